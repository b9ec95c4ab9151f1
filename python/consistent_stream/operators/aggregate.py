"""GROUP BY aggregation under retractions: SUM, COUNT, COUNT(*), AVG, MIN, MAX and the
DISTINCT forms COUNT/SUM/AVG(DISTINCT x).

State (two kinds of arrangement, both append-only logs summed on read):

* ``acc``: per group and batch the linear accumulators ``__count = sum(w)`` and per
  argument ``s_i = sum(x*w)``, ``n_i = sum(w) over non-NULL x``. Linear aggregates are
  differences of these: SUM = s (NULL when n = 0), COUNT(x) = n, COUNT(*) = __count,
  AVG = s / n.
* ``vals_<i>`` for each MIN/MAX/DISTINCT argument: the multiset of (group, value) with
  weights, so that when the current extreme is retracted the next one is known (Flink's
  MinWithRetract / MaxWithRetract accumulators, kept as a Z-set instead of a map), and the
  distinct values of a group are those with a positive weight. These aggregates are Spark's
  own functions over the live values of the touched groups, so their types and rounding
  are batch evaluation's.

Delta rule, for the set G of groups touched by the batch:

    d(agg(A)) = + rows(agg(A_old + dA) over G where count > 0)
                - rows(agg(A_old) over G where count > 0)

consolidated, so an untouched value cancels. A global aggregate (no GROUP BY) has exactly
one output row at every version, with SQL's values for an empty input (COUNT 0, others NULL).

In: the input changelog (input columns + ``__weight``). Out: group columns, one column per
aggregate, ``__weight``.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

from ..changelog import WEIGHT, consolidate
from ..plan.logical import LINEAR_AGGS, MULTISET_AGGS, AggCall
from ..state import StateStore
from .keyed import restrict_to_keys

_MULTISET_FN = {"min": F.min, "max": F.max, "count_distinct": F.count, "sum_distinct": F.sum,
                "avg_distinct": F.avg}


def _avg_expr(s: str, n: str, arg_type) -> F.Column:
    """AVG as Spark computes it: for DECIMAL(p, s) the sum is DECIMAL(p+10, s) divided by a
    DECIMAL(20, 0) count, the result DECIMAL(p+4, s+4); otherwise DOUBLE."""
    if isinstance(arg_type, DecimalType):
        p, sc = arg_type.precision, arg_type.scale
        return (F.col(s).cast(DecimalType(min(38, p + 10), sc)) / F.col(n).cast(DecimalType(20, 0))) \
            .cast(DecimalType(min(38, p + 4), min(38, sc + 4)))
    return F.col(s).cast("double") / F.col(n).cast("double")


def aggregate_delta(state: StateStore, op_id: str, delta: DataFrame, group_names: list[str],
                    group_exprs: list[str], aggs: list[AggCall], first_batch: bool) -> DataFrame:
    """The aggregate's output changelog for one batch; stages its arrangements.

    ``first_batch``: no earlier version of the output exists (a global aggregate then has
    no previous row to retract).
    """
    g = list(group_names)
    args = {a.name: f"__x_{i}" for i, a in enumerate(aggs) if a.arg is not None}
    pre = delta.select(*[F.expr(e).alias(n) for n, e in zip(g, group_exprs)],
                       *[F.expr(a.arg).alias(args[a.name]) for a in aggs if a.arg is not None],
                       F.col(WEIGHT))
    arg_types = {f.name: f.dataType for f in pre.schema.fields}

    linear = [a for a in aggs if a.func in LINEAR_AGGS]
    multiset = [a for a in aggs if a.func in MULTISET_AGGS]
    acc_cols = [F.sum(WEIGHT).alias("__count")]
    for a in linear:
        x = args[a.name]
        if a.func in ("sum", "avg"):
            acc_cols.append(F.sum(F.col(x) * F.col(WEIGHT)).alias(f"__s_{x}"))
        acc_cols.append(F.sum(F.when(F.col(x).isNotNull(), F.col(WEIGHT)).otherwise(F.lit(0))).alias(f"__n_{x}"))
    partial = pre.groupBy(*g).agg(*acc_cols) if g else pre.groupBy().agg(*acc_cols)
    value_cols = [c for c in partial.columns if c not in g]

    def sum_acc(df: DataFrame) -> DataFrame:
        sums = [F.sum(c).alias(c) for c in value_cols]
        out = df.groupBy(*g).agg(*sums) if g else df.groupBy().agg(*sums)
        return out

    def compact_acc(df: DataFrame) -> DataFrame:
        s = sum_acc(df)
        nonzero = None
        for c in value_cols:
            e = F.coalesce(F.col(c), F.lit(0)) != 0
            nonzero = e if nonzero is None else nonzero | e
        return s.where(nonzero)

    acc_old_log = state.read(f"{op_id}_acc", partial.schema)
    state.stage(f"{op_id}_acc", partial, compact=compact_acc)
    touched = pre.select(*g).distinct() if g else None
    acc_touched = restrict_to_keys(acc_old_log, g, touched, g) if g else acc_old_log
    acc_old = sum_acc(acc_touched)
    acc_new = sum_acc(acc_touched.unionByName(partial))

    ext_old, ext_new = [], []
    staged_vals: dict[str, tuple[DataFrame, DataFrame]] = {}
    for a in multiset:
        x = args[a.name]
        if x not in staged_vals:  # one multiset per argument, shared by its aggregates
            vals = pre.where(F.col(x).isNotNull()).select(*g, F.col(x), F.col(WEIGHT))
            vals_old_log = state.read(f"{op_id}_vals_{x}", vals.schema)
            state.stage(f"{op_id}_vals_{x}", vals)
            vt = restrict_to_keys(vals_old_log, g, touched, g) if g else vals_old_log
            staged_vals[x] = (vt, vals)
        vt, vals = staged_vals[x]
        fn = _MULTISET_FN[a.func]
        for src, outl in ((vt, ext_old), (vt.unionByName(vals), ext_new)):
            live = consolidate(src).where(F.col(WEIGHT) > 0)  # each live (group, value) once
            ext = (live.groupBy(*g) if g else live.groupBy()).agg(fn(x).alias(a.name))
            outl.append(ext)

    def rows(acc: DataFrame, exts: list[DataFrame], weight: int) -> DataFrame:
        if not g:
            # a global aggregate always has its one row, even over an empty input
            base = acc.sparkSession.createDataFrame([(1,)], "__one int")
            acc = base.join(acc, how="left").drop("__one")
            for e in exts:
                acc = acc.crossJoin(base.join(e, how="left").drop("__one"))
        else:
            for e in exts:
                acc = _join_null_safe(acc, e, g)
            acc = acc.where(F.col("__count") > 0)
        cols = [F.col(c) for c in g]
        for a in aggs:
            if a.func == "count_star":
                cols.append(F.coalesce(F.col("__count"), F.lit(0)).cast("bigint").alias(a.name))
                continue
            if a.func == "count_distinct":
                cols.append(F.coalesce(F.col(a.name), F.lit(0)).cast("bigint").alias(a.name))
                continue
            if a.func in MULTISET_AGGS:
                cols.append(F.col(a.name))
                continue
            x = args[a.name]
            n = F.coalesce(F.col(f"__n_{x}"), F.lit(0))
            if a.func == "count":
                cols.append(n.cast("bigint").alias(a.name))
            elif a.func == "sum":
                cols.append(F.when(n > 0, F.col(f"__s_{x}")).alias(a.name))
            else:
                cols.append(F.when(n > 0, _avg_expr(f"__s_{x}", f"__n_{x}", arg_types[x])).alias(a.name))
        return acc.select(*cols, F.lit(weight).cast("bigint").alias(WEIGHT))

    new_rows = rows(acc_new, ext_new, 1)
    if first_batch:
        return new_rows
    return consolidate(new_rows.unionByName(rows(acc_old, ext_old, -1)))


def _join_null_safe(a: DataFrame, b: DataFrame, keys: list[str]) -> DataFrame:
    b2 = b.select(*[F.col(k).alias(f"__j_{k}") for k in keys], *[c for c in b.columns if c not in keys])
    cond = None
    for k in keys:
        e = a[k].eqNullSafe(b2[f"__j_{k}"])
        cond = e if cond is None else cond & e
    return a.join(b2, cond, "left").drop(*[f"__j_{k}" for k in keys])
