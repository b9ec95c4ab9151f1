"""Changelogs as Z-sets: a DataFrame of rows plus an integer weight column ``__weight``.

+1 is an insertion, -1 a retraction; an update is ``-old, +new``. A Z-set is *consolidated*
when every distinct full row appears once with its summed, non-zero weight (DBSP's
``consolidate``; Flink's changelog normal form without UPDATE_BEFORE/AFTER pairs).

A :class:`Changelog` is one operator's change in one micro-batch, where it lives: on the
driver as Arrow when it is change-sized (then its size and emptiness are known without a
Spark job, and it reaches Spark as a broadcastable local relation), or on the executors as a
lazy DataFrame over files (a rebuild from snapshots, or a change too large for the driver).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

WEIGHT = "__weight"

BROADCAST_BYTES = 64 << 20
"""Driver-side changelogs up to this size (Arrow bytes) are broadcast to the joins that use
them; Spark cannot size a relation made from Arrow batches on its own."""


def arrow_to_spark(spark, data: pa.Table, schema=None) -> DataFrame:
    """An Arrow table as a Spark DataFrame (``schema``: the Spark schema to give it; default
    from Arrow). Use this, never ``spark.createDataFrame(table)`` directly: pyspark 4.2.1
    silently drops every record batch that follows an empty batch (a table whose batches hold
    1, 0 and 1 rows arrives with 1 row), and tables concatenated or filtered by pyarrow often
    carry empty batches."""
    if schema is None:
        from pyspark.sql.pandas.types import from_arrow_schema
        schema = from_arrow_schema(data.schema)
    if data.num_rows == 0:
        return spark.createDataFrame([], schema)
    batches = [b for b in data.to_batches() if b.num_rows]
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=data.schema), schema=schema)


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


@dataclass
class Changelog:
    """One batch's change of one plan node (columns + ``__weight``).

    ``df``: always usable in a Spark plan. ``arrow``: the same rows on the driver, when the
    change was materialized there. ``rows``: the number of rows when known without a job
    (None: unknown). ``consolidated``: each distinct row once, non-zero weights.
    """
    df: DataFrame
    arrow: pa.Table | None = None
    rows: int | None = None
    consolidated: bool = False

    @staticmethod
    def of_arrow(spark, data: pa.Table, *, consolidated: bool = False, schema=None) -> "Changelog":
        """A driver-side changelog; ``schema``: the Spark schema to give it (default: from Arrow)."""
        df = arrow_to_spark(spark, data, schema)
        if data.num_rows and data.nbytes <= BROADCAST_BYTES:
            df = F.broadcast(df)
        return Changelog(df, data, data.num_rows, consolidated)

    @property
    def empty(self) -> bool:
        """Known to hold no row."""
        return self.rows == 0

    @property
    def small(self) -> bool:
        return self.arrow is not None and self.arrow.nbytes <= BROADCAST_BYTES

    def keys(self, columns: list[str], *, drop_null: bool = False) -> "KeySet":
        """The distinct values of ``columns`` in this change (the keys a batch touches), as
        columns named ``columns``. ``drop_null``: leave out tuples with a NULL (SQL ``=`` keys
        never match them)."""
        if self.arrow is not None:
            t = self.arrow.select(columns)
            if drop_null and t.num_rows:
                import pyarrow.compute as pc
                mask = None
                for c in columns:
                    m = pc.is_valid(t.column(c))
                    mask = m if mask is None else pc.and_(mask, m)
                t = t.filter(mask)
            if t.num_rows:
                t = t.group_by(columns, use_threads=False).aggregate([])
            return KeySet(self.df.sparkSession, t, None)
        df = self.df.select(*[F.col(f"`{c}`") for c in columns])
        if drop_null:
            df = df.dropna()
        return KeySet(self.df.sparkSession, None, df.distinct())


@dataclass
class KeySet:
    """Key tuples a batch touches: on the driver (``arrow``: state reads can skip files by
    their statistics) or as a lazy DataFrame (``df``)."""
    spark: object
    arrow: pa.Table | None
    df: DataFrame | None

    @property
    def small(self) -> bool:
        return self.arrow is not None and self.arrow.nbytes <= BROADCAST_BYTES

    @property
    def empty(self) -> bool:
        return self.arrow is not None and self.arrow.num_rows == 0

    @property
    def columns(self) -> list[str]:
        return list(self.arrow.column_names if self.arrow is not None else self.df.columns)

    def renamed(self, columns: list[str]) -> "KeySet":
        """The same tuples under other column names (the other side's key columns)."""
        if self.arrow is not None:
            return KeySet(self.spark, self.arrow.rename_columns(list(columns)), None)
        return KeySet(self.spark, None, self.df.toDF(*columns))

    def frame(self) -> DataFrame:
        if self.df is None:
            self.df = arrow_to_spark(self.spark, self.arrow)
        return self.df
