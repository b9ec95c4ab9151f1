"""Eager aggregation: an aggregate over an inner join sums one side per join key before the
join, so that side is arranged once per key instead of once per row.

This is Yan and Larson's *eager group-by* ("Eager Aggregation and Lazy Aggregation", VLDB
1995), in the one case where it can only shrink the state. For

    Aggregate(G; aggs) over Join(L, S; inner, L.k = S.j)

where

* every aggregate is SUM, COUNT or COUNT(*) (not their DISTINCT forms) and every argument
  reads columns of S only;
* every group expression is a plain column, and those of S are among its join columns ``j``;
* ``j`` are plain columns of S, the join has no band and its residual reads no column of S;
* S is not already unique on ``j`` (:func:`.keys.unique_keys`): grouping makes fewer rows;

S is replaced by ``S' = Aggregate(j; a partial SUM or COUNT per aggregate) over S``, and each
aggregate above sums the partials: SUM(x) -> SUM(partial sum), typed as its argument (the SUM
it completes, :attr:`~.logical.AggCall.merge`); COUNT(x) and COUNT(*) -> SUM(partial count).

Why it is exact. A row of S' stands for the rows of S with its key. They meet exactly the
same rows of L (the join reads only ``j`` of S) and fall into the same group above (S's
group columns are among ``j``). So each joined row ``(l, s')`` adds the sum of those rows'
values, once per ``l``, as the rows ``(l, s)`` did. A partial SUM is NULL when all its rows'
values are, and the SUM above skips it as it skipped them. A NULL key meets nothing, summed
or not. A FLOAT or DOUBLE SUM is re-associated: each partial is a compensated sum and so is
the sum of partials (:mod:`consistent_stream.fsum`), so the result stays within rounding of
batch evaluation's, whose order of additions is unspecified anyway (such columns are compared
with a tolerance, :mod:`.inexact`).

Why it pays. Without it, the join arranges S: one row per row of S. With it, the join reads
S' from the partial aggregate's accumulators in place, one row per key (the shared
arrangement of an aggregate's output read by its group columns,
``exec.evaluator.BatchEvaluator._aggregate_output``), so no arrangement of S is written at
all. A rebuild writes that much less state; a batch's change to S is summed per key before it
meets L; a change to L reads one row per key of S'.

Delta rule: none of its own. The rewritten plan is made of the aggregate and join operators,
each with its own rule.

Example: TPC-H Q3 (``group by l_orderkey, o_orderdate, o_shippriority`` of
``sum(l_extendedprice * (1 - l_discount))`` over ``(customer join orders) join lineitem on
l_orderkey = o_orderkey``)::

    Aggregate by [l_orderkey, o_orderdate, o_shippriority]: sum(`__p_sum`) (merge)
      Join inner on o_orderkey = l_orderkey
        <customer join orders>
        Aggregate by [l_orderkey]: sum(l_extendedprice * (1 - l_discount)) AS __p_sum
          <lineitem where l_shipdate > ..>
"""
from __future__ import annotations

from .keys import unique_keys
from .logical import AggCall, Aggregate, Join, Node, plain_column, walk
from .prune import referenced
from .scope import Names, quote

PUSHED = ("sum", "count", "count_star")
"""The aggregates a partial aggregate computes and the one above completes by a SUM."""


def push_partial_aggregates(root: Node) -> Node:
    """Rewrite ``root``'s plan in place (see the module docstring): every aggregate that meets
    the conditions gets its partial aggregate below its join. Run on a pruned plan before
    :func:`.logical.assign_ids`. Returns ``root``."""
    names = Names()
    names.used.update(c.lower() for n in walk(root) for c in n.columns)
    for node in list(walk(root)):
        if isinstance(node, Aggregate):
            _push(node, names)
    return root


def _push(agg: Aggregate, names: Names) -> None:
    join = agg.child
    if not isinstance(join, Join) or join.kind != "inner" or join.bands or not join.left_keys:
        return
    if not agg.group_exprs or not agg.aggs or any(a.func not in PUSHED or a.merge for a in agg.aggs):
        return
    groups = [plain_column(e) for e in agg.group_exprs]
    if None in groups:
        return
    args: set[str] = set().union(*(referenced(a.arg) for a in agg.aggs))
    residual = referenced(join.residual)
    for role in ("right", "left"):
        side = join.right if role == "right" else join.left
        keys = [plain_column(k) for k in (join.right_keys if role == "right" else join.left_keys)]
        columns = set(side.columns)
        if None in keys or len(set(keys)) != len(keys) or not args <= columns or residual & columns:
            continue
        if not {g for g in groups if g in columns} <= set(keys):
            continue
        if any(set(k) <= set(keys) for k in unique_keys(side)):
            continue   # one row per key already
        partials, completed = [], []
        for a in agg.aggs:
            p = names.new(f"__p_{a.func}")
            partials.append(AggCall(p, a.func, a.arg))
            completed.append(AggCall(a.name, "sum", quote(p), merge=a.func == "sum"))
        partial = Aggregate(columns=keys + [p.name for p in partials], child=side, group_names=list(keys),
                            group_exprs=[quote(k) for k in keys], aggs=partials)
        if role == "right":
            join.right = partial
        else:
            join.left = partial
        join.columns = list(join.left.columns) + list(join.right.columns)
        agg.aggs = completed
        return
