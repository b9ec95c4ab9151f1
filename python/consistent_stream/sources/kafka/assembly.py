"""Kafka records of Debezium change events -> complete upstream transactions: the assembler
of ``consistency: transaction``. Pure: it reads no topic and keeps no client; what it is given
and what it gives back are values (testable alone: ``tests/test_kafka_assembly.py``).

In: a read's records as :mod:`..debezium.columns` makes them (an Arrow table, one row per
Kafka record, ordered by topic: ``topic``, ``partition``, ``offset``, ``timestamp``, ``kind``,
``op``, ``tx_id``, ``total_order``, the ``s_*`` fields of ``source``, the ``t_*`` fields of a
transaction metadata event, ...), the record indices of its data topics' changes and of its
transaction topic's events (:func:`checked`), and the records' typed row images
(:class:`Images`). Out: the positions published (:class:`Published`: the transaction's
:class:`~..landing_index.TxInfo`, its weighted rows per table as ``(weight, image table, row
index)``, the offsets it spans for a resume point).

**The consistency rule** (the idea of seed 001, TiFlink's transaction-consistent checkpoints,
with Debezium's transaction metadata in place of TiDB's timestamps). Transactions enter the
log in the order of the transaction topic (one partition): Debezium emits a transaction whole
when the database commits it, so its BEGIN and END are adjacent there and their order is the
commit order; a transaction whose END is missing holds back every transaction after its
BEGIN. A transaction's position is the offset of its END event + 1 (or the previous position
+ 1 when its END came late, after a later transaction's); the connector's snapshot (``op: r``
events) is position 0. A position is published only when the transaction is *complete*: for
every table of the reader, as many distinct events of it (``transaction.total_order``) have
arrived, in whatever partitions, as the END's ``data_collections`` count; and every earlier
END's transaction is complete. So a cut never splits a transaction, across tables or
partitions, and never lets a later transaction in before an earlier one.

Delivery as it happens: Kafka Connect is at-least-once. A data event is identified by
(transaction, ``total_order``) and a transaction by its id (:func:`transaction_keys`: the
PostgreSQL connector's ids carry each message's own LSN): a second copy is counted as a
duplicate, never applied twice; a transaction a resume point already holds (its END's commit
LSN not above the point's) too. The connector's snapshot is assembled across partitions by
:mod:`.snapshot` and published, as position 0, when complete (:meth:`TransactionAssembler.publish`).
"""
from __future__ import annotations

import re
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SourceError
from ..debezium.columns import as_number, images, loads_collections
from ..debezium.events import ATTEMPT_FIELDS, FIRST, LAST_OF_TABLE, POS, WEIGHT, chunk_schema
from ..landing import TableSchema
from ..landing_index import TxInfo
from ..spec import INITIAL
from ..tx_ids import TxIdSet
from .snapshot import SnapshotAssembly

SNAPSHOT_POSITION = 0

_PG_TX_ID = re.compile(r"^(\d+):(\d+)$")

Diagnose = Callable[[dict, str], None]
"""``(part, cause)``: name the first record of ``part`` ((topic, partition) -> [start, end))
that cannot be read, as a SourceError (the reader reads it again raw:
:meth:`.reader.KafkaReader.diagnose`); raises."""


def transaction_keys(ids: pa.Array) -> pa.Array:
    """What identifies a transaction across its BEGIN, END and change events, for each of
    ``ids`` (strings; nulls stay null): Debezium's PostgreSQL connector writes ids
    ``"<xid>:<LSN>"`` whose LSN is each message's own (the first change's at BEGIN, each
    change's, the commit's at END), so its key is the xid; other connectors' ids (MySQL's
    GTIDs, ...) are the same on every message and are kept whole.

    >>> transaction_keys(pa.array(["771:2345", "gtid-1", None])).to_pylist()
    ['771', 'gtid-1', None]"""
    return pc.replace_substring_regex(pc.cast(ids, pa.string()), pattern=r"^([0-9]+):[0-9]+$", replacement=r"\1")


def end_lsn(tx_id) -> int | None:
    """The LSN in a Debezium PostgreSQL END event's id (the commit's end LSN: it grows with
    commit order), None for other connectors' ids.

    >>> end_lsn("771:2345"), end_lsn("gtid-1")
    (2345, None)"""
    m = _PG_TX_ID.match(str(tx_id))
    return int(m.group(2)) if m else None


def where(topic: str, partition: int, offset: int) -> str:
    return f"Kafka topic {topic} partition {partition} offset {offset}"


def _flags(mask) -> np.ndarray:
    """A boolean Arrow array (nulls false) as NumPy."""
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def _first(mask: np.ndarray) -> int | None:
    """The index of the first true of ``mask``, None when none is."""
    i = int(np.argmax(mask)) if mask.size else 0
    return i if mask.size and mask[i] else None


def record_ms(records: pa.Table, take: pa.Array) -> list:
    """The Kafka timestamps of ``records``' rows at ``take`` in milliseconds (None where a
    record has none)."""
    return pc.divide(pc.cast(records.column("timestamp").take(take), pa.int64()), 1000).to_pylist()


def weighted(rows: list, images: "Images", topic: str, op: str, i: int) -> list:
    """``rows`` with the change of record ``i`` of ``topic`` as weighted rows (weight, image
    table, row index): c/r +after, d -before, u -before +after."""
    if op == "u" or op == "d":
        image, lo = images.of(topic, "b")
        rows.append((-1, image, i - lo))
    if op != "d":
        image, lo = images.of(topic, "a")
        rows.append((1, image, i - lo))
    return rows


def place(records: pa.Table, i: int) -> tuple[str, int, int]:
    """Record ``i``'s topic, partition and offset."""
    return tuple(records.column(c)[i].as_py() for c in ("topic", "partition", "offset"))


def not_tx_metadata(at: str) -> SourceError:
    return SourceError(f"{at}: not Debezium transaction metadata (no 'status'); is "
                       f"meta.consistent_stream.transaction_topic the connector's <topic.prefix>.transaction?")


@dataclass
class Topic:
    """One data topic of a reader: its table, schema (None until known) and converters."""
    topic: str
    table: str
    primary_key: tuple
    schema: TableSchema | None = None
    convert: dict = field(default_factory=dict)
    absent: bool = False        # its topic did not exist at the last refresh
    partitions: int = 0         # partitions of its topic at the last refresh


@dataclass
class Published:
    """One position published: its :class:`~..landing_index.TxInfo`, its rows per table
    (weighted rows ``(weight, image table, row index)``), and, for a transaction of the
    transaction topic, ``extent``: (id, END commit LSN or None, first and last offset of its
    records per (topic, partition)), what a resume point needs (:mod:`.extents`)."""
    info: TxInfo
    rows: dict
    extent: tuple | None = None


class Images:
    """The typed before/after images of one read's records (:func:`..debezium.columns.images`),
    per data topic and side, made at first use over the topic's rows alone (the records are
    ordered by topic): :meth:`of` gives the table and the record index of its first row.
    ``typed``: topic -> (index of its image columns, table schema); ``diagnose`` names the
    record an image cannot be made of."""

    def __init__(self, records: pa.Table, typed: dict, diagnose: Diagnose):
        self.records, self.typed, self.diagnose = records, typed, diagnose
        self._made: dict[tuple, tuple[pa.Table, int]] = {}

    def of(self, topic: str, side: str) -> tuple[pa.Table, int]:
        got = self._made.get((topic, side))
        if got is None:
            rows = np.flatnonzero(pc.equal(self.records.column("topic"), topic).to_numpy(zero_copy_only=False))
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            mine = self.records.slice(lo, hi - lo)
            i, ts = self.typed[topic]
            try:
                table = images(mine, i, ts, side)
            except SourceError as e:
                part = {}
                for p, o in zip(mine.column("partition").to_pylist(), mine.column("offset").to_pylist()):
                    a, b = part.get((topic, p), (o, o + 1))
                    part[(topic, p)] = (min(a, o), max(b, o + 1))
                self.diagnose(part, str(e))
            got = self._made[(topic, side)] = (table, lo)
        return got


def weighted_table(ts: TableSchema, blocks: list) -> pa.Table:
    """Weighted rows of one table, as blocks ``(position, [(weight, image table, row index),
    ...])`` (a transaction's rows of the table, or the snapshot's) -> an Arrow table of its
    columns + __pos + __weight (rows taken from each image table in one call)."""
    groups: dict[int, tuple] = {}
    for pos, rows in blocks:
        for w, image, i in rows:
            g = groups.get(id(image))
            if g is None:
                g = groups[id(image)] = (image, array("q"), array("q"), array("q"))
            g[1].append(i)
            g[2].append(pos)
            g[3].append(w)
    schema = chunk_schema(ts)
    def column(a: array) -> pa.Array:
        return pa.array(np.frombuffer(a, np.int64))
    parts = [image.take(column(idx)).append_column(POS, column(pos)).append_column(WEIGHT, column(w)).cast(schema)
             for image, idx, pos, w in groups.values()]
    return pa.concat_tables(parts)


def checked(records: pa.Table, topics: dict[str, Topic], tx_topic: str | None, skipped: dict,
            diagnose: Diagnose) -> tuple[np.ndarray, np.ndarray]:
    """The record indices of the data topics' change events and of the transaction topic's
    events (``tx_topic``; None: a clock without one, whose changes need no ``transaction``
    block), after the checks every record gets whatever came before it: tombstones and events
    without an ``op`` (heartbeats, schema changes) counted in ``skipped``; a value that is not
    a JSON object, an image that does not fit the table, an unknown op, an event of another
    table, a missing before/after image, a change without a transaction block when there is a
    transaction topic: a SourceError naming the first such record."""
    kind, topic, op = records.column("kind"), records.column("topic"), records.column("op")

    def at(i: int) -> str:
        return where(*place(records, i))

    def diagnose_record(i: int, cause: str) -> None:
        t, p, offset = place(records, i)
        diagnose({(t, p): (offset, offset + 1)}, cause)
    event = _flags(pc.equal(kind, "event"))
    tomb = _flags(pc.equal(kind, "tombstone"))
    skipped["tombstones"] += int(tomb.sum())
    wrong = np.flatnonzero(~event & ~tomb)
    if wrong.size:
        diagnose_record(int(wrong[0]), "not a JSON object")
    on_tx = (_flags(pc.equal(topic, tx_topic)) if tx_topic is not None
             else np.zeros(records.num_rows, dtype=bool))
    has_op = _flags(pc.is_valid(op))
    skipped["other"] += int((event & ~on_tx & ~has_op).sum())
    data = event & ~on_tx & has_op
    first = _first(data & ~_flags(records.column("images_ok")))
    if first is not None:
        diagnose_record(first, "an image's columns or values do not fit the table's")
    first = _first(data & ~_flags(pc.is_in(op, value_set=pa.array(["c", "u", "d", "r"]))))
    if first is not None:
        raise SourceError(f"{at(first)}: unknown op {op[first].as_py()!r}; expected c, u, d or r")
    first = _first(data & _flags(pc.is_valid(records.column("other_table"))))
    if first is not None:
        table = records.column("other_table")[first].as_py()
        raise SourceError(f"{at(first)}: event of table {table or None!r} in the topic of "
                          f"{topics[topic[first].as_py()].table} (meta.consistent_stream.table); an event "
                          f"of an unknown table, or the wrong topic")
    if tx_topic is not None:
        first = _first(data & _flags(pc.and_(pc.not_equal(op, "r"), pc.is_null(records.column("tx_id")))))
        if first is not None:
            raise SourceError(f"{at(first)}: change event (op {op[first].as_py()}) without "
                              f"a 'transaction' block: the connector must run with "
                              f"provide.transaction.metadata=true for consistency: transaction, or set "
                              f"meta.consistent_stream.consistency: per_topic (each table cut on its own)")
    retracts = _flags(pc.is_in(op, value_set=pa.array(["u", "d"])))
    first = _first(data & retracts & ~_flags(records.column("has_before")))
    if first is not None:
        table = topics[topic[first].as_py()].table
        raise SourceError(f"{at(first)}: op {op[first].as_py()} on {table} without a "
                          f"'before' image: retractions need the whole old row; run ALTER TABLE {table} REPLICA "
                          f"IDENTITY FULL")
    first = _first(data & _flags(pc.not_equal(op, "d")) & ~_flags(records.column("has_after")))
    if first is not None:
        raise SourceError(f"{at(first)}: op {op[first].as_py()} on "
                          f"{topics[topic[first].as_py()].table} without an 'after' image")
    return np.flatnonzero(data), np.flatnonzero(event & on_tx)


def snapshot_waiting(snapshot: SnapshotAssembly, topics: dict[str, Topic], over: bool) -> list[str]:
    """What the connector's snapshot still waits for, one line per table naming its topic
    and partitions (:meth:`.snapshot.SnapshotAssembly.waiting`); empty once it is read
    (``over``: a transaction was read)."""
    if snapshot.published:
        return []
    return snapshot.waiting([(t.topic, t.table, t.partitions) for t in topics.values()],
                            over=over, absent={t.topic for t in topics.values() if t.absent})


@dataclass
class PendingTx:
    """A transaction seen in part: its events per table (weighted rows: (weight, image table,
    row index)), the total_orders seen,
    and its END (offset, ts_ms, counts per data collection) once it arrived."""
    id: str
    first_seen_ms: int
    rows: dict = field(default_factory=dict)
    seen: set = field(default_factory=set)
    counts: dict = field(default_factory=dict)
    end_offset: int | None = None
    end_ts_ms: int = 0
    end_counts: dict | None = None
    queued: bool = False
    end_lsn: int | None = None
    first: dict = field(default_factory=dict)   # (topic, partition) -> first offset of its records
    last: dict = field(default_factory=dict)    # (topic, partition) -> last offset of its records

    def saw(self, tp: tuple, offset: int) -> None:
        first = self.first.setdefault(tp, offset)
        if offset > self.last.get(tp, first):
            self.last[tp] = offset
        elif tp not in self.last:
            self.last[tp] = first


class TransactionAssembler:
    """The transactions of ``tx_topic`` and the data topics ``topics`` (topic -> :class:`Topic`,
    shared with the reader, which updates their partitions), assembled from the records given
    to :meth:`add` in the order they were read, published by the consistency rule (module
    docstring). ``skipped`` (reason -> count) gets the duplicates. ``last``: the newest
    position published; ``pending``: id -> the transactions seen in part; ``published``: the
    ids published (or held by the resume point started at, :meth:`start_at`)."""

    def __init__(self, tx_topic: str, topics: dict[str, Topic], skipped: dict):
        self.tx_topic, self.topics, self.skipped = tx_topic, topics, skipped
        self.pending: dict[str, PendingTx] = {}
        self.order: deque[str] = deque()          # transaction topic order, not yet published
        self.published = TxIdSet()
        self.snapshot = SnapshotAssembly()
        self.last = INITIAL
        self.base_lsn: int | None = None
        self.tx_records = 0

    def start_at(self, position: int, included, lsn: int | None) -> None:
        """Start after ``position`` (a resume point: past the snapshot), the transactions
        ``included`` already in, and every transaction whose END's commit LSN is not above
        ``lsn``."""
        self.published = TxIdSet(included)
        self.base_lsn = lsn
        self.last = position
        self.snapshot.take()

    def add(self, records: pa.Table, data: np.ndarray, tx: np.ndarray, images: Images) -> list[Published]:
        """Assemble ``records`` (:func:`checked` gave ``data`` and ``tx``) in passes over their
        columns (every record keeps its place in the order the per-record rules are defined
        in): the connector's snapshot reads, a run of them in one partition and one attempt
        accepted at once; each change into its pending transaction; the transaction topic's
        BEGIN and END; then publish what became complete (:meth:`publish`)."""
        if records.num_rows:
            r_op = _flags(pc.and_(pc.equal(records.column("op"), "r"), pc.is_null(records.column("tx_id"))))
            changes = data[~r_op[data]]
            self._snapshot_reads(records, data[r_op[data]], changes, images)
            self._changes(records, changes, images)
            self._tx_events(records, tx)
        return self.publish()

    def _snapshot_reads(self, records: pa.Table, snap: np.ndarray, changes: np.ndarray, images: Images) -> None:
        """The connector's snapshot reads (record indices ``snap``, in record order) into the
        snapshot assembly. A run of reads in one partition and one attempt whose markers after
        the first have no meaning to the assembly (``true``) is one :meth:`.snapshot.
        SnapshotAssembly.accept`; a read after a change of the same partition (``changes``,
        earlier in record order) is the assembly's error."""
        if not snap.size:
            return
        take = pa.array(snap)
        topic = records.column("topic").take(take).to_numpy(zero_copy_only=False)
        part = records.column("partition").take(take).to_numpy(zero_copy_only=False)
        cols = {f: records.column(f"s_{f}").take(take).to_numpy(zero_copy_only=False)
                for f in ATTEMPT_FIELDS + ("snapshot",)}
        marker = np.char.lower(cols["snapshot"].astype(str))
        new_run = np.ones(snap.size, dtype=bool)
        same = (topic[1:] == topic[:-1]) & (part[1:] == part[:-1]) & ~np.isin(marker[1:], FIRST + LAST_OF_TABLE)
        for f in ATTEMPT_FIELDS:
            same &= cols[f][1:] == cols[f][:-1]
        new_run[1:] = ~same
        # the first change of each partition in this read, by record index (a snapshot read after it is an error)
        changed: dict[tuple, int] = {}
        if changes.size:
            ct = records.column("topic").take(pa.array(changes)).to_pylist()
            cp = records.column("partition").take(pa.array(changes)).to_pylist()
            for tp, i in zip(zip(ct, cp), changes.tolist()):
                changed.setdefault(tp, i)
        starts = np.flatnonzero(new_run).tolist() + [snap.size]
        offsets = records.column("offset")
        for a, b in zip(starts, starts[1:]):
            t, p = self.topics[str(topic[a])], int(part[a])
            c = changed.get((t.topic, p))
            if c is not None and int(snap[b - 1]) > c:
                a = a + int(np.searchsorted(snap[a:b], c))   # the first read after the change
                b = a + 1
                self.snapshot.streamed(t.topic, p)
            at = where(t.topic, p, offsets[int(snap[a])].as_py())
            source = {f: as_number(cols[f][a]) for f in ATTEMPT_FIELDS}
            source["snapshot"] = cols["snapshot"][a]
            rows = self.snapshot.accept(t.topic, t.table, p, source, at, t.partitions, count=b - a)
            if rows is not None:
                image, lo = images.of(t.topic, "a")
                rows.extend(zip(repeat(1), repeat(image), (snap[a:b] - lo).tolist()))
        if self.snapshot.superseded:
            self.skipped["repeated_snapshot"] = self.snapshot.superseded

    def _changes(self, records: pa.Table, changes: np.ndarray, images: Images) -> None:
        """Each change (record indices ``changes``: the data topics' events that are not
        snapshot reads) into its pending transaction (made at its first record): a second copy
        of a (transaction, ``total_order``) or an event of a published transaction counted as
        a duplicate; the rest as weighted rows (c/r +after, d -before, u -before +after)."""
        if not changes.size:
            return
        take = pa.array(changes)
        col = {c: records.column(c).take(take).to_pylist() for c in ("topic", "partition", "offset", "op",
                                                                     "total_order")}
        keys = transaction_keys(records.column("tx_id").take(take)).to_pylist()
        ms = record_ms(records, take)
        for tp in set(zip(col["topic"], col["partition"])):
            self.snapshot.streamed(*tp)
        tables = {topic: t.table for topic, t in self.topics.items()}
        pending = self.pending
        rows_of = zip(keys, col["topic"], col["partition"], col["offset"], col["op"], col["total_order"],
                      changes.tolist(), ms)
        for key, topic, p, offset, op, order, i, ms_i in rows_of:
            tx = pending.get(key)
            if tx is None:
                tx = self._pending_tx(key, ms_i or 0)
                if tx is None:
                    continue
            if order in tx.seen:
                self.skipped["duplicates"] += 1
                continue
            tx.seen.add(order)
            tx.saw((topic, p), offset)
            table = tables[topic]
            tx.counts[table] = tx.counts.get(table, 0) + 1
            weighted(tx.rows.setdefault(table, []), images, topic, op, i)

    def _tx_events(self, records: pa.Table, tx: np.ndarray) -> None:
        """The transaction topic's BEGIN and END events (record indices ``tx``), in order: a
        transaction is queued at its first, its END records the counts it must have; a second
        END, or a transaction the resume point already holds, is a duplicate."""
        if not tx.size:
            return
        take = pa.array(tx)
        col = {c: records.column(c).take(take).to_pylist() for c in ("partition", "offset", "t_status", "t_id",
                                                                     "t_ts_ms", "t_collections")}
        keys = transaction_keys(records.column("t_id").take(take)).to_pylist()
        ms = record_ms(records, take)
        self.tx_records += tx.size
        rows_of = zip(keys, col["partition"], col["offset"], col["t_status"], col["t_id"], col["t_ts_ms"],
                      col["t_collections"], ms)
        for key, p, offset, status, tx_id, ts_ms, collections, ms_i in rows_of:
            if status is None:
                raise not_tx_metadata(where(self.tx_topic, p, offset))
            upper = status.upper()
            t = self.pending.get(key) or self._pending_tx(key, ms_i or 0)
            if t is None:
                continue
            if not t.queued:
                t.queued = True
                self.order.append(key)
            t.saw((self.tx_topic, p), offset)
            if upper == "BEGIN":
                continue
            if upper != "END":
                raise SourceError(f"{where(self.tx_topic, p, offset)}: transaction metadata with status "
                                  f"{status!r}; expected BEGIN or END")
            if t.end_offset is not None:
                self.skipped["duplicates"] += 1
                continue
            t.end_offset, t.end_ts_ms = offset, int(ts_ms or ms_i or 0)
            t.end_counts, t.end_lsn = loads_collections(collections), end_lsn(tx_id)
            if self.base_lsn is not None and t.end_lsn is not None and t.end_lsn <= self.base_lsn:
                # a transaction the resume point already holds, sent again by a restarted connector
                self.skipped["duplicates"] += 1 + sum(t.counts.values())
                self.order.remove(key)
                del self.pending[key]
                self.published.add(key)

    def _pending_tx(self, tx_id: str, first_ms: int) -> PendingTx | None:
        """The transaction ``tx_id`` seen in part (made at its first record), or None when it
        is already published (a record sent again: counted as a duplicate). A transaction is
        pending or published, never both: the published set is asked once per transaction."""
        tx = self.pending.get(tx_id)
        if tx is None:
            if tx_id in self.published:
                self.skipped["duplicates"] += 1
                return None
            tx = self.pending[tx_id] = PendingTx(tx_id, first_ms)
        return tx

    def complete(self, tx: PendingTx) -> bool:
        """Whether every table's events of ``tx`` arrived, as its END counts them; a
        SourceError when more arrived than it counts."""
        if tx.end_counts is None:
            return False
        for topic in self.topics.values():
            want, have = tx.end_counts.get(topic.table, 0), tx.counts.get(topic.table, 0)
            if have > want:
                raise SourceError(f"{where(self.tx_topic, 0, tx.end_offset)}: END of transaction {tx.id} counts "
                                  f"{want} events of {topic.table}, but {have} distinct events (total_order) of it "
                                  f"arrived")
            if have < want:
                return False
        return True

    def snapshot_waiting(self) -> list[str]:
        """:func:`snapshot_waiting` (``over`` once a transaction was read)."""
        return snapshot_waiting(self.snapshot, self.topics, self.tx_records > 0)

    def snapshot_complete(self) -> bool:
        """Every table's snapshot is read (:meth:`.snapshot.SnapshotAssembly.table_complete`)."""
        return not self.snapshot_waiting()

    def snapshot_evident(self) -> bool:
        """The snapshot is read, and each table's own partitions prove it
        (:meth:`.snapshot.SnapshotAssembly.table_evident`): it may be published between
        two reads of a refresh, so that a backlog's transactions after it do not wait for the
        refresh's end."""
        return self.snapshot_complete() and all(
            self.snapshot.table_evident(t.table, t.topic, t.partitions, absent=t.absent)
            for t in self.topics.values())

    def publish(self, snapshot: bool = False) -> list[Published]:
        """Publish the snapshot once complete (``snapshot``: at the end of a refresh, every
        partition read to its high watermark; else when each table's own partitions prove it,
        :meth:`snapshot_evident`), then every complete transaction at the head of the END
        order."""
        out = []
        if not self.snapshot.published:
            if not (self.snapshot_complete() if snapshot else self.snapshot_evident()):
                return out
            rows, counts = self.snapshot.take()
            out.append(Published(TxInfo(SNAPSHOT_POSITION, "snapshot", 0, counts, self.tx_topic, -1, True), rows))
            self.last = SNAPSHOT_POSITION
        while self.order:
            tx = self.pending[self.order[0]]
            if not self.complete(tx):
                break
            self.order.popleft()
            del self.pending[tx.id]
            self.published.add(tx.id)
            # END offsets grow in the topic's order; an END that came late (after a later
            # transaction's END) takes the position after the previous one: positions grow
            position = max(tx.end_offset + 1, self.last + 1)
            out.append(Published(TxInfo(position, tx.id, tx.end_ts_ms, tx.counts, self.tx_topic, tx.end_offset),
                                 tx.rows, (tx.id, tx.end_lsn, tx.first, tx.last)))
            self.last = position
        return out

    def stalled(self, now_ms: int | None = None) -> list[dict]:
        """The transaction at the head of the log that is not complete yet, which holds back
        every later one: ``[{id, age_s, end_seen, missing: {table: events}, waiting_behind}]``
        (empty when nothing waits); ``age_s`` counts from its first record's Kafka timestamp,
        ``missing`` (once its END arrived) the events still to come per table,
        ``waiting_behind`` the transactions queued after it."""
        now_ms = now_ms or int(time.time() * 1000)
        if not self.order:
            return []
        tx = self.pending[self.order[0]]
        missing = {}
        if tx.end_counts is not None:
            missing = {t.table: tx.end_counts.get(t.table, 0) - tx.counts.get(t.table, 0)
                       for t in self.topics.values() if tx.end_counts.get(t.table, 0) > tx.counts.get(t.table, 0)}
        return [{"id": tx.id, "age_s": round((now_ms - tx.first_seen_ms) / 1000.0, 1),
                 "end_seen": tx.end_counts is not None, "missing": missing,
                 "waiting_behind": len(self.order) - 1}]
