"""Join delta rules: inner, left/full outer, semi and anti joins, with an optional residual
(non-equi) predicate that is part of the join condition.

Inner join, bilinear in its inputs (DBSP; the classic IVM delta rule):

    d(L join R) = dL join R_old + L_old join dR + dL join dR

with the output weight the product of the input weights. ``L_old``/``R_old`` are the
arrangements (integrals) as of the previous batch; they may be unconsolidated logs, since the
join distributes over Z-set addition.

Everything else is built from the *unmatched* part of one side. For a row ``l`` of L, its
number of associations ``c(l, R)`` is the summed weight of the R rows matching it (key
equality and residual); ``unmatched(L, R)`` is the rows of L with ``c = 0`` (Flink's outer
join state keeps ``numOfAssociations`` per row for the same purpose). It is linear in L for
a fixed R, and R only changes at the keys of ``dR`` (``K``), so

    d unmatched = unmatched(dL, R_new) + unmatched(L_old|K, R_new|K) - unmatched(L_old|K, R_old|K)

which retracts the NULL-padded row of ``l`` exactly when its associations go from 0 to 1 or
more and emits it again when they fall back to 0; it reads state only at the touched keys
(the last two terms are computed in one pass, counting each row's associations before and
after).
Then

* left outer  = inner + unmatched(L, R) padded with NULLs for R's columns;
* full outer  = left outer + unmatched(R, L) padded with NULLs for L's columns;
* anti (NOT EXISTS) = unmatched(L, R);
* semi (EXISTS, IN) = L - unmatched(L, R), so ``d semi = dL - d anti``.

Each L row appears once in a semi join, with its own multiplicity, however many R rows match.
NULL keys never match (SQL ``=``), unless the join is ``null_safe`` (set operations).

Columns in: left changelog (left columns + ``__weight``), right changelog likewise, both
consolidated. Out: left columns, right columns (none for semi/anti), ``__weight``; not
consolidated.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..changelog import WEIGHT, consolidate
from ..state import StateStore
from .keyed import key_condition, restrict_to_keys


class _Side:
    """One input of the join: its changelog, old arrangement log, key expressions (as
    columns ``<prefix>i``) and data columns with their types."""

    def __init__(self, delta: DataFrame, old: DataFrame, keys: list[str], cols: list[str], prefix: str):
        self.key_cols = [f"{prefix}{i}" for i in range(len(keys))]
        self.keys, self.cols, self.prefix = keys, cols, prefix
        self.delta = self.keyed(delta)
        self.old = self.keyed(old)
        self.types = [delta.schema[c].dataType for c in cols]

    def keyed(self, df: DataFrame) -> DataFrame:
        return df.select(*[F.col(f"`{c}`") for c in self.cols], F.col(WEIGHT),
                         *[F.expr(k).alias(n) for k, n in zip(self.keys, self.key_cols)])

    def null_padding(self) -> list:
        return [F.lit(None).cast(t).alias(c) for c, t in zip(self.cols, self.types)]


def _matched(a: DataFrame, a_side: _Side, b: DataFrame, b_side: _Side, residual: str | None,
             null_safe: bool, how: str) -> DataFrame:
    """``a`` joined to ``b`` on the keys and the residual (Spark join type ``how``), weights
    renamed ``__wa``/``__wb``."""
    a2 = a.withColumnRenamed(WEIGHT, "__wa")
    b2 = b.withColumnRenamed(WEIGHT, "__wb")
    cond = key_condition(a2, a_side.key_cols, b2, b_side.key_cols, null_safe)
    if residual:
        cond = cond & F.expr(residual)
    return a2.join(b2, cond, how)


def _inner(l: DataFrame, left: _Side, r: DataFrame, right: _Side, residual, null_safe) -> DataFrame:
    """One term of the bilinear rule: ``l join r``, weights multiplied."""
    j = _matched(l, left, r, right, residual, null_safe, "inner")
    return j.select(*[F.col(f"`{c}`") for c in left.cols + right.cols], (F.col("__wa") * F.col("__wb")).alias(WEIGHT))


def _associations(a: DataFrame, a_side: _Side, b: DataFrame, b_side: _Side, residual, null_safe,
                  sums: dict) -> DataFrame:
    """Per row of ``a`` (consolidated: distinct rows, weight ``__wa``), sums over the rows of
    ``b`` it matches: ``sums`` maps an output name to a column expression over ``__wb`` and
    ``b``'s columns (a row without a match sums to 0). Out: ``a_side.cols``, ``__wa``, sums."""
    b_cols = [F.col(f"`{c}`") for c in b_side.cols] if residual else []
    extra = [c for c in b.columns if c.startswith("__tag")]
    j = _matched(a, a_side, b.select(*b_side.key_cols, *b_cols, *extra, F.col(WEIGHT)),
                 b_side, residual, null_safe, "left")
    return j.groupBy(*[F.col(f"`{c}`") for c in a_side.cols], F.col("__wa")) \
        .agg(*[F.sum(F.coalesce(e, F.lit(0))).alias(n) for n, e in sums.items()])


def _unmatched_delta(a: _Side, b: _Side, residual, null_safe) -> DataFrame:
    """The change of unmatched(A, B) in this batch (see the module docstring), in two parts:

    * the rows of ``dA`` (consolidated) with no association in ``B_old + dB``;
    * the rows of ``A_old`` at the keys ``dB`` touches whose associations go from 0 to
      more (retracted) or from more to 0 (emitted): one join of ``consolidate(A_old|K)``
      with ``B_old|K`` (tagged old) and ``dB``, counting before and after in one pass.

    Out: ``a.cols`` + ``__weight``.
    """
    cols = [F.col(f"`{c}`") for c in a.cols]
    fresh = _associations(a.delta, a, b.old.unionByName(b.delta), b, residual, null_safe,
                          {"__assoc": F.col("__wb")})
    fresh = fresh.where(F.col("__assoc") == 0).select(*cols, F.col("__wa").alias(WEIGHT))

    touched = b.delta.select(*b.key_cols).distinct()
    if not null_safe:
        touched = touched.where(" AND ".join(f"{k} IS NOT NULL" for k in b.key_cols))
    a_old_k = a.keyed(consolidate(restrict_to_keys(a.old, a.key_cols, touched, b.key_cols, null_safe)
                                  .select(*cols, F.col(WEIGHT))))
    b_k = (restrict_to_keys(b.old, b.key_cols, touched, b.key_cols, null_safe).withColumn("__tag_old", F.lit(1))
           .unionByName(b.delta.withColumn("__tag_old", F.lit(0))))
    counts = _associations(a_old_k, a, b_k, b, residual, null_safe,
                           {"__c_old": F.col("__wb") * F.col("__tag_old"), "__c_new": F.col("__wb")})
    flips = counts.where((F.col("__c_old") == 0) != (F.col("__c_new") == 0)).select(
        *cols, F.when(F.col("__c_new") == 0, F.col("__wa")).otherwise(-F.col("__wa")).alias(WEIGHT))
    return fresh.unionByName(flips)


def join_delta(state: StateStore, op_id: str, kind: str, d_left: DataFrame, d_right: DataFrame,
               left_keys: list[str], right_keys: list[str], residual: str | None,
               left_cols: list[str], right_cols: list[str], null_safe: bool = False) -> DataFrame:
    """The join's output changelog for one batch; stages both arrangements
    (``<op_id>_left``, ``<op_id>_right``: the inputs' Z-set logs).

    ``kind``: inner, left, full, semi or anti. ``left_keys``/``right_keys``: Spark SQL
    expressions over each side's columns; ``residual``: Spark SQL over the columns of both
    sides, or None.
    """
    l_old = state.read(f"{op_id}_left", d_left.schema)
    r_old = state.read(f"{op_id}_right", d_right.schema)
    state.stage(f"{op_id}_left", d_left)
    state.stage(f"{op_id}_right", d_right)
    left = _Side(d_left, l_old, left_keys, left_cols, "__lk")
    right = _Side(d_right, r_old, right_keys, right_cols, "__rk")

    parts: list[DataFrame] = []
    if kind in ("inner", "left", "full"):
        parts += [_inner(left.delta, left, right.old, right, residual, null_safe),
                  _inner(left.old, left, right.delta, right, residual, null_safe),
                  _inner(left.delta, left, right.delta, right, residual, null_safe)]
    if kind in ("left", "full", "semi", "anti"):
        unmatched = _unmatched_delta(left, right, residual, null_safe)
        if kind == "anti":
            parts.append(unmatched)
        elif kind == "semi":
            parts += [d_left.select(*[F.col(f"`{c}`") for c in left_cols], F.col(WEIGHT)),
                      unmatched.withColumn(WEIGHT, -F.col(WEIGHT))]
        else:
            parts.append(unmatched.select(*[F.col(f"`{c}`") for c in left_cols], *right.null_padding(),
                                          F.col(WEIGHT)))
    if kind == "full":
        unmatched_r = _unmatched_delta(right, left, residual, null_safe)
        parts.append(unmatched_r.select(*left.null_padding(), *[F.col(f"`{c}`") for c in right_cols],
                                        F.col(WEIGHT)))
    if not parts:
        raise ValueError(f"join kind {kind!r}: expected inner, left, full, semi or anti")
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out
