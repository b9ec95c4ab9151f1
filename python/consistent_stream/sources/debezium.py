"""Debezium JSON change events in a landing directory, as changelogs cut at transactions.

Input: the event files of a landing directory (layout in :mod:`.landing`), JSON lines, each a
Debezium event with or without the ``{"schema": .., "payload": ..}`` envelope:

* change events: ``op`` (``c`` create, ``u`` update, ``d`` delete, ``r`` snapshot read),
  ``before``, ``after``, ``source`` {``schema``, ``table``, ``lsn``, ``txId``, ``ts_ms``,
  ``snapshot``} and optionally ``transaction`` {``id``};
* Debezium's transaction metadata events: ``status`` ``BEGIN`` / ``END``, ``id``,
  ``event_count`` and ``data_collections`` [{``data_collection``, ``event_count``}] (END),
  ``ts_ms``. The ``id`` is Debezium PostgreSQL's ``"<txId>:<LSN>"``; the LSN (a decimal
  integer or ``X/Y``) is the transaction's *position*: it must grow strictly in file order.
  ``consistent-stream capture postgres`` writes the LSN just past the commit record.
* a ``null`` line (Debezium's tombstone) is skipped.

Snapshot: ``op: r`` events outside any transaction form the snapshot. They share one
``source.lsn``, P0, which is the snapshot's position, and the snapshot is complete at the
event whose ``source.snapshot`` is ``"last"`` (Debezium's marker). Transactions whose
position is <= P0 are already in the snapshot and are skipped (no overlap).

Output (Z-set changelogs, DBSP's vocabulary): per table, the table's columns (typed by its
``_schemas/<table>.json``) plus ``__weight`` int64: ``c``/``r`` -> +after, ``d`` -> -before,
``u`` -> -before, +after. Changes are returned only for a range of positions
``(after, upto]`` made of *complete* transactions, in commit order: a micro-batch holds a
transaction entirely or not at all, across all tables of the landing directory (the idea of
TiFlink's transaction-consistent checkpoints, with the source database's commit order in
place of a global timestamp). A trailing transaction whose END has not arrived yet is simply
not available yet.

Errors (``SourceError``, naming the file, line and byte offset): malformed JSON, an event that
is neither a change nor transaction metadata, an unknown ``op``, an event for a table with no
schema file, a change event outside a transaction (other than snapshot reads), a BEGIN while a
transaction is open (its END never arrived although later transactions exist), an END that does
not match its BEGIN or whose counts differ from the events seen, positions that do not grow, a
missing event file in the sequence, an update or delete without a ``before`` image (the table
needs ``REPLICA IDENTITY FULL``), a row whose columns differ from the schema file, a file that
changed after it was read.
"""
from __future__ import annotations

import bisect
import datetime
import decimal
import json
import logging
import os
import threading
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..changelog import consolidate_arrow
from ..errors import SourceError
from .landing import TableSchema, arrow_type, list_event_files, load_schemas, parse_lsn

log = logging.getLogger(__name__)

WEIGHT = "__weight"
POS = "__pos"
INITIAL = -1
_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_TS = datetime.datetime(1970, 1, 1)


@dataclass(frozen=True)
class TxInfo:
    """One complete transaction (or the snapshot): ``position`` (commit LSN, int), ``id``,
    ``ts_ms`` (commit time, ms since epoch), ``counts`` (table -> change events), and where its
    END is (``file``, ``line``, 1-based)."""
    position: int
    id: str
    ts_ms: int
    counts: dict
    file: str
    line: int
    snapshot: bool = False


@dataclass
class _Open:
    id: str
    position: int
    ts_ms: int
    where: str
    skip: bool
    rows: dict = field(default_factory=dict)   # table -> list of (weight, row dict, where)
    counts: dict = field(default_factory=dict)
    snapshot: bool = False


@dataclass
class _Chunk:
    """The complete transactions whose END is in one event file: per table an Arrow table of
    the table's columns + __pos + __weight."""
    seq: int
    name: str
    min_pos: int
    max_pos: int
    tables: dict


def _err(where: str, msg: str) -> SourceError:
    return SourceError(f"{where}: {msg}")


def _parse_json(raw: bytes, where: str, exact: bool = False):
    """One JSON line, unwrapped from Debezium's ``{"schema", "payload"}`` envelope. orjson
    (C, several times faster than ``json``) unless ``exact`` or orjson refuses the line
    (integers past 64 bits, NaN): then ``json`` with numbers with a fraction as ``Decimal``,
    whose error names the position."""
    obj = None
    if not exact:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            exact = True
    if exact:
        try:
            obj = json.loads(raw, parse_float=decimal.Decimal)
        except ValueError as e:
            raise _err(where, f"malformed JSON line: {e}") from None
    if isinstance(obj, dict) and "payload" in obj and "schema" in obj:
        obj = obj["payload"]
    return obj


def _table_of(source: dict) -> str:
    """A change event's table, ``<schema>.<table>`` (``source.table`` alone without a schema)."""
    return f"{source.get('schema')}.{source.get('table')}" if source.get("schema") else str(source.get("table"))


def _tx_position(tx_id, where: str) -> int:
    s = str(tx_id)
    _, sep, lsn = s.rpartition(":")
    try:
        if not sep:
            raise ValueError
        return parse_lsn(lsn)
    except ValueError:
        raise _err(where, f"transaction id {tx_id!r} is not Debezium PostgreSQL's '<txId>:<LSN>'; "
                          f"the LSN gives the transaction's commit position") from None


def _convert_column(values: list, type_name: str, where: str, column: str) -> pa.Array:
    """JSON values of one column -> an Arrow array of the column's type (module table)."""
    t = arrow_type(type_name)
    try:
        if pa.types.is_decimal(t):
            vals = [None if v is None else decimal.Decimal(str(v)) for v in values]
            return pa.array(vals, type=t)
        if pa.types.is_date(t):
            vals = [None if v is None else (_EPOCH_DATE + datetime.timedelta(days=v) if isinstance(v, int)
                                            else datetime.date.fromisoformat(str(v))) for v in values]
            return pa.array(vals, type=t)
        if pa.types.is_timestamp(t):
            out = []
            for v in values:
                if v is None or isinstance(v, int):
                    out.append(v)
                else:
                    dt = datetime.datetime.fromisoformat(str(v).replace("Z", "+00:00"))
                    if dt.tzinfo is not None:
                        dt = dt.astimezone(datetime.timezone.utc).replace(tzinfo=None)
                    out.append((dt - _EPOCH_TS) // datetime.timedelta(microseconds=1))
            return pa.array(out, type=pa.int64()).cast(t)
        if pa.types.is_floating(t):
            return pa.array([None if v is None else float(v) for v in values], type=t)
        return pa.array(values, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, decimal.InvalidOperation, OverflowError) as e:
        raise _err(where, f"column {column!r} has a value that is not a {type_name}: {e}") from e


class LandingReader:
    """The complete transactions of one landing directory, parsed once and kept in memory.

    ``refresh()`` parses event files that arrived since the last call (files are immutable);
    ``latest_position()`` is the position of the last complete transaction (or of the
    snapshot; INITIAL = -1 when there is none); ``changes(table, after, upto)`` and
    ``table_at(table, position)`` return Arrow tables. Use :func:`reader_for` to share one
    reader per directory in a process. Thread-safe.
    """

    def __init__(self, location: str):
        self.location = os.path.abspath(location)
        self._lock = threading.RLock()
        self._schemas: dict[str, TableSchema] = {}
        self._files: list[tuple[int, str, int, int]] = []   # seq, name, size, mtime_ns (parsed)
        self._chunks: list[_Chunk] = []
        self._txs: list[TxInfo] = []
        self._open: _Open | None = None
        self._snap: _Open | None = None
        self._snapshot_pos: int | None = None
        self._last_pos = INITIAL
        self._started_tx = False

    # -- parsing ---------------------------------------------------------------------------
    def refresh(self) -> "LandingReader":
        """Parse new event files. Raises SourceError (see the module docstring)."""
        with self._lock:
            if not os.path.isdir(self.location):
                raise SourceError(f"landing directory {self.location} does not exist (meta.consistent_stream."
                                  f"location; it is written by `consistent-stream capture postgres --landing ..`)")
            self._schemas = load_schemas(self.location)
            files = list_event_files(self.location)
            known = {seq: (name, size, mt) for seq, name, size, mt in self._files}
            for seq, name in files:
                if seq in known:
                    st = os.stat(os.path.join(self.location, name))
                    if known[seq][0] != name or (st.st_size, st.st_mtime_ns) != known[seq][1:]:
                        raise SourceError(f"{os.path.join(self.location, name)}: event file changed after it was "
                                          f"read; landing files must be written once (temp file + rename)")
            expected = (self._files[-1][0] + 1) if self._files else 1
            for seq, name in files:
                if seq in known:
                    continue
                path = os.path.join(self.location, name)
                if seq != expected:
                    raise SourceError(f"{path}: gap in the event file sequence: expected file number {expected} "
                                      f"before {seq} (a file is missing; nothing after the gap is read)")
                try:
                    self._parse_file(seq, name)
                except BaseException:
                    self.__init__(self.location)  # nothing half-parsed survives an error
                    raise
                expected = seq + 1
            return self

    def _parse_file(self, seq: int, name: str) -> None:
        path = os.path.join(self.location, name)
        st = os.stat(path)
        acc: dict[str, dict[str, list]] = {}
        positions: list[int] = []
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            where = f"{path}:{lineno} (byte {offset})"
            offset += len(raw) + 1
            if not raw.strip():
                continue
            obj = _parse_json(raw, where)
            if self._inexact(obj):
                obj = _parse_json(raw, where, exact=True)
            if obj is None:
                continue  # tombstone
            if not isinstance(obj, dict):
                raise _err(where, "expected a JSON object (a Debezium change or transaction event)")
            if "status" in obj:
                done = self._metadata(obj, where)
            elif "op" in obj:
                done = self._change(obj, where)
            else:
                raise _err(where, "neither a change event (no 'op') nor transaction metadata (no 'status')")
            if done is not None:
                self._emit(done, acc, positions, where, name, lineno)
        tables = {}
        for table, cols in acc.items():
            ts = self._schemas[table]
            arrays = [_convert_column(cols[c.name], c.type, path, c.name) for c in ts.columns]
            arrays += [pa.array(cols[POS], pa.int64()), pa.array(cols[WEIGHT], pa.int64())]
            tables[table] = pa.Table.from_arrays(arrays, names=ts.column_names + [POS, WEIGHT])
        if positions:
            self._chunks.append(_Chunk(seq, name, min(positions), max(positions), tables))
        self._files.append((seq, name, st.st_size, st.st_mtime_ns))

    def _inexact(self, obj) -> bool:
        """Whether a change event holds a JSON number with a fraction or exponent (parsed as
        a float) in a DECIMAL column: such a line is parsed again keeping exact decimals."""
        if not isinstance(obj, dict) or "op" not in obj or not isinstance(obj.get("source"), dict):
            return False
        ts = self._schemas.get(_table_of(obj["source"]))
        if ts is None or not ts.has_decimal:
            return False
        return any(isinstance(img, dict) and any(type(v) is float for v in img.values())
                   for img in (obj.get("before"), obj.get("after")))

    def _metadata(self, obj: dict, where: str) -> _Open | None:
        status = str(obj.get("status")).upper()
        tx_id = obj.get("id")
        if status == "BEGIN":
            if self._open is not None:
                raise _err(where, f"BEGIN of transaction {tx_id} while transaction {self._open.id} (BEGIN at "
                                  f"{self._open.where}) has no END: its END never arrived although later "
                                  f"transactions exist")
            self._close_snapshot_or_fail(where)
            pos = _tx_position(tx_id, where)
            skip = self._snapshot_pos is not None and pos <= self._snapshot_pos
            if not skip and pos <= self._last_pos:
                raise _err(where, f"transaction {tx_id} has position {pos}, not after the previous position "
                                  f"{self._last_pos}: positions must grow in file order (duplicate or reordered "
                                  f"transaction)")
            self._open = _Open(str(tx_id), pos, int(obj.get("ts_ms") or 0), where, skip)
            self._started_tx = True
            return None
        if status == "END":
            tx = self._open
            if tx is None or str(tx_id) != tx.id:
                raise _err(where, f"END of transaction {tx_id} without its BEGIN"
                                  + (f" (the open transaction is {tx.id})" if tx else ""))
            n = sum(tx.counts.values())
            if "event_count" in obj and int(obj["event_count"]) != n:
                raise _err(where, f"END of transaction {tx_id} says event_count {obj['event_count']} but "
                                  f"{n} change events were read since its BEGIN at {tx.where}")
            if "data_collections" in obj:
                said = {str(d.get("data_collection")): int(d.get("event_count", 0))
                        for d in obj.get("data_collections") or []}
                said = {k: v for k, v in said.items() if v}
                if said != tx.counts:
                    raise _err(where, f"END of transaction {tx_id}: data_collections counts {said} differ from "
                                      f"the change events read {tx.counts}")
            if obj.get("ts_ms"):
                tx.ts_ms = int(obj["ts_ms"])
            self._open = None
            return tx
        raise _err(where, f"transaction metadata with status {obj.get('status')!r}; expected BEGIN or END")

    def _close_snapshot_or_fail(self, where: str) -> None:
        if self._snap is not None:
            raise _err(where, f"a transaction starts while the snapshot (first read at {self._snap.where}) "
                              f"has no event with source.snapshot = 'last': the snapshot is incomplete")

    def _change(self, obj: dict, where: str) -> _Open | None:
        op = obj.get("op")
        if op not in ("c", "u", "d", "r"):
            raise _err(where, f"unknown op {op!r}; expected c, u, d or r")
        src = obj.get("source")
        if not isinstance(src, dict) or "table" not in src:
            raise _err(where, "change event without source.table")
        table = _table_of(src)
        if table not in self._schemas:
            raise _err(where, f"event for unknown table {table!r}: no schema file "
                              f"{os.path.join(self.location, '_schemas', table + '.json')} "
                              f"(known: {sorted(self._schemas) or 'none'})")
        done = None
        if self._open is not None:
            tx = self._open
            t = obj.get("transaction")
            if isinstance(t, dict) and t.get("id") is not None and str(t["id"]) != tx.id:
                raise _err(where, f"event of transaction {t['id']} inside transaction {tx.id} (BEGIN at {tx.where})")
        elif op == "r":
            if self._started_tx:
                raise _err(where, "snapshot read (op r) after transactions began; a snapshot must come first")
            try:
                pos = parse_lsn(src.get("lsn"))
            except (TypeError, ValueError):
                raise _err(where, f"snapshot read without a valid source.lsn ({src.get('lsn')!r})") from None
            if self._snap is None:
                self._snap = _Open(f"snapshot:{pos}", pos, int(src.get("ts_ms") or 0), where, False, snapshot=True)
            elif pos != self._snap.position:
                raise _err(where, f"snapshot read at source.lsn {pos}, but the snapshot began at "
                                  f"{self._snap.position} ({self._snap.where}); a snapshot has one position")
            tx = self._snap
            if str(src.get("snapshot")).lower() == "last":
                done, self._snap = tx, None
        else:
            raise _err(where, f"change event (op {op}) outside a transaction: the capture must write "
                              f"Debezium's transaction metadata (BEGIN/END; provide.transaction.metadata=true)")
        tx.counts[table] = tx.counts.get(table, 0) + 1
        if not tx.skip:
            rows = tx.rows.setdefault(table, [])
            if op in ("u", "d"):
                if not isinstance(obj.get("before"), dict):
                    raise _err(where, f"op {op} on {table} without a 'before' image: retractions need the whole "
                                      f"old row; run ALTER TABLE {table} REPLICA IDENTITY FULL")
                rows.append((-1, obj["before"], where))
            if op in ("c", "u", "r"):
                if not isinstance(obj.get("after"), dict):
                    raise _err(where, f"op {op} on {table} without an 'after' image")
                rows.append((1, obj["after"], where))
        return done

    def _emit(self, tx: _Open, acc: dict, positions: list, where: str, name: str, lineno: int) -> None:
        if tx.skip:
            log.info("%s: transaction %s is at or before the snapshot position %s: already in the snapshot, "
                     "skipped", where, tx.id, self._snapshot_pos)
            return
        if tx.snapshot:
            self._snapshot_pos = tx.position
        for table, rows in tx.rows.items():
            cols = acc.setdefault(table, {c: [] for c in self._schemas[table].column_names + [POS, WEIGHT]})
            names = self._schemas[table].column_names
            name_set = set(names)
            for w, row, rwhere in rows:
                if row.keys() != name_set:
                    extra, missing = sorted(set(row) - name_set), sorted(name_set - set(row))
                    raise _err(rwhere, f"row of {table} does not match its schema file (columns {names}): "
                                       f"unknown columns {extra}, missing columns {missing}; schema changes of "
                                       f"captured tables are not supported (start a new landing directory)")
                for c in names:
                    cols[c].append(row.get(c))
                cols[POS].append(tx.position)
                cols[WEIGHT].append(w)
        self._last_pos = tx.position
        positions.append(tx.position)
        self._txs.append(TxInfo(tx.position, tx.id, tx.ts_ms, dict(tx.counts), name, lineno, tx.snapshot))

    # -- reading ---------------------------------------------------------------------------
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

    def latest_position(self) -> int:
        """Position of the last complete transaction (or the snapshot); -1 when none."""
        with self._lock:
            return self._last_pos

    def snapshot_position(self) -> int | None:
        """P0, the snapshot's position, or None when the landing directory has no snapshot."""
        with self._lock:
            return self._snapshot_pos

    def transactions(self, after: int | None = None, upto: int | None = None) -> list[TxInfo]:
        """The complete transactions in commit order (the snapshot first, when there is one);
        only those with ``after < position <= upto`` when given (a binary search: positions
        grow)."""
        with self._lock:
            lo = 0 if after is None else bisect.bisect_right(self._txs, after, key=lambda t: t.position)
            hi = len(self._txs) if upto is None else bisect.bisect_right(self._txs, upto, key=lambda t: t.position)
            return self._txs[lo:hi]

    def commit_ms(self, position: int) -> int:
        """Commit time (ms since epoch) of the newest transaction at or before ``position``;
        0 when there is none."""
        with self._lock:
            i = bisect.bisect_right(self._txs, position, key=lambda t: t.position)
            return self._txs[i - 1].ts_ms if i else 0

    def _check_upto(self, upto: int) -> None:
        if upto > self._last_pos:
            raise SourceError(f"{self.location}: position {upto} is past the last complete transaction "
                              f"{self._last_pos} (files missing or deleted since the cut was taken?)")

    def changes(self, table: str, after: int, upto: int, columns: list[str] | None = None) -> pa.Table:
        """The changes of ``table`` from the transactions with ``after < position <= upto``
        (the snapshot is at P0), in commit order: ``columns`` (default all) + ``__weight``
        int64, not consolidated. Raises SourceError when ``upto`` is past the last complete
        transaction or ``table`` is unknown."""
        with self._lock:
            ts = self.schema(table)
            self._check_upto(upto)
            cols = list(columns) if columns is not None else ts.column_names
            unknown = [c for c in cols if c not in ts.column_names]
            if unknown:
                raise SourceError(f"{self.location}: table {table} has no columns {unknown} (has {ts.column_names})")
            parts = []
            for ch in self._chunks:
                if ch.max_pos <= after or ch.min_pos > upto or table not in ch.tables:
                    continue
                t = ch.tables[table]
                if ch.min_pos <= after or ch.max_pos > upto:
                    pos = t.column(POS)
                    t = t.filter(pc.and_(pc.greater(pos, after), pc.less_equal(pos, upto)))
                parts.append(t.select(cols + [WEIGHT]))
            schema = pa.schema([ts.arrow_schema().field(c) for c in cols] + [pa.field(WEIGHT, pa.int64())])
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
    key = os.path.abspath(location)
    with _READERS_LOCK:
        r = _READERS.get(key)
        if r is None:
            r = _READERS[key] = LandingReader(key)
    return r.refresh()


def forget_reader(location: str) -> None:
    """Drop the cached reader of ``location`` (after its files were deleted and rewritten)."""
    with _READERS_LOCK:
        _READERS.pop(os.path.abspath(location), None)


class DebeziumSource:
    """One captured table of a landing directory (``format: debezium``), through the
    process-wide :class:`LandingReader` of its directory. Positions are transaction positions;
    the table as of position X is the snapshot plus every change up to X. Everything is read
    on the driver (the landing reader parses JSON there), the snapshot of a first batch too.
    Every table of the directory shares its clock (the transaction log); a backlog may end a
    batch after any transaction."""
    splits_backlog = True

    def __init__(self, spec):
        self.spec = spec
        self.clock = f"landing:{spec.location}"
        self._reader: LandingReader | None = None

    def reader(self, refresh: bool = False, upto: int | None = None) -> LandingReader:
        """The landing directory's reader; refreshed (new files parsed) when asked, or when it
        has not seen position ``upto`` yet (a cut taken by the streaming source)."""
        if self._reader is None or refresh or (upto is not None and upto > self._reader.latest_position()):
            self._reader = reader_for(self.spec.location)
        return self._reader

    def columns(self) -> list[str]:
        return self.reader().schema(self.spec.table).column_names

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema
        return from_arrow_schema(self.reader().schema(self.spec.table).arrow_schema())

    def latest_position(self) -> int:
        return self.reader(refresh=True).latest_position()

    def rows(self, position: int) -> int:
        return self.reader(upto=position).row_count(self.spec.table, position)

    def commits(self, start: int, end: int) -> list:
        """The transactions in ``(start, end]`` with their commit times and this table's change
        events."""
        from .backlog import SourceCommit
        return [SourceCommit(tx.position, tx.ts_ms, tx.counts.get(self.spec.table, 0))
                for tx in self.reader(upto=end).transactions(start, end)]

    def commit_ms(self, position: int) -> int:
        return self.reader(upto=position).commit_ms(position)

    def base_positions(self, position: int) -> dict[str, int]:
        """A base source reflects itself: ``{key: position}``."""
        return {self.spec.key: position}

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """``cut_lsn``: the landing directory -> the position as a PostgreSQL LSN."""
        from .landing import format_lsn
        return {"cut_lsn": {self.spec.location: format_lsn(position)}}

    def _changelog(self, views, data: pa.Table, *, change: bool):
        from ..changelog import Changelog
        from pyspark.sql.pandas.types import from_arrow_schema
        make = Changelog.of_source_change if change else Changelog.of_arrow
        return make(views, data, schema=from_arrow_schema(data.schema))

    def snapshot(self, views, position: int, columns):
        rel = self.reader(upto=position).table_at(self.spec.table, position, columns)
        z = rel.append_column(WEIGHT, pa.array([1] * rel.num_rows, pa.int64()))
        return self._changelog(views, z, change=False)

    def snapshot_arrow(self, position: int) -> pa.Table:
        return self.reader(upto=position).table_at(self.spec.table, position)

    def snapshot_dataframe(self, spark, position: int):
        from ..changelog import arrow_to_spark
        return arrow_to_spark(spark, self.snapshot_arrow(position))

    def changes(self, views, start: int, end: int, columns):
        from .delta_cdf import SourceChanges
        z = self.reader(upto=end).changes(self.spec.table, start, end, columns)
        ms = self.reader().commit_ms(end) if z.num_rows else None
        return SourceChanges(self._changelog(views, z, change=True), z.num_rows, ms)
