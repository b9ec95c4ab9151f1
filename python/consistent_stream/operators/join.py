"""Equi-join delta rules (inner and left outer).

Inner join, bilinear in its inputs (DBSP; the classic IVM delta rule):

    d(L join R) = dL join R_old + L_old join dR + dL join dR

with the output weight the product of the input weights. ``L_old``/``R_old`` are the
arrangements (integrals) as of the previous batch; they may be unconsolidated logs, since the
join distributes over Z-set addition.

Left outer join = inner join + the NULL-padded rows of L whose key has no match in R. With
``c(k)`` the number of R rows (sum of weights) with key k, before and after the batch, the
padded part changes by

    +L_old(k)   where c_old(k) > 0 and c_new(k) = 0   (last match retracted)
    -L_old(k)   where c_old(k) = 0 and c_new(k) > 0   (first match arrived)
    +dL(k)      where c_new(k) = 0, or k is NULL      (new rows without a match)

which is Flink's ``numOfAssociations`` bookkeeping done per batch over key sets. NULL keys
never match (SQL ``=``).

Columns in: left changelog (left columns + ``__weight``), right changelog likewise.
Out: left columns, right columns, ``__weight``.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..changelog import WEIGHT
from ..state import StateStore


def _keyed(df: DataFrame, keys: list[str], prefix: str) -> tuple[DataFrame, list[str]]:
    names = [f"{prefix}{i}" for i in range(len(keys))]
    return df.select("*", *[F.expr(k).alias(n) for k, n in zip(keys, names)]), names


def _eq(a: DataFrame, ak: list[str], b: DataFrame, bk: list[str]):
    cond = None
    for x, y in zip(ak, bk):
        c = a[x] == b[y]
        cond = c if cond is None else cond & c
    return cond


def _inner(l: DataFrame, lk: list[str], r: DataFrame, rk: list[str], lcols, rcols) -> DataFrame:
    l2 = l.withColumnRenamed(WEIGHT, "__wl")
    r2 = r.withColumnRenamed(WEIGHT, "__wr")
    j = l2.join(r2, _eq(l2, lk, r2, rk), "inner")
    return j.select(*[l2[f"`{c}`"] for c in lcols], *[r2[f"`{c}`"] for c in rcols],
                    (l2["__wl"] * r2["__wr"]).alias(WEIGHT))


def join_delta(state: StateStore, op_id: str, kind: str, d_left: DataFrame, d_right: DataFrame,
               left_keys: list[str], right_keys: list[str], residual: str | None,
               left_cols: list[str], right_cols: list[str], right_types) -> DataFrame:
    """The join's output changelog for one batch; stages both arrangements.

    ``left_keys``/``right_keys``: Spark SQL expressions over each side's columns;
    ``right_types``: Spark types of ``right_cols`` (for typed NULL padding).
    """
    l_old = state.read(f"{op_id}_left", d_left.schema)
    r_old = state.read(f"{op_id}_right", d_right.schema)
    state.stage(f"{op_id}_left", d_left)
    state.stage(f"{op_id}_right", d_right)

    dl, lk = _keyed(d_left, left_keys, "__lk")
    dr, rk = _keyed(d_right, right_keys, "__rk")
    lo, _ = _keyed(l_old, left_keys, "__lk")
    ro, _ = _keyed(r_old, right_keys, "__rk")
    parts = [_inner(dl, lk, ro, rk, left_cols, right_cols),
             _inner(lo, lk, dr, rk, left_cols, right_cols),
             _inner(dl, lk, dr, rk, left_cols, right_cols)]
    out = parts[0].unionByName(parts[1]).unionByName(parts[2])
    if residual:
        out = out.where(F.expr(residual))
    if kind == "inner":
        return out
    if kind != "left":
        raise ValueError(f"join kind {kind}")

    # match counts per key before and after, for keys touched by this batch
    not_null = " AND ".join(f"{k} IS NOT NULL" for k in rk)
    touched = (dl.select(*[F.col(a).alias(b) for a, b in zip(lk, rk)])
               .unionByName(dr.select(*rk)).where(not_null).distinct())
    c_old = (ro.join(touched, rk, "left_semi").groupBy(*rk).agg(F.sum(WEIGHT).alias("__c_old")))
    c_d = dr.where(not_null).groupBy(*rk).agg(F.sum(WEIGHT).alias("__c_d"))
    counts = (touched.join(c_old, rk, "left").join(c_d, rk, "left")
              .select(*rk, F.coalesce("__c_old", F.lit(0)).alias("__c_old"),
                      (F.coalesce("__c_old", F.lit(0)) + F.coalesce("__c_d", F.lit(0))).alias("__c_new")))
    pad = [F.lit(None).cast(t).alias(c) for c, t in zip(right_cols, right_types)]
    flips = counts.where((F.col("__c_old") > 0) != (F.col("__c_new") > 0))
    lo_flip = lo.join(flips.select(*[F.col(a).alias(b) for a, b in zip(rk, lk)], "__c_old", "__c_new"), lk, "inner")
    padded_old = lo_flip.select(*[F.col(f"`{c}`") for c in left_cols], *pad,
                                F.when(F.col("__c_new") > 0, -F.col(WEIGHT)).otherwise(F.col(WEIGHT)).alias(WEIGHT))
    dl_c = dl.join(counts.select(*[F.col(a).alias(b) for a, b in zip(rk, lk)], "__c_new"), lk, "left")
    padded_new = (dl_c.where(F.coalesce(F.col("__c_new"), F.lit(0)) == 0)
                  .select(*[F.col(f"`{c}`") for c in left_cols], *pad, F.col(WEIGHT)))
    return out.unionByName(padded_old).unionByName(padded_new)
