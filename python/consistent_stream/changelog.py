"""Changelogs as Z-sets: a DataFrame of rows plus an integer weight column ``__weight``.

+1 is an insertion, -1 a retraction; an update is ``-old, +new``. A Z-set is *consolidated*
when every distinct full row appears once with its summed, non-zero weight (DBSP's
``consolidate``; Flink's changelog normal form without UPDATE_BEFORE/AFTER pairs).
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

WEIGHT = "__weight"


def data_columns(df: DataFrame) -> list[str]:
    """The columns of ``df`` other than the weight."""
    return [c for c in df.columns if c != WEIGHT]


def consolidate(df: DataFrame) -> DataFrame:
    """Sum the weights of equal rows and drop rows whose weight is zero.

    In: any columns plus ``__weight`` (bigint). Out: the same columns, one row per distinct
    data row, ``__weight`` != 0. Rows compare with SQL GROUP BY semantics (NULLs equal).
    """
    cols = data_columns(df)
    if not cols:
        return df.groupBy().agg(F.sum(WEIGHT).cast("bigint").alias(WEIGHT)).where(F.col(WEIGHT) != 0)
    return (df.groupBy(*[F.col(f"`{c}`") for c in cols])
            .agg(F.sum(WEIGHT).cast("bigint").alias(WEIGHT))
            .where(F.col(WEIGHT) != 0))


def with_weight(df: DataFrame, weight: int = 1) -> DataFrame:
    """Turn a plain relation into a Z-set: every row gets ``__weight = weight``."""
    return df.withColumn(WEIGHT, F.lit(weight).cast("bigint"))
