"""delta-rs backend of the Delta interface (see ``consistent_stream.delta``).

Every function takes a table path (local path or URI). Versions are Delta table versions
(int >= 0). Commits carry an idempotent transaction (``txn`` action: app id + version) and
custom commit metadata under ``consistent_stream.*`` keys.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from ..errors import CommitError, SourceError

META_PREFIX = "consistent_stream."


@dataclass(frozen=True)
class Txn:
    """An idempotent Delta transaction: ``app_id`` and a monotonically growing ``version``
    (we use the micro-batch id). Delta keeps the latest version per app id in the log."""
    app_id: str
    version: int


@dataclass(frozen=True)
class Commit:
    """One commit of a table: its version, commit time (ms since epoch) and our metadata."""
    version: int
    timestamp_ms: int
    metadata: dict[str, Any] = field(default_factory=dict)


def plain_arrow(table: pa.Table) -> pa.Table:
    """Cast Arrow view and large string/binary types (delta-rs emits views, and rejects
    some of what Spark emits) to plain string/binary."""
    fields = []
    changed = False
    for f in table.schema:
        t = f.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t, changed = pa.string(), True
        elif pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            t, changed = pa.binary(), True
        fields.append(pa.field(f.name, t, f.nullable))
    return table.cast(pa.schema(fields)) if changed else table


class DeltaTableRef:
    """A Delta table at ``path``: reads at explicit versions and idempotent commits.

    Raises :class:`SourceError` when the table is missing or a version is gone.
    """

    def __init__(self, path: str):
        self.path = str(path)

    # ---- metadata -------------------------------------------------------------------------
    def exists(self) -> bool:
        return os.path.isdir(os.path.join(self.path, "_delta_log")) and self._try_table() is not None

    def _try_table(self, version: int | None = None) -> DeltaTable | None:
        try:
            return DeltaTable(self.path, version=version)
        except TableNotFoundError:
            return None

    def table(self, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(self.path, version=version)
        except TableNotFoundError as e:
            raise SourceError(f"no Delta table at {self.path}: {e}") from e
        except Exception as e:  # delta-rs raises plain exceptions for vacuumed versions
            raise SourceError(f"cannot open Delta table {self.path} at version {version}: {e}") from e

    def latest_version(self) -> int:
        return self.table().version()

    def txn_version(self, app_id: str) -> int | None:
        """Latest transaction version committed by ``app_id``, or None."""
        t = self._try_table()
        return None if t is None else t.transaction_version(app_id)

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        return pa.schema(self.table(version).schema().to_arrow())

    def partition_columns(self) -> list[str]:
        return list(self.table().metadata().partition_columns)

    def change_data_feed_enabled(self, version: int | None = None) -> bool:
        conf = self.table(version).metadata().configuration
        return str(conf.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def num_records(self, version: int) -> int:
        """Number of rows of ``version`` (from the log's file statistics, no data scan)."""
        actions = pa.table(self.table(version).get_add_actions(flatten=True))
        return int(sum(v or 0 for v in actions.column("num_records").to_pylist())) if actions.num_rows else 0

    def files(self, version: int) -> list[str]:
        """Paths, relative to the table root, of the data files of ``version``."""
        actions = pa.table(self.table(version).get_add_actions(flatten=True))
        return actions.column("path").to_pylist()

    def history(self, limit: int | None = None) -> list[Commit]:
        """Commits, newest first, with the ``consistent_stream.*`` metadata decoded."""
        out = []
        for h in self.table().history(limit):
            meta = {k[len(META_PREFIX):]: v for k, v in h.items() if k.startswith(META_PREFIX)}
            out.append(Commit(int(h["version"]), int(h.get("timestamp", 0)), meta))
        return out

    def commit_at(self, version: int) -> Commit:
        latest = self.latest_version()
        for c in self.history(latest - version + 1):
            if c.version == version:
                return c
        raise SourceError(f"commit {version} of {self.path} is not in its history (log cleaned up?)")

    def find_commit(self, app_id: str, batch_id: int, search_limit: int = 1000) -> Commit | None:
        """The commit this app id made for ``batch_id`` (metadata keys app_id/batch_id)."""
        for c in self.history(search_limit):
            if c.metadata.get("app_id") == app_id and int(c.metadata.get("batch_id", -1)) == batch_id:
                return c
        return None

    # ---- reads into Spark -------------------------------------------------------------------
    def read_snapshot(self, spark: SparkSession, version: int, columns: list[str] | None = None) -> DataFrame:
        """The table at ``version`` as a Spark DataFrame (its columns, or ``columns``).

        Spark reads the version's Parquet files directly; tables with deletion vectors or
        column mapping, which plain Parquet reading would get wrong, go through delta-rs.
        """
        dt = self.table(version)
        schema = pa.schema(dt.schema().to_arrow())
        proto = dt.protocol()
        features = set(proto.reader_features or [])
        if features & {"deletionVectors", "columnMapping"}:
            arrow = pa.table(dt.to_pyarrow_table(columns=columns)) if hasattr(dt, "to_pyarrow_table") \
                else pa.table(dt.scan(columns=columns).read_all())
            return spark.createDataFrame(arrow)
        uris = dt.file_uris()
        spark_schema = from_arrow_schema(schema)
        if not uris:
            df = spark.createDataFrame([], spark_schema)
        else:
            reader = spark.read.schema(spark_schema)
            if dt.metadata().partition_columns:
                reader = reader.option("basePath", _as_uri(self.path))
            df = reader.parquet(*uris)
            df = df.select(*[f"`{f.name}`" for f in schema])
        if columns is not None:
            df = df.select(*[f"`{c}`" for c in columns])
        return df

    def read_changes_arrow(self, start_exclusive: int, end_inclusive: int,
                           columns: list[str] | None = None) -> pa.Table:
        """Change Data Feed rows of versions ``(start_exclusive, end_inclusive]`` as Arrow,
        with ``_change_type`` (insert, delete, update_preimage, update_postimage) and
        ``_commit_version``.

        Raises SourceError naming the table and the table property to set when the
        Change Data Feed is off or the versions are gone.
        """
        if not self.change_data_feed_enabled(end_inclusive):
            raise SourceError(
                f"Delta table {self.path} does not have the Change Data Feed on: set table "
                f"property delta.enableChangeDataFeed = true, then run with --full-refresh")
        cols = None if columns is None else list(columns) + ["_change_type", "_commit_version"]
        try:
            reader = self.table().load_cdf(starting_version=start_exclusive + 1,
                                           ending_version=end_inclusive, columns=cols)
            return plain_arrow(pa.table(reader.read_all()))
        except Exception as e:
            raise SourceError(
                f"cannot read the Change Data Feed of {self.path} for versions "
                f"{start_exclusive + 1}..{end_inclusive}: {e}. If those versions were vacuumed, "
                f"run with --full-refresh") from e

    # ---- commits ----------------------------------------------------------------------------
    @staticmethod
    def _props(txn: Txn | None, metadata: dict[str, Any] | None) -> CommitProperties:
        meta = {META_PREFIX + k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True))
                for k, v in (metadata or {}).items()}
        return CommitProperties(custom_metadata=meta or None,
                                app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None)

    def write(self, data: pa.Table, *, mode: str, txn: Txn | None = None,
              metadata: dict[str, Any] | None = None, partition_by: list[str] | None = None,
              configuration: dict[str, str] | None = None) -> int:
        """Append or overwrite (``mode``) ``data`` as ONE commit; returns the new version."""
        data = plain_arrow(data)
        exists = self._try_table() is not None
        write_deltalake(self.path, data, mode=mode, partition_by=partition_by or None,
                        schema_mode="overwrite" if (mode == "overwrite" and exists) else None,
                        configuration=None if exists else configuration,
                        commit_properties=self._props(txn, metadata))
        return self.latest_version()

    def create_empty(self, schema: pa.Schema, *, partition_by: list[str] | None = None,
                     configuration: dict[str, str] | None = None) -> None:
        from deltalake import DeltaTable as _DT
        _DT.create(self.path, schema, partition_by=partition_by or None, configuration=configuration)

    def commit_empty(self, *, txn: Txn, metadata: dict[str, Any]) -> int:
        """A commit with no data change that records ``txn`` and ``metadata``."""
        dt = self.table()
        dt.create_write_transaction([], "append", dt.schema(),
                                    commit_properties=self._props(txn, metadata))
        return self.latest_version()

    def merge_by_key(self, changes: pa.Table, key: list[str], *, txn: Txn,
                     metadata: dict[str, Any]) -> int:
        """Apply upserts and deletes by ``key`` in ONE commit.

        ``changes``: the target's columns plus ``__op`` ('upsert' | 'delete'), at most one
        row per key. Keys compare with IS NOT DISTINCT FROM (a NULL key is a value).
        """
        return self._merge(
            changes, lambda cols: _same(key),
            lambda m, cols: (m.when_matched_update({_q(c): f"s.{_q(c)}" for c in cols}, predicate="s.__op = 'upsert'")
                             .when_matched_delete(predicate="s.__op = 'delete'")
                             .when_not_matched_insert({_q(c): f"s.{_q(c)}" for c in cols},
                                                      predicate="s.__op = 'upsert'")),
            txn=txn, metadata=metadata)

    def merge_bag(self, changes: pa.Table, *, txn: Txn, metadata: dict[str, Any]) -> int:
        """Apply a bag's changes in ONE commit: rows with ``__op`` 'delete' remove every copy
        of that row (all columns equal, NULLs as values); rows with ``__op`` 'insert' are
        appended, one copy each.

        ``changes``: the target's columns plus ``__op``; the delete rows are distinct.
        """
        return self._merge(
            changes, lambda cols: "s.__op = 'delete' AND " + _same(cols),
            lambda m, cols: (m.when_matched_delete()
                             .when_not_matched_insert({_q(c): f"s.{_q(c)}" for c in cols},
                                                      predicate="s.__op = 'insert'")),
            txn=txn, metadata=metadata)

    def _merge(self, changes: pa.Table, predicate, clauses, *, txn: Txn, metadata: dict[str, Any]) -> int:
        """One MERGE of ``changes`` (target columns + ``__op``) as ONE commit recording
        ``txn``: ``predicate(cols)`` is its ON condition (target ``t``, source ``s``) and
        ``clauses(merger, cols)`` adds its WHEN clauses. Raises CommitError when the commit
        did not record ``txn``."""
        if changes.num_rows == 0:
            return self.commit_empty(txn=txn, metadata=metadata)
        changes = plain_arrow(changes)
        cols = [c for c in changes.column_names if c != "__op"]
        merger = self.table().merge(changes, predicate(cols), source_alias="s", target_alias="t",
                                    commit_properties=self._props(txn, metadata))
        clauses(merger, cols).execute()
        v = self.latest_version()
        if self.txn_version(txn.app_id) != txn.version:
            raise CommitError(f"merge into {self.path} did not record txn {txn}")
        return v


def _same(cols: list[str]) -> str:
    """Target row ``t`` and source row ``s`` agree on ``cols`` (NULLs equal)."""
    return " AND ".join(f"(t.{_q(c)} IS NOT DISTINCT FROM s.{_q(c)})" for c in cols)


def _q(name: str) -> str:
    """Quote an identifier for delta-rs' SQL (DataFusion: double quotes)."""
    return '"' + name.replace('"', '""') + '"'


def _as_uri(path: str) -> str:
    return path if "://" in path else "file://" + os.path.abspath(path)
