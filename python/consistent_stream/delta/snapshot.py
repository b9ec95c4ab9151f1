"""One version of a Delta table as an immutable value, and which engine reads it.

Owns :class:`Snapshot`: what a table's log reconciles to at one version (its protocol, its
metadata: columns, partition columns, table properties, description), built from a delta-rs
handle (:meth:`Snapshot.of_table`) or from the log replayed by :mod:`.log`
(:meth:`Snapshot.of_log`), never changed once built (a newer version is a new snapshot, as
delta-rs' own table state is). And :class:`ReadPlan`: the engine that reads a snapshot's rows
and its Change Data Feed, decided from the reader features of its protocol (the feature sets
below). Values only: nothing here reads a table; :class:`~.reader.TableReader` makes the
snapshots.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Mapping

import pyarrow as pa
from deltalake import DeltaTable

from .log import OwnedLog
from .values import Docs


@dataclass(frozen=True)
class Snapshot:
    """A Delta table at ``version``, as its log reconciles to it (Delta protocol, "Action
    Reconciliation"): the ``protocol`` action's reader and writer versions and features, and
    the ``metaData`` action's columns (``schema_string``: Delta's schema JSON), partition
    columns, table properties (``configuration``), ``description`` and the table's ``id``
    (``table_id``: a table dropped and created again under the same path has another).

    ``reader_features``: the features a reader must support (Delta protocol, "Table
    Features"): the ``readerFeatures`` of reader version 3, or for reader version 2 the
    ``columnMapping`` it implies when ``delta.columnMapping.mode`` is set. The data files are
    not part of the value (a version's add actions are read when asked:
    :meth:`~.reader.TableReader.add_actions`)."""
    version: int
    min_reader_version: int
    min_writer_version: int
    reader_features: frozenset
    writer_features: frozenset
    schema_string: str = field(repr=False)
    partition_columns: tuple = ()
    configuration: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    description: str | None = None
    table_id: str = ""

    @staticmethod
    def of_table(dt: DeltaTable) -> "Snapshot":
        """The snapshot of an open delta-rs handle, at its version."""
        protocol, metadata = dt.protocol(), dt.metadata()
        conf = dict(metadata.configuration)
        return Snapshot(dt.version(), int(protocol.min_reader_version), int(protocol.min_writer_version),
                        _features(protocol.min_reader_version, protocol.reader_features, conf),
                        frozenset(protocol.writer_features or ()), dt.schema().to_json(),
                        tuple(metadata.partition_columns), MappingProxyType(conf), metadata.description,
                        str(metadata.id or ""))

    @staticmethod
    def of_log(own: OwnedLog) -> "Snapshot":
        """The snapshot of a log replayed by :mod:`.log`, at its version (>= 0)."""
        p, m = own.protocol, own.metadata
        conf = own.configuration
        return Snapshot(own.version, int(p.get("minReaderVersion", 1)), int(p.get("minWriterVersion", 2)),
                        _features(int(p.get("minReaderVersion", 1)), p.get("readerFeatures"), conf),
                        frozenset(p.get("writerFeatures") or ()), m.get("schemaString") or '{"fields": []}',
                        tuple(own.partition_columns), MappingProxyType(conf), m.get("description"),
                        str(m.get("id") or ""))

    def at(self, version: int) -> "Snapshot":
        """This snapshot as version ``version``: the table after commits that changed neither
        its protocol nor its metadata (the table's own appends)."""
        return replace(self, version=version)

    @property
    def fields(self) -> list[dict]:
        """The columns as Delta's schema JSON holds them (``name``, ``type``, ``nullable``,
        ``metadata`` with the column mapping id and physical name where the table has column
        mapping); a new list each time."""
        return json.loads(self.schema_string)["fields"]

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The columns in Arrow, as delta-rs maps Delta's types."""
        from deltalake import Schema
        return pa.schema(Schema.from_json(self.schema_string).to_arrow())

    @property
    def read_plan(self) -> "ReadPlan":
        return ReadPlan(self.reader_features)

    @property
    def change_data_feed(self) -> bool:
        """Whether the table records its Change Data Feed (``delta.enableChangeDataFeed``)."""
        return str(self.configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    @property
    def docs(self) -> Docs:
        """The description and the columns' comments the table holds."""
        return Docs.of(self.description, self.fields)


def _features(min_reader_version: int, reader_features, configuration: Mapping[str, str]) -> frozenset:
    """:attr:`Snapshot.reader_features` of a protocol and table properties."""
    features = set(reader_features or ())
    mode = str(configuration.get("delta.columnMapping.mode", "none")).lower()
    if int(min_reader_version) == 2 and mode != "none":
        features.add("columnMapping")
    return frozenset(features)


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
    def of(snapshot: Snapshot) -> "ReadPlan":
        """The plan of a snapshot (its version's protocol)."""
        return ReadPlan(snapshot.reader_features)

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

