"""delta-rs backend of the Delta interface (see ``consistent_stream.delta``).

Every table is a :class:`DeltaTableRef` on a path (local path or URI). A ref opens the table
once (one log replay, from the last Delta checkpoint) and is then *refreshed*, never
reopened: ``refresh()`` applies only the commits written since, and the ref's own commits
advance it without reading the log. Versions are Delta table versions (int >= 0). Commits
carry an idempotent transaction (``txn`` action: app id + version) and custom commit
metadata under ``consistent_stream.*`` keys. A ref made with ``own_log`` (a table only the
model's run writes) replays and commits through :mod:`.log` and opens delta-rs only for what
that does not serve (history, time travel, maintenance, a MERGE :mod:`~consistent_stream.sink.
rewrite` leaves to delta-rs).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from .. import location, storage
from ..errors import CommitError, SourceError
from ..faults import fault_point
from .log import ConflictingCommit, OwnedLog, UnsupportedLog, log_path

META_PREFIX = "consistent_stream."
log = logging.getLogger("consistent_stream")


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


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file of a Delta table, as its add (or remove) action describes it.

    ``path``: relative to the table root, not URL-encoded; ``size``: bytes; ``num_records``:
    rows; ``partition_values``: partition column -> Delta's string form of the value (None for
    NULL); ``stats``: Delta's JSON statistics (``numRecords``, ``minValues``, ``maxValues``,
    ``nullCount``), "" when unknown.
    """
    path: str
    size: int
    num_records: int
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    stats: str = ""

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, dict(self.partition_values), int(time.time() * 1000), True,
                         self.stats or json.dumps({"numRecords": self.num_records}))

    def remove_action(self) -> RemoveAction:
        return RemoveAction(self.path, True, int(time.time() * 1000), self.size, dict(self.partition_values))


def arrow_schema(schema) -> pa.Schema:
    """A Spark schema (``StructType``) in Arrow as Delta stores it: a TIMESTAMP is
    UTC-adjusted microseconds (``timestamp[us, tz=UTC]``), every other type as pyspark maps it."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types :func:`plain_arrow` casts to (plain string/binary)."""
    return plain_arrow(schema.empty_table()).schema


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


@dataclass(frozen=True)
class Docs:
    """dbt's ``persist_docs`` as Delta keeps it: the table's ``description`` (the metaData
    action's) and the columns' comments (``comment`` in each field's metadata, as Spark and
    Delta Lake write ``COMMENT``). ``None`` / missing columns: not managed (kept as they are)."""
    description: str | None = None
    columns: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(dt: DeltaTable) -> "Docs":
        """What table ``dt`` holds now."""
        return Docs(dt.metadata().description,
                    tuple(sorted((f.name.lower(), f.metadata["comment"]) for f in dt.schema().fields
                                 if f.metadata and f.metadata.get("comment") is not None)))

    @staticmethod
    def from_dbt(docs: dict | None) -> "Docs | None":
        """From the job spec's ``docs`` (``{description, columns: {name: description}}``)."""
        if not docs:
            return None
        return Docs(docs.get("description") or None,
                    tuple(sorted((str(k).lower(), str(v)) for k, v in (docs.get("columns") or {}).items() if v)))

    def updated(self, wanted: "Docs | None", schema: pa.Schema) -> "Docs":
        """These descriptions with ``wanted``'s set over them, for the columns of ``schema``."""
        names = {f.name.lower() for f in schema}
        columns = {**dict(self.columns), **dict(wanted.columns if wanted else ())}
        return Docs(wanted.description if wanted and wanted.description is not None else self.description,
                    tuple(sorted((k, v) for k, v in columns.items() if k in names)))


def _commented(schema: pa.Schema, docs: Docs | None) -> pa.Schema:
    """``schema`` with each column's comment from ``docs`` in its field metadata."""
    comments = {k.lower(): v for k, v in (docs.columns if docs else ())}
    return pa.schema([f.with_metadata({"comment": comments[f.name.lower()]}) if f.name.lower() in comments else f
                      for f in schema])


PARQUET = "Parquet files"
DATASET = "delta-rs (dataset)"
QUERY_BUILDER = "delta-rs (QueryBuilder)"
DELTA_RS = "delta-rs"
DELTA_SPARK = "delta-spark"

FILE_EXACT_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck", "v2Checkpoint"})
"""Reader features under which the Parquet files the log lists for a version hold exactly its
rows and columns: they change how the log is kept (v2 checkpoints, which delta-rs' log replay
reads) or a type, not which rows or columns a file holds. An allowlist: a feature added to
Delta later goes to delta-spark until it is known to be harmless here."""
DATASET_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})
"""Reader features delta-rs' pyarrow dataset (``to_pyarrow_table``) accepts."""
CHANGE_FEED_DELTA_RS_EXCLUDED = frozenset({"columnMapping"})
"""Reader features under which delta-rs' ``load_cdf`` refuses the table (1.6: "Column mapping
is not supported for read operation 'CHANGE DATA FEED scans'")."""
SPARK_FEATURES = frozenset(FILE_EXACT_FEATURES | {"deletionVectors", "columnMapping"})
"""Reader features delta-spark reads and this project tests (snapshots and Change Data Feed
of tables delta-spark wrote with them): the features a source may have."""


@dataclass(frozen=True)
class ReadPlan:
    """Which engine reads a Delta table, decided from the reader features of its protocol
    (``features``):

    * ``snapshot_executors``: :data:`PARQUET` (Spark's executors read the version's files, as
      the log lists them: exact under :data:`FILE_EXACT_FEATURES`) or :data:`DELTA_SPARK`
      (``spark.read.format("delta")``: deletion vectors, column mapping);
    * ``snapshot_driver``: :data:`DATASET` (delta-rs' pyarrow dataset) or
      :data:`QUERY_BUILDER` (delta-rs' DataFusion scan, which applies deletion vectors and
      column mapping);
    * ``change_feed``: :data:`DELTA_RS` (``load_cdf``, on the driver) or :data:`DELTA_SPARK`
      (``readChangeFeed``, collected to the driver) under column mapping.

    ``unreadable`` holds the features neither engine reads (outside :data:`SPARK_FEATURES`)."""
    features: frozenset

    @staticmethod
    def of(dt: DeltaTable) -> "ReadPlan":
        """The plan of an open delta-rs handle (its version's protocol)."""
        return ReadPlan(frozenset(_reader_features(dt)))

    @property
    def snapshot_executors(self) -> str:
        return PARQUET if self.features <= FILE_EXACT_FEATURES else DELTA_SPARK

    @property
    def snapshot_driver(self) -> str:
        return DATASET if self.features <= DATASET_FEATURES else QUERY_BUILDER

    @property
    def change_feed(self) -> str:
        return DELTA_SPARK if self.features & CHANGE_FEED_DELTA_RS_EXCLUDED else DELTA_RS

    @property
    def unreadable(self) -> frozenset:
        return self.features - SPARK_FEATURES

    def describe(self) -> str:
        """One line for the run log: the features and the engine of each read."""
        return (f"reader features {', '.join(sorted(self.features)) or 'none'}: snapshots read by "
                f"{self.snapshot_executors} on the executors and {self.snapshot_driver} on the driver, the Change "
                f"Data Feed by {self.change_feed}")


def _reader_features(dt: DeltaTable) -> set[str]:
    """:meth:`DeltaTableRef.reader_features` of an open handle."""
    protocol = dt.protocol()
    features = set(protocol.reader_features or ())
    mode = str(dt.metadata().configuration.get("delta.columnMapping.mode", "none")).lower()
    if protocol.min_reader_version == 2 and mode != "none":
        features.add("columnMapping")
    return features


CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
"""The columns the Change Data Feed adds to a table's own."""

_SCHEMA_REFUSALS = ("DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
                    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE")
"""delta-spark's error conditions for a batch Change Data Feed read it refuses to read with one
schema (``CDCReader.changesToDF``): a commit of the range, or its first version, has a schema
delta-spark cannot read as the end version's (a column renamed or dropped under column
mapping, a type or nullability change)."""


def physical_name(field: dict) -> str:
    """A column's identity across a table's versions: its physical name (field metadata
    ``delta.columnMapping.physicalName``, with its column mapping id, under column mapping;
    without column mapping, the name itself). ``field``: a column as Delta's schema JSON
    holds it."""
    return (field.get("metadata") or {}).get("delta.columnMapping.physicalName") or field["name"]


def _columns_of(fields) -> list[tuple]:
    """What a schema says of its columns: (physical name, name, type, nullability) each;
    descriptions and other field metadata left out."""
    return [(physical_name(f), f["name"], json.dumps(f["type"], sort_keys=True), bool(f.get("nullable", True)))
            for f in fields]


def _type_name(field: dict) -> str:
    from pyspark.sql.types import StructField
    return StructField.fromJson(field).dataType.simpleString()


@dataclass(frozen=True)
class SchemaChange:
    """A commit whose ``metaData`` action changed a table's columns: its ``version`` and the
    columns ``before`` and ``after`` it (Delta's schema JSON fields)."""
    version: int
    before: tuple
    after: tuple

    def describe(self) -> str:
        """What changed, column by column, matched by physical name: e.g. ``version 6 renamed
        column name to full_name, dropped column v (bigint)``."""
        old = {physical_name(f): f for f in self.before}
        new = {physical_name(f): f for f in self.after}
        said = []
        for key, f in old.items():
            g = new.get(key)
            if g is None:
                said.append(f"dropped column {f['name']} ({_type_name(f)})")
                continue
            if g["name"] != f["name"]:
                said.append(f"renamed column {f['name']} to {g['name']}")
            if g["type"] != f["type"]:
                said.append(f"changed the type of column {g['name']} from {_type_name(f)} to {_type_name(g)}")
            if bool(g.get("nullable", True)) != bool(f.get("nullable", True)):
                said.append(f"made column {g['name']} {'nullable' if g.get('nullable', True) else 'NOT NULL'}")
        said += [f"added column {g['name']} ({_type_name(g)})" for key, g in new.items() if key not in old]
        if not said and [physical_name(f) for f in self.before] != [physical_name(f) for f in self.after]:
            said.append("reordered the columns")
        return f"version {self.version} {', '.join(said) or 'replaced the schema'}"


def _describe_changes(changes: list[SchemaChange]) -> str:
    return "; ".join(c.describe() for c in changes)


def _check_same_columns(what: str, wanted: list[str], start: list[dict], end_by_name: dict[str, dict],
                        changes: list[SchemaChange]) -> None:
    """Raise SourceError when a column of ``wanted`` (named as at the range's end) was, under
    that name, another column at the range's start (another physical name: the column was
    dropped, or renamed away, and its name given to another one), or is gone at the end.
    Then every row older than the range reads differently now without a row in the Change
    Data Feed saying so, and a model that read the column cannot follow incrementally. Names
    the column, the commit that took the name away from it, and --full-refresh; ``what``
    says which read failed (the table and the versions)."""
    at_start = {f["name"]: physical_name(f) for f in start}
    for name in wanted:
        key = at_start.get(name)
        if key is None or (name in end_by_name and physical_name(end_by_name[name]) == key):
            continue
        where = next((c for c in changes if {physical_name(f) for f in c.after if f["name"] == name} != {key}),
                     changes[-1])
        raise SourceError(
            f"{what}: the model reads column "
            f"{name}, and {where.describe()}, so column {name} is no longer the column it was (its physical name "
            f"{key}): its rows from before that version changed without a row in the Change Data Feed "
            f"({_describe_changes(changes)}). Run with --full-refresh (the model is rebuilt from the table at the "
            f"cut)")


HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
"""delta-rs' hooks after each of our commits: its checkpoint every ``delta.checkpointInterval``
commits, but no expired-log cleanup (a listing of the whole log after each commit; maintenance
cleans the logs, :mod:`consistent_stream.sink.maintenance`)."""


class DeltaTableRef:
    """A Delta table at ``path``: one handle, refreshed; reads at explicit versions and
    idempotent commits.

    Raises :class:`SourceError` when the table is missing or a version is gone.
    """

    def __init__(self, path: str, *, owned: bool = False, own_log: bool = False, checksums: bool = False):
        self.path = str(path)
        self.owned = owned or own_log
        # a table only this package writes (the state table, the target): its log replayed and committed by
        # :mod:`.log`, delta-rs opened only for what that does not serve (history, maintenance)
        # (a table :mod:`consistent_stream.storage` reaches: a local path or an object store's)
        reached = "://" not in self.path or location.is_remote(self.path)
        # (``checksums``: each of its commits writes the version checksum Spark readers use)
        self._log: OwnedLog | None = OwnedLog(self.path, checksums=checksums) if own_log and reached else None
        self._log_loaded = False
        self._fresh = False     # owned: the handle is at the latest version (only our commits move it)
        self._ahead: int | None = None   # owned: our newest commit's version, past the handle's (not read yet)
        self.storage_options = location.delta_storage_options(self.path)
        self._txns: dict[str, tuple[int, int | None]] = {}   # app id -> (handle version, its txn version)
        self._commit_cache: dict[int, tuple[Commit, dict[str, int]]] = {}   # version -> (commit, its txns)
        self._dt: DeltaTable | None = None
        self._files: dict[int, pa.Table] = {}  # version -> add actions (flattened), newest two kept

    # ---- the handle -------------------------------------------------------------------------
    def _delta_rs(self, version: int | None = None) -> DeltaTable:
        """A delta-rs handle of the table (at ``version``, default the latest): one log replay
        by delta-rs, counted in :data:`location.REQUESTS` for a table on an object store."""
        if location.is_remote(self.path):
            location.REQUESTS.add(location.DELTA_RS_OPEN, self.path + "/_delta_log/")
        return DeltaTable(self.path, version=version, storage_options=self.storage_options)

    def _own(self) -> OwnedLog | None:
        """The replayed log of an ``own_log`` table, loaded on first use; None for another
        table, or when the log holds what :mod:`.log` does not replay (delta-rs serves it)."""
        if self._log is None:
            return None
        if not self._log_loaded:
            try:
                self._log.load()
            except UnsupportedLog as e:
                log.info("the Delta log of %s is read by delta-rs: it has %s", self.path, e)
                self._log = None
                return None
            except OSError as e:
                raise SourceError(f"cannot read the Delta log of {self.path}: {e}") from e
            self._log_loaded = True
        return self._log

    def replayed_log(self) -> OwnedLog | None:
        """The table's log as :mod:`.log` replays it (an ``own_log`` table, loaded on first
        use): its version, live files, tombstones and checkpoints, read with the run's own
        requests. None when delta-rs serves the table (not ``own_log``, a file system
        :mod:`consistent_stream.storage` does not reach, or a log :mod:`.log` does not replay)."""
        return self._own()

    def _created(self) -> int:
        """After this ref created the table: its version, from the replayed log of an
        ``own_log`` table (delta-rs is opened only when something needs it), else from a
        delta-rs handle."""
        if self._log is not None:
            self._log_loaded = False
            own = self._own()
            if own is not None:
                return own.version
        self._dt = self._delta_rs()
        self._fresh = True
        return self._dt.version()

    def exists(self) -> bool:
        own = self._own()
        if own is not None:
            return own.version >= 0
        if self._dt is not None:
            return True
        if not location.is_remote(self.path) and not os.path.isdir(os.path.join(self.path, "_delta_log")):
            return False
        try:
            self._dt = self._delta_rs()
            self._fresh = True
            return True
        except TableNotFoundError:
            return False

    def table(self) -> DeltaTable:
        """The open handle (opened on first use, at the latest version; an owned table's
        handle catches up with the run's own commits here, when something reads it)."""
        if self._ahead is not None and self._dt is not None:
            if self._dt.version() < self._ahead:
                self._dt.update_incremental()
            self._ahead = None
        own = self._own()
        if own is not None and self._dt is not None and self._dt.version() < own.version:
            self._dt.update_incremental()
        if self._dt is None:
            try:
                self._dt = self._delta_rs()
                self._fresh = True
            except TableNotFoundError as e:
                raise SourceError(f"no Delta table at {self.path}: {e}") from e
        return self._dt

    def refresh(self, *, force: bool = False) -> int:
        """Bring the handle to the latest version (reading only the newer commits); returns it.
        An ``owned`` table (the run holds the model's writer lock: only its own commits move it)
        is looked up once, and after each of its own commits (:meth:`_advanced`), not at every
        call: on an object store a refresh is a LIST and a GET."""
        own = self._own()
        if own is not None:
            if force or own.version < 0:
                own.refresh()
            if own.version < 0:
                raise SourceError(f"no Delta table at {self.path}")
            return own.version
        if self._dt is None:
            self._fresh = True
            return self.table().version()
        if self.owned and not force and (self._fresh or self._ahead is not None):
            return self.version()
        self._dt.update_incremental()
        self._ahead, self._fresh = None, True
        return self._dt.version()

    def latest_version(self) -> int:
        """The latest version (the handle refreshed first)."""
        return self.refresh()

    def version(self) -> int:
        """The handle's version, without looking for newer commits (an owned table: its
        newest, the run's own last commit included)."""
        own = self._own()
        if own is not None and own.version >= 0:
            return own.version
        return self._ahead if self._ahead is not None else self.table().version()

    def _at(self, version: int) -> DeltaTable:
        """A handle at ``version``: the ref's own when it is there, else a second handle."""
        dt = self.table()
        if dt.version() == version:
            return dt
        try:
            return self._delta_rs(version)
        except Exception as e:  # delta-rs raises plain exceptions for vacuumed versions
            raise SourceError(f"cannot open Delta table {self.path} at version {version}: {e}. If the "
                              f"version was vacuumed or its log cleaned up, run with --full-refresh") from e

    # ---- metadata -------------------------------------------------------------------------
    def txn_version(self, app_id: str) -> int | None:
        """Latest transaction version committed by ``app_id`` (at the handle's version), or None.

        delta-rs reads it by replaying the log since the newest checkpoint (one read per
        commit: on an object store, one GET each), so it is remembered per handle version, and
        a commit this ref makes with a txn records it (:meth:`_recorded`) without a replay."""
        if not self.exists():
            return None
        own = self._own()
        if own is not None:
            return own.txn_version(app_id)
        version = self.table().version()
        known = self._txns.get(app_id)
        if known is None or known[0] != version:
            newest = self._commit_info(version)[1].get(app_id) if self.owned else None
            # an owned table's newest commit is one of the run's query's when it records its txn;
            # otherwise delta-rs replays the log for it
            known = (version, newest if newest is not None else self.table().transaction_version(app_id))
            self._txns[app_id] = known
        return known[1]

    def _recorded(self, version: int, txn: Txn) -> bool:
        """Whether commit ``version`` (this ref's own, just made) records ``txn``: read from
        that one commit file (one read, however long the log; kept for :meth:`commit_at`).
        Remembers it for :meth:`txn_version`."""
        recorded = self._commit_info(version)[1].get(txn.app_id)
        if recorded is None or recorded != txn.version:
            return False
        if self.version() == version:
            self._txns[txn.app_id] = (version, txn.version)
        return True

    def log_actions(self, version: int) -> list[dict]:
        """The actions of commit ``version`` (``add``, ``remove``, ``metaData``, ``txn``,
        ``commitInfo``, ...), as Delta's JSON commit file ``_delta_log/<version>.json`` holds
        them: one read of that file, however long the log. Raises FileNotFoundError (or the
        object store's error) when the commit file is gone (its log cleaned up)."""
        uri = self.file_path(f"_delta_log/{version:020d}.json")
        return [json.loads(line) for line in storage.read_bytes(uri).splitlines() if line.strip()]

    def schema_fields(self, version: int | None = None) -> list[dict]:
        """The table's columns at ``version`` (default: the handle's) as Delta's schema JSON
        holds them (``name``, ``type``, ``nullable``, ``metadata`` with the column mapping id
        and physical name where the table has column mapping)."""
        dt = self.table() if version is None else self._at(version)
        return json.loads(dt.schema().to_json())["fields"]

    def schema_changes(self, start_exclusive: int, end_inclusive: int) -> list[SchemaChange]:
        """The commits in ``(start_exclusive, end_inclusive]`` whose ``metaData`` action changes
        the table's columns (:func:`_columns_of`: a column added, dropped, renamed, retyped, or
        its nullability changed; a new table property or comment is no change), oldest first,
        each with the columns before and after it. Reads the range's commit files (one read
        each, in parallel) and the schema at ``start_exclusive`` (a handle at that version):
        for a range known to hold a schema change, never on the common path. Raises
        SourceError when a version or a commit file is gone."""
        from concurrent.futures import ThreadPoolExecutor
        versions = list(range(start_exclusive + 1, end_inclusive + 1))
        try:
            with ThreadPoolExecutor(max_workers=min(16, max(1, len(versions))),
                                    thread_name_prefix="delta-log") as pool:
                commits = list(pool.map(self.log_actions, versions))
        except Exception as e:
            raise SourceError(f"cannot read the commits {start_exclusive + 1}..{end_inclusive} of the Delta table "
                              f"{self.path}: {e}. If its log was cleaned up, run with --full-refresh") from e
        changes: list[SchemaChange] = []
        before = None
        for version, actions in zip(versions, commits):
            for meta in (a["metaData"] for a in actions if "metaData" in a):
                if before is None:
                    before = self.schema_fields(start_exclusive)
                after = json.loads(meta["schemaString"])["fields"]
                if _columns_of(after) != _columns_of(before):
                    changes.append(SchemaChange(version, tuple(before), tuple(after)))
                before = after
        return changes

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        own = self._own()
        if own is not None and own.version >= 0 and version in (None, own.version):
            from deltalake import Schema
            return pa.schema(Schema.from_json(own.metadata["schemaString"]).to_arrow())
        dt = self.table() if version is None else self._at(version)
        return pa.schema(dt.schema().to_arrow())

    def plain_arrow_schema(self, version: int | None = None) -> pa.Schema:
        """:meth:`arrow_schema` with plain string/binary types (:func:`plain_schema`): the
        types the table's rows have once read."""
        return plain_schema(self.arrow_schema(version))

    def partition_columns(self) -> list[str]:
        own = self._own()
        if own is not None and own.version >= 0:
            return own.partition_columns
        return list(self.table().metadata().partition_columns)

    def reader_features(self, version: int | None = None) -> set[str]:
        """The reader features the table's protocol requires at ``version`` (default: the
        handle's) (Delta protocol, "Table Features"): the ``readerFeatures`` of reader version
        3, or for reader version 2 the ``columnMapping`` it implies when
        ``delta.columnMapping.mode`` is set."""
        return _reader_features(self.table() if version is None else self._at(version))

    def read_plan(self, version: int | None = None) -> ReadPlan:
        """Which engine reads the table (:class:`ReadPlan`), from the reader features of its
        protocol at ``version`` (default: the handle's version)."""
        return ReadPlan.of(self.table() if version is None else self._at(version))

    def change_data_feed_enabled(self) -> bool:
        conf = self.table().metadata().configuration
        return str(conf.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def add_actions(self, version: int) -> pa.Table:
        """The add actions of ``version`` (flattened: ``path``, ``size_bytes``,
        ``num_records``, ``min.<col>``, ``max.<col>``, ``null_count.<col>``,
        ``partition.<col>``). Cached per version; a ref's own commits update the cache."""
        if version not in self._files:
            self._remember(version, pa.table(self._at(version).get_add_actions(flatten=True)))
        return self._files[version]

    def data_files(self, version: int) -> list[DataFile] | None:
        """The data files of ``version`` with their Delta statistics JSON, from the replayed
        log of an ``own_log`` table at that version (no read); None otherwise (read
        :meth:`add_actions`). Paths as the log holds them."""
        own = self._own()
        if own is None or own.version != version:
            return None
        return [DataFile(a["path"], int(a.get("size") or 0), _num_records(a.get("stats")),
                         dict(a.get("partitionValues") or {}), a.get("stats") or "") for a in own.files.values()]

    def _remember(self, version: int, actions: pa.Table) -> None:
        self._files[version] = actions
        for v in sorted(self._files)[:-2]:
            del self._files[v]

    def num_records(self, version: int) -> int:
        """Number of rows of ``version`` (from the log's file statistics, no data scan)."""
        actions = self.add_actions(version)
        return int(sum(v or 0 for v in actions.column("num_records").to_pylist())) if actions.num_rows else 0

    def files(self, version: int) -> list[str]:
        """Paths, relative to the table root, of the data files of ``version``."""
        return self.add_actions(version).column("path").to_pylist()

    def history(self, limit: int | None = None) -> list[Commit]:
        """Commits, newest first, with the ``consistent_stream.*`` metadata decoded."""
        out = []
        for h in self.table().history(limit):
            meta = {k[len(META_PREFIX):]: v for k, v in h.items() if k.startswith(META_PREFIX)}
            out.append(Commit(int(h["version"]), int(h.get("timestamp", 0)), meta))
        return out

    def commit_rows(self, start_exclusive: int, end_inclusive: int) -> list[tuple[int, int, int | None]]:
        """``(version, commit ms, change rows)`` of the versions in ``(start, end]``, from the
        commits' operation metrics (delta-rs' and Delta Spark's names): rows inserted + deleted
        + 2 x updated; None for a commit without such metrics."""
        latest = self.latest_version()
        out = []
        for h in self.table().history(max(0, latest - start_exclusive)):
            v = int(h["version"])
            if start_exclusive < v <= end_inclusive:
                out.append((v, int(h.get("timestamp", 0)), changed_rows(h.get("operationMetrics") or {})))
        return sorted(out)

    def latest_commit(self) -> Commit:
        """The newest commit (after a refresh): one commit file read, however long the log."""
        return self.commit_at(self.refresh())

    def commit_at(self, version: int) -> Commit:
        """Commit ``version`` with its time and our metadata: its commit file read (once per
        ref), not the history since. Raises SourceError when it is not in the log (cleaned up,
        or past the newest version)."""
        return self._commit_info(version)[0]

    def _commit_info(self, version: int) -> tuple[Commit, dict[str, int]]:
        """Commit ``version`` and the txn versions it records (app id -> version), from its
        commit file (cached: a commit never changes)."""
        known = self._commit_cache.get(version)
        if known is not None:
            return known
        own = self._own()
        replayed = own.commits.get(version) if own is not None else None
        if replayed is not None:
            meta = {k[len(META_PREFIX):]: v for k, v in replayed.info.items() if k.startswith(META_PREFIX)}
            return Commit(version, replayed.timestamp_ms, meta), dict(replayed.txns)
        try:
            actions = self.log_actions(version)
        except FileNotFoundError:
            raise SourceError(f"commit {version} of {self.path} is not in its log (cleaned up, or past the newest "
                              f"version {self.version()})") from None
        except OSError as e:
            raise SourceError(f"cannot read commit {version} of {self.path}: {e}") from e
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        meta = {k[len(META_PREFIX):]: v for k, v in info.items() if k.startswith(META_PREFIX)}
        ts = int(info.get("inCommitTimestamp") or info.get("timestamp") or 0)
        txns = {a["txn"]["appId"]: int(a["txn"]["version"]) for a in actions if "txn" in a}
        known = (Commit(version, ts, meta), txns)
        if len(self._commit_cache) > 64:
            self._commit_cache.clear()
        self._commit_cache[version] = known
        return known

    # ---- reads into Spark -------------------------------------------------------------------
    def read_snapshot(self, spark: SparkSession, version: int, columns: list[str] | None = None) -> DataFrame:
        """The table at ``version`` as a Spark DataFrame (its columns, or ``columns``), read by
        the engine its protocol needs (:class:`ReadPlan`): Spark's executors read the
        version's Parquet files directly (nothing passes through the driver), or, for deletion
        vectors and column mapping, delta-spark reads the version (``versionAsOf``).
        Raises SourceError when the session has no delta-spark and the table needs it."""
        dt = self._at(version)
        schema = pa.schema(dt.schema().to_arrow())
        if ReadPlan.of(dt).snapshot_executors == DELTA_SPARK:
            df = self._spark_reader(spark, version).option("versionAsOf", version).load(as_uri(self.path))
        else:
            paths = self.files(version)
            spark_schema = from_arrow_schema(plain_schema(schema))
            if not paths:
                df = spark.createDataFrame([], spark_schema)
            else:
                reader = spark.read.schema(spark_schema)
                if dt.metadata().partition_columns:
                    reader = reader.option("basePath", as_uri(self.path))
                df = reader.parquet(*[self.file_uri(p) for p in paths])
        df = df.select(*[f"`{f.name}`" for f in schema])
        if columns is not None:
            df = df.select(*[f"`{c}`" for c in columns])
        return df

    def _spark_reader(self, spark: SparkSession, version: int):
        """``spark.read.format("delta")``. Raises SourceError when the session has no
        delta-spark (its SQL extension), naming the table and the features that need it."""
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        if "io.delta.sql.DeltaSparkSessionExtension" not in extensions:
            features = ", ".join(sorted(self.reader_features(version)))
            raise SourceError(
                f"the Delta table at {self.path} has the reader feature(s) {features}, which only delta-spark reads "
                f"on the executors, and this Spark session has no delta-spark: build it with "
                f"consistent_stream.session.delta_confs() (the dbt profile and the command line do)")
        return spark.read.format("delta")

    def read_snapshot_arrow(self, version: int, columns: list[str] | None = None) -> pa.Table:
        """The table at ``version`` read on the driver by delta-rs (its columns, or
        ``columns``), with plain string/binary types; for tables small enough to hold there.
        Tables with deletion vectors, column mapping or v2 checkpoints are read by delta-rs'
        DataFusion scan (``QueryBuilder``), which applies them."""
        dt = self._at(version)
        if ReadPlan.of(dt).snapshot_driver == DATASET:
            return plain_arrow(pa.table(dt.to_pyarrow_table(columns=columns)))
        from deltalake import QueryBuilder
        names = columns if columns is not None else [f.name for f in dt.schema().to_arrow()]
        reader = QueryBuilder().register("t", dt).execute(f"SELECT {', '.join(dq(c) for c in names)} FROM t")
        schema = plain_schema(pa.schema([pa.schema(dt.schema().to_arrow()).field(c) for c in names]))
        return plain_arrow(pa.table(reader.read_all())).cast(schema)

    def file_uri(self, rel: str) -> str:
        """URI of a data file given its path relative to the table root (as in the log)."""
        from urllib.parse import unquote
        return as_uri(os.path.join(self.path, "")) + unquote(rel)

    def file_path(self, rel: str) -> str:
        """Where a data file (its path relative to the table root, as in the log) is read
        from: a local path for a table on the local file system, else its URI."""
        from urllib.parse import unquote
        return os.path.join(self.path, unquote(rel)) if "://" not in self.path else self.file_uri(rel)

    def read_changes_arrow(self, start_exclusive: int, end_inclusive: int,
                           columns: list[str] | None = None, spark: SparkSession | None = None) -> pa.Table:
        """Change Data Feed rows of versions ``(start_exclusive, end_inclusive]`` as Arrow: the
        table's columns at ``end_inclusive`` (or ``columns``, named as there), with
        ``_change_type`` (insert, delete, update_preimage, update_postimage),
        ``_commit_version`` and ``_commit_timestamp``; plain string/binary types. Read by
        delta-rs (``load_cdf``), or, for a table with column mapping (:class:`ReadPlan`), by
        delta-spark's ``readChangeFeed`` in ``spark`` and collected to the driver (the rows
        of one change).

        A range delta-spark refuses to read with one schema (a column renamed or dropped
        inside it, under column mapping) is read across its schema changes
        (:meth:`_spark_changes_across`), each part with its own schema, its columns matched
        to those at ``end_inclusive`` by physical name.

        Raises SourceError naming the table and the table property to set when the Change
        Data Feed is off; naming the versions, and the commits that changed the schema and
        how when there are any, when the range cannot be read (versions vacuumed, log
        cleaned up, a schema change the feed cannot be read across); and what to do.
        """
        if not self.change_data_feed_enabled():
            raise SourceError(
                f"Delta table {self.path} does not have the Change Data Feed on: set table "
                f"property delta.enableChangeDataFeed = true, then run with --full-refresh")
        cols = None if columns is None else list(columns) + list(CDF_COLUMNS)
        first = start_exclusive + 1
        try:
            if self.read_plan().change_feed == DELTA_SPARK:
                if spark is None:
                    raise ValueError("a Change Data Feed read by delta-spark needs the Spark session")
                try:
                    df = self._spark_change_feed(spark, first, end_inclusive)
                    return plain_arrow(df.select(*[f"`{c}`" for c in (cols or df.columns)]).toArrow())
                except Exception as e:
                    if not any(c in str(e) for c in _SCHEMA_REFUSALS):
                        raise
                return self._spark_changes_across(spark, start_exclusive, end_inclusive, columns)
            reader = self.table().load_cdf(starting_version=first, ending_version=end_inclusive, columns=cols)
            return plain_arrow(pa.table(reader.read_all()))
        except SourceError:
            raise
        except Exception as e:
            raise self._unreadable_changes(start_exclusive, end_inclusive, e) from e

    def _spark_change_feed(self, spark: SparkSession, first: int, last: int) -> DataFrame:
        """delta-spark's Change Data Feed of versions ``first..last`` (a lazy DataFrame), read
        with the schema at ``last`` (delta-spark's default batch schema mode for column mapping
        tables, ``spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable
        = endVersion``)."""
        return (self._spark_reader(spark, last).option("readChangeFeed", "true")
                .option("startingVersion", first).option("endingVersion", last).load(as_uri(self.path)))

    def _spark_changes_across(self, spark: SparkSession, start_exclusive: int, end_inclusive: int,
                              columns: list[str] | None) -> pa.Table:
        """:meth:`read_changes_arrow` by delta-spark for a range holding schema changes
        (:meth:`schema_changes`): the range split at each of them, each part read with its
        own schema (no schema change inside a part, so delta-spark reads it), its columns
        matched to ``columns`` as named at ``end_inclusive`` by physical name (Delta never
        changes a column's physical name: a rename keeps it, a dropped column's goes away, an
        added column gets a new one). A column a part does not have (added later) is NULL in
        its rows, as Delta reads older rows. The parts are one Spark query (a union), read
        once.

        Raises SourceError naming the versions and the schema changes when a column in
        ``columns`` is not the same column at the start and at the end (dropped and added
        again, or a renamed column's old name taken by another: its older rows changed
        without a row in the Change Data Feed), or when a part still cannot be read."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructField
        what = f"cannot read the Change Data Feed of {self.path} for versions {start_exclusive + 1}..{end_inclusive}"
        changes = self.schema_changes(start_exclusive, end_inclusive)
        if not changes:
            raise SourceError(
                f"{what}: delta-spark refuses it for a schema change, but no commit in the range changes the schema "
                f"(spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable must be endVersion, "
                f"delta-spark's default). Run with --full-refresh")
        start = list(changes[0].before)
        end_by_name = {f["name"]: f for f in changes[-1].after}
        # as named at the end; a column added after the range (none of the parts has it) as the handle has it
        targets = {**{f["name"]: f for f in self.schema_fields()}, **end_by_name}
        wanted = list(columns) if columns is not None else list(end_by_name)
        _check_same_columns(what, wanted, start, end_by_name, changes)
        bounds = [start_exclusive + 1] + [c.version for c in changes] + [end_inclusive + 1]
        schemas = [start] + [list(c.after) for c in changes]
        parts = [(lo, hi - 1, fields) for lo, hi, fields in zip(bounds, bounds[1:], schemas)
                 if lo < hi]   # empty before a schema change in the range's first commit
        log.info("Change Data Feed of %s, versions %d..%d: read in parts %s across its schema changes (%s)",
                 self.path, start_exclusive + 1, end_inclusive, ", ".join(f"{lo}..{hi}" for lo, hi, _ in parts),
                 _describe_changes(changes))
        frames = []
        for lo, hi, fields in parts:
            by_key = {physical_name(f): f for f in fields}
            exprs = []
            for name in wanted:
                mine = by_key.get(physical_name(targets[name]))
                if mine is None:   # added after these versions: NULL in their rows, as Delta reads them
                    exprs.append(F.lit(None).cast(StructField.fromJson(targets[name]).dataType).alias(name))
                elif mine["type"] != targets[name]["type"]:
                    raise SourceError(f"{what}: column {name} has another type in versions {lo}..{hi} "
                                      f"({_describe_changes(changes)}). Run with --full-refresh")
                else:
                    exprs.append(F.col(f"`{mine['name']}`").alias(name))
            frames.append(self._spark_change_feed(spark, lo, hi).select(*exprs, *CDF_COLUMNS))
        df = frames[0]
        for frame in frames[1:]:
            df = df.union(frame)
        try:
            return plain_arrow(df.toArrow())
        except Exception as e:
            raise SourceError(
                f"{what} across its schema changes ({_describe_changes(changes)}), read in parts "
                f"{', '.join(f'{lo}..{hi}' for lo, hi, _ in parts)}: {e}. Run with --full-refresh (the model is "
                f"rebuilt from the table at the cut)") from e

    def _unreadable_changes(self, start_exclusive: int, end_inclusive: int, error: Exception) -> SourceError:
        """The SourceError for a Change Data Feed range that cannot be read (``error``): naming
        the commits in the range that changed the schema and how, when there are any (read
        from the range's commit files, only now that the read failed); else the versions
        vacuumed or the log cleaned up."""
        what = f"cannot read the Change Data Feed of {self.path} for versions {start_exclusive + 1}..{end_inclusive}"
        try:
            changes = self.schema_changes(start_exclusive, end_inclusive)
        except Exception:
            changes = []
        if changes:
            return SourceError(
                f"{what}: {error}. The schema changed inside these versions ({_describe_changes(changes)}) and the "
                f"feed cannot be read across the change. Run with --full-refresh (the model is rebuilt from the "
                f"table at the cut)")
        return SourceError(f"{what}: {error}. If those versions were vacuumed, run with --full-refresh")

    # ---- commits ----------------------------------------------------------------------------
    @staticmethod
    def _props(txn: Txn | None, metadata: dict[str, Any] | None) -> CommitProperties:
        meta = {META_PREFIX + k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True))
                for k, v in (metadata or {}).items()}
        return CommitProperties(custom_metadata=meta or None,
                                app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None)

    def _advanced(self, expected: int) -> int:
        """After one of our commits, which should be version ``expected``: the handle follows
        it. delta-rs moves it itself after a MERGE; an owned table's handle is moved when
        something next reads the table through it (its version is known meanwhile, and the
        commit is checked from its own file, :meth:`_recorded`); any other is refreshed. An
        ``own_log`` table's replay reads the commit delta-rs made (one LIST, one GET)."""
        own = self._own()
        if own is not None:
            own.refresh()
            return own.version
        if self._dt is not None and self._dt.version() >= expected:
            self._ahead, self._fresh = None, True
            return self._dt.version()
        if self.owned and self._dt is not None:
            self._ahead = expected
            return expected
        return self.refresh(force=True)

    def write(self, data: pa.Table, *, mode: str, txn: Txn | None = None,
              metadata: dict[str, Any] | None = None, partition_by: list[str] | None = None,
              configuration: dict[str, str] | None = None) -> int:
        """Append or overwrite (``mode``) ``data`` as ONE commit; returns the new version."""
        data = plain_arrow(data)
        exists = self.exists()
        before = self.version() if exists else -1
        write_deltalake(self.path, data, mode=mode, partition_by=partition_by or None,
                        storage_options=self.storage_options,
                        schema_mode="overwrite" if (mode == "overwrite" and exists) else None,
                        configuration=None if exists else configuration,
                        commit_properties=self._props(txn, metadata), post_commithook_properties=HOOKS)
        if not exists:
            return self._created()
        return self._advanced(before + 1)

    def commit_files(self, adds: list[DataFile], removes: list[DataFile], *, schema: pa.Schema,
                     txn: Txn | None, metadata: dict[str, Any] | None,
                     partition_by: list[str] | None = None,
                     configuration: dict[str, str] | None = None, docs: Docs | None = None) -> int:
        """ONE commit that adds ``adds`` (files already written under the table root) and
        removes ``removes``, recording ``txn`` and ``metadata``; creates the table (with
        ``schema``, ``partition_by``, table properties ``configuration`` and descriptions
        ``docs``) when missing, and replaces its schema, partitioning and descriptions (every
        file removed: a rebuild) when they differ. Give ``docs`` only with a commit whose
        ``removes`` are every current file. Returns the new version."""
        schema = plain_schema(schema)
        fault_point("files_written")
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions
        if not self.exists():
            create_table_with_add_actions(self.path, Schema.from_arrow(_commented(schema, docs)),
                                          [a.add_action() for a in adds], partition_by=partition_by or None,
                                          storage_options=self.storage_options,
                                          description=docs.description if docs else None,
                                          configuration=configuration, commit_properties=self._props(txn, metadata),
                                          post_commithook_properties=HOOKS)
            return self._created()
        own = self._own()
        if own is not None and own.plain and self._same_table(own, schema, partition_by, docs):
            return self._commit_own(adds, removes, txn, metadata)
        dt = self.table()
        current = pa.schema(dt.schema().to_arrow())
        same = [(f.name, f.type) for f in plain_schema(current)] == \
               [(f.name, f.type) for f in schema] and \
               list(dt.metadata().partition_columns) == list(partition_by or [])
        before = dt.version()
        kept = Docs.of(dt)
        wanted = kept.updated(docs, schema)
        if not same or wanted != kept:
            # a new schema, partitioning or descriptions (a rebuild that changed the output,
            # partition_by or the model's docs): CREATE OR REPLACE in one commit, every file
            # removed. (An "overwrite" write transaction keeps the old partition columns in
            # the metadata while the new files carry partition values: they would read as
            # NULL; and it cannot change the description.)
            create_table_with_add_actions(self.path, Schema.from_arrow(_commented(schema, wanted)),
                                          [a.add_action() for a in adds], mode="overwrite",
                                          storage_options=self.storage_options,
                                          partition_by=partition_by or None, description=wanted.description,
                                          configuration={**dt.metadata().configuration, **(configuration or {})},
                                          commit_properties=self._props(txn, metadata),
                                          post_commithook_properties=HOOKS)
        else:
            dt.create_write_transaction([a.add_action() for a in adds] + [r.remove_action() for r in removes],
                                        "append", current, partition_by=partition_by or None,
                                        commit_properties=self._props(txn, metadata),
                                        post_commithook_properties=HOOKS)
        version = self._advanced(before + 1)
        if version != before + 1 or (txn is not None and not self._recorded(version, txn)):
            raise CommitError(f"commit to {self.path} did not record txn {txn} as version {before + 1}")
        return version

    @staticmethod
    def _same_table(own: OwnedLog, schema: pa.Schema, partition_by: list[str] | None, docs: Docs | None) -> bool:
        """Whether a commit of files of ``schema`` (plain types), ``partition_by`` and ``docs``
        leaves the replayed table's metadata as it is (else delta-rs replaces it)."""
        from deltalake import Schema
        if not own.metadata or own.partition_columns != list(partition_by or []):
            return False
        fields = json.loads(own.metadata.get("schemaString") or "{}").get("fields", [])
        wanted = json.loads(Schema.from_arrow(schema).to_json())["fields"]
        if [(f["name"], f["type"]) for f in fields] != [(f["name"], f["type"]) for f in wanted]:
            return False
        kept = Docs(own.metadata.get("description"),
                    tuple(sorted((f["name"].lower(), f["metadata"]["comment"]) for f in fields
                                 if (f.get("metadata") or {}).get("comment") is not None)))
        return kept.updated(docs, schema) == kept

    def _commit_own(self, adds: list[DataFile], removes: list[DataFile], txn: Txn | None,
                    metadata: dict[str, Any] | None, *, operation: str = "WRITE", metrics: dict | None = None,
                    cdc: list[DataFile] = ()) -> int:
        """ONE commit through the replayed log (:meth:`.log.OwnedLog.commit`): ``adds``,
        ``removes``, the Change Data Feed files ``cdc``, recording ``txn``, ``metadata`` and
        the operation's ``metrics`` (delta-rs' names). Raises CommitError when another writer
        took the version."""
        meta = self._props(txn, metadata).custom_metadata or {}
        if metrics is None:
            metrics = {"num_added_files": len(adds), "num_removed_files": len(removes),
                       "num_added_rows": sum(a.num_records for a in adds)}
        info = {"operation": operation, "engineInfo": "consistent_stream", "operationMetrics": metrics, **meta}
        cdc_actions = [{"path": log_path(f.path), "partitionValues": dict(f.partition_values), "size": int(f.size),
                        "dataChange": False} for f in cdc]
        now = int(time.time() * 1000)
        try:
            return self._own().commit([_add_dict(a, now) for a in adds], [_remove_dict(r, now) for r in removes],
                                      txn=(txn.app_id, txn.version) if txn else None, info=info, cdc=cdc_actions)
        except ConflictingCommit as e:
            raise CommitError(f"commit to {self.path} refused: {e}") from e
        except OSError as e:
            raise CommitError(f"commit to {self.path} failed: {e}") from e

    def rewritable(self) -> str | None:
        """Why a copy-on-write rewrite through the replayed log (:meth:`commit_rewrite`) may
        not replace a delta-rs MERGE on this table (None: it may): not an ``own_log`` table,
        partitioned, a protocol this package does not write (:attr:`.log.OwnedLog.plain`), CHECK constraints,
        column invariants, generated or identity columns (delta-rs' MERGE enforces them), or
        append-only."""
        own = self._own()
        if own is None or own.version < 0:
            return "its log is not replayed here"
        conf = own.configuration
        if own.partition_columns:
            return "it is partitioned"
        if not own.plain:
            return f"its protocol ({own.protocol})"
        if any(k.startswith("delta.constraints.") for k in conf) or conf.get("delta.appendOnly") == "true":
            return "it has CHECK constraints or is append-only"
        fields = json.loads(own.metadata.get("schemaString") or "{}").get("fields", [])
        if any(k.startswith(("delta.invariants", "delta.generationExpression", "delta.identity"))
               for f in fields for k in (f.get("metadata") or {})):
            return "it has column invariants, generated or identity columns"
        return None

    def change_feed_on(self) -> bool:
        """Whether the table records its Change Data Feed (``delta.enableChangeDataFeed``)."""
        own = self._own()
        conf = own.configuration if own is not None else self.table().metadata().configuration
        return str(conf.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def commit_rewrite(self, adds: list[DataFile], removes: list[DataFile], cdc: list[DataFile], *, txn: Txn,
                       metadata: dict[str, Any], metrics: dict[str, int]) -> int:
        """ONE commit of a copy-on-write MERGE done by the caller (a :meth:`rewritable`
        table): ``removes`` the files it rewrote, ``adds`` their new files, ``cdc`` its Change
        Data Feed files (under ``_change_data/``), recording ``txn``, ``metadata`` and
        ``metrics`` (delta-rs' MERGE metric names). Returns the new version. Raises
        CommitError when another writer took the version."""
        return self._commit_own(adds, removes, txn, metadata, operation="MERGE", metrics=metrics, cdc=cdc)

    def commit_empty(self, *, txn: Txn, metadata: dict[str, Any]) -> int:
        """A commit with no data change that records ``txn`` and ``metadata``."""
        own = self._own()
        if own is not None and own.version >= 0 and own.plain:
            return self._commit_own([], [], txn, metadata)
        dt = self.table()
        before = dt.version()
        dt.create_write_transaction([], "append", dt.schema(), commit_properties=self._props(txn, metadata),
                                    post_commithook_properties=HOOKS)
        return self._advanced(before + 1)

    def merge_by_key(self, changes: pa.Table, key: list[str], *, txn: Txn,
                     metadata: dict[str, Any]) -> tuple[int, dict]:
        """Apply upserts and deletes by ``key`` in ONE commit; returns the new version and
        delta-rs' merge metrics (``num_target_rows_copied``: rows rewritten unchanged, ...).

        ``changes``: the target's columns plus ``__op`` ('upsert' | 'delete'), at most one
        row per key. Keys compare with IS NOT DISTINCT FROM (a NULL key is a value).
        """
        return self._merge(
            changes, lambda cols: _same(key),
            lambda m, cols: (m.when_matched_update({dq(c): f"s.{dq(c)}" for c in cols}, predicate="s.__op = 'upsert'")
                             .when_matched_delete(predicate="s.__op = 'delete'")
                             .when_not_matched_insert({dq(c): f"s.{dq(c)}" for c in cols},
                                                      predicate="s.__op = 'upsert'")),
            txn=txn, metadata=metadata)

    def merge_bag(self, changes: pa.Table, *, txn: Txn, metadata: dict[str, Any]) -> tuple[int, dict]:
        """Apply a bag's changes in ONE commit: rows with ``__op`` 'delete' remove every copy
        of that row (all columns equal, NULLs as values); rows with ``__op`` 'insert' are
        appended, one copy each. Returns the new version and the merge metrics.

        ``changes``: the target's columns plus ``__op``; the delete rows are distinct.
        """
        return self._merge(
            changes, lambda cols: "s.__op = 'delete' AND " + _same(cols),
            lambda m, cols: (m.when_matched_delete()
                             .when_not_matched_insert({dq(c): f"s.{dq(c)}" for c in cols},
                                                      predicate="s.__op = 'insert'")),
            txn=txn, metadata=metadata)

    def _merge(self, changes: pa.Table, predicate, clauses, *, txn: Txn,
               metadata: dict[str, Any]) -> tuple[int, dict]:
        """One MERGE of ``changes`` (target columns + ``__op``) as ONE commit recording
        ``txn``: ``predicate(cols)`` is its ON condition (target ``t``, source ``s``) and
        ``clauses(merger, cols)`` adds its WHEN clauses. Raises CommitError when the commit
        did not record ``txn``."""
        if changes.num_rows == 0:
            return self.commit_empty(txn=txn, metadata=metadata), {}
        changes = plain_arrow(changes)
        cols = [c for c in changes.column_names if c != "__op"]
        dt = self.table()
        before = dt.version()
        merger = dt.merge(changes, predicate(cols), source_alias="s", target_alias="t",
                          commit_properties=self._props(txn, metadata), post_commithook_properties=HOOKS)
        metrics = clauses(merger, cols).execute()
        v = self._advanced(before + 1)
        if not self._recorded(v, txn):
            raise CommitError(f"merge into {self.path} did not record txn {txn}")
        return v, dict(metrics or {})


def _num_records(stats: str | None) -> int:
    """``numRecords`` of a Delta statistics JSON (0 when absent)."""
    try:
        return int(json.loads(stats).get("numRecords") or 0) if stats else 0
    except (ValueError, AttributeError):
        return 0


def _add_dict(f: DataFile, now_ms: int) -> dict:
    """The log's ``add`` action of data file ``f`` (path in log form)."""
    return {"path": log_path(f.path), "partitionValues": dict(f.partition_values), "size": int(f.size),
            "modificationTime": now_ms, "dataChange": True,
            "stats": f.stats or json.dumps({"numRecords": f.num_records})}


def _remove_dict(f: DataFile, now_ms: int) -> dict:
    """The log's ``remove`` action of data file ``f`` (path in log form)."""
    return {"path": log_path(f.path), "deletionTimestamp": now_ms, "dataChange": True,
            "extendedFileMetadata": True, "partitionValues": dict(f.partition_values), "size": int(f.size)}


INSERTED_METRICS = ("num_added_rows", "num_target_rows_inserted", "numOutputRows", "numTargetRowsInserted")
DELETED_METRICS = ("num_deleted_rows", "num_target_rows_deleted", "numDeletedRows", "numTargetRowsDeleted")
UPDATED_METRICS = ("num_updated_rows", "num_target_rows_updated", "numUpdatedRows", "numTargetRowsUpdated")
"""A commit's operation metrics, by delta-rs' and Delta Spark's names: rows inserted, deleted
and updated."""


def changed_rows(metrics: dict) -> int | None:
    """Change Data Feed rows a commit produced, from its operation metrics (None: unknown)."""
    known = False
    rows = 0
    for names, factor in ((INSERTED_METRICS, 1), (DELETED_METRICS, 1), (UPDATED_METRICS, 2)):
        for n in names:
            if n in metrics:
                known = True
                try:
                    rows += factor * int(metrics[n])
                except (TypeError, ValueError):
                    return None
                break
    return rows if known else None


def _same(cols: list[str]) -> str:
    """Target row ``t`` and source row ``s`` agree on ``cols`` (NULLs equal)."""
    return " AND ".join(f"(t.{dq(c)} IS NOT DISTINCT FROM s.{dq(c)})" for c in cols)


def dq(name: str) -> str:
    """An identifier double-quoted as ANSI SQL does (delta-rs' DataFusion, DuckDB)."""
    return '"' + name.replace('"', '""') + '"'


def as_uri(path: str) -> str:
    """A local path as a ``file://`` URI (URIs unchanged)."""
    if "://" in path:
        return path
    tail = "/" if path.endswith(os.sep) else ""
    return "file://" + os.path.abspath(path) + tail
