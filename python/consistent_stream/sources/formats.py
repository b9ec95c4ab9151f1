"""One entry point per question the engine asks of a source, whatever its format.

Formats (``meta.consistent_stream.format``):

* ``delta``: a Delta table with the Change Data Feed on; positions are Delta versions
  (:mod:`.delta_cdf`).
* ``debezium``: one table of a CDC landing directory of Debezium JSON events
  (:mod:`.debezium`, written by ``consistent-stream capture postgres``); positions are
  transaction positions (the LSN just past a commit), and every table of one landing
  directory is cut at the same position, so a cut never splits a transaction. The table as of
  position X is the snapshot (at P0) plus every change up to X: the snapshot-then-CDC source
  (``snapshot_then_cdc`` macro).

Positions are ints; -1 (INITIAL) is "nothing read yet".
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from ..delta import DeltaTableRef
from ..errors import SourceError
from .spec import INITIAL, Cut, SourceSpec

WEIGHT = "__weight"


def _landing(source: SourceSpec):
    from .debezium import reader_for
    return reader_for(source.location)


def column_names(source: SourceSpec) -> list[str]:
    """The source table's columns. SourceError when the table or landing directory is missing."""
    if source.format == "debezium":
        return _landing(source).schema(source.table).column_names
    t = DeltaTableRef(source.location)
    if not t.exists():
        raise SourceError(f"source {source.key}: no Delta table at {source.location} "
                          f"(meta.consistent_stream.location of source('{source.source_name}', '{source.name}'))")
    return [f.name for f in t.arrow_schema()]


def latest_cut(sources: list[SourceSpec]) -> dict[str, int]:
    """The newest complete position of every source: Delta's latest version; for Debezium
    sources the last complete transaction of their landing directory, read once per directory
    so that all its tables share one transaction-consistent position."""
    out, landings = {}, {}
    for s in sources:
        if s.format == "debezium":
            if s.location not in landings:
                landings[s.location] = _landing(s).latest_position()
            out[s.key] = landings[s.location]
        else:
            out[s.key] = DeltaTableRef(s.location).latest_version()
    return out


def _to_spark(spark: SparkSession, data: pa.Table) -> DataFrame:
    schema = from_arrow_schema(data.schema)
    return spark.createDataFrame(data, schema=schema) if data.num_rows else spark.createDataFrame([], schema)


def read_changelog(spark: SparkSession, source: SourceSpec, start: int, end: int,
                   columns: list[str] | None = None) -> tuple[DataFrame, int]:
    """The changes of ``source`` in ``(start, end]`` as a Z-set DataFrame (``columns`` +
    ``__weight`` bigint) and the number of change rows read; ``start == -1``: the table at
    ``end``, every row +1."""
    if source.format != "debezium":
        from .delta_cdf import read_changelog as delta_changelog
        return delta_changelog(spark, source, start, end, columns)
    r = _landing(source)
    if start == INITIAL:
        rel = r.table_at(source.table, end, columns)
        z = rel.append_column(WEIGHT, pa.array([1] * rel.num_rows, pa.int64()))
    else:
        z = r.changes(source.table, start, end, columns)
    return _to_spark(spark, z), z.num_rows


def snapshot_arrow(source: SourceSpec, position: int) -> pa.Table:
    """The source table as of ``position`` (all columns) as Arrow."""
    if source.format == "debezium":
        return _landing(source).table_at(source.table, position)
    from deltalake import DeltaTable
    dt = DeltaTable(source.location, version=position)
    return pa.table(dt.to_pyarrow_table()) if hasattr(dt, "to_pyarrow_table") else pa.table(dt.scan().read_all())


def snapshot_dataframe(spark: SparkSession, source: SourceSpec, position: int) -> DataFrame:
    """The source table as of ``position`` as a Spark DataFrame (the oracle's input)."""
    if source.format == "debezium":
        return _to_spark(spark, snapshot_arrow(source, position))
    return DeltaTableRef(source.location).read_snapshot(spark, position)


def commit_ms(source: SourceSpec, position: int) -> int:
    """Commit time (ms since epoch) of the newest source commit at or before ``position``."""
    if source.format == "debezium":
        return _landing(source).commit_ms(position)
    return DeltaTableRef(source.location).commit_at(position).timestamp_ms


def cut_metadata(sources: list[SourceSpec], cut: Cut) -> dict:
    """Extra commit metadata describing ``cut``: ``cut_lsn`` = landing directory -> the cut's
    LSN in PostgreSQL notation (only when the model reads Debezium sources)."""
    from .landing import format_lsn
    lsn = {s.location: format_lsn(cut.versions[s.key]) for s in sources
           if s.format == "debezium" and cut.versions.get(s.key, INITIAL) >= 0}
    return {"cut_lsn": lsn} if lsn else {}


def stream_options(sources: list[SourceSpec]) -> dict:
    """What the streaming source needs to find each source's latest position."""
    return {s.key: {"format": s.format, "location": s.location, "table": s.table} for s in sources}


def specs_from_options(options: dict) -> list[SourceSpec]:
    out = []
    for key, v in sorted(options.items()):
        if isinstance(v, str):
            v = {"format": "delta", "location": v}
        out.append(SourceSpec(name=key, relation=key, location=v["location"], format=v.get("format", "delta"),
                              table=v.get("table", "")))
    return out
