"""Join delta rules: inner, left/full outer, semi and anti joins, with an optional residual
(non-equi) predicate that is part of the join condition.

Inner join, bilinear in its inputs (DBSP; the classic IVM delta rule):

    d(L join R) = dL join R_old + L_old join dR + dL join dR

with the output weight the product of the input weights. ``L_old``/``R_old`` are the
arrangements (integrals) as of the previous batch, read only at the keys the batch touches
(``K_L`` = keys of ``dL``, ``K_R`` = keys of ``dR``); they may be unconsolidated, since the
join distributes over Z-set addition. A term whose change is empty is not computed, and its
state is not read.

Everything else is built from the *unmatched* part of one side. For a row ``l`` of L, its
number of associations ``c(l, R)`` is the summed weight of the R rows matching it (key
equality and residual); ``unmatched(L, R)`` is the rows of L with ``c = 0`` (Flink's outer
join state keeps ``numOfAssociations`` per row for the same purpose). It is linear in L for
a fixed R, and R only changes at ``K_R``, so

    d unmatched = unmatched(dL, R_new) + unmatched(L_old|K_R, R_new|K_R) - unmatched(L_old|K_R, R_old|K_R)

which retracts the NULL-padded row of ``l`` exactly when its associations go from 0 to 1 or
more and emits it again when they fall back to 0 (the last two terms are computed in one
pass, counting each row's associations before and after). Then

* left outer  = inner + unmatched(L, R) padded with NULLs for R's columns;
* full outer  = left outer + unmatched(R, L) padded with NULLs for L's columns;
* anti (NOT EXISTS) = unmatched(L, R);
* semi (EXISTS, IN) = L - unmatched(L, R), so ``d semi = dL - d anti``.

Each L row appears once in a semi join, with its own multiplicity, however many R rows match.
NULL keys never match (SQL ``=``), unless the join is ``null_safe`` (set operations).

Example (inner, key k): L_old = {(k=1, a): +1}, R_old = {}, dR = {(k=1, x): +1} ->
d = L_old join dR = {(1, a, 1, x): +1}.

Columns in: each side's changelog holds its data columns, its key columns (the evaluated join
keys, named in ``left_keys``/``right_keys``) and ``__weight``, consolidated; the lookups return
rows of the same columns. Out: left data columns, right data columns (none for semi/anti),
``__weight``; not consolidated; None when the change is known to be empty.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..changelog import WEIGHT, Changelog, KeySet, consolidate
from .keyed import Lookup, key_condition, union_keys

JOIN_KINDS = ("inner", "left", "full", "semi", "anti")


class _Side:
    """One input of the join: its change, its old rows at the touched keys (or None), key
    columns and data columns with their types."""

    def __init__(self, delta: Changelog, keys: list[str], cols: list[str]):
        self.delta, self.keys, self.cols = delta, keys, cols
        self.old: DataFrame | None = None
        self.types = [delta.df.schema[c].dataType for c in cols]

    def null_padding(self) -> list:
        return [F.lit(None).cast(t).alias(c) for c, t in zip(self.cols, self.types)]

    def data(self, df: DataFrame) -> DataFrame:
        return df.select(*[F.col(f"`{c}`") for c in self.cols + self.keys], F.col(WEIGHT))


def _matched(a: DataFrame, a_side: _Side, b: DataFrame, b_side: _Side, residual: str | None,
             null_safe: bool, how: str) -> DataFrame:
    """``a`` joined to ``b`` on the keys and the residual (Spark join type ``how``), weights
    renamed ``__wa``/``__wb``."""
    a2 = a.withColumnRenamed(WEIGHT, "__wa")
    b2 = b.withColumnRenamed(WEIGHT, "__wb")
    cond = key_condition(a2, a_side.keys, b2, b_side.keys, null_safe)
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
    ``b``'s columns (a row without a match sums to 0). Out: ``a_side.cols + keys``, ``__wa``, sums."""
    b_cols = [F.col(f"`{c}`") for c in b_side.cols] if residual else []
    extra = [c for c in b.columns if c.startswith("__tag")]
    j = _matched(a, a_side, b.select(*[F.col(f"`{k}`") for k in b_side.keys], *b_cols, *extra, F.col(WEIGHT)),
                 b_side, residual, null_safe, "left")
    return j.groupBy(*[F.col(f"`{c}`") for c in a_side.cols + a_side.keys], F.col("__wa")) \
        .agg(*[F.sum(F.coalesce(e, F.lit(0))).alias(n) for n, e in sums.items()])


def _unmatched_delta(a: _Side, b: _Side, residual, null_safe) -> DataFrame | None:
    """The change of unmatched(A, B) in this batch (see the module docstring), in two parts:

    * the rows of ``dA`` with no association in ``B_old + dB``;
    * the rows of ``A_old`` at the keys ``dB`` touches whose associations go from 0 to
      more (retracted) or from more to 0 (emitted): one join of ``consolidate(A_old)``
      with ``B_old`` (tagged old) and ``dB``, counting before and after in one pass.

    Out: ``a.cols`` + ``__weight``.
    """
    cols = [F.col(f"`{c}`") for c in a.cols]
    parts = []
    if not a.delta.empty:
        b_new = b.delta.df if b.old is None else b.old.unionByName(b.delta.df)
        fresh = _associations(a.delta.df, a, b_new, b, residual, null_safe, {"__assoc": F.col("__wb")})
        parts.append(fresh.where(F.col("__assoc") == 0).select(*cols, F.col("__wa").alias(WEIGHT)))
    if not b.delta.empty and a.old is not None:
        a_old = consolidate(a.data(a.old))
        b_k = b.delta.df.withColumn("__tag_old", F.lit(0))
        if b.old is not None:
            b_k = b.old.withColumn("__tag_old", F.lit(1)).unionByName(b_k)
        counts = _associations(a_old, a, b_k, b, residual, null_safe,
                               {"__c_old": F.col("__wb") * F.col("__tag_old"), "__c_new": F.col("__wb")})
        parts.append(counts.where((F.col("__c_old") == 0) != (F.col("__c_new") == 0)).select(
            *cols, F.when(F.col("__c_new") == 0, F.col("__wa")).otherwise(-F.col("__wa")).alias(WEIGHT)))
    return _union(parts)


def _union(parts: list[DataFrame]) -> DataFrame | None:
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def join_delta(kind: str, d_left: Changelog, d_right: Changelog, left_old: Lookup, right_old: Lookup,
               left_keys: list[str], right_keys: list[str], residual: str | None,
               left_cols: list[str], right_cols: list[str], null_safe: bool = False) -> DataFrame | None:
    """The join's output changelog for one batch (see the module docstring).

    ``kind``: inner, left, full, semi or anti. ``left_keys``/``right_keys``: the key columns
    of each side's changelog and arrangement; ``residual``: Spark SQL over the data columns of
    both sides, or None. ``left_old``/``right_old``: the arrangements as of the previous
    batch. Returns None when the change is known to be empty.
    """
    if kind not in JOIN_KINDS:
        raise ValueError(f"join kind {kind!r}: expected one of {', '.join(JOIN_KINDS)}")
    if d_left.empty and d_right.empty:
        return None
    left = _Side(d_left, left_keys, left_cols)
    right = _Side(d_right, right_keys, right_cols)
    inner = kind in ("inner", "left", "full")
    unmatched_l = kind in ("left", "full", "semi", "anti")
    unmatched_r = kind == "full"
    k_l = None if d_left.empty else d_left.keys(left_keys, drop_null=not null_safe)
    k_r = None if d_right.empty else d_right.keys(right_keys, drop_null=not null_safe)

    # old rows read once per side, at every key a term needs
    r_at: list[KeySet] = []
    if k_l is not None and (inner or unmatched_l or unmatched_r):
        r_at.append(k_l.renamed(right_keys))
    if k_r is not None and unmatched_l:
        r_at.append(k_r)
    l_at: list[KeySet] = []
    if k_r is not None:
        l_at.append(k_r.renamed(left_keys))
    if k_l is not None and unmatched_r:
        l_at.append(k_l)
    right.old = _read(right_old, r_at, null_safe)
    left.old = _read(left_old, l_at, null_safe)

    parts: list[DataFrame] = []
    if inner:
        if right.old is not None and not d_left.empty:
            parts.append(_inner(d_left.df, left, right.old, right, residual, null_safe))
        if left.old is not None and not d_right.empty:
            parts.append(_inner(left.old, left, d_right.df, right, residual, null_safe))
        if not d_left.empty and not d_right.empty:
            parts.append(_inner(d_left.df, left, d_right.df, right, residual, null_safe))
    if unmatched_l:
        unmatched = _unmatched_delta(left, right, residual, null_safe)
        if kind == "anti":
            parts += [unmatched] if unmatched is not None else []
        elif kind == "semi":
            if not d_left.empty:
                parts.append(d_left.df.select(*[F.col(f"`{c}`") for c in left_cols], F.col(WEIGHT)))
            if unmatched is not None:
                parts.append(unmatched.withColumn(WEIGHT, -F.col(WEIGHT)))
        elif unmatched is not None:
            parts.append(unmatched.select(*[F.col(f"`{c}`") for c in left_cols], *right.null_padding(),
                                          F.col(WEIGHT)))
    if unmatched_r:
        unmatched_r_df = _unmatched_delta(right, left, residual, null_safe)
        if unmatched_r_df is not None:
            parts.append(unmatched_r_df.select(*left.null_padding(), *[F.col(f"`{c}`") for c in right_cols],
                                               F.col(WEIGHT)))
    return _union(parts)


def _read(lookup: Lookup, at: list[KeySet], null_safe: bool) -> DataFrame | None:
    """The old rows of one side at the union of ``at`` (None: none needed, or none stored)."""
    if not at or lookup.empty:
        return None
    keys = union_keys(at)
    if keys.empty:
        return None
    old = lookup.read(keys, null_safe=null_safe)
    return None if old.empty else old.df
