"""Debezium JSON change events parsed into complete transactions, one event file at a time.

The reader that keeps a landing directory's transactions and serves them as changelogs is
:mod:`.source`; this module is what it (and the landing index's workers) parse with.

Input: the event files of a landing directory (layout in :mod:`..landing`), JSON lines, each a
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

import datetime
import decimal
import json
import logging
import os
import subprocess
import sys
import time
from operator import itemgetter

import orjson
import pyarrow as pa

from ... import storage
from ...errors import SourceError
from .. import landing_index
from ..landing import TableSchema, arrow_type, load_schemas, parse_lsn
from ..landing_index import OpenTransaction, ParsedFile, ParserState, TxInfo

log = logging.getLogger(__name__)

WEIGHT = "__weight"
POS = "__pos"
INITIAL = -1
ATTEMPT_FIELDS = ("txId", "lsn", "file", "pos", "gtid", "commit_lsn", "scn")
"""Fields of a snapshot event's ``source`` block that are the same on every event of one
snapshot attempt and differ between attempts (the connector's snapshot position)."""
FIRST = ("first", "first_in_data_collection")
LAST_OF_TABLE = ("last_in_data_collection", "last")
"""``source.snapshot`` markers: the first event of the snapshot (or of a table's), the last
of a table's (or of the snapshot)."""
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
    return unwrap(obj)


def unwrap(obj):
    """A parsed JSON value without Kafka Connect's ``{"schema", "payload"}`` envelope (its
    payload), or the value itself when it has none."""
    if type(obj) is dict and "payload" in obj and "schema" in obj:
        return obj["payload"]
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


def chunk_schema(ts: TableSchema) -> pa.Schema:
    """The Arrow schema of a table's rows in a transaction log's chunks (what
    :func:`rows_to_arrow` and the Kafka reader make, and its chunk files hold): the table's
    columns + ``__pos`` int64 + ``__weight`` int64."""
    return pa.schema(list(ts.arrow_schema()) + [pa.field(POS, pa.int64()), pa.field(WEIGHT, pa.int64())])


def rows_to_arrow(ts: TableSchema, rows: list, path: str) -> pa.Table:
    """The rows (position, weight, row dict, Where) of one table -> an Arrow table of the
    table's columns (typed by ``ts``) + __pos + __weight. Raises SourceError naming the
    event of a row whose columns differ from the schema (``path`` names what was read in a
    conversion error)."""
    table, names = ts.table, ts.column_names
    name_set = set(names)
    for _, _, row, rwhere in rows:
        if row.keys() != name_set:
            extra, missing = sorted(set(row) - name_set), sorted(name_set - set(row))
            raise _err(rwhere, f"row of {table} does not match its schema (columns {names}): "
                               f"unknown columns {extra}, missing columns {missing}; schema changes of "
                               f"captured tables are not supported (start a new landing directory or topic)")
    get = itemgetter(*names)
    values = [get(r[2]) for r in rows]
    columns = list(zip(*values)) if len(names) > 1 else [values]
    if not rows:
        columns = [[] for _ in names]
    arrays = [_convert_column(list(vals), c.type, path, c.name) for c, vals in zip(ts.columns, columns)]
    arrays += [pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows], pa.int64())]
    return pa.Table.from_arrays(arrays, names=names + [POS, WEIGHT])


class EventParser:
    """Debezium events -> complete transactions, one event file at a time (the semantics in the
    module docstring). Its state carries from file to file: the open transaction (a capture may
    cut a file inside a long one), the snapshot being read, the snapshot's position, the last
    position and whether transactions began. A fresh parser reads a file *in isolation*, the
    way an entry of the landing index (:mod:`.landing_index`) is made."""

    def __init__(self, location: str, schemas: dict[str, TableSchema]):
        self.location = location
        self.schemas = schemas
        self.open: OpenTransaction | None = None
        self.snap: OpenTransaction | None = None
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
        data = storage.read_bytes(path)
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        decimals = any(ts.has_decimal for ts in self.schemas.values())
        offset = 0
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            where = (path, lineno, offset)
            offset += len(raw) + 1
            if not raw or raw.isspace():
                continue
            try:
                obj = unwrap(loads(raw))
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
        return rows_to_arrow(self.schemas[table], rows, path)

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

    def _metadata(self, obj: dict, where: str) -> OpenTransaction | None:
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
            self.open = OpenTransaction(str(tx_id), pos, int(obj.get("ts_ms") or 0), where, skip)
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

    def _change(self, obj: dict, where: Where) -> OpenTransaction | None:
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
                self.snap = OpenTransaction(f"snapshot:{pos}", pos, int(src.get("ts_ms") or 0), where, False,
                                            snapshot=True)
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

    def _emit(self, tx: OpenTransaction, acc: dict, out: "ParsedFile", lineno: int) -> None:
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


def build_index(location: str, files: list[tuple[str, int, int]], digest: str, workers: int | None = None) -> int:
    """Make the entries of ``files`` ([(name, size, mtime_ns)], in order) in ``workers``
    processes (default: one per core), when they are worth it (at least
    ``landing_index.PARALLEL_MIN_BYTES``, two cores or more). Each worker parses a contiguous run of files in
    isolation. Returns the number of workers started (0: the caller parses alone)."""
    workers = workers or os.cpu_count() or 1
    total = sum(size for _, size, _ in files)
    if workers < 2 or len(files) < 2 or total < landing_index.PARALLEL_MIN_BYTES:
        return 0
    workers = min(workers, len(files))
    groups: list[list[str]] = [[] for _ in range(workers)]
    acc, share = 0, total / workers
    for name, size, _ in files:
        groups[min(int(acc // share), workers - 1)].append(name)
        acc += size
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", __name__, location, digest, *g],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for g in groups if g]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            log.warning("landing index worker exited %s (its files are parsed by the reader): %s", p.returncode,
                        err.decode(errors="replace")[-2000:])
    log.info("%s: indexed %d event files (%.1f MB) in %d worker processes in %.2fs", location, len(files),
             total / 1e6, len(procs), time.time() - t0)
    return len(procs)


def _main(argv: list[str]) -> int:
    """Worker: ``python -m consistent_stream.sources.debezium.events <location> <digest> <file>...``
    parses each file in isolation and writes its entry; a file that raises or ends inside a
    transaction gets none (the reader parses it in context)."""
    location, digest, names = argv[0], argv[1], argv[2:]
    schemas = load_schemas(location)
    if landing_index.schemas_digest(schemas) != digest:
        return 0  # the schema files changed since the reader listed them: the reader parses
    for name in names:
        st = storage.stat(os.path.join(location, name))
        parser = EventParser(location, schemas)
        try:
            parsed = parser.parse(name, st.size, st.mtime_ns)
        except SourceError:
            continue
        if parser.open is None:
            landing_index.store(location, digest, parsed)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(_main(sys.argv[1:]))
