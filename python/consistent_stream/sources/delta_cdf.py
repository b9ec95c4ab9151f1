"""Delta Change Data Feed as a changelog (``format: delta``).

Between two cut positions ``(start, end]`` of one source table (positions are Delta versions):

* ``start == -1`` (first batch, a rebuild): the snapshot at ``end``, every row +1, read by
  Spark's executors (or, for a rebuild small enough to run on the driver, by delta-rs);
* ``start == end``: the empty changelog (no read at all);
* otherwise: the Change Data Feed of versions ``start+1 .. end``, read on the driver
  (change-sized) and mapped to weights insert/update_postimage -> +1,
  delete/update_preimage -> -1 (not consolidated here: linear operators do not need it, and
  stateful operators consolidate their inputs, after projection, where an update of an
  unused column cancels out).

Which engine reads each of these is decided per table from its protocol's reader features
(:class:`~consistent_stream.delta.deltars.ReadPlan`; the run log says which): the version's
Parquet files or delta-spark on the executors, delta-rs' dataset or its DataFusion scan on the
driver, delta-rs' or delta-spark's Change Data Feed. A feature neither reads is refused.

Out: the source's columns (or the requested subset) plus ``__weight`` bigint.
"""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructField, StructType

from .. import storage
from ..changelog import WEIGHT, Changelog, with_weight
from ..delta import DeltaTableRef
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
    "vacuumProtocolCheck (README, \"Sources written by Spark and Databricks\"). Point the source at a copy of the "
    "table written without the feature, or drop it (ALTER TABLE <table> DROP FEATURE <feature>, where Delta can)")

log = logging.getLogger("consistent_stream")


class DeltaSource:
    """A Delta table with the Change Data Feed on, read through one handle per run. Each
    table is its own clock (its versions), and a backlog may end a batch at any version."""
    splits_backlog = True

    def __init__(self, spec: SourceSpec):
        self.spec = spec
        self.table = DeltaTableRef(spec.location)
        self.clock = f"source:{spec.key}"
        self._plan = None   # the table's ReadPlan, once its protocol's reader features were checked

    def _require(self) -> DeltaTableRef:
        if not self.table.exists():
            where = (f"meta.consistent_stream.location of source('{self.spec.source_name}', '{self.spec.name}')")
            if storage.is_dir(self.spec.location):
                raise SourceError(f"source {self.spec.key}: {self.spec.location} is not a Delta table (it has no "
                                  f"_delta_log directory; plain Parquet or other files are not a changelog). Point "
                                  f"{where} at the root of a Delta table with the Change Data Feed on")
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
        return [f.name for f in self._require().arrow_schema()]

    def schema(self) -> StructType:
        """The table's columns as Spark types; under column mapping each field's metadata keeps
        its physical name (``delta.columnMapping.physicalName``), its identity: a column dropped
        and added again under its name has another one (:func:`consistent_stream.preflight.
        source_schema_drift` compares them)."""
        table = self._require()
        arrow, spark = table.arrow_schema(), from_arrow_schema(table.plain_arrow_schema())
        fields = []
        for f, a in zip(spark.fields, arrow):
            physical = (a.metadata or {}).get(PHYSICAL_NAME.encode())
            fields.append(StructField(f.name, f.dataType, f.nullable, {PHYSICAL_NAME: physical.decode()} if physical
                                      else {}))
        return StructType(fields)

    def latest_position(self) -> int:
        """The table's latest version. Raises SourceError when the table is missing, its
        Change Data Feed is off, or its protocol needs a reader feature that cannot be read
        exactly (checked at every run's start, before anything is written)."""
        table = self._require()
        version = table.latest_version()
        self._check_features()   # at the new version too: a feature added later is seen before it is read
        if not table.change_data_feed_enabled():
            raise SourceError(
                f"source {self.spec.key}: the Delta table {self.spec.location} does not have the Change Data Feed "
                f"on: set its table property delta.enableChangeDataFeed = true (ALTER TABLE ... SET TBLPROPERTIES), "
                f"then run with --full-refresh (changes made while it was off are not in the feed). Nothing was "
                f"read or written")
        return version

    def rows(self, position: int) -> int:
        """Rows of the table at ``position`` (from the log's statistics)."""
        return self._require().num_records(position)

    def commit_ms(self, position: int) -> int:
        return self._require().commit_at(position).timestamp_ms

    def base_positions(self, position: int) -> dict[str, int]:
        """A base source reflects itself: ``{key: position}``."""
        return {self.spec.key: position}

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """Nothing beyond the cut's version."""
        return {}

    def commits(self, start: int, end: int) -> list:
        """The versions in ``(start, end]`` with their commit times and change rows (from the
        commit's operation metrics; None when it has none)."""
        from .backlog import SourceCommit
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
        across any schema change in them (:meth:`DeltaTableRef.read_changes_arrow`), in the
        columns as named at ``end``. Raises SourceError when the table is missing or its Change
        Data Feed is off, gone for those versions, or cannot be read across a schema change in
        them (naming the commit and the change)."""
        table = self._require()
        if start == INITIAL:
            raise ValueError("a snapshot is read with snapshot(), not changes()")
        zschema = _zset_schema(table, None, columns)
        if start == end:
            return SourceChanges(Changelog.empty(views, zschema), 0, None)
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
        v = bad.column("v")[0].as_py()
        raise SourceError(
            f"{source.location}: the Change Data Feed of version {v} has {bad.column('pre_sum')[0].as_py()} "
            f"update_preimage rows but {bad.column('post_sum')[0].as_py()} update_postimage rows, so it "
            f"does not describe the update (a writer bug; delta-rs 1.6.6 drops the postimages of rows "
            f"updated to equal another row). Nothing was read; rewrite the source table with a "
            f"primary key, then run with --full-refresh")
