"""The Structured Streaming source of a consistent_stream query: its offsets are cuts.

``spark.readStream.format("consistent_stream_cuts")`` with options ``sources`` (JSON:
source key -> Delta table path, or {format, location, table}: ``formats.stream_options``) and, for a run-to-cut job (``dbt run``), ``cut`` (JSON:
source key -> version, taken when the run starts). Each micro-batch ``(start, end]`` yields
one row per source: ``source string, start_version bigint, end_version bigint`` as Arrow,
so the query's progress reports one input row per source; the changelogs themselves are read
by the batch function through ``sources.formats``. Without ``cut``, the latest offset is the
sources' latest positions (continuous mode): Delta versions, and for Debezium sources the last
complete transaction of their landing directory, shared by all its tables.
"""
from __future__ import annotations

import json

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

SCHEMA = "source string, start_version bigint, end_version bigint"


class CutSource(DataSource):
    """Python data source ``consistent_stream_cuts`` (register with
    ``spark.dataSource.register(CutSource)``)."""

    @classmethod
    def name(cls) -> str:
        return "consistent_stream_cuts"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> DataSourceStreamReader:
        return CutStreamReader(self.options)


class _Range(InputPartition):
    def __init__(self, start: dict, end: dict):
        self.start, self.end = start, end


class CutStreamReader(DataSourceStreamReader):
    def __init__(self, options):
        self.sources = json.loads(options["sources"])
        self.fixed = json.loads(options["cut"]) if options.get("cut") else None

    def initialOffset(self) -> dict:
        return {k: -1 for k in sorted(self.sources)}

    def _current(self) -> dict:
        if self.fixed is not None:
            return {k: int(self.fixed[k]) for k in sorted(self.sources)}
        from .formats import latest_cut, specs_from_options
        return latest_cut(specs_from_options(self.sources))

    def latestOffset(self, start: dict = None, limit=None) -> dict:
        cur = self._current()
        if start is not None:
            # never move backwards (a source recreated with fewer versions is an error later)
            cur = {k: max(int(v), int(start.get(k, -1))) for k, v in cur.items()}
        return cur

    def partitions(self, start: dict, end: dict):
        return [_Range(start, end)]

    def read(self, partition: _Range):
        keys = sorted(partition.end)
        yield pa.RecordBatch.from_pydict({
            "source": keys,
            "start_version": [int(partition.start.get(k, -1)) for k in keys],
            "end_version": [int(partition.end[k]) for k in keys],
        }, schema=pa.schema([("source", pa.string()), ("start_version", pa.int64()), ("end_version", pa.int64())]))

    def commit(self, end: dict) -> None:
        pass
