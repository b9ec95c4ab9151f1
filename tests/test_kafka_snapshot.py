"""The connector's snapshot assembled across partitions (:mod:`consistent_stream.sources.kafka.snapshot`),
in every order a reader can meet the partitions: each partition's events in the order the
connector wrote them, the partitions in any order and interleaving. (The same on real Kafka
topics: ``tests/test_kafka_debezium.py``.)"""
from __future__ import annotations

import itertools
import random

import pytest

from consistent_stream.errors import SourceError
from consistent_stream.sources.kafka.snapshot import SnapshotAssembly, attempt_of

TOPIC, TABLE = "p.public.a", "public.a"


def _events(attempts: list[list[tuple[int, int, str]]], keyed: bool = True) -> dict[int, list]:
    """Per partition, in the connector's order: ``(row id, attempt, marker)``; ``attempts``:
    per attempt, ``(row id, partition, marker)`` in write order."""
    parts: dict[int, list] = {}
    for n, rows in enumerate(attempts):
        for rid, part, marker in rows:
            src = {"snapshot": marker, **({"txId": 700 + n, "lsn": 5000 + 100 * n} if keyed else {})}
            parts.setdefault(part, []).append((rid, n, src))
    return parts


def _interleavings(parts: dict[int, list], seed: int, count: int):
    """``count`` random merges of the partitions' sequences (each kept in its order), and
    every partition read whole in each order of the partitions."""
    for order in itertools.permutations(sorted(parts)):
        yield [(p, e) for p in order for e in parts[p]]
    rnd = random.Random(seed)
    for _ in range(count):
        queues = {p: list(es) for p, es in parts.items()}
        out = []
        while queues:
            p = rnd.choice(sorted(queues))
            out.append((p, queues[p].pop(0)))
            if not queues[p]:
                del queues[p]
        yield out


def _assemble(seq, partitions: int = 3) -> tuple[SnapshotAssembly, list]:
    a = SnapshotAssembly()
    for p, (rid, n, src) in seq:
        rows = a.accept(TOPIC, TABLE, p, src, f"partition {p}", partitions)
        if rows is not None:
            rows.append((rid, n))
    return a, a.take()[0].get(TABLE, [])


def test_the_snapshot_is_whole_and_complete_in_every_order_the_partitions_are_read():
    parts = _events([[(1, 2, "first"), (2, 1, "true"), (3, 0, "true"), (4, 2, "true"),
                      (5, 0, "last_in_data_collection")]])
    for seq in _interleavings(parts, seed=1, count=50):
        a = SnapshotAssembly()
        for i, (p, (rid, n, src)) in enumerate(seq):
            assert not a.table_complete(TABLE, TOPIC, over=False, absent=False) or \
                any(s["snapshot"] == "last_in_data_collection" for _, (_, _, s) in seq[:i])
            a.accept(TOPIC, TABLE, p, src, "w", 3).append((rid, n))
        assert a.table_complete(TABLE, TOPIC, over=False, absent=False)
        assert sorted(r for r, _ in a.take()[0][TABLE]) == [1, 2, 3, 4, 5]


def test_a_repeated_snapshot_keeps_only_the_newest_attempt_in_every_order():
    """The first attempt stopped after 3 rows (no last marker); the second wrote them all."""
    first = [(1, 0, "first"), (2, 1, "true"), (3, 2, "true")]
    second = [(1, 0, "first"), (2, 1, "true"), (3, 2, "true"), (4, 1, "true"), (5, 2, "last")]
    for seq in _interleavings(_events([first, second]), seed=2, count=200):
        a, rows = _assemble(seq)
        assert sorted(rows) == [(i, 1) for i in range(1, 6)], seq
        assert a.superseded == 3


def test_snapshot_positions_are_the_connectors_own():
    assert attempt_of({"snapshot": "true", "txId": 732, "lsn": 26589128, "ts_ms": 1}) == \
        (("txId", 732), ("lsn", 26589128))
    assert attempt_of({"snapshot": "true", "file": "binlog.000003", "pos": 154}) == (("file", "binlog.000003"),
                                                                                     ("pos", 154))
    assert attempt_of({"snapshot": "true"}) is None


def test_without_snapshot_positions_a_repeat_is_seen_in_one_partition_and_refused_across_several():
    one = [(p, e) for p, es in _events([[(1, 0, "first"), (2, 0, "true")],
                                        [(1, 0, "first"), (2, 0, "last")]], keyed=False).items() for e in es]
    a, rows = _assemble(one, partitions=1)
    assert sorted(rows) == [(1, 1), (2, 1)] and a.superseded == 2
    several = [(p, e) for p, es in _events([[(1, 0, "first"), (2, 1, "true")],
                                            [(1, 0, "first"), (2, 1, "last")]], keyed=False).items() for e in es]
    with pytest.raises(SourceError, match=r"partition 0: the snapshot of public.a starts again .* no snapshot "
                                          r"position .* across the topic's 3 partitions"):
        _assemble(several)


def test_a_snapshot_read_after_a_change_in_its_partition_or_after_publishing_is_refused():
    a = SnapshotAssembly()
    a.accept(TOPIC, TABLE, 0, {"snapshot": "first", "txId": 1, "lsn": 2}, "w", 3)
    a.streamed(TOPIC, 1)
    a.accept(TOPIC, TABLE, 2, {"snapshot": "true", "txId": 1, "lsn": 2}, "w", 3)   # another partition: fine
    with pytest.raises(SourceError, match=r"p1: a snapshot read \(op r\) after a change of public.a in the same "
                                          r"partition"):
        a.accept(TOPIC, TABLE, 1, {"snapshot": "true", "txId": 1, "lsn": 2}, "p1", 3)
    assert a.table_complete(TABLE, TOPIC, over=False, absent=False)   # a change of it was streamed
    a.take()
    with pytest.raises(SourceError, match=r"after the snapshot was complete"):
        a.accept(TOPIC, TABLE, 0, {"snapshot": "true", "txId": 1, "lsn": 2}, "w", 3)


def test_what_an_incomplete_snapshot_waits_for_names_topic_and_partitions():
    a = SnapshotAssembly()
    for p in (2, 0):
        a.accept(TOPIC, TABLE, p, {"snapshot": "true", "txId": 1, "lsn": 2}, "w", 3).append(p)
    waits = a.waiting([(TOPIC, TABLE, 3), ("p.public.b", "public.b", 1)], over=False, absent=set())
    assert waits[0].startswith("Kafka topic p.public.a (public.a): 2 snapshot rows read in partitions [0, 2] of 3")
    assert "p.public.b (public.b): no snapshot row and no change read yet" in waits[1]
    assert a.waiting([(TOPIC, TABLE, 3), ("p.public.b", "public.b", 1)], over=True, absent=set()) == waits[:1]


def test_between_two_reads_only_a_tables_own_partitions_prove_its_snapshot_read():
    """What may be published before a refresh has read every partition to its end: a table
    whose every partition had a change read (its snapshot rows came before, in each), or whose
    one partition holds its own last snapshot event."""
    a = SnapshotAssembly()
    a.accept(TOPIC, TABLE, 0, {"snapshot": "first", "txId": 1, "lsn": 2}, "w", 3)
    a.accept(TOPIC, TABLE, 1, {"snapshot": "last_in_data_collection", "txId": 1, "lsn": 2}, "w", 3)
    assert a.table_complete(TABLE, TOPIC, over=False, absent=False)
    assert not a.table_evident(TABLE, TOPIC, 3, absent=False)     # partition 2 may hold rows not read yet
    for p in (0, 1):
        a.streamed(TOPIC, p)
    assert not a.table_evident(TABLE, TOPIC, 3, absent=False)
    a.streamed(TOPIC, 2)
    assert a.table_evident(TABLE, TOPIC, 3, absent=False)
    one = SnapshotAssembly()
    one.accept("p.public.b", "public.b", 0, {"snapshot": "true", "txId": 1, "lsn": 2}, "w", 1)
    assert not one.table_evident("public.b", "p.public.b", 1, absent=False)
    one.accept("p.public.b", "public.b", 0, {"snapshot": "last", "txId": 1, "lsn": 2}, "w", 1)
    assert one.table_evident("public.b", "p.public.b", 1, absent=False)
    assert SnapshotAssembly().table_evident("public.c", "p.public.c", 0, absent=True)
