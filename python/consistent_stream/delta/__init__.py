"""One narrow interface for all Delta I/O.

Commits and the log are delta-rs' (the ``deltalake`` package): one handle per table,
refreshed, with idempotent transactions and custom commit metadata; the logs of the tables
only a model's run writes (its state table and its target) are replayed and committed by
:mod:`.log` instead, with the same actions, so a batch opens and commits them at a few
object-store requests. Spark does the
computing: snapshots are handed to Spark as the Parquet files of one Delta version, or read by
delta-spark (in every session, :mod:`consistent_stream.session`) where the table's protocol
needs it (deletion vectors, column mapping: :class:`~.deltars.ReadPlan`); results come back
as Parquet files written by Spark's executors (committed by delta-rs as add actions,
:mod:`.files`) or, when change-sized, as Arrow for a delta-rs MERGE. Tables written this way
are standard Delta tables that delta-spark, DuckDB or Trino read unchanged.
"""
from deltalake.exceptions import DeltaError  # noqa: F401  (what delta-rs raises for a table it cannot read)

from .deltars import (  # noqa: F401
    Commit,
    DataFile,
    Docs,
    DeltaTableRef,
    Txn,
)
