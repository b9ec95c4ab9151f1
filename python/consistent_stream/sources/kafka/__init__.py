"""Debezium change events on Kafka topics, read as changelogs cut at whole upstream
transactions (``format: kafka``).

A Kafka Connect worker running Debezium (e.g. its PostgreSQL connector) writes each captured
table's change events to a topic of its own (``<topic.prefix>.<schema>.<table>``), and with
``provide.transaction.metadata=true`` a BEGIN and an END event per transaction to the
transaction topic (``<topic.prefix>.transaction``). Values are Debezium's JSON (Kafka Connect's
``JsonConverter``), with the ``{"schema", "payload"}`` envelope (``schemas.enable=true``: the
columns and their types come from it, :mod:`..debezium.schema`) or without it (then
``meta.consistent_stream.columns`` declares them).

The package, from the records up:

- :mod:`.log`: Kafka partitions, offsets and records in an offset range (the driver's client,
  ``confluent-kafka``, imported when first needed: the ``kafka`` extra; or Spark's Kafka source).
- :mod:`.snapshot`: the connector's snapshot assembled across partitions.
- :mod:`.assembly`: records -> complete upstream transactions, and **the consistency rule**
  (how a cut at whole transactions is taken). Pure.
- :mod:`.clocks`: one clock per ``consistency`` (``transaction``, ``per_topic``).
- :mod:`.extents`: what a resume point may still need of the published transactions.
- :mod:`.reader`: :class:`~.reader.KafkaReader`, the I/O: reads, schemas, the kept changes.
- :mod:`.table`: a table's changes and the table as of a position computed by Spark from the topics.
- :mod:`.registry`: the readers of a run, one per clock.
- :mod:`.source`: :class:`~.source.KafkaSource`, one table as a source.

Its face (what the rest of the engine and the tests use) is re-exported here.
"""
from .registry import READERS, ReaderRegistry, declare, forget_readers, full_reader_for, reader_for
from .source import KafkaSource

__all__ = ["KafkaSource", "READERS", "ReaderRegistry", "declare", "forget_readers", "full_reader_for",
           "reader_for"]
