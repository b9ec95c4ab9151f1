"""The Structured Streaming source of a consistent_stream query: its offsets are cuts.

``spark.readStream.format("consistent_stream_cuts")`` with options ``sources`` (JSON:
source key -> Delta table path, or {format, location, table}: ``formats.stream_options``),
``max_batch_rows`` and ``recompute_threshold`` (admission control, :mod:`.backlog`) and, for
a run-to-cut job (``dbt run``), ``cut`` (JSON: source key -> position, taken when the run
starts). Each micro-batch ``(start, end]`` yields one row per source: ``source string,
start_version bigint, end_version bigint`` as Arrow, so the query's progress reports one
input row per source; the changelogs themselves are read by the batch function.

Trigger available-now (``SupportsTriggerAvailableNow``): the target is the run's cut, and a
backlog is split into batches of at most ``max_batch_rows`` source change rows, each ending
at a transaction-consistent cut, the last at the target. Processing-time trigger: the target
is the sources' latest positions (Delta versions; for Debezium sources the last complete
transaction of their landing directory, shared by all its tables), split the same way.

The reader runs in a Python worker process of Spark's; it keeps its sources (and their Delta
handles and landing readers) open between calls.
"""
from __future__ import annotations

import json

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

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


class CutStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options):
        self.sources = json.loads(options["sources"])
        self.fixed = json.loads(options["cut"]) if options.get("cut") else None
        self.max_rows = int(options.get("max_batch_rows") or 0)
        self.threshold = float(options.get("recompute_threshold") or 0.25)
        self.target: dict | None = None
        self._open = None

    def _sources(self):
        if self._open is None:
            from .formats import open_source, specs_from_options
            self._open = [open_source(s) for s in specs_from_options(self.sources)]
        return self._open

    def initialOffset(self) -> dict:
        return {k: -1 for k in sorted(self.sources)}

    def _current(self) -> dict:
        if self.target is not None:
            return dict(self.target)
        if self.fixed is not None:
            return {k: int(self.fixed[k]) for k in sorted(self.sources)}
        from .formats import latest_cut
        return latest_cut(self._sources())

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._current()

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict = None, limit=None) -> dict:
        cur = self._current()
        if start is None:
            return cur
        # never move backwards (a source recreated with fewer versions is an error later)
        cur = {k: max(int(v), int(start.get(k, -1))) for k, v in cur.items()}
        if isinstance(limit, ReadMaxRows) and limit.max_rows:
            from .backlog import next_cut
            cur = next_cut(self._sources(), {k: int(v) for k, v in start.items()}, cur,
                           max_rows=int(limit.max_rows), recompute_threshold=self.threshold)
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
