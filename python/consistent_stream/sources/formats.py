"""Sources by format: one protocol (:class:`Source`), one implementation per format, chosen
once per source by :func:`open_source`.

Formats (``meta.consistent_stream.format``):

* ``delta``: a Delta table with the Change Data Feed on; positions are Delta versions
  (:class:`.delta_cdf.DeltaSource`).
* ``debezium``: one table of a CDC landing directory of Debezium JSON events
  (:class:`.debezium.DebeziumSource`, written by ``consistent-stream capture postgres``);
  positions are transaction positions (the LSN just past a commit), and every table of one
  landing directory is cut at the same position, so a cut never splits a transaction. The
  table as of position X is the snapshot (at P0) plus every change up to X: the
  snapshot-then-CDC source (``snapshot_then_cdc`` macro).
* ``model``: the target of an upstream consistent_stream model (``ref()``,
  :class:`.model.ModelSource`); positions are the target's versions, each one batch of the
  upstream that records the base cut it reflects. A cut over several inputs is chosen by the
  DAG cut rule (:mod:`.dag`) so that they agree on every base source they share.

Positions are ints; -1 (INITIAL) is "nothing read yet".
"""
from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ..changelog import Changelog
from .delta_cdf import DeltaSource, SourceChanges
from .spec import INITIAL, Cut, SourceSpec


class Source(Protocol):
    """What the engine asks of a source, whatever its format. A Source object lives as long
    as the run (or the continuous query) and keeps its handles open."""
    spec: SourceSpec

    def columns(self) -> list[str]: ...

    def schema(self) -> StructType: ...

    def latest_position(self) -> int: ...

    def rows(self, position: int) -> int: ...

    def commit_ms(self, position: int) -> int: ...

    def snapshot(self, views, position: int, columns: list[str] | None) -> Changelog: ...

    def snapshot_dataframe(self, spark: SparkSession, position: int) -> DataFrame: ...

    def snapshot_arrow(self, position: int) -> pa.Table: ...

    def changes(self, views, start: int, end: int, columns: list[str] | None) -> SourceChanges: ...

    def commits(self, start: int, end: int) -> list: ...

    def base_positions(self, position: int) -> dict[str, int]: ...


def open_source(spec: SourceSpec) -> Source:
    """The :class:`Source` of ``spec``'s format."""
    if spec.format == "debezium":
        from .debezium import DebeziumSource
        return DebeziumSource(spec)
    if spec.format == "model":
        from .model import ModelSource
        return ModelSource(spec)
    return DeltaSource(spec)


def column_names(source: SourceSpec) -> list[str]:
    """The source table's columns. SourceError when the table or landing directory is missing."""
    return open_source(source).columns()


def latest_cut(sources: list[Source]) -> dict[str, int]:
    """The newest consistent cut of ``sources``: Delta's latest version; for Debezium
    sources the last complete transaction of their landing directory, read once per directory
    so that all its tables share one transaction-consistent position; with upstream models,
    the newest cut on which they and the base sources agree (:func:`.dag.aligned_cut`)."""
    out, landings = {}, {}
    for s in sources:
        if s.spec.format == "debezium":
            if s.spec.location not in landings:
                landings[s.spec.location] = s.latest_position()
            out[s.spec.key] = landings[s.spec.location]
        else:
            out[s.spec.key] = s.latest_position()
    from .dag import aligned_cut
    return aligned_cut(sources, out)


def snapshot_arrow(source: SourceSpec, position: int) -> pa.Table:
    """The source table as of ``position`` (all columns) as Arrow (the DuckDB oracle's input)."""
    return open_source(source).snapshot_arrow(position)


def snapshot_dataframe(spark: SparkSession, source: SourceSpec, position: int) -> DataFrame:
    """The source table as of ``position`` as a Spark DataFrame (the Spark oracle's input)."""
    return open_source(source).snapshot_dataframe(spark, position)


def cut_metadata(sources: list[SourceSpec], cut: Cut) -> dict:
    """Extra commit metadata describing ``cut``: ``cut_lsn`` = landing directory -> the cut's
    LSN in PostgreSQL notation (only when the model reads Debezium sources)."""
    from .landing import format_lsn
    lsn = {s.location: format_lsn(cut.versions[s.key]) for s in sources
           if s.format == "debezium" and cut.versions.get(s.key, INITIAL) >= 0}
    return {"cut_lsn": lsn} if lsn else {}
