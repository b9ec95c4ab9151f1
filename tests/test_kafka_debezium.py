"""Debezium on Kafka (``format: kafka``) against a real Kafka broker (KRaft), a real Kafka
Connect worker running Debezium's PostgreSQL connector, and PostgreSQL 15: one stack for the
file (``kafka_stack.start``, the script `make demo-kafka` uses too).

* pgbench TPC-B through the whole chain into a continuous model, its four tables full before the
  connector starts (500 branches, 5,000 tellers, 100,000 accounts, 600 history rows: the
  connector's snapshot), on data topics of 1 and of 3 partitions: every committed version keeps
  ``sum(abalance) = sum(tbalance) = sum(bbalance)`` and each branch's balance = the sum of its
  history, equals batch evaluation at its cut, and the last equals PostgreSQL's answer; per-topic
  reads of the same topics (the foil) break the invariant. The Connect worker is SIGKILLed
  and restarted mid-run (duplicates arrive and are dropped), and so is the model's own run.
* Bad inputs on hand-written topics (:mod:`kafka_events`): malformed JSON, an event of another
  table, a topic that does not exist, a transaction whose END never arrives (reported by
  ``status``, nothing partial committed), offsets retention deleted.
"""
from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pytest

import kafka_scenario
from kafka_events import Events
from postgres_server import wait_for
from consistent_stream_testing import kafka_stack
from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import SourceError
from consistent_stream.job import run_job
from consistent_stream.observe import model_status
from consistent_stream.sources.spec import SourceSpec
from consistent_stream.sources.formats import open_source
from consistent_stream.sources.kafka import forget_readers
from consistent_stream.spec import JobSpec


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = kafka_stack.start(tmp_path_factory.mktemp("kafka"))
    try:
        yield s
    finally:
        forget_readers()
        s.stop()


def test_pgbench_through_debezium_on_kafka_is_consistent_at_every_version_through_connect_and_run_crashes(
        spark, stack, tmp_path):
    o = kafka_scenario.run(spark, stack, tmp_path, seconds=45, rate=100, kill_connect_after_s=10,
                           kill_run_after_s=20, min_versions=5)
    print(o)
    assert len(o.snapshot_rows) == 4 and min(o.snapshot_rows.values()) >= 500, o
    assert o.connect_killed and o.run_killed, o
    assert o.transactions > 2000, o
    # how many versions a 45-s continuous run commits depends on the machine's load (4 to 11 seen
    # on 2 cores with the other pytest worker busy): the run goes on until it has five, every one
    # of them checked below
    assert o.versions >= 5, o
    assert o.invariant_violations == 0, o
    assert o.oracle_mismatches == 0 and o.spark_checked >= 2, o
    assert o.final_matches_database, o
    assert o.cut_positions == sorted(o.cut_positions) and len(set(o.cut_positions)) == o.versions, o
    assert o.duplicates_dropped > 0, o       # the restarted connector re-sent what it had not recorded
    assert o.foil_violations > 0, o          # per-topic reads of the same topics break the invariant
    assert o.control_violations == 0, o


def test_pgbench_through_debezium_on_three_partition_topics_is_consistent_through_a_connect_crash(
        spark, stack, tmp_path):
    """The same chain with every data topic in 3 partitions (the transaction topic in one):
    pgbench's four tables are full before the connector starts (500+ rows each; its snapshot
    spreads them over the partitions), the Connect worker is SIGKILLed mid-run; every version
    keeps the invariant and equals batch evaluation, the last equals PostgreSQL. Every read
    goes through Spark's Kafka source, parsed on the executors (``driver_read_records: 0``;
    the test above reads on the driver)."""
    o = kafka_scenario.run(spark, stack, tmp_path, seconds=25, rate=100, kill_connect_after_s=8, partitions=3,
                           spark_checks=1, driver_read_records=0, min_versions=3)
    print(o)
    assert o.connect_killed and o.transactions > 1000 and o.versions >= 3, o
    assert o.invariant_violations == 0 and o.oracle_mismatches == 0 and o.spark_checked >= 1, o
    assert o.final_matches_database, o
    assert o.cut_positions == sorted(o.cut_positions) and len(set(o.cut_positions)) == o.versions, o
    assert stack.partitions(f"{o.prefix}.public.pgbench_accounts") == 3, o
    assert len(o.snapshot_rows) == 4 and min(o.snapshot_rows.values()) >= 500, o


def test_a_snapshot_on_topics_of_several_partitions_builds_and_equals_postgres(spark, stack, tmp_path):
    """The connector's initial snapshot of tables full before it starts, on data topics of 3
    partitions (created before the connector, as production topics are): the first build
    equals PostgreSQL, and so does the run after transfers, deletes and an insert."""
    from postgres_server import Database
    db = Database()
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner int NOT NULL, balance bigint NOT NULL)")
    db.execute("CREATE TABLE owners (id int PRIMARY KEY, name text NOT NULL)")
    for t in ("accounts", "owners"):
        db.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    db.execute("INSERT INTO accounts SELECT g, g % 7, 1000 + g FROM generate_series(1, 500) g")
    db.execute("INSERT INTO owners SELECT g, 'o' || g FROM generate_series(0, 6) g")
    for t in ("accounts", "owners"):
        stack.create_topic(f"bank.public.{t}", 3)
    stack.register_postgres("bank", db.dsn, ["accounts", "owners"], "bank", slot=f"s_bank_{db.name}")
    try:
        _bank_builds_and_equals_postgres(spark, stack, tmp_path, db)
    finally:
        kafka_scenario.remove_connector(stack, db, "bank", f"s_bank_{db.name}")
        forget_readers()


def _bank_builds_and_equals_postgres(spark, stack, tmp_path, db):
    assert len(stack.consume("bank.public.accounts", min_count=500, timeout_s=120)) == 500
    sql = ("select o.name, count(*) as n, sum(a.balance) as total from bank.accounts a "
           "join bank.owners o on a.owner = o.id group by o.name")
    sources = [{"source_name": "bank", "name": t, "relation": f"bank.{t}",
                "meta": {"format": "kafka", "bootstrap_servers": stack.bootstrap, "topic": f"bank.public.{t}",
                         "primary_key": "id"}} for t in ("accounts", "owners")]
    job = JobSpec.from_dbt(project_root=str(tmp_path), schema="s", identifier="bank", model_name="bank", sql=sql,
                           sources=sources, config={"unique_key": "name",
                                                    "location_root": str(tmp_path / "targets")},
                           warehouse_dir=str(tmp_path / "wh"))
    job = JobSpec(**{**job.__dict__, "trigger": "available_now"})
    want = "select o.name, count(*), sum(a.balance) from accounts a join owners o on a.owner = o.id group by o.name"

    def same():
        from helpers import delta_pandas
        got = {(r.name, r.n, r.total) for r in delta_pandas(job.target_path).itertuples(index=False)}
        assert got == {(n, c, int(t)) for n, c, t in db.execute(want)}
    run_job(spark, job, full_refresh=True)
    same()
    for i in range(1, 40):
        db.execute(f"UPDATE accounts SET balance = balance - {i} WHERE id = {i}; "
                   f"UPDATE accounts SET balance = balance + {i} WHERE id = {500 - i}")
    db.execute("DELETE FROM accounts WHERE id BETWEEN 200 AND 209")
    db.execute("INSERT INTO accounts VALUES (501, 3, 7)")
    # the transactions' ENDs and their data events (78 updates, 10 deletes each with its
    # tombstone, an insert): a run takes a transaction whole or not at all, so one whose data
    # events are not all on the topics yet would (rightly) be left for the next run
    wait_for(lambda: _topic_events(stack, "bank.transaction") >= 2 * 41
             and _topic_events(stack, "bank.public.accounts") >= 500 + 78 + 2 * 10 + 1,
             timeout=120, what="the transactions and their events")
    run_job(spark, job)
    same()


def test_decimals_are_decimals_in_every_decimal_handling_mode(spark, stack, tmp_path):
    """A numeric(12,2) column through Debezium in its precise, string and double modes (and in
    string mode with the table's columns declared): decimal(12,2) in the model, and 0.10 + 0.20
    + 0.30 is exactly 0.60. The precise connector's data topic has 3 partitions (Connect's topic
    creation), its transaction topic one."""
    from postgres_server import Database
    db = Database()
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance numeric(12,2) NOT NULL)")
    db.execute("ALTER TABLE acct REPLICA IDENTITY FULL")
    db.execute("INSERT INTO acct VALUES (1, 0.10), (2, 0.20)")
    modes = ("precise", "string", "double")
    try:
        for mode in modes:
            stack.register_postgres(f"dec_{mode}", db.dsn, ["acct"], f"dec{mode}", slot=f"s_dec_{mode}_{db.name}",
                                    decimal_handling=mode, partitions=3 if mode == "precise" else None)
        _decimals_sum_exactly(spark, stack, tmp_path, db, modes)
    finally:
        for mode in modes:
            if f"dec_{mode}" in stack.connectors():
                kafka_scenario.remove_connector(stack, db, f"dec_{mode}", f"s_dec_{mode}_{db.name}")


def _decimals_sum_exactly(spark, stack, tmp_path, db, modes):
    import decimal
    import pyarrow as pa
    from helpers import delta_pandas
    db.execute("INSERT INTO acct VALUES (3, 0.30)")
    for mode in modes:
        # the data topic too: a run takes a transaction whole or not at all, so one whose END is
        # on the transaction topic before its row is on the data topic is rightly left for later
        wait_for(lambda mode=mode: _topic_events(stack, f"dec{mode}.transaction") >= 2
                 and _topic_events(stack, f"dec{mode}.public.acct") >= 3, timeout=120,
                 what="the transaction and its row")
    assert stack.partitions("decprecise.public.acct") == 3 and stack.partitions("decprecise.transaction") == 1
    assert stack.partitions("decstring.public.acct") == 1
    for mode, columns in [(m, None) for m in modes] + [("string", {"id": "int", "balance": "decimal(12,2)"})]:
        meta = {"format": "kafka", "bootstrap_servers": stack.bootstrap, "topic": f"dec{mode}.public.acct",
                "primary_key": "id", **({"columns": columns} if columns else {})}
        name = f"dec_{mode}{'_declared' if columns else ''}"
        job = JobSpec.from_dbt(project_root=str(tmp_path), schema="s", identifier=name, model_name=name,
                               sql="select 'all' as k, sum(balance) as total, count(*) as n from d.acct",
                               sources=[{"source_name": "d", "name": "acct", "relation": "d.acct", "meta": meta}],
                               config={"unique_key": "k", "location_root": str(tmp_path / "targets")},
                               warehouse_dir=str(tmp_path / "wh"))
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
        got = pa.table(DeltaTableRef(job.target_path).table().to_pyarrow_table())
        assert got.schema.field("total").type == pa.decimal128(22, 2), (name, got.schema)   # Spark's sum of (12,2)
        rows = delta_pandas(job.target_path).to_dict("records")
        assert rows == [{"k": "all", "total": decimal.Decimal("0.60"), "n": 3}], (name, rows)
        forget_readers()


def _topic_events(stack, topic: str) -> int:
    return sum(high - low for low, high in stack.watermarks(topic).values())


def _spread(stack, e: Events, table: str, rows: list[tuple[int, int, str]]) -> None:
    """Snapshot reads of ``table``: ``(id, partition, marker)`` each (v = 10 * id)."""
    for i, part, marker in rows:
        stack.produce(e.topic(table), [e.change(table, "r", None, {"id": i, "v": 10 * i}, None, marker)],
                      key=str(i), partition=part)


def test_a_snapshot_spread_over_partitions_in_any_order_and_a_repeated_one_are_assembled(spark, stack, tmp_path):
    """Snapshot reads on topics of 3 partitions, the event marked ``first`` in the last
    partition and the table's last one in the first: the first build holds every row. A
    connector that stopped during its snapshot and took it again: only the second attempt's
    rows, however the attempts' events fall into partitions. A snapshot whose last event has
    not come: the run says which topic and partitions wait, and blames no SQL."""
    e = Events("spread")
    for t in ("a", "b"):
        stack.create_topic(e.topic(t), 3)
    _spread(stack, e, "a", [(1, 2, "first"), (2, 1, "true"), (3, 2, "true"), (4, 1, "true"),
                            (5, 0, "last_in_data_collection")])
    _spread(stack, e, "b", [(1, 2, "true"), (2, 0, "last")])
    job = _job(tmp_path, stack, e)
    available_now = JobSpec(**{**job.__dict__, "trigger": "available_now"})
    run_job(spark, available_now, full_refresh=True)
    assert _totals(job.target_path) == {"a": 150, "b": 30}
    _tx(stack, e, [("a", {"id": 1, "v": 10}, {"id": 1, "v": 11}), ("b", None, {"id": 3, "v": 1})])
    run_job(spark, available_now)
    assert _totals(job.target_path) == {"a": 151, "b": 31}
    forget_readers()

    e = Events("again")
    for t in ("a", "b"):
        stack.create_topic(e.topic(t), 3)
    _spread(stack, e, "a", [(1, 0, "first"), (2, 1, "true"), (3, 2, "true")])          # stopped here
    e.repeat_snapshot()
    _spread(stack, e, "a", [(1, 0, "first"), (2, 1, "true"), (4, 2, "true"), (5, 0, "last_in_data_collection")])
    _spread(stack, e, "b", [(7, 1, "last")])
    job = _job(tmp_path, stack, e, name="m2")
    run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    assert _totals(job.target_path) == {"a": 120, "b": 70}
    forget_readers()

    e = Events("partial")
    for t in ("a", "b"):
        stack.create_topic(e.topic(t), 3)
    _spread(stack, e, "a", [(1, 2, "first"), (2, 1, "true"), (3, 0, "true")])
    job = _job(tmp_path, stack, e, name="m3", tables=("a",))
    with pytest.raises(SourceError, match=r"source\('k', 'a'\) has nothing to read yet: the connector's snapshot is "
                                          r"not read yet: Kafka topic partial.public.a \(public.a\): 3 snapshot rows "
                                          r"read in partitions \[0, 1, 2\] of 3, but not the connector's last"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    forget_readers()


def _tx_spread(stack, e: Events, changes: list[tuple[str, dict | None, dict | None]], *, again: bool = False,
               twice: int | None = None) -> None:
    """A transaction whose events go to partition ``id % 3`` of their topics; ``again``: the
    whole transaction is sent a second time (a restarted connector); ``twice``: the change at
    that index is sent twice in a row."""
    tx, begin = e.begin()
    sent = [(e.tx_topic, None, begin)]
    counts = {}
    for i, (table, before, after) in enumerate(changes):
        op = "c" if before is None else "d" if after is None else "u"
        row = after or before
        value = e.change(table, op, before, after, tx)
        sent += [(e.topic(table), row["id"] % 3, value)] * (2 if i == twice else 1)
        counts[table] = counts.get(table, 0) + 1
    sent.append((e.tx_topic, None, e.end(tx, counts)))
    for topic, part, value in sent * (2 if again else 1):
        stack.produce(topic, [value], key=None if part is None else str(part), partition=part)


def test_changes_dropped_from_memory_are_read_from_their_copies_or_again_from_the_topics(
        spark, stack, tmp_path, monkeypatch):
    """A reader keeps at most ``image_budget`` bytes of assembled changes; what needs older ones
    reads the copies it wrote of them to the driver's disk (a local session:
    :mod:`consistent_stream.sources.chunk_files`), or is computed by Spark from the topics
    (``copy_dropped`` false, as with a cluster: :mod:`consistent_stream.sources.kafka.table`).
    On topics of 3 partitions, with a snapshot that stopped and was taken again, updates,
    deletes, a key changed twice in one transaction, a transaction sent twice and an event sent
    twice: a reader that keeps nothing gives, either way, the same table at every position (on
    the driver and computed by Spark) and the same changes as one that keeps everything, and a
    first build that keeps nothing (the rebuild on the driver and on the executors) gives the
    model's answer."""
    from consistent_stream.sources.kafka import reader as kafka
    e = Events("dropped")
    for t in ("a", "b"):
        stack.create_topic(e.topic(t), 3)
    _spread(stack, e, "a", [(1, 0, "first"), (2, 1, "true"), (3, 2, "true")])          # stopped here
    e.repeat_snapshot()
    _spread(stack, e, "a", [(i, i % 3, "first" if i == 1 else "true") for i in range(1, 30)]
            + [(30, 0, "last_in_data_collection")])
    _spread(stack, e, "b", [(1, 1, "true"), (2, 2, "last")])
    _tx_spread(stack, e, [("a", {"id": 1, "v": 10}, {"id": 1, "v": 11}), ("b", None, {"id": 3, "v": 1})])
    _tx_spread(stack, e, [("a", {"id": 2, "v": 20}, None), ("a", None, {"id": 31, "v": 310})], again=True)
    _tx_spread(stack, e, [("a", {"id": 5, "v": 50}, {"id": 5, "v": 55}), ("a", {"id": 5, "v": 55}, {"id": 5, "v": 56}),
                          ("b", {"id": 1, "v": 10}, None)], twice=1)
    _tx_spread(stack, e, [("a", {"id": 31, "v": 310}, {"id": 31, "v": 1}), ("b", {"id": 3, "v": 1}, {"id": 3, "v": 2})])

    def reader(budget: int, copy: bool = True):
        r = kafka.KafkaReader(stack.bootstrap, e.tx_topic, "transaction")
        r.image_budget, r.copy_dropped = budget, copy
        for t in ("a", "b"):
            r.add_table(e.topic(t), f"public.{t}", ("id",), {})
        return r.refresh()

    kept, copied, dropped = reader(1 << 30), reader(0), reader(0, copy=False)
    positions = [tx.position for tx in kept.transactions()]
    assert len(positions) == 5 and positions[0] == 0 and dropped.latest_position() == positions[-1]
    assert kept.floor == -1 and dropped.floor == copied.floor == positions[-1] and dropped.recomputable
    assert kept.skipped == dropped.skipped and kept.skipped["duplicates"] >= 3
    assert dropped._files is None and copied._files is not None and os.listdir(copied._files.directory)

    def rows(t):
        return sorted(t.to_pylist(), key=lambda r: sorted(r.items()))
    for table in ("public.a", "public.b"):
        for p in (0, positions[2], positions[-1]):
            want = rows(kept.table_at(table, p))
            for r in (copied, dropped):
                assert rows(r.table_at(table, p)) == want, (table, p, r.copy_dropped)
                assert rows(r.table_frame(table, p, materialize=False).toArrow()) == want, (table, p, r.copy_dropped)
                assert r.row_count(table, p) == kept.row_count(table, p)
        assert rows(kept.table_frame(table, positions[3]).toArrow()) == rows(kept.table_at(table, positions[3]))
        for after, upto in ((-1, positions[-1]), (0, positions[2]), (positions[1], positions[3])):
            for r in (copied, dropped):
                assert rows(r.changes(table, after, upto)) == rows(kept.changes(table, after, upto))
    assert sum(r["v"] for r in kept.table_at("public.a", positions[-1]).to_pylist()) == 10 * sum(range(1, 31)) \
        - 10 + 11 - 20 - 50 + 56 + 1
    assert rows(dropped.table_at("public.b", positions[-1])) == [{"id": 2, "v": 20}, {"id": 3, "v": 2}]

    expected = {"a": sum(r["v"] for r in kept.table_at("public.a", positions[-1]).to_pylist()), "b": 22}
    monkeypatch.setattr(kafka, "IMAGE_BUDGET", 0)
    for copy in (True, False):
        monkeypatch.setattr(kafka.KafkaReader, "copy_dropped", copy)
        for name, config in (("on_driver", {}), ("executors", {"driver_rebuild_rows": 0})):
            forget_readers()
            job = _job(tmp_path, stack, e, name=f"{name}_{copy}")
            job = JobSpec(**{**job.__dict__, "trigger": "available_now", **config})
            run_job(spark, job, full_refresh=True)
            assert _totals(job.target_path) == expected, (name, copy)
    forget_readers()


# -- bad inputs on hand-written topics ------------------------------------------------------------

def _job(tmp_path, stack, e: Events, tables=("a", "b"), sql=None, name="m", columns=None):
    sources = [{"source_name": "k", "name": t, "relation": f"k.{t}",
                "meta": {"format": "kafka", "bootstrap_servers": stack.bootstrap, "topic": e.topic(t),
                         "primary_key": "id", **({"columns": columns} if columns else {})}} for t in tables]
    sql = sql or " union all ".join(f"select '{t}' as t, sum(v) as total from k.{t}" for t in tables)
    return JobSpec.from_dbt(project_root=str(tmp_path), schema="s", identifier=name, model_name=name, sql=sql,
                            sources=sources, config={"unique_key": "t", "location_root": str(tmp_path / "targets")},
                            warehouse_dir=str(tmp_path / "wh"))


def _snapshot(stack, e: Events, tables=("a", "b")):
    for t in tables:
        stack.produce(e.topic(t), [e.change(t, "r", None, {"id": 1, "v": 10}, None, "last_in_data_collection")])


def _tx(stack, e: Events, changes: list[tuple[str, dict | None, dict | None]], end: bool = True) -> str:
    tx, begin = e.begin()
    stack.produce(e.tx_topic, [begin])
    counts = {}
    for table, before, after in changes:
        op = "c" if before is None else "d" if after is None else "u"
        stack.produce(e.topic(table), [e.change(table, op, before, after, tx)])
        counts[table] = counts.get(table, 0) + 1
    if end:
        stack.produce(e.tx_topic, [e.end(tx, counts)])
    return tx


def _totals(path: str) -> dict:
    from helpers import delta_pandas
    t = DeltaTableRef(path)
    return {r.t: r.total for r in delta_pandas(path, t.latest_version()).itertuples(index=False)}


def test_a_payload_is_parsed_alone_where_the_value_has_its_topics_envelope_and_whole_elsewhere(
        spark, stack, tmp_path):
    """The reader learns the text each topic's values start with up to the payload from its
    first event (spacing as written); values that have it are parsed from the payload alone,
    any other (another spacing, an envelope whose schema differs, no envelope: the transaction
    topic here, a null payload: a tombstone) whole. The
    reader's columns equal those of parsing every value whole, and the model's answer holds
    every event."""
    import orjson
    from consistent_stream.sources.kafka import reader as kafka
    from consistent_stream.sources.debezium.columns import local_projection, projection
    e = Events("env")

    def compact(v: bytes) -> bytes:
        return orjson.dumps(orjson.loads(v))
    for t in ("a", "b"):
        stack.produce(e.topic(t), [compact(e.change(t, "r", None, {"id": 1, "v": 10}, None,
                                                    "last_in_data_collection"))])
    tx, begin = e.begin()
    other = orjson.loads(e.change("a", "u", {"id": 1, "v": 10}, {"id": 1, "v": 11}, tx))
    other["schema"]["version"] = 3
    tombstone = orjson.loads(compact(e.change("a", "c", None, {"id": 9, "v": 90}, None)))
    tombstone["payload"] = None
    values_a = [compact(e.change("a", "c", None, {"id": 3, "v": 30}, tx)),
                e.change("a", "c", None, {"id": 2, "v": 20}, tx),       # json.dumps: spaced
                orjson.dumps(other), orjson.dumps(tombstone)]
    stack.produce(e.tx_topic, [begin])
    stack.produce(e.topic("a"), values_a)
    stack.produce(e.topic("b"), [compact(e.change("b", "d", {"id": 1, "v": 10}, None, tx))])
    stack.produce(e.tx_topic, [e.end(tx, {"a": 3, "b": 1})])

    r = kafka.KafkaReader(stack.bootstrap, e.tx_topic, "transaction")
    for t in ("a", "b"):
        r.add_table(e.topic(t), f"public.{t}", ("id",), {})
    r.refresh()
    prefix = r.envelopes[e.topic("a")]
    assert set(r.envelopes) == {e.topic("a"), e.topic("b")} and prefix.endswith('},"payload":')
    assert [v.startswith(prefix.encode() + b"{") for v in values_a] == [True, False, False, False]
    assert r.skipped["tombstones"] == 1
    data = [(t.topic, t.table, t.schema) for t in r._topics.values()]
    ranges = {tp: (0, end) for tp, end in r._next.items()}
    alone = r.log.read(ranges, project=projection(data, r.tx_topic, r.envelopes))
    whole = r.log.read(ranges, project=projection(data, r.tx_topic, {}))
    assert alone.num_rows == 9 and alone.equals(whole)
    # the driver's read and parse (librdkafka, DuckDB) gives the executors' columns, the
    # values cut to their payloads where they have their topic's envelope or not
    for prefixes in ({t: p.encode() for t, p in r.envelopes.items()}, {}):
        fetched = r.log.fetch(ranges, prefixes)
        assert fetched.column("cut").to_pylist().count(True) == (4 if prefixes else 0)
        local = local_projection(data, r.tx_topic)(fetched)
        assert local.column_names == whole.column_names
        assert local.cast(whole.schema).equals(whole), (local.to_pylist(), whole.to_pylist())
    # the reads set a consumer group id (a cache key only): Spark's seven-line warning about
    # group ids is not logged at every one of them
    provider = spark._jvm.org.apache.logging.log4j.LogManager.getLogger(
        "org.apache.spark.sql.kafka010.KafkaSourceProvider")
    assert str(provider.getLevel()) == "ERROR"

    job = _job(tmp_path, stack, e, name="env", sql=" union all ".join(
        f"select '{t}' as t, count(*) as n, coalesce(sum(v), 0) as total from k.{t}" for t in ("a", "b")))
    run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    assert _totals(job.target_path) == {"a": 61, "b": 0}
    forget_readers()


def test_malformed_json_names_topic_partition_and_offset_and_commits_nothing(spark, stack, tmp_path):
    e = Events("bad1")
    _snapshot(stack, e)
    job = _job(tmp_path, stack, e)
    run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    before = _totals(job.target_path)
    stack.produce(e.tx_topic, [e.begin()[1]])
    stack.produce(e.topic("a"), [b'{"op": "c", "after": {"id": 2,'])
    with pytest.raises(SourceError, match=r"Kafka topic bad1.public.a partition 0 offset 1: malformed JSON"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}))
    assert _totals(job.target_path) == before
    forget_readers()


def test_a_value_that_does_not_fit_its_column_and_a_changed_schema_are_named_and_nothing_is_committed(
        spark, stack, tmp_path):
    """Values are parsed on the executors (FAILFAST, try_cast: with ANSI mode on or off); the
    record the executors refuse is named by reading it again on the driver. Extra columns,
    which a typed parse would drop, are caught from each image's keys, with the envelope or
    without it (declared columns)."""
    import json
    ansi = spark.conf.get("spark.sql.ansi.enabled", None)
    try:
        for mode in ("false", "true"):   # a cast that fails quietly, or raises
            spark.conf.set("spark.sql.ansi.enabled", mode)
            e = Events(f"bad5{mode}")
            _snapshot(stack, e)
            job = _job(tmp_path, stack, e, name=f"m5{mode}")
            run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
            before = _totals(job.target_path)
            _tx(stack, e, [("a", None, {"id": 2, "v": 5})])
            _tx(stack, e, [("a", None, {"id": "three", "v": 5})])
            with pytest.raises(SourceError, match=rf"Kafka topic bad5{mode}.public.a partition 0 offset 2: column "
                                                  rf"'id' has a value that is not a int32"):
                run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}))
            assert _totals(job.target_path) == before
            forget_readers()
    finally:
        if ansi is None:
            spark.conf.unset("spark.sql.ansi.enabled")
        else:
            spark.conf.set("spark.sql.ansi.enabled", ansi)

    e = Events("bad6")
    _snapshot(stack, e)
    job = _job(tmp_path, stack, e, name="m6")
    run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    before = _totals(job.target_path)
    tx, begin = e.begin()
    value = json.loads(e.change("a", "c", None, {"id": 2, "v": 5, "w": 1}, tx))
    row = value["schema"]["fields"][1]
    value["schema"]["fields"][1] = {**row, "fields": row["fields"] + [{"type": "int64", "optional": True,
                                                                       "field": "w"}]}
    stack.produce(e.tx_topic, [begin])
    stack.produce(e.topic("a"), [json.dumps(value).encode()])
    stack.produce(e.tx_topic, [e.end(tx, {"a": 1})])
    with pytest.raises(SourceError, match=r"Kafka topic bad6.public.a partition 0 offset 1: row of public.a does not "
                                          r"match its schema .*unknown columns \['w'\].*schema changes of captured "
                                          r"tables are not supported"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}))
    assert _totals(job.target_path) == before
    forget_readers()

    e = Events("bad7", schemas=False)
    _snapshot(stack, e)
    _tx(stack, e, [("a", None, {"id": 2, "v": 5, "w": 1})])
    job = _job(tmp_path, stack, e, name="m7", columns={"id": "int", "v": "bigint"})
    with pytest.raises(SourceError, match=r"Kafka topic bad7.public.a partition 0 offset 1: row of public.a does not "
                                          r"match its schema .*unknown columns \['w'\]"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    forget_readers()


def test_an_event_of_another_table_and_a_missing_topic_are_named(spark, stack, tmp_path):
    e = Events("bad2")
    _snapshot(stack, e)
    stack.produce(e.topic("a"), [e.change("zzz", "r", None, {"id": 3, "v": 1}, None, "last")])
    job = _job(tmp_path, stack, e)
    with pytest.raises(SourceError, match=r"offset 1: event of table 'public.zzz' in the topic of public.a"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    forget_readers()
    e = Events("bad3")
    _snapshot(stack, e, tables=("a",))
    job = _job(tmp_path, stack, e, tables=("a", "nope"), name="m2")
    with pytest.raises(SourceError, match=r"Kafka topic 'bad3.public.nope' \(meta.consistent_stream.topic\) "
                                          r"does not exist"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    forget_readers()


def test_a_transaction_whose_end_never_arrives_holds_back_later_ones_and_status_reports_it(spark, stack, tmp_path):
    e = Events("stall")
    _snapshot(stack, e)
    job = _job(tmp_path, stack, e)
    available_now = JobSpec(**{**job.__dict__, "trigger": "available_now"})
    run_job(spark, available_now, full_refresh=True)
    assert _totals(job.target_path) == {"a": 10, "b": 10}
    # a transfer between a and b whose END never arrives, then a complete later transaction
    stuck = _tx(stack, e, [("a", {"id": 1, "v": 10}, {"id": 1, "v": 5}), ("b", {"id": 1, "v": 10},
                                                                          {"id": 1, "v": 15})], end=False)
    _tx(stack, e, [("a", None, {"id": 2, "v": 100})])
    run_job(spark, available_now)
    assert _totals(job.target_path) == {"a": 10, "b": 10}     # nothing partial, nothing later
    s = model_status(job)
    assert set(s.waiting) == {"k.a", "k.b"}    # one clock: both tables wait for it
    waiting = s.waiting["k.a"]
    assert waiting[0]["waiting_behind"] == 1 and waiting[0]["id"] == stuck.split(":")[0], s   # the xid
    assert not waiting[0]["end_seen"] and waiting[0]["age_s"] >= 0, s
    # the END arrives: both transactions enter, in END order
    stack.produce(e.tx_topic, [e.end(stuck, {"a": 1, "b": 1})])
    run_job(spark, available_now)
    assert _totals(job.target_path) == {"a": 105, "b": 15}
    forget_readers()


def test_a_run_reads_on_from_the_offsets_its_target_commit_records_and_lost_ones_are_named(spark, stack, tmp_path):
    """Each run below is a new process as far as Kafka goes (``forget_readers``): it resumes
    from the offsets the target's last commit records (``cut_offsets``), so records before
    them may be deleted (retention); records deleted before they were read are a SourceError
    naming partition and offset and --full-refresh, and nothing is committed."""
    e = Events("gone")
    _snapshot(stack, e)
    job = _job(tmp_path, stack, e)
    available_now = JobSpec(**{**job.__dict__, "trigger": "available_now"})
    run_job(spark, available_now, full_refresh=True)
    _tx(stack, e, [("a", {"id": 1, "v": 10}, {"id": 1, "v": 11}), ("b", None, {"id": 2, "v": 1})])
    forget_readers()
    run_job(spark, available_now)
    assert _totals(job.target_path) == {"a": 11, "b": 11}
    # the run read on from its resume point; the table as of a position reads the topics' start
    resumed = open_source(job.sources[0])
    assert resumed.reader().base == 0
    assert sorted(resumed.snapshot_arrow(resumed.latest_position()).to_pylist(), key=str) == [{"id": 1, "v": 11}]
    offsets = DeltaTableRef(job.target_path).latest_commit().metadata["cut_offsets"]
    assert "gone.transaction" in str(offsets) and '"gone.public.a": {"0": 2}' in str(offsets).replace("'", '"')
    # everything read so far may go: the next run starts past it
    for t in ("a", "b"):
        stack.delete_records(e.topic(t), 0, 2)
    stack.delete_records(e.tx_topic, 0, 2)
    _tx(stack, e, [("a", {"id": 1, "v": 11}, {"id": 1, "v": 12})])
    forget_readers()
    run_job(spark, available_now)
    assert _totals(job.target_path) == {"a": 12, "b": 11}
    # a change deleted before any run read it
    _tx(stack, e, [("a", {"id": 1, "v": 12}, {"id": 1, "v": 13})])
    stack.delete_records(e.topic("a"), 0, 4)
    forget_readers()
    with pytest.raises(SourceError, match=r"Kafka topic gone.public.a partition 0: offset 3, where this model's "
                                          r"next read starts, is no longer in Kafka \(the first offset still there "
                                          r"is 4.*--full-refresh"):
        run_job(spark, available_now)
    assert _totals(job.target_path) == {"a": 12, "b": 11}
    forget_readers()


def test_without_transaction_metadata_the_model_refuses_unless_per_topic_cuts_are_chosen(spark, stack, tmp_path):
    e = Events("notx")
    _snapshot(stack, e)
    stack.produce(e.topic("a"), [e.change("a", "u", {"id": 1, "v": 10}, {"id": 1, "v": 12}, None)])
    job = _job(tmp_path, stack, e)
    with pytest.raises(SourceError, match=r"notx.public.a partition 0 offset 1: change event \(op u\) without a "
                                          r"'transaction' block: the connector must run with "
                                          r"provide.transaction.metadata=true for .*consistency: per_topic"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    per_topic = JobSpec(**{**job.__dict__, "trigger": "available_now", "sources": [
        SourceSpec.from_json({**dataclasses.asdict(s), "options": [
            (k, v if k != "consistency" else '"per_topic"') for k, v in s.options]}) for s in job.sources]})
    run_job(spark, per_topic, full_refresh=True)
    assert _totals(job.target_path) == {"a": 12, "b": 10}
    cut = DeltaTableRef(job.target_path).latest_commit().metadata["cut"]
    assert '"k.a": 2' in str(cut).replace("'", '"') and '"k.b": 1' in str(cut).replace("'", '"')   # own offsets
    forget_readers()


def test_an_empty_range_of_a_table_from_the_topics_is_an_empty_frame_in_a_thread_without_an_active_session(
        spark, stack):
    """dbt runs models in threads of its own, where no Spark session is active: the lazy
    table from the topics of a range with no change (what compiling a model analyzes before
    anything was published) is an empty frame of the table's columns there too."""
    import threading
    from consistent_stream.sources.kafka import reader as kafka
    from consistent_stream.sources.kafka.table import table_frame
    from consistent_stream.sources.spec import INITIAL
    e = Events("nosession")
    r = kafka.KafkaReader(stack.bootstrap, e.tx_topic, "transaction")
    r.add_table(e.topic("a"), "public.a", ("id",), {"id": "int32", "v": "int64"})
    r.refresh()
    out = {}

    def analyze():
        try:
            df = table_frame(r.topic_cut("public.a", INITIAL, INITIAL), INITIAL, materialize=False)
            out["columns"], out["rows"] = df.columns, df.count()
        except Exception as ex:   # noqa: BLE001 - handed to the test's thread
            out["error"] = ex
    t = threading.Thread(target=analyze)
    t.start()
    t.join()
    assert "error" not in out, out.get("error")
    assert out == {"columns": ["id", "v"], "rows": 0}
    forget_readers()


def test_reads_on_the_driver_and_on_the_executors_give_the_same_tables_and_a_bad_setting_is_named(
        spark, stack, tmp_path):
    """``driver_read_records`` decides where a refresh reads and parses: the driver's Kafka
    client and DuckDB (the default, for a small refresh) or Spark's Kafka source and its
    executors (``0``); both readers publish the same positions and tables. The setting comes
    from the sources (the smallest of a clock's), and a value that is not a count is named."""
    from consistent_stream.errors import ConfigError
    from consistent_stream.sources.kafka import ReaderRegistry
    from consistent_stream.sources.kafka import reader as kafka
    e = Events("where")
    _snapshot(stack, e)
    _tx(stack, e, [("a", None, {"id": 2, "v": 20}), ("b", {"id": 1, "v": 10}, {"id": 1, "v": 11})])
    _tx(stack, e, [("a", {"id": 1, "v": 10}, None)])
    stack.produce(e.topic("a"), [None])   # the delete's tombstone
    seen = {}
    for limit in (kafka.DRIVER_READ_RECORDS, 0):
        spec = SourceSpec.from_dbt({"source_name": "k", "name": "a", "relation": "k.a", "meta": {
            "format": "kafka", "bootstrap_servers": stack.bootstrap, "topic": e.topic("a"), "primary_key": "id",
            **({} if limit else {"driver_read_records": 0})}}, str(tmp_path))
        r = ReaderRegistry().declare(spec)
        assert r.driver_read_records == limit
        r.add_table(e.topic("b"), "public.b", ("id",), {})
        r.refresh()
        assert r._on_driver is (limit > 0) and r.skipped["tombstones"] == 1
        seen[limit] = (r.latest_position(), [r.table_at(f"public.{t}", r.latest_position()).sort_by("id").to_pylist()
                                             for t in ("a", "b")])
        r.log.close()
    assert seen[0] == seen[kafka.DRIVER_READ_RECORDS]
    assert [[(row["id"], row["v"]) for row in t] for t in seen[0][1]] == [[(2, 20)], [(1, 11)]]
    with pytest.raises(ConfigError, match=r"source\('k', 'a'\): meta.consistent_stream.driver_read_records is -1"):
        SourceSpec.from_dbt({"source_name": "k", "name": "a", "relation": "k.a", "meta": {
            "format": "kafka", "bootstrap_servers": stack.bootstrap, "topic": e.topic("a"),
            "driver_read_records": -1}}, str(tmp_path))


def test_a_model_over_kafka_compiles_from_the_topics_first_records_while_the_backlog_is_read(
        spark, stack, tmp_path):
    """A Kafka source's columns come from its topic's first records, not from reading its
    backlog (:meth:`.kafka.reader.KafkaReader.head_schema`), so a first build compiles the model on a
    thread while the driver reads the topics (``job._compile_ahead``): its SQL error is the
    run's, nothing is committed and no compile thread outlives the run; a valid model builds."""
    import threading
    from consistent_stream.errors import CompileError
    from consistent_stream.sources.kafka import declare
    e = Events("ahead")
    _snapshot(stack, e)
    for i in range(2, 6):
        _tx(stack, e, [("a", None, {"id": i, "v": i}), ("b", {"id": 1, "v": 10 + i - 1 if i > 2 else 10},
                                                        {"id": 1, "v": 10 + i})])
    job = _job(tmp_path, stack, e, sql="select 'a' as t, sum(nope) as total from k.a", name="bad")
    source = open_source(job.sources[0])
    assert [f.name for f in source.schema().fields] == ["id", "v"]
    reader = declare(job.sources[0])   # the process-wide reader the source reads through
    assert reader.read_events == 0 and reader.latest_position() == -1   # the backlog is not read for the columns
    with pytest.raises(CompileError, match="nope"):
        run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    assert not DeltaTableRef(job.target_path).exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("compile-ahead")]
    forget_readers()
    job = _job(tmp_path, stack, e, name="good")
    run_job(spark, JobSpec(**{**job.__dict__, "trigger": "available_now"}), full_refresh=True)
    assert _totals(job.target_path) == {"a": 10 + 2 + 3 + 4 + 5, "b": 15}
    forget_readers()


def test_successive_fetches_of_a_backlog_go_on_where_the_last_ended_and_equal_one_fetch(stack):
    """The driver's fetch of a backlog in parts (:func:`.kafka.log.split_ranges`: every partition
    advancing in each) keeps its assignment and what it fetched ahead from part to part; a
    fetch of other ranges between parts (a diagnosis) and a tombstone change nothing: the parts
    together are the records of one fetch, each once, and the values that start with the
    prefix are cut to what follows it."""
    from consistent_stream.sources.kafka.log import KafkaLog, split_ranges
    topic = "fetch.parts"
    stack.create_topic(topic, 3)
    for p in range(3):
        stack.produce(topic, [b'{"s":1,"payload":{"n":%d}}' % i if i % 50 else None for i in range(400)],
                      partition=p)
    log = KafkaLog(stack.bootstrap)
    try:
        ranges = {(topic, p.partition): (p.low, p.high) for p in log.partitions(topic)}
        prefixes = {topic: b'{"s":1,"payload":'}
        whole = log.fetch(ranges, prefixes)
        assert whole.num_rows == 1200 and whole.column("cut").to_pylist().count(True) == 1200 - 24
        assert whole.column("value")[1].as_py() == b'{"n":1}' and whole.column("value")[0].as_py() is None
        parts = []
        for i, part in enumerate(split_ranges(ranges, 250)):
            parts.append(log.fetch(part, prefixes))
            if i == 1:
                assert log._stream is not None and log._carry   # went on, with records fetched ahead
                log.fetch({(topic, 2): (10, 12)})                # another range between two parts
        assert pa.concat_tables(parts).sort_by([("partition", "ascending"), ("offset", "ascending")]).equals(whole)
    finally:
        log.close()
