"""Rule: set operations and DISTINCT as aggregates and joins.

Columns are matched by position, named from the left. UNION ALL is linear (a
:class:`~.logical.Union`); UNION is UNION ALL then DISTINCT (:func:`distinct`: a GROUP BY of
every column); INTERSECT and EXCEPT are a semi and an anti join of DISTINCT(left) with the
right on all columns (NULLs equal); INTERSECT ALL and EXCEPT ALL join the rows' counts and
repeat each row min(m, n) or max(m - n, 0) times (:class:`~.logical.Reweight`).

Example::

    select cid from src.orders except all select id from src.customers

plans to (:func:`.logical.explain`)::

    Reweight by __times
      Project `cid` AS cid, greatest(`__count_l` - coalesce(`__count_r`, 0), 0) AS __times
        Join left on `cid` <=> `cid_r`
          Aggregate by ['`cid`']: count_star(None)
            Project `cid` AS cid
              Project `orders__cid` AS cid
                Scan src.orders ['cid']
          Aggregate by ['`cid_r`']: count_star(None)
            Project `id` AS cid_r
              Project `customers__id` AS id
                Scan src.customers ['id']
"""
from __future__ import annotations

from sqlglot import exp

from .logical import Aggregate, AggCall, Join, Node, Project, Reweight, Union
from .parse import err
from .scope import Lowering, PlanQuery, quote, with_ctes


def distinct(node: Node) -> Node:
    """SELECT DISTINCT of ``node``: a GROUP BY of every column without aggregates (a row is
    in the output while its count is above zero)."""
    return Aggregate(columns=list(node.columns), child=node, group_names=list(node.columns),
                     group_exprs=[quote(c) for c in node.columns], aggs=[])


def plan_set_operation(lw: Lowering, q: exp.SetOperation, outer_ctes: dict[str, exp.Expression], top: bool,
                       plan_query: PlanQuery) -> tuple[Node, list[tuple[str, str]]]:
    """The set operation ``q`` (its sides lowered by ``plan_query``, with ``outer_ctes`` and
    ``q``'s own CTEs): the node and its outputs ``[(name, internal column)]``; the model's
    own outputs (``top``) keep the left side's names.

    Raises CompileError when the sides have different numbers of columns.
    """
    ctes = with_ctes(q, outer_ctes)
    left, louts = plan_query(lw, q.this, ctes)
    right, routs = plan_query(lw, q.expression, ctes)
    op = type(q).__name__.upper()
    if len(louts) != len(routs):
        raise err(f"{op} of queries with different numbers of columns",
                  f"{len(louts)} columns on the left, {len(routs)} on the right", q, lw.sql)
    if top:
        names = [n for n, _ in louts]
        lw.names.used.update(n.lower() for n in names)
    else:
        names = [lw.names.new(n) for n, _ in louts]
    l_ = Project(columns=names, child=left, exprs=[quote(i) for _, i in louts])
    is_distinct = q.args.get("distinct") is not False
    if isinstance(q, exp.Union):
        r = Project(columns=names, child=right, exprs=[quote(i) for _, i in routs])
        node: Node = Union(columns=names, left=l_, right=r)
        if is_distinct:
            node = distinct(node)
        return node, list(zip([n.lower() for n, _ in louts], names))
    rnames = [lw.names.new(f"{n}_r") for n in names]
    r = Project(columns=rnames, child=right, exprs=[quote(i) for _, i in routs])
    lk, rk = [quote(n) for n in names], [quote(n) for n in rnames]
    if is_distinct:
        node = Join(columns=list(names), left=distinct(l_), right=r,
                    kind="semi" if isinstance(q, exp.Intersect) else "anti",
                    left_keys=lk, right_keys=rk, null_safe=True)
    else:
        ca, cb, n = lw.names.new("__count_l"), lw.names.new("__count_r"), lw.names.new("__times")
        la = Aggregate(columns=names + [ca], child=l_, group_names=list(names), group_exprs=lk,
                       aggs=[AggCall(ca, "count_star", None)])
        rb = Aggregate(columns=rnames + [cb], child=r, group_names=list(rnames), group_exprs=rk,
                       aggs=[AggCall(cb, "count_star", None)])
        if isinstance(q, exp.Intersect):
            j = Join(columns=la.columns + rb.columns, left=la, right=rb, kind="inner",
                     left_keys=lk, right_keys=rk, null_safe=True)
            times = f"least({quote(ca)}, {quote(cb)})"
        else:
            j = Join(columns=la.columns + rb.columns, left=la, right=rb, kind="left",
                     left_keys=lk, right_keys=rk, null_safe=True)
            times = f"greatest({quote(ca)} - coalesce({quote(cb)}, 0), 0)"
        p = Project(columns=names + [n], child=j, exprs=lk + [times])
        node = Reweight(columns=list(names), child=p, count=n)
    return node, list(zip([n.lower() for n, _ in louts], names))
