"""Pass 2: lower a qualified query AST (:func:`.parse.resolve`) to the logical plan
(:mod:`.logical`), applying the rules of :mod:`.joins`, :mod:`.subqueries`, :mod:`.dedup`,
:mod:`.setops`, :mod:`.windows`, :mod:`.topn` and :mod:`.recompute` on the way.

A SELECT is lowered as: its relations (sources are Scans of the columns the query uses,
CTEs and derived tables are lowered recursively), the joins with WHERE pushdown (OR-ed
conditions' common conjuncts factored out first), its LATERAL VIEWs (generators in the
select list among them, :mod:`.generators`), the subquery predicates (those nested in
a condition as scalar COUNT subqueries), the scalar subqueries, the remaining WHERE as a
Filter, then either a dedup (ROW_NUMBER() = 1), or an Aggregate (GROUP BY, aggregates,
HAVING and the scalar subqueries these hold; grouping sets put an Expand under it,
:mod:`.grouping`), the window functions, QUALIFY, a Project of the select list, DISTINCT and
ORDER BY .. LIMIT (a top-N; ORDER BY alone is dropped). A query block holding a construct
without a delta rule (NoDeltaRule) is planned by the recompute floor instead. Every column
of the plan has an internal name, unique in the plan; the model's own outputs keep their
names.

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

from ..errors import NoDeltaRule
from ..sources import SourceSpec
from .clock import temporal_operators, uses_clock
from .dedup import check_ranks_filtered, is_dedup, plan_dedup, take_rank_filters
from .expressions import (SCALAR_VALUE, WINDOW_VALUE, aliases, factor_or, has_aggregate, own, translate,
                          window_of, with_aliases)
from .generators import plan_generate, select_list_generators
from .grouping import GroupingSets, grouping_call, grouping_sets, plan_expand
from .joins import plan_from_clause
from .keys import unique_keys
from .logical import COMOMENT_AGGS, Aggregate, AggCall, Filter, Node, Project, Scan
from .parse import AGGREGATES, err, no_rule
from .recompute import check_block, plan_recompute
from .scope import Lowering, Rel, output_names, with_ctes
from .setops import distinct, plan_set_operation
from .subqueries import as_counts, plan_scalar_subqueries, plan_subquery_predicate, subquery_predicate
from .topn import limit_of, order_keys, top_n
from .windows import keep_ranks, plan_windows, query_windows


def lower(ast: exp.Expression, sources: dict[tuple[str, ...], SourceSpec], schemas: dict[str, list[str]],
          sql: str, incremental_only: bool = False) -> tuple[Node, list[tuple[str, str]]]:
    """The logical plan of the model ``ast`` (qualified, over ``sources`` by their lower-case
    name parts, with columns ``schemas[source.key]``; ``sql``: its text, for error positions)
    and its outputs ``[(name, internal column)]``; the plan is neither pruned nor numbered.
    A query block without a delta rule is recomputed (:mod:`.recompute`), unless
    ``incremental_only``.

    Raises CompileError (located in ``sql``) for every construct the rules do not maintain:
    NoDeltaRule for those the recompute floor would maintain, with ``incremental_only``.
    """
    lw = Lowering(sql=sql, sources=sources, schemas=schemas, incremental_only=incremental_only)
    lw.names.used.update(_model_output_names(ast))
    root, outputs = plan_query(lw, ast, {}, top=True)
    check_ranks_filtered(lw)
    keep_ranks(root)
    return temporal_operators(root), outputs


def _model_output_names(ast: exp.Expression) -> list[str]:
    """The names of the model's own output columns (lower case; a set operation's are its
    leftmost SELECT's), reserved before anything is planned: an inner query's column planned
    first (a CTE's ``sales``) then gets another internal name than the model's ``sales``, so
    no two arrangements of the state hold one column name with two types."""
    q = ast
    while isinstance(q, (exp.SetOperation, exp.Subquery)):
        q = q.this
    return [e.alias_or_name.lower() for e in q.expressions] if isinstance(q, exp.Select) else []


def plan_query(lw: Lowering, q: exp.Expression, outer_ctes: dict[str, exp.Expression],
               top: bool = False) -> tuple[Node, list[tuple[str, str]]]:
    """A SELECT (:func:`plan_select`) or a set operation of queries
    (:func:`.setops.plan_set_operation`, with its ORDER BY .. LIMIT: :mod:`.topn`), also in
    parentheses, with the CTEs ``outer_ctes`` in scope: its node and outputs ``[(name,
    internal column)]``. ``top``: ``q`` is the model itself, whose outputs keep their names.
    A block without a delta rule is planned by :func:`.recompute.plan_recompute` (unless
    ``lw.incremental_only``)."""
    if isinstance(q, exp.Subquery):
        q = q.this
    try:
        if not isinstance(q, exp.SetOperation):
            return plan_select(lw, q, outer_ctes, top)
        node, outs = plan_set_operation(lw, q, outer_ctes, top, plan_query)
        limit = limit_of(q, lw.sql) if q.args.get("order") is not None else None
        if limit is not None:
            keys, _ = order_keys(lw, q, outs, None)
            node = top_n(lw, node, keys, limit[0], limit[1], [c for _, c in outs])
        return node, outs
    except NoDeltaRule as e:
        if lw.incremental_only:
            raise
        return plan_recompute(lw, q, with_ctes(q, outer_ctes) if not isinstance(q, exp.Select) else outer_ctes,
                              top, e, plan_relation)


def plan_select(lw: Lowering, sel: exp.Expression, outer_ctes: dict[str, exp.Expression],
                top: bool = False) -> tuple[Node, list[tuple[str, str]]]:
    """The SELECT ``sel`` with the CTEs ``outer_ctes`` in scope: its node and outputs
    ``[(name, internal column)]`` (see the module docstring for the order of the steps).

    Raises CompileError for anything else than a SELECT, a SELECT without FROM, two relations
    with one alias, and what the steps reject (NoDeltaRule for a construct without a delta
    rule, :func:`.recompute.check_block`).
    """
    if not isinstance(sel, exp.Select):
        raise err(type(sel).__name__.upper(), "only SELECT is supported here", sel, lw.sql)
    check_block(sel, lw.sql)
    sel = select_list_generators(sel, lw.sql)
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
    where_conj = factor_or(where.this) if where else []
    where_conj = take_rank_filters(lw, where_conj, rels)
    sub_conj = [c for c in where_conj if subquery_predicate(c) is not None]
    where_conj = [as_counts(c) for c in where_conj if subquery_predicate(c) is None]
    laterals = sel.args.get("laterals") or []
    views = {lat.alias_or_name.lower() for lat in laterals}
    after_views = [c for c in where_conj if aliases(c) & views]   # WHERE reads a generator's columns
    current, scope, where_conj = plan_from_clause(lw, joins, rels, [c for c in where_conj if not aliases(c) & views])
    for lat in laterals:
        current, scope = plan_generate(lw, lat, current, scope)
    where_conj = where_conj + after_views
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

    windows = query_windows(sel)
    if windows and is_dedup(sel, windows, top):
        return plan_dedup(lw, sel, current, scope, windows, top)
    unique = unique_keys(current)
    if has_agg:
        post_items = list(select_exprs) + ([having.this] if having is not None else [])
        later = [sel.args[k] for k in ("qualify", "order") if sel.args.get(k) is not None]
        current, post = plan_aggregate(lw, current, scope, group, post_items + later)
        current = plan_post_subqueries(lw, post_items, current, post, ctes)
        if having is not None:
            current = Filter(columns=current.columns, child=current,
                             predicate=translate_post(having.this, post, lw.sql))
        tr = lambda e: translate_post(e, post, lw.sql)  # noqa: E731
        unique = [frozenset(post.groups_columns)]
    else:
        tr = lambda e: translate(e, scope, lw.sql)  # noqa: E731
    if windows:
        current = plan_windows(lw, current, windows, tr, unique)
    qualify = sel.args.get("qualify")
    if qualify is not None:
        current = Filter(columns=current.columns, child=current,
                         predicate=tr(with_aliases(qualify.this, select_exprs)))
    exprs = [tr(e.unalias() if isinstance(e, exp.Alias) else e) for e in select_exprs]
    lowered, internal = output_names(lw, sel, select_exprs, top)
    limit = limit_of(sel, lw.sql) if sel.args.get("order") is not None else None
    hidden: list[tuple[str, str]] = []
    if limit is not None:
        keys, hidden = order_keys(lw, sel, list(zip(lowered, internal)),
                                  None if sel.args.get("distinct") else tr)
    node = Project(columns=internal + [c for c, _ in hidden], child=current, exprs=exprs + [e for _, e in hidden])
    if sel.args.get("distinct"):
        node = distinct(node)
    if limit is not None:
        node = top_n(lw, node, keys, limit[0], limit[1], internal)
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
    its FILTER node) and its column; ``grouping``: the grouping sets, whose position is the
    column ``set_column`` (:mod:`.grouping`), or None."""
    groups: list[tuple[exp.Expression, str]]
    aggs: dict[exp.Expression, str]
    grouping: GroupingSets | None = None
    set_column: str = ""

    @property
    def groups_columns(self) -> list[str]:
        return [name for _, name in self.groups]

    def scope(self) -> dict[tuple[str, str], str]:
        """The columns of the aggregate's input that its output still has (the GROUP BY
        columns), by ``(alias, column)``: what a correlated subquery above it may read."""
        return {(g.table.lower(), g.name.lower()): name for g, name in self.groups if isinstance(g, exp.Column)}


def plan_aggregate(lw: Lowering, child: Node, scope: dict[tuple[str, str], str], group: exp.Group | None,
                   exprs: list[exp.Expression]) -> tuple[Aggregate, AggregateOutputs]:
    """GROUP BY over ``child`` (whose columns are ``scope``): one AggCall per distinct
    aggregate of ``exprs`` (the select list, HAVING, QUALIFY and ORDER BY; not the window
    functions, computed above the Aggregate). A FILTER (WHERE c) clause becomes the argument
    ``CASE WHEN c THEN x END`` (COUNT(*) counts ``CASE WHEN c THEN 1 END``); DISTINCT picks
    the value-multiset form. Grouping sets group an :class:`~.logical.Expand` of ``child``
    by their keys and the set (:mod:`.grouping`). Returns the Aggregate and its outputs.

    Raises CompileError for nested aggregates and an aggregate of several arguments,
    NoDeltaRule for a GROUP BY or an aggregate that reads the clock.
    """
    gs = grouping_sets(group)
    group_exprs = gs.keys if gs is not None else list(group.expressions) if group is not None else []
    for g in group_exprs:
        if uses_clock(g):
            raise no_rule("current_date()/current_timestamp() in GROUP BY", "no delta rule yet", g, lw.sql)
    gnames = [lw.names.new(f"__g_{g.alias_or_name or 'expr'}") for g in group_exprs]
    aggs: list[AggCall] = []
    agg_map: dict[exp.Expression, str] = {}
    for e in exprs:
        for a in own(e, exp.AggFunc):
            if window_of(a) is not None or isinstance(a, (exp.Grouping, exp.GroupingId)):
                continue
            ordered = a.parent if isinstance(a.parent, exp.WithinGroup) else None   # percentile_disc
            holder = ordered if ordered is not None else a
            holder = holder.parent if isinstance(holder.parent, exp.Filter) else holder
            if holder in agg_map:
                continue
            outer = a.find_ancestor(exp.AggFunc)
            while outer is not None and window_of(outer) is not None:
                outer = outer.find_ancestor(exp.AggFunc)
            if outer is not None:
                raise err("nested aggregate", "aggregates cannot contain aggregates", a, lw.sql)
            if uses_clock(holder):
                raise no_rule("current_date()/current_timestamp() in an aggregate", "no delta rule yet", a, lw.sql)
            func = AGGREGATES[type(a)]
            arg = a.this
            is_distinct = isinstance(arg, exp.Distinct)
            if is_distinct:
                arg = arg.expressions[0]
            if a.expressions:
                raise err(f"{func.upper()} with several arguments", "not supported", a, lw.sql)
            param = None
            if func == "percentile_disc":
                p = a.this
                keys = ordered.expression.expressions if ordered is not None else []
                if not (isinstance(p, exp.Literal) and not p.is_string and 0 <= float(p.this) <= 1) or len(keys) != 1:
                    raise no_rule("PERCENTILE_DISC of other than one fraction literal WITHIN GROUP (ORDER BY "
                                  "one expression)", "the delta rule is for that form", a, lw.sql)
                arg, param = keys[0].this, p.this
                if keys[0].args.get("desc"):
                    func = "percentile_disc_desc"
            if func == "percentile":
                p = a.args.get("quantile")
                if not (isinstance(p, exp.Literal) and not p.is_string and 0 <= float(p.this) <= 1):
                    raise no_rule("PERCENTILE of other than one fraction literal", "the delta rule is for one "
                                  "fraction between 0 and 1", a, lw.sql)
                param = p.this
            cond = translate(holder.expression.this, scope, lw.sql) if isinstance(holder, exp.Filter) else None
            if func == "count" and (arg is None or isinstance(arg, exp.Star)):
                func, arg_sql = ("count", f"CASE WHEN {cond} THEN 1 END") if cond else ("count_star", None)
            else:
                arg_sql = translate(arg, scope, lw.sql)
                if func in COMOMENT_AGGS:
                    if is_distinct:
                        raise no_rule(f"{func.upper()}(DISTINCT ..)", "DISTINCT has a delta rule in aggregates "
                                      "of one argument", a, lw.sql)
                    arg_sql = (f"named_struct('x', CAST({arg_sql} AS DOUBLE), "
                               f"'y', CAST({translate(a.expression, scope, lw.sql)} AS DOUBLE))")
                if cond:
                    arg_sql = f"CASE WHEN {cond} THEN {arg_sql} END"
                if is_distinct and func in ("count", "sum", "avg"):
                    func = f"{func}_distinct"
            name = lw.names.new(f"__a_{func}")
            agg_map[holder] = name
            aggs.append(AggCall(name, func, arg_sql, param))
    key_sqls = [translate(g, scope, lw.sql) for g in group_exprs]
    outputs = AggregateOutputs(groups=list(zip(group_exprs, gnames)), aggs=agg_map, grouping=gs)
    if gs is not None:
        knames = [lw.names.new(f"__k_{g.alias_or_name or 'expr'}") for g in group_exprs]
        set_in, outputs.set_column = lw.names.new("__set"), lw.names.new("__g_set")
        child = plan_expand(child, key_sqls, knames, set_in, gs.sets)
        gnames, key_sqls = gnames + [outputs.set_column], [f"`{k}`" for k in knames + [set_in]]
    node = Aggregate(columns=gnames + [a.name for a in aggs], child=child, group_names=gnames,
                     group_exprs=key_sqls, aggs=aggs)
    return node, outputs


def plan_post_subqueries(lw: Lowering, exprs: list[exp.Expression], current: Node, post: AggregateOutputs,
                         ctes: dict[str, exp.Expression]) -> Node:
    """The scalar subqueries of an aggregating query's SELECT list and HAVING (``exprs``),
    joined onto its Aggregate ``current`` (:func:`.subqueries.plan_scalar_subqueries`): an
    uncorrelated one on every group, one correlated by GROUP BY columns on its group (TPC-H
    Q11's ``HAVING sum(..) > (SELECT sum(..) * 0.0001 ..)``). Returns the node."""
    if not any(e.find(exp.Subquery) for e in exprs):
        return current
    node, _ = plan_scalar_subqueries(lw, exprs, current, post.scope(), ctes, plan_query)
    return node


def translate_post(e: exp.Expression, post: AggregateOutputs, sql: str) -> str:
    """Spark SQL text of ``e`` (HAVING or a select-list item of an aggregating query) over
    the Aggregate's outputs ``post``: GROUP BY expressions and aggregates replaced by their
    columns, ``grouping()``/``grouping_id()`` by their value per grouping set, planned scalar
    subqueries and windows by their value columns.

    Raises CompileError (located in ``sql``) for a column outside GROUP BY and aggregates,
    NoDeltaRule for an EXISTS or IN subquery there.
    """
    def fn(n):
        if isinstance(n, exp.Subquery) and SCALAR_VALUE in n.meta:
            return exp.column(n.meta[SCALAR_VALUE], quoted=True)
        if isinstance(n, exp.Window) and WINDOW_VALUE in n.meta:
            return exp.column(n.meta[WINDOW_VALUE], quoted=True)
        value = grouping_call(n, post.grouping, post.set_column, sql)
        if value is not None:
            return value
        for g, name in post.groups:
            if n == g:
                return exp.column(name, quoted=True)
        if isinstance(n, (exp.AggFunc, exp.Filter, exp.WithinGroup)) and n in post.aggs:
            return exp.column(post.aggs[n], quoted=True)
        if isinstance(n, (exp.Subquery, exp.Exists)):
            raise no_rule("subquery in an aggregating query's SELECT or HAVING", "this form has no delta "
                          "rule yet (scalar subqueries do)", n, sql)
        if isinstance(n, exp.Column):
            raise err(f"column {n.sql(dialect='spark')}", "must appear in GROUP BY or inside an aggregate",
                      n, sql)
        return n
    return e.copy().transform(fn).sql(dialect="spark")
