"""One table of Debezium change events on Kafka as a source (``format: kafka``).

Config (a dbt source's ``meta.consistent_stream``)::

    format: kafka
    bootstrap_servers: 127.0.0.1:9092     # required
    topic: pgb.public.pgbench_accounts    # required: the table's topic
    table: public.pgbench_accounts        # default: the topic's last two parts
    transaction_topic: pgb.transaction    # default: <first part of topic>.transaction
    consistency: transaction              # or per_topic (:mod:`.clocks`)
    columns: {aid: int, abalance: int}    # only without the schema envelope
    primary_key: [aid]
    driver_read_records: 1000000          # where a refresh reads (:mod:`.reader`)

In: the spec. Out: what :class:`..debezium.source.DebeziumSource` gives (positions, changes
across them, the table as of one), read through the reader of the source's clock
(:mod:`.registry`): the transaction topic's in transaction mode (every table of one connector
is cut at the same transaction, :mod:`.assembly`), the topic's own in per_topic mode.
"""
from __future__ import annotations

import logging

import pyarrow as pa

from ..debezium.events import WEIGHT
from ..debezium.source import DebeziumSource
from .reader import KafkaReader
from .registry import declare, full_reader_for, reader_for

log = logging.getLogger(__name__)


class KafkaSource(DebeziumSource):
    """One table's topic of Debezium change events on Kafka (``format: kafka``), through the
    run's :class:`.reader.KafkaReader` of its clock (:mod:`.registry`): the transaction topic's
    in transaction mode (every table of one connector is cut at the same transaction), the
    topic's own in per_topic mode. Positions and the table as of a position as in
    :class:`DebeziumSource`.

    A run resumes (:meth:`resume`) from the resume point its target's last commit records
    (``cut_offsets``): it reads the topics from those offsets on, not from their start. What
    needs the table as of a position (a first batch, a rebuild, ``verify``) reads the topics
    from their start with a reader of its own."""

    def __init__(self, spec):
        super().__init__(spec)
        consistency = spec.option("consistency", "transaction")
        on = spec.option("transaction_topic") if consistency == "transaction" else spec.option("topic")
        self.clock = f"kafka:{spec.option('bootstrap_servers')}/{on}"
        self.splits_backlog = True
        declare(spec)

    def _open_reader(self) -> KafkaReader:
        return reader_for(self.spec)

    def schema(self):
        """The table's columns as a Spark StructType, from its topic's first records when the
        reader has not read it yet (:meth:`.reader.KafkaReader.head_schema`): what compiling a model
        needs, without its backlog."""
        from pyspark.sql.pandas.types import from_arrow_schema
        return from_arrow_schema(declare(self.spec).head_schema(self.spec.table).arrow_schema())

    def waiting_for(self) -> str:
        waits = self.reader().snapshot_waiting()
        return ("the connector's snapshot is not read yet: " + "; ".join(waits) + ". Wait until the connector has "
                "finished its snapshot (Kafka Connect's status of the connector; its last snapshot event is marked "
                "source.snapshot = last), then run again") if waits else \
            f"no complete transaction on {self.clock} yet"

    def resume(self, cut_offsets: dict, position: int) -> bool:
        """Start this process's reader of the clock at the resume point ``cut_offsets`` holds
        for it (a target commit's ``cut_offsets``) when that point is ``position`` (the
        commit's cut of this source) and the reader has read nothing yet. Returns whether it
        does."""
        point = (cut_offsets or {}).get(self.clock)
        if not isinstance(point, dict) or point.get("position") != position or "offsets" not in point:
            return False
        started = declare(self.spec).resume_at(point)
        if started:
            log.info("%s: reading on from the resume point of position %d (offsets %s)", self.clock, position,
                     point["offsets"])
        return started

    def _full(self, upto: int | None = None):
        r = full_reader_for(self.spec)
        if upto is not None and upto > r.latest_position():
            r.refresh()
        return r

    def snapshot(self, views, position: int, columns, *, on_driver: bool = False):
        """The table at ``position``, every row +1: computed by Spark where the rebuild runs on
        the executors (``on_driver`` false; :meth:`.reader.KafkaReader.table_frame`), else on the
        driver from the reader's changes (:meth:`.reader.KafkaReader.table_at`)."""
        r = self._full(position)
        if not on_driver and r.computes_tables:
            from ...changelog import Changelog, with_weight
            return Changelog.of_frame(views, with_weight(r.table_frame(self.spec.table, position, columns)))
        rel = r.table_at(self.spec.table, position, columns)
        z = rel.append_column(WEIGHT, pa.array([1] * rel.num_rows, pa.int64()))
        return self._changelog(views, z, change=False)

    def snapshot_dataframe(self, spark, position: int):
        """The table at ``position`` as the lazy Spark query that computes it
        (:meth:`.reader.KafkaReader.table_frame`: what the model's SQL is analyzed over, and ``verify``
        reads once)."""
        r = self._full(position)
        if r.computes_tables:
            return r.table_frame(self.spec.table, position, materialize=False)
        return super().snapshot_dataframe(spark, position)

    def snapshot_arrow(self, position: int) -> pa.Table:
        return self._full(position).table_at(self.spec.table, position)

    def changes(self, views, start: int, end: int, columns):
        r = self.reader(upto=end)
        if start >= max(r.base, r.floor):
            return super().changes(views, start, end, columns)
        from ..delta_cdf import SourceChanges
        r = self._full(end)
        z = r.changes(self.spec.table, start, end, columns)
        return SourceChanges(self._changelog(views, z, change=True), z.num_rows,
                             r.commit_ms(end) if z.num_rows else None)

    def commits(self, start: int, end: int) -> list:
        if start >= self.reader(upto=end).base:
            return super().commits(start, end)
        from ..backlog import SourceCommit
        return [SourceCommit(tx.position, tx.ts_ms, tx.counts.get(self.spec.table, 0))
                for tx in self._full(end).transactions(start, end)]

    def stalled(self) -> list[dict]:
        """The transactions seen in part that hold back this source's clock
        (:meth:`.reader.KafkaReader.stalled`)."""
        return self.reader().stalled()

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """``cut_offsets``: the clock -> the resume point of ``position``
        (:meth:`.reader.KafkaReader.resume_point`; omitted when there is none)."""
        point = self.reader(upto=position).resume_point(position)
        return {"cut_offsets": {self.clock: point}} if point is not None else {}
