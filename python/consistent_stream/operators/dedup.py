"""Dedup: ``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) = 1`` under retractions.

State ``rows``: the input's Z-set log. For the set P of partitions the batch touches,

    d(first(A)) = + first(A_old|P + dA) - first(A_old|P)

where ``first`` keeps, per partition, the live row (weight > 0) that sorts first by the
ORDER BY and then by every other column ascending; ties are therefore broken
deterministically, and a row present twice is still output once. An event that arrives
late with an older sequence number sorts behind the current row and changes nothing; when
the winning row is retracted, the next one is taken from state (Flink's deduplicate keeps
only the last row and cannot do that).

In: the input changelog (columns + ``__weight``). Out: the same columns, ``__weight`` +-1,
consolidated.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ..changelog import WEIGHT, consolidate
from ..plan.logical import SortKey
from ..state import StateStore
from .keyed import restrict_to_keys


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


def dedup_delta(state: StateStore, op_id: str, delta: DataFrame, partition: list[str],
                order: list[SortKey]) -> DataFrame:
    """The dedup's output changelog for one batch; stages its arrangement ``<op_id>_rows``."""
    old_log = state.read(f"{op_id}_rows", delta.schema)
    state.stage(f"{op_id}_rows", delta)
    touched = delta.select(*[F.col(f"`{c}`") for c in partition]).distinct()
    old = restrict_to_keys(old_log, partition, touched, partition) if partition else old_log
    new_first = first_rows(old.unionByName(delta), partition, order)
    old_first = first_rows(old, partition, order)
    return consolidate(new_first.unionByName(old_first.withColumn(WEIGHT, -F.col(WEIGHT))))
