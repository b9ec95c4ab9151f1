"""Pass 2: lower a qualified query AST (:func:`.parse.resolve`) to the logical plan
(:mod:`.logical`), applying the rules of :mod:`.joins`, :mod:`.subqueries`, :mod:`.dedup`
and :mod:`.setops` on the way.

A SELECT is lowered as: its relations (sources are Scans of the columns the query uses,
CTEs and derived tables are lowered recursively), the joins with WHERE pushdown, the
subquery predicates, the scalar subqueries, the remaining WHERE as a Filter, then either a
dedup (ROW_NUMBER()), or an Aggregate (GROUP BY, aggregates, HAVING) and a Project of the
select list, and DISTINCT. Every column of the plan has an internal name, unique in the
plan; the model's own outputs keep their names.

Example::

    select cid, count(*) as n, sum(amount) filter (where day > 3) as s from src.orders
    group by cid having count(*) > 1

plans to (:func:`.logical.explain`)::

    Project `__g_cid` AS cid, `__a_count_star` AS n, `__a_sum` AS s
      Filter `__a_count_star` > 1
        Aggregate by ['`orders__cid`']: count_star(None), sum(CASE WHEN `orders__day` > 3 THEN `orders__amount` END)
          Scan src.orders ['cid', 'amount', 'day']
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ..sources import SourceSpec
from .dedup import check_ranks_filtered, plan_dedup, take_rank_filters
from .expressions import conjuncts, has_aggregate, own, translate
from .joins import plan_from_clause
from .logical import Aggregate, AggCall, Filter, Node, Project, Scan
from .parse import AGGREGATES, err
from .scope import Lowering, Rel, output_names, with_ctes
from .setops import distinct, plan_set_operation
from .subqueries import plan_scalar_subqueries, plan_subquery_predicate, subquery_predicate


def lower(ast: exp.Expression, sources: dict[tuple[str, ...], SourceSpec], schemas: dict[str, list[str]],
          sql: str) -> tuple[Node, list[tuple[str, str]]]:
    """The logical plan of the model ``ast`` (qualified, over ``sources`` by their lower-case
    name parts, with columns ``schemas[source.key]``; ``sql``: its text, for error positions)
    and its outputs ``[(name, internal column)]``; the plan is neither pruned nor numbered.

    Raises CompileError (located in ``sql``) for every construct the rules do not maintain.
    """
    lw = Lowering(sql=sql, sources=sources, schemas=schemas)
    root, outputs = plan_query(lw, ast, {}, top=True)
    check_ranks_filtered(lw)
    return root, outputs


def plan_query(lw: Lowering, q: exp.Expression, outer_ctes: dict[str, exp.Expression],
               top: bool = False) -> tuple[Node, list[tuple[str, str]]]:
    """A SELECT (:func:`plan_select`) or a set operation of queries
    (:func:`.setops.plan_set_operation`), also in parentheses, with the CTEs ``outer_ctes``
    in scope: its node and outputs ``[(name, internal column)]``. ``top``: ``q`` is the model
    itself, whose outputs keep their names."""
    if isinstance(q, exp.Subquery):
        q = q.this
    if not isinstance(q, exp.SetOperation):
        return plan_select(lw, q, outer_ctes, top)
    return plan_set_operation(lw, q, outer_ctes, top, plan_query)


def plan_select(lw: Lowering, sel: exp.Expression, outer_ctes: dict[str, exp.Expression],
                top: bool = False) -> tuple[Node, list[tuple[str, str]]]:
    """The SELECT ``sel`` with the CTEs ``outer_ctes`` in scope: its node and outputs
    ``[(name, internal column)]`` (see the module docstring for the order of the steps).

    Raises CompileError for anything else than a SELECT, a SELECT without FROM, two relations
    with one alias, and what the steps reject.
    """
    if not isinstance(sel, exp.Select):
        raise err(type(sel).__name__.upper(), "only SELECT is supported here", sel, lw.sql)
    ctes = with_ctes(sel, outer_ctes)
    from_ = sel.args.get("from") or sel.args.get("from_")
    if from_ is None:
        raise err("SELECT without FROM", "a model reads at least one source", sel, lw.sql)
    joins = sel.args.get("joins") or []
    used: dict[str, set[str]] = {}
    for c in sel.find_all(exp.Column):  # nested subqueries too: their correlated references
        used.setdefault(c.table.lower(), set()).add(c.name.lower())
    rels = [plan_relation(lw, r, ctes, used) for r in [from_.this] + [j.this for j in joins]]
    if len({r.alias.lower() for r in rels}) != len(rels):
        raise err("duplicate table alias", "give every relation in FROM its own alias", sel, lw.sql)

    where = sel.args.get("where")
    where_conj = list(conjuncts(where.this)) if where else []
    where_conj = take_rank_filters(lw, where_conj, rels)
    sub_conj = [c for c in where_conj if subquery_predicate(c) is not None]
    where_conj = [c for c in where_conj if subquery_predicate(c) is None]
    current, scope, where_conj = plan_from_clause(lw, joins, rels, where_conj)
    for c in sub_conj:
        current = plan_subquery_predicate(lw, c, current, scope, ctes, plan_query)

    select_exprs = sel.expressions
    group = sel.args.get("group")
    having = sel.args.get("having")
    has_agg = any(has_aggregate(e) for e in select_exprs) or having is not None or group is not None
    current, scope = plan_scalar_subqueries(lw, where_conj + ([] if has_agg else list(select_exprs)),
                                            current, scope, ctes, plan_query)
    if where_conj:
        current = Filter(columns=current.columns, child=current,
                         predicate=" AND ".join(translate(c, scope, lw.sql) for c in where_conj))

    windows = [e for e in select_exprs if e.find(exp.Window)]
    if windows:
        return plan_dedup(lw, sel, current, scope, windows, top)
    if has_agg:
        current, post_scope = plan_aggregate(lw, current, scope, group, select_exprs, having)
        if having is not None:
            current = Filter(columns=current.columns, child=current,
                             predicate=translate_post(having.this, post_scope, lw.sql))
        exprs = [translate_post(e.unalias() if isinstance(e, exp.Alias) else e, post_scope, lw.sql)
                 for e in select_exprs]
    else:
        exprs = [translate(e.unalias() if isinstance(e, exp.Alias) else e, scope, lw.sql) for e in select_exprs]

    lowered, internal = output_names(lw, sel, select_exprs, top)
    node = Project(columns=internal, child=current, exprs=exprs)
    if sel.args.get("distinct"):
        node = distinct(node)
    return node, list(zip(lowered, internal))


def plan_relation(lw: Lowering, rel: exp.Expression, ctes: dict[str, exp.Expression],
                  used: dict[str, set[str]]) -> Rel:
    """A relation of FROM: a CTE or derived table (lowered), or a source read as a Scan of
    the columns ``used[alias]`` of the query (projection pruning; its first primary key
    column, or its first column, when it uses none).

    Raises CompileError for any other relation.
    """
    alias = rel.alias_or_name
    if isinstance(rel, exp.Table):
        parts = tuple(p.name.lower() for p in rel.parts)
        if len(parts) == 1 and parts[0] in ctes:
            node, outs = plan_query(lw, ctes[parts[0]], ctes)
            return Rel(node, alias, dict(outs))
        src = lw.sources[parts]
        # projection pruning: read only the columns this scope references
        want = used.get(alias.lower(), set())
        cols = [c for c in lw.schemas[src.key] if c.lower() in want] or \
            [next((c for c in lw.schemas[src.key] if c.lower() in src.primary_key), lw.schemas[src.key][0])]
        internal = [lw.names.new(f"{alias}__{c}") for c in cols]
        node = Scan(columns=internal, source=src, source_columns=cols)
        return Rel(node, alias, dict(zip([c.lower() for c in cols], internal)))
    if isinstance(rel, exp.Subquery):
        node, outs = plan_query(lw, rel.this, ctes)
        return Rel(node, alias, dict(outs))
    raise err(type(rel).__name__, "unsupported relation in FROM", rel, lw.sql)


@dataclass
class AggregateOutputs:
    """What an Aggregate computes, for the expressions above it (:func:`translate_post`):
    ``groups``: each GROUP BY expression and its column; ``aggs``: each aggregate call (or
    its FILTER node) and its column."""
    groups: list[tuple[exp.Expression, str]]
    aggs: dict[exp.Expression, str]


def plan_aggregate(lw: Lowering, child: Node, scope: dict[tuple[str, str], str], group: exp.Group | None,
                   select_exprs: list[exp.Expression], having: exp.Having | None) -> tuple[Aggregate, AggregateOutputs]:
    """GROUP BY over ``child`` (whose columns are ``scope``): one AggCall per distinct
    aggregate of the select list and HAVING. A FILTER (WHERE c) clause becomes the argument
    ``CASE WHEN c THEN x END`` (COUNT(*) counts ``CASE WHEN c THEN 1 END``); DISTINCT picks
    the value-multiset form. Returns the Aggregate and its outputs.

    Raises CompileError for a subquery in the select list or HAVING, nested aggregates and
    an aggregate of several arguments.
    """
    group_exprs = list(group.expressions) if group is not None else []
    gnames = [lw.names.new(f"__g_{g.alias_or_name or 'expr'}") for g in group_exprs]
    aggs: list[AggCall] = []
    agg_map: dict[exp.Expression, str] = {}
    exprs_to_scan = list(select_exprs) + ([having.this] if having is not None else [])
    for e in exprs_to_scan:
        if e.find(exp.Subquery, exp.Exists):
            raise err("subquery in an aggregating query's SELECT or HAVING", "compute it in a CTE "
                      "and join it", e.find(exp.Subquery, exp.Exists), lw.sql)
        for a in own(e, exp.AggFunc):
            holder = a.parent if isinstance(a.parent, exp.Filter) else a
            if holder in agg_map:
                continue
            if a.find_ancestor(exp.AggFunc) is not None:
                raise err("nested aggregate", "aggregates cannot contain aggregates", a, lw.sql)
            func = AGGREGATES[type(a)]
            arg = a.this
            is_distinct = isinstance(arg, exp.Distinct)
            if is_distinct:
                arg = arg.expressions[0]
            if a.expressions:
                raise err(f"{func.upper()} with several arguments", "not supported", a, lw.sql)
            cond = translate(holder.expression.this, scope, lw.sql) if holder is not a else None
            if func == "count" and (arg is None or isinstance(arg, exp.Star)):
                func, arg_sql = ("count", f"CASE WHEN {cond} THEN 1 END") if cond else ("count_star", None)
            else:
                arg_sql = translate(arg, scope, lw.sql)
                if cond:
                    arg_sql = f"CASE WHEN {cond} THEN {arg_sql} END"
                if is_distinct and func in ("count", "sum", "avg"):
                    func = f"{func}_distinct"
            name = lw.names.new(f"__a_{func}")
            agg_map[holder] = name
            aggs.append(AggCall(name, func, arg_sql))
    node = Aggregate(columns=gnames + [a.name for a in aggs], child=child, group_names=gnames,
                     group_exprs=[translate(g, scope, lw.sql) for g in group_exprs], aggs=aggs)
    return node, AggregateOutputs(groups=list(zip(group_exprs, gnames)), aggs=agg_map)


def translate_post(e: exp.Expression, post: AggregateOutputs, sql: str) -> str:
    """Spark SQL text of ``e`` (HAVING or a select-list item of an aggregating query) over
    the Aggregate's outputs ``post``: GROUP BY expressions and aggregates replaced by their
    columns.

    Raises CompileError (located in ``sql``) for a column outside GROUP BY and aggregates.
    """
    def fn(n):
        for g, name in post.groups:
            if n == g:
                return exp.column(name, quoted=True)
        if isinstance(n, (exp.AggFunc, exp.Filter)) and n in post.aggs:
            return exp.column(post.aggs[n], quoted=True)
        if isinstance(n, exp.Column):
            raise err(f"column {n.sql(dialect='spark')}", "must appear in GROUP BY or inside an aggregate",
                      n, sql)
        return n
    return e.copy().transform(fn).sql(dialect="spark")
