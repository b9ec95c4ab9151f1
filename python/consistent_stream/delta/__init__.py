"""One narrow interface for all Delta I/O.

The embedded default backend is delta-rs (the ``deltalake`` package): Delta's JVM classes are
not on PyPI, so a local SparkSession has no ``format("delta")``. Spark still does all of the
computing: snapshots are handed to Spark as the Parquet files of one Delta version, and
results come back to delta-rs as Arrow for the commit. Tables written this way are standard
Delta tables that delta-spark, DuckDB or Trino read unchanged.
"""
from .deltars import (  # noqa: F401
    Commit,
    DeltaTableRef,
    Txn,
)
