"""The Kafka + Kafka Connect + Debezium stack (consistent_stream_testing.kafka_stack) end to end: a
real KRaft broker and Connect worker on loopback capture two PostgreSQL tables with
transaction metadata; the worker survives a kill -9 and its connector runs again."""
from __future__ import annotations

import json
import socket
import time
from collections import defaultdict

import pytest

from consistent_stream_testing import kafka_stack, localpg
from postgres_server import Database

pytestmark = pytest.mark.skipif(localpg.available() is not None, reason=str(localpg.available()))


def _payloads(msgs):
    """(key payload, value payload or None) of JsonConverter messages with schemas."""
    out = []
    for m in msgs:
        k = json.loads(m["key"])["payload"] if m["key"] is not None else None
        v = json.loads(m["value"])["payload"] if m["value"] is not None else None
        out.append((k, v))
    return out


def test_debezium_transactions_and_worker_restart(tmp_path):
    db = Database()
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance numeric(12,2) NOT NULL)")
    db.execute("CREATE TABLE note (id int PRIMARY KEY, acct int NOT NULL, text text)")
    for t in ("acct", "note"):
        db.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    db.execute("INSERT INTO acct VALUES (1, 100.00), (2, 50.00)")
    slot = f"dbz_{db.name}"
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        connect_port = so.getsockname()[1]
    stack = kafka_stack.start(tmp_path / "kafka", offset_flush_interval_ms=1000, connect_port=connect_port)
    try:
        assert stack.connect_port == connect_port and stack.connect_url.endswith(f":{connect_port}")
        assert kafka_stack.load(tmp_path / "kafka").bootstrap == stack.bootstrap
        status = stack.register_postgres("cs", db.dsn, ["acct", "note"], "cs", slot=slot, decimal_handling="string")
        assert status["connector"]["state"] == "RUNNING" and status["tasks"][0]["state"] == "RUNNING"
        xids = []
        conn = db.connect()
        conn.autocommit = False
        with conn.cursor() as c:
            for stmts in (["INSERT INTO acct VALUES (3, 10.50)", "INSERT INTO note VALUES (1, 3, 'opened')"],
                          ["UPDATE acct SET balance = balance - 5 WHERE id = 1",
                           "UPDATE acct SET balance = balance + 5 WHERE id = 2", "INSERT INTO note VALUES (2, 1, 'x')"],
                          ["DELETE FROM note WHERE id = 1", "UPDATE acct SET balance = 0 WHERE id = 3"]):
                c.execute("SELECT txid_current()")
                xids.append(str(c.fetchone()[0]))
                for s in stmts:
                    c.execute(s)
                conn.commit()
        conn.close()
        want = {xids[0]: {"public.acct": 1, "public.note": 1}, xids[1]: {"public.acct": 2, "public.note": 1},
                xids[2]: {"public.acct": 1, "public.note": 1}}

        tx = [v for _, v in _payloads(stack.consume("cs.transaction", min_count=6, timeout_s=60))]
        ends = {v["id"].split(":")[0]: v for v in tx if v["status"] == "END" and v["event_count"]}
        begins = {v["id"].split(":")[0] for v in tx if v["status"] == "BEGIN"}
        assert set(ends) == set(want) and set(want) <= begins
        for xid, counts in want.items():
            end = ends[xid]
            assert end["event_count"] == sum(counts.values())
            assert {d["data_collection"]: d["event_count"] for d in end["data_collections"]} == counts
        end_lsns = [int(ends[x]["id"].split(":")[1]) for x in xids]
        assert end_lsns == sorted(end_lsns)  # commit order

        events = defaultdict(list)  # xid -> [(total_order, table, data_collection_order, op)]
        snapshot, tombstones = [], 0
        for table, n in (("acct", 2 + 4), ("note", 3 + 1)):  # snapshot, changes (and a tombstone)
            for key, v in _payloads(stack.consume(f"cs.public.{table}", min_count=n, timeout_s=60)):
                if v is None:
                    tombstones += 1
                    assert key == {"id": 1}
                    continue
                if v["op"] == "r":
                    assert v["transaction"] is None
                    snapshot.append(v["after"]["id"])
                    continue
                t = v["transaction"]
                xid = str(v["source"]["txId"])
                assert t["id"] == f"{xid}:{v['source']['lsn']}"
                events[xid].append((t["total_order"], table, t["data_collection_order"], v["op"]))
        assert sorted(snapshot) == [1, 2] and tombstones == 1
        assert set(events) == set(want)
        for xid, evs in events.items():
            evs.sort()
            assert [e[0] for e in evs] == list(range(1, len(evs) + 1))
            for table in ("acct", "note"):
                assert [e[2] for e in evs if e[1] == table] == list(range(1, want[xid][f"public.{table}"] + 1))
        assert [e[3] for e in events[xids[2]]] == ["d", "u"]
        assert {"cs.transaction", "cs.public.acct", "cs.public.note"} <= set(stack.topics())

        # kill -9 the worker once it committed offsets past the transactions: started again, the
        # connector streams on from them (no second snapshot)
        deadline = time.time() + 30
        while time.time() < deadline:
            offsets = stack.connector_offsets("cs")
            if offsets and offsets[0]["offset"].get("lsn_commit", 0) >= end_lsns[-1]:
                break
            time.sleep(0.5)
        assert offsets and offsets[0]["partition"] == {"server": "cs"}, offsets
        stack.kill_connect()
        assert not stack.alive()["connect"]
        stack.start_connect()
        assert kafka_stack.load(tmp_path / "kafka").connect_pid == stack.connect_pid
        status = stack.wait_running("cs", timeout_s=90)
        assert status["connector"]["state"] == "RUNNING" and status["tasks"][0]["state"] == "RUNNING"
        db.execute("INSERT INTO acct VALUES (4, 1.25)")
        acct = [v for _, v in _payloads(stack.consume("cs.public.acct", min_count=7, timeout_s=60))]
        assert [(v["op"], v["after"]["balance"]) for v in acct if v["after"]["id"] == 4] == [("c", "1.25")]
        assert sum(v["op"] == "r" for v in acct) == 2
    finally:
        stack.stop()
        db.drop_replication_slot(slot, timeout_s=10)
