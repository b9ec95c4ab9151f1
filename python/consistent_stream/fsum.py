"""Compensated sums of floating-point accumulators, so that a SUM or AVG over doubles
maintained under retractions does not drift away from batch evaluation as batches go by.

Why. A SUM over a DOUBLE column is kept as an accumulator: each batch adds its changes
(``x * __weight``) and reads add the partial sums of earlier batches. Plain floating-point
addition rounds at every step, and the rounding does not cancel when a value is retracted
later: insert 1e17 and 1.0 in one batch (the sum rounds to 1e17), delete the 1e17 in the next,
and the accumulator says 0.0 where batch evaluation over the remaining row says 1.0. The error
grows with everything the accumulator ever held, not with what it holds now, so over millions
of updates and deletes it has no bound relative to the current value.

How. A floating-point accumulator is a pair of additive DOUBLE columns ``(hi, lo)``, a
double-double number whose value is ``hi + lo``: every addition keeps its own rounding error
in ``lo`` (Knuth's TwoSum: ``s = a + b``, ``e = (a - (s - (s - a))) + (b - (s - a))`` is exact,
``a + b == s + e``), the compensated summation of Neumaier (1974) / Ogita, Rump and Oishi's
Sum2 ("Accurate sum and dot product", SIAM J. Sci. Comput. 26(6), 2005). Its error is of the
order of ``eps**2`` (1.2e-32) times the magnitudes summed, instead of ``eps`` (1.1e-16): a value
retracted in a later batch cancels to within that, and a history of 10**9 batches of values a
million times larger than the current sum stays below one part in 10**14 of it. Infinities and
NaN never enter the pair (``inf - inf`` would leave a NaN behind forever); they are counted in
additive BIGINT columns instead (:func:`nonfinite_counts_sql`), as Materialize's float
accumulators do, and a retracted infinity leaves nothing behind.

Three forms of the same sum, one per place rows are combined: a Spark SQL aggregate
expression (:func:`pair_sum_sql`: a batch's partial sums, reads of the state, compactions by
Spark), and Arrow on the driver (:func:`consolidate_pairs_arrow`: ``math.fsum``, exactly
rounded, for compactions and commits on the driver). What is left between them is the
double-double's own rounding, far below what any comparison can see.

>>> consolidate_pairs_arrow(pa.table({"g": [1, 1, 1], "h": [1e17, 1.0, -1e17], "l": [0.0, 0.0, 0.0]}),
...                         ["g"], [("h", "l")]).to_pylist()
[{'g': 1, 'h': 1.0, 'l': 0.0}]
"""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

ZERO = "CAST(0 AS DOUBLE)"
_INF = "CAST('Infinity' AS DOUBLE)"


def finite_sql(x: str) -> str:
    """SQL: ``x`` when it is a finite number, else NULL (Spark orders NaN above +Infinity, so
    ``abs(x) < Infinity`` holds exactly for the finite values)."""
    return f"CASE WHEN abs({x}) < {_INF} THEN CAST({x} AS DOUBLE) END"


def nonfinite_counts_sql(x: str, weight: str) -> tuple[str, str, str]:
    """Aggregate expressions: the summed ``weight`` of rows whose ``x`` is +Infinity,
    -Infinity and NaN (BIGINT each)."""
    def count(cond: str) -> str:
        return f"CAST(SUM(CASE WHEN {cond} THEN {weight} ELSE 0 END) AS BIGINT)"
    return count(f"{x} = {_INF}"), count(f"{x} = -{_INF}"), count(f"isnan({x})")


def pair_sum_sql(hi: str, lo: str | None = None) -> tuple[str, str]:
    """Aggregate expressions ``(hi, lo)`` of the compensated sum over a group's rows of the
    SQL values ``hi`` (and ``lo``, another pair's low part; None for plain values). NULL
    ``hi`` rows are skipped; an empty group sums to ``(0.0, 0.0)``. Spark evaluates the fold
    (a higher-order ``aggregate`` over the group's ``collect_list``) on the executors, so a
    group's rows are held by one task at a time: callers bound a group's rows (a batch's
    partial sums are bucketed first, :func:`bucket_sql`; state reads and compactions combine
    one row per file)."""
    low = f"COALESCE({lo}, {ZERO})" if lo else ZERO
    items = f"collect_list(CASE WHEN {hi} IS NOT NULL THEN named_struct('h', CAST({hi} AS DOUBLE), 'l', {low}) END)"
    s = "fs_acc.s + fs_v.h"
    err = f"((fs_acc.s - (({s}) - (({s}) - fs_acc.s))) + (fs_v.h - (({s}) - fs_acc.s)))"
    fold = (f"aggregate({items}, named_struct('s', {ZERO}, 'c', {ZERO}), "
            f"(fs_acc, fs_v) -> named_struct('s', {s}, 'c', fs_acc.c + fs_v.l + {err}))")
    return f"({fold}).s", f"({fold}).c"


BUCKETS = 1024
"""Sub-groups a batch's partial sums are first taken over (:func:`bucket_sql`): a group of N
input rows folds at most about N / BUCKETS of them in one list."""


def bucket_sql(columns: list[str]) -> str:
    """SQL: a deterministic bucket (0 .. BUCKETS-1) of a row from its ``columns`` (quoted
    identifiers), for a two-level compensated sum whose lists stay small when one group holds
    many rows (a global aggregate's rebuild). Deterministic, so a replayed batch sums in the
    same order and stages the same state."""
    return f"pmod(xxhash64({', '.join(columns)}), {BUCKETS})"


_SPLIT = "CAST(134217729 AS DOUBLE)"   # 2**27 + 1: Veltkamp's splitter for 53-bit doubles


def two_product_sql(a: str, b: str) -> tuple[str, str]:
    """SQL ``(p, e)`` with ``p = fl(a * b)`` and ``a * b == p + e`` exactly, for finite DOUBLE
    ``a`` and ``b`` whose product neither overflows nor underflows: Dekker's TwoProduct with
    Veltkamp's split ("A floating-point technique for extending the available precision",
    Numer. Math. 18, 1971), the product of Ogita, Rump and Oishi's Dot2. Squares summed as
    such pairs keep a sum of squares exact to the double-double's precision."""
    def split(x: str) -> tuple[str, str]:
        c = f"({_SPLIT} * {x})"
        hi = f"({c} - ({c} - {x}))"
        return hi, f"({x} - {hi})"
    (ah, al), (bh, bl) = split(a), split(b)
    p = f"({a} * {b})"
    return p, f"(((({ah} * {bh} - {p}) + {ah} * {bl}) + {al} * {bh}) + {al} * {bl})"


def value_sql(hi: str, lo: str, pinf: str, ninf: str, nan: str) -> str:
    """SQL: the DOUBLE a compensated accumulator holds: NaN when it counts a NaN or both
    infinities, the infinity it counts, else ``hi + lo``."""
    return (f"CASE WHEN {nan} <> 0 OR ({pinf} <> 0 AND {ninf} <> 0) THEN CAST('NaN' AS DOUBLE) "
            f"WHEN {pinf} <> 0 THEN {_INF} WHEN {ninf} <> 0 THEN -{_INF} ELSE {hi} + {lo} END")


def consolidate_pairs_arrow(data: pa.Table, group: list[str], pairs: list[tuple[str, str]],
                            plain: list[str] = ()) -> pa.Table:
    """Per value of the ``group`` columns (NULLs equal), the exact sum of each pair's ``hi``
    and ``lo`` values rounded back to a pair (``hi`` = the sum correctly rounded, ``lo`` = the
    rest, both by ``math.fsum``), and the plain sum of each ``plain`` column. Out: the group
    columns, the pairs' and the plain columns, with ``data``'s types and column order; one row
    per group, in no particular order. Raises ``pa.ArrowNotImplementedError`` for group
    column types Arrow cannot group by."""
    if data.num_rows == 0:
        return data
    aggs = [(c, "list") for hi, lo in pairs for c in (hi, lo)] + [(c, "sum") for c in plain]
    if group:
        g = data.group_by(group, use_threads=False).aggregate(aggs)
    else:
        g = pa.table({f"{c}_{fn}": [data.column(c).to_pylist() if fn == "list" else pc.sum(data.column(c)).as_py()]
                      for c, fn in aggs})
    out = {c: g.column(c) for c in group}
    for hi, lo in pairs:
        his, los = g.column(f"{hi}_list").to_pylist(), g.column(f"{lo}_list").to_pylist()
        sums = [_fsum_pair(high, low) for high, low in zip(his, los)]
        out[hi] = pa.array([s[0] for s in sums], data.schema.field(hi).type)
        out[lo] = pa.array([s[1] for s in sums], data.schema.field(lo).type)
    for c in plain:
        out[c] = pc.cast(g.column(f"{c}_sum"), data.schema.field(c).type)
    return pa.table([out[c] for c in data.column_names], schema=data.schema)


def _fsum_pair(his: list, los: list) -> tuple[float, float]:
    terms = [v for v in his + los if v is not None]
    hi = math.fsum(terms)
    if not math.isfinite(hi):
        return hi, 0.0
    return hi, math.fsum(terms + [-hi])
