"""A landing directory of Debezium JSON change events, read as changelogs cut at transactions.

:class:`LandingReader` keeps the complete transactions of one directory (parsed by
:mod:`.events`, or loaded from the landing index, :mod:`..landing_index`);
:class:`DebeziumSource` is one table of it behind the :class:`~..formats.Source` protocol.
Changes are returned only for a range of positions ``(after, upto]`` made of *complete*
transactions, in commit order: a micro-batch holds a transaction entirely or not at all,
across all tables of the landing directory (the idea of TiFlink's transaction-consistent
checkpoints, with the source database's commit order in place of a global timestamp).
The event format, the snapshot rule and the errors are in :mod:`.events`.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ... import storage
from ...location import normalize
from ...changelog import consolidate_arrow
from ...errors import SourceError
from .. import landing_index
from .events import INITIAL, POS, WEIGHT, EventParser, build_index
from ..landing import TableSchema, list_event_files, load_schemas
from ..landing_index import TxInfo, TxLog
from ..packed import PackedInts

log = logging.getLogger(__name__)


@dataclass
class _Chunk:
    """The rows of one event file: of the complete transactions whose END is in it, and the
    snapshot reads in it; per table an Arrow table of the table's columns + __pos + __weight
    (``images``), or once dropped (:meth:`TransactionLog._drop_images`) a :class:`NetWeights`."""
    seq: int
    name: str
    min_pos: int
    max_pos: int
    tables: dict
    images: bool = True


class NetWeights:
    """A dropped chunk's rows of one table (:meth:`TransactionLog._drop_images`): each
    position's summed weight, zero sums left out, as two :class:`~.packed.PackedInts` columns
    in position order (a few bytes a transaction, where Arrow's ``__pos`` + ``__weight`` took
    sixteen and more). Built from an Arrow table with ``__pos`` and ``__weight`` (int64)."""

    def __init__(self, t: pa.Table):
        g = t.select([POS, WEIGHT]).group_by(POS, use_threads=False).aggregate([(WEIGHT, "sum")])
        g = g.filter(pc.not_equal(g.column(f"{WEIGHT}_sum"), 0)).sort_by(POS)
        self.pos = PackedInts(g.column(POS).to_numpy())
        self.weight = PackedInts(g.column(f"{WEIGHT}_sum").to_numpy())

    def upto(self, position: int) -> int:
        """The summed weights at positions ``<= position``."""
        return int(self.weight.numpy(0, self.pos.searchsorted(position)).sum())

    def past(self, position: int) -> int:
        """The summed weights at positions ``> position``."""
        return int(self.weight.numpy(self.pos.searchsorted(position)).sum())


def _min_max(a) -> tuple[int, int]:
    m = pc.min_max(a)
    return m["min"].as_py(), m["max"].as_py()


class TransactionLog:
    """Complete transactions kept in memory on the driver, served as changelogs: what a
    landing directory (:class:`LandingReader`) and a set of Kafka topics
    (:class:`consistent_stream.sources.kafka.reader.KafkaReader`) are both read into.

    Subclasses fill ``_schemas`` (table -> TableSchema), ``_chunks`` (rows of complete
    transactions, per table an Arrow table of its columns + __pos + __weight) and ``_txs``
    (a :class:`~.landing_index.TxLog`: transactions in position order) and give
    :meth:`latest_position`; ``location`` names what is read in errors. Positions grow
    strictly with commit order. A subclass may drop the oldest chunks' rows past a budget
    (:meth:`_drop_images`): :attr:`floor` is then the newest position whose changes are no
    longer here. Thread-safe (``_lock``).
    """

    def __init__(self, location: str):
        self.location = location
        self._lock = threading.RLock()
        self._schemas: dict[str, TableSchema] = {}
        self._chunks: list[_Chunk] = []
        self._txs = TxLog()
        self._image_bytes = 0
        self.floor = INITIAL

    def latest_position(self) -> int:
        """Position of the last complete transaction (or the snapshot); -1 when none."""
        raise NotImplementedError

    def _add_chunk(self, seq: int, name: str, tables: dict) -> None:
        """Keep the rows ``tables`` (table -> Arrow table with __pos, __weight) of complete
        transactions; ``seq``/``name`` say where they came from."""
        tables = {t: v for t, v in tables.items() if v.num_rows}
        if tables:
            lo, hi = zip(*(_min_max(t.column(POS)) for t in tables.values()))
            self._chunks.append(_Chunk(seq, name, min(lo), max(hi), tables))
            self._image_bytes += sum(t.nbytes for t in tables.values())

    def _drop_images(self, budget: int) -> None:
        """Keep the rows of the newest chunks within ``budget`` bytes: older chunks keep only
        each position's summed weight per table (:class:`NetWeights`: what :meth:`row_count`
        reads), and :attr:`floor` becomes the newest position dropped. What needs the dropped
        rows is the subclass's to serve (:meth:`_keep_dropped`; :class:`~..kafka.reader.KafkaReader`:
        from Parquet copies on the driver's disk, or from the topics, with Spark)."""
        drop, left = [], self._image_bytes
        for ch in self._chunks:
            if left <= budget:
                break
            if ch.images:
                drop.append(ch)
                left -= sum(t.nbytes for t in ch.tables.values())
        if not drop:
            return
        self._keep_dropped(drop)
        for ch in drop:
            self._image_bytes -= sum(t.nbytes for t in ch.tables.values())
            ch.tables = {table: NetWeights(t) for table, t in ch.tables.items()}
            ch.images = False
            self.floor = max(self.floor, ch.max_pos)

    def _keep_dropped(self, chunks: list) -> None:
        """Called with the chunks :meth:`_drop_images` is about to drop (oldest first), their
        rows still there: a subclass may keep them elsewhere (:meth:`_dropped_changes`)."""

    def _dropped_changes(self, table: str, after: int, upto: int, columns: list[str]) -> list[pa.Table]:
        """The changes of ``table`` in ``(after, upto]`` (``upto <= floor``) from the chunks
        dropped from memory, where a subclass kept them (:meth:`_keep_dropped`): ``columns`` +
        ``__weight``, in position order. Here: SourceError, they are gone."""
        raise SourceError(f"{self.location}: the changes after position {after} are no longer held in "
                          f"memory (kept from position {self.floor} on)")

    def tables(self) -> list[str]:
        with self._lock:
            return sorted(self._schemas)

    def schema(self, table: str) -> TableSchema:
        with self._lock:
            if table not in self._schemas:
                raise SourceError(f"{self.location}: no schema file for table {table!r} in _schemas/ "
                                  f"(captured tables: {sorted(self._schemas) or 'none'}); check "
                                  f"meta.consistent_stream.table")
            return self._schemas[table]

    def transactions(self, after: int | None = None, upto: int | None = None) -> list[TxInfo]:
        """The complete transactions in commit order (the snapshot first, when there is one);
        only those with ``after < position <= upto`` when given (a binary search: positions
        grow)."""
        with self._lock:
            lo = 0 if after is None else self._txs.bisect(after)
            hi = len(self._txs) if upto is None else self._txs.bisect(upto)
            return self._txs[lo:hi]

    def commit_ms(self, position: int) -> int:
        """Commit time (ms since epoch) of the newest transaction at or before ``position``;
        0 when there is none."""
        with self._lock:
            i = self._txs.bisect(position)
            return self._txs[i - 1].ts_ms if i else 0

    def _check_upto(self, upto: int) -> None:
        last = self.latest_position()
        if upto > last:
            raise SourceError(f"{self.location}: position {upto} is past the last complete transaction "
                              f"{last} (data missing or deleted since the cut was taken?)")

    def _columns(self, table: str, columns: list[str] | None) -> tuple[list[str], pa.Schema]:
        """``columns`` of ``table`` (default all) and the Arrow schema of its changes: those
        columns + ``__weight`` int64. SourceError when the table or a column is unknown."""
        ts = self.schema(table)
        cols = list(columns) if columns is not None else ts.column_names
        unknown = [c for c in cols if c not in ts.column_names]
        if unknown:
            raise SourceError(f"{self.location}: table {table} has no columns {unknown} (has {ts.column_names})")
        return cols, pa.schema([ts.arrow_schema().field(c) for c in cols] + [pa.field(WEIGHT, pa.int64())])

    def changes(self, table: str, after: int, upto: int, columns: list[str] | None = None) -> pa.Table:
        """The changes of ``table`` from the transactions with ``after < position <= upto``
        (the snapshot is at P0), in commit order: ``columns`` (default all) + ``__weight``
        int64, not consolidated. Raises SourceError when ``upto`` is past the last complete
        transaction or ``table`` is unknown."""
        with self._lock:
            cols, schema = self._columns(table, columns)
            self._check_upto(upto)
            parts = self._dropped_changes(table, after, min(upto, self.floor), cols) if after < self.floor else []
            for ch in self._chunks:
                if not ch.images or ch.max_pos <= after or ch.min_pos > upto or table not in ch.tables:
                    continue
                t = ch.tables[table]
                if ch.min_pos <= after or ch.max_pos > upto:
                    pos = t.column(POS)
                    t = t.filter(pc.and_(pc.greater(pos, after), pc.less_equal(pos, upto)))
                parts.append(t.select(cols + [WEIGHT]))
            if not parts:
                return schema.empty_table()
            return pa.concat_tables(parts).cast(schema)

    def row_count(self, table: str, position: int) -> int:
        """Rows of ``table`` as of ``position`` (the summed weights; no table is built)."""
        with self._lock:
            self.schema(table)
            total = 0
            for ch in self._chunks:
                if ch.min_pos > position or table not in ch.tables:
                    continue
                t = ch.tables[table]
                if not ch.images:
                    total += t.upto(position)
                    continue
                w = t.column(WEIGHT)
                if ch.max_pos > position:
                    w = pc.filter(w, pc.less_equal(t.column(POS), position))
                total += pc.sum(w).as_py() or 0
            return int(total)

    def table_at(self, table: str, position: int, columns: list[str] | None = None) -> pa.Table:
        """The table as of ``position``: snapshot + every change up to it, consolidated, each
        row repeated by its weight. Out: ``columns`` (default all), no weight column.

        Raises SourceError when a row's weight is negative (a retraction of a row that was
        never there: the snapshot and the changes disagree)."""
        z = self.changes(table, INITIAL, position, columns)
        return materialize(z, f"{self.location}: table {table} at position {position}")



class LandingReader(TransactionLog):
    """The complete transactions of one landing directory, read once and kept in memory.

    ``refresh()`` reads event files that arrived since the last call (files are immutable):
    from the landing index (:mod:`..landing_index`) where an entry fits, else by parsing them
    (and indexing them); ``index_stats`` counts files ``parsed``, ``loaded`` from the index,
    and ``workers`` started to index a cold backlog;
    ``latest_position()`` is the position of the last complete transaction (or of the
    snapshot; INITIAL = -1 when there is none); ``changes(table, after, upto)`` and
    ``table_at(table, position)`` return Arrow tables. Use :func:`reader_for` to share one
    reader per directory in a process. Thread-safe.
    """

    def __init__(self, location: str):
        super().__init__(normalize(location))
        self._files: list[tuple[int, str, int, int]] = []   # seq, name, size, mtime_ns (parsed)
        self._parser = EventParser(self.location, self._schemas)
        self._indexed: bool | None = None   # whether the landing index is written (None: not checked yet)
        self.index_stats = {"parsed": 0, "loaded": 0, "workers": 0}

    # -- parsing ---------------------------------------------------------------------------
    def refresh(self) -> "LandingReader":
        """Read new event files: from the landing index (:mod:`..landing_index`) where an entry
        fits, else by parsing them. Raises SourceError (see the module docstring)."""
        with self._lock:
            if not storage.is_dir(self.location):
                raise SourceError(f"landing directory {self.location} does not exist (meta.consistent_stream."
                                  f"location; it is written by `consistent-stream capture postgres --landing ..`)")
            self._schemas = self._parser.schemas = load_schemas(self.location)
            files = list_event_files(self.location)
            known = {seq: (name, size, mt) for seq, name, size, mt in self._files}
            new = []
            expected = (self._files[-1][0] + 1) if self._files else 1
            for seq, name in files:
                path = os.path.join(self.location, name)
                st = storage.stat(path)
                if seq in known:
                    if known[seq][0] != name or (st.size, st.mtime_ns) != known[seq][1:]:
                        raise SourceError(f"{path}: event file changed after it was read; landing files must "
                                          f"be written once (temp file + rename)")
                    continue
                if seq != expected:
                    raise SourceError(f"{path}: gap in the event file sequence: expected file number {expected} "
                                      f"before {seq} (a file is missing; nothing after the gap is read)")
                new.append((seq, name, st.size, st.mtime_ns))
                expected = seq + 1
            if not new:
                return self
            if self._indexed is None:
                self._indexed = landing_index.writable(self.location)
            digest = landing_index.schemas_digest(self._schemas)
            try:
                if self._indexed:
                    missing = [(n, size, mt) for _, n, size, mt in new
                               if not storage.exists(landing_index.entry_path(self.location, n, size, mt, digest))]
                    self.index_stats["workers"] += build_index(self.location, missing, digest)
                for seq, name, size, mtime_ns in new:
                    self._read(seq, name, size, mtime_ns, digest)
            except BaseException:
                self.__init__(self.location)  # nothing half-read survives an error
                raise
            return self

    def _read(self, seq: int, name: str, size: int, mtime_ns: int, digest: str) -> None:
        """One new event file: its landing index entry when it fits the parser's state, else
        parsed in context (and indexed when the parse was one in isolation would give)."""
        before = self._parser.state()
        parsed = None
        if self._indexed and not before.open_tx:
            parsed = landing_index.load(self.location, digest, name, size, mtime_ns)
            if parsed is not None and not parsed.fits(before):
                parsed = None
        if parsed is not None:
            parsed.apply(self._parser)
            self.index_stats["loaded"] += 1
        else:
            parsed = self._parser.parse(name, size, mtime_ns)
            self.index_stats["parsed"] += 1
            if self._indexed and self._parser.open is None:
                if before.snap_position is None and parsed.fits(before):
                    landing_index.store(self.location, digest, parsed)   # what isolation gives
                elif before.snap_position is not None and not before.open_tx:
                    self._index_in_isolation(name, size, mtime_ns, digest)   # inside the snapshot: once
        self._add_chunk(seq, name, parsed.tables)
        self._txs.extend(parsed.txs)
        self._files.append((seq, name, size, mtime_ns))

    def _index_in_isolation(self, name: str, size: int, mtime_ns: int, digest: str) -> None:
        """Index a file read in context inside the snapshot: its entry is what a fresh parser
        makes of it (the snapshot's counts so far are added when the entry is applied)."""
        parser = EventParser(self.location, self._schemas)
        try:
            parsed = parser.parse(name, size, mtime_ns)
        except SourceError:
            return
        if parser.open is None:
            landing_index.store(self.location, digest, parsed)

    def latest_position(self) -> int:
        """Position of the last complete transaction (or the snapshot); -1 when none."""
        with self._lock:
            return self._parser.last_pos

    def snapshot_position(self) -> int | None:
        """P0, the snapshot's position, or None when the landing directory has no snapshot."""
        with self._lock:
            return self._parser.snapshot_pos


def materialize(z: pa.Table, what: str) -> pa.Table:
    """A Z-set whose consolidated weights are all positive -> the relation (rows repeated by
    weight, weight column dropped). SourceError naming ``what`` on a negative weight."""
    g = consolidate_arrow(z)
    cols = [c for c in g.column_names if c != WEIGHT]
    w = g.column(WEIGHT)
    if g.num_rows and pc.min(w).as_py() < 0:
        bad = g.filter(pc.less(w, 0)).slice(0, 1).to_pylist()[0]
        raise SourceError(f"{what}: a row is retracted more often than it was inserted (weight "
                          f"{bad[WEIGHT]}): {bad}; the snapshot and the change events disagree")
    if g.num_rows and pc.max(w).as_py() > 1:
        import numpy as np
        idx = np.repeat(np.arange(g.num_rows), w.to_numpy())
        g = g.take(pa.array(idx))
    return g.select(cols)


_READERS: dict[str, LandingReader] = {}
_READERS_LOCK = threading.Lock()


def reader_for(location: str) -> LandingReader:
    """The process-wide reader of landing directory ``location``, refreshed (new files parsed)."""
    key = normalize(location)
    with _READERS_LOCK:
        r = _READERS.get(key)
        if r is None:
            r = _READERS[key] = LandingReader(key)
    return r.refresh()


def forget_reader(location: str) -> None:
    """Drop the cached reader of ``location`` (after its files were deleted and rewritten)."""
    with _READERS_LOCK:
        _READERS.pop(normalize(location), None)


class DebeziumSource:
    """One captured table of a landing directory (``format: debezium``), through the
    process-wide :class:`LandingReader` of its directory. Positions are transaction positions;
    the table as of position X is the snapshot plus every change up to X. Everything is read
    on the driver (the landing reader parses JSON there), the snapshot of a first batch too.
    Every table of the directory shares its clock (the transaction log); a backlog may end a
    batch after any transaction."""
    splits_backlog = True
    reads_beside_others = False   # (the tables of one landing directory share its process-wide reader)
    reads_before_lock = False     # (that reader consumes the directory: opened under the lock)

    def __init__(self, spec):
        self.spec = spec
        self.clock = f"landing:{spec.location}"
        self._reader: LandingReader | None = None

    def reader(self, refresh: bool = False, upto: int | None = None) -> LandingReader:
        """The landing directory's reader; refreshed (new files parsed) when asked, or when it
        has not seen position ``upto`` yet (a cut taken by the streaming source)."""
        if self._reader is None or refresh or (upto is not None and upto > self._reader.latest_position()):
            self._reader = self._open_reader()
        return self._reader

    def _open_reader(self) -> TransactionLog:
        """The process-wide reader of this source's log, refreshed."""
        return reader_for(self.spec.location)

    def columns(self) -> list[str]:
        return self.reader().schema(self.spec.table).column_names

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema
        return from_arrow_schema(self.reader().schema(self.spec.table).arrow_schema())

    def latest_position(self) -> int:
        return self.reader(refresh=True).latest_position()

    def waiting_for(self) -> str:
        return (f"the landing directory {self.spec.location} holds no complete snapshot and no complete transaction "
                f"yet: wait until capture has written the snapshot (its event marked snapshot 'last'), then run again")

    def rows(self, position: int) -> int:
        return self.reader(upto=position).row_count(self.spec.table, position)

    def commits(self, start: int, end: int) -> list:
        """The transactions in ``(start, end]`` with their commit times and this table's change
        events."""
        from ..backlog import SourceCommit
        return [SourceCommit(tx.position, tx.ts_ms, tx.counts.get(self.spec.table, 0))
                for tx in self.reader(upto=end).transactions(start, end)]

    def commit_ms(self, position: int) -> int:
        return self.reader(upto=position).commit_ms(position)

    def base_positions(self, position: int) -> dict[str, int]:
        """A base source reflects itself: ``{key: position}``."""
        return {self.spec.key: position}

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """``cut_lsn``: the landing directory -> the position as a PostgreSQL LSN."""
        from ..landing import format_lsn
        return {"cut_lsn": {self.spec.location: format_lsn(position)}}

    def _changelog(self, views, data: pa.Table, *, change: bool):
        from ...changelog import Changelog
        from pyspark.sql.pandas.types import from_arrow_schema
        make = Changelog.of_source_change if change else Changelog.of_arrow
        return make(views, data, schema=from_arrow_schema(data.schema))

    def snapshot(self, views, position: int, columns, *, on_driver: bool = False):
        """The table at ``position``, every row +1; always on the driver (the landing files
        are read there)."""
        rel = self.reader(upto=position).table_at(self.spec.table, position, columns)
        z = rel.append_column(WEIGHT, pa.array([1] * rel.num_rows, pa.int64()))
        return self._changelog(views, z, change=False)

    def snapshot_arrow(self, position: int) -> pa.Table:
        return self.reader(upto=position).table_at(self.spec.table, position)

    def snapshot_dataframe(self, spark, position: int):
        from ...changelog import arrow_to_spark
        return arrow_to_spark(spark, self.snapshot_arrow(position))

    def changes(self, views, start: int, end: int, columns):
        from ..delta_cdf import SourceChanges
        z = self.reader(upto=end).changes(self.spec.table, start, end, columns)
        ms = self.reader().commit_ms(end) if z.num_rows else None
        return SourceChanges(self._changelog(views, z, change=True), z.num_rows, ms)
