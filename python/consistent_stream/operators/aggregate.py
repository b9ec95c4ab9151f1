"""GROUP BY aggregation under retractions: SUM, COUNT, COUNT(*), AVG, MIN, MAX and the
DISTINCT forms COUNT/SUM/AVG(DISTINCT x).

State (two kinds of arrangement, both additive, keyed by the group columns):

* ``acc``: per group the linear accumulators ``<op>__count = sum(w)`` and per argument
  ``<op>__s<i> = sum(x*w)``, ``<op>__n<i> = sum(w) over non-NULL x``. Linear aggregates are
  differences of these: SUM = s (NULL when n = 0), COUNT(x) = n, COUNT(*) = count,
  AVG = s / n. A batch appends its partial accumulators; a read sums them per group.
* ``vals<i>`` for each MIN/MAX/DISTINCT argument: the multiset of (group, value) with counts
  (``__weight``), consolidated per batch, so that when the current extreme is retracted the
  next one is known (Flink's MinWithRetract / MaxWithRetract accumulators, kept as a Z-set
  instead of a map), and the distinct values of a group are those with a positive count.
  These aggregates are Spark's own functions over the live values of the touched groups, so
  their types and rounding are batch evaluation's.

Delta rule, for the set G of groups touched by the batch (the groups of its partials):

    d(agg(A)) = + rows(agg(A_old + dA) over G where count > 0)
                - rows(agg(A_old) over G where count > 0)

consolidated, so an untouched value cancels; state is read only at G. A global aggregate (no
GROUP BY) has exactly one output row at every version, with SQL's values for an empty input
(COUNT 0, others NULL).

Example: A_old = {(g=a, x=5)}, dA = {(a, 7): +1} -> d(sum(x) by g) = {(a, 12): +1, (a, 5): -1}.

In: the input changelog, already projected to the group columns and one column per distinct
argument expression (``args``), + ``__weight``. Out: group columns, one column per aggregate,
``__weight``; None when the change is known to be empty.
"""
from __future__ import annotations

from typing import Callable, Protocol

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DecimalType

from ..changelog import WEIGHT, Changelog, consolidate
from ..plan.logical import LINEAR_AGGS, MULTISET_AGGS, AggCall
from .keyed import Lookup

_MULTISET_FN = {"min": F.min, "max": F.max, "count_distinct": F.count, "sum_distinct": F.sum,
                "avg_distinct": F.avg}


class OperatorState(Protocol):
    """The arrangements of one operator, by role (``acc``, ``vals0``, ``left``, ...).

    ``stage(role, df, key, additive, live)``: the batch's change to arrangement ``role``
    (materialized once: on the driver when change-sized, else by executors), returned as a
    changelog to compute with. ``old(role)``: that arrangement as of the previous batch.
    """

    def stage(self, role: str, df: DataFrame, key: list[str], additive: tuple[str, ...] = (WEIGHT,),
              live: str | None = None) -> Changelog: ...

    def old(self, role: str) -> Lookup: ...


def _avg_expr(s: str, n: str, arg_type: DataType) -> F.Column:
    """AVG as Spark computes it: for DECIMAL(p, s) the sum is DECIMAL(p+10, s) divided by a
    DECIMAL(20, 0) count, the result DECIMAL(p+4, s+4); otherwise DOUBLE."""
    if isinstance(arg_type, DecimalType):
        p, sc = arg_type.precision, arg_type.scale
        return (F.col(s).cast(DecimalType(min(38, p + 10), sc)) / F.col(n).cast(DecimalType(20, 0))) \
            .cast(DecimalType(min(38, p + 4), min(38, sc + 4)))
    return F.col(s).cast("double") / F.col(n).cast("double")


def aggregate_delta(op_id: str, delta: Changelog, group_names: list[str], aggs: list[AggCall],
                    args: dict[str, str], state: OperatorState, first: bool,
                    materialize: Callable[[DataFrame], Changelog]) -> DataFrame | None:
    """The aggregate's output changelog for one batch; stages its arrangements.

    ``args``: aggregate name -> the input column holding its argument (aggregates over the
    same expression share it, and share one value multiset). ``first``: no earlier version of
    the output exists (a global aggregate then has no previous row to retract).
    ``materialize``: used for the input when several arrangements are computed from it.
    """
    g = list(group_names)
    if delta.empty and not (first and not g):
        return None
    arg_types = {f.name: f.dataType for f in delta.df.schema.fields}
    linear = [a for a in aggs if a.func in LINEAR_AGGS]
    multiset_args = list(dict.fromkeys(args[a.name] for a in aggs if a.func in MULTISET_AGGS))
    if multiset_args and delta.arrow is None and delta.rows is None:
        delta = materialize(delta.df)  # read by the accumulators and by each value multiset

    count = f"{op_id}__count"
    acc_cols = [F.sum(WEIGHT).cast("bigint").alias(count)]
    linear_args = list(dict.fromkeys(args[a.name] for a in linear))
    s_col = {x: f"{op_id}__s{i}" for i, x in enumerate(linear_args)}
    n_col = {x: f"{op_id}__n{i}" for i, x in enumerate(linear_args)}
    for x in linear_args:
        if any(a.func in ("sum", "avg") and args[a.name] == x for a in linear):
            acc_cols.append(F.sum(F.col(f"`{x}`") * F.col(WEIGHT)).alias(s_col[x]))
        acc_cols.append(F.sum(F.when(F.col(f"`{x}`").isNotNull(), F.col(WEIGHT)).otherwise(F.lit(0)))
                        .cast("bigint").alias(n_col[x]))
    pre = delta.df
    partial_df = pre.groupBy(*[F.col(f"`{c}`") for c in g]).agg(*acc_cols) if g else pre.groupBy().agg(*acc_cols)
    value_cols = [c for c in partial_df.columns if c not in g]
    partial = state.stage("acc", partial_df, g, additive=tuple(value_cols), live=f"`{count}` != 0")
    touched = partial.keys(g) if g else None

    def summed(df: DataFrame) -> DataFrame:
        sums = [F.sum(F.col(f"`{c}`")).alias(c) for c in value_cols]
        return df.groupBy(*[F.col(f"`{c}`") for c in g]).agg(*sums) if g else df.groupBy().agg(*sums)

    acc_lookup = state.old("acc")
    acc_old = None
    if not acc_lookup.empty and not first and (touched is None or not touched.empty):
        read = acc_lookup.read(touched) if g else acc_lookup.read(None)
        acc_old = None if read.empty else read.df
    acc_new = summed(partial.df if acc_old is None else acc_old.unionByName(partial.df))
    acc_before = summed(acc_old) if acc_old is not None else None

    ext_new: dict[str, DataFrame] = {}
    ext_old: dict[str, DataFrame] = {}
    for i, x in enumerate(multiset_args):
        vals_df = consolidate(delta.df.where(F.col(f"`{x}`").isNotNull())
                              .select(*[F.col(f"`{c}`") for c in g], F.col(f"`{x}`"), F.col(WEIGHT)))
        vals = state.stage(f"vals{i}", vals_df, g)
        lookup = state.old(f"vals{i}")
        old = None
        if not lookup.empty and not first:
            read = lookup.read(touched) if g else lookup.read(None)
            old = None if read.empty else read.df
        for a in [a for a in aggs if a.func in MULTISET_AGGS and args[a.name] == x]:
            fn = _MULTISET_FN[a.func]
            for src, out in ((old, ext_old), (vals.df if old is None else old.unionByName(vals.df), ext_new)):
                if src is None:
                    continue
                live = consolidate(src).where(F.col(WEIGHT) > 0)  # each live (group, value) once
                out[a.name] = (live.groupBy(*[F.col(f"`{c}`") for c in g]) if g else live.groupBy()) \
                    .agg(fn(F.col(f"`{x}`")).alias(a.name))

    def rows(acc: DataFrame, exts: dict[str, DataFrame], weight: int) -> DataFrame:
        if not g:
            # a global aggregate always has its one row, even over an empty input
            base = acc.sparkSession.createDataFrame([(1,)], "__one int")
            acc = base.join(acc, how="left").drop("__one")
            for e in exts.values():
                acc = acc.crossJoin(base.join(e, how="left").drop("__one"))
        else:
            for e in exts.values():
                acc = _join_null_safe(acc, e, g)
            acc = acc.where(F.col(f"`{count}`") > 0)
        cols = [F.col(f"`{c}`") for c in g]
        for a in aggs:
            if a.func == "count_star":
                cols.append(F.coalesce(F.col(f"`{count}`"), F.lit(0)).cast("bigint").alias(a.name))
                continue
            if a.func == "count_distinct":
                value = F.col(f"`{a.name}`") if a.name in exts else F.lit(None)
                cols.append(F.coalesce(value, F.lit(0)).cast("bigint").alias(a.name))
                continue
            if a.func in MULTISET_AGGS:
                typ = _multiset_type(a.func, arg_types[args[a.name]], acc)
                value = F.col(f"`{a.name}`") if a.name in exts else F.lit(None).cast(typ)
                cols.append(value.alias(a.name))
                continue
            x = args[a.name]
            n = F.coalesce(F.col(f"`{n_col[x]}`"), F.lit(0))
            if a.func == "count":
                cols.append(n.cast("bigint").alias(a.name))
            elif a.func == "sum":
                cols.append(F.when(n > 0, F.col(f"`{s_col[x]}`")).alias(a.name))
            else:
                cols.append(F.when(n > 0, _avg_expr(s_col[x], n_col[x], arg_types[x])).alias(a.name))
        return acc.select(*cols, F.lit(weight).cast("bigint").alias(WEIGHT))

    new_rows = rows(acc_new, ext_new, 1)
    if first or acc_before is None and g:
        return new_rows
    if acc_before is None:  # a global aggregate whose old state was empty: its row of SQL's empty values
        acc_before = summed(partial.df.limit(0))
    return consolidate(new_rows.unionByName(rows(acc_before, ext_old, -1)))


def _multiset_type(func: str, arg_type: DataType, acc: DataFrame) -> DataType:
    """The result type of a multiset aggregate over an argument of ``arg_type`` (Spark's)."""
    probe = acc.sparkSession.createDataFrame([], f"x {arg_type.simpleString()}")
    return probe.agg(_MULTISET_FN[func](F.col("x")).alias("r")).schema["r"].dataType


def _join_null_safe(a: DataFrame, b: DataFrame, keys: list[str]) -> DataFrame:
    b2 = b.select(*[F.col(f"`{k}`").alias(f"__j_{k}") for k in keys], *[F.col(f"`{c}`") for c in b.columns
                                                                         if c not in keys])
    cond = None
    for k in keys:
        e = a[f"`{k}`"].eqNullSafe(b2[f"`__j_{k}`"])
        cond = e if cond is None else cond & e
    return a.join(b2, cond, "left").drop(*[f"__j_{k}" for k in keys])
