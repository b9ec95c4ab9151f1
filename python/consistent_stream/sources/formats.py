"""Sources by format: one protocol (:class:`Source`), one implementation per format, chosen
once per source by :func:`open_source`.

Formats (``meta.consistent_stream.format``):

* ``delta``: a Delta table with the Change Data Feed on; positions are Delta versions
  (:class:`.delta_cdf.DeltaSource`).
* ``debezium``: one table of a CDC landing directory of Debezium JSON events
  (:class:`.debezium.source.DebeziumSource`, written by ``consistent-stream capture postgres``);
  positions are transaction positions (the LSN just past a commit), and every table of one
  landing directory is cut at the same position, so a cut never splits a transaction. The
  table as of position X is the snapshot (at P0) plus every change up to X: the
  snapshot-then-CDC source (``snapshot_then_cdc`` macro).
* ``kafka``: one table's topic of Debezium change events on Kafka
  (:class:`.kafka.source.KafkaSource`); positions are complete transactions in the order of the
  connector's transaction topic (an END event's offset + 1; the snapshot is 0), and every table
  of one transaction topic is cut at the same position; or, with ``consistency: per_topic``,
  the topic's own offsets.
* ``model``: the target of an upstream consistent_stream model (``ref()``,
  :class:`.model.ModelSource`); positions are the target's versions, each one batch of the
  upstream that records the base cut it reflects. A cut over several inputs is chosen by the
  DAG cut rule (:mod:`.dag`, which also takes the newest cut of a model's sources) so that
  they agree on every base source they share.

Positions are ints; -1 (INITIAL) is "nothing read yet".
"""
from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ..changelog import Changelog
from ..errors import SourceError
from .delta_cdf import DeltaSource, SourceChanges
from .spec import INITIAL, Cut, SourceSpec


class Source(Protocol):
    """What the engine asks of a source, whatever its format. A Source object lives as long
    as the run (or the continuous query) and keeps its handles open.

    ``clock``: the transaction clock its positions belong to (sources of one clock are cut
    at one position together and their commits interleave as one log); ``splits_backlog``:
    whether a backlog may end a batch at any of its commits (:mod:`.backlog`);
    ``reads_beside_others``: whether its :meth:`changes` may run on a thread while other
    sources' do (its reads share no handle with theirs), so that a batch's reads of several
    sources on an object store take one round trip, not one each; ``reads_before_lock``: whether
    a run may read it before it holds the model's writer lock (its reads touch nothing another
    run reads from: not a landing directory or topic the process's one reader consumes), so that
    an object store's run lists it while the lock is taken (``consistent_stream.job._CutAhead``).
    Both are class attributes, read through :func:`source_class` without opening a source."""
    spec: SourceSpec
    clock: str
    splits_backlog: bool
    reads_beside_others: bool
    reads_before_lock: bool

    def columns(self) -> list[str]: ...

    def schema(self) -> StructType: ...

    def latest_position(self) -> int: ...

    def waiting_for(self) -> str:
        """Why :meth:`latest_position` is INITIAL (nothing to read yet) and what to wait for."""

    def rows(self, position: int) -> int: ...

    def commit_ms(self, position: int) -> int: ...

    def snapshot(self, views, position: int, columns: list[str] | None, *, on_driver: bool = False) -> Changelog:
        """The source at ``position``, every row +1 (source columns, or ``columns``, +
        ``__weight``); ``on_driver``: as driver-side Arrow (the caller knows it is small)."""

    def snapshot_dataframe(self, spark: SparkSession, position: int) -> DataFrame: ...

    def snapshot_arrow(self, position: int) -> pa.Table: ...

    def changes(self, views, start: int, end: int, columns: list[str] | None) -> SourceChanges: ...

    def commits(self, start: int, end: int) -> list: ...

    def base_positions(self, position: int) -> dict[str, int]: ...

    def cut_metadata(self, position: int) -> dict[str, dict]: ...


def source_class(format: str) -> type:
    """The :class:`Source` class of a source ``format`` (a ``SourceSpec.format``: ``delta``,
    ``model``, ``debezium``, ``kafka``; any other reads a Delta table)."""
    if format == "debezium":
        from .debezium.source import DebeziumSource
        return DebeziumSource
    if format == "kafka":
        from .kafka.source import KafkaSource
        return KafkaSource
    if format == "model":
        from .model import ModelSource
        return ModelSource
    return DeltaSource


def open_source(spec: SourceSpec) -> Source:
    """The :class:`Source` of ``spec``'s format."""
    return source_class(spec.format)(spec)


def column_names(source: SourceSpec) -> list[str]:
    """The source table's columns. SourceError when the table or landing directory is missing."""
    return open_source(source).columns()


def snapshot_arrow(source: SourceSpec, position: int) -> pa.Table:
    """The source table as of ``position`` (all columns) as Arrow (the DuckDB oracle's input)."""
    return open_source(source).snapshot_arrow(position)


def snapshot_dataframe(spark: SparkSession, source: SourceSpec, position: int) -> DataFrame:
    """The source table as of ``position`` as a Spark DataFrame (the Spark oracle's input)."""
    return open_source(source).snapshot_dataframe(spark, position)


def analysis_dataframe(spark: SparkSession, source: SourceSpec, position: int | None) -> DataFrame:
    """A DataFrame with the columns and types of the source table as of ``position``, for
    Spark's analysis of a model's SQL (its output schema) and nothing else: for a Kafka source
    an empty one of its schema, at any position (``None``: before the topics are read; its
    columns come from the first records, :meth:`.kafka.source.KafkaSource.schema`), else the
    snapshot's. SourceError for another source without a position."""
    s = open_source(source)
    if source.format == "kafka":
        return spark.createDataFrame([], s.schema())
    if position is None:
        raise SourceError(f"source {source.key}: no position to analyze the model's SQL at")
    return s.snapshot_dataframe(spark, position)


def cut_metadata(sources: list[Source], cut: Cut) -> dict:
    """Extra commit metadata describing ``cut``, merged from every source's
    :meth:`Source.cut_metadata` (e.g. ``cut_lsn``: landing directory -> the cut's LSN in
    PostgreSQL notation, for Debezium sources)."""
    out: dict[str, dict] = {}
    for s in sources:
        position = cut.versions.get(s.spec.key, INITIAL)
        if position >= 0:
            for k, v in s.cut_metadata(position).items():
                out.setdefault(k, {}).update(v)
    return out
