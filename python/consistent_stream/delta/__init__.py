"""One narrow interface for all Delta I/O.

Commits and the log are delta-rs' (the ``deltalake`` package): one handle per table,
refreshed, with idempotent transactions and custom commit metadata; the logs of the tables
only a model's run writes (its state table and its target) are replayed and committed by
:mod:`.log` instead, with the same actions, so a batch opens and commits them at a few
object-store requests. Spark does the
computing: snapshots are handed to Spark as the Parquet files of one Delta version, or read by
delta-spark (in every session, :mod:`consistent_stream.session`) where the table's protocol
needs it (deletion vectors, column mapping: :class:`~.snapshot.ReadPlan`); results come back
as Parquet files written by Spark's executors (committed by delta-rs as add actions,
:mod:`.files`) or, when change-sized, as Arrow for a delta-rs MERGE. Tables written this way
are standard Delta tables that delta-spark, DuckDB or Trino read unchanged.

The modules: :mod:`.values` (what the interface takes and gives), :mod:`.snapshot` (one version
of a table as an immutable value, and its read plan), :mod:`.reader` (the snapshots, commits
and rows of a table), :mod:`.changes` (its Change Data Feed), :mod:`.committer` (its idempotent
commits), :mod:`.deltars` (:class:`DeltaTableRef`, the reader and the committer as one face),
:mod:`.log` (the replayed logs), :mod:`.checkpoint_rows` (their checkpoints' rows),
:mod:`.tail` (a source's log read from a version on), :mod:`.log_changes` (a range's change
from its log), :mod:`.files` (data files written and read), :mod:`.deletion_vectors` (the
deletion vector format, read and written).
"""
from deltalake.exceptions import DeltaError  # noqa: F401  (what delta-rs raises for a table it cannot read)

from .deltars import (  # noqa: F401
    Commit,
    DataFile,
    Docs,
    DeltaTableRef,
    Snapshot,
    Txn,
)
