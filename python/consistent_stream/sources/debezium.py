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
from operator import itemgetter

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..changelog import consolidate_arrow
from ..errors import SourceError
from . import landing_index
from .landing import TableSchema, arrow_type, list_event_files, load_schemas, parse_lsn
from .landing_index import ParsedFile, ParserState, TxInfo

log = logging.getLogger(__name__)

WEIGHT = "__weight"
POS = "__pos"
INITIAL = -1
_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_TS = datetime.datetime(1970, 1, 1)


# Where an event is: (file path, line number 1-based, byte offset); formatted only for errors,
# since every line has one and few are ever reported.
Where = tuple


def _at(where) -> str:
    """``Where`` -> ``'<file>:<line> (byte <offset>)'`` (a string passes through)."""
    if isinstance(where, tuple):
        path, line, offset = where
        return f"{path}:{line} (byte {offset})"
    return str(where)


@dataclass
class _Open:
    id: str
    position: int
    ts_ms: int
    where: Where
    skip: bool
    rows: dict = field(default_factory=dict)   # table -> list of (position, weight, row dict, Where)
    counts: dict = field(default_factory=dict)
    snapshot: bool = False


@dataclass
class _Chunk:
    """The rows of one event file: of the complete transactions whose END is in it, and the
    snapshot reads in it; per table an Arrow table of the table's columns + __pos + __weight."""
    seq: int
    name: str
    min_pos: int
    max_pos: int
    tables: dict


def _min_max(a) -> tuple[int, int]:
    m = pc.min_max(a)
    return m["min"].as_py(), m["max"].as_py()


def _err(where, msg: str) -> SourceError:
    return SourceError(f"{_at(where)}: {msg}")


def _parse_json(raw: bytes, where, exact: bool = False):
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


def _tx_position(tx_id, where) -> int:
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


class _Parser:
    """Debezium events -> complete transactions, one event file at a time (the semantics in the
    module docstring). Its state carries from file to file: the open transaction (a capture may
    cut a file inside a long one), the snapshot being read, the snapshot's position, the last
    position and whether transactions began. A fresh parser reads a file *in isolation*, the
    way an entry of the landing index (:mod:`.landing_index`) is made."""

    def __init__(self, location: str, schemas: dict[str, TableSchema]):
        self.location = location
        self.schemas = schemas
        self.open: _Open | None = None
        self.snap: _Open | None = None
        self.snapshot_pos: int | None = None
        self.last_pos = INITIAL
        self.started_tx = False
        self.out: ParsedFile | None = None    # the file being parsed
        self.acc: dict | None = None           # its rows, per table
        self.leading = False                   # no event of it read yet

    def state(self) -> ParserState:
        return ParserState(self.open is not None, self.snap.position if self.snap is not None else None,
                           self.snapshot_pos, self.last_pos, self.started_tx)

    def parse(self, name: str, size: int, mtime_ns: int) -> ParsedFile:
        """Parse event file ``name`` (of this size and mtime) in the parser's state, which it
        moves past the file: the transactions whose END is in it, as a :class:`ParsedFile`.

        The hot loop of a catch-up (a 410,000-event pgbench backlog is 920,000 lines): one
        orjson call per line, no string formatting unless an error is raised, rows kept as the
        parsed dicts and turned into columns once per file (``itemgetter`` + ``zip``)."""
        path = os.path.join(self.location, name)
        acc: dict[str, list] = {}   # table -> rows (position, weight, row dict, Where)
        self.acc = acc
        out = self.out = ParsedFile(name, size, mtime_ns)
        self.leading = True   # no event read yet in this file
        with open(path, "rb") as f:
            data = f.read()
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        decimals = any(ts.has_decimal for ts in self.schemas.values())
        offset = 0
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            where = (path, lineno, offset)
            offset += len(raw) + 1
            if not raw or raw.isspace():
                continue
            try:
                obj = loads(raw)
                if type(obj) is dict and "payload" in obj and "schema" in obj:
                    obj = obj["payload"]
            except decode_error:
                obj = _parse_json(raw, where, exact=True)
            if decimals and self._inexact(obj):
                obj = _parse_json(raw, where, exact=True)
            if obj is None:
                continue  # tombstone
            if type(obj) is not dict:
                raise _err(where, "expected a JSON object (a Debezium change or transaction event)")
            if "status" in obj:
                done = self._metadata(obj, where)
            elif "op" in obj:
                done = self._change(obj, where)
            else:
                raise _err(where, "neither a change event (no 'op') nor transaction metadata (no 'status')")
            if done is not None:
                self._emit(done, acc, out, lineno)
            self.leading = False
        out.tables = {table: self._columns(table, rows, path) for table, rows in acc.items()}
        if self.snap is not None:
            s = self.snap
            out.snap_end = {"position": s.position, "ts_ms": s.ts_ms, "counts": dict(s.counts), "where": list(s.where)}
        self.out = self.acc = None
        return out

    def _columns(self, table: str, rows: list, path: str) -> pa.Table:
        """The rows (position, weight, row dict, Where) of one table in one file -> an Arrow
        table of the table's columns (typed by its schema file) + __pos + __weight. Raises
        SourceError naming the line of a row whose columns differ from the schema file."""
        ts = self.schemas[table]
        names = ts.column_names
        name_set = set(names)
        for _, _, row, rwhere in rows:
            if row.keys() != name_set:
                extra, missing = sorted(set(row) - name_set), sorted(name_set - set(row))
                raise _err(rwhere, f"row of {table} does not match its schema file (columns {names}): "
                                   f"unknown columns {extra}, missing columns {missing}; schema changes of "
                                   f"captured tables are not supported (start a new landing directory)")
        get = itemgetter(*names)
        values = [get(r[2]) for r in rows]
        columns = list(zip(*values)) if len(names) > 1 else [values]
        arrays = [_convert_column(list(vals), c.type, path, c.name) for c, vals in zip(ts.columns, columns)]
        arrays += [pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows], pa.int64())]
        return pa.Table.from_arrays(arrays, names=names + [POS, WEIGHT])

    def _inexact(self, obj) -> bool:
        """Whether a change event holds a JSON number with a fraction or exponent (parsed as
        a float) in a DECIMAL column: such a line is parsed again keeping exact decimals."""
        if not isinstance(obj, dict) or "op" not in obj or not isinstance(obj.get("source"), dict):
            return False
        ts = self.schemas.get(_table_of(obj["source"]))
        if ts is None or not ts.has_decimal:
            return False
        return any(isinstance(img, dict) and any(type(v) is float for v in img.values())
                   for img in (obj.get("before"), obj.get("after")))

    def _metadata(self, obj: dict, where: str) -> _Open | None:
        status = str(obj.get("status")).upper()
        tx_id = obj.get("id")
        if status == "BEGIN":
            if self.open is not None:
                raise _err(where, f"BEGIN of transaction {tx_id} while transaction {self.open.id} (BEGIN at "
                                  f"{_at(self.open.where)}) has no END: its END never arrived although later "
                                  f"transactions exist")
            self._close_snapshot_or_fail(where)
            pos = _tx_position(tx_id, where)
            skip = self.snapshot_pos is not None and pos <= self.snapshot_pos
            if not skip and pos <= self.last_pos:
                raise _err(where, f"transaction {tx_id} has position {pos}, not after the previous position "
                                  f"{self.last_pos}: positions must grow in file order (duplicate or reordered "
                                  f"transaction)")
            self.open = _Open(str(tx_id), pos, int(obj.get("ts_ms") or 0), where, skip)
            self.started_tx = True
            out = self.out
            out.began = True
            if out.first_pos is None:
                out.first_pos = pos
            return None
        if status == "END":
            tx = self.open
            if tx is None or str(tx_id) != tx.id:
                raise _err(where, f"END of transaction {tx_id} without its BEGIN"
                                  + (f" (the open transaction is {tx.id})" if tx else ""))
            n = sum(tx.counts.values())
            if "event_count" in obj and int(obj["event_count"]) != n:
                raise _err(where, f"END of transaction {tx_id} says event_count {obj['event_count']} but "
                                  f"{n} change events were read since its BEGIN at {_at(tx.where)}")
            if "data_collections" in obj:
                said = {str(d.get("data_collection")): int(d.get("event_count", 0))
                        for d in obj.get("data_collections") or []}
                said = {k: v for k, v in said.items() if v}
                if said != tx.counts:
                    raise _err(where, f"END of transaction {tx_id}: data_collections counts {said} differ from "
                                      f"the change events read {tx.counts}")
            if obj.get("ts_ms"):
                tx.ts_ms = int(obj["ts_ms"])
            self.open = None
            return tx
        raise _err(where, f"transaction metadata with status {obj.get('status')!r}; expected BEGIN or END")

    def _close_snapshot_or_fail(self, where: str) -> None:
        if self.snap is not None:
            raise _err(where, f"a transaction starts while the snapshot (first read at {_at(self.snap.where)}) "
                              f"has no event with source.snapshot = 'last': the snapshot is incomplete")

    def _change(self, obj: dict, where: Where) -> _Open | None:
        op = obj.get("op")
        if op not in ("c", "u", "d", "r"):
            raise _err(where, f"unknown op {op!r}; expected c, u, d or r")
        src = obj.get("source")
        if type(src) is not dict or "table" not in src:
            raise _err(where, "change event without source.table")
        table = _table_of(src)
        if table not in self.schemas:
            raise _err(where, f"event for unknown table {table!r}: no schema file "
                              f"{os.path.join(self.location, '_schemas', table + '.json')} "
                              f"(known: {sorted(self.schemas) or 'none'})")
        done = None
        tx = self.open
        if tx is not None:
            t = obj.get("transaction")
            if type(t) is dict and t.get("id") is not None and str(t["id"]) != tx.id:
                raise _err(where, f"event of transaction {t['id']} inside transaction {tx.id} "
                                  f"(BEGIN at {_at(tx.where)})")
        elif op == "r":
            if self.started_tx:
                raise _err(where, "snapshot read (op r) after transactions began; a snapshot must come first")
            try:
                pos = parse_lsn(src.get("lsn"))
            except (TypeError, ValueError):
                raise _err(where, f"snapshot read without a valid source.lsn ({src.get('lsn')!r})") from None
            if self.snap is None:
                self.snap = _Open(f"snapshot:{pos}", pos, int(src.get("ts_ms") or 0), where, False, snapshot=True)
                if self.leading:
                    self.out.leading_snapshot = pos
            elif pos != self.snap.position:
                raise _err(where, f"snapshot read at source.lsn {pos}, but the snapshot began at "
                                  f"{self.snap.position} ({_at(self.snap.where)}); a snapshot has one position")
            tx = self.snap
            self.out.snapshot_reads = True
            if str(src.get("snapshot")).lower() == "last":
                done, self.snap = tx, None
        else:
            raise _err(where, f"change event (op {op}) outside a transaction: the capture must write "
                              f"Debezium's transaction metadata (BEGIN/END; provide.transaction.metadata=true)")
        counts = tx.counts
        counts[table] = counts.get(table, 0) + 1
        if not tx.skip:
            # a transaction's rows wait for its END; the snapshot's go to the file's rows at
            # once (at position P0, past latest_position() until the snapshot is complete), so
            # that a file cut inside the snapshot holds its own rows
            held = self.acc if tx.snapshot else tx.rows
            rows = held.get(table)
            if rows is None:
                rows = held[table] = []
            if op != "c":   # u, d, r
                if op != "r":
                    before = obj.get("before")
                    if type(before) is not dict:
                        raise _err(where, f"op {op} on {table} without a 'before' image: retractions need the "
                                          f"whole old row; run ALTER TABLE {table} REPLICA IDENTITY FULL")
                    rows.append((tx.position, -1, before, where))
                if op == "d":
                    return done
            after = obj.get("after")
            if type(after) is not dict:
                raise _err(where, f"op {op} on {table} without an 'after' image")
            rows.append((tx.position, 1, after, where))
        return done

    def _emit(self, tx: _Open, acc: dict, out: "ParsedFile", lineno: int) -> None:
        """A complete transaction (END read, or the snapshot's last read): its rows join the
        file's rows, and it becomes a :class:`TxInfo`."""
        if tx.skip:
            log.info("%s:%d: transaction %s is at or before the snapshot position %s: already in the snapshot, "
                     "skipped", os.path.join(self.location, out.name), lineno, tx.id, self.snapshot_pos)
            return
        if tx.snapshot:
            self.snapshot_pos = out.snapshot_pos = tx.position
        for table, rows in tx.rows.items():
            have = acc.get(table)
            if have is None:
                acc[table] = rows
            else:
                have.extend(rows)
        self.last_pos = tx.position
        out.txs.append(TxInfo(tx.position, tx.id, tx.ts_ms, tx.counts, out.name, lineno, tx.snapshot))



class LandingReader:
    """The complete transactions of one landing directory, read once and kept in memory.

    ``refresh()`` reads event files that arrived since the last call (files are immutable):
    from the landing index (:mod:`.landing_index`) where an entry fits, else by parsing them
    (and indexing them); ``index_stats`` counts files ``parsed``, ``loaded`` from the index,
    and ``workers`` started to index a cold backlog;
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
        self._parser = _Parser(self.location, self._schemas)
        self._indexed: bool | None = None   # whether the landing index is written (None: not checked yet)
        self.index_stats = {"parsed": 0, "loaded": 0, "workers": 0}

    # -- parsing ---------------------------------------------------------------------------
    def refresh(self) -> "LandingReader":
        """Read new event files: from the landing index (:mod:`.landing_index`) where an entry
        fits, else by parsing them. Raises SourceError (see the module docstring)."""
        with self._lock:
            if not os.path.isdir(self.location):
                raise SourceError(f"landing directory {self.location} does not exist (meta.consistent_stream."
                                  f"location; it is written by `consistent-stream capture postgres --landing ..`)")
            self._schemas = self._parser.schemas = load_schemas(self.location)
            files = list_event_files(self.location)
            known = {seq: (name, size, mt) for seq, name, size, mt in self._files}
            new = []
            expected = (self._files[-1][0] + 1) if self._files else 1
            for seq, name in files:
                path = os.path.join(self.location, name)
                st = os.stat(path)
                if seq in known:
                    if known[seq][0] != name or (st.st_size, st.st_mtime_ns) != known[seq][1:]:
                        raise SourceError(f"{path}: event file changed after it was read; landing files must "
                                          f"be written once (temp file + rename)")
                    continue
                if seq != expected:
                    raise SourceError(f"{path}: gap in the event file sequence: expected file number {expected} "
                                      f"before {seq} (a file is missing; nothing after the gap is read)")
                new.append((seq, name, st.st_size, st.st_mtime_ns))
                expected = seq + 1
            if not new:
                return self
            if self._indexed is None:
                self._indexed = landing_index.writable(self.location)
            digest = landing_index.schemas_digest(self._schemas)
            try:
                if self._indexed:
                    missing = [(n, size, mt) for _, n, size, mt in new
                               if not os.path.exists(landing_index.entry_path(self.location, n, size, mt, digest))]
                    self.index_stats["workers"] += landing_index.build(self.location, missing, digest)
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
        if parsed.tables:
            lo, hi = zip(*(_min_max(t.column(POS)) for t in parsed.tables.values() if t.num_rows))
            self._chunks.append(_Chunk(seq, name, min(lo), max(hi), parsed.tables))
        self._txs.extend(parsed.txs)
        self._files.append((seq, name, size, mtime_ns))

    def _index_in_isolation(self, name: str, size: int, mtime_ns: int, digest: str) -> None:
        """Index a file read in context inside the snapshot: its entry is what a fresh parser
        makes of it (the snapshot's counts so far are added when the entry is applied)."""
        parser = _Parser(self.location, self._schemas)
        try:
            parsed = parser.parse(name, size, mtime_ns)
        except SourceError:
            return
        if parser.open is None:
            landing_index.store(self.location, digest, parsed)

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
            return self._parser.last_pos

    def snapshot_position(self) -> int | None:
        """P0, the snapshot's position, or None when the landing directory has no snapshot."""
        with self._lock:
            return self._parser.snapshot_pos

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
        if upto > self._parser.last_pos:
            raise SourceError(f"{self.location}: position {upto} is past the last complete transaction "
                              f"{self._parser.last_pos} (files missing or deleted since the cut was taken?)")

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

    def snapshot(self, views, position: int, columns, *, on_driver: bool = False):
        """The table at ``position``, every row +1; always on the driver (the landing files
        are read there)."""
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
