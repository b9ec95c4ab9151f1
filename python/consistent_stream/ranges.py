"""The key ranges of a rebuild's executor writes, taken from the sources' Delta statistics
instead of a sampling job.

Why. A rebuild writes each keyed arrangement of the state and the target range-partitioned
by the key and sorted within each range, so their files hold disjoint ranges of the key
(:meth:`consistent_stream.state.arrangement.StateStore.rebuild`,
:func:`consistent_stream.sink.target.commit_rebuild`). Spark's ``repartitionByRange`` learns
its bounds from a sample of its input: a job of its own, which computes the input once more
before the exchange computes it again (a scan of the source, an aggregate's final
aggregation, a join). A rebuild pays one per keyed write.

How. When the first key column holds the values of a column of a Delta source
(:func:`consistent_stream.plan.logical.column_origins`), of an integer, DATE or DECIMAL type,
and every data file of the source's snapshot at the rebuild's cut has its row count and that
column's min and max in its statistics (``DeltaSource.column_stats``), the column's
distribution is taken as each file's rows spread evenly over its [min, max], and the bounds
are its quantiles (:func:`estimated_bounds`). A source written in key order (TPC-H's line
items by order) gives nearly the true quantiles; one whose every file spans the key's range
gives an even split of that range. No job reads the rows.

A row's range is then a nested CASE on the first key column (NULL in the first range) whose
value is a BIGINT that Spark's hash partitioning sends to that range's own partition
(:func:`hash_slots`: ``pmod(hash(v), n)``, what ``HashPartitioning`` computes), so one hash
exchange by the range column puts every range in a partition of its own, in ascending order,
as ``repartitionByRange`` would. Spark does not know that a partitioning by the range column
clusters the key, so an operator that needs the key clustered (the consolidation of equal
rows, the target's one-row-per-key check) also groups by the range column (:data:`RANGE`);
the writer drops it.

Exactness does not depend on the estimate: equal keys always fall in the same range and the
ranges are disjoint and ascending whatever the bounds are; an estimate far from the data only
makes the ranges uneven (one task writes more). Anything else (another key type, a source
without statistics or not a Delta table, a column computed from several) keeps Spark's
sampled range partitioning.
"""
from __future__ import annotations

import datetime
import decimal
import logging
import threading
from typing import Callable

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, IntegralType

from .changelog import q

log = logging.getLogger("consistent_stream")

RANGE = "__range"
"""The column holding a row's range (a BIGINT) while the write's operators run."""

_SLOTS: dict[int, list[int] | None] = {}
_SLOTS_LOCK = threading.Lock()

Bounds = Callable[[str, object], "list | None"]
"""A rebuild's bounds of a plan column of a Spark type (ascending values of the type,
:func:`typed_bounds`), None when unknown."""


def _distribution(files: list[tuple[float, float, int]]):
    """``(below, total)``: the rows of ``files`` at or below a value, each file's ``rows`` taken
    as spread evenly over its ``[lo, hi]`` (a point when ``lo == hi``), and all their rows."""
    lo, hi, rows = (np.array([f[i] for f in files], dtype=float) for i in range(3))
    width = hi - lo

    def below(x: float) -> float:
        spread = np.clip((x - lo) / np.where(width > 0, width, 1.0), 0.0, 1.0)
        return float((rows * np.where(width > 0, spread, (x >= lo).astype(float))).sum())
    return below, float(rows.sum())


def estimated_bounds(files: list[tuple[float, float, int]], parts: int) -> list[float]:
    """The ``parts - 1`` quantiles that cut the rows of ``files`` into ``parts`` equal
    shares, each file's ``rows`` taken as spread evenly over its ``[lo, hi]`` (a point when
    ``lo == hi``): ascending floats, found by bisection of that piecewise-linear distribution
    function. Empty for fewer than two parts or no rows."""
    if parts < 2 or not files:
        return []
    below, total = _distribution(files)
    if total <= 0:
        return []
    out = []
    for k in range(1, parts):
        want, a, b = total * k / parts, min(f[0] for f in files), max(f[1] for f in files)
        for _ in range(64):
            m = (a + b) / 2
            if below(m) < want:
                a = m
            else:
                b = m
        out.append(b)
    return out


CLUSTERED_FILES_PER_KEY = 3.0
"""A rebuild writes an arrangement whose rows need no consolidation in the order its scan
reads them (no range exchange: :meth:`~consistent_stream.state.arrangement.StateStore.
_write_base`) when a key's value lies in at most this many of the files' ``[min, max]`` on
average (:func:`files_per_key`): a keyed read then opens at most about three files where
disjoint ranges open one."""


def files_per_key(stats: list[tuple] | None) -> float | None:
    """How many files hold a value drawn from a column's rows in their ``[min, max]``, on
    average, given per-file ``(min, max, rows)`` statistics of the column (Python values as
    delta-rs gives them, :func:`numeric_stats`), each file's rows spread evenly over its range
    (:func:`estimated_bounds`' distribution): 1.0 for files of disjoint ranges, the number of
    files when every file spans the column's range. None without rows, or when a file's
    statistics are missing or not of a number or a date."""
    files = numeric_stats(stats)
    if not files:
        return None
    below, total = _distribution(files)
    if total <= 0:
        return None
    out = 0.0
    for lo, hi, rows in files:
        out += (rows if lo == hi else below(hi) - below(lo)) / total
    return out


def numeric_stats(stats: list[tuple] | None) -> list[tuple[float, float, int]] | None:
    """Per-file ``(min, max, rows)`` statistics (Python values as delta-rs gives them) as
    floats (a date as its ordinal); None when one is missing, not a number or a date, or
    ``max < min``."""
    if not stats:
        return None
    files = []
    for lo, hi, rows in stats:
        a, b = _as_number(lo), _as_number(hi)
        if a is None or b is None or rows is None or b < a:
            return None
        files.append((a, b, int(rows)))
    return files


def _as_number(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, datetime.date):
        return float(v.toordinal())
    if isinstance(v, (int, float, decimal.Decimal)):
        return float(v)
    return None


def typed_bounds(stats: list[tuple] | None, dtype, parts: int) -> list | None:
    """Bounds of ``parts`` ranges of a column of Spark type ``dtype`` from its per-file
    ``(min, max, rows)`` statistics (Python values as delta-rs gives them), as strictly
    ascending values of the type (ints, dates, Decimals at the type's scale); None when the
    type is not an integer, DATE or DECIMAL, a file has no statistics, or fewer than two
    ranges remain."""
    if parts < 2 or not isinstance(dtype, (IntegralType, DateType, DecimalType)):
        return None
    files = numeric_stats(stats)
    if files is None:
        return None
    out: list = []
    for x in estimated_bounds(files, parts):
        if isinstance(dtype, IntegralType):
            v = int(round(x))
        elif isinstance(dtype, DateType):
            v = datetime.date.fromordinal(max(1, int(round(x))))
        else:
            v = decimal.Decimal(repr(x)).quantize(decimal.Decimal(1).scaleb(-dtype.scale),
                                                  rounding=decimal.ROUND_HALF_UP)
        if not out or v > out[-1]:
            out.append(v)
    return out or None


def hash_slots(spark, parts: int) -> list[int] | None:
    """Per partition ``p`` of a hash exchange into ``parts`` partitions, a BIGINT value that
    Spark's hash partitioning sends to ``p`` (``pmod(hash(v), parts) = p``), asked of Spark
    once per partition count (one small job); None when ``range(64 * parts)`` does not reach
    every partition."""
    with _SLOTS_LOCK:
        if parts in _SLOTS:
            return _SLOTS[parts]
    found: dict[int, int] = {}
    for r in spark.range(64 * parts).selectExpr("id", f"pmod(hash(id), {int(parts)}) AS p").collect():
        found.setdefault(int(r["p"]), int(r["id"]))
    slots = [found[p] for p in range(parts)] if len(found) == parts else None
    with _SLOTS_LOCK:
        _SLOTS[parts] = slots
    return slots


def _range_case(column: str, literals: list[str], slots: list[int], lo: int, hi: int) -> str:
    """The slot of the range of ``column`` among ranges ``lo``..``hi`` (range ``i`` holds the
    values ``literals[i-1] <= v < literals[i]``): a binary search as nested CASEs."""
    if lo == hi:
        return str(slots[lo])
    mid = (lo + hi) // 2
    return (f"CASE WHEN {column} < {literals[mid]} THEN {_range_case(column, literals, slots, lo, mid)} "
            f"ELSE {_range_case(column, literals, slots, mid + 1, hi)} END")


def range_partitioned(df: DataFrame, key: list[str], parts: int,
                      bounds: list | None = None) -> tuple[DataFrame, list[str]]:
    """``df`` range-partitioned by ``key`` (its column names) into at most ``parts``
    partitions, ranges ascending with the partitions, and the columns the operators after it
    must group by too (module docstring). With ``bounds`` (ascending values of the first key
    column's type, :func:`typed_bounds`): one hash exchange by the range column
    :data:`RANGE` (returned in the list), no sampling job; without, or when Spark's hash
    slots are not found, Spark's ``repartitionByRange`` (nothing to group by)."""
    slots = hash_slots(df.sparkSession, len(bounds) + 1) if bounds else None
    if slots is None:
        return df.repartitionByRange(parts, *[F.col(q(k)) for k in key]), []
    dtype = df.schema[key[0]].dataType.simpleString()
    literals = [f"CAST('{b}' AS {dtype})" for b in bounds]
    column = q(key[0])
    case = _range_case(column, literals, slots, 0, len(bounds))
    expr = f"CAST(CASE WHEN {column} IS NULL THEN {slots[0]} ELSE {case} END AS BIGINT)"
    return df.withColumn(RANGE, F.expr(expr)).repartition(len(slots), F.col(RANGE)), [RANGE]


class SourceBounds:
    """A rebuild's bounds per plan column (:data:`Bounds`), from the statistics of the Delta
    source the column comes from, at the rebuild's cut: ``origins`` (plan column -> source
    key, source column: :func:`~consistent_stream.plan.logical.column_origins`), ``sources``
    (source key -> the run's source, whose ``column_stats(position, column)`` gives per-file
    ``(min, max, rows)`` or None), ``positions`` (source key -> its position at the cut),
    ``parts`` ranges; called with a plan column and its Spark type. Each column's bounds
    are computed once per type; any failure reading statistics is logged and leaves the
    column to Spark's sampling."""

    def __init__(self, origins: dict[str, tuple[str, str]], sources: dict, positions: dict[str, int],
                 parts: int):
        self.origins, self.sources, self.positions, self.parts = origins, sources, positions, parts
        self._done: dict[tuple[str, str, str], object] = {}

    def __call__(self, column: str, dtype=None) -> list | None:
        if dtype is None or self.parts < 2:
            return None
        return self._of(column, dtype.simpleString(), lambda stats: typed_bounds(stats, dtype, self.parts))

    def files_per_key(self, column: str) -> float | None:
        """:func:`files_per_key` of the source files the plan column's values come from (None:
        unknown, as for the bounds)."""
        return self._of(column, "files per key", files_per_key)

    def _of(self, column: str, what: str, compute: Callable):
        """``compute(stats)`` of the source column the plan column comes from, once per
        ``what``; None when there is none or its statistics cannot be read (logged)."""
        origin = self.origins.get(column)
        if origin is None:
            return None
        source = self.sources.get(origin[0])
        position = self.positions.get(origin[0], -1)
        stats_of = getattr(source, "column_stats", None)
        if stats_of is None or position < 0:
            return None
        at = (origin[0], origin[1], what)
        if at not in self._done:
            try:
                self._done[at] = compute(stats_of(position, origin[1]))
            except Exception as e:  # noqa: BLE001 (a hint only: Spark samples instead)
                log.debug("no %s from %s.%s's statistics: %s", what, origin[0], origin[1], e)
                self._done[at] = None
        return self._done[at]
