"""Rule: decorrelate subqueries into joins.

``[NOT] EXISTS (q)`` and ``x [NOT] IN (q)`` conjuncts of WHERE become semi and anti joins
with ``q`` stripped of its correlated conditions (:func:`decorrelate`): its correlated
equalities are the join keys, its other correlated conditions the residual
(:func:`plan_subquery_predicate`). Scalar subqueries (in WHERE, and in the SELECT list of a
query without GROUP BY) become joins with a one-row aggregate, or with the subquery grouped
by its correlated columns (:func:`plan_scalar_subqueries`).

Example::

    select c.id from src.customers c where exists (select 1 from src.orders o where o.cid = c.id and o.amount > c.id)

plans to (:func:`.logical.explain`)::

    Project `c__id` AS id
      Join semi on `c__id` = `__c0` and `__c1` > `c__id`
        Scan src.customers ['id']
        Project `o__cid` AS __c0, `o__amount` AS __c1
          Scan src.orders ['cid', 'amount']

and ``select c.id, (select count(*) from src.orders o where o.cid = c.id) as n from
src.customers c`` to::

    Project `c__id` AS id, `__scalar` AS n
      Project `c__id` AS c__id, CASE WHEN `__present` IS NULL THEN 0 ELSE `__v` END AS __scalar
        Join left on `c__id` = `__k0`
          Scan src.customers ['id']
          Project `__g_cid` AS __k0, `__a_count_star` AS __v, TRUE AS __present
            Aggregate by ['`o__cid`']: count_star(None)
              Scan src.orders ['cid']
"""
from __future__ import annotations

from sqlglot import exp

from .clock import uses_clock
from .expressions import SCALAR_VALUE, aliases, factor_or, from_relations, own_columns, translate
from .joins import equi
from .logical import Aggregate, AggCall, Filter, Join, Node, Project
from .parse import err, no_rule, position
from .scope import Lowering, PlanQuery, quote, with_ctes


def subquery_predicate(c: exp.Expression) -> tuple[bool, exp.Exists | exp.In] | None:
    """``(negated, EXISTS or IN node)`` when ``c`` is ``[NOT] EXISTS (q)`` or ``x [NOT] IN (q)``."""
    negated = isinstance(c, exp.Not)
    inner = c.this if negated else c
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Exists) or (isinstance(inner, exp.In) and inner.args.get("query") is not None):
        return negated, inner
    return None


def decorrelate(sub: exp.Expression, outer_scope: dict[tuple[str, str], str],
                sql: str) -> tuple[exp.Expression, list[tuple[exp.Expression, exp.Expression]], list[exp.Expression]]:
    """Split a subquery's WHERE into its own conditions and the correlated ones (those
    naming a relation of the enclosing query, whose columns are ``outer_scope``). Returns
    a copy of the subquery without the correlated conditions, the correlated equalities
    ``(inner expr, outer expr)`` and the other correlated conditions (a set operation is
    returned as it is, uncorrelated).

    Raises CompileError for a column of neither the subquery nor the enclosing query.
    """
    if not isinstance(sub, exp.Select):
        return sub, [], []
    inner = {r.alias_or_name.lower() for r in from_relations(sub)}
    outer = {a for a, _ in outer_scope}
    where = sub.args.get("where")
    own, eqs, other = [], [], []
    for c in (factor_or(where.this) if where else []):
        al = aliases(c)
        if al <= inner:
            own.append(c)
            continue
        if not (al - inner) <= outer:
            raise err(f"column reference in {c.sql(dialect='spark')}", "not visible here", c, sql)
        pair = None if uses_clock(c) else equi(c, inner, outer)
        if pair is not None:
            eqs.append(pair)
        else:
            other.append(c)
    new = sub.copy()
    new.set("where", exp.Where(this=exp.and_(*[o.copy() for o in own])) if own else None)
    return new, eqs, other


def plan_subquery_predicate(lw: Lowering, c: exp.Expression, current: Node, scope: dict[tuple[str, str], str],
                            ctes: dict[str, exp.Expression], plan_query: PlanQuery) -> Node:
    """``[NOT] EXISTS (q)`` and ``x [NOT] IN (q)`` (the WHERE conjunct ``c``) over
    ``current`` (whose columns are ``scope``): a semi or anti join with the decorrelated
    subquery (lowered by ``plan_query`` with ``ctes``), on its correlated equalities (and
    ``x = q's column``), the other correlated conditions as the residual. ``NOT IN`` keeps
    SQL's NULL rules: ``x NOT IN q`` is TRUE iff q is empty, or x is not NULL, matches nothing
    and q holds no NULL; q's row and NULL counts come from a global aggregate joined to every
    row. Returns the node with ``current``'s columns.

    Raises NoDeltaRule for IN of several columns, a correlated subquery with aggregates and a
    correlated NOT IN (the query holding it is recomputed).
    """
    negated, pred = subquery_predicate(c)
    if isinstance(pred, exp.Exists):
        sub, in_expr = pred.this, None
    else:
        sub, in_expr = pred.args["query"].this, pred.this
        if isinstance(in_expr, exp.Tuple):
            raise no_rule("IN with several columns", "compare one column, or use EXISTS", pred, lw.sql)
    sub_ctes = with_ctes(sub, ctes)
    new, eqs, other = decorrelate(sub, scope, lw.sql)
    correlated = bool(eqs or other)
    if any(uses_clock(o) for o in other):
        raise no_rule("current_date()/current_timestamp() in a correlated condition", "no delta rule yet",
                      pred, lw.sql)
    if correlated and (new.args.get("group") or any(e.find(exp.AggFunc) for e in new.expressions)):
        raise no_rule("correlated subquery with aggregates", "only scalar subqueries may aggregate; "
                  "rewrite as a join with a derived table", pred, lw.sql)
    if negated and in_expr is not None and correlated:
        raise no_rule("correlated NOT IN", "use NOT EXISTS (NOT IN's NULL rules make it a different "
                  "query)", pred, lw.sql)
    # the subquery's columns the conditions need, as outputs __c0, __c1, ..
    inner_aliases = {r.alias_or_name.lower() for r in from_relations(sub)} if isinstance(sub, exp.Select) else set()
    inner_cols: list[exp.Column] = []
    for cond in [i for i, _ in eqs] + other:
        for col in own_columns(cond):
            if col.table.lower() in inner_aliases and all(col != x for x in inner_cols):
                inner_cols.append(col)
    outs = [exp.alias_(x.copy(), f"__c{i}") for i, x in enumerate(inner_cols)]
    if in_expr is not None:
        if not isinstance(new, exp.Select):  # a set operation: one column by position
            node, souts = plan_query(lw, new, sub_ctes)
            if len(souts) != 1:
                raise err("IN subquery with several columns", "select exactly one column", pred, lw.sql)
            inner_map, in_col = {}, souts[0][1]
        else:
            if len(new.expressions) != 1:
                raise err("IN subquery with several columns", "select exactly one column", pred, lw.sql)
            new.set("expressions", [exp.alias_(new.expressions[0].unalias().copy(), "__in")] + outs)
            node, souts = plan_query(lw, new, sub_ctes)
            inner_map, in_col = dict(souts), dict(souts)["__in"]
    else:
        new.set("expressions", outs or [exp.alias_(exp.Literal.number(1), "__one")])
        node, souts = plan_query(lw, new, sub_ctes)
        inner_map, in_col = dict(souts), None
    inner_scope = {(x.table.lower(), x.name.lower()): inner_map[f"__c{i}"] for i, x in enumerate(inner_cols)}
    lkeys = [translate(o, scope, lw.sql) for _, o in eqs]
    rkeys = [translate(i, inner_scope, lw.sql) for i, _ in eqs]
    if in_col is not None:
        lkeys.append(translate(in_expr, scope, lw.sql))
        rkeys.append(quote(in_col))
    if not lkeys:  # uncorrelated EXISTS, or only non-equality correlation
        lkeys, rkeys = ["1"], ["1"]
    residual = " AND ".join(translate(o, {**scope, **inner_scope}, lw.sql) for o in other) or None
    if negated and in_col is not None:
        counted, couts = plan_query(lw, sub.copy(), sub_ctes)
        n, nn = lw.names.new("__in_rows"), lw.names.new("__in_nonnull")
        agg = Aggregate(columns=[n, nn], child=counted, aggs=[AggCall(n, "count_star", None),
                                                              AggCall(nn, "count", quote(couts[0][1]))])
        current = Join(columns=current.columns + agg.columns, left=current, right=agg, kind="inner",
                       left_keys=["1"], right_keys=["1"])
        current = Join(columns=list(current.columns), left=current, right=node, kind="anti",
                       left_keys=lkeys, right_keys=rkeys)
        return Filter(columns=list(current.columns), child=current,
                      predicate=f"{quote(n)} = 0 OR ({lkeys[-1]} IS NOT NULL AND {quote(n)} = {quote(nn)})")
    return Join(columns=list(current.columns), left=current, right=node, kind="anti" if negated else "semi",
                left_keys=lkeys, right_keys=rkeys, residual=residual)


def as_counts(c: exp.Expression) -> exp.Expression:
    """The WHERE condition ``c`` with each ``EXISTS (q)`` and ``x IN (q)`` nested in it (under
    OR, NOT, CASE: not a conjunct of its own, which is a semi join) written as comparisons of
    scalar COUNT subqueries, which are maintained as joins (:func:`plan_scalar_subqueries`):

    * ``EXISTS (q)`` -> ``(SELECT COUNT(*) FROM .. WHERE ..) > 0``, for ``q`` a plain SELECT
      (no GROUP BY, aggregate, HAVING, window, LIMIT); its correlated equalities group the
      count, a row without a group counting 0;
    * ``x IN (q)``, ``q`` uncorrelated, of one column ``y`` -> SQL's three values: TRUE when
      a row of ``q`` has ``y = x``, else NULL when ``q`` holds a NULL, or has rows and ``x`` is
      NULL, else FALSE; each a COUNT over ``q`` as a derived table.

    Anything else is left as it is (and refused where it is translated)."""
    def fn(n):
        if isinstance(n, exp.Exists) and _plain(n.this):
            count = n.this.copy()
            count.set("expressions", [exp.alias_(exp.Count(this=exp.Star()), "__n")])
            return exp.GT(this=exp.Subquery(this=count), expression=exp.Literal.number(0))
        query = n.args.get("query") if isinstance(n, exp.In) else None
        if query is not None and not isinstance(n.this, exp.Tuple) and isinstance(query.this, exp.Select) \
                and len(query.this.expressions) == 1 and _uncorrelated(query.this):
            rows = query.this.copy()
            rows.set("expressions", [exp.alias_(rows.expressions[0].unalias(), "__y")])

            def count(cond: str | None) -> exp.Expression:
                sel = exp.select(exp.alias_(exp.Count(this=exp.Star()), "__n")).from_(
                    exp.Subquery(this=rows.copy(), alias=exp.TableAlias(this=exp.to_identifier("__in_rows"))))
                if cond is not None:
                    sel = sel.where(exp.maybe_parse(cond, dialect="spark"))
                return exp.GT(this=exp.Subquery(this=sel), expression=exp.Literal.number(0))
            x = n.this.copy()
            matched = count("__in_rows.__y = __x")
            for col in matched.find_all(exp.Column):
                if col.name == "__x":
                    col.replace(x.copy())
            return exp.Case(ifs=[exp.If(this=matched, true=exp.true()),
                                 exp.If(this=exp.or_(count("__in_rows.__y IS NULL"),
                                                     exp.and_(exp.Is(this=x, expression=exp.null()), count(None))),
                                        true=exp.cast(exp.null(), "BOOLEAN"))],
                            default=exp.false())
        return n
    return c.transform(fn)


def _plain(q: exp.Expression) -> bool:
    """Whether ``q`` is a SELECT whose rows are its FROM's rows filtered (no GROUP BY,
    aggregate, HAVING, window, DISTINCT, LIMIT): what ``EXISTS`` asks of it is a count."""
    return isinstance(q, exp.Select) and not any(q.args.get(k) for k in ("group", "having", "limit", "distinct",
                                                                           "qualify", "offset")) \
        and not any(e.find(exp.AggFunc, exp.Window) for e in q.expressions)


def _uncorrelated(q: exp.Select) -> bool:
    """Whether every column of ``q`` (nested subqueries included) names a relation of ``q``."""
    names = {t.alias_or_name.lower() for t in q.find_all(exp.Table, exp.Subquery) if t.alias_or_name}
    return all(c.table.lower() in names for c in q.find_all(exp.Column) if c.table)


def plan_scalar_subqueries(lw: Lowering, exprs: list[exp.Expression], current: Node,
                           scope: dict[tuple[str, str], str], ctes: dict[str, exp.Expression],
                           plan_query: PlanQuery) -> tuple[Node, dict[tuple[str, str], str]]:
    """Plan each scalar subquery in ``exprs`` as a join onto ``current`` (whose columns are
    ``scope``; subqueries lowered by ``plan_query`` with ``ctes``) and mark it with the
    column that holds its value: ``meta[SCALAR_VALUE]`` of the subquery node, read by
    :func:`.expressions.translate` (the marks are this pass's output besides the node).
    Returns the node (``current``'s columns plus the value columns) and the scope.

    Uncorrelated: a global aggregate (exactly one row) joined to every row. Correlated by
    equalities: the subquery grouped by its correlated columns, LEFT joined on them; a row
    without a group gets the aggregate's value over no rows (COUNT 0, others NULL), which
    avoids the classic COUNT bug of this decorrelation.

    Any other uncorrelated one: its rows counted, and its value when there is at most one
    (:func:`_at_most_one_row`).

    Raises CompileError for a scalar subquery of several columns; NoDeltaRule for a correlated
    one that is not an aggregate without GROUP BY, and one correlated by other conditions
    than equalities.
    """
    scope = dict(scope)
    for e in exprs:
        for sq in list(e.walk(prune=lambda n: isinstance(n, exp.Subquery))):
            if not isinstance(sq, exp.Subquery) or isinstance(sq.parent, exp.In):
                continue
            current, col = _scalar_subquery(lw, sq, current, scope, ctes, plan_query)
            sq.meta[SCALAR_VALUE] = col
    return current, scope


def _at_most_one_row(lw: Lowering, sq: exp.Subquery, scope: dict[tuple[str, str], str]) -> exp.Select:
    """An uncorrelated scalar subquery ``sq`` that is not a global aggregate (``SELECT DISTINCT
    d_month_seq ..``, an aggregate with GROUP BY) as one: its rows counted, the value their
    MAX when there is at most one (NULL for none, as SQL's), else the batch fails with Spark's
    ``[SCALAR_SUBQUERY_TOO_MANY_ROWS]`` (Spark checks the one row when the query runs, and so
    does this, at every batch: nothing is committed).

    Raises NoDeltaRule for a correlated one."""
    _, eqs, other = decorrelate(sq.this, scope, lw.sql)
    if eqs or other:
        raise no_rule("correlated scalar subquery without an aggregate", "it must return one row: select an "
                      "aggregate without GROUP BY (or rewrite as a join)", sq, lw.sql)
    line, col = position(sq, lw.sql)
    where = f" (line {line}, col {col})" if line else ""
    message = (f"[SCALAR_SUBQUERY_TOO_MANY_ROWS] More than one row returned by a subquery used as an expression"
               f"{where} of the model")
    inner = sq.this.copy()
    inner.set("expressions", [exp.alias_(inner.expressions[0].unalias(), "__v")])
    wrapper = exp.maybe_parse(f"SELECT CASE WHEN COUNT(*) > 1 THEN raise_error('{message}') "
                              f"ELSE MAX(__rows.__v) END AS __v FROM __rows", dialect="spark")
    wrapper.find(exp.Table).replace(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("__rows"))))
    return wrapper


def _scalar_subquery(lw: Lowering, sq: exp.Subquery, current: Node, scope: dict[tuple[str, str], str],
                     ctes: dict[str, exp.Expression], plan_query: PlanQuery) -> tuple[Node, str]:
    """One scalar subquery ``sq`` joined onto ``current``: the node and its value column."""
    sub = sq.this
    if not isinstance(sub, exp.Select) or len(sub.expressions) != 1:
        raise err("scalar subquery", "a scalar subquery selects exactly one value", sq, lw.sql)
    sub_ctes = with_ctes(sub, ctes)
    if sub.args.get("group") or not sub.expressions[0].find(exp.AggFunc):
        sub = _at_most_one_row(lw, sq, scope)
    value = sub.expressions[0].unalias()
    new, eqs, other = decorrelate(sub, scope, lw.sql)
    if other:
        raise no_rule("correlated scalar subquery condition", "only equalities with the outer query "
                  f"are supported, not {other[0].sql(dialect='spark')}", other[0], lw.sql)
    keys = [exp.alias_(i.copy(), f"__k{n}") for n, (i, _) in enumerate(eqs)]
    new.set("expressions", keys + [exp.alias_(value.copy(), "__v"), exp.alias_(exp.true(), "__present")])
    if eqs:
        new.set("group", exp.Group(expressions=[i.copy() for i, _ in eqs]))
    node, outs = plan_query(lw, new, sub_ctes)
    od = dict(outs)
    col = lw.names.new("__scalar")
    if eqs:
        current = Join(columns=current.columns + node.columns, left=current, right=node, kind="left",
                       left_keys=[translate(o, scope, lw.sql) for _, o in eqs],
                       right_keys=[quote(od[f"__k{n}"]) for n in range(len(eqs))])

        def empty(n):
            # the aggregate over no rows (a FILTER clause with it: COUNT(..) FILTER (..) is 0)
            agg = n.this if isinstance(n, exp.Filter) else n
            if isinstance(agg, exp.Count):
                return exp.Literal.number(0)
            if isinstance(agg, exp.AggFunc):
                return exp.null()
            return n
        empty_sql = value.copy().transform(empty).sql(dialect="spark")
        expr = f"CASE WHEN {quote(od['__present'])} IS NULL THEN {empty_sql} ELSE {quote(od['__v'])} END"
    else:
        current = Join(columns=current.columns + node.columns, left=current, right=node, kind="inner",
                       left_keys=["1"], right_keys=["1"])
        expr = quote(od["__v"])
    return Project(columns=current.columns + [col], child=current,
                   exprs=[quote(c) for c in current.columns] + [expr]), col
