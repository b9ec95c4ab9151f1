"""The Kafka readers of a run: one :class:`.reader.KafkaReader` per clock, shared by the
sources of that clock, and a second of the topics' start where the first resumed.

In: ``format: kafka`` source specs (:class:`..spec.SourceSpec`). Out: their clock's reader,
told to read each spec's topic too. A :class:`ReaderRegistry` is an object with a lifetime:
:meth:`ReaderRegistry.close` closes its readers' Kafka clients and drops them (and the chunk
files they keep, :mod:`..chunk_files`); nothing outlives it. :data:`READERS` is the registry
runs use until the run that owns it closes it (:func:`forget_readers`: tests that recreate
topics, or act as a new process).
"""
from __future__ import annotations

import threading

from ..debezium.schema import column_type
from ..spec import INITIAL
from .reader import KafkaReader


def clock_key(spec) -> tuple:
    """The key of ``spec``'s clock: (bootstrap servers, the transaction topic, or the topic
    of a per_topic clock, consistency)."""
    servers, topic = spec.option("bootstrap_servers"), spec.option("topic")
    consistency = spec.option("consistency", "transaction")
    return servers, spec.option("transaction_topic") if consistency == "transaction" else topic, consistency


def _columns(spec) -> dict:
    label = f"source('{spec.source_name}', '{spec.name}'): meta.consistent_stream.columns"
    return {c: column_type(c, t, label) for c, t in (spec.option("columns") or {}).items()}


class ReaderRegistry:
    """The readers of one run, by clock (:func:`clock_key`): those runs read with (they may
    start at a resume point) and those of the topics' start (``full``)."""

    def __init__(self):
        self._readers: dict[tuple, KafkaReader] = {}
        self._full: dict[tuple, KafkaReader] = {}
        self._lock = threading.Lock()

    def declare(self, spec, full: bool = False) -> KafkaReader:
        """The reader of ``spec``'s clock (``full``: of the topics' start, where the run's
        reader resumed), told to read the spec's topic too (not refreshed). A
        :class:`.source.KafkaSource` declares its table when it is opened, so that the tables
        of a job, opened together, are read in one pass (a table added after a read makes the
        reader read every topic again)."""
        registry = self._full if full else self._readers
        key = clock_key(spec)
        with self._lock:
            r = registry.get(key)
            if r is None:
                r = registry[key] = KafkaReader(*key)
        r.add_table(spec.option("topic"), spec.table, spec.primary_key, _columns(spec))
        limit = spec.option("driver_read_records")
        if limit is not None:   # the smallest any of the clock's sources asks for
            r.driver_read_records = min(int(limit), r.driver_read_records)
        return r

    def reader_for(self, spec) -> KafkaReader:
        """The reader of ``spec``'s clock, reading the spec's topic too, refreshed. It may
        start at a resume point (:meth:`.reader.KafkaReader.resume_at`)."""
        return self.declare(spec).refresh()

    def full_reader_for(self, spec) -> KafkaReader:
        """A reader of ``spec``'s clock that read the topics from their start (what the table
        as of a position needs), refreshed: :meth:`reader_for`'s when it did."""
        r = self.declare(spec)
        return r.refresh() if r.base == INITIAL else self.declare(spec, full=True).refresh()

    def close(self) -> None:
        """Close every reader's Kafka clients and drop the readers."""
        with self._lock:
            for r in list(self._readers.values()) + list(self._full.values()):
                r.log.close()
            self._readers.clear()
            self._full.clear()


READERS = ReaderRegistry()
"""The registry of this process's run."""


def declare(spec, full: bool = False) -> KafkaReader:
    """:meth:`ReaderRegistry.declare` of :data:`READERS`."""
    return READERS.declare(spec, full)


def reader_for(spec) -> KafkaReader:
    """:meth:`ReaderRegistry.reader_for` of :data:`READERS`."""
    return READERS.reader_for(spec)


def full_reader_for(spec) -> KafkaReader:
    """:meth:`ReaderRegistry.full_reader_for` of :data:`READERS`."""
    return READERS.full_reader_for(spec)


def forget_readers() -> None:
    """Close :data:`READERS` (tests that recreate topics, or act as a new process)."""
    READERS.close()
