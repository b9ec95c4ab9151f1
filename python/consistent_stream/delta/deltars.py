"""The face of the Delta interface (see ``consistent_stream.delta``): :class:`DeltaTableRef`.

Every table is a :class:`DeltaTableRef` on a path (local path or URI): a
:class:`~.reader.TableReader` (its snapshots, commits and rows, by the engine its protocol
needs) and a :class:`~.committer.TableCommitter` (its idempotent commits; the commit
protocol is stated there) over the reader's one current :class:`~.snapshot.Snapshot`. Owns
nothing else: each method is the reader's or the committer's, named once here so the engine
keeps one handle per table. The values and conversions the interface takes and gives
(:mod:`.values`), the read plan (:mod:`.snapshot`) and the Change Data Feed's schema changes
(:mod:`.changes`) are re-exported under the names the engine imports them by.

Raises what the reader and the committer raise: :class:`~consistent_stream.errors.SourceError`
(a table missing, a version gone, a read that needs delta-spark) and
:class:`~consistent_stream.errors.CommitError` (a commit that did not record its txn).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from .changes import CDF_COLUMNS, SchemaChange, physical_name  # noqa: F401
from .committer import HOOKS, TableCommitter  # noqa: F401
from .log import OwnedLog
from .reader import TableReader
from .snapshot import (  # noqa: F401
    CHANGE_FEED_DELTA_RS_EXCLUDED,
    DATASET,
    DATASET_FEATURES,
    DELTA_RS,
    DELTA_SPARK,
    FILE_EXACT_FEATURES,
    PARQUET,
    QUERY_BUILDER,
    SPARK_FEATURES,
    ReadPlan,
    Snapshot,
)
from .values import (  # noqa: F401
    DELETED_METRICS,
    INSERTED_METRICS,
    META_PREFIX,
    UPDATED_METRICS,
    Commit,
    DataFile,
    Docs,
    Txn,
    arrow_schema,
    as_uri,
    changed_rows,
    dq,
    plain_arrow,
    plain_schema,
)


class DeltaTableRef:
    """A Delta table at ``path``: one snapshot, refreshed; reads at explicit versions
    (:attr:`reader`) and idempotent commits (:attr:`committer`). ``own_log``: a table only the
    model's run writes (its state table, its target), its log replayed and committed by
    :mod:`.log`; ``owned``: only the run's commits move it (implied by ``own_log``);
    ``checksums``: each commit writes its version checksum.

    Raises :class:`SourceError` when the table is missing or a version is gone.
    """

    def __init__(self, path: str, *, owned: bool = False, own_log: bool = False, checksums: bool = False):
        self.reader = TableReader(path, owned=owned, own_log=own_log, checksums=checksums)
        self.committer = TableCommitter(self.reader)
        self.path = self.reader.path
        self.owned = self.reader.owned
        self.storage_options = self.reader.storage_options

    # ---- the snapshot ---------------------------------------------------------------------------
    def replayed_log(self) -> OwnedLog | None:
        """The table's log as :mod:`.log` replays it (:meth:`.reader.TableReader.own`): None
        when delta-rs serves the table."""
        return self.reader.own()

    def exists(self) -> bool:
        return self.reader.exists()

    def table(self):
        """The delta-rs handle (``deltalake.DeltaTable``) at the current version."""
        return self.reader.table()

    def snapshot(self) -> Snapshot:
        """The current snapshot, without looking for newer commits."""
        return self.reader.snapshot()

    def refresh(self, *, force: bool = False) -> Snapshot:
        """The latest snapshot (:meth:`.reader.TableReader.refresh`)."""
        return self.reader.refresh(force=force)

    def latest_version(self) -> int:
        """The latest version (the snapshot refreshed first)."""
        return self.reader.refresh().version

    def version(self) -> int:
        """The current snapshot's version, without looking for newer commits (an owned table:
        its newest, the run's own last commit included)."""
        return self.reader.version()

    # ---- what the table says --------------------------------------------------------------------
    def txn_version(self, app_id: str) -> int | None:
        return self.reader.txn_version(app_id)

    def log_actions(self, version: int) -> list[dict]:
        return self.reader.log_actions(version)

    def schema_fields(self, version: int | None = None) -> list[dict]:
        return self.reader.schema_fields(version)

    def schema_changes(self, start_exclusive: int, end_inclusive: int) -> list[SchemaChange]:
        return self.reader.schema_changes(start_exclusive, end_inclusive)

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        return self.reader.arrow_schema(version)

    def plain_arrow_schema(self, version: int | None = None) -> pa.Schema:
        return self.reader.plain_arrow_schema(version)

    def partition_columns(self) -> list[str]:
        return self.reader.partition_columns()

    def reader_features(self, version: int | None = None) -> set[str]:
        return self.reader.reader_features(version)

    def read_plan(self, version: int | None = None) -> ReadPlan:
        return self.reader.read_plan(version)

    def change_data_feed_enabled(self) -> bool:
        return self.reader.change_data_feed_enabled()

    def add_actions(self, version: int) -> pa.Table:
        return self.reader.add_actions(version)

    def data_files(self, version: int) -> list[DataFile] | None:
        return self.reader.data_files(version)

    def num_records(self, version: int) -> int:
        return self.reader.num_records(version)

    def files(self, version: int) -> list[str]:
        return self.reader.files(version)

    def file_uri(self, rel: str) -> str:
        return self.reader.file_uri(rel)

    def file_path(self, rel: str) -> str:
        return self.reader.file_path(rel)

    def history(self, limit: int | None = None) -> list[Commit]:
        return self.reader.history(limit)

    def commit_rows(self, start_exclusive: int, end_inclusive: int) -> list[tuple[int, int, int | None]]:
        return self.reader.commit_rows(start_exclusive, end_inclusive)

    def kept_commit(self) -> Commit | None:
        return self.reader.kept_commit()

    def latest_commit(self) -> Commit:
        """The newest commit (after a refresh): one commit file read, however long the log."""
        return self.reader.commit_at(self.reader.refresh().version)

    def commit_at(self, version: int) -> Commit:
        return self.reader.commit_at(version)

    # ---- rows -----------------------------------------------------------------------------------
    def read_snapshot(self, spark: SparkSession, version: int, columns: list[str] | None = None) -> DataFrame:
        return self.reader.read_snapshot(spark, version, columns)

    def read_snapshot_arrow(self, version: int, columns: list[str] | None = None) -> pa.Table:
        return self.reader.read_snapshot_arrow(version, columns)

    def read_changes_arrow(self, start_exclusive: int, end_inclusive: int,
                           columns: list[str] | None = None, spark: SparkSession | None = None) -> pa.Table:
        return self.reader.read_changes_arrow(start_exclusive, end_inclusive, columns, spark)

    def read_log_changes(self, start_exclusive: int, end_inclusive: int, schema: pa.Schema,
                         partition_columns: list[str], physical: dict[str, str] | None = None,
                         commits: list | None = None):
        return self.reader.read_log_changes(start_exclusive, end_inclusive, schema, partition_columns, physical,
                                            commits)

    def log_commits(self, start_exclusive: int, end_inclusive: int) -> list:
        return self.reader.log_commits(start_exclusive, end_inclusive)

    # ---- commits --------------------------------------------------------------------------------
    def write(self, data: pa.Table, *, mode: str, txn: Txn | None = None,
              metadata: dict[str, Any] | None = None, partition_by: list[str] | None = None,
              configuration: dict[str, str] | None = None) -> int:
        return self.committer.write(data, mode=mode, txn=txn, metadata=metadata, partition_by=partition_by,
                                    configuration=configuration)

    def commit_files(self, adds: list[DataFile], removes: list[DataFile], *, schema: pa.Schema,
                     txn: Txn | None, metadata: dict[str, Any] | None,
                     partition_by: list[str] | None = None,
                     configuration: dict[str, str] | None = None, docs: Docs | None = None) -> int:
        return self.committer.commit_files(adds, removes, schema=schema, txn=txn, metadata=metadata,
                                           partition_by=partition_by, configuration=configuration, docs=docs)

    def rewritable(self) -> str | None:
        return self.committer.rewritable()

    def change_feed_on(self) -> bool:
        return self.committer.change_feed_on()

    def commit_rewrite(self, adds: list[DataFile], removes: list[DataFile], cdc: list[DataFile], *, txn: Txn,
                       metadata: dict[str, Any], metrics: dict[str, int], deletion_vectors: bool = False) -> int:
        return self.committer.commit_rewrite(adds, removes, cdc, txn=txn, metadata=metadata, metrics=metrics,
                                             deletion_vectors=deletion_vectors)

    def commit_empty(self, *, txn: Txn, metadata: dict[str, Any]) -> int:
        return self.committer.commit_empty(txn=txn, metadata=metadata)

    def merge_by_key(self, changes: pa.Table, key: list[str], *, txn: Txn,
                     metadata: dict[str, Any]) -> tuple[int, dict]:
        return self.committer.merge_by_key(changes, key, txn=txn, metadata=metadata)

    def merge_bag(self, changes: pa.Table, *, txn: Txn, metadata: dict[str, Any]) -> tuple[int, dict]:
        return self.committer.merge_bag(changes, txn=txn, metadata=metadata)
