"""Dedup: ``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) = 1`` under retractions.

State: arrangement ``rows``, the input Z-set keyed by the partition columns.

Delta rule, for the set P of partitions touched by the batch:

    d(first(A)) = first(A_old|P + dA) - first(A_old|P)

where ``first`` keeps, per partition, the first live row (weight > 0) by the ORDER BY keys,
ties broken by the remaining columns ascending (a total order, so the choice is
deterministic). A late event with an older sequence changes nothing; when the winner is
retracted, the next row takes its place.

Example (partition id, order seq desc): A_old = {(1, seq 2)}, dA = {(1, seq 1): +1} ->
first is still (1, seq 2): d = {}.

In: the input changelog (columns + ``__weight``), consolidated. Out: the same columns +
``__weight``, consolidated; None when the change is known to be empty.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ..changelog import WEIGHT, Changelog, consolidate
from ..plan.logical import SortKey
from .keyed import Lookup


def _sort_column(k: SortKey):
    c = F.col(f"`{k.column}`")
    if k.descending:
        return c.desc_nulls_first() if k.effective_nulls_first else c.desc_nulls_last()
    return c.asc_nulls_first() if k.effective_nulls_first else c.asc_nulls_last()


def first_rows(log: DataFrame, partition: list[str], order: list[SortKey]) -> DataFrame:
    """Per partition the first live row of a Z-set log. Out: columns + ``__weight`` = 1."""
    cols = [c for c in log.columns if c != WEIGHT]
    ordered = {k.column for k in order}
    sort = [_sort_column(k) for k in order] + [F.col(f"`{c}`").asc_nulls_first() for c in cols if c not in ordered]
    live = consolidate(log).where(F.col(WEIGHT) > 0)
    w = Window.partitionBy(*[F.col(f"`{c}`") for c in partition]).orderBy(*sort)
    return (live.withColumn("__rn", F.row_number().over(w)).where(F.col("__rn") == 1)
            .select(*[F.col(f"`{c}`") for c in cols], F.lit(1).cast("bigint").alias(WEIGHT)))


def dedup_delta(delta: Changelog, old: Lookup, partition: list[str], order: list[SortKey]) -> DataFrame | None:
    """The dedup's output changelog for one batch (``old``: the ``rows`` arrangement as of the
    previous batch)."""
    if delta.empty:
        return None
    before = None
    if not old.empty:
        read = old.read(delta.keys(partition)) if partition else old.read(None)
        before = None if read.empty else read.df.select(*delta.df.columns)
    if before is None:
        return first_rows(delta.df, partition, order)
    new_first = first_rows(before.unionByName(delta.df), partition, order)
    old_first = first_rows(before, partition, order)
    return consolidate(new_first.unionByName(old_first.withColumn(WEIGHT, -F.col(WEIGHT))))
