"""The read side of a Delta table: its snapshots, its commits, and its rows read by the engine
its protocol needs.

Owns :class:`TableReader`: the table at a path (local path or URI) opened once (one log
replay, from the last Delta checkpoint) and then *refreshed*, never reopened. Its state is one
:class:`~.snapshot.Snapshot` value, the table's current version (:meth:`TableReader.snapshot`,
replaced by :meth:`~TableReader.refresh` and by the table's own commits,
:meth:`~TableReader.after_commit`), with what it was read from: a delta-rs handle, or, for a
table only a model's run writes (``own_log``), the log replayed by :mod:`.log` (delta-rs is
then opened only for what that does not serve: history, time travel, maintenance, Spark and
Arrow reads). Reads at another version take a snapshot (and a handle) of that version.

Shapes: versions are Delta table versions (int >= 0); snapshots are read into Spark
(:meth:`~TableReader.read_snapshot`: the version's Parquet files read by Spark's executors,
or delta-spark) or Arrow (:meth:`~TableReader.read_snapshot_arrow`); the Change Data Feed as
Arrow (:mod:`.changes`). Which engine reads what is the snapshot's
:class:`~.snapshot.ReadPlan`.

Raises :class:`~consistent_stream.errors.SourceError` when the table is missing, a version is
gone (vacuumed, its log cleaned up) or a read needs delta-spark the session does not have.
"""
from __future__ import annotations

import json
import logging
import os
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from .. import location, storage
from ..threads import at_once
from ..errors import SourceError
from . import changes
from .changes import SchemaChange
from .log import OwnedLog, UnsupportedLog
from .snapshot import DATASET, DELTA_SPARK, ReadPlan, Snapshot
from .values import (Commit, DataFile, Txn, _num_records, as_uri, changed_rows, data_file_path, dq, our_metadata,
                     plain_arrow, plain_schema)

log = logging.getLogger("consistent_stream")


class TableReader:
    """The read side of the Delta table at ``path`` (module docstring). ``owned``: only this
    run commits to the table (its version moves only by the commits made through this
    reader's :class:`~.committer.TableCommitter`), so it is looked up once and not at every
    :meth:`refresh`; ``own_log``: its log is replayed by :mod:`.log` (owned);
    ``checksums``: the replay writes each commit's version checksum."""

    def __init__(self, path: str, *, owned: bool = False, own_log: bool = False, checksums: bool = False):
        self.path = str(path)
        self.owned = owned or own_log
        # (a table :mod:`consistent_stream.storage` reaches: a local path or an object store's)
        reached = "://" not in self.path or location.is_remote(self.path)
        self._log: OwnedLog | None = OwnedLog(self.path, checksums=checksums) if own_log and reached else None
        self._log_loaded = False
        self.storage_options = location.delta_storage_options(self.path)
        self._dt: DeltaTable | None = None       # the delta-rs handle; may lag _snap after the table's own commits
        self._snap: Snapshot | None = None       # the current snapshot (None: not read yet)
        self._txns: dict[str, tuple[int, int | None]] = {}   # app id -> (version, its txn version)
        self._commits: dict[int, tuple[Commit, dict[str, int]]] = {}   # version -> (commit, its txns)
        self._files: dict[int, pa.Table] = {}  # version -> add actions (flattened), newest two kept

    # ---- the snapshot and the handle ---------------------------------------------------------
    def _delta_rs(self, version: int | None = None) -> DeltaTable:
        """A delta-rs handle of the table (at ``version``, default the latest): one log replay
        by delta-rs, counted in :data:`location.REQUESTS` for a table on an object store."""
        if location.is_remote(self.path):
            location.REQUESTS.add(location.DELTA_RS_OPEN, self.path + "/_delta_log/")
        return DeltaTable(self.path, version=version, storage_options=self.storage_options)

    def own(self) -> OwnedLog | None:
        """The replayed log of an ``own_log`` table, loaded on first use: its version, live
        files, tombstones and checkpoints, read with the run's own requests. None for another
        table, a file system :mod:`consistent_stream.storage` does not reach, or a log
        :mod:`.log` does not replay (delta-rs serves it). Raises SourceError when the log
        cannot be read."""
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

    def kept_commit(self) -> Commit | None:
        """The newest commit this machine's copy of the replayed log holds (:meth:`.log.
        OwnedLog.kept_head`): no request, not checked against the table (after :meth:`own`,
        :meth:`.log.OwnedLog.from_copy` and the version say whether it is still the newest).
        None for a table without a replayed log or a copy."""
        head = self._log.kept_head() if self._log is not None else None
        return None if head is None else Commit(head.version, head.timestamp_ms, our_metadata(head.info))

    def _replayed(self) -> OwnedLog | None:
        """:meth:`own` when it holds the table (version >= 0)."""
        own = self.own()
        return own if own is not None and own.version >= 0 else None

    def _handle_moved(self) -> None:
        """The delta-rs handle was opened or moved: a table delta-rs serves has its snapshot."""
        if self._replayed() is None:
            self._snap = Snapshot.of_table(self._dt)

    def exists(self) -> bool:
        own = self.own()
        if own is not None:
            return own.version >= 0
        if self._dt is not None:
            return True
        if not location.is_remote(self.path) and not os.path.isdir(os.path.join(self.path, "_delta_log")):
            return False
        try:
            self._dt = self._delta_rs()
        except TableNotFoundError:
            return False
        self._handle_moved()
        return True

    def table(self) -> DeltaTable:
        """The delta-rs handle at the current snapshot's version (opened on first use, at the
        latest version; after the table's own commits it catches up here, when something
        reads the table through it)."""
        own = self._replayed()
        at = own.version if own is not None else (self._snap.version if self._snap is not None else None)
        if self._dt is None:
            try:
                self._dt = self._delta_rs()
            except TableNotFoundError as e:
                raise SourceError(f"no Delta table at {self.path}: {e}") from e
            self._handle_moved()
        elif at is not None and self._dt.version() < at:
            self._dt.update_incremental()
            self._handle_moved()
        return self._dt

    def snapshot(self) -> Snapshot:
        """The current snapshot, without looking for newer commits (the table opened on first
        use). Raises SourceError when there is no table."""
        own = self._replayed()
        if own is not None:
            if self._snap is None or self._snap.version != own.version:
                self._snap = Snapshot.of_log(own)
            return self._snap
        if self._snap is None:
            self.table()
        return self._snap

    def refresh(self, *, force: bool = False) -> Snapshot:
        """The latest snapshot (reading only the commits since the current one). An ``owned``
        table (only this run's commits move it) is looked up once, and after each of its own
        commits (:meth:`after_commit`), not at every call (on an object store a refresh is a
        LIST and a GET), unless ``force``. Raises SourceError when there is no table."""
        own = self.own()
        if own is not None:
            if force or own.version < 0:
                own.refresh()
            if own.version < 0:
                raise SourceError(f"no Delta table at {self.path}")
            return self.snapshot()
        if self._dt is None or (self.owned and not force and self._snap is not None):
            return self.snapshot()
        self._dt.update_incremental()
        self._handle_moved()
        return self._snap

    def version(self) -> int:
        """The current snapshot's version (an owned table: the run's own last commit)."""
        return self.snapshot().version

    def created(self) -> int:
        """After the table was created through this reader's committer: its version, from
        the replayed log of an ``own_log`` table (delta-rs is opened only when something
        needs it), else from a delta-rs handle."""
        if self._log is not None:
            self._log_loaded = False
            own = self.own()
            if own is not None:
                return own.version
        self._dt = self._delta_rs()
        self._handle_moved()
        return self._dt.version()

    def after_commit(self, expected: int, *, same_metadata: bool = True) -> int:
        """After one of the table's own commits, which should be version ``expected``: the
        snapshot follows it; returns its version. A replayed log reads the commit (one LIST,
        one GET: delta-rs made it) unless it made it itself; delta-rs moves its handle itself
        after a MERGE; an owned table whose commit changed neither protocol nor metadata
        (``same_metadata``) takes the snapshot on to ``expected`` without a read (its handle
        catches up when something reads through it, :meth:`table`; the commit is checked from
        its own file); any other is refreshed."""
        own = self.own()
        if own is not None:
            own.refresh()
            return own.version
        if self._dt is not None and self._dt.version() >= expected:
            self._handle_moved()
            return self._dt.version()
        if self.owned and same_metadata and self._dt is not None and self._snap is not None:
            self._snap = self._snap.at(expected)
            return expected
        return self.refresh(force=True).version

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

    def snapshot_at(self, version: int | None = None) -> Snapshot:
        """The snapshot at ``version`` (default: the current one); another version's is read
        from a handle at it (:meth:`_at`)."""
        if version is None:
            return self.snapshot()
        own = self._replayed()
        if own is not None and own.version == version:
            return self.snapshot()
        if own is None and self._snap is not None and self._snap.version == version:
            return self._snap
        return Snapshot.of_table(self._at(version))

    # ---- what a snapshot says ----------------------------------------------------------------
    def schema_fields(self, version: int | None = None) -> list[dict]:
        """The table's columns at ``version`` (default: the current one) as Delta's schema
        JSON holds them (:attr:`.snapshot.Snapshot.fields`)."""
        return self.snapshot_at(version).fields

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        return self.snapshot_at(version).arrow_schema

    def plain_arrow_schema(self, version: int | None = None) -> pa.Schema:
        """:meth:`arrow_schema` with plain string/binary types (:func:`.values.plain_schema`):
        the types the table's rows have once read."""
        return plain_schema(self.arrow_schema(version))

    def partition_columns(self) -> list[str]:
        return list(self.snapshot().partition_columns)

    def reader_features(self, version: int | None = None) -> set[str]:
        """The reader features the table's protocol requires at ``version`` (default: the
        current one): :attr:`.snapshot.Snapshot.reader_features`."""
        return set(self.snapshot_at(version).reader_features)

    def read_plan(self, version: int | None = None) -> ReadPlan:
        """Which engine reads the table (:class:`ReadPlan`), from the reader features of its
        protocol at ``version`` (default: the current one)."""
        return self.snapshot_at(version).read_plan

    def change_data_feed_enabled(self) -> bool:
        """Whether the table records its Change Data Feed (``delta.enableChangeDataFeed``)."""
        return self.snapshot().change_data_feed

    # ---- files ---------------------------------------------------------------------------------
    def add_actions(self, version: int) -> pa.Table:
        """The add actions of ``version`` (flattened: ``path``, ``size_bytes``,
        ``num_records``, ``min.<col>``, ``max.<col>``, ``null_count.<col>``,
        ``partition.<col>``). Cached per version (the newest two)."""
        if version not in self._files:
            self._files[version] = pa.table(self._at(version).get_add_actions(flatten=True))
            for v in sorted(self._files)[:-2]:
                del self._files[v]
        return self._files[version]

    def data_files(self, version: int) -> list[DataFile] | None:
        """The data files of ``version`` with their Delta statistics JSON and deletion vectors,
        from the replayed log of an ``own_log`` table at that version (no read); None otherwise
        (read :meth:`add_actions`). Paths as the log holds them."""
        own = self.own()
        if own is None or own.version != version:
            return None
        return [DataFile(a["path"], int(a.get("size") or 0), _num_records(a.get("stats")),
                         dict(a.get("partitionValues") or {}), a.get("stats") or "", a.get("deletionVector"))
                for a in own.files.values()]

    def num_records(self, version: int) -> int:
        """Number of rows of ``version`` (from the log's file statistics, no data scan)."""
        actions = self.add_actions(version)
        return int(sum(v or 0 for v in actions.column("num_records").to_pylist())) if actions.num_rows else 0

    def files(self, version: int) -> list[str]:
        """Paths, relative to the table root, of the data files of ``version``."""
        return self.add_actions(version).column("path").to_pylist()

    def file_uri(self, rel: str) -> str:
        """URI of a data file given its path relative to the table root (as in the log)."""
        from urllib.parse import unquote
        return as_uri(os.path.join(self.path, "")) + unquote(rel)

    def file_path(self, rel: str) -> str:
        """Where a data file (its path relative to the table root, as in the log) is read
        from: a local path for a table on the local file system, else its URI."""
        return data_file_path(self.path, rel)

    # ---- commits ---------------------------------------------------------------------------
    def txn_version(self, app_id: str) -> int | None:
        """Latest transaction version committed by ``app_id`` (at the current version), or None.

        delta-rs reads it by replaying the log since the newest checkpoint (one read per
        commit: on an object store, one GET each), so it is remembered per version, and a
        commit made with a txn records it (:meth:`remember_txn`) without a replay."""
        if not self.exists():
            return None
        own = self.own()
        if own is not None:
            return own.txn_version(app_id)
        version = self.table().version()
        known = self._txns.get(app_id)
        if known is None or known[0] != version:
            newest = self.commit_txns(version)[1].get(app_id) if self.owned else None
            # an owned table's newest commit is one of the run's query's when it records its txn;
            # otherwise delta-rs replays the log for it
            known = (version, newest if newest is not None else self.table().transaction_version(app_id))
            self._txns[app_id] = known
        return known[1]

    def remember_txn(self, version: int, txn: Txn) -> None:
        """Commit ``version``, the current one, recorded ``txn`` (for :meth:`txn_version`)."""
        if self.version() == version:
            self._txns[txn.app_id] = (version, txn.version)

    def log_actions(self, version: int) -> list[dict]:
        """The actions of commit ``version`` (``add``, ``remove``, ``metaData``, ``txn``,
        ``commitInfo``, ...), as Delta's JSON commit file ``_delta_log/<version>.json`` holds
        them: one read of that file, however long the log. Raises FileNotFoundError (or the
        object store's error) when the commit file is gone (its log cleaned up)."""
        uri = self.file_path(f"_delta_log/{version:020d}.json")
        return [json.loads(line) for line in storage.read_bytes(uri).splitlines() if line.strip()]

    def schema_changes(self, start_exclusive: int, end_inclusive: int) -> list[SchemaChange]:
        """:func:`.changes.schema_changes` of this table."""
        return changes.schema_changes(self, start_exclusive, end_inclusive)

    def history(self, limit: int | None = None) -> list[Commit]:
        """Commits, newest first, with the ``consistent_stream.*`` metadata decoded."""
        return [Commit(int(h["version"]), int(h.get("timestamp", 0)), our_metadata(h))
                for h in self.table().history(limit)]

    def commit_rows(self, start_exclusive: int, end_inclusive: int) -> list[tuple[int, int, int | None]]:
        """``(version, commit ms, change rows)`` of the versions in ``(start, end]``, from the
        commits' operation metrics (delta-rs' and Delta Spark's names): rows inserted + deleted
        + 2 x updated; None for a commit without such metrics."""
        latest = self.refresh().version
        out = []
        for h in self.table().history(max(0, latest - start_exclusive)):
            v = int(h["version"])
            if start_exclusive < v <= end_inclusive:
                out.append((v, int(h.get("timestamp", 0)), changed_rows(h.get("operationMetrics") or {})))
        return sorted(out)

    def commit_at(self, version: int) -> Commit:
        """Commit ``version`` with its time and our metadata: its commit file read (once per
        reader), not the history since. Raises SourceError when it is not in the log (cleaned
        up, or past the newest version)."""
        return self.commit_txns(version)[0]

    def commit_txns(self, version: int) -> tuple[Commit, dict[str, int]]:
        """Commit ``version`` and the txn versions it records (app id -> version), from the
        replayed log or its commit file (cached: a commit never changes)."""
        known = self._commits.get(version)
        if known is not None:
            return known
        own = self.own()
        replayed = own.commits.get(version) if own is not None else None
        if replayed is not None:
            return Commit(version, replayed.timestamp_ms, our_metadata(replayed.info)), dict(replayed.txns)
        try:
            actions = self.log_actions(version)
        except FileNotFoundError:
            raise SourceError(f"commit {version} of {self.path} is not in its log (cleaned up, or past the newest "
                              f"version {self.version()})") from None
        except OSError as e:
            raise SourceError(f"cannot read commit {version} of {self.path}: {e}") from e
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        ts = int(info.get("inCommitTimestamp") or info.get("timestamp") or 0)
        txns = {a["txn"]["appId"]: int(a["txn"]["version"]) for a in actions if "txn" in a}
        known = (Commit(version, ts, our_metadata(info)), txns)
        if len(self._commits) > 64:
            self._commits.clear()
        self._commits[version] = known
        return known

    # ---- rows ------------------------------------------------------------------------------
    def read_snapshot(self, spark: SparkSession, version: int, columns: list[str] | None = None) -> DataFrame:
        """The table at ``version`` as a Spark DataFrame (its columns, or ``columns``), read by
        the engine its protocol needs (:class:`ReadPlan`): Spark's executors read the
        version's Parquet files directly (nothing passes through the driver), or, for deletion
        vectors and column mapping, delta-spark reads the version (``versionAsOf``).
        Raises SourceError when the session has no delta-spark and the table needs it."""
        dt = self._at(version)
        snap = Snapshot.of_table(dt)
        schema = pa.schema(dt.schema().to_arrow())
        if snap.read_plan.snapshot_executors == DELTA_SPARK:
            df = self.spark_reader(spark, version).option("versionAsOf", version).load(as_uri(self.path))
        else:
            paths = self.files(version)
            spark_schema = from_arrow_schema(plain_schema(schema))
            if not paths:
                df = spark.createDataFrame([], spark_schema)
            else:
                reader = spark.read.schema(spark_schema)
                if snap.partition_columns:
                    reader = reader.option("basePath", as_uri(self.path))
                df = reader.parquet(*[self.file_uri(p) for p in paths])
        df = df.select(*[f"`{f.name}`" for f in schema])
        if columns is not None:
            df = df.select(*[f"`{c}`" for c in columns])
        return df

    def spark_reader(self, spark: SparkSession, version: int):
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
        if Snapshot.of_table(dt).read_plan.snapshot_driver == DATASET:
            return plain_arrow(pa.table(dt.to_pyarrow_table(columns=columns)))
        from deltalake import QueryBuilder
        names = columns if columns is not None else [f.name for f in dt.schema().to_arrow()]
        reader = QueryBuilder().register("t", dt).execute(f"SELECT {', '.join(dq(c) for c in names)} FROM t")
        schema = plain_schema(pa.schema([pa.schema(dt.schema().to_arrow()).field(c) for c in names]))
        return plain_arrow(pa.table(reader.read_all())).cast(schema)

    def deletion_vectors(self, version: int) -> dict:
        """The keep masks (numpy bool arrays, True: the row is in the table) of the files that have a deletion
        vector at ``version``, by path relative to the table (delta-rs'
        ``DeltaTable.deletion_vectors``). Row ``i`` of a mask is row ``i`` of its Parquet file;
        rows past a mask's end are kept. Raises SourceError when the version cannot be opened."""
        dt = self._at(version)
        root = dt.table_uri.rstrip("/") + "/"
        out = {}
        found = pa.RecordBatchReader.from_stream(dt.deletion_vectors()).read_all()
        masks = found.column(1)
        for i, uri in enumerate(found.column(0).to_pylist()):
            rel = uri[len(root):] if uri.startswith(root) else uri.rsplit("/", 1)[-1]
            out[unquote(rel)] = masks[i].values.to_numpy(zero_copy_only=False)
        return out

    def log_commits(self, start_exclusive: int, end_inclusive: int) -> list:
        """The commits of ``(start_exclusive, end_inclusive]`` as their log files hold them
        (:class:`~.tail.TailCommit`: version, commit time, actions), read all at once. Raises
        SourceError naming the first version whose commit file is gone (its log cleaned up)."""
        from .tail import TailCommit, commit_ms
        versions = list(range(start_exclusive + 1, end_inclusive + 1))

        def read(v: int) -> tuple:
            try:
                return tuple(self.log_actions(v))
            except FileNotFoundError as e:
                raise SourceError(f"Delta table {self.path}: versions {start_exclusive + 1}..{end_inclusive} cannot "
                                  f"be read: the commit file of version {v} is gone (its log was cleaned up): {e}. "
                                  f"Run with --full-refresh") from e
        return [TailCommit(v, commit_ms(actions), actions)
                for v, actions in zip(versions, at_once(read, versions, "delta-log", limit=16))]

    def read_log_changes(self, start_exclusive: int, end_inclusive: int, schema: pa.Schema,
                         partition_columns: list[str], physical: dict[str, str] | None = None,
                         commits: list | None = None):
        """:func:`.log_changes.changelog` of versions ``(start_exclusive, end_inclusive]``
        (``commits``: their :meth:`log_commits`, when the caller read them): the change derived
        from the log, with or without the Change Data Feed, deletion vectors read by
        :meth:`deletion_vectors`. Raises SourceError naming a file that is gone."""
        from .log_changes import changelog
        if commits is None:
            commits = self.log_commits(start_exclusive, end_inclusive)
        try:
            return changelog(self.path, commits, start_exclusive, end_inclusive, schema, partition_columns,
                             physical=physical, deletion_vectors=self.deletion_vectors)
        except FileNotFoundError as e:
            raise SourceError(f"Delta table {self.path}: a data file of versions {start_exclusive + 1}.."
                              f"{end_inclusive} is gone (VACUUM removed it): {e}. Run with --full-refresh") from e

    def read_changes_arrow(self, start_exclusive: int, end_inclusive: int,
                           columns: list[str] | None = None, spark: SparkSession | None = None) -> pa.Table:
        """:func:`.changes.read_changes_arrow` of this table: Change Data Feed rows of versions
        ``(start_exclusive, end_inclusive]`` as Arrow."""
        return changes.read_changes_arrow(self, start_exclusive, end_inclusive, columns, spark)
