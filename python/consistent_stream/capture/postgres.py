"""Direct PostgreSQL capture into a landing directory of Debezium JSON events (no Kafka).

``consistent-stream capture postgres --dsn .. --tables public.a,public.b --slot NAME --landing DIR``

Protocol (the snapshot-then-CDC bootstrap of Debezium's PostgreSQL connector, with the
replication protocol spoken by psycopg2's ``LogicalReplicationConnection`` and rows decoded by
the wal2json output plugin, format 2):

1. Checks every table exists and has ``REPLICA IDENTITY FULL`` (retractions need the whole old
   row; ``--set-replica-identity-full`` sets it), and writes ``_schemas/<table>.json``
   (columns, types, primary key; type mapping in ``pg_column_type``).
2. ``CREATE_REPLICATION_SLOT <slot> LOGICAL wal2json EXPORT_SNAPSHOT``: the slot's
   ``consistent_point`` is P0. In a REPEATABLE READ transaction with
   ``SET TRANSACTION SNAPSHOT`` of the exported snapshot, reads every table and writes its rows
   as ``op: r`` events at ``source.lsn`` = P0 (the last one marked ``snapshot: "last"``).
3. ``START_REPLICATION`` and streams committed transactions: each becomes Debezium's
   BEGIN, change events (``c``/``u``/``d`` with full before and after images), END with
   per-table counts. The transaction id is ``"<xid>:<LSN>"`` with the LSN just past its commit
   record (wal2json's ``nextlsn``), the transaction's position. Transactions are gathered for
   ``flush_interval_s`` and written as one event file, atomically (temp file, fsync, rename);
   only then is the slot's flush position (``confirmed_flush_lsn``) advanced to the last
   written position, so it never runs ahead of durable files.
   Keepalives: psycopg2 moves the flush position it reports up to a server keepalive's WAL
   end when the last message received is at or before the last position we confirmed. The
   server sends such keepalives mid-stream only to a client silent for half of
   ``wal_sender_timeout``; capture writes its complete transactions and sends feedback at every
   ``flush_interval_s``, also inside a long transaction, so that window stays closed in
   practice (a residual risk for a client stalled that long, e.g. on a hung disk).
4. After a restart (a crash, SIGKILL included), the slot streams from its confirmed position;
   any transaction whose position is <= the last one in a durable file is skipped, so nothing
   is lost or written twice. A capture that died during the snapshot starts over (drops its
   slot, deletes its partial files).

State kept in the landing directory: ``_capture.json`` (slot, tables, P0, whether the snapshot
is complete). Errors: ``CaptureError`` naming the table, slot or setting and what to do.
"""
from __future__ import annotations

import datetime
import decimal
import json
import logging
import os
import select
import signal
import time
from dataclasses import asdict, dataclass

from .. import location, storage
from ..errors import ConsistentStreamError
from ..sources.debezium.source import forget_reader
from ..sources.landing_index import INDEX_DIR
from ..sources.landing import (ColumnSchema, TableSchema, atomic_write, event_file_name, format_lsn,
                               list_event_files, parse_lsn, schema_path, write_schema)

log = logging.getLogger(__name__)

STATE_FILE = "_capture.json"
_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_TS = datetime.datetime(1970, 1, 1)
_STRING_TYPES = {"text", "varchar", "bpchar", "name", "uuid", "json", "jsonb", "citext"}


class CaptureError(ConsistentStreamError):
    """The database, a table, the slot or the landing directory is not in a state capture can use."""


def pg_column_type(typname: str, typmod: int) -> str:
    """PostgreSQL type (``pg_type.typname``, ``atttypmod``) -> landing column type.

    int2/int4/int8 -> int16/int32/int64; float4/float8 -> float32/float64; numeric(p,s) ->
    decimal(p,s) (p <= 38), numeric without a declared precision -> decimal(38,9); bool; date;
    timestamp; timestamptz; text, varchar, char, uuid, json, anything else -> string (the
    type's text form)."""
    simple = {"int2": "int16", "int4": "int32", "int8": "int64", "float4": "float32", "float8": "float64",
              "bool": "bool", "date": "date", "timestamp": "timestamp", "timestamptz": "timestamptz"}
    if typname in simple:
        return simple[typname]
    if typname == "numeric":
        if typmod >= 4:
            p, s = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
            if p <= 38:
                return f"decimal({p},{s})"
        return "decimal(38,9)"
    return "string"


def _encode(value, type_name: str):
    """A Python value (from psycopg2) or a wal2json value -> its Debezium JSON value."""
    if value is None:
        return None
    if type_name.startswith("decimal"):
        return str(value)
    if type_name == "date":
        d = value if isinstance(value, datetime.date) else datetime.date.fromisoformat(str(value))
        return (d - _EPOCH_DATE).days
    if type_name == "timestamp":
        dt = value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(str(value))
        return (dt.replace(tzinfo=None) - _EPOCH_TS) // datetime.timedelta(microseconds=1)
    if type_name == "timestamptz":
        dt = value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(str(value))
        return dt.astimezone(datetime.timezone.utc).isoformat()
    if type_name.startswith("float"):
        return float(value)
    if type_name == "string" and not isinstance(value, str):
        return str(value)
    return value


def _ts_ms(pg_timestamp: str) -> int:
    return int(datetime.datetime.fromisoformat(pg_timestamp).timestamp() * 1000)


@dataclass(frozen=True)
class CaptureConfig:
    """``dsn``: libpq connection string (may be empty: libpq then reads ``PGHOST``,
    ``PGPASSWORD``, ``~/.pgpass``, ``PGSERVICE`` ...; it is never written anywhere, and
    messages show it with the password redacted); ``tables``: ``schema.table`` names; ``slot``: the
    logical replication slot; ``landing``: the landing directory; ``max_seconds``: stop after
    this many seconds of streaming (None: until SIGTERM/SIGINT); ``flush_interval_s``: how long
    transactions are gathered into one file; ``set_replica_identity_full``: run
    ``ALTER TABLE .. REPLICA IDENTITY FULL`` instead of failing."""
    dsn: str
    tables: tuple[str, ...]
    slot: str
    landing: str
    max_seconds: float | None = None
    flush_interval_s: float = 0.2
    max_file_events: int = 50_000
    set_replica_identity_full: bool = False


@dataclass
class CaptureSummary:
    """What a capture run did: ``snapshot_rows`` (0 when resumed), ``transactions`` and
    ``events`` written, ``skipped_transactions`` (already durable before a restart),
    ``files`` written, ``confirmed_lsn`` (PostgreSQL notation), ``resumed``."""
    slot: str
    snapshot_lsn: str
    resumed: bool
    snapshot_rows: int = 0
    transactions: int = 0
    events: int = 0
    skipped_transactions: int = 0
    files: int = 0
    confirmed_lsn: str = ""
    seconds: float = 0.0


def redact_dsn(dsn: str) -> str:
    """``dsn`` (libpq key/value string or URI) with its password replaced by ``***``, for
    messages and logs; a DSN that does not parse is not echoed at all."""
    from psycopg2.extensions import make_dsn, parse_dsn
    if not dsn:
        return ""
    try:
        params = parse_dsn(dsn)
    except Exception:
        return "<a DSN that libpq cannot parse>"
    if "password" in params:
        params["password"] = "***"
    return make_dsn(**params)


def normalize_table(name: str) -> str:
    name = name.strip()
    return name if "." in name else f"public.{name}"


class PostgresCapture:
    """One capture run; ``run()`` returns a CaptureSummary. See the module docstring."""

    def __init__(self, cfg: CaptureConfig):
        self.cfg = cfg
        self.tables = [normalize_table(t) for t in cfg.tables]
        if not self.tables:
            raise CaptureError("--tables: name at least one table (schema.table)")
        self.landing = location.normalize(cfg.landing, key="landing")
        self.schemas: dict[str, TableSchema] = {}
        self._as_text: dict[str, set[str]] = {}
        self._stop = False

    # -- setup -----------------------------------------------------------------------------
    def _connect(self, replication: bool = False):
        import psycopg2
        import psycopg2.extras
        try:
            if replication:
                return psycopg2.connect(self.cfg.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
            conn = psycopg2.connect(self.cfg.dsn)
            conn.autocommit = True
            return conn
        except psycopg2.Error as e:
            raise CaptureError(f"cannot connect to PostgreSQL with DSN {redact_dsn(self.cfg.dsn)!r} (and libpq's "
                               f"PG* environment): {e}") from e

    def _describe(self, conn) -> None:
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            if cur.fetchone()[0] != "logical":
                raise CaptureError("the server's wal_level is not 'logical': set wal_level = logical in "
                                   "postgresql.conf and restart PostgreSQL")
            for t in self.tables:
                cur.execute("SELECT to_regclass(%s)", (t,))
                if cur.fetchone()[0] is None:
                    raise CaptureError(f"--tables: table {t} does not exist")
                cur.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (t,))
                if cur.fetchone()[0] != "f":
                    if self.cfg.set_replica_identity_full:
                        cur.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
                    else:
                        raise CaptureError(
                            f"table {t} does not have REPLICA IDENTITY FULL: updates and deletes would carry only "
                            f"the key, and retractions need the whole old row. Run ALTER TABLE {t} REPLICA "
                            f"IDENTITY FULL (or pass --set-replica-identity-full)")
                cur.execute("""SELECT a.attname, t.typname, a.atttypmod, format_type(a.atttypid, a.atttypmod),
                                      a.attnotnull
                               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                               WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
                               ORDER BY a.attnum""", (t,))
                attrs = cur.fetchall()
                cols = tuple(ColumnSchema(n, pg_column_type(tn, mod), ft, not nn) for n, tn, mod, ft, nn in attrs)
                # string-typed columns read as their text form (char(n) keeps its padding, as in wal2json)
                self._as_text[t] = {n for n, tn, *_ in attrs if pg_column_type(tn, -1) == "string"
                                    and tn not in ("bpchar", "text", "varchar")}
                cur.execute("""SELECT a.attname FROM pg_index i
                               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord) ON true
                               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                               WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.ord""", (t,))
                pk = tuple(r[0] for r in cur.fetchall())
                self.schemas[t] = TableSchema(t, cols, pk)

    def _state(self) -> dict | None:
        try:
            return storage.load_json(os.path.join(self.landing, STATE_FILE))
        except FileNotFoundError:
            return None

    def _save_state(self, **state) -> None:
        atomic_write(os.path.join(self.landing, STATE_FILE), json.dumps(state, indent=2).encode())

    def _slot_exists(self, conn) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.cfg.slot,))
            return cur.fetchone() is not None

    def _reset_landing(self) -> None:
        for _, name in list_event_files(self.landing):
            storage.remove(os.path.join(self.landing, name))
        storage.remove_tree(os.path.join(self.landing, INDEX_DIR), ignore_errors=True)
        forget_reader(self.landing)

    # -- snapshot --------------------------------------------------------------------------
    def _snapshot(self, conn, snapshot_name: str, p0: int, summary: CaptureSummary) -> int:
        """Rows of every table at the exported snapshot -> ``op: r`` events; returns the next
        file number."""
        seq, lines, pending_last = 1, [], None
        now = int(time.time() * 1000)
        dbname = conn.get_dsn_parameters().get("dbname", "")

        def flush():
            nonlocal seq, lines
            if lines:
                atomic_write(os.path.join(self.landing, event_file_name(seq)), ("\n".join(lines) + "\n").encode())
                seq, lines = seq + 1, []
                summary.files += 1

        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
        for t in self.tables:
            ts = self.schemas[t]
            schema, table = t.split(".", 1)
            types = [c.type for c in ts.columns]
            names = ts.column_names
            with conn.cursor(name=f"cs_snapshot_{len(lines)}_{seq}") as cur:
                cur.itersize = 10_000
                cols = ", ".join(f'"{n}"' + ("::text" if n in self._as_text[t] else "") for n in names)
                cur.execute(f"SELECT {cols} FROM {t}")
                for row in cur:
                    if pending_last is not None:
                        lines.append(json.dumps(pending_last))
                        if len(lines) >= self.cfg.max_file_events:
                            flush()
                    after = {n: _encode(v, ty) for n, v, ty in zip(names, row, types)}
                    pending_last = {"before": None, "after": after, "op": "r", "ts_ms": now,
                                    "source": {"connector": "postgresql", "name": self.cfg.slot, "db": dbname,
                                               "schema": schema, "table": table, "lsn": p0, "txId": None,
                                               "ts_ms": now, "snapshot": "true"},
                                    "transaction": None}
                    summary.snapshot_rows += 1
        conn.rollback()
        conn.autocommit = True
        if pending_last is not None:
            pending_last["source"]["snapshot"] = "last"
            lines.append(json.dumps(pending_last))
        flush()
        return seq

    # -- streaming -------------------------------------------------------------------------
    def _durable(self) -> tuple[int, int]:
        """(next file number, position of the last transaction in a durable file or -1)."""
        files = list_event_files(self.landing)
        if not files:
            return 1, -1
        seq, name = files[-1]
        pos = -1
        for raw in reversed(storage.read_bytes(os.path.join(self.landing, name)).splitlines()):
            if raw.strip():
                obj = json.loads(raw)
                if obj.get("status") == "END":
                    pos = parse_lsn(str(obj["id"]).rpartition(":")[2])
                    break
                if obj.get("op") == "r":
                    break
        if pos < 0:  # only snapshot files so far
            pos = int(self._state()["snapshot_lsn"])
        return seq + 1, pos

    def _to_event(self, change: dict, tx_id: str, ts_ms: int, xid: int, order: int, per_table: dict,
                  dbname: str) -> tuple[str, dict]:
        table = f"{change['schema']}.{change['table']}"
        ts = self.schemas.get(table)
        if ts is None:
            raise CaptureError(f"wal2json sent a change of {table}, which is not in --tables {self.tables}")
        types = {c.name: c.type for c in ts.columns}

        def image(cols):
            return {c["name"]: _encode(c.get("value"), types.get(c["name"], "string")) for c in cols or []}
        action = change["action"]
        before = image(change.get("identity")) if action in ("U", "D") else None
        after = image(change.get("columns")) if action in ("I", "U") else None
        if action in ("U", "D") and set(before) != set(types):
            raise CaptureError(f"{table}: the old row of an update/delete lacks columns "
                               f"{sorted(set(types) - set(before))}; set REPLICA IDENTITY FULL on it")
        if action == "U":
            after = {**before, **after}  # unchanged TOASTed values are omitted from the new row
        per_table[table] = per_table.get(table, 0) + 1
        return table, {"before": before, "after": after, "op": {"I": "c", "U": "u", "D": "d"}[action],
                       "ts_ms": int(time.time() * 1000),
                       "source": {"connector": "postgresql", "name": self.cfg.slot, "db": dbname,
                                  "schema": change["schema"], "table": change["table"], "txId": xid,
                                  "lsn": parse_lsn(change["lsn"]), "ts_ms": ts_ms, "snapshot": "false"},
                       "transaction": {"id": tx_id, "total_order": order,
                                       "data_collection_order": per_table[table]}}

    def run(self) -> CaptureSummary:
        """Capture until stopped (SIGTERM/SIGINT, or ``max_seconds``): check the landing
        directory against the tables and the slot, take the snapshot when none is complete
        (a new slot's exported snapshot), then stream the slot's transactions into event
        files. Returns the capture's summary; raises CaptureError naming what to do."""
        t0 = time.time()
        for sig in (signal.SIGTERM, signal.SIGINT):  # graceful stop: flush, then exit
            try:
                signal.signal(sig, lambda *_: setattr(self, "_stop", True))
            except ValueError:  # not the main thread
                pass
        storage.make_dirs(self.landing, mode=0o700)  # change data: owner only
        conn = self._connect()
        state, resumed = self._check_landing(conn)
        rconn = self._connect(replication=True)
        rcur = rconn.cursor()
        summary = CaptureSummary(self.cfg.slot, "", resumed)
        if not resumed:
            rcur.execute(f'CREATE_REPLICATION_SLOT "{self.cfg.slot}" LOGICAL wal2json EXPORT_SNAPSHOT')
            _, consistent_point, snapshot_name, _ = rcur.fetchone()
            p0 = parse_lsn(consistent_point)
            self._snapshot(conn, snapshot_name, p0, summary)
            self._save_state(slot=self.cfg.slot, tables=self.tables, snapshot_lsn=p0, snapshot_done=True,
                             snapshot_ts_ms=int(time.time() * 1000))
            state = self._state()
        summary.snapshot_lsn = format_lsn(int(state["snapshot_lsn"]))
        seq, durable = self._durable()
        dbname = conn.get_dsn_parameters().get("dbname", "")
        conn.close()
        self._stream(rcur, seq, durable, dbname, summary)
        rconn.close()
        summary.seconds = round(time.time() - t0, 3)
        return summary

    def _check_landing(self, conn) -> tuple[dict | None, bool]:
        """Write the tables' schema files and check the landing directory's capture state
        against ``--tables`` and ``--slot``: ``(state, resumed)``, where ``resumed`` says a
        snapshot is complete and its slot still exists. A capture that died during its
        snapshot starts over (its slot dropped, the landing directory reset)."""
        self._describe(conn)
        for ts in self.schemas.values():
            old_path = schema_path(self.landing, ts.table)
            if storage.exists(old_path) and TableSchema.load(old_path) != ts:
                raise CaptureError(f"table {ts.table} changed since {old_path} was written (schema changes of "
                                   f"captured tables are not supported): start a new capture with a new "
                                   f"--landing directory and --slot")
            write_schema(self.landing, ts)
        state = self._state()
        if state is not None and sorted(state["tables"]) != sorted(self.tables):
            raise CaptureError(f"{self.landing} holds a capture of tables {state['tables']}, not --tables "
                               f"{self.tables}: use a new landing directory (and slot)")
        if state is not None and state["slot"] != self.cfg.slot:
            raise CaptureError(f"{self.landing} was captured with slot {state['slot']!r}, not --slot "
                               f"{self.cfg.slot!r}")
        resumed = bool(state and state.get("snapshot_done"))
        if resumed and not self._slot_exists(conn):
            raise CaptureError(f"slot {self.cfg.slot!r} no longer exists, so changes since "
                               f"{state['snapshot_lsn']} are gone: start a new capture in a new landing directory")
        if not resumed:
            if state is None and self._slot_exists(conn):
                raise CaptureError(f"replication slot {self.cfg.slot!r} exists but {self.landing} has no capture "
                                   f"state: pick another --slot, or drop it with "
                                   f"SELECT pg_drop_replication_slot('{self.cfg.slot}')")
            if state is not None:  # died during the snapshot: start over
                log.warning("capture %s: the previous run died during the snapshot; starting over", self.cfg.slot)
                if self._slot_exists(conn):
                    with conn.cursor() as cur:
                        cur.execute("SELECT pg_drop_replication_slot(%s)", (self.cfg.slot,))
                self._reset_landing()
            self._save_state(slot=self.cfg.slot, tables=self.tables, snapshot_lsn=None, snapshot_done=False)
        return state, resumed

    def _stream(self, rcur, seq: int, durable: int, dbname: str, summary: CaptureSummary) -> None:
        """Stream the slot's transactions (wal2json format 2) into event files numbered from
        ``seq``, skipping those at or below ``durable`` (already in a durable file), until
        stopped; the slot's confirmed position follows the durable files only."""
        rcur.start_replication(slot_name=self.cfg.slot, decode=True, options={
            "format-version": "2", "include-xids": "1", "include-timestamp": "1", "include-lsn": "1",
            "include-types": "1", "add-tables": ",".join(self.tables)})

        lines: list[str] = []
        n_events = 0
        last_complete = durable     # every transaction up to here is durable (or had no changes)
        tx = None
        last_flush = time.time()
        # Fault injection for tests: SIGKILL this process right after the N-th streamed file is
        # durable and before the slot's flush position is advanced (the window a restart must
        # deduplicate).
        crash_after = int(os.environ.get("CONSISTENT_STREAM_CAPTURE_KILL_AFTER_FILES", "0"))
        deadline = None if self.cfg.max_seconds is None else time.time() + self.cfg.max_seconds

        def flush():
            nonlocal seq, lines, n_events, last_flush
            if lines:
                atomic_write(os.path.join(self.landing, event_file_name(seq)), ("\n".join(lines) + "\n").encode())
                seq += 1
                summary.files += 1
                lines, n_events = [], 0
                if crash_after and summary.files >= crash_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # fault injection: file durable, feedback not sent
            last_flush = time.time()
            if last_complete > 0:
                # only now: the confirmed position never runs ahead of durable files
                rcur.send_feedback(write_lsn=last_complete, flush_lsn=last_complete, force=True)
                summary.confirmed_lsn = format_lsn(last_complete)

        while not self._stop and (deadline is None or time.time() < deadline):
            msg = rcur.read_message()
            if msg is None:
                if time.time() - last_flush >= self.cfg.flush_interval_s:
                    flush()
                select.select([rcur], [], [], min(self.cfg.flush_interval_s, 0.5))
                continue
            rec = json.loads(msg.payload, parse_float=decimal.Decimal)
            action = rec.get("action")
            if action == "B":
                pos = parse_lsn(rec["nextlsn"])
                tx = {"xid": rec["xid"], "pos": pos, "id": f"{rec['xid']}:{pos}", "ts": _ts_ms(rec["timestamp"]),
                      "events": [], "per_table": {}, "skip": pos <= durable}
            elif action in ("I", "U", "D"):
                if tx is None:
                    raise CaptureError(f"wal2json sent a change outside a transaction: {msg.payload[:200]}")
                if not tx["skip"]:
                    tx["events"].append(self._to_event(rec, tx["id"], tx["ts"], tx["xid"], len(tx["events"]) + 1,
                                                       tx["per_table"], dbname)[1])
            elif action == "C":
                if tx is None:
                    raise CaptureError(f"wal2json sent a commit without a begin: {msg.payload[:200]}")
                if tx["skip"]:
                    summary.skipped_transactions += 1
                elif tx["events"]:
                    lines.append(json.dumps({"status": "BEGIN", "id": tx["id"], "event_count": None,
                                             "data_collections": None, "ts_ms": tx["ts"]}))
                    lines.extend(json.dumps(e) for e in tx["events"])
                    lines.append(json.dumps({"status": "END", "id": tx["id"], "event_count": len(tx["events"]),
                                             "data_collections": [{"data_collection": k, "event_count": v}
                                                                  for k, v in tx["per_table"].items()],
                                             "ts_ms": tx["ts"]}))
                    summary.transactions += 1
                    summary.events += len(tx["events"])
                    n_events += len(tx["events"])
                last_complete = max(last_complete, tx["pos"])
                tx = None
                if n_events >= self.cfg.max_file_events:
                    flush()
            # other actions (M: logical messages) are not table changes: ignored
            if time.time() - last_flush >= self.cfg.flush_interval_s:
                # also inside a long transaction: complete transactions become durable and the
                # server hears from us at every interval (see "keepalives" in the docstring)
                flush()
        flush()


def capture_postgres(cfg: CaptureConfig) -> CaptureSummary:
    """Run one capture (see the module docstring); returns its summary."""
    return PostgresCapture(cfg).run()


def summary_json(s: CaptureSummary) -> str:
    return json.dumps(asdict(s))
