"""The clocks of a Kafka reader, one per ``consistency`` (chosen once, :func:`clock_for`): what
a refresh reads, how a read's records become published positions, and what each mode
allows (a resume point, recomputing a table from the topics).

In: the partitions of the data topics (:class:`.log.Partition`), a read's records with their
checked indices and typed images (:mod:`.assembly`). Out: :class:`.assembly.Published`
positions.

- :class:`TransactionClock` (``consistency: transaction``): the transaction topic's order;
  the positions are whole upstream transactions (the rule: :mod:`.assembly`); every table of
  one transaction topic shares it.
- :class:`PerTopicClock` (``consistency: per_topic``; a connector without transaction
  metadata, or the foil of the tests): each topic is its own clock, one event per position
  (offset + 1 of its record; the topic must have one partition). A version may then hold half
  of an upstream transaction, or one table's side of it without the other's: what Flink and
  Spark's own Kafka source give. A change is identified by its ``source.lsn`` (and row): a
  second copy is a duplicate.
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import pyarrow as pa

from ...errors import ConfigError, SourceError
from ..landing_index import TxInfo
from ..spec import INITIAL
from .assembly import Images, Published, Topic, TransactionAssembler, snapshot_waiting, weighted
from .snapshot import SnapshotAssembly


class Clock(Protocol):
    """What a :class:`.reader.KafkaReader` asks of its clock."""
    tx_topic: str | None
    """The topic read as transaction metadata (None: none)."""
    resumable: bool
    """Whether a position has a resume point (:meth:`.reader.KafkaReader.resume_point`) and
    Spark can compute a table's changes from the topics (:mod:`.table`)."""
    last: int
    pending: dict
    queued: int
    """Transactions queued in the transaction topic's order, not published yet."""
    snapshot: SnapshotAssembly

    def admit(self, topics: dict, location: str) -> None: ...
    def partitions(self, log, data: Callable[[], list]) -> list: ...
    def add(self, records: pa.Table, data: np.ndarray, tx: np.ndarray, images: Images) -> list[Published]: ...
    def end_of_refresh(self) -> list[Published] | None: ...
    def snapshot_waiting(self) -> list[str]: ...
    def snapshot_complete(self) -> bool: ...
    def stalled(self, now_ms: int | None = None) -> list[dict]: ...


class TransactionClock:
    """``consistency: transaction``: the positions of a :class:`.assembly.TransactionAssembler`."""
    resumable = True

    def __init__(self, tx_topic: str, topics: dict[str, Topic], skipped: dict):
        self.tx_topic = tx_topic
        self.assembler = TransactionAssembler(tx_topic, topics, skipped)

    @property
    def last(self) -> int:
        return self.assembler.last

    @property
    def pending(self) -> dict:
        return self.assembler.pending

    @property
    def queued(self) -> int:
        return len(self.assembler.order)

    @property
    def snapshot(self) -> SnapshotAssembly:
        return self.assembler.snapshot

    def admit(self, topics: dict, location: str) -> None:
        """Every table of the connector may share the clock."""

    def partitions(self, log, data: Callable[[], list]) -> list:
        """The transaction topic's partition (Debezium creates the topic at the first
        transaction after its snapshot: none before) and the data topics' (``data()``)."""
        tx_parts = (log.partitions(self.tx_topic, key="meta.consistent_stream.transaction_topic")
                    if self.tx_topic in log.topics() else [])
        if len(tx_parts) > 1:
            raise SourceError(f"Kafka topic {self.tx_topic} (the transaction topic) has {len(tx_parts)} "
                              f"partitions; Debezium writes transaction metadata to one partition, whose order "
                              f"is the commit order")
        return tx_parts + data()

    def start_at(self, position: int, included, lsn: int | None) -> None:
        self.assembler.start_at(position, included, lsn)

    def add(self, records: pa.Table, data: np.ndarray, tx: np.ndarray, images: Images) -> list[Published]:
        return self.assembler.add(records, data, tx, images)

    def end_of_refresh(self) -> list[Published] | None:
        """The snapshot, once every partition was read to a high watermark taken after its
        last markers were read (None: nothing to publish)."""
        a = self.assembler
        if not a.snapshot.published and a.snapshot_complete():
            return a.publish(snapshot=True)
        return None

    def snapshot_waiting(self) -> list[str]:
        return self.assembler.snapshot_waiting()

    def snapshot_complete(self) -> bool:
        return self.assembler.snapshot_complete()

    def stalled(self, now_ms: int | None = None) -> list[dict]:
        return self.assembler.stalled(now_ms)


class PerTopicClock:
    """``consistency: per_topic``: one topic of one partition, each change at its own position."""
    tx_topic = None
    resumable = False
    queued = 0

    def __init__(self, topic: str, topics: dict[str, Topic], skipped: dict):
        self.topic, self.topics, self.skipped = topic, topics, skipped
        self.last = INITIAL
        self.pending: dict = {}
        self.snapshot = SnapshotAssembly()
        self._seen_lsn: dict[str, set] = {}   # changes applied, by topic

    def admit(self, topics: dict, location: str) -> None:
        if topics:
            raise ConfigError(f"{location}: a per_topic reader reads one topic")

    def partitions(self, log, data: Callable[[], list]) -> list:
        parts = data()
        if len(parts) != 1:
            raise SourceError(f"Kafka topic {self.topic} has {len(parts)} partitions; consistency: per_topic reads "
                              f"a topic of one partition (its offsets are the positions)")
        return parts

    def start_at(self, position: int, included, lsn: int | None) -> None:
        raise SourceError(f"Kafka topic {self.topic}: consistency: per_topic has no resume point")

    def add(self, records: pa.Table, data: np.ndarray, tx: np.ndarray, images: Images) -> list[Published]:
        """The changes (record indices ``data``), each at its own position (offset + 1); a
        change whose ``source.lsn`` and row were applied before is a duplicate."""
        out: list[Published] = []
        if not records.num_rows:
            return out
        take = pa.array(data)
        col = {c: records.column(c).take(take).to_pylist() for c in ("topic", "offset", "op", "s_lsn", "s_txId",
                                                                     "s_ts_ms", "has_after")}
        rows_of = zip(col["topic"], col["offset"], col["op"], col["s_lsn"], col["s_txId"], col["s_ts_ms"],
                      col["has_after"], data.tolist())
        for topic, offset, op, lsn, tx_id, ts_ms, has_after, i in rows_of:
            t = self.topics[topic]
            position = offset + 1
            if op != "r" and lsn is not None:
                seen = self._seen_lsn.setdefault(t.topic, set())
                table, lo = images.of(t.topic, "a" if has_after else "b")
                key = (lsn, tx_id, str(table.slice(i - lo, 1).to_pylist()))
                if key in seen:
                    self.skipped["duplicates"] += 1
                    continue
                seen.add(key)
            out.append(Published(TxInfo(position, f"{t.topic}@{offset}", int(ts_ms or 0), {t.table: 1}, t.topic,
                                        offset, op == "r"), {t.table: weighted([], images, topic, op, i)}))
            self.last = position
        return out

    def end_of_refresh(self) -> list[Published] | None:
        return None

    def snapshot_waiting(self) -> list[str]:
        return snapshot_waiting(self.snapshot, self.topics, False)

    def snapshot_complete(self) -> bool:
        return not self.snapshot_waiting()

    def stalled(self, now_ms: int | None = None) -> list[dict]:
        """Nothing waits: every change is its own position."""
        return []


def clock_for(consistency: str, topic: str, topics: dict[str, Topic], skipped: dict) -> Clock:
    """The clock of ``consistency`` over ``topic`` (the transaction topic, or per_topic's one
    topic) and the data topics ``topics``; ``skipped`` counts its duplicates."""
    if consistency == "per_topic":
        return PerTopicClock(topic, topics, skipped)
    return TransactionClock(topic, topics, skipped)
