"""Debezium change events on Kafka topics, read as changelogs cut at whole upstream
transactions (``format: kafka``).

A Kafka Connect worker running Debezium (e.g. its PostgreSQL connector) writes each captured
table's change events to a topic of its own (``<topic.prefix>.<schema>.<table>``), and with
``provide.transaction.metadata=true`` a BEGIN and an END event per transaction to the
transaction topic (``<topic.prefix>.transaction``). Values are Debezium's JSON (Kafka Connect's
``JsonConverter``), with the ``{"schema", "payload"}`` envelope (``schemas.enable=true``: the
columns and their types come from it) or without it (then ``meta.consistent_stream.columns``
declares them).

Config (a dbt source's ``meta.consistent_stream``)::

    format: kafka
    bootstrap_servers: 127.0.0.1:9092     # required
    topic: pgb.public.pgbench_accounts    # required: the table's topic
    table: public.pgbench_accounts        # default: the topic's last two parts
    transaction_topic: pgb.transaction    # default: <first part of topic>.transaction
    consistency: transaction              # or per_topic (see below)
    columns: {aid: int, abalance: int}    # only without the schema envelope
    primary_key: [aid]

**The consistency rule** (``consistency: transaction``; the idea of seed 001, TiFlink's
transaction-consistent checkpoints, with Debezium's transaction metadata in place of TiDB's
timestamps). Transactions enter the log in the order of the transaction topic (one
partition): Debezium emits a transaction whole when the database commits it, so its BEGIN
and END are adjacent there and their order is the commit order; a transaction whose END is
missing holds back every transaction after its BEGIN. A transaction's position
is the offset of its END event + 1 (or the previous position + 1 when its END came late, after
a later transaction's); the connector's snapshot (``op: r`` events) is position 0.
A position is published only when the transaction is *complete*: for every table of the
reader, as many distinct events of it (``transaction.total_order``) have arrived, in whatever
partitions, as the END's ``data_collections`` count; and every earlier END's transaction is
complete. So a cut never splits a transaction, across tables or partitions, and never lets a
later transaction in before an earlier one. All tables of one transaction topic share one
clock (:attr:`KafkaSource.clock`) and one process-wide :class:`KafkaReader`.

``consistency: per_topic`` (a connector without transaction metadata, or the foil of the
tests): each topic is its own clock, one event per position (offset + 1 of its record; the
topic must have one partition). A version may then hold half of an upstream transaction, or
one table's side of it without the other's: what Flink and Spark's own Kafka source give.

**Delivery as it happens.** Kafka Connect is at-least-once: after a crash the connector
re-sends what it had not recorded as sent. A data event is identified by (transaction,
``total_order``) and a transaction by its id: a second copy is dropped (counted as a
duplicate), never applied twice (a transaction's id is :func:`transaction_keys` of Debezium's:
the PostgreSQL connector's ids carry each message's own LSN); in per_topic mode a change is
identified by its ``source.lsn``. Tombstones (the null value after a delete) and events that are neither
changes nor transaction metadata (heartbeats, schema changes) are skipped and counted. The
counts go to the log at every refresh (:attr:`KafkaReader.skipped`).

**The connector's snapshot** (:mod:`.kafka_snapshot`): its events are assembled whatever the
number of partitions of the data topics and however they interleave; a snapshot that starts
again (a connector that crashed during its initial snapshot and repeats it) replaces the
partial attempt (counted as ``repeated_snapshot``). It is published, as position 0, at the
end of a refresh that read every partition to a high watermark taken after its last markers
were read, or earlier when each table's own partitions prove it (a change read in each); until
then the source has no position, and a run says what the snapshot waits for
(:meth:`KafkaReader.snapshot_waiting`).

Reading: each refresh reads every partition from where the last one stopped to its high
watermark (:mod:`.kafka_log`): a refresh of at most ``driver_read_records`` records
(:data:`DRIVER_READ_RECORDS`) with the driver's Kafka client, parsed by DuckDB on the driver, a
larger one through Spark's Kafka source, parsed on the executors; both parse the values into
the same columns (:mod:`.debezium_columns`: the bookkeeping fields as columns, each table's
row images typed by its schema); the driver walks those columns to assemble transactions,
takes the images by index, and keeps the complete transactions as Arrow chunks (:class:`~.debezium.TransactionLog`),
at most :data:`IMAGE_BUDGET` bytes of them: past it the oldest chunks keep only each
transaction's net row count per table, so that the driver's memory does not grow with the
topics' history (the transaction bookkeeping aside: a few bytes per transaction,
:mod:`.packed`). What needs their changes (the table as of a position, changes across them)
reads the Parquet copies the reader wrote of them to the driver's disk as it dropped them
(:mod:`.chunk_files`; with a local Spark session, whose executors read that disk), or, with a
cluster, is computed by Spark from the topics again (:mod:`.kafka_table`). A rebuild on the
executors always computes its tables there.
A value the parse refuses is read again raw and named by the driver's parser
(:meth:`KafkaReader.diagnose`). A reader starts at the topics' start, or at
a *resume point* (:meth:`KafkaReader.resume_point`, recorded in every target commit as
``cut_offsets``): a run reads on from its target's last commit (:meth:`KafkaSource.resume`),
and what needs the table as of a position (a first batch, a rebuild, ``verify``) reads from the
start with a reader of its own. Offsets retention deleted before they were read give a
SourceError naming the partition and offset.

Errors (``SourceError``, naming topic, partition and offset): malformed JSON, an event of
another table than the source's, a change event without a ``transaction`` block in
transaction mode (the connector lacks ``provide.transaction.metadata``), an update or delete
without a ``before`` image (the table needs ``REPLICA IDENTITY FULL``), a value that does not
fit its column's type, an END whose counts contradict the events, a missing topic,
retention-deleted offsets. A transaction whose END never arrives holds back every later one:
nothing partial is ever committed, and :meth:`KafkaReader.stalled` says which transaction
waits, since when, and for what.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import re
import threading
import time
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConfigError, SourceError
from .chunk_files import ChunkFiles
from .debezium import DebeziumSource, TransactionLog
from .debezium_columns import (as_number, envelope_prefix, images, loads_collections,
                               local_projection, projection)
from .debezium_events import POS, WEIGHT, chunk_schema, rows_to_arrow, unwrap
from .kafka_log import MAX_RECORDS, KafkaLog, lost_offset
from .kafka_schema import column_type, converters, schema_from_envelope
from .kafka_snapshot import ATTEMPT_FIELDS, FIRST, LAST_OF_TABLE, SnapshotAssembly
from .landing import ColumnSchema, TableSchema
from .landing_index import TxInfo, TxLog
from .packed import PackedInts
from .spec import INITIAL
from .tx_ids import TxIdSet, TxIds

log = logging.getLogger(__name__)

SNAPSHOT_POSITION = 0
IMAGE_BUDGET = 128 << 20
"""Bytes of assembled changes (Arrow) a reader keeps on the driver; past it the oldest are
dropped and read again by Spark from the topics where needed (:mod:`.kafka_table`)."""
DRIVER_READ_RECORDS = 1_000_000
"""Default ``driver_read_records``: a refresh that reads at most this many Kafka records
(every partition's backlog together) reads them with the driver's Kafka client and parses
them with DuckDB on the driver (:meth:`.kafka_log.KafkaLog.fetch`,
:func:`.debezium_columns.local_projection`); a larger one reads and parses them where Spark
runs, on the executors (:meth:`.kafka_log.KafkaLog.read`, :func:`.debezium_columns.projection`).
Both give the same columns; the driver's way has no Spark job and no warm-up of Spark's
Kafka source, the executors' scales with the cluster."""
LEARN_FROM = 64
"""Records at the start of each partition read raw to learn a topic's schema from its envelope."""


_PG_TX_ID = re.compile(r"^(\d+):(\d+)$")


def transaction_keys(ids: pa.Array) -> pa.Array:
    """What identifies a transaction across its BEGIN, END and change events, for each of
    ``ids`` (strings; nulls stay null): Debezium's PostgreSQL connector writes ids
    ``"<xid>:<LSN>"`` whose LSN is each message's own (the first change's at BEGIN, each
    change's, the commit's at END), so its key is the xid; other connectors' ids (MySQL's
    GTIDs, ...) are the same on every message and are kept whole."""
    return pc.replace_substring_regex(pc.cast(ids, pa.string()), pattern=r"^([0-9]+):[0-9]+$", replacement=r"\1")


def end_lsn(tx_id) -> int | None:
    """The LSN in a Debezium PostgreSQL END event's id (the commit's end LSN: it grows with
    commit order), None for other connectors' ids."""
    m = _PG_TX_ID.match(str(tx_id))
    return int(m.group(2)) if m else None


def _split(ranges: dict, limit: int) -> list[dict]:
    """``ranges`` ((topic, partition) -> [start, end)) as successive reads of at most about
    ``limit`` records each: every partition advances in each read, in proportion to its
    backlog, so the transaction topic and the data topics move together."""
    total = sum(end - start for start, end in ranges.values())
    if total <= limit:
        return [ranges]
    steps = -(-total // limit)
    out = []
    for i in range(steps):
        part = {}
        for tp, (start, end) in ranges.items():
            n = end - start
            lo, hi = start + n * i // steps, start + n * (i + 1) // steps
            if hi > lo:
                part[tp] = (lo, hi)
        out.append(part)
    return out


@contextlib.contextmanager
def _no_cyclic_gc():
    """Pause Python's cyclic garbage collector for the block. Parsing a read's records makes
    millions of small containers (row dicts, tuples, pending transactions) and no reference
    cycles: each is freed by its reference count, but their allocations keep triggering
    collections that walk every live container, the rows kept so far included: a large part
    of the parsing time (the README's catch-up section)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _release_freed() -> None:
    """Give back to the OS what a read freed: Arrow's allocator (mimalloc) and glibc's malloc
    keep freed memory for later allocations (glibc's heap cannot shrink below a live block,
    and its mmap threshold rises to the size of the large blocks a read frees), and the read
    ahead allocates anew, so without this the driver's RSS grows read by read with memory it
    does not use (the distributed scheduler of Dask trims for the same reason)."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()


def _where(topic: str, partition: int, offset: int) -> str:
    return f"Kafka topic {topic} partition {partition} offset {offset}"


_PARSE_ERRORS = ("MALFORMED_RECORD", "CAST_INVALID_INPUT", "NUMERIC_VALUE_OUT_OF_RANGE", "CAST_OVERFLOW",
                 "INVALID_BASE64", "Malformed")
"""What Spark's errors say when the executors could not parse a value (:meth:`KafkaReader.diagnose`)."""


def _flags(mask) -> np.ndarray:
    """A boolean Arrow array (nulls false) as NumPy."""
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def _first(mask: np.ndarray) -> int | None:
    """The index of the first true of ``mask``, None when none is."""
    i = int(np.argmax(mask)) if mask.size else 0
    return i if mask.size and mask[i] else None


def _record_ms(records: pa.Table, take: pa.Array) -> list:
    """The Kafka timestamps of ``records``' rows at ``take`` in milliseconds (None where a
    record has none)."""
    return pc.divide(pc.cast(records.column("timestamp").take(take), pa.int64()), 1000).to_pylist()


def _weighted(rows: list, images: "_Images", topic: str, op: str, i: int) -> list:
    """``rows`` with the change of record ``i`` of ``topic`` as weighted rows (weight, image
    table, row index): c/r +after, d -before, u -before +after."""
    if op == "u" or op == "d":
        image, lo = images.of(topic, "b")
        rows.append((-1, image, i - lo))
    if op != "d":
        image, lo = images.of(topic, "a")
        rows.append((1, image, i - lo))
    return rows


def _place(records: pa.Table, i: int) -> tuple[str, int, int]:
    """Record ``i``'s topic, partition and offset."""
    return tuple(records.column(c)[i].as_py() for c in ("topic", "partition", "offset"))


def _not_tx_metadata(where: str) -> SourceError:
    return SourceError(f"{where}: not Debezium transaction metadata (no 'status'); is "
                       f"meta.consistent_stream.transaction_topic the connector's <topic.prefix>.transaction?")


def _ranges_text(part: dict) -> str:
    return ", ".join(f"{t}[{p}] {a}..{b - 1}" for (t, p), (a, b) in sorted(part.items()))


class _Images:
    """The typed before/after images of one read's records (:func:`.debezium_columns.images`),
    per data topic and side, made at first use over the topic's rows alone (the records are
    ordered by topic): :meth:`of` gives the table and the record index of its first row."""

    def __init__(self, reader: "KafkaReader", records: pa.Table, typed: dict):
        self.reader, self.records, self.typed = reader, records, typed
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
                self.reader.diagnose(part, str(e))
            got = self._made[(topic, side)] = (table, lo)
        return got


def _weighted_table(ts: TableSchema, blocks: list) -> pa.Table:
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


@dataclass
class _Topic:
    """One data topic of a reader: its table, schema (None until known) and converters."""
    topic: str
    table: str
    primary_key: tuple
    schema: TableSchema | None = None
    convert: dict = field(default_factory=dict)
    absent: bool = False        # its topic did not exist at the last refresh
    partitions: int = 0         # partitions of its topic at the last refresh


@dataclass
class _PendingTx:
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


class _Extents:
    """The published transactions a resume point may still need (:meth:`KafkaReader.resume_point`),
    as columns: position, id (:class:`.tx_ids.TxIds`), the END's commit LSN (-1: not a
    PostgreSQL id), and the first and last offsets of the transaction's records in each
    partition it has records in, as sparse entries (a transaction's entries one after another:
    partition index into ``partitions``, first offset, last offset less first (``span``: small,
    where the offsets of one block of entries are far apart); ``ends``: the entries up to and
    including each transaction's). A catch-up publishes millions of transactions before its
    first cut is asked for, each with records in a few of the partitions read: every column a
    :class:`.packed.PackedInts` (a byte or a few a value), not two dicts of boxed offsets nor a
    column per partition; the questions a resume point asks are answered block by block."""

    def __init__(self):
        self.position, self.lsn, self.ends = PackedInts(), PackedInts(), PackedInts()
        self.ids = TxIds()
        self.partitions: list[tuple] = []
        self._index: dict[tuple, int] = {}
        self.part, self.first, self.span = PackedInts(), PackedInts(), PackedInts()
        self._n = self._entries = 0   # transactions and entries appended

    def append(self, position: int, tx_id: str, lsn: int | None, first: dict, last: dict) -> None:
        self.position.append(position)
        self.lsn.append(-1 if lsn is None else lsn)
        self.ids.append(tx_id)
        part, firsts, span = self.part.append, self.first.append, self.span.append
        for tp, f in first.items():
            i = self._index.get(tp)
            if i is None:
                i = self._index[tp] = len(self.partitions)
                self.partitions.append(tp)
            part(i)
            firsts(f)
            span(last[tp] - f)
        self._entries += len(first)
        self.ends.append(self._entries)
        self._n += 1
        if not self._n & 1023:
            self.settle()

    def settle(self) -> None:
        """Seal every column's whole blocks (:meth:`.packed.PackedInts.settle`)."""
        for c in (self.position, self.lsn, self.ends, self.part, self.first, self.span, self.ids):
            c.settle()

    def split(self, position: int) -> tuple[int, int]:
        """``(k, e)``: the transactions at or before ``position`` are the first ``k`` (positions
        grow), their entries the first ``e``."""
        k = self.position.searchsorted(position)
        return k, (self.ends[k - 1] if k else 0)

    def first_offsets(self, e: int) -> dict:
        """``(topic, partition)`` -> the first offset of a record there of the transactions
        whose entries start at entry ``e``; partitions none of them has records in are left out."""
        low = np.full(len(self.partitions), np.iinfo(np.int64).max, np.int64)
        for (i, part), (_, first) in zip(self.part.blocks(e), self.first.blocks(e)):
            np.minimum.at(low, part, first)
        return {tp: int(low[i]) for i, tp in enumerate(self.partitions) if low[i] != np.iinfo(np.int64).max}

    def read_again(self, k: int, e: int, offsets: dict) -> np.ndarray:
        """The indices (ascending) of the first ``k`` transactions (entries ``[0, e)``) with a
        record at or after ``offsets`` (``(topic, partition)`` -> offset) in its partition:
        what a read from those offsets meets again. One comparison per entry, block by block."""
        limit = np.full(len(self.partitions), np.iinfo(np.int64).max, np.int64)
        for tp, o in offsets.items():
            if tp in self._index:
                limit[self._index[tp]] = o
        hits = [i + np.flatnonzero(first + span >= limit[part])
                for (i, part), (_, first), (_, span) in zip(self.part.blocks(0, e), self.first.blocks(0, e),
                                                             self.span.blocks(0, e))]
        hit = np.concatenate(hits) if hits else np.zeros(0, np.int64)
        if not hit.size:
            return hit
        return np.unique(np.searchsorted(self.ends.numpy(0, k), hit, side="right"))

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the transactions where ``mask`` (bool, one per transaction) is true."""
        counts = np.diff(self.ends.numpy(), prepend=0)   # entries per transaction
        entries = np.repeat(mask, counts)
        self.position, self.lsn = self.position.compress(mask), self.lsn.compress(mask)
        self.ids = self.ids.compress(mask)
        self.ends = PackedInts(np.cumsum(counts[mask]))
        self.part, self.first, self.span = (c.compress(entries) for c in (self.part, self.first, self.span))
        self._n, self._entries = len(self.position), len(self.part)


class KafkaReader(TransactionLog):
    """The Debezium change events of the data topics of one clock, assembled into complete
    transactions (module docstring). ``key``: (bootstrap servers, transaction topic or the
    one topic of a per_topic clock, consistency). Use :func:`reader_for`.

    ``skipped``: events not applied, by reason (``duplicates``, ``tombstones``, ``other``:
    heartbeats, schema changes); ``read_events``: records read in all."""

    copy_dropped = True
    """Copy the chunks dropped from memory to the driver's disk where a local Spark session
    reads them (:meth:`_chunk_files`); false: read them again from the topics, as with a
    cluster."""

    def __init__(self, bootstrap: str, tx_topic: str, consistency: str):
        super().__init__(f"kafka://{bootstrap}/{tx_topic}")
        self.bootstrap, self.tx_topic, self.consistency = bootstrap, tx_topic, consistency
        self.log = KafkaLog(bootstrap)
        self._topics: dict[str, _Topic] = {}
        self._declared: dict[str, tuple] = {}     # topic -> (table, primary key, declared columns)
        self._base: dict | None = None            # the resume point this reader starts at (resume_at)
        self.image_budget = IMAGE_BUDGET
        self.driver_read_records = DRIVER_READ_RECORDS
        self._files: ChunkFiles | None = None
        self._on_driver = True
        self._reset()

    def _reset(self) -> None:
        if self._files is not None:
            _RETIRED.append(self._files)   # a lazy frame of the state before may still read them
        self._files, self._copied = None, 0
        self._chunks, self._txs = [], TxLog()
        self._image_bytes, self.floor = 0, INITIAL
        self._schemas = {}
        self._envelopes: dict[str, str | None] = {}   # topic -> its values' envelope text (debezium_columns)
        self._topics = {t: _Topic(t, table, pk) for t, (table, pk, _) in self._declared.items()}
        for t, (table, pk, cols) in self._declared.items():
            if cols:
                self._topics[t].schema = TableSchema(table, tuple(ColumnSchema(c, ty) for c, ty in cols), pk)
                self._schemas[table] = self._topics[t].schema
        self._next: dict[tuple[str, int], int] = {}
        self._pending: dict[str, _PendingTx] = {}
        self._order: deque[str] = deque()          # transaction topic order, not yet published
        self._published = TxIdSet()
        self._seen_lsn: dict[str, set] = {}        # per_topic: changes applied, by topic
        self._last = INITIAL
        self._snapshot = SnapshotAssembly()
        self._tx_records = 0
        self._chunk_seq = 0
        self.skipped = {"duplicates": 0, "tombstones": 0, "other": 0}
        self.read_events = 0
        self._recent = _Extents()                  # published transactions not yet behind a cut asked for
        self._base_lsn: int | None = None
        self._row_totals: dict[str, int] = {}    # table -> rows at the newest position
        base = self._base
        if base is not None and set(self._declared) <= set(base.get("tables", {})):
            self._apply_base(base)
        elif base is not None:
            log.info("%s: a table was added that the resume point does not hold: reading every topic from its "
                     "start", self.location)
            self._base = None

    def _apply_base(self, base: dict) -> None:
        """Start at a resume point (:meth:`resume_point`) instead of the topics' start."""
        p = int(base["position"])
        for topic, parts in base["offsets"].items():
            for part, offset in parts.items():
                self._next[(topic, int(part))] = int(offset)
        for topic, d in base["tables"].items():
            t = self._topics.get(topic)
            if t is None:
                continue
            if t.schema is None and d.get("schema"):
                ts = TableSchema.from_dict(d["schema"])
                t.schema, t.convert = ts, converters(ts)
                self._schemas[t.table] = ts
            self._row_totals[t.table] = int(d.get("rows", 0))
        self._published = TxIdSet(base.get("included", ()))
        self._base_lsn = base.get("end_lsn")
        self._last = p
        self._snapshot.take()   # the resume point is past the snapshot
        self._txs = TxLog([TxInfo(p, "resume point", int(base.get("ts_ms", 0)), {}, self.tx_topic, -1, p == 0)])

    # -- tables ---------------------------------------------------------------------------------
    def add_table(self, topic: str, table: str, primary_key: tuple, columns: dict) -> None:
        """Read ``topic`` (the change events of ``table``) too; ``columns`` (name -> type of
        :mod:`.landing`) when the values have no schema envelope. A table added after the reader
        read anything makes it read every topic again from the start, so that no published
        transaction lacks the new table's events."""
        spec = (table, tuple(primary_key), tuple(sorted(columns.items())) if columns else ())
        if self._declared.get(topic) == spec:
            return   # read already (asked without the lock, so as not to wait for a refresh)
        with self._lock:
            if self._declared.get(topic) == spec:
                return
            if self.consistency == "per_topic" and self._declared:
                raise ConfigError(f"{self.location}: a per_topic reader reads one topic")
            self._declared[topic] = spec
            self._reset()

    def schema(self, table: str) -> TableSchema:
        with self._lock:
            if table not in self._schemas:
                topic = next((t for t, d in self._declared.items() if d[0] == table), None)
                raise SourceError(f"Kafka topic {topic} ({table}) has no change event yet, so its columns are not "
                                  f"known: its values have no schema envelope to read them from until one arrives. "
                                  f"Declare them in meta.consistent_stream.columns (e.g. {{aid: int, "
                                  f"filler: string}}), or run the model once the connector has written the "
                                  f"table's snapshot")
            return self._schemas[table]

    def head_schema(self, table: str) -> TableSchema:
        """:meth:`schema`, learned when not known yet from the first records of the table's
        topic that this reader has not read (:meth:`_learn_schemas`), not by reading its
        backlog; a topic whose first records hold no change event is read whole
        (:meth:`refresh`). A schema once known stays: it is given without waiting for a
        refresh that runs meanwhile. Raises SourceError as :meth:`schema`."""
        known = self._schemas.get(table)
        if known is not None:
            return known
        with self._lock:
            if table not in self._schemas:
                topic = next(t for t, d in self._declared.items() if d[0] == table)
                ranges = self._unread(self._partitions(topic))
                if ranges:
                    self._learn_schemas(ranges)
            if table not in self._schemas:
                self.refresh()
            return self.schema(table)

    def latest_position(self) -> int:
        with self._lock:
            return self._last

    # -- reading --------------------------------------------------------------------------------
    def refresh(self) -> "KafkaReader":
        """Read what the topics gained since the last refresh and publish every transaction
        that became complete (module docstring). Raises SourceError."""
        with self._lock:
            try:
                self._refresh()
            except BaseException:
                self._reset()   # nothing half-read survives an error
                raise
            return self

    def _refresh(self) -> None:
        t0 = time.time()
        settled = self._snapshot.published or self._snapshot_complete()
        n, read = self._read_round()
        if not (settled or self._snapshot.published) and self._snapshot_complete() and \
                any(t.partitions > 1 for t in self._topics.values()):
            # the snapshot's last markers were read in this round: the rows the connector wrote
            # before them to other partitions are below high watermarks taken now
            m, more = self._read_round()
            n, read = n + m, read | more
        if self.consistency == "transaction" and not self._snapshot.published and self._snapshot_complete():
            out: dict = {}
            self._publish(out, snapshot=True)
            self._add_rows(out)
        if read:
            log.info("%s: read %d records of %d partitions in %.2fs; position %d; skipped %s; %d transactions "
                     "waiting", self.location, n, len(read), time.time() - t0, self._last, self.skipped,
                     len(self._order))

    def _read_round(self) -> tuple[int, set]:
        """Read every partition from where the last read stopped to its high watermark (taken
        now); returns the records read and the partitions that had any."""
        topics = list(self._declared)
        if self.consistency == "transaction":
            # Debezium creates the transaction topic at the first transaction after its snapshot
            tx_parts = (self.log.partitions(self.tx_topic, key="meta.consistent_stream.transaction_topic")
                        if self.tx_topic in self.log.topics() else [])
            if len(tx_parts) > 1:
                raise SourceError(f"Kafka topic {self.tx_topic} (the transaction topic) has {len(tx_parts)} "
                                  f"partitions; Debezium writes transaction metadata to one partition, whose order "
                                  f"is the commit order")
            parts = tx_parts + [p for t in topics for p in self._partitions(t)]
        else:
            parts = [p for t in topics for p in self._partitions(t)]
            if len(parts) != 1:
                raise SourceError(f"Kafka topic {topics[0]} has {len(parts)} partitions; consistency: per_topic reads "
                                  f"a topic of one partition (its offsets are the positions)")
        ranges = self._unread(parts)
        if not ranges:
            return 0, set()
        self._learn_schemas(ranges)
        total = sum(b - a for a, b in ranges.values())
        self._on_driver = total <= self.driver_read_records
        if not self._on_driver:
            log.info("%s: %d records to read (more than driver_read_records, %d): read and parsed where Spark runs",
                     self.location, total, self.driver_read_records)
        parts = _split(ranges, MAX_RECORDS)
        n = 0
        # a backlog's reads are pipelined: the next part is read (by librdkafka's and DuckDB's
        # threads, or Spark's) while this thread applies the one it has
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-read") as pool:
            ahead = pool.submit(self._read_part, parts[0])
            for i, part in enumerate(parts):
                records, typed = ahead.result()
                if i + 1 < len(parts):
                    ahead = pool.submit(self._read_part, parts[i + 1])
                records, typed = self._with_schemas(part, records, typed)
                self._apply(records, typed)
                n += records.num_rows
                del records, typed
                _release_freed()
                for tp, (_, end) in part.items():
                    self._next[tp] = end
        return n, set(ranges)

    def _unread(self, parts: list) -> dict:
        """What ``parts`` (partitions with their watermarks) hold that this reader has not
        read: (topic, partition) -> [start, high watermark), for those with any. SourceError
        naming partition and offset where retention removed records never read."""
        ranges = {}
        for p in parts:
            start = self._next.get((p.topic, p.partition), 0)
            if p.low > start:
                raise lost_offset(p.topic, p.partition, start, p.low)
            if p.high > start:
                ranges[(p.topic, p.partition)] = (start, p.high)
        return ranges

    def _partitions(self, topic: str) -> list:
        """The partitions of a data topic. Debezium creates a table's topic at its first
        event: a missing topic is an empty table when its columns are declared (the source's
        ``columns``), else a SourceError saying so."""
        t = self._topics[topic]
        if t.schema is not None and self._declared[topic][2] and topic not in self.log.topics():
            if not t.absent:
                log.info("%s: Kafka topic %s does not exist yet: %s is taken as empty until Debezium writes its "
                         "first event", self.location, topic, t.table)
                t.absent = True
            return []
        t.absent = False
        try:
            parts = self.log.partitions(topic)
        except SourceError as e:
            raise SourceError(f"{e}. An empty table has no topic until its first change: declare its columns in "
                              f"meta.consistent_stream.columns to read it as empty until then") from None
        t.partitions = len(parts)
        return parts

    def _read_part(self, part: dict) -> tuple[pa.Table, dict]:
        """The records of ``part`` parsed into :mod:`.debezium_columns`' columns, on the driver
        or on the executors (:data:`DRIVER_READ_RECORDS`), and the data topics whose images
        they hold typed (topic -> (index, schema)). A value that fails the parse makes
        :meth:`diagnose` name it."""
        data = [(t.topic, t.table, t.schema) for t in self._topics.values()]
        typed = {topic: (i, ts) for i, (topic, _, ts) in enumerate(data) if ts is not None}
        tx = self.tx_topic if self.consistency == "transaction" else None
        try:
            if self._on_driver:
                records = self.log.fetch(part, {t: e.encode("utf-8") for t, e in self.envelopes.items()})
                return local_projection(data, tx)(records), typed
            return self.log.read(part, project=projection(data, tx, self.envelopes)), typed
        except SourceError:
            raise
        except Exception as e:   # Spark's MALFORMED_RECORD_IN_PARSING, CAST_INVALID_INPUT, DuckDB's Malformed JSON
            if not (isinstance(e, pa.ArrowInvalid) or any(m in str(e) for m in _PARSE_ERRORS)):
                raise
            self.diagnose(part, str(e))

    @property
    def envelopes(self) -> dict[str, str]:
        """Topic -> the envelope text its values start with (:func:`.debezium_columns.envelope_prefix`),
        for the topics that have one."""
        return {topic: e for topic, e in self._envelopes.items() if e is not None}

    def _learn_schemas(self, ranges: dict, first: int = LEARN_FROM) -> None:
        """Learn the schema of every data topic in ``ranges`` whose columns are not known yet
        from its first change event's envelope (:meth:`_learn_schema`), and the envelope text
        of every topic's values (:attr:`envelopes`), reading the first ``first`` records of
        each of its partitions as raw values (one small read), so that the first read of a
        backlog parses its images typed and only its payloads."""
        unknown = {t.topic: t for t in self._topics.values() if t.schema is None}
        heads = {tp: (a, min(b, a + first)) for tp, (a, b) in ranges.items()
                 if tp[0] in unknown or tp[0] not in self._envelopes}
        if not heads:
            return
        for topic, value, obj, where in self._raw_records(heads):
            if topic not in self._envelopes and type(obj) is dict and (type(obj.get("payload")) is dict
                                                                       or "schema" not in obj):
                self._envelopes[topic] = envelope_prefix(value, obj)   # None: values without one
            t = unknown.get(topic)
            if t is None or t.schema is not None:
                continue
            if type(obj) is dict and isinstance(obj.get("schema"), dict) and type(obj.get("payload")) is dict \
                    and obj["payload"].get("op") is not None:
                self._learn_schema(t, obj, where)

    def _raw_records(self, part: dict):
        """The records of ``part`` read raw and parsed on the driver (:meth:`_parse`, which
        names a malformed one): ``(topic, value bytes, value as JSON, where)`` in offset order."""
        raw = self.log.fetch(part)
        for topic, p, offset, value in zip(*(raw.column(c).to_pylist() for c in ("topic", "partition", "offset",
                                                                                  "value"))):
            where = _where(topic, p, offset)
            yield topic, value, self._parse(value, where), where

    def _with_schemas(self, part: dict, records: pa.Table, typed: dict) -> tuple[pa.Table, dict]:
        """``records`` again with every data topic's images typed: a topic whose schema was
        not known when they were read (its first change event came after the records
        :meth:`_learn_schemas` looked at) makes the part read once more."""
        events = pc.and_(pc.equal(records.column("kind"), "event"), pc.is_valid(records.column("op")))
        missing = [t for t in self._topics.values() if t.topic not in typed and pc.any(pc.and_(
            events, pc.equal(records.column("topic"), t.topic))).as_py()]
        for t in missing:
            if t.schema is None:
                mine = records.filter(pc.and_(events, pc.equal(records.column("topic"), t.topic)))
                p, offset = mine.column("partition")[0].as_py(), mine.column("offset")[0].as_py()
                (_, _, obj, where), = self._raw_records({(t.topic, p): (offset, offset + 1)})
                self._learn_schema(t, obj, where)
        return self._read_part(part) if missing else (records, typed)

    def _learn_schema(self, t: _Topic, obj, where: str) -> None:
        """``t``'s table schema from the envelope of the change event ``obj`` (parsed JSON)."""
        if not (type(obj) is dict and isinstance(obj.get("schema"), dict) and "payload" in obj):
            raise SourceError(f"{where}: the value has no schema envelope (value.converter.schemas.enable="
                              f"false), so the columns of {t.table} are unknown: declare them in "
                              f"meta.consistent_stream.columns")
        t.schema = schema_from_envelope(t.table, obj["schema"], t.primary_key, where)
        t.convert = converters(t.schema)
        self._schemas[t.table] = t.schema

    def diagnose(self, part: dict, cause: str) -> None:
        """Name the first record of ``part`` that cannot be read (read again as raw values and
        checked by the driver's parser: malformed JSON, not an event, a value that does not
        fit its column's type, columns that differ from the table's), as a SourceError naming
        topic, partition and offset; ``cause`` (the executors' error) when none is found."""
        for topic, _, obj, where in self._raw_records(part):
            obj = unwrap(obj)
            if obj is None:
                continue
            if topic == self.tx_topic and self.consistency == "transaction":
                if type(obj) is not dict or "status" not in obj:
                    raise _not_tx_metadata(where)
                continue
            if type(obj) is not dict:
                raise SourceError(f"{where}: expected a JSON object (a Debezium change event)")
            t = self._topics[topic]
            if obj.get("op") is None or t.schema is None:
                continue
            images = [(0, 1, self._converted(t, obj[side]), where) for side in ("before", "after")
                      if type(obj.get(side)) is dict]
            rows_to_arrow(t.schema, images, where)
        raise SourceError(f"{self.location}: Kafka records in offsets {_ranges_text(part)} could not be parsed, and "
                          f"no record among them was found wrong when read one by one: {cause[:2000]}")

    def _apply(self, records: pa.Table, typed: dict) -> None:
        """Apply ``records`` (:mod:`.debezium_columns`' columns), data topics first (their
        events wait for their transaction's END), then the transaction topic; publish what is
        complete. Python's cyclic garbage collector is paused meanwhile (:func:`_no_cyclic_gc`)."""
        with _no_cyclic_gc():
            self._apply_records(records, typed)

    def _apply_records(self, records: pa.Table, typed: dict) -> None:
        """Assemble ``records`` in passes over their columns (every record keeps its place in
        the order the per-record rules are defined in): the checks and counts that need no
        state (:meth:`_checked`); the connector's snapshot reads, a run of them in one partition
        and one attempt accepted at once (:meth:`_snapshot_reads`); each change into its
        pending transaction (:meth:`_changes`), or into its own position (per_topic); the
        transaction topic's BEGIN and END (:meth:`_tx_events`); then publish (:meth:`_publish`)
        and keep the published rows as one chunk (:meth:`_add_rows`)."""
        self.read_events += records.num_rows
        out: dict = {}
        if records.num_rows:
            data, tx = self._checked(records)
            images = _Images(self, records, typed)
            if self.consistency == "per_topic":
                self._per_topic_events(records, data, images, out)
            else:
                r_op = _flags(pc.and_(pc.equal(records.column("op"), "r"), pc.is_null(records.column("tx_id"))))
                changes = data[~r_op[data]]
                self._snapshot_reads(records, data[r_op[data]], changes, images)
                self._changes(records, changes, images)
                self._tx_events(records, tx)
        if self.consistency == "transaction":
            self._publish(out)
        self._add_rows(out)

    def _checked(self, records: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """The record indices of the data topics' change events and of the transaction topic's
        events, after the checks every record gets whatever came before it: tombstones and
        events without an ``op`` (heartbeats, schema changes) counted as skipped; a value that
        is not a JSON object, an image that does not fit the table, an unknown op, an event of
        another table, a missing before/after image, a change without a transaction block in
        transaction mode: a SourceError naming the first such record."""
        kind, topic, op = records.column("kind"), records.column("topic"), records.column("op")
        event = _flags(pc.equal(kind, "event"))
        tomb = _flags(pc.equal(kind, "tombstone"))
        self.skipped["tombstones"] += int(tomb.sum())
        wrong = np.flatnonzero(~event & ~tomb)
        if wrong.size:
            self._diagnose_record(records, int(wrong[0]), "not a JSON object")
        on_tx = (_flags(pc.equal(topic, self.tx_topic)) if self.consistency == "transaction"
                 else np.zeros(records.num_rows, dtype=bool))
        has_op = _flags(pc.is_valid(op))
        self.skipped["other"] += int((event & ~on_tx & ~has_op).sum())
        data = event & ~on_tx & has_op
        first = _first(data & ~_flags(records.column("images_ok")))
        if first is not None:
            self._diagnose_record(records, first, "an image's columns or values do not fit the table's")
        first = _first(data & ~_flags(pc.is_in(op, value_set=pa.array(["c", "u", "d", "r"]))))
        if first is not None:
            raise SourceError(f"{self._where_of(records, first)}: unknown op {op[first].as_py()!r}; expected c, u, "
                              f"d or r")
        first = _first(data & _flags(pc.is_valid(records.column("other_table"))))
        if first is not None:
            table = records.column("other_table")[first].as_py()
            raise SourceError(f"{self._where_of(records, first)}: event of table {table or None!r} in the topic of "
                              f"{self._topics[topic[first].as_py()].table} (meta.consistent_stream.table); an event "
                              f"of an unknown table, or the wrong topic")
        if self.consistency == "transaction":
            first = _first(data & _flags(pc.and_(pc.not_equal(op, "r"), pc.is_null(records.column("tx_id")))))
            if first is not None:
                raise SourceError(f"{self._where_of(records, first)}: change event (op {op[first].as_py()}) without "
                                  f"a 'transaction' block: the connector must run with "
                                  f"provide.transaction.metadata=true for consistency: transaction, or set "
                                  f"meta.consistent_stream.consistency: per_topic (each table cut on its own)")
        retracts = _flags(pc.is_in(op, value_set=pa.array(["u", "d"])))
        first = _first(data & retracts & ~_flags(records.column("has_before")))
        if first is not None:
            table = self._topics[topic[first].as_py()].table
            raise SourceError(f"{self._where_of(records, first)}: op {op[first].as_py()} on {table} without a "
                              f"'before' image: retractions need the whole old row; run ALTER TABLE {table} REPLICA "
                              f"IDENTITY FULL")
        first = _first(data & _flags(pc.not_equal(op, "d")) & ~_flags(records.column("has_after")))
        if first is not None:
            raise SourceError(f"{self._where_of(records, first)}: op {op[first].as_py()} on "
                              f"{self._topics[topic[first].as_py()].table} without an 'after' image")
        return np.flatnonzero(data), np.flatnonzero(event & on_tx)

    def _where_of(self, records: pa.Table, i: int) -> str:
        return _where(*_place(records, i))

    def _diagnose_record(self, records: pa.Table, i: int, cause: str) -> None:
        topic, part, offset = _place(records, i)
        self.diagnose({(topic, part): (offset, offset + 1)}, cause)

    def _snapshot_reads(self, records: pa.Table, snap: np.ndarray, changes: np.ndarray, images: "_Images") -> None:
        """The connector's snapshot reads (record indices ``snap``, in record order) into the
        snapshot assembly. A run of reads in one partition and one attempt whose markers after
        the first have no meaning to the assembly (``true``) is one :meth:`.kafka_snapshot.
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
            t, p = self._topics[str(topic[a])], int(part[a])
            c = changed.get((t.topic, p))
            if c is not None and int(snap[b - 1]) > c:
                a = a + int(np.searchsorted(snap[a:b], c))   # the first read after the change
                b = a + 1
                self._snapshot.streamed(t.topic, p)
            where = _where(t.topic, p, offsets[int(snap[a])].as_py())
            source = {f: as_number(cols[f][a]) for f in ATTEMPT_FIELDS}
            source["snapshot"] = cols["snapshot"][a]
            rows = self._snapshot.accept(t.topic, t.table, p, source, where, t.partitions, count=b - a)
            if rows is not None:
                image, lo = images.of(t.topic, "a")
                rows.extend(zip(repeat(1), repeat(image), (snap[a:b] - lo).tolist()))
        if self._snapshot.superseded:
            self.skipped["repeated_snapshot"] = self._snapshot.superseded

    def _changes(self, records: pa.Table, changes: np.ndarray, images: "_Images") -> None:
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
        ms = _record_ms(records, take)
        for tp in set(zip(col["topic"], col["partition"])):
            self._snapshot.streamed(*tp)
        tables = {topic: t.table for topic, t in self._topics.items()}
        pending = self._pending
        rows_of = zip(keys, col["topic"], col["partition"], col["offset"], col["op"], col["total_order"],
                      changes.tolist(), ms)
        for key, topic, p, offset, op, order, i, record_ms in rows_of:
            tx = pending.get(key)
            if tx is None:
                tx = self._pending_tx(key, record_ms or 0)
                if tx is None:
                    continue
            if order in tx.seen:
                self.skipped["duplicates"] += 1
                continue
            tx.seen.add(order)
            tx.saw((topic, p), offset)
            table = tables[topic]
            tx.counts[table] = tx.counts.get(table, 0) + 1
            _weighted(tx.rows.setdefault(table, []), images, topic, op, i)

    def _per_topic_events(self, records: pa.Table, data: np.ndarray, images: "_Images", out: dict) -> None:
        """The changes of a per_topic reader (record indices ``data``), each at its own
        position (offset + 1); a change whose ``source.lsn`` and row were applied before is a
        duplicate."""
        take = pa.array(data)
        col = {c: records.column(c).take(take).to_pylist() for c in ("topic", "offset", "op", "s_lsn", "s_txId",
                                                                     "s_ts_ms", "has_after")}
        rows_of = zip(col["topic"], col["offset"], col["op"], col["s_lsn"], col["s_txId"], col["s_ts_ms"],
                      col["has_after"], data.tolist())
        for topic, offset, op, lsn, tx_id, ts_ms, has_after, i in rows_of:
            t = self._topics[topic]
            position = offset + 1
            if op != "r" and lsn is not None:
                seen = self._seen_lsn.setdefault(t.topic, set())
                table, lo = images.of(t.topic, "a" if has_after else "b")
                key = (lsn, tx_id, str(table.slice(i - lo, 1).to_pylist()))
                if key in seen:
                    self.skipped["duplicates"] += 1
                    continue
                seen.add(key)
            out.setdefault(t.table, []).append((position, _weighted([], images, topic, op, i)))
            self._txs.append(TxInfo(position, f"{t.topic}@{offset}", int(ts_ms or 0), {t.table: 1}, t.topic,
                                    offset, op == "r"))
            self._last = position

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
        ms = _record_ms(records, take)
        self._tx_records += tx.size
        rows_of = zip(keys, col["partition"], col["offset"], col["t_status"], col["t_id"], col["t_ts_ms"],
                      col["t_collections"], ms)
        for key, p, offset, status, tx_id, ts_ms, collections, record_ms in rows_of:
            if status is None:
                raise _not_tx_metadata(_where(self.tx_topic, p, offset))
            upper = status.upper()
            t = self._pending.get(key) or self._pending_tx(key, record_ms or 0)
            if t is None:
                continue
            if not t.queued:
                t.queued = True
                self._order.append(key)
            t.saw((self.tx_topic, p), offset)
            if upper == "BEGIN":
                continue
            if upper != "END":
                raise SourceError(f"{_where(self.tx_topic, p, offset)}: transaction metadata with status "
                                  f"{status!r}; expected BEGIN or END")
            if t.end_offset is not None:
                self.skipped["duplicates"] += 1
                continue
            t.end_offset, t.end_ts_ms = offset, int(ts_ms or record_ms or 0)
            t.end_counts, t.end_lsn = loads_collections(collections), end_lsn(tx_id)
            if self._base_lsn is not None and t.end_lsn is not None and t.end_lsn <= self._base_lsn:
                # a transaction the resume point already holds, sent again by a restarted connector
                self.skipped["duplicates"] += 1 + sum(t.counts.values())
                self._order.remove(key)
                del self._pending[key]
                self._published.add(key)

    def _parse(self, value: bytes | None, where: str):
        if value is None:
            return None
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise SourceError(f"{where}: malformed JSON value ({e}); a Debezium JSON change event (Kafka "
                              f"Connect's JsonConverter) was expected") from None

    @staticmethod
    def _converted(t: _Topic, row: dict) -> dict:
        if not t.convert:
            return row
        return {k: (t.convert[k](v) if k in t.convert else v) for k, v in row.items()}

    def _pending_tx(self, tx_id: str, record_ms: int) -> _PendingTx | None:
        """The transaction ``tx_id`` seen in part (made at its first record), or None when it
        is already published (a record sent again: counted as a duplicate). A transaction is
        pending or published, never both: the published set is asked once per transaction."""
        tx = self._pending.get(tx_id)
        if tx is None:
            if tx_id in self._published:
                self.skipped["duplicates"] += 1
                return None
            tx = self._pending[tx_id] = _PendingTx(tx_id, record_ms)
        return tx

    def _complete(self, tx: _PendingTx) -> bool:
        if tx.end_counts is None:
            return False
        for topic in self._topics.values():
            want, have = tx.end_counts.get(topic.table, 0), tx.counts.get(topic.table, 0)
            if have > want:
                raise SourceError(f"{_where(self.tx_topic, 0, tx.end_offset)}: END of transaction {tx.id} counts "
                                  f"{want} events of {topic.table}, but {have} distinct events (total_order) of it "
                                  f"arrived")
            if have < want:
                return False
        return True

    def _snapshot_complete(self) -> bool:
        """Every table's snapshot is read (:meth:`.kafka_snapshot.SnapshotAssembly.table_complete`;
        ``over`` once a transaction was read)."""
        return not self.snapshot_waiting()

    def snapshot_waiting(self) -> list[str]:
        """What the connector's snapshot still waits for, one line per table naming its topic
        and partitions (:meth:`.kafka_snapshot.SnapshotAssembly.waiting`); empty once it is read."""
        if self._snapshot.published:
            return []
        return self._snapshot.waiting([(t.topic, t.table, t.partitions) for t in self._topics.values()],
                                      over=self._tx_records > 0, absent={t.topic for t in self._topics.values()
                                                                         if t.absent})

    def _snapshot_evident(self) -> bool:
        """The snapshot is read, and each table's own partitions prove it
        (:meth:`.kafka_snapshot.SnapshotAssembly.table_evident`): it may be published between
        two reads of a refresh, so that a backlog's transactions after it do not wait for the
        refresh's end."""
        return self._snapshot_complete() and all(
            self._snapshot.table_evident(t.table, t.topic, t.partitions, absent=t.absent)
            for t in self._topics.values())

    def _publish(self, out: dict, snapshot: bool = False) -> None:
        """Publish the snapshot once complete (``snapshot``: at the end of a refresh, every
        partition read to its high watermark, :meth:`_refresh`; else when each table's own
        partitions prove it, :meth:`_snapshot_evident`), then every complete transaction at
        the head of the END order; their rows go to ``out`` (table -> blocks of
        :func:`_weighted_table`)."""
        if not self._snapshot.published:
            if not (self._snapshot_complete() if snapshot else self._snapshot_evident()):
                return
            rows, counts = self._snapshot.take()
            for table, r in rows.items():
                out.setdefault(table, []).append((SNAPSHOT_POSITION, r))
            self._txs.append(TxInfo(SNAPSHOT_POSITION, "snapshot", 0, counts, self.tx_topic, -1, True))
            self._last = SNAPSHOT_POSITION
        while self._order:
            tx = self._pending[self._order[0]]
            if not self._complete(tx):
                break
            self._order.popleft()
            del self._pending[tx.id]
            self._published.add(tx.id)
            # END offsets grow in the topic's order; an END that came late (after a later
            # transaction's END) takes the position after the previous one: positions grow
            position = max(tx.end_offset + 1, self._last + 1)
            for table, rows in tx.rows.items():
                out.setdefault(table, []).append((position, rows))
            self._txs.append(TxInfo(position, tx.id, tx.end_ts_ms, tx.counts, self.tx_topic, tx.end_offset))
            self._recent.append(position, tx.id, tx.end_lsn, tx.first, tx.last)
            self._last = position

    def _add_rows(self, out: dict) -> None:
        tables = {}
        for table, blocks in out.items():
            if any(rows for _, rows in blocks):
                tables[table] = _weighted_table(self._schemas[table], blocks)
                self._row_totals[table] = self._row_totals.get(table, 0) + sum(w for _, rows in blocks
                                                                               for w, _, _ in rows)
        self._chunk_seq += 1
        self._add_chunk(self._chunk_seq, f"refresh {self._chunk_seq}", tables)
        if self._image_bytes > self.image_budget and (self._base is not None or self.recomputable
                                                      or self._chunk_files() is not None):
            before = self.floor
            self._drop_images(self.image_budget)
            if self.floor != before:
                log.info("%s: changes up to position %d dropped from memory (image_budget %d bytes); what needs "
                         "them is read again from the topics", self.location, self.floor, self.image_budget)

    # -- what waits -----------------------------------------------------------------------------
    def stalled(self, now_ms: int | None = None) -> list[dict]:
        """The transaction at the head of the log that is not complete yet, which holds back
        every later one: ``[{id, age_s, end_seen, missing: {table: events}, waiting_behind}]``
        (empty when nothing waits); ``age_s`` counts from its first record's Kafka timestamp,
        ``missing`` (once its END arrived) the events still to come per table,
        ``waiting_behind`` the transactions queued after it."""
        now_ms = now_ms or int(time.time() * 1000)
        with self._lock:
            if not self._order:
                return []
            tx = self._pending[self._order[0]]
            missing = {}
            if tx.end_counts is not None:
                missing = {t.table: tx.end_counts.get(t.table, 0) - tx.counts.get(t.table, 0)
                           for t in self._topics.values() if tx.end_counts.get(t.table, 0) > tx.counts.get(t.table, 0)}
            return [{"id": tx.id, "age_s": round((now_ms - tx.first_seen_ms) / 1000.0, 1),
                     "end_seen": tx.end_counts is not None, "missing": missing,
                     "waiting_behind": len(self._order) - 1}]

    # -- resuming -------------------------------------------------------------------------------
    def resume_point(self, position: int) -> dict | None:
        """What a later process needs to read on from ``position`` (a published position)
        without reading the topics from their start, or None when it cannot (per_topic, or
        transaction ids without a commit LSN): ``position``, ``ts_ms``; ``end_lsn`` (of the
        transaction at ``position``: a re-sent transaction whose END LSN is not above it is
        already in); ``offsets`` (topic -> partition -> the first offset holding a record of
        a transaction after ``position``, or what was read); ``included`` (the transactions up
        to ``position`` with records at or after those offsets, to drop when read again);
        ``tables`` (topic -> the table's schema and rows at ``position``). Recorded in the
        target's commit (``cut_offsets``) with the cut."""
        with self._lock:
            if self.consistency != "transaction" or position < self.base or position > self._last:
                return None
            recent = self._recent
            k, e = recent.split(position)
            firsts = recent.first_offsets(e)
            offsets = {}
            for tp, o in self._next.items():
                offsets[tp] = min([tx.first[tp] for tx in self._pending.values() if tp in tx.first]
                                  + ([firsts[tp]] if tp in firsts else []) + [o])
            # a transaction up to ``position`` with records at or after the offsets is read again
            again = recent.read_again(k, e, offsets)
            included = sorted({recent.ids[i] for i in again.tolist()}
                              | self._published.intersection((self._base or {}).get("included", ())))
            if k and recent.position[k - 1] == position:
                lsn = recent.lsn[k - 1]
                lsn = None if lsn == -1 else lsn
            else:
                lsn = self._base_lsn if position == self.base else None
            if lsn is None and position > SNAPSHOT_POSITION:
                return None   # not a PostgreSQL connector's ids: no order to recognize re-sent transactions by
            # offsets only grow with the position asked for and with what is read: a transaction
            # wholly before them is never "included" again
            keep = np.zeros(len(recent.position), dtype=bool)
            keep[k:] = True
            keep[again] = True
            recent.keep(keep)
            tables = {t.topic: {"schema": json.loads(t.schema.to_json()) if t.schema else None,
                                "rows": self.row_count(t.table, position) if t.schema else 0}
                      for t in self._topics.values()}
            out: dict[str, dict[str, int]] = {}
            for (topic, p), o in sorted(offsets.items()):
                out.setdefault(topic, {})[str(p)] = o
            return {"position": position, "ts_ms": self.commit_ms(position), "end_lsn": lsn if lsn is not None else -1,
                    "offsets": out, "included": included, "tables": tables}

    def resume_at(self, point: dict) -> bool:
        """Start at ``point`` (:meth:`resume_point`, from the target's last commit) instead of
        the topics' start, when this reader has read nothing yet; returns whether it does. The
        offsets are checked against the topics' first offsets at the first read (SourceError
        naming partition and offset when retention deleted records never read)."""
        with self._lock:
            if self.read_events or self._chunks or self.consistency != "transaction":
                return False
            self._base = point
            self._reset()
            return self._base is not None

    @property
    def base(self) -> int:
        """The position this reader started at: INITIAL for a reader of the topics' start."""
        return int(self._base["position"]) if self._base else INITIAL

    def row_count(self, table: str, position: int) -> int:
        """Rows of ``table`` as of ``position``: the running count at the newest position, less
        the weights of the chunks' rows past ``position`` (read from the newest chunk back:
        positions grow from chunk to chunk), so a cut near the head costs O(1) chunks."""
        with self._lock:
            self.schema(table)
            total = self._row_totals.get(table, 0)
            for ch in reversed(self._chunks):
                if ch.max_pos <= position:
                    break
                t = ch.tables.get(table)
                if t is not None and not ch.images:
                    total -= t.past(position)
                elif t is not None:
                    past = pc.filter(t.column(WEIGHT), pc.greater(t.column(POS), position))
                    total -= pc.sum(past).as_py() or 0
            return int(total)

    @property
    def recomputable(self) -> bool:
        """Whether Spark can compute a table's changes from the topics (:mod:`.kafka_table`):
        a reader of the topics' start in transaction consistency whose published snapshot
        attempt can be told apart from others."""
        return self._base is None and self.consistency == "transaction" and self._snapshot.told_apart

    def topic_cut(self, table: str, after: int, upto: int):
        """The :class:`.kafka_table.TopicCut` of ``table``'s changes in ``(after, upto]``."""
        from .kafka_table import TopicCut
        with self._lock:
            ts = self.schema(table)
            self._check_upto(upto)
            topic = next(t for t in self._topics.values() if t.table == table)

            def key_at(position: int) -> str | None:
                i = self._txs.bisect(position)
                tx = self._txs[i - 1] if i else None
                return None if tx is None or tx.snapshot else tx.id
            after_tx = key_at(after)
            # from the start to the newest position: no transaction topic (kafka_table)
            incomplete = tuple(sorted(self._pending)) if upto == self._last and after_tx is None else None
            ranges = {tp: (0, end) for tp, end in self._next.items()
                      if tp[0] == topic.topic or (tp[0] == self.tx_topic and incomplete is None)}
            return TopicCut(self.log, table, topic.topic, ts, self.tx_topic, ranges,
                            after < SNAPSHOT_POSITION <= upto, self._snapshot.attempt, after_tx, key_at(upto),
                            incomplete, tuple(sorted(self.envelopes.items())))

    # -- the changes dropped from memory --------------------------------------------------------
    def _chunk_files(self) -> ChunkFiles | None:
        """The Parquet copies of this reader's chunks (:mod:`.chunk_files`), started when none
        was dropped yet without one, :attr:`copy_dropped` holds and Spark's executors share the
        driver's disk (a classic session on a local master, :func:`..session.is_local`); None
        otherwise: dropped changes are then read again from the topics (:mod:`.kafka_table`)."""
        if self._files is None and self.copy_dropped and self.floor == INITIAL:
            from ..connect import is_connect
            from ..session import is_local
            spark = self.log.session(create=False)
            if spark is not None and not is_connect(spark) and is_local(spark.sparkContext.master):
                self._files = ChunkFiles()
        return self._files

    def _copy_chunks(self, n: int) -> None:
        """Copy the first ``n`` chunks to the chunk files (those not copied yet, together)."""
        todo = self._chunks[self._copied:n]
        if not todo:
            return
        tables: dict[str, list] = {}
        for ch in todo:
            for table, t in ch.tables.items():
                tables.setdefault(table, []).append(t)
        self._files.write({table: pa.concat_tables(ts) for table, ts in tables.items()})
        self._copied = n

    def _keep_dropped(self, chunks: list) -> None:
        """Copy the chunks about to be dropped (and any older not copied yet) to the chunk
        files, when there are any (:meth:`_chunk_files`)."""
        if self._chunk_files() is not None:
            # every chunk before the copied prefix's end is copied: look for the last one after it
            last = next(i for i in range(self._copied, len(self._chunks)) if self._chunks[i] is chunks[-1])
            self._copy_chunks(last + 1)

    def _dropped_changes(self, table: str, after: int, upto: int, columns: list[str]) -> list[pa.Table]:
        if self._files is None:
            return super()._dropped_changes(table, after, upto, columns)
        return self._files.read(table, after, upto, columns)

    @property
    def computes_tables(self) -> bool:
        """Whether Spark can compute a table as of a position for this reader (:meth:`table_frame`):
        a reader of the topics' start whose chunks it copies to the driver's disk
        (:meth:`_chunk_files`), or that can read them again from the topics (:attr:`recomputable`)."""
        with self._lock:
            return self._base is None and (self._chunk_files() is not None or self.recomputable)

    def _from_topics(self, what: str) -> None:
        if not self.recomputable:
            raise SourceError(f"{self.location}: {what} needs the changes up to position {self.floor}, which this "
                              f"reader no longer holds, and cannot read them again from the topics (a reader of a "
                              f"resume point: use full_reader_for)")
        log.info("%s: %s is read from the topics by Spark", self.location, what)

    def changes(self, table: str, after: int, upto: int, columns: list[str] | None = None) -> pa.Table:
        """:meth:`TransactionLog.changes`; across the changes dropped from memory (before
        :attr:`floor`), read from their copies on the driver's disk (:mod:`.chunk_files`), or
        computed by Spark from the topics (:mod:`.kafka_table`; then not in commit order)."""
        with self._lock:
            if after >= self.floor or self._files is not None:
                return super().changes(table, after, upto, columns)
            self._from_topics(f"the changes of {table} in ({after}, {upto}]")
            from .kafka_table import changes_frame
            cols, schema = self._columns(table, columns)
            return changes_frame(self.topic_cut(table, after, upto), cols).toArrow().cast(schema)

    def table_at(self, table: str, position: int, columns: list[str] | None = None) -> pa.Table:
        """:meth:`TransactionLog.table_at`; once changes were dropped from memory, from their
        copies on the driver's disk, or computed by Spark from the topics (:meth:`table_frame`)."""
        if self._base is not None:
            raise SourceError(f"{self.location}: this reader starts at position {self.base} (a resume point): the "
                              f"table as of a position needs a reader of the topics' start (full_reader_for)")
        with self._lock:
            if self.floor == INITIAL or self._files is not None:
                return super().table_at(table, position, columns)
            cols, schema = self._columns(table, columns)
            return self.table_frame(table, position, cols).toArrow().cast(schema.remove(len(cols)))

    def table_frame(self, table: str, position: int, columns: list[str] | None = None, *,
                    materialize: bool = True):
        """The table as of ``position`` as a Spark DataFrame computed where Spark runs,
        materialized on the executors or lazy (:func:`.kafka_table.table_of`): from the
        reader's chunks copied to the driver's disk (:mod:`.chunk_files`; the chunks up to
        ``position`` not copied yet are copied first; a lazy frame reads links of its own,
        :meth:`.chunk_files.ChunkFiles.pin`), or from the topics
        (:func:`.kafka_table.table_frame`). Raises SourceError when this reader can do
        neither (:attr:`computes_tables`)."""
        from .kafka_table import chunk_frame, table_frame, table_of
        with self._lock:
            files = self._chunk_files() if self._base is None else None
            if files is None:
                self._from_topics(f"the table {table} at position {position}")
                return table_frame(self.topic_cut(table, INITIAL, position), position, columns,
                                   materialize=materialize)
            ts = self.schema(table)
            self._check_upto(position)
            self._copy_chunks(sum(1 for ch in self._chunks if ch.min_pos <= position))
            paths = files.paths(table, position) if materialize else files.pin(table, position)
            z = chunk_frame(self.log.session(), paths, ts, position, columns)
            return table_of(z, f"{self.location}: table {table} at position {position}", materialize)


_RETIRED: list[ChunkFiles] = []
"""Chunk files of readers that started again (:meth:`KafkaReader._reset`), kept until the
process ends: a lazy frame of the table before may still read them."""
_READERS: dict[tuple, KafkaReader] = {}
_FULL: dict[tuple, KafkaReader] = {}     # readers of the topics' start, where _READERS' resumed
_READERS_LOCK = threading.Lock()


def _key(spec) -> tuple:
    servers, topic = spec.option("bootstrap_servers"), spec.option("topic")
    consistency = spec.option("consistency", "transaction")
    return servers, spec.option("transaction_topic") if consistency == "transaction" else topic, consistency


def _columns(spec) -> dict:
    label = f"source('{spec.source_name}', '{spec.name}'): meta.consistent_stream.columns"
    return {c: column_type(c, t, label) for c, t in (spec.option("columns") or {}).items()}


def reader_for(spec) -> KafkaReader:
    """The process-wide reader of ``spec``'s clock (a ``format: kafka`` SourceSpec), reading
    the spec's topic too, refreshed. It may start at a resume point (:func:`resume`)."""
    return declare(spec).refresh()


def full_reader_for(spec) -> KafkaReader:
    """A process-wide reader of ``spec``'s clock that read the topics from their start
    (what the table as of a position needs), refreshed: :func:`reader_for`'s when it did."""
    r = declare(spec)
    return r.refresh() if r.base == INITIAL else declare(spec, _FULL).refresh()


def declare(spec, registry: dict | None = None) -> KafkaReader:
    """The process-wide reader of ``spec``'s clock (in ``registry``: the readers runs use,
    or ``_FULL``), told to read the spec's topic too (not refreshed). A :class:`KafkaSource`
    declares its table when it is opened, so that the tables of a job, opened together, are
    read in one pass (a table added after a read makes the reader read every topic again)."""
    registry = _READERS if registry is None else registry
    key = _key(spec)
    with _READERS_LOCK:
        r = registry.get(key)
        if r is None:
            r = registry[key] = KafkaReader(*key)
    r.add_table(spec.option("topic"), spec.table, spec.primary_key, _columns(spec))
    limit = spec.option("driver_read_records")
    if limit is not None:   # the smallest any of the clock's sources asks for
        r.driver_read_records = min(int(limit), r.driver_read_records)
    return r


def forget_readers() -> None:
    """Drop every cached reader (tests that recreate topics, or act as a new process)."""
    with _READERS_LOCK:
        for r in list(_READERS.values()) + list(_FULL.values()):
            r.log.close()
        _READERS.clear()
        _FULL.clear()


class KafkaSource(DebeziumSource):
    """One table's topic of Debezium change events on Kafka (``format: kafka``), through the
    process-wide :class:`KafkaReader` of its clock: the transaction topic's in transaction
    mode (every table of one connector is cut at the same transaction), the topic's own in
    per_topic mode. Positions and the table as of a position as in :class:`DebeziumSource`.

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
        reader has not read it yet (:meth:`KafkaReader.head_schema`): what compiling a model
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
        the executors (``on_driver`` false; :meth:`KafkaReader.table_frame`), else on the
        driver from the reader's changes (:meth:`KafkaReader.table_at`)."""
        r = self._full(position)
        if not on_driver and r.computes_tables:
            from ..changelog import Changelog, with_weight
            return Changelog.of_frame(views, with_weight(r.table_frame(self.spec.table, position, columns)))
        rel = r.table_at(self.spec.table, position, columns)
        z = rel.append_column(WEIGHT, pa.array([1] * rel.num_rows, pa.int64()))
        return self._changelog(views, z, change=False)

    def snapshot_dataframe(self, spark, position: int):
        """The table at ``position`` as the lazy Spark query that computes it
        (:meth:`KafkaReader.table_frame`: what the model's SQL is analyzed over, and ``verify``
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
        from .delta_cdf import SourceChanges
        r = self._full(end)
        z = r.changes(self.spec.table, start, end, columns)
        return SourceChanges(self._changelog(views, z, change=True), z.num_rows,
                             r.commit_ms(end) if z.num_rows else None)

    def commits(self, start: int, end: int) -> list:
        if start >= self.reader(upto=end).base:
            return super().commits(start, end)
        from .backlog import SourceCommit
        return [SourceCommit(tx.position, tx.ts_ms, tx.counts.get(self.spec.table, 0))
                for tx in self._full(end).transactions(start, end)]

    def stalled(self) -> list[dict]:
        """The transactions seen in part that hold back this source's clock
        (:meth:`KafkaReader.stalled`)."""
        return self.reader().stalled()

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """``cut_offsets``: the clock -> the resume point of ``position``
        (:meth:`KafkaReader.resume_point`; omitted when there is none)."""
        point = self.reader(upto=position).resume_point(position)
        return {"cut_offsets": {self.clock: point}} if point is not None else {}
