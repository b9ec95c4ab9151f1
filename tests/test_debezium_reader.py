"""The Debezium landing-directory reader on hand-written files: transaction cuts, the
snapshot, Debezium's envelope, and every kind of bad input (the error names file and offset)."""
from __future__ import annotations

import json
import os
import re
from decimal import Decimal

import pyarrow as pa
import pytest

from consistent_stream.errors import SourceError
from consistent_stream.sources import landing_index
from consistent_stream.sources.debezium import events as debezium_events
from consistent_stream.sources.debezium.source import LandingReader
from consistent_stream.sources.landing import ColumnSchema, TableSchema, event_file_name, load_schemas, write_schema

ACCOUNTS = TableSchema("public.accounts", (ColumnSchema("id", "int32", "integer", False),
                                           ColumnSchema("balance", "decimal(12,2)", "numeric(12,2)"),
                                           ColumnSchema("opened", "date", "date"),
                                           ColumnSchema("seen", "timestamp", "timestamp")), ("id",))
TELLERS = TableSchema("public.tellers", (ColumnSchema("tid", "int32"), ColumnSchema("total", "int64")), ("tid",))


def ev(op, table, before=None, after=None, lsn=100, tx=None, snapshot="false", ts=1000):
    schema, name = table.split(".")
    e = {"op": op, "before": before, "after": after, "ts_ms": ts,
         "source": {"schema": schema, "table": name, "lsn": lsn, "txId": 7, "ts_ms": ts, "snapshot": snapshot}}
    if tx:
        e["transaction"] = {"id": tx, "total_order": 1, "data_collection_order": 1}
    return e


def begin(tx_id, ts=1000):
    return {"status": "BEGIN", "id": tx_id, "event_count": None, "data_collections": None, "ts_ms": ts}


def end(tx_id, counts, ts=1000):
    return {"status": "END", "id": tx_id, "event_count": sum(counts.values()), "ts_ms": ts,
            "data_collections": [{"data_collection": k, "event_count": v} for k, v in counts.items()]}


def acc(i, bal, opened=0, seen=0):
    return {"id": i, "balance": str(bal), "opened": opened, "seen": seen}


def landing(tmp_path, files: list[list], schemas=(ACCOUNTS, TELLERS)) -> str:
    d = str(tmp_path / "landing")
    os.makedirs(d, exist_ok=True)
    for s in schemas:
        write_schema(d, s)
    for i, events in enumerate(files, start=1):
        with open(os.path.join(d, event_file_name(i)), "w") as f:
            for e in events:
                f.write((e if isinstance(e, str) else json.dumps(e)) + "\n")
    return d


SNAPSHOT = [ev("r", "public.accounts", after=acc(1, "10.00"), lsn=50, snapshot="first"),
            ev("r", "public.accounts", after=acc(2, "5.50"), lsn=50, snapshot="true"),
            ev("r", "public.tellers", after={"tid": 1, "total": 15}, lsn=50, snapshot="last")]
TX1 = [begin("700:120"),
       ev("u", "public.accounts", before=acc(1, "10.00"), after=acc(1, "7.00"), lsn=101, tx="700:120"),
       ev("u", "public.tellers", before={"tid": 1, "total": 15}, after={"tid": 1, "total": 12}, lsn=102, tx="700:120"),
       end("700:120", {"public.accounts": 1, "public.tellers": 1}, ts=2000)]
TX2 = [begin("701:130"),
       ev("c", "public.accounts", after=acc(3, "1.25", opened=19000, seen=1_600_000_000_000_000), lsn=121,
          tx="701:130"),
       ev("d", "public.accounts", before=acc(2, "5.50"), lsn=122, tx="701:130"),
       end("701:130", {"public.accounts": 2}, ts=3000)]


def rows(t: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in t.to_pylist())


def test_snapshot_then_transactions_in_commit_order(tmp_path):
    r = LandingReader(landing(tmp_path, [SNAPSHOT, TX1 + TX2])).refresh()
    assert r.snapshot_position() == 50
    assert [t.position for t in r.transactions()] == [50, 120, 130]
    assert r.latest_position() == 130 and r.commit_ms(125) == 2000 and r.commit_ms(130) == 3000
    # the snapshot alone
    assert rows(r.changes("public.accounts", -1, 50, ["id", "balance"])) == \
        [(1, Decimal("10.00"), 1), (2, Decimal("5.50"), 1)]
    # one transaction: -before, +after, in both tables
    assert rows(r.changes("public.accounts", 50, 120, ["id", "balance"])) == \
        [(1, Decimal("7.00"), 1), (1, Decimal("10.00"), -1)]
    assert rows(r.changes("public.tellers", 50, 120)) == [(1, 12, 1), (1, 15, -1)]
    assert r.changes("public.tellers", 120, 130).num_rows == 0
    # the table as of each position = snapshot + changes up to it
    t = r.table_at("public.accounts", 130)
    assert t.schema.field("balance").type == pa.decimal128(12, 2)
    assert t.schema.field("opened").type == pa.date32() and t.schema.field("seen").type == pa.timestamp("us")
    got = {x["id"]: x for x in t.to_pylist()}
    assert sorted(got) == [1, 3] and got[1]["balance"] == Decimal("7.00")
    assert str(got[3]["opened"]) == "2022-01-08" and str(got[3]["seen"]) == "2020-09-13 12:26:40"
    assert sorted(r.table_at("public.accounts", 120).column("id").to_pylist()) == [1, 2]


def test_debezium_envelope_and_tombstones_are_accepted(tmp_path):
    wrapped = [json.dumps({"schema": {"type": "struct"}, "payload": e}) for e in SNAPSHOT] + ["null"]
    r = LandingReader(landing(tmp_path, [wrapped, TX1])).refresh()
    assert r.latest_position() == 120 and r.table_at("public.tellers", 120).to_pylist() == [{"tid": 1, "total": 12}]


def test_a_trailing_incomplete_transaction_is_not_available_until_its_end_arrives(tmp_path):
    d = landing(tmp_path, [SNAPSHOT, TX1 + TX2[:2]])
    r = LandingReader(d).refresh()
    assert r.latest_position() == 120
    with pytest.raises(SourceError, match="past the last complete transaction"):
        r.changes("public.accounts", 120, 130)
    # the rest of the transaction arrives in the next file
    with open(os.path.join(d, event_file_name(3)), "w") as f:
        for e in TX2[2:]:
            f.write(json.dumps(e) + "\n")
    r.refresh()
    assert r.latest_position() == 130
    assert rows(r.changes("public.accounts", 120, 130, ["id", "balance"])) == \
        [(2, Decimal("5.50"), -1), (3, Decimal("1.25"), 1)]


def test_transactions_at_or_before_the_snapshot_position_are_skipped(tmp_path):
    old = [begin("699:40"), ev("c", "public.tellers", after={"tid": 9, "total": 1}, lsn=30, tx="699:40"),
           end("699:40", {"public.tellers": 1})]
    r = LandingReader(landing(tmp_path, [SNAPSHOT, old + TX1])).refresh()
    assert [t.position for t in r.transactions()] == [50, 120]
    assert r.table_at("public.tellers", 120).to_pylist() == [{"tid": 1, "total": 12}]


def _error(tmp_path, files, schemas=(ACCOUNTS, TELLERS)) -> str:
    with pytest.raises(SourceError) as e:
        LandingReader(landing(tmp_path, files, schemas)).refresh()
    return str(e.value)


def _names(msg: str, file_no: int, line: int) -> None:
    assert re.search(rf"{event_file_name(file_no)}:{line} \(byte \d+\)", msg), msg


def test_decimals_written_as_json_numbers_are_read_exactly(tmp_path):
    """Debezium's double/precise modes write DECIMALs as JSON numbers: digits past a double's
    17 are kept (such lines are parsed again with exact decimals), integers past 64 bits too."""
    wide = TableSchema("public.w", (ColumnSchema("id", "int64", "bigint", False),
                                    ColumnSchema("amount", "decimal(38,10)", "numeric(38,10)"),
                                    ColumnSchema("big", "decimal(38,0)", "numeric(38,0)"),
                                    ColumnSchema("ratio", "float64", "float8")), ("id",))
    line = ('{"op": "r", "before": null, "after": {"id": 1, "amount": 1234567890123456789.0123456789, '
            '"big": 123456789012345678901234567890, "ratio": 0.1}, "source": {"schema": "public", "table": "w", '
            '"lsn": 50, "snapshot": "last"}}')
    r = LandingReader(landing(tmp_path, [[line]], schemas=(wide,))).refresh()
    row = r.table_at("public.w", 50).to_pylist()[0]
    assert row["amount"] == Decimal("1234567890123456789.0123456789")
    assert row["big"] == Decimal("123456789012345678901234567890") and row["ratio"] == 0.1


def test_malformed_line_names_file_line_and_byte_offset(tmp_path):
    msg = _error(tmp_path, [SNAPSHOT, TX1[:2] + ['{"op": "u", "before": {']])
    _names(msg, 2, 3)
    assert "malformed JSON" in msg
    first_two = sum(len(json.dumps(e)) + 1 for e in TX1[:2])
    assert f"(byte {first_two})" in msg


def test_event_for_an_unknown_table(tmp_path):
    msg = _error(tmp_path, [SNAPSHOT], schemas=(ACCOUNTS,))
    _names(msg, 1, 3)
    assert "unknown table 'public.tellers'" in msg and "_schemas" in msg


def test_end_that_never_arrives_while_later_transactions_exist(tmp_path):
    msg = _error(tmp_path, [SNAPSHOT, TX1[:-1] + TX2])
    _names(msg, 2, 4)
    assert "700:120" in msg and "END never arrived" in msg


def test_end_counts_must_match_the_events(tmp_path):
    bad_total = TX1[:-1] + [dict(TX1[-1], event_count=3)]
    _names(_error(tmp_path, [SNAPSHOT, bad_total]), 2, 4)
    bad_tables = TX1[:-1] + [end("700:120", {"public.accounts": 2})]
    msg = _error(tmp_path / "b", [SNAPSHOT, bad_tables])
    _names(msg, 2, 4)
    assert "data_collections" in msg


def test_a_missing_event_file_is_a_gap(tmp_path):
    d = landing(tmp_path, [SNAPSHOT, TX1, TX2])
    os.remove(os.path.join(d, event_file_name(2)))
    with pytest.raises(SourceError, match=r"gap in the event file sequence: expected file number 2") as e:
        LandingReader(d).refresh()
    assert event_file_name(3) in str(e.value)


def test_positions_must_grow(tmp_path):
    msg = _error(tmp_path, [SNAPSHOT, TX2 + TX1])
    _names(msg, 2, 5)
    assert "positions must grow" in msg


def test_change_outside_a_transaction_and_missing_before_image(tmp_path):
    msg = _error(tmp_path, [SNAPSHOT, [ev("c", "public.tellers", after={"tid": 2, "total": 0})]])
    _names(msg, 2, 1)
    assert "outside a transaction" in msg
    no_before = [begin("700:120"), ev("d", "public.tellers", before=None, lsn=101, tx="700:120"),
                 end("700:120", {"public.tellers": 1})]
    msg = _error(tmp_path / "b", [SNAPSHOT, no_before])
    _names(msg, 2, 2)
    assert "REPLICA IDENTITY FULL" in msg


def test_incomplete_snapshot_followed_by_a_transaction(tmp_path):
    msg = _error(tmp_path, [SNAPSHOT[:2], TX1])
    _names(msg, 2, 1)
    assert "snapshot" in msg and "'last'" in msg


def test_a_value_of_the_wrong_type_names_file_and_column(tmp_path):
    bad = [begin("700:120"), ev("c", "public.tellers", after={"tid": 2, "total": "lots"}, lsn=101, tx="700:120"),
           end("700:120", {"public.tellers": 1})]
    msg = _error(tmp_path, [SNAPSHOT, bad])
    assert event_file_name(2) in msg and "'total'" in msg


def test_a_row_that_does_not_match_the_schema(tmp_path):
    bad = [begin("700:120"), ev("c", "public.tellers", after={"tid": 2}, lsn=101, tx="700:120"),
           end("700:120", {"public.tellers": 1})]
    msg = _error(tmp_path, [SNAPSHOT, bad])
    _names(msg, 2, 2)
    assert "missing columns ['total']" in msg


def test_a_file_rewritten_after_it_was_read(tmp_path):
    d = landing(tmp_path, [SNAPSHOT, TX1])
    r = LandingReader(d).refresh()
    with open(os.path.join(d, event_file_name(2)), "a") as f:
        f.write(json.dumps(begin("702:140")) + "\n")
    with pytest.raises(SourceError, match="changed after it was read"):
        r.refresh()


# -- the landing index (consistent_stream.sources.landing_index) -----------------------------

def _everything(r: LandingReader) -> tuple:
    """What a reader makes of a landing directory: transactions and each table's changelog."""
    upto = r.latest_position()
    return ([tuple(t) for t in r.transactions()],
            {t: rows(r.changes(t, -1, upto)) for t in r.tables()} if upto >= 0 else {})


def _entries(d: str) -> list[str]:
    return sorted(os.listdir(os.path.join(d, landing_index.INDEX_DIR)))


TX3 = [begin("702:140"), ev("c", "public.tellers", after={"tid": 2, "total": 4}, lsn=131, tx="702:140"),
       end("702:140", {"public.tellers": 1}, ts=4000)]


def test_a_second_reader_loads_the_index_and_reads_exactly_what_parsing_read(tmp_path):
    """Files bounded by complete transactions are indexed by the first reader and loaded by
    the next; a file cut inside a transaction (TX2 spans files 3 and 4) is parsed every time,
    and so is the one after it."""
    d = landing(tmp_path, [SNAPSHOT, TX1, TX2[:2], TX2[2:], TX3])
    first = LandingReader(d).refresh()
    assert first.index_stats == {"parsed": 5, "loaded": 0, "workers": 0}
    assert [e.split(".")[0] for e in _entries(d)] == ["cdc-000000000001", "cdc-000000000002", "cdc-000000000005"]
    second = LandingReader(d).refresh()
    assert second.index_stats == {"parsed": 2, "loaded": 3, "workers": 0}
    assert _everything(second) == _everything(first)
    assert second.latest_position() == 140 and second.snapshot_position() == 50


def test_a_snapshot_that_spans_files_is_indexed_too(tmp_path):
    """A large snapshot spans event files: each file's entry holds its own snapshot rows, and
    the snapshot's counts, first read time and place carry from file to file as when parsed."""
    reads = [ev("r", "public.accounts", after=acc(1, "10.00"), lsn=50, snapshot="first", ts=1111),
             ev("r", "public.accounts", after=acc(2, "5.50"), lsn=50, snapshot="true", ts=2222),
             ev("r", "public.tellers", after={"tid": 1, "total": 15}, lsn=50, snapshot="last", ts=3333)]
    d = landing(tmp_path, [reads[:1], reads[1:2], reads[2:] + TX1])
    first = LandingReader(d).refresh()
    assert first.index_stats["parsed"] == 3 and len(_entries(d)) == 3
    snap = first.transactions()[0]
    assert snap.snapshot and snap.counts == {"public.accounts": 2, "public.tellers": 1} and snap.ts_ms == 1111
    assert (snap.file, snap.line) == (event_file_name(3), 1)
    second = LandingReader(d).refresh()
    assert second.index_stats == {"parsed": 0, "loaded": 3, "workers": 0}
    assert _everything(second) == _everything(first)
    # the snapshot is not available before its last read, from the index either
    os.remove(os.path.join(d, event_file_name(3)))
    partial = LandingReader(d).refresh()
    assert partial.index_stats["loaded"] == 2 and partial.latest_position() == -1
    with pytest.raises(SourceError, match="past the last complete transaction"):
        partial.changes("public.accounts", -1, 50)


def test_an_entry_made_in_isolation_is_not_used_where_the_file_reads_differently_in_context(tmp_path):
    """Entries made by the parallel workers read each file alone. File 2's first transaction
    (position 40) is at or before the snapshot position 50, so in context it is skipped; its
    entry (made in isolation, where it is not) must not be used. File 3 fits and is loaded."""
    old = [begin("699:40"), ev("c", "public.tellers", after={"tid": 9, "total": 1}, lsn=30, tx="699:40"),
           end("699:40", {"public.tellers": 1})]
    d = landing(tmp_path, [SNAPSHOT, old + TX1, TX2])
    digest = landing_index.schemas_digest(load_schemas(d))
    os.makedirs(os.path.join(d, landing_index.INDEX_DIR))
    assert debezium_events._main([d, digest] + [event_file_name(i) for i in (1, 2, 3)]) == 0
    assert len(_entries(d)) == 3
    r = LandingReader(d).refresh()
    assert r.index_stats == {"parsed": 1, "loaded": 2, "workers": 0}
    assert [t.position for t in r.transactions()] == [50, 120, 130]
    assert r.table_at("public.tellers", 130).to_pylist() == [{"tid": 1, "total": 12}]


def test_a_torn_entry_or_new_schema_files_mean_parsing_again(tmp_path, caplog):
    d = landing(tmp_path, [SNAPSHOT, TX1])
    want = _everything(LandingReader(d).refresh())
    entries = _entries(d)
    with open(os.path.join(d, landing_index.INDEX_DIR, entries[1]), "r+b") as f:
        f.truncate(40)
    r = LandingReader(d).refresh()
    assert r.index_stats == {"parsed": 1, "loaded": 1, "workers": 0} and _everything(r) == want
    assert "unreadable landing index entry" in caplog.text
    # a schema file that changes (here: a column's source type) keys new entries
    write_schema(d, TableSchema("public.tellers", (ColumnSchema("tid", "int32", "int"), ColumnSchema("total", "int64")),
                                ("tid",)))
    r = LandingReader(d).refresh()
    assert r.index_stats["loaded"] == 0 and _everything(r) == want


def test_a_backlog_is_indexed_by_worker_processes(tmp_path, monkeypatch):
    """Past PARALLEL_MIN_BYTES of files without an entry, worker processes (one per core, at
    least two here) index them in isolation and the reader loads their entries."""
    txs = [[begin(f"{800 + i}:{200 + 10 * i}"),
            ev("c", "public.tellers", after={"tid": 100 + i, "total": i}, lsn=195 + 10 * i,
               tx=f"{800 + i}:{200 + 10 * i}"),
            end(f"{800 + i}:{200 + 10 * i}", {"public.tellers": 1}, ts=5000 + i)] for i in range(6)]
    d = landing(tmp_path, [SNAPSHOT, TX1, TX2] + txs)
    monkeypatch.setattr(landing_index, "writable", lambda location: False)  # a landing directory we cannot write
    plain = LandingReader(d).refresh()
    assert plain.index_stats["parsed"] == 9 and not os.path.exists(os.path.join(d, landing_index.INDEX_DIR))
    want = _everything(plain)
    monkeypatch.undo()
    monkeypatch.setattr(landing_index, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    r = LandingReader(d).refresh()
    assert r.index_stats == {"parsed": 0, "loaded": 9, "workers": 2}
    assert _everything(r) == want and r.latest_position() == 250


def test_the_transaction_log_gives_back_what_was_appended_and_finds_positions():
    """TxLog holds transactions as columns: each comes back as the TxInfo appended (counts
    equal, not the caller's dict), slices and negative indexes as a list's, bisect as
    bisect_right over the positions, past its shared-counts bound too."""
    txs = [landing_index.TxInfo(p, f"tx{p}", 1000 + p, {"a": p % 3, "b": 1} if p else {}, f"f{p % 2}", p * 2,
                                p == 0) for p in range(0, 60, 3)]
    log = landing_index.TxLog(txs[:1])
    log.extend(txs[1:])
    assert len(log) == len(txs) and list(log) == txs and log[-1] == txs[-1] and log[2:5] == txs[2:5]
    assert log[3].counts is not txs[3].counts
    assert [log.bisect(x) for x in (-1, 0, 1, 3, 56, 57, 99)] == [0, 1, 1, 2, 19, 20, 20]
    with pytest.raises(IndexError):
        log[len(txs)]
    many = landing_index.TxLog()
    many._MAX_SHARED = 2
    many.extend(landing_index.TxInfo(p, "x", 0, {"t": p}, "f", 0) for p in range(5))
    assert [t.counts for t in many] == [{"t": p} for p in range(5)]
