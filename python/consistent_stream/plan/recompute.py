"""Rule: the floor under the compiler. A query block holding a construct without a delta rule
(:class:`~consistent_stream.errors.NoDeltaRule`: a LATERAL VIEW, a grouping set, an aggregate
such as ``percentile``, ..) is maintained by recomputing it: DBSP's ``D . Q . I``.

The block ``Q`` (one SELECT, or one set operation, with everything nested in it) keeps its
SQL; each relation it reads becomes an *input* of a :class:`~.logical.Recompute` node, planned
like any other relation (a source is a Scan of the columns the block reads; a CTE of an
enclosing query or a derived table in its FROM is lowered, incrementally where it can be).
Each batch that changes an input (or moves the clock ``Q`` reads), ``Q`` runs over the inputs'
whole contents before and after the change, and the difference of the two results is the
block's change. It is never silent: ``explain`` says ``recompute`` with the construct, the run
log counts the rows recomputed, and ``incremental_only: true`` turns it into a compile error.

A top-level ``ORDER BY .. LIMIT`` of the block is not recomputed: the block's other rows are,
and the top-N is the incremental rule of :mod:`.topn` over them (its keys added to the block's
SELECT list), so that ties at the boundary are broken the same way every batch.

Example::

    select g, percentile(x, 0.5) as p from src.a group by g

plans to::

    Recompute (aggregate PERCENTILE) over ['__cs_in0']
      Scan src.a ['g', 'x']

with the SQL ``SELECT a.g AS g, PERCENTILE(a.x, 0.5) AS p FROM __cs_in0 AS a GROUP BY a.g``.
"""
from __future__ import annotations

from sqlglot import exp

from ..errors import NoDeltaRule
from .expressions import from_relations, own, window_of
from .logical import Node, Recompute, SortKey
from .parse import AGGREGATES, err, no_rule
from .scope import Lowering, Rel, output_names
from .topn import limit_of, top_n

INPUT = "__cs_in{}"
"""The name of a Recompute's input ``i`` in its SQL."""

# constructs Spark evaluates that no operator maintains by a delta rule of its own: the query
# block holding one is maintained by the recompute floor (:func:`plan_recompute`)
_NO_RULE: list[tuple[type, str, str]] = [
    (exp.Pivot, "PIVOT", "PIVOT has no delta rule yet"),
]
_GENERATOR_NAMES = {"inline", "inline_outer", "stack", "json_tuple", "explode_outer", "posexplode_outer"}


def check_block(sel: exp.Expression, sql: str) -> None:
    """Raise NoDeltaRule at the first construct of the SELECT ``sel``'s own scope (not its
    nested subqueries, which are blocks of their own) that no operator maintains by a delta
    rule: generators outside LATERAL VIEW and explode/posexplode, PIVOT, aggregates other than :data:`AGGREGATES` (as
    window functions any function is maintained) and DISTINCT aggregates of several
    arguments."""
    for node in own(sel, exp.Expression):
        for typ, name, hint in _NO_RULE:
            if isinstance(node, typ):
                raise no_rule(name, hint, node, sql)
        if isinstance(node, exp.Anonymous) and node.name.lower() in _GENERATOR_NAMES \
                and not isinstance(node.parent, exp.Lateral):
            raise no_rule(f"a generator ({node.name})", "a generator in the select list has no delta rule yet",
                          node, sql)
        if isinstance(node, exp.AggFunc) and window_of(node) is None \
                and not isinstance(node, (exp.Grouping, exp.GroupingId)):
            if type(node) not in AGGREGATES:
                name = node.sql(dialect="spark").split("(")[0]   # as Spark names it: MAX_BY, not ARG_MAX
                raise no_rule(f"aggregate {name.upper()}", "the aggregates with delta rules are SUM, COUNT, "
                              "COUNT(*), AVG, MIN, MAX (also with DISTINCT and FILTER), STDDEV, "
                              "STDDEV_SAMP, STDDEV_POP, VARIANCE, VAR_SAMP, VAR_POP, COVAR_POP, COVAR_SAMP, CORR, "
                              "PERCENTILE, MEDIAN, "
                              "PERCENTILE_CONT, PERCENTILE_DISC, COUNT_IF, BOOL_AND, BOOL_OR, MAX_BY, MIN_BY, "
                              "COLLECT_LIST, COLLECT_SET", node, sql)
            d = node.this
            if isinstance(d, exp.Distinct) and len(d.expressions) != 1:
                raise no_rule(f"{type(node).__name__.upper()}(DISTINCT ..) of several arguments",
                              "DISTINCT has a delta rule in aggregates of one argument", node, sql)


def plan_recompute(lw: Lowering, q: exp.Expression, ctes: dict[str, exp.Expression], top: bool,
                   reason: NoDeltaRule, plan_relation) -> tuple[Node, list[tuple[str, str]]]:
    """The query block ``q`` (qualified; with the CTEs ``ctes`` of its enclosing queries in
    scope) as a Recompute over its relations (each lowered by ``plan_relation(lw, rel, ctes,
    used)``, the used columns by alias), the ``reason`` it has no delta rule recorded. Returns
    the node and its outputs ``[(name, internal column)]`` (``top``: the model's own, whose
    names are kept).

    Raises CompileError for an ORDER BY key of a DISTINCT query or a set operation that is not
    one of its outputs."""
    q = q.copy()
    order = q.args.get("order")
    topn = limit_of(q, lw.sql) if order is not None else None
    for key in ("order", "limit", "offset"):
        q.set(key, None)
    selects = _first_select(q)
    visible = len(selects.expressions)
    sort: list[tuple[int, bool, bool | None]] = []   # (output position, descending, nulls first)
    if topn is not None:
        names = [e.alias_or_name.lower() for e in selects.expressions]
        values = [(e.unalias() if isinstance(e, exp.Alias) else e).unnest() for e in selects.expressions]
        for o in order.expressions:
            e = o.this
            if isinstance(e, exp.Column) and not e.table and e.name.lower() in names:
                pos = names.index(e.name.lower())
            elif e.unnest() in values:
                pos = values.index(e.unnest())
            elif isinstance(q, exp.Select) and not q.args.get("distinct"):
                pos = len(q.expressions)   # a key the SELECT list does not hold: computed beside it
                q.append("expressions", exp.alias_(e.copy(), f"__sort{pos}"))
            else:
                raise err(f"ORDER BY {e.sql(dialect='spark')}", "order a SELECT DISTINCT or a set operation by "
                          "its output columns", o, lw.sql)
            sort.append((pos, bool(o.args.get("desc")), o.args.get("nulls_first")))
    own_ctes = {c.alias_or_name.lower() for c in q.find_all(exp.CTE)}
    used: dict[str, set[str]] = {}
    for c in q.find_all(exp.Column):
        used.setdefault(c.table.lower(), set()).add(c.name.lower())
    inputs: list[Node] = []
    names_in: list[str] = []
    columns: list[list[tuple[str, str]]] = []

    def add(rel_ast: exp.Expression) -> exp.Expression:
        rel: Rel = plan_relation(lw, rel_ast, ctes, used)
        name = INPUT.format(len(inputs))
        inputs.append(rel.node)
        names_in.append(name)
        columns.append(list(rel.cols.items()))
        return exp.Table(this=exp.to_identifier(name), alias=exp.TableAlias(this=exp.to_identifier(rel.alias)))

    froms = {id(r) for r in (from_relations(q) if isinstance(q, exp.Select) else [])}
    for node in list(q.walk()):
        if node.root() is not q:   # inside a relation already replaced
            continue
        if isinstance(node, exp.Subquery) and id(node) in froms:
            node.replace(add(node))
        elif isinstance(node, exp.Table) and not (len(node.parts) == 1 and node.name.lower() in own_ctes):
            node.replace(add(node))
    lowered, internal = output_names(lw, selects, selects.expressions[:visible], top)
    internal = internal + [lw.names.new("__sort") for _ in selects.expressions[visible:]]
    node: Node = Recompute(columns=internal, inputs=inputs, names=names_in, input_columns=columns,
                           sql=q.sql(dialect="spark"), reason=reason.construct,
                           keys=_keys(q, internal[:visible]) if isinstance(q, exp.Select) else [])
    if topn is not None:
        keys = [SortKey(internal[pos], desc, nulls) for pos, desc, nulls in sort]
        node = top_n(lw, node, keys, topn[0], topn[1], internal[:visible])
    return node, list(zip(lowered, internal[:visible]))


def _keys(q: exp.Select, outputs: list[str]) -> list[list[str]]:
    """Unique keys of the block's result: its GROUP BY expressions when each is one of its
    outputs (a plain GROUP BY: one row per group), or every output of a SELECT DISTINCT."""
    items = [e.unalias() if isinstance(e, exp.Alias) else e for e in q.expressions[:len(outputs)]]
    if q.args.get("distinct") is not None:
        return [list(outputs)]
    group = q.args.get("group")
    if group is None or any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets")) or not group.expressions:
        return []
    key = []
    for g in group.expressions:
        pos = next((i for i, e in enumerate(items) if e == g), None)
        if pos is None:
            return []
        key.append(outputs[pos])
    return [key]


def _first_select(q: exp.Expression) -> exp.Select:
    """The SELECT whose list names a query's outputs (the leftmost of a set operation)."""
    while isinstance(q, (exp.SetOperation, exp.Subquery)):
        q = q.this
    return q
