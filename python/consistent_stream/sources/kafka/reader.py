"""The reader of one Kafka clock: the I/O around :mod:`.assembly` and :mod:`.clocks`.

A :class:`KafkaReader` reads the Debezium change events of its data topics (and the
transaction topic of a ``transaction`` clock), hands each read's records to its clock
(:mod:`.clocks`; the consistency rule: :mod:`.assembly`), and keeps what the clock published
as a :class:`~..debezium.source.TransactionLog`: per position its transaction
(:class:`~..landing_index.TxInfo`) and the tables' weighted rows (Arrow chunks: the table's
columns + ``__pos`` + ``__weight``). In: Kafka partitions and their offsets (:mod:`.log`).
Out: positions, a table's changes across them, the table as of one (Arrow, or Spark frames
computed where Spark runs: :mod:`.table`), resume points.

Reading: each refresh reads every partition from where the last one stopped to its high
watermark (:mod:`.log`): a refresh of at most ``driver_read_records`` records
(:data:`DRIVER_READ_RECORDS`) with the driver's Kafka client, parsed by DuckDB on the driver, a
larger one through Spark's Kafka source, parsed on the executors; both parse the values into
the same columns (:mod:`..debezium.columns`: the bookkeeping fields as columns, each table's
row images typed by its schema); the clock walks those columns to assemble transactions,
takes the images by index, and the reader keeps the complete transactions as Arrow chunks,
at most :data:`IMAGE_BUDGET` bytes of them: past it the oldest chunks keep only each
transaction's net row count per table, so that the driver's memory does not grow with the
topics' history (the transaction bookkeeping aside: a few bytes per transaction,
:mod:`..packed`). What needs their changes (the table as of a position, changes across them)
reads the Parquet copies the reader wrote of them to the driver's disk as it dropped them
(:mod:`..chunk_files`; with a local Spark session, whose executors read that disk), or, with a
cluster, is computed by Spark from the topics again (:mod:`.table`). A rebuild on the
executors always computes its tables there.

A value the parse refuses is read again raw and named by the driver's parser
(:meth:`KafkaReader.diagnose`). A reader starts at the topics' start, or at a *resume point*
(:meth:`KafkaReader.resume_point`, recorded in every target commit as ``cut_offsets``): a run
reads on from its target's last commit (:meth:`.source.KafkaSource.resume`), and what needs
the table as of a position (a first batch, a rebuild, ``verify``) reads from the start with a
reader of its own (:mod:`.registry`). Offsets retention deleted before they were read give a
SourceError naming the partition and offset.

Errors (``SourceError``, naming topic, partition and offset): malformed JSON, an event of
another table than the source's, a change event without a ``transaction`` block in
transaction mode (the connector lacks ``provide.transaction.metadata``), an update or delete
without a ``before`` image (the table needs ``REPLICA IDENTITY FULL``), a value that does not
fit its column's type, an END whose counts contradict the events, a missing topic,
retention-deleted offsets. A transaction whose END never arrives holds back every later one:
nothing partial is ever committed, and :meth:`KafkaReader.stalled` says which transaction
waits, since when, and for what. Tombstones (the null value after a delete) and events that
are neither changes nor transaction metadata (heartbeats, schema changes) are skipped and
counted; the counts go to the log at every refresh (:attr:`KafkaReader.skipped`).
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SourceError
from ..chunk_files import ChunkFiles
from ..debezium.columns import envelope_prefix, local_projection, projection
from ..debezium.events import POS, WEIGHT, rows_to_arrow, unwrap
from ..debezium.schema import converters, schema_from_envelope
from ..debezium.source import TransactionLog
from ..landing import ColumnSchema, TableSchema
from ..landing_index import TxInfo, TxLog
from ..spec import INITIAL
from .assembly import (SNAPSHOT_POSITION, Images, Published, Topic, checked, not_tx_metadata, weighted_table,
                       where)
from .clocks import Clock, clock_for
from .extents import Extents
from .log import MAX_RECORDS, KafkaLog, lost_offset, split_ranges

log = logging.getLogger(__name__)
IMAGE_BUDGET = 128 << 20
"""Bytes of assembled changes (Arrow) a reader keeps on the driver; past it the oldest are
dropped and read again by Spark from the topics where needed (:mod:`.table`)."""
DRIVER_READ_RECORDS = 1_000_000
"""Default ``driver_read_records``: a refresh that reads at most this many Kafka records
(every partition's backlog together) reads them with the driver's Kafka client and parses
them with DuckDB on the driver (:meth:`.log.KafkaLog.fetch`,
:func:`..debezium.columns.local_projection`); a larger one reads and parses them where Spark
runs, on the executors (:meth:`.log.KafkaLog.read`, :func:`..debezium.columns.projection`).
Both give the same columns; the driver's way has no Spark job and no warm-up of Spark's
Kafka source, the executors' scales with the cluster."""
LEARN_FROM = 64
"""Records at the start of each partition read raw to learn a topic's schema from its envelope."""



@contextlib.contextmanager
def _no_cyclic_gc():
    """Pause Python's cyclic garbage collector for the block. Parsing a read's records makes
    millions of small containers (row dicts, tuples, pending transactions) and no reference
    cycles: each is freed by its reference count, but their allocations keep triggering
    collections that walk every live container, the rows kept so far included: a large part
    of the parsing time (the Kafka catch-up benchmark page)."""
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


_PARSE_ERRORS = ("MALFORMED_RECORD", "CAST_INVALID_INPUT", "NUMERIC_VALUE_OUT_OF_RANGE", "CAST_OVERFLOW",
                 "INVALID_BASE64", "Malformed")
"""What Spark's errors say when the executors could not parse a value (:meth:`KafkaReader.diagnose`)."""


def _ranges_text(part: dict) -> str:
    return ", ".join(f"{t}[{p}] {a}..{b - 1}" for (t, p), (a, b) in sorted(part.items()))


class KafkaReader(TransactionLog):
    """The Debezium change events of the data topics of one clock, assembled into complete
    transactions by its clock (:mod:`.clocks`; the rule: :mod:`.assembly`). ``key``: (bootstrap
    servers, transaction topic or the one topic of a per_topic clock, consistency). Use
    :func:`.registry.reader_for`.

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
        self._topics: dict[str, Topic] = {}
        self._retired: list[ChunkFiles] = []       # chunk files of the states before (_reset)
        self._declared: dict[str, tuple] = {}     # topic -> (table, primary key, declared columns)
        self._base: dict | None = None            # the resume point this reader starts at (resume_at)
        self.image_budget = IMAGE_BUDGET
        self.driver_read_records = DRIVER_READ_RECORDS
        self._files: ChunkFiles | None = None
        self._on_driver = True
        self._reset()

    def _reset(self) -> None:
        if self._files is not None:
            self._retired.append(self._files)   # a lazy frame of the state before may still read them
        self._files, self._copied = None, 0
        self._chunks, self._txs = [], TxLog()
        self._image_bytes, self.floor = 0, INITIAL
        self._schemas = {}
        self._envelopes: dict[str, str | None] = {}   # topic -> its values' envelope text (..debezium.columns)
        self._topics = {t: Topic(t, table, pk) for t, (table, pk, _) in self._declared.items()}
        for t, (table, pk, cols) in self._declared.items():
            if cols:
                self._topics[t].schema = TableSchema(table, tuple(ColumnSchema(c, ty) for c, ty in cols), pk)
                self._schemas[table] = self._topics[t].schema
        self._next: dict[tuple[str, int], int] = {}
        self._chunk_seq = 0
        self.skipped = {"duplicates": 0, "tombstones": 0, "other": 0}
        self.clock: Clock = clock_for(self.consistency, self.tx_topic, self._topics, self.skipped)
        self.read_events = 0
        self._recent = Extents()                   # published transactions not yet behind a cut asked for
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
        self.clock.start_at(p, base.get("included", ()), base.get("end_lsn"))   # past the snapshot
        self._txs = TxLog([TxInfo(p, "resume point", int(base.get("ts_ms", 0)), {}, self.tx_topic, -1, p == 0)])

    # -- tables ---------------------------------------------------------------------------------
    def add_table(self, topic: str, table: str, primary_key: tuple, columns: dict) -> None:
        """Read ``topic`` (the change events of ``table``) too; ``columns`` (name -> type of
        :mod:`..landing`) when the values have no schema envelope. A table added after the reader
        read anything makes it read every topic again from the start, so that no published
        transaction lacks the new table's events."""
        spec = (table, tuple(primary_key), tuple(sorted(columns.items())) if columns else ())
        if self._declared.get(topic) == spec:
            return   # read already (asked without the lock, so as not to wait for a refresh)
        with self._lock:
            if self._declared.get(topic) == spec:
                return
            self.clock.admit(self._declared, self.location)
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
            return self.clock.last

    # -- reading --------------------------------------------------------------------------------
    def refresh(self) -> "KafkaReader":
        """Read what the topics gained since the last refresh and publish every transaction
        that became complete (:mod:`.assembly`). Raises SourceError."""
        with self._lock:
            try:
                self._refresh()
            except BaseException:
                self._reset()   # nothing half-read survives an error
                raise
            return self

    def _refresh(self) -> None:
        t0 = time.time()
        snapshot = self.clock.snapshot
        settled = snapshot.published or self.clock.snapshot_complete()
        n, read = self._read_round()
        if not (settled or snapshot.published) and self.clock.snapshot_complete() and \
                any(t.partitions > 1 for t in self._topics.values()):
            # the snapshot's last markers were read in this round: the rows the connector wrote
            # before them to other partitions are below high watermarks taken now
            m, more = self._read_round()
            n, read = n + m, read | more
        published = self.clock.end_of_refresh()
        if published is not None:
            self._add_rows(self._record(published))
        if read:
            log.info("%s: read %d records of %d partitions in %.2fs; position %d; skipped %s; %d transactions "
                     "waiting", self.location, n, len(read), time.time() - t0, self.clock.last, self.skipped,
                     self.clock.queued)

    def _read_round(self) -> tuple[int, set]:
        """Read every partition from where the last read stopped to its high watermark (taken
        now); returns the records read and the partitions that had any."""
        topics = list(self._declared)
        parts = self.clock.partitions(self.log, lambda: [p for t in topics for p in self._partitions(t)])
        ranges = self._unread(parts)
        if not ranges:
            return 0, set()
        self._learn_schemas(ranges)
        total = sum(b - a for a, b in ranges.values())
        self._on_driver = total <= self.driver_read_records
        if not self._on_driver:
            log.info("%s: %d records to read (more than driver_read_records, %d): read and parsed where Spark runs",
                     self.location, total, self.driver_read_records)
        parts = split_ranges(ranges, MAX_RECORDS)
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
        """The records of ``part`` parsed into :mod:`..debezium.columns`' columns, on the driver
        or on the executors (:data:`DRIVER_READ_RECORDS`), and the data topics whose images
        they hold typed (topic -> (index, schema)). A value that fails the parse makes
        :meth:`diagnose` name it."""
        data = [(t.topic, t.table, t.schema) for t in self._topics.values()]
        typed = {topic: (i, ts) for i, (topic, _, ts) in enumerate(data) if ts is not None}
        tx = self.clock.tx_topic
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
        """Topic -> the envelope text its values start with (:func:`..debezium.columns.envelope_prefix`),
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
        for topic, value, obj, at in self._raw_records(heads):
            if topic not in self._envelopes and type(obj) is dict and (type(obj.get("payload")) is dict
                                                                       or "schema" not in obj):
                self._envelopes[topic] = envelope_prefix(value, obj)   # None: values without one
            t = unknown.get(topic)
            if t is None or t.schema is not None:
                continue
            if type(obj) is dict and isinstance(obj.get("schema"), dict) and type(obj.get("payload")) is dict \
                    and obj["payload"].get("op") is not None:
                self._learn_schema(t, obj, at)

    def _raw_records(self, part: dict):
        """The records of ``part`` read raw and parsed on the driver (:meth:`_parse`, which
        names a malformed one): ``(topic, value bytes, value as JSON, where)`` in offset order."""
        raw = self.log.fetch(part)
        for topic, p, offset, value in zip(*(raw.column(c).to_pylist() for c in ("topic", "partition", "offset",
                                                                                  "value"))):
            at = where(topic, p, offset)
            yield topic, value, self._parse(value, at), at

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
                (_, _, obj, at), = self._raw_records({(t.topic, p): (offset, offset + 1)})
                self._learn_schema(t, obj, at)
        return self._read_part(part) if missing else (records, typed)

    def _learn_schema(self, t: Topic, obj, where: str) -> None:
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
        for topic, _, obj, at in self._raw_records(part):
            obj = unwrap(obj)
            if obj is None:
                continue
            if topic == self.clock.tx_topic:
                if type(obj) is not dict or "status" not in obj:
                    raise not_tx_metadata(at)
                continue
            if type(obj) is not dict:
                raise SourceError(f"{at}: expected a JSON object (a Debezium change event)")
            t = self._topics[topic]
            if obj.get("op") is None or t.schema is None:
                continue
            rows = [(0, 1, self._converted(t, obj[side]), at) for side in ("before", "after")
                    if type(obj.get(side)) is dict]
            rows_to_arrow(t.schema, rows, at)
        raise SourceError(f"{self.location}: Kafka records in offsets {_ranges_text(part)} could not be parsed, and "
                          f"no record among them was found wrong when read one by one: {cause[:2000]}")

    def _apply(self, records: pa.Table, typed: dict) -> None:
        """Apply ``records`` (:mod:`..debezium.columns`' columns), data topics first (their
        events wait for their transaction's END), then the transaction topic; publish what is
        complete. Python's cyclic garbage collector is paused meanwhile (:func:`_no_cyclic_gc`)."""
        with _no_cyclic_gc():
            self._apply_records(records, typed)

    def _apply_records(self, records: pa.Table, typed: dict) -> None:
        """Check ``records`` (:func:`.assembly.checked`), give them to the clock, which
        publishes what became complete, and keep the published rows as one chunk
        (:meth:`_add_rows`)."""
        self.read_events += records.num_rows
        data = tx = np.zeros(0, np.int64)
        images = None
        if records.num_rows:
            data, tx = checked(records, self._topics, self.clock.tx_topic, self.skipped, self.diagnose)
            images = Images(records, typed, self.diagnose)
        self._add_rows(self._record(self.clock.add(records, data, tx, images)))

    def _record(self, published: list[Published]) -> dict:
        """Keep the bookkeeping of the positions ``published`` (:attr:`transactions`, the
        extents of a resume point) and return their rows: table -> blocks of
        :func:`.assembly.weighted_table`."""
        out: dict = {}
        for p in published:
            for table, rows in p.rows.items():
                out.setdefault(table, []).append((p.info.position, rows))
            self._txs.append(p.info)
            if p.extent is not None:
                self._recent.append(p.info.position, *p.extent)
        return out

    def _parse(self, value: bytes | None, where: str):
        if value is None:
            return None
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise SourceError(f"{where}: malformed JSON value ({e}); a Debezium JSON change event (Kafka "
                              f"Connect's JsonConverter) was expected") from None

    @staticmethod
    def _converted(t: Topic, row: dict) -> dict:
        if not t.convert:
            return row
        return {k: (t.convert[k](v) if k in t.convert else v) for k, v in row.items()}

    def _add_rows(self, out: dict) -> None:
        tables = {}
        for table, blocks in out.items():
            if any(rows for _, rows in blocks):
                tables[table] = weighted_table(self._schemas[table], blocks)
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
    def snapshot_waiting(self) -> list[str]:
        """What the connector's snapshot still waits for, one line per table naming its topic
        and partitions (:func:`.assembly.snapshot_waiting`); empty once it is read."""
        return self.clock.snapshot_waiting()

    def stalled(self, now_ms: int | None = None) -> list[dict]:
        """The transaction that holds back every later one
        (:meth:`.assembly.TransactionAssembler.stalled`); empty when nothing waits."""
        with self._lock:
            return self.clock.stalled(now_ms)

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
            clock = self.clock
            if not clock.resumable or position < self.base or position > clock.last:
                return None
            recent = self._recent
            k, e = recent.split(position)
            firsts = recent.first_offsets(e)
            offsets = {}
            for tp, o in self._next.items():
                offsets[tp] = min([tx.first[tp] for tx in clock.pending.values() if tp in tx.first]
                                  + ([firsts[tp]] if tp in firsts else []) + [o])
            # a transaction up to ``position`` with records at or after the offsets is read again
            again = recent.read_again(k, e, offsets)
            included = sorted({recent.ids[i] for i in again.tolist()}
                              | clock.assembler.published.intersection((self._base or {}).get("included", ())))
            if k and recent.position[k - 1] == position:
                lsn = recent.lsn[k - 1]
                lsn = None if lsn == -1 else lsn
            else:
                lsn = clock.assembler.base_lsn if position == self.base else None
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
            if self.read_events or self._chunks or not self.clock.resumable:
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
        """Whether Spark can compute a table's changes from the topics (:mod:`.table`):
        a reader of the topics' start in transaction consistency whose published snapshot
        attempt can be told apart from others."""
        return self._base is None and self.clock.resumable and self.clock.snapshot.told_apart

    def topic_cut(self, table: str, after: int, upto: int):
        """The :class:`.table.TopicCut` of ``table``'s changes in ``(after, upto]``."""
        from .table import TopicCut
        with self._lock:
            ts = self.schema(table)
            self._check_upto(upto)
            topic = next(t for t in self._topics.values() if t.table == table)

            def key_at(position: int) -> str | None:
                i = self._txs.bisect(position)
                tx = self._txs[i - 1] if i else None
                return None if tx is None or tx.snapshot else tx.id
            after_tx = key_at(after)
            # from the start to the newest position: no transaction topic (.table)
            incomplete = tuple(sorted(self.clock.pending)) if upto == self.clock.last and after_tx is None else None
            ranges = {tp: (0, end) for tp, end in self._next.items()
                      if tp[0] == topic.topic or (tp[0] == self.tx_topic and incomplete is None)}
            return TopicCut(self.log, table, topic.topic, ts, self.tx_topic, ranges,
                            after < SNAPSHOT_POSITION <= upto, self.clock.snapshot.attempt, after_tx, key_at(upto),
                            incomplete, tuple(sorted(self.envelopes.items())))

    # -- the changes dropped from memory --------------------------------------------------------
    def _chunk_files(self) -> ChunkFiles | None:
        """The Parquet copies of this reader's chunks (:mod:`..chunk_files`), started when none
        was dropped yet without one, :attr:`copy_dropped` holds and Spark's executors share the
        driver's disk (a classic session on a local master, :func:`...session.is_local`); None
        otherwise: dropped changes are then read again from the topics (:mod:`.table`)."""
        if self._files is None and self.copy_dropped and self.floor == INITIAL:
            from ...connect import is_connect
            from ...session import is_local
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
        :attr:`floor`), read from their copies on the driver's disk (:mod:`..chunk_files`), or
        computed by Spark from the topics (:mod:`.table`; then not in commit order)."""
        with self._lock:
            if after >= self.floor or self._files is not None:
                return super().changes(table, after, upto, columns)
            self._from_topics(f"the changes of {table} in ({after}, {upto}]")
            from .table import changes_frame
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
        materialized on the executors or lazy (:func:`.table.table_of`): from the
        reader's chunks copied to the driver's disk (:mod:`..chunk_files`; the chunks up to
        ``position`` not copied yet are copied first; a lazy frame reads links of its own,
        :meth:`..chunk_files.ChunkFiles.pin`), or from the topics
        (:func:`.table.table_frame`). Raises SourceError when this reader can do
        neither (:attr:`computes_tables`)."""
        from .table import chunk_frame, table_frame, table_of
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
