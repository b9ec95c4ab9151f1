"""Delta rules on the smallest change streams that show them; every version is checked
against batch evaluation in Spark and DuckDB."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from consistent_stream.job import run_job
from scenario import Scenario


def test_left_join_retracts_the_null_padded_row_when_the_first_match_arrives_and_restores_it(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2, 3], "seg": ["A", "B", None]}),
        "o": pa.table({"oid": [10, 11], "cid": pa.array([1, None], pa.int64()), "amt": [5.0, 2.0]}),
    }, {"c": ["id"], "o": ["oid"]})
    job = sc.job("select c.id, c.seg, o.oid, o.amt from src.c c left join src.o o on c.id = o.cid", ["id", "oid"])
    sc.run(job, full_refresh=True)
    sc.insert("o", pa.table({"oid": [12, 13], "cid": [2, 2], "amt": [1.0, 3.0]}))   # 2: 0 -> 2 matches
    sc.delete("o", "oid = 10")                                                      # 1: 1 -> 0 matches
    sc.run(job)
    sc.delete("o", "oid = 12")                                                      # 2: 2 -> 1
    sc.update("c", {"seg": "'Z'"}, "id = 3")                                        # padded row updated
    sc.insert("o", pa.table({"oid": [14], "cid": [4], "amt": [9.0]}))               # no customer yet
    sc.run(job)
    sc.insert("c", pa.table({"id": [4], "seg": ["D"]}))                             # match arrives on the left
    sc.run(job)


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_rebuild_joins_whole_relations_with_sqls_own_outer_join(spark, tmp_path, monkeypatch, where):
    """Without old rows on either side an outer join's rebuild is one SQL outer join: NULL
    keys, a key with several matches, a residual condition and rows of each side matching
    nothing come out as batch evaluation has them, and the state it leaves serves the delta
    rules after it."""
    from consistent_stream.operators import join
    calls = []
    whole = join._whole_outer
    monkeypatch.setattr(join, "_whole_outer", lambda *a: calls.append(a[0]) or whole(*a))
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2, 3, 5], "k": pa.array([1, 2, None, 5], pa.int64()), "seg": ["A", "B", None, "E"]}),
        "o": pa.table({"oid": [10, 11, 12, 13, 14], "cid": pa.array([1, None, 2, 2, 4], pa.int64()),
                       "amt": [5, 2, 1, 3, 9]}),
    }, {"c": ["id"], "o": ["oid"]})
    jobs = [sc.job(f"select c.id, c.seg, o.oid, o.amt from src.c c {kind} join src.o o on c.k = o.cid and o.amt < 8",
                   None, name=kind) for kind in ("left", "full")]
    for job in jobs:
        job.driver_rebuild_rows = 0 if where == "executors" else job.driver_rebuild_rows
        sc.run(job, full_refresh=True)
    assert calls == ["left", "full"]
    sc.insert("o", pa.table({"oid": [15], "cid": [5], "amt": [1]}))
    sc.delete("o", "oid = 10")
    for job in jobs:
        sc.run(job)
    assert calls == ["left", "full"]


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_join_reads_an_aggregates_output_from_the_aggregates_own_arrangement(spark, tmp_path, where):
    """A join side that is an aggregate's output, renamed, looked up by its group columns
    keeps no arrangement of its own: its old rows are the aggregate's accumulators at the
    keys, summed and finalized. Groups appear, change, vanish and come back (a NULL group
    never matches), on both sides of the join, rebuilt on the driver or by the executors."""
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2, 3, 4], "name": ["a", "b", "c", "d"]}),
        "o": pa.table({"oid": [10, 11, 12, 13, 14], "cid": pa.array([1, 1, 2, None, 9], pa.int64()),
                       "amt": pa.array([5, 7, 1, 3, 2], pa.int64())}),
    }, {"c": ["id"], "o": ["oid"]})
    job = sc.job("with t as (select cid, count(*) as n, sum(amt) as total, avg(amt) as mean from src.o group by cid) "
                 "select c.id, c.name, coalesce(t.n, 0) as n, t.total, t.mean "
                 "from src.c c left join t on c.id = t.cid", "id")
    job.driver_rebuild_rows = 0 if where == "executors" else job.driver_rebuild_rows
    sc.run(job, full_refresh=True)
    arrangements = sorted(p.name.split("=", 1)[1] for p in Path(job.state_root).glob("__arrangement=*"))
    assert len(arrangements) == 2 and any(a.endswith("_acc") for a in arrangements), arrangements
    sc.insert("o", pa.table({"oid": [15, 16], "cid": [3, 2], "amt": [4, 6]}))     # c: its first order
    sc.delete("o", "oid = 12")                                                  # b: 1 -> 1 order, other amount
    sc.update("c", {"name": "'z'"}, "id = 1")                                   # a renamed, its totals kept
    sc.run(job)
    sc.delete("o", "cid = 3")                                                   # c: its group vanishes
    sc.insert("c", pa.table({"id": [9], "name": ["i"]}))                       # the customer of group 9 arrives
    sc.run(job)
    sc.insert("o", pa.table({"oid": [17], "cid": [3], "amt": [8]}))             # c's group comes back
    sc.delete("c", "id = 2")
    sc.run(job)
    assert sorted(p.name.split("=", 1)[1] for p in Path(job.state_root).glob("__arrangement=*")) == arrangements


def test_an_aggregate_and_the_join_over_its_output_read_its_accumulators_once(spark, tmp_path, monkeypatch):
    """The aggregate reads its accumulators at its groups and at the keys the join's other
    side changed (read ahead), and the join takes the same rows: one read a batch, whichever
    side of the join the aggregate is on. The aggregate gets the rows of its own groups only
    (it would otherwise finalize the groups read ahead, to cancel them)."""
    from consistent_stream.exec.evaluator import _SharedRead
    from consistent_stream.state.arrangement import StateStore
    reads, stored, given = [], [], []
    read, shared_read = StateStore.read, _SharedRead.read

    def store_read(self, a, keys, null_safe=True):
        reads.append(a.name)
        if a.name.endswith("_acc"):
            stored.append(set(keys.arrow.column(0).to_pylist()))
        return read(self, a, keys, null_safe)

    def first_read(self, keys, null_safe=True):
        rows = shared_read(self, keys, null_safe)
        if not given:
            given.append(set(rows.arrow.column(keys.columns[0]).to_pylist()))
        return rows
    monkeypatch.setattr(StateStore, "read", store_read)
    monkeypatch.setattr(_SharedRead, "read", first_read)
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2, 3, 4], "name": ["a", "b", "c", "d"]}),
        "o": pa.table({"oid": [10, 11, 12, 13], "cid": [1, 1, 2, 4], "amt": [5, 7, 1, 3]}),
    }, {"c": ["id"], "o": ["oid"]})
    totals = "(select cid, count(*) as n, sum(amt) as total from src.o group by cid)"
    jobs = [sc.job(f"select c.id, c.name, t.n, t.total from src.c c left join {totals} t on c.id = t.cid", "id",
                   name="right"),
            sc.job(f"select c.id, c.name, t.n, t.total from {totals} t join src.c c on t.cid = c.id", "id",
                   name="left")]
    for job in jobs:
        sc.run(job, full_refresh=True)
    sc.insert("o", pa.table({"oid": [14, 15], "cid": [1, 3], "amt": [2, 4]}))   # groups 1 and 3
    sc.update("c", {"name": "'z'"}, "id in (2, 4)")                             # keys 2 and 4: not touched
    for job in jobs:
        reads.clear(), stored.clear(), given.clear()
        sc.run(job)
        assert len([r for r in reads if r.endswith("_acc")]) == 1, reads
        assert stored == [{1, 2, 3, 4}] and given == [{1}], (stored, given)   # (group 3 is new)


def test_a_rebuild_writes_an_inner_joins_sides_as_their_rows_come(spark, tmp_path):
    """A rebuild on the executors writes an inner join's side without consolidating it (its
    lookups take a Z-set): two lines of one order with the same price stay two rows of the
    side's base. The batches after it delete one of them, then the other, and add a third:
    the target follows, the side's base rows read as the Z-set they are."""
    import pyarrow.parquet as pq
    sc = Scenario(spark, tmp_path, {
        "o": pa.table({"ok": [1, 2], "cust": ["a", "b"]}),
        "l": pa.table({"lid": [10, 11, 12], "ok": [1, 1, 2], "price": [5, 5, 7]}),
    }, {"o": ["ok"], "l": ["lid"]})
    job = sc.job("select o.ok, o.cust, sum(l.price) as total, count(*) as n "
                 "from src.o o join src.l l on o.ok = l.ok group by o.ok, o.cust", ["ok"])
    job.driver_rebuild_rows = 0
    sc.run(job, full_refresh=True)
    side, = Path(job.state_root).glob("__arrangement=*_join_right")   # the lines' side: (l__ok, l__price)
    lines = pq.read_table([str(f) for f in side.rglob("*.parquet")]).to_pylist()
    assert sorted(r["__weight"] for r in lines if (r["l__ok"], r["l__price"]) == (1, 5)) == [1, 1], lines
    # the lines' side (numbers only) in Parquet's version 2 encodings, the orders' (a string) in plain ones
    orders, = Path(job.state_root).glob("__arrangement=*_join_left")

    def encodings(d):
        return {e for f in d.rglob("*.parquet") for e in pq.ParquetFile(f).metadata.row_group(0).column(0).encodings}
    assert "RLE_DICTIONARY" in encodings(side) and "PLAIN_DICTIONARY" not in encodings(side)
    assert encodings(orders) <= {"PLAIN", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED"}   # (version 1's)
    sc.delete("l", "lid = 10")
    sc.run(job)
    sc.delete("l", "lid = 11")
    sc.insert("l", pa.table({"lid": [13], "ok": [1], "price": [5]}))
    sc.run(job)



def test_state_files_of_numbers_are_delta_encoded_and_read_back_the_same(spark, tmp_path):
    """``write_spark(delta_encoded=True)``, as a rebuild writes an arrangement of numbers: a
    sorted key column too large for a dictionary is ``DELTA_BINARY_PACKED``, the file a
    fraction of the plain one's size, and pyarrow, DuckDB's keyed scan and Spark read the same
    rows from both. Which arrangements are written so: numbers, dates, booleans and decimals of
    at most 18 digits; a string or a wider decimal keeps plain values."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import DecimalType, LongType, StringType, StructField, StructType

    from consistent_stream.delta.files import write_spark
    from consistent_stream.duck import KeyedScan
    from consistent_stream.state.arrangement import _delta_encoded
    df = spark.range(0, 300_000, 1, 1).selectExpr("id * 3 as k", "cast(id % 7 as decimal(12, 2)) as v",
                                                  "1L as __weight")
    v2 = write_spark(df, str(tmp_path), "v2", delta_encoded=True)
    v1 = write_spark(df, str(tmp_path), "v1")
    paths = {name: [str(tmp_path / f.path) for f in files] for name, files in (("v2", v2), ("v1", v1))}
    assert "DELTA_BINARY_PACKED" in pq.ParquetFile(paths["v2"][0]).metadata.row_group(0).column(0).encodings
    assert sum(f.size for f in v2) * 4 < sum(f.size for f in v1)
    tables = {name: pq.read_table(p) for name, p in paths.items()}
    assert tables["v2"].equals(tables["v1"])
    keys = {"k": pa.array([0, 3, 4, 899_997], pa.int64())}
    scan = KeyedScan()
    try:
        got = {name: scan.scan(p, tables["v1"].schema, keys, None).to_pylist() for name, p in paths.items()}
    finally:
        scan.close()
    assert got["v2"] == got["v1"] and [r["k"] for r in got["v2"]] == [0, 3, 899_997]
    assert spark.read.parquet(*paths["v2"]).count() == 300_000

    def schema(*types):
        return StructType([StructField(f"c{i}", t) for i, t in enumerate(types)])
    assert _delta_encoded(schema(LongType(), DecimalType(18, 2)))
    assert not _delta_encoded(schema(LongType(), StringType()))
    assert not _delta_encoded(schema(LongType(), DecimalType(38, 2)))

def test_an_aggregates_output_joined_on_its_group_columns_in_another_order(spark, tmp_path):
    """Two group columns joined in the other order than grouped: the keys the join looks up
    are put in the arrangement's order."""
    sc = Scenario(spark, tmp_path, {
        "p": pa.table({"id": [1, 2, 3], "a": [1, 1, 2], "b": ["x", "y", "x"]}),
        "o": pa.table({"oid": [10, 11, 12, 13], "a": [1, 1, 2, 1], "b": ["x", "x", "x", "y"], "amt": [5, 7, 1, 3]}),
    }, {"p": ["id"], "o": ["oid"]})
    job = sc.job("with t as (select b, a, sum(amt) as total, count(*) as n from src.o group by a, b) "
                 "select p.id, t.total, t.n from src.p p join t on p.b = t.b and p.a = t.a", "id")
    sc.run(job, full_refresh=True)
    assert len(list(Path(job.state_root).glob("__arrangement=*"))) == 2
    sc.insert("o", pa.table({"oid": [14, 15], "a": [2, 1], "b": ["x", "y"], "amt": [4, 6]}))
    sc.insert("p", pa.table({"id": [4], "a": [1], "b": ["x"]}))
    sc.run(job)
    sc.delete("o", "a = 1 and b = 'x'")
    sc.update("p", {"b": "'y'"}, "id = 3")
    sc.run(job)


def test_aggregates_follow_deletes_min_max_recomputed_and_empty_groups_vanish(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {
        "t": pa.table({"k": [1, 2, 3, 4, 5], "g": ["a", "a", "b", None, "b"],
                       "x": pa.array([5, 9, None, 4, 1], pa.int64())}),
    }, {"t": ["k"]})
    job = sc.job("select g, count(*) n, count(x) nx, sum(x) s, avg(x) a, min(x) lo, max(x) hi "
                 "from src.t group by g having count(*) > 0", "g")
    sc.run(job, full_refresh=True)
    sc.delete("t", "k = 2")                       # max of group a retracted: recomputed from state
    sc.update("t", {"x": "0"}, "k = 5")           # min of b changes by update
    sc.run(job)
    sc.delete("t", "g = 'b'")                     # group b disappears
    sc.insert("t", pa.table({"k": [6], "g": [None], "x": pa.array([None], pa.int64())}))  # NULL group key
    sc.run(job)


def test_a_global_aggregate_keeps_one_row_with_sql_values_for_empty_input(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2], "x": [3.5, 4.0]})}, {"t": ["k"]})
    job = sc.job("select 1 as one, count(*) as n, sum(x) as s, max(x) as m from src.t", "one")
    sc.run(job, full_refresh=True)
    sc.delete("t", "k > 0")
    sc.run(job)
    sc.insert("t", pa.table({"k": [3], "x": [1.0]}))
    sc.run(job)


def test_transfers_never_change_the_total_balance(spark, tmp_path):
    """A SUM over accounts under transfers: every committed version shows the same total,
    because each transfer is one source commit and a cut never splits it."""
    sc = Scenario(spark, tmp_path, {"acct": pa.table({"id": list(range(10)), "bal": [100] * 10})}, {"acct": ["id"]})
    job = sc.job("select 1 as one, sum(bal) as total, count(*) as n from src.acct", "one")
    sc.run(job, full_refresh=True)
    from consistent_stream.delta import DeltaTableRef
    from deltalake import DeltaTable
    from helpers import delta_pandas
    for i in range(3):
        # one transfer = one MERGE commit updating two rows
        src = pa.table({"id": [i, 9 - i], "delta": [-7 * (i + 1), 7 * (i + 1)]})
        (DeltaTable(sc.path("acct")).merge(src, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update({"bal": "t.bal + s.delta"}).execute())
        sc.run(job)
    target = DeltaTableRef(job.target_path)
    for v in range(target.latest_version() + 1):
        assert delta_pandas(job.target_path, v)["total"].tolist() == [1000]


def test_distinct_and_union_follow_multiplicities(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {
        "a": pa.table({"id": [1, 2, 3], "v": ["x", "x", "y"]}),
        "b": pa.table({"id": [7], "v": ["y"]}),
    }, {"a": ["id"], "b": ["id"]})
    distinct = sc.job("select distinct v from src.a", "v", name="d")
    union = sc.job("select v from src.a union select v from src.b", "v", name="u")
    union_all = sc.job("select id, v from src.a where id > 1 union all select id + 100, v from src.b", "id", name="ua")
    for job in (distinct, union, union_all):
        sc.run(job, full_refresh=True)
    sc.delete("a", "id = 1")                          # x still there once: no change
    sc.insert("b", pa.table({"id": [8], "v": ["z"]}))
    for job in (distinct, union, union_all):
        sc.run(job)
    sc.delete("a", "v = 'y'")                         # y leaves DISTINCT, stays in UNION via b
    sc.update("a", {"v": "'w'"}, "id = 2")            # x leaves, w arrives
    for job in (distinct, union, union_all):
        sc.run(job)


def test_an_update_below_two_joins_retracts_its_old_rows_through_the_upper_join(spark, tmp_path):
    """Two-level join: changing an order's customer (an input of the first join) must retract
    the row that went through the second join (with the old customer's nation) and emit the
    new one; the target's Change Data Feed shows exactly that pair."""
    sc = Scenario(spark, tmp_path, {
        "o": pa.table({"oid": [1, 2, 3], "cid": [10, 10, 11], "amt": [5, 6, 7]}),
        "c": pa.table({"id": [10, 11, 12], "nid": [100, 101, 100]}),
        "n": pa.table({"id": [100, 101], "name": ["FR", "DE"]}),
    }, {"o": ["oid"], "c": ["id"], "n": ["id"]})
    job = sc.job("select o.oid, o.amt, c.id as cid, n.name from src.o o join src.c c on o.cid = c.id "
                 "join src.n n on c.nid = n.id", None)
    sc.run(job, full_refresh=True)
    sc.update("o", {"cid": "11"}, "oid = 1")          # FR -> DE through both joins
    sc.update("c", {"nid": "101"}, "id = 12")          # a customer without orders: no output change
    sc.run(job)
    from deltalake import DeltaTable
    target = DeltaTable(job.target_path)
    v = target.version()
    cdf = pa.table(target.load_cdf(starting_version=v, ending_version=v).read_all()).to_pylist()
    changes = sorted((r["_change_type"], r["oid"], r["cid"], r["name"]) for r in cdf)
    assert changes == [("update_postimage", 1, 11, "DE"), ("update_preimage", 1, 10, "FR")]
    sc.update("n", {"name": "'XX'"}, "id = 101")       # a change at the top join's input reaches 2 orders
    sc.delete("c", "id = 10")                          # order 2 loses its customer: retracted
    sc.run(job)


def test_the_same_changes_give_the_same_commits_whatever_the_shuffle_partitioning(spark, tmp_path):
    """Determinism: every version holds the same rows, and every commit makes the same changes
    (its Change Data Feed), with 2 or 7 shuffle partitions. (The order of files within a
    version is delta-rs' choice, and file names are random, so bytes are not compared.)"""
    results = []
    for parts in ("2", "7"):
        sc = Scenario(spark, tmp_path / parts, {
            "a": pa.table({"id": list(range(40)), "k": [i % 7 for i in range(40)], "x": list(range(40))}),
            "b": pa.table({"id": list(range(20)), "k": [i % 5 for i in range(20)]}),
        }, {"a": ["id"], "b": ["id"]})
        job = sc.job("select a.k, count(*) as n, sum(a.x) as s from src.a a join src.b b on a.k = b.k "
                     "group by a.k union all select k, id, x from src.a where id < 5", None)
        old = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", parts)
        try:
            sc.run(job, full_refresh=True)
            sc.delete("a", "id % 3 = 0")
            sc.insert("b", pa.table({"id": [50, 51], "k": [6, 1]}))
            sc.run(job)
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", old)
        from deltalake import DeltaTable
        dt = DeltaTable(job.target_path)
        key = lambda r: tuple((c, str(v)) for c, v in sorted(r.items()))  # noqa: E731
        versions = [sorted(pa.table(DeltaTable(job.target_path, version=v).to_pyarrow_table()).to_pylist(), key=key)
                    for v in range(dt.version() + 1)]
        cdf = pa.table(dt.load_cdf(starting_version=0).read_all()).drop_columns(["_commit_timestamp"])
        results.append((versions, sorted(cdf.to_pylist(), key=key)))
    assert results[0] == results[1]


def test_a_change_data_feed_whose_update_lost_its_postimages_is_refused(spark, tmp_path):
    """delta-rs 1.6.6 writes no update_postimage for a row updated to equal another row of a
    table without a key; the changelog would silently drop it, so the batch fails instead."""
    import pytest

    from consistent_stream.errors import SourceError
    sc = Scenario(spark, tmp_path, {"c": pa.table({"k": [1, 2], "z": ["a", "u"]})}, {"c": []})
    job = sc.job("select k, z from src.c", None)
    sc.run(job, full_refresh=True)
    sc.update("c", {"k": "2", "z": "'u'"}, "k = 1")
    with pytest.raises(SourceError, match="update_preimage rows but 0 update_postimage"):
        run_job(spark, job)
    sc.run(job, full_refresh=True)  # from the snapshot: exact again


def test_min_and_max_follow_an_update_that_changes_no_count(spark, tmp_path):
    """An update inside a group moves no accumulator of a MIN/MAX-only aggregate, only its
    value multiset: the group is still touched, and its extremes move."""
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2, 3], "g": ["a", "a", "b"], "x": [5, 9, 4]})},
                  {"t": ["k"]})
    job = sc.job("select g, min(x) as lo, max(x) as hi from src.t group by g", "g")
    sc.run(job, full_refresh=True)
    sc.update("t", {"x": "20"}, "k = 1")   # a: max 9 -> 20, min 5 -> 9
    sc.run(job)
    sc.update("t", {"x": "1"}, "k = 3")    # b: 4 -> 1
    sc.run(job)


def test_a_rule_that_reads_two_arrangements_scans_them_at_once(spark, tmp_path, monkeypatch):
    """A join whose two sides both change reads each side's old rows at the other's keys, and
    an aggregate with MIN and MAX reads its accumulators and its value multiset at the same
    groups: the second read of each is started before the first (``prefetch``) and scanned on
    another thread with its own DuckDB cursor, and its rows are the read's. Every version
    equals batch evaluation."""
    import threading

    from consistent_stream.state.arrangement import StateStore
    scans: list[tuple[str, bool]] = []
    read_local = StateStore._read_local

    def recorded(self, arrangement, files, keys, limit=None, scan=None):
        scans.append((arrangement.name, threading.current_thread() is threading.main_thread()))
        return read_local(self, arrangement, files, keys, limit, scan)
    monkeypatch.setattr(StateStore, "_read_local", recorded)
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2, 3], "seg": ["a", "b", "a"]}),
        "o": pa.table({"oid": [10, 11, 12, 13], "cid": [1, 1, 2, 3], "amt": [5, 7, 1, 3]}),
    }, {"c": ["id"], "o": ["oid"]})
    job = sc.job("select c.seg, count(*) as n, min(o.amt) as lo, max(o.amt) as hi "
                 "from src.o o join src.c c on o.cid = c.id group by c.seg", "seg")
    sc.run(job, full_refresh=True)
    sc.insert("o", pa.table({"oid": [14], "cid": [2], "amt": [9]}))   # the orders side: customer 2's rows read
    sc.update("c", {"seg": "'b'"}, "id = 3")                          # the customers side: order 13 read
    sc.delete("o", "oid = 10")                                        # segment a's MIN: its multiset read
    scans.clear()
    sc.run(job)
    joined = [(name, main) for name, main in scans if "_join_" in name]
    grouped = [(name, main) for name, main in scans if "_aggregate_" in name]
    assert len({n for n, _ in joined}) == 2 and sorted(m for _, m in joined) == [False, True], scans
    assert len({n for n, _ in grouped}) == 2 and sorted(m for _, m in grouped) == [False, True], scans


def test_a_join_over_an_aggregates_output_reads_its_other_side_beside_the_aggregates_read(spark, tmp_path,
                                                                                          monkeypatch):
    """Customers left joined to their order totals (an aggregate's output, looked up through its
    accumulators): the totals change at the groups the orders' change touches, so the
    customers' old rows are read at those groups while the aggregate reads its accumulators
    there, on another thread, and the join's read at the groups whose totals changed takes
    them. Every version equals batch evaluation."""
    import threading

    from consistent_stream.state.arrangement import StateStore
    scans: list[tuple[str, bool]] = []   # (what, on the main thread), in the order they began
    read_local, prefetch = StateStore._read_local, StateStore.prefetch

    def recorded(self, arrangement, files, keys, limit=None, scan=None):
        scans.append((arrangement.name, threading.current_thread() is threading.main_thread()))
        return read_local(self, arrangement, files, keys, limit, scan)

    def started(self, arrangement, keys, null_safe=True):
        scans.append((f"prefetch {arrangement.name}", True))
        return prefetch(self, arrangement, keys, null_safe)
    monkeypatch.setattr(StateStore, "_read_local", recorded)
    monkeypatch.setattr(StateStore, "prefetch", started)
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2, 3, 4], "name": ["a", "b", "c", "d"]}),
        "o": pa.table({"oid": [10, 11, 12, 13], "cid": [1, 1, 2, 3], "amt": [5, 7, 1, 3]}),
    }, {"c": ["id"], "o": ["oid"]})
    job = sc.job("with t as (select cid, count(*) as n, sum(amt) as total from src.o group by cid) "
                 "select c.id, c.name, coalesce(t.n, 0) as n, coalesce(t.total, 0) as total "
                 "from src.c c left join t on c.id = t.cid", "id")
    sc.run(job, full_refresh=True)
    sc.insert("o", pa.table({"oid": [14, 15], "cid": [2, 4], "amt": [9, 2]}))   # customer 4's first order
    sc.delete("o", "oid = 13")                                                   # customer 3's last
    scans.clear()
    sc.run(job)
    acc = [i for i, (n, _) in enumerate(scans) if n.endswith("_aggregate_acc")]
    customers = [i for i, (n, _) in enumerate(scans) if n.startswith("prefetch") and "_join_" in n]
    assert len(acc) == 1 and scans[acc[0]][1] and customers and customers[0] < acc[0], scans
    assert [m for n, m in scans if "_join_" in n and not n.startswith("prefetch")] == [False], scans
    sc.update("c", {"name": "'bb'"}, "id = 2")   # both sides change (the totals read at customer 2 too)
    sc.insert("o", pa.table({"oid": [16], "cid": [1], "amt": [4]}))
    sc.run(job)
