"""One narrow interface for all Delta I/O.

The embedded default backend is delta-rs (the ``deltalake`` package): Delta's JVM classes are
not on PyPI, so a local SparkSession has no ``format("delta")``. Spark still does all of the
computing: snapshots are handed to Spark as the Parquet files of one Delta version; results
come back as Parquet files written by Spark's executors (committed by delta-rs as add actions,
:mod:`.files`) or, when change-sized, as Arrow for a delta-rs MERGE. Tables written this way are standard
Delta tables that delta-spark, DuckDB or Trino read unchanged.
"""
from deltalake.exceptions import DeltaError  # noqa: F401  (what delta-rs raises for a table it cannot read)

from .deltars import (  # noqa: F401
    Commit,
    DataFile,
    Docs,
    DeltaTableRef,
    Txn,
)
