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

from ..changelog import WEIGHT, Changelog, cols_sql, consolidate_sql, q
from ..plan.logical import SortKey
from .keyed import Lookup

W = q(WEIGHT)


def _sort_sql(k: SortKey) -> str:
    return f"{q(k.column)} {'DESC' if k.descending else 'ASC'} NULLS {'FIRST' if k.effective_nulls_first else 'LAST'}"


def first_rows(relation: str, columns: list[str], partition: list[str], order: list[SortKey]) -> str:
    """Per partition the first live row of a Z-set (``relation`` with data ``columns``), as
    a SELECT of ``columns`` + ``__weight`` = 1."""
    ordered = {k.column for k in order}
    sort = [_sort_sql(k) for k in order] + [f"{q(c)} ASC NULLS FIRST" for c in columns if c not in ordered]
    part = f"PARTITION BY {cols_sql(partition)} " if partition else ""
    live = f"SELECT * FROM ({consolidate_sql(relation, columns)}) WHERE {W} > 0"
    ranked = f"SELECT {cols_sql(columns)}, ROW_NUMBER() OVER ({part}ORDER BY {', '.join(sort)}) AS `__rn` FROM ({live})"
    return f"SELECT {cols_sql(columns)}, CAST(1 AS BIGINT) AS {W} FROM ({ranked}) WHERE `__rn` = 1"


def dedup_delta(delta: Changelog, old: Lookup, partition: list[str], order: list[SortKey]) -> str | None:
    """The dedup's output changelog for one batch, as a SELECT (``old``: the ``rows``
    arrangement as of the previous batch); None when it is known to be empty."""
    if delta.is_empty:
        return None
    cols = delta.data_columns
    before = None
    if not old.empty:
        read = old.read(delta.keys(partition)) if partition else old.read(None)
        before = None if read.is_empty else read.sql
    if before is None:
        return first_rows(delta.sql, cols, partition, order)
    c = cols_sql(cols + [WEIGHT])
    new_first = first_rows(f"(SELECT {c} FROM {before} UNION ALL SELECT {c} FROM {delta.sql})", cols, partition, order)
    old_first = first_rows(before, cols, partition, order)
    both = f"(SELECT * FROM ({new_first}) UNION ALL SELECT {cols_sql(cols)}, -{W} FROM ({old_first}))"
    return consolidate_sql(both, cols)
