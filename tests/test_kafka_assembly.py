"""The assembler of ``consistency: transaction`` alone (:mod:`consistent_stream.sources.kafka.assembly`):
Kafka records in, complete upstream transactions out, without Kafka, Spark or a reader. And
the two clocks chosen by ``consistency`` (:mod:`consistent_stream.sources.kafka.clocks`)."""
from __future__ import annotations

import doctest
import json

import numpy as np
import pyarrow as pa
import pytest

from consistent_stream.errors import SourceError
from consistent_stream.sources.kafka import assembly, clocks
from consistent_stream.sources.kafka.assembly import Topic, TransactionAssembler

TX = "pg.transaction"
TOPICS = {"pg.public.a": "public.a", "pg.public.b": "public.b"}


class _Images:
    """One image row per record: the record's index (what the assembler takes by index)."""

    def __init__(self, n: int):
        self.table = pa.table({"i": list(range(n))})

    def of(self, topic: str, side: str):
        return self.table, 0


def _records(rows: list[dict]) -> pa.Table:
    cols = ("topic", "partition", "offset", "op", "tx_id", "total_order", "t_status", "t_id", "t_ts_ms",
            "t_collections")
    table = {c: [r.get(c) for r in rows] for c in cols}
    table["timestamp"] = pa.array([1_700_000_000_000_000] * len(rows), pa.timestamp("us", tz="UTC"))
    return pa.table(table)


def _change(topic: str, partition: int, offset: int, tx: str, order: int, op: str = "c") -> dict:
    return {"topic": topic, "partition": partition, "offset": offset, "op": op, "tx_id": tx, "total_order": order}


def _meta(offset: int, status: str, tx: str, counts: dict | None = None) -> dict:
    collections = json.dumps([{"data_collection": t, "event_count": n} for t, n in counts.items()]) if counts else None
    return {"topic": TX, "partition": 0, "offset": offset, "t_status": status, "t_id": tx, "t_ts_ms": "5",
            "t_collections": collections}


def _assembler() -> tuple[TransactionAssembler, dict]:
    skipped = {"duplicates": 0, "tombstones": 0, "other": 0}
    a = TransactionAssembler(TX, {t: Topic(t, table, ("id",)) for t, table in TOPICS.items()}, skipped)
    a.start_at(0, (), None)   # past the snapshot
    return a, skipped


def _add(a: TransactionAssembler, rows: list[dict]) -> list:
    records = _records(rows)
    data = np.array([i for i, r in enumerate(rows) if r["topic"] != TX], np.int64)
    tx = np.array([i for i, r in enumerate(rows) if r["topic"] == TX], np.int64)
    return a.add(records, data, tx, _Images(len(rows)))


def test_a_transaction_is_published_whole_once_every_table_s_events_arrived_in_commit_order():
    a, skipped = _assembler()
    # tx 7 (END at offset 1) lacks its event of b; tx 8 (END at offset 3) is complete but behind it
    out = _add(a, [_meta(0, "BEGIN", "7:100"), _change("pg.public.a", 0, 0, "7:101", 1),
                   _meta(1, "END", "7:300", {"public.a": 1, "public.b": 1}),
                   _meta(2, "BEGIN", "8:400"), _change("pg.public.a", 1, 0, "8:401", 1),
                   _meta(3, "END", "8:500", {"public.a": 1})])
    assert out == [] and a.last == 0
    assert a.stalled(now_ms=1_700_000_001_000) == [{"id": "7", "age_s": 1.0, "end_seen": True,
                                                    "missing": {"public.b": 1}, "waiting_behind": 1}]
    # b's event arrives (twice: the copy is a duplicate): both publish, in the END order
    out = _add(a, [_change("pg.public.b", 0, 0, "7:102", 2), _change("pg.public.b", 0, 1, "7:102", 2)])
    assert [(p.info.position, p.info.id, p.info.counts) for p in out] == [
        (2, "7", {"public.a": 1, "public.b": 1}), (4, "8", {"public.a": 1})]
    assert {t: [w for w, _, _ in rows] for t, rows in out[0].rows.items()} == {"public.a": [1], "public.b": [1]}
    assert out[0].extent == ("7", 300, {(TX, 0): 0, ("pg.public.a", 0): 0, ("pg.public.b", 0): 0},
                             {(TX, 0): 1, ("pg.public.a", 0): 0, ("pg.public.b", 0): 0})
    assert skipped["duplicates"] == 1 and a.stalled() == [] and not a.pending
    # a transaction sent again after it was published is a duplicate, never applied twice
    assert _add(a, [_change("pg.public.a", 0, 5, "8:401", 1)]) == [] and skipped["duplicates"] == 2


def test_an_end_that_counts_fewer_events_than_arrived_is_an_error():
    a, _ = _assembler()
    with pytest.raises(SourceError, match="counts 1 events of public.a, but 2 distinct events"):
        _add(a, [_meta(0, "BEGIN", "9"), _change("pg.public.a", 0, 0, "9", 1), _change("pg.public.a", 0, 1, "9", 2),
                 _meta(1, "END", "9", {"public.a": 1})])


def test_each_consistency_has_its_clock():
    topics = {"t": Topic("t", "public.t", ("id",))}
    tx, per_topic = clocks.clock_for("transaction", TX, topics, {}), clocks.clock_for("per_topic", "t", topics, {})
    assert isinstance(tx, clocks.TransactionClock) and tx.tx_topic == TX and tx.resumable
    assert isinstance(per_topic, clocks.PerTopicClock) and per_topic.tx_topic is None and not per_topic.resumable
    per_topic.admit({}, "kafka://x")
    with pytest.raises(Exception, match="a per_topic reader reads one topic"):
        per_topic.admit(topics, "kafka://x")


def test_the_docstring_examples_hold():
    result = doctest.testmod(assembly)
    assert result.failed == 0 and result.attempted > 0
