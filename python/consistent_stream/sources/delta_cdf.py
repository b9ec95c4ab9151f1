"""A Delta table as a changelog (``format: delta``), with or without the Change Data Feed.

Between two cut positions ``(start, end]`` of one source table (positions are Delta versions):

* ``start == -1`` (first batch, a rebuild): the snapshot at ``end``, every row +1, read by
  Spark's executors (or, for a rebuild small enough to run on the driver, by delta-rs);
* ``start == end``: the empty changelog (no read at all);
* otherwise, read on the driver (change-sized): when the Change Data Feed was on for every
  commit of the range, the feed of versions ``start+1 .. end`` mapped to weights
  insert/update_postimage -> +1, delete/update_preimage -> -1 (not consolidated here: linear
  operators do not need it, and stateful operators consolidate their inputs, after
  projection, where an update of an unused column cancels out); else the change derived from
  the log (:mod:`consistent_stream.delta.log_changes`: each commit's Change Data Feed files
  where it has them, else the rows of the files it added at +1 and removed at -1, less their
  deletion vectors, consolidated), which costs the files the commits touched, not the table.

Which engine reads each of these is decided per table from its protocol's reader features
(:class:`~consistent_stream.delta.deltars.ReadPlan`; the run log says which): the version's
Parquet files or delta-spark on the executors, delta-rs' dataset or its DataFusion scan on the
driver, delta-rs' or delta-spark's Change Data Feed. A feature neither reads is refused.

A run that goes on from a cut reads the table without opening it when it can
(:class:`~consistent_stream.delta.tail.LogTail`: one listing of the log after the cut's
version, the new commit files and the change files they name): each target commit records,
per source, what the run knew of the table at the cut (its reader features, schema,
partition columns and the commit time of that version: ``cut_offsets``), and the next run
resumes from it (:meth:`DeltaSource.resume`). Any commit the tail does not read (a protocol or
metadata change, deletion vectors, a gap in the log), and anything that needs the table's
snapshot (row counts, a rebuild), opens the table as before.

Out: the source's columns (or the requested subset) plus ``__weight`` bigint.
"""
from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructField, StructType

from .. import storage
from ..changelog import WEIGHT, Changelog, with_weight
from ..delta import DeltaTableRef
from ..delta.deltars import FILE_EXACT_FEATURES
from ..delta.log_changes import UnpairedUpdate
from ..delta.tail import LogTail
from ..errors import SourceError
from .spec import INITIAL, SourceSpec

PHYSICAL_NAME = "delta.columnMapping.physicalName"
_SIGN = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


class SourceChanges:
    """One source's change in one batch: the changelog, the change rows read and the newest
    source commit time in the range (ms since epoch; None when unknown)."""

    def __init__(self, changelog: Changelog, rows: int, commit_ms: int | None):
        self.changelog, self.rows, self.commit_ms = changelog, rows, commit_ms


_FEATURE_ADVICE = (
    "consistent_stream reads deletion vectors, column mapping, v2 checkpoints, timestampNtz and "
    "vacuumProtocolCheck (docs/guides/delta-sources.md). Point the source at a copy of the "
    "table written without the feature, or drop it (ALTER TABLE <table> DROP FEATURE <feature>, where Delta can)")

log = logging.getLogger("consistent_stream")


class DeltaSource:
    """A Delta table, with or without the Change Data Feed, read through one handle per run. Each
    table is its own clock (its versions), and a backlog may end a batch at any version. Its
    reads go through its own handle: they may run beside other sources', and before the run
    holds its writer lock."""
    splits_backlog = True
    reads_beside_others = True
    reads_before_lock = True

    def __init__(self, spec: SourceSpec):
        self.spec = spec
        self.table = DeltaTableRef(spec.location)
        self.clock = f"source:{spec.key}"
        self._plan = None   # the table's ReadPlan, once its protocol's reader features were checked
        self._tail: LogTail | None = None   # the log after the cut, read without opening the table (resume)
        self._hint: dict | None = None      # what the run before knew of the table at that cut
        self._said_log = False              # the run log said the table is read from its log
        self._cut_table_id: str | None = None   # the table's id at the cut the run goes on from
        self.replaced: str | None = None    # why the table is another than the one the cut read

    # ---- going on from a cut without opening the table -------------------------------------
    def resume(self, cut_offsets: dict, position: int) -> bool:
        """Read on from ``position`` (the target's last cut) with the log's tail, given what
        the commit of that cut recorded of this table (``cut_offsets[self.clock]``: version,
        reader features, schema, partition columns, commit time, rows when known); False (the table is opened
        as before) when it recorded nothing for this position or the table needs a reader the
        tail is not (:data:`FILE_EXACT_FEATURES`: no deletion vectors, no column mapping)."""
        hint = (cut_offsets or {}).get(self.clock)
        if not isinstance(hint, dict) or hint.get("version") != position or "schema" not in hint:
            return False
        self._cut_table_id = hint.get("table_id")
        if not set(hint.get("reader_features") or ()) <= FILE_EXACT_FEATURES:
            return False
        self._hint, self._tail = hint, LogTail(self.spec.location, position, hint.get("commit_ms"),
                                               hint.get("commit_tag"))
        return True

    def _drop_tail(self, why: str) -> None:
        log.info("source %s (%s): %s; the table is opened", self.spec.key, self.spec.location, why)
        self._tail = self._hint = None

    def _tail_for(self, start: int, end: int) -> LogTail | None:
        """The tail when it reads the change in ``(start, end]``, else None."""
        if self._tail is None or start < self._tail.after:
            return None
        return None if self._tail.unreadable(start, end) else self._tail

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """What the next run needs to read on from ``position`` without opening the table
        (:meth:`resume`): ``{"cut_offsets": {clock: {version, reader_features, schema,
        partition_columns, commit_ms, rows, table_id, commit_tag}}}`` (``rows`` None when not known
        without opening the table at an older version; ``commit_tag`` the write tag of the version's
        commit file when the log's tail listed it, else None)."""
        rows = tag = None
        if self._hint is not None and self._tail is not None and not self._tail.unreadable(self._tail.after, position):
            features, schema, partitions = (self._hint["reader_features"], self._hint["schema"],
                                            self._hint["partition_columns"])
            table_id = self._hint.get("table_id")
            rows = self._counted_rows(position)
            tag = self._tail.tag(position)
        else:
            table = self._require()
            features = sorted(table.read_plan().features)
            schema, partitions = self.schema().json(), table.partition_columns()
            table_id = table.snapshot().table_id
            if position == table.version():   # (an older version's count would open it at that version)
                rows = table.num_records(position)
        return {"cut_offsets": {self.clock: {"version": position, "reader_features": list(features),
                                             "schema": schema, "partition_columns": list(partitions),
                                             "commit_ms": self.commit_ms(position) if position >= 0 else 0,
                                             "rows": rows, "table_id": table_id, "commit_tag": tag}}}

    def _require(self) -> DeltaTableRef:
        if not self.table.exists():
            where = (f"meta.consistent_stream.location of source('{self.spec.source_name}', '{self.spec.name}')")
            if storage.is_dir(self.spec.location):
                raise SourceError(f"source {self.spec.key}: {self.spec.location} is not a Delta table (it has no "
                                  f"_delta_log directory; plain Parquet or other files are not a changelog). Point "
                                  f"{where} at the root of a Delta table")
            raise SourceError(f"source {self.spec.key}: no Delta table at {self.spec.location} ({where}). Restore "
                              f"the table there or fix the location; nothing was read or written")
        if self._plan is None:
            self._check_features()
        return self.table

    def _check_features(self) -> None:
        """Raise SourceError when the table's protocol needs a reader feature neither engine
        reads (:attr:`ReadPlan.unreadable`), naming the source, the table, each feature and
        what to do. Checked at the handle's first use, before anything of the table is read,
        and at every newest version a cut may reach. The run log says which engine reads
        what (:meth:`ReadPlan.describe`) the first time and whenever the features change."""
        plan = self.table.read_plan()
        if plan.unreadable:
            raise SourceError(
                f"source {self.spec.key}: the Delta table at {self.spec.location} needs the reader feature(s) "
                f"{', '.join(sorted(plan.unreadable))} (its protocol), which consistent_stream does not read; "
                f"nothing was read or written. {_FEATURE_ADVICE}")
        if plan != self._plan:
            log.info("source %s (%s): %s", self.spec.key, self.spec.location, plan.describe())
            self._plan = plan

    def columns(self) -> list[str]:
        if self._hint is not None:
            return self.schema().fieldNames()
        return [f.name for f in self._require().arrow_schema()]

    def schema(self) -> StructType:
        """The table's columns as Spark types; under column mapping each field's metadata keeps
        its physical name (``delta.columnMapping.physicalName``), its identity: a column dropped
        and added again under its name has another one (:func:`consistent_stream.preflight.
        source_schema_drift` compares them)."""
        if self._hint is not None:
            return StructType.fromJson(json.loads(self._hint["schema"]))
        table = self._require()
        arrow, spark = table.arrow_schema(), from_arrow_schema(table.plain_arrow_schema())
        fields = []
        for f, a in zip(spark.fields, arrow):
            physical = (a.metadata or {}).get(PHYSICAL_NAME.encode())
            fields.append(StructField(f.name, f.dataType, f.nullable, {PHYSICAL_NAME: physical.decode()} if physical
                                      else {}))
        return StructType(fields)

    def physical_names(self) -> dict[str, str]:
        """Column name -> its physical name (``delta.columnMapping.physicalName``) for the
        columns that have one (column mapping on); the log's statistics and data files name a
        column by it. Empty without column mapping."""
        return {f.name: f.metadata[PHYSICAL_NAME] for f in self.schema().fields
                if (f.metadata or {}).get(PHYSICAL_NAME)}

    def waiting_for(self) -> str:
        return f"the Delta table {self.spec.location} has no version"

    def latest_position(self) -> int:
        """The table's latest version. Raises SourceError when the table is missing or its
        protocol needs a reader feature that cannot be read exactly (checked at every run's
        start, before anything is written). A table without the Change Data Feed is read from
        its log (the run log says so once)."""
        if self._tail is not None:
            try:
                latest = self._tail.refresh()
                why = self._tail.unreadable(self._tail.after, latest)
            except OSError as e:
                why = f"its log's tail could not be read ({e})"
            if why is None:
                return latest
            self._drop_tail(why)
        table = self._require()
        version = table.latest_version()
        self._check_features()   # at the new version too: a feature added later is seen before it is read
        table_id = table.snapshot().table_id
        if self._cut_table_id and table_id and table_id != self._cut_table_id:
            self.replaced = (f"source {self.spec.key}: the Delta table at {self.spec.location} was created again "
                             f"since the last run (its table id is {table_id}, was {self._cut_table_id}: dropped "
                             f"and created, as dbt seed and a DROP TABLE do); its old versions are gone")
        if not table.change_data_feed_enabled() and not self._said_log:
            log.info("source %s (%s): the Change Data Feed is off; each batch's change is derived from the log (the "
                     "rows of the files its commits added and removed, less their deletion vectors)",
                     self.spec.key, self.spec.location)
            self._said_log = True
        return version

    def rows(self, position: int) -> int:
        """Rows of the table at ``position`` (from the log's statistics; reading on from the
        cut, the rows the cut's commit recorded plus what the tail's commits added less what
        they removed, by their operation metrics, when those tell)."""
        rows = self._counted_rows(position)
        return rows if rows is not None else self._require().num_records(position)

    def column_stats(self, position: int, column: str) -> list[tuple] | None:
        """Per data file of the table at ``position``: ``(min, max, rows)`` of ``column``
        from the log's statistics (Python values; no data read), for the bounds of a
        rebuild's key ranges (:mod:`consistent_stream.ranges`). None when a file has
        no row count or no min and max of the column (statistics not written, a partition
        column, a column past ``delta.dataSkippingNumIndexedCols``). Under column mapping the
        log names statistics by the column's physical name (:meth:`physical_names`),
        which a rename keeps."""
        actions = self._require().add_actions(position)
        names = set(actions.column_names)
        stat = self.physical_names().get(column, column)
        if f"min.{stat}" not in names or f"max.{stat}" not in names or "num_records" not in names:
            return None
        out = list(zip(actions.column(f"min.{stat}").to_pylist(), actions.column(f"max.{stat}").to_pylist(),
                       actions.column("num_records").to_pylist()))
        return None if any(v is None for row in out for v in row) else out

    def _counted_rows(self, position: int) -> int | None:
        """Rows at ``position`` from the cut's recorded count and the tail's commits after it
        (:attr:`.TailCommit.net_rows`); None when the hint records no count, the tail does not
        read that far or a commit's metrics do not tell."""
        hint, tail = self._hint, self._tail
        if hint is None or tail is None or hint.get("rows") is None or position < tail.after \
                or tail.unreadable(tail.after, position):
            return None
        nets = [c.net_rows for c in tail.range(tail.after, position)]
        return None if None in nets else int(hint["rows"]) + sum(nets)

    def commit_ms(self, position: int) -> int:
        if self._hint is not None and position == self._hint["version"]:
            return int(self._hint["commit_ms"])
        if self._tail is not None and position in self._tail.commits:
            return self._tail.commits[position].timestamp_ms
        return self._require().commit_at(position).timestamp_ms

    def base_positions(self, position: int) -> dict[str, int]:
        """A base source reflects itself: ``{key: position}``."""
        return {self.spec.key: position}

    def commits(self, start: int, end: int) -> list:
        """The versions in ``(start, end]`` with their commit times and change rows (from the
        commit's operation metrics; None when it has none)."""
        from .backlog import SourceCommit
        tail = self._tail_for(start, end)
        if tail is not None:
            return [SourceCommit(c.version, c.timestamp_ms, c.change_rows) for c in tail.range(start, end)]
        return [SourceCommit(v, ts, rows) for v, ts, rows in self._require().commit_rows(start, end)]

    def snapshot(self, views, position: int, columns: list[str] | None, *, on_driver: bool = False) -> Changelog:
        """The table at ``position``, every row +1: read by Spark's executors, or
        (``on_driver``, for a table known to be small) by delta-rs as a driver-side changelog."""
        table = self._require()
        if not on_driver:
            return Changelog.of_frame(views, with_weight(table.read_snapshot(views.spark, position, columns)))
        data = table.read_snapshot_arrow(position, columns)
        data = data.append_column(WEIGHT, pa.array([1] * data.num_rows, pa.int64()))
        return Changelog.of_source_change(views, data, schema=_zset_schema(table, position, columns))

    def snapshot_dataframe(self, spark: SparkSession, position: int) -> DataFrame:
        return self._require().read_snapshot(spark, position)

    def snapshot_arrow(self, position: int) -> pa.Table:
        return self._require().read_snapshot_arrow(position)

    def changes(self, views, start: int, end: int, columns: list[str] | None) -> SourceChanges:
        """The changes in ``(start, end]`` as a driver-side Z-set (a relation among ``views``),
        in the columns as named at ``end``: from the log's tail when the run goes on from its
        cut; else from the table's Change Data Feed when the feed covers every commit of the
        range (across any schema change in them, :meth:`DeltaTableRef.read_changes_arrow`);
        else derived from the log (:mod:`consistent_stream.delta.log_changes`: the files the
        commits added and removed, less their deletion vectors, consolidated). Raises
        SourceError when the table is missing, a file or commit of the range is gone, or the
        feed cannot be read across a schema change in them (naming the commit and the change)."""
        if start == INITIAL:
            raise ValueError("a snapshot is read with snapshot(), not changes()")
        tail = self._tail_for(start, end)
        if tail is not None:
            schema = self.schema()
            zschema = _with_weight_field(schema if columns is None else StructType([schema[c] for c in columns]))
            if start == end:
                return SourceChanges(Changelog.empty(views, zschema), 0, None)
            try:
                found = tail.changes(start, end, _plain_arrow(zschema, drop=WEIGHT), self._hint["partition_columns"])
            except UnpairedUpdate as e:
                raise _unpaired(self.spec, e) from e
            except Exception as e:   # a file the tail cannot decode as the schema says: the table's own reader
                self._drop_tail(f"versions {start + 1}..{end} could not be read from the log's tail ({e})")
            else:
                return self._logged(views, found, zschema, start, end)
        table = self._require()
        zschema = _zset_schema(table, None, columns)
        if start == end:
            return SourceChanges(Changelog.empty(views, zschema), 0, None)
        commits = self._commits_unless_fed(table, start, end)
        if commits is not None:
            try:
                found = table.read_log_changes(start, end, _plain_arrow(zschema, drop=WEIGHT),
                                               table.partition_columns(), self.physical_names(), commits)
            except UnpairedUpdate as e:
                raise _unpaired(self.spec, e) from e
            return self._logged(views, found, zschema, start, end)
        arrow = table.read_changes_arrow(start, end, columns, spark=views.spark)
        n = arrow.num_rows
        kinds = arrow.column("_change_type")
        unknown = pc.invert(pc.is_in(kinds, pa.array(list(_SIGN))))
        if n and pc.any(unknown).as_py():
            bad = pc.filter(kinds, unknown)[0].as_py()
            raise SourceError(f"{self.spec.location}: unknown Change Data Feed _change_type {bad!r}")
        _check_update_pairs(self.spec, arrow)
        commit_ms = None
        if n and pc.max(arrow.column("_commit_version")).as_py() == end:
            commit_ms = int(pc.max(arrow.column("_commit_timestamp").cast(pa.timestamp("ms")).cast(pa.int64())).as_py())
        weight = pc.if_else(pc.is_in(kinds, pa.array(["insert", "update_postimage"])), 1, -1).cast(pa.int64())
        keep = [c for c in arrow.column_names if c not in ("_change_type", "_commit_version", "_commit_timestamp")]
        data = arrow.select(keep).append_column(WEIGHT, weight)
        return SourceChanges(Changelog.of_source_change(views, data, schema=zschema), n, commit_ms)

    def _commits_unless_fed(self, table: DeltaTableRef, start: int, end: int) -> list | None:
        """The commits of ``(start, end]`` (:meth:`DeltaTableRef.log_commits`) when the range
        is read from the log, None when its Change Data Feed reads it exactly
        (:func:`_feed_covers`)."""
        commits = table.log_commits(start, end)
        return None if _feed_covers(table, commits) else commits

    def _logged(self, views, found, zschema: StructType, start: int, end: int) -> SourceChanges:
        """A :class:`~consistent_stream.delta.log_changes.LogChanges` as the batch's change,
        with a run-log line saying how it was read (and that a whole-table rewrite read the
        table whole)."""
        if found.whole_table:
            log.info("source %s (%s): version(s) %s rewrote the table whole (an overwrite or CREATE OR REPLACE): "
                     "the batch read the whole table, before and after, to find the rows that changed "
                     "(%d files, %d rows read; %d changed)", self.spec.key, self.spec.location,
                     ", ".join(map(str, found.whole_table)), found.files_read, found.rows_read, found.change_rows)
        else:
            log.info("source %s: versions %d..%d read from the log (%s%s): %d files, %d rows in them, %d decoded, "
                     "%d changed", self.spec.key, start + 1, end,
                     "Change Data Feed files" if found.used_cdc else "the files the commits added and removed",
                     ", with deletion vectors" if found.used_deletion_vectors else "",
                     found.files_read, found.rows_read, found.rows_decoded, found.change_rows)
        return SourceChanges(Changelog.of_source_change(views, found.data, schema=zschema, grouped=True),
                             found.change_rows, found.commit_ms)


def _feed_covers(table: DeltaTableRef, commits: list) -> bool:
    """Whether the table's Change Data Feed reader reads ``commits`` exactly: the feed was on
    for every one of them (on now, and no commit of the range set the table's properties
    without it) and none has a deletion vector (delta-rs 1.6.6's ``load_cdf`` reads a removed
    file whole, its deletion vector ignored: an overwrite of such a file reports rows deleted
    before as deleted again; the log's reader applies the vectors)."""
    if not table.change_data_feed_enabled():
        return False
    for c in commits:
        for a in c.actions:
            conf = (a.get("metaData") or {}).get("configuration")
            if "metaData" in a and str((conf or {}).get("delta.enableChangeDataFeed", "false")).lower() != "true":
                return False
            if any(a.get(kind, {}).get("deletionVector") for kind in ("add", "remove", "cdc")):
                return False
    return True


def _unpaired(source: SourceSpec, e: UnpairedUpdate) -> SourceError:
    return SourceError(
        f"{source.location}: the Change Data Feed of version {e.version} has {e.pre} update_preimage rows but "
        f"{e.post} update_postimage rows, so it does not describe the update (a writer bug; delta-rs 1.6.6 drops "
        f"the postimages of rows updated to equal another row). Nothing was read; rewrite the source table with "
        f"a primary key, then run with --full-refresh")


def _with_weight_field(schema: StructType) -> StructType:
    from pyspark.sql.types import LongType
    return StructType(list(schema.fields) + [StructField(WEIGHT, LongType())])


def _plain_arrow(schema: StructType, drop: str) -> pa.Schema:
    """``schema`` (less column ``drop``) in Arrow, as the table's rows are once read."""
    from ..delta.deltars import arrow_schema, plain_schema
    return plain_schema(arrow_schema(StructType([f for f in schema.fields if f.name != drop])))


def _zset_schema(table: DeltaTableRef, version: int | None, columns: list[str] | None) -> StructType:
    """The Spark schema of the table's changelog: its columns (or ``columns``) + ``__weight``."""
    from pyspark.sql.types import LongType, StructField
    schema = from_arrow_schema(_schema(table, version, columns))
    return StructType(list(schema.fields) + [StructField(WEIGHT, LongType())])


def _schema(table: DeltaTableRef, version: int | None, columns: list[str] | None) -> pa.Schema:
    schema = table.plain_arrow_schema(version)
    return schema if columns is None else pa.schema([schema.field(c) for c in columns])


def _check_update_pairs(source: SourceSpec, arrow: pa.Table) -> None:
    """Every update_preimage row has its update_postimage in the same commit (Delta's Change
    Data Feed protocol). delta-rs 1.6.6 writes an UPDATE's postimages as a set difference, so
    a row updated to the same values as another row of the table (possible only without a
    primary key) loses its postimage; reading on would silently drop rows. Raises SourceError
    naming the table and version."""
    if not arrow.num_rows:
        return
    kinds = arrow.column("_change_type")
    is_pre = pc.equal(kinds, "update_preimage")
    is_post = pc.equal(kinds, "update_postimage")
    if not (pc.any(is_pre).as_py() or pc.any(is_post).as_py()):
        return
    counts = pa.table({"v": arrow.column("_commit_version"), "pre": pc.cast(is_pre, pa.int64()),
                       "post": pc.cast(is_post, pa.int64())}).group_by("v").aggregate([("pre", "sum"), ("post", "sum")])
    bad = counts.filter(pc.not_equal(counts.column("pre_sum"), counts.column("post_sum")))
    if bad.num_rows:
        raise _unpaired(source, UnpairedUpdate(bad.column("v")[0].as_py(), bad.column("pre_sum")[0].as_py(),
                                               bad.column("post_sum")[0].as_py()))
