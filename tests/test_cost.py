"""What a batch costs follows its change: state read by key, no work for no change, backlogs
split into bounded batches, large changes recomputed; and every version still equals batch
evaluation at its cut."""
from __future__ import annotations

import decimal
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from consistent_stream import settings
from consistent_stream.changelog import arrow_to_spark
from consistent_stream.delta import DeltaTableRef, Txn
from consistent_stream.delta.log import OwnedLog
from consistent_stream.errors import CommitError, UniqueKeyViolation
from consistent_stream.job import run_job
from consistent_stream.oracle import batch_dataframe
from consistent_stream.runtime import BatchMeta
from consistent_stream.sink.target import commit_rebuild
from consistent_stream.sources import Cut
from consistent_stream.state import arrangement
from consistent_stream.state.arrangement import CompactionPolicy
from helpers import assert_same_rows, delta_pandas
from scenario import Scenario


def test_arrow_tables_with_empty_batches_reach_spark_whole(spark):
    """pyspark 4.2.1's createDataFrame(pyarrow.Table) drops every batch after an empty one;
    arrow_to_spark, which every driver-side change goes through, keeps them all."""
    batches = [pa.record_batch({"x": pa.array(list(range(n)), pa.int64())}) for n in (1, 0, 1, 0, 3)]
    table = pa.Table.from_batches(batches)
    assert arrow_to_spark(spark, table).count() == 5


def _versions_equal_batch_evaluation(spark, job):
    """Every consistent_stream version of the target equals batch evaluation at its cut."""
    target = DeltaTableRef(job.target_path)
    checked = 0
    for c in target.history():
        if "cut" not in c.metadata:
            continue
        cut = Cut.from_json(c.metadata["cut"])
        assert_same_rows(delta_pandas(job.target_path, c.version),
                         batch_dataframe(spark, job.sql, job.sources, cut).toPandas(), f"version {c.version}")
        checked += 1
    return checked


def test_a_change_at_one_key_reads_a_small_fraction_of_the_state(spark, tmp_path):
    n = 3000
    sc = Scenario(spark, tmp_path, {
        "a": pa.table({"id": list(range(n)), "k": list(range(n)), "x": [i % 17 for i in range(n)]}),
        "b": pa.table({"k": list(range(n)), "name": [f"n{i}" for i in range(n)]}),
    }, {"a": ["id"], "b": ["k"]})
    job = sc.job("select a.id, a.x, b.name from src.a a join src.b b on a.k = b.k", "id")
    job.state_file_rows = 200  # the arrangements are 15 files of at most 200 keys
    sc.run(job, full_refresh=True)
    sc.update("b", {"name": "'changed'"}, "k = 1234")
    summary = sc.run(job)
    m = summary["metrics"][0]
    assert m["strategy"] == "incremental"
    # the join reads a's arrangement at key 1234 only: one base file of 200 of its 3000 rows
    assert 0 < m["state_rows_read"] <= 400, m
    assert summary["rows_written"] == 1


def test_a_change_read_from_the_log_is_grouped_once(spark, tmp_path, monkeypatch):
    """The Delta log's reader consolidates the change it derives (an update of a column the
    model does not read cancels there), with the changelog's consolidation; the changelog
    takes the change as consolidated and does not group its rows a second time: one grouping
    a run. The change still cancels to nothing: the run writes no row."""
    from consistent_stream import changelog
    from consistent_stream.delta import log_changes
    calls = {"log": 0, "changelog": 0}

    def counted(name, f):
        def wrapped(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return wrapped
    n = 200
    sc = Scenario(spark, tmp_path, {"a": pa.table({"id": list(range(n)), "g": [i % 5 for i in range(n)],
                                                  "x": list(range(n))})}, {"a": ["id"]})
    job = sc.job("select g, count(*) as n from src.a group by g", "g")
    sc.run(job, full_refresh=True)
    monkeypatch.setattr(log_changes, "consolidate", counted("log", log_changes.consolidate))
    monkeypatch.setattr(changelog, "consolidate_arrow", counted("changelog", changelog.consolidate_arrow))
    sc.update("a", {"x": "x + 1"}, "id < 50")   # a column the model does not read
    summary = sc.run(job)
    assert calls == {"log": 1, "changelog": 1}, calls
    assert summary["rows_written"] == 0, summary
    sc.update("a", {"g": "g + 1"}, "id < 50")
    summary = sc.run(job)
    assert calls == {"log": 2, "changelog": 2}, calls
    assert summary["rows_written"] > 0, summary
    assert _versions_equal_batch_evaluation(spark, job) == 3


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_small_first_build_runs_on_the_driver_and_writes_what_the_executors_write(spark, tmp_path, where):
    """Sources of at most ``driver_rebuild_rows`` rows are rebuilt on the driver: their
    snapshots go through the delta rules over empty state, in a few Spark jobs, not one or
    more per arrangement. Either way the state is base files of at most ``state_file_rows``
    rows (so the next batch reads by key) and the target equals batch evaluation, bag or keyed."""
    n = 3000
    sc = Scenario(spark, tmp_path, {
        "a": pa.table({"id": list(range(n)), "k": [i % 1000 for i in range(n)], "x": [i % 17 for i in range(n)]}),
        "b": pa.table({"k": list(range(1000)), "name": [f"n{i % 7}" for i in range(1000)]}),
    }, {"a": ["id"], "b": ["k"]})
    keyed = sc.job("select b.name, count(*) as n, sum(a.x) as s, max(a.x) as hi "
                   "from src.a a join src.b b on a.k = b.k group by b.name", "name", name="keyed")
    bag = sc.job("select a.x, b.name from src.a a join src.b b on a.k = b.k where a.x < 3", None, name="bag")
    for job in (keyed, bag):
        job.state_file_rows = 200
        job.driver_rebuild_rows = 0 if where == "executors" else job.driver_rebuild_rows
        m = sc.run(job, full_refresh=True)["metrics"][0]
        assert m["strategy"] == "recompute" and ("on the driver" in m["reason"]) == (where == "driver"), m
        if where == "driver":
            assert m["spark_jobs"] <= 2, m
        state = pa.table(DeltaTable(job.state_root).get_add_actions(flatten=True)).to_pylist()
        assert state and max(f["num_records"] for f in state) <= 200
        assert all("/base-" in f["path"] for f in state), [f["path"] for f in state]
    sc.update("b", {"name": "'changed'"}, "k = 123")
    for job in (keyed, bag):
        m = sc.run(job)["metrics"][0]
        assert m["strategy"] == "incremental" and m["state_rows_read"] <= 1000, m


def test_a_rebuild_reads_an_aggregates_input_once_for_its_sums_and_its_extremes(spark, tmp_path, monkeypatch):
    """MIN and MAX keep each group's values, an arrangement beside the sums': a rebuild on the
    executors feeds both from one pass over the snapshot, grouped by the group and the value,
    so what it writes between them is (group, value) pairs (500 here), not the input's rows
    (3,000: more than the driver takes, so counted as a change on the executors); the batches
    after it equal batch evaluation."""
    monkeypatch.setattr(settings, "MAX_DRIVER_ROWS", 1000)
    n = 3000
    sc = Scenario(spark, tmp_path, {
        "a": pa.table({"id": list(range(n)), "g": [i % 10 for i in range(n)], "d": [i % 50 for i in range(n)],
                       "x": [i % 17 for i in range(n)]}),
    }, {"a": ["id"]})
    job = sc.job("select g, count(*) as n, sum(x) as s, avg(x) as av, min(d) as lo, max(d) as hi "
                 "from src.a group by g", "g", name="extremes")
    job.driver_rebuild_rows = 0
    m = sc.run(job, full_refresh=True)["metrics"][0]
    assert m["strategy"] == "recompute" and "on the driver" not in m["reason"], m
    assert m["changes_on_executors"] == 0, m
    sc.update("a", {"d": "d + 100"}, "id = 7")
    sc.update("a", {"d": "d - 100", "x": "x + 1"}, "id = 1234")
    assert sc.run(job)["metrics"][0]["strategy"] == "incremental"
    _versions_equal_batch_evaluation(spark, job)


@pytest.mark.parametrize("kept", ["every customer column", "not the key"])
def test_a_rebuilds_left_join_over_an_aggregates_output_is_not_aggregated_again(spark, tmp_path, monkeypatch, kept):
    """customer_order_totals' shape rebuilt on the executors: the orders' accumulators (one row
    per customer, a GROUP BY's) and the customers (a snapshot's rows, every weight +1) are
    written as they come, and SQL's left outer join of the two, whose weights are all
    positive, is written to the target without a consolidation, whether its projection keeps
    the customer key (the rows are distinct) or not (a row's copies are written as copies).
    The join takes the accumulators as the order totals, one row per customer, without
    summing them per customer again. Every version equals batch evaluation."""
    from consistent_stream import runtime
    from consistent_stream.state.arrangement import StateStore
    written, stored, plans = [], {}, []
    rebuild, commit = StateStore.rebuild, runtime.commit_rebuild

    def recorded_rebuild(self, a, sql, **kw):
        stored[a.name] = kw.get("consolidated", False) or not kw.get("consolidate", True)
        return rebuild(self, a, sql, **kw)

    def recorded_commit(*args, **kw):
        written.append(kw["consolidated"] or kw["positive"])
        plans.append(args[1]._jdf.queryExecution().executedPlan().toString())
        return commit(*args, **kw)
    monkeypatch.setattr(StateStore, "rebuild", recorded_rebuild)
    monkeypatch.setattr(runtime, "commit_rebuild", recorded_commit)
    n = 400
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"ck": list(range(n)), "name": [f"c{i % 7}" for i in range(n)]}),
        "o": pa.table({"ok": list(range(3 * n)), "ck": [i % (n - 50) for i in range(3 * n)],
                       "price": pa.array([decimal.Decimal(i % 13) / 4 for i in range(3 * n)], pa.decimal128(12, 2))}),
    }, {"c": ["ck"], "o": ["ok"]})
    totals = "(select ck, count(*) as cnt, sum(price) as total from src.o group by ck) t on c.ck = t.ck"
    if kept == "every customer column":
        job = sc.job(f"select c.ck, c.name, coalesce(t.cnt, 0) as cnt, coalesce(t.total, 0) as total "
                     f"from src.c c left join {totals}", "ck", name="totals")
    else:
        job = sc.job(f"select c.name, coalesce(t.cnt, 0) as cnt from src.c c left join {totals}", None,
                     name="by_name")
    job.driver_rebuild_rows = 0
    m = sc.run(job, full_refresh=True)["metrics"][0]
    assert m["strategy"] == "recompute" and "on the driver" not in m["reason"], m
    # (arrangement -> written as the rows come)
    assert sorted(v for k, v in stored.items() if k.endswith(("_acc", "_left"))) == [True, True], stored
    assert written == [True], written
    # the join reads the accumulators back as the output rows, one per group: no sum again
    assert len(plans) == 1 and "HashAggregate" not in plans[0], plans
    sc.update("o", {"ck": "ck + 1"}, "ok < 20")
    sc.delete("c", "ck = 3")
    assert sc.run(job)["metrics"][0]["strategy"] == "incremental"
    assert _versions_equal_batch_evaluation(spark, job) == 2


def test_a_rebuilds_outer_join_over_a_semi_join_consolidates_the_semi_joins_retractions(spark, tmp_path):
    """A rebuild takes an outer join's sides as their rows come only when their weights are
    known positive: a semi join's rebuild is its left rows less their unmatched ones (a row's
    +1 and -1 until consolidated), so its rows are consolidated before SQL's outer join, which
    would otherwise find the cancelled row a match (an ``a`` row of k 20 here) and not pad the
    customer row it should."""
    sc = Scenario(spark, tmp_path, {
        "a": pa.table({"id": [1, 2, 3, 4], "k": [10, 10, 20, 30], "x": [1, 5, 1, 1]}),
        "b": pa.table({"id": [1, 2], "k": [10, 20], "y": [3, 0]}),
        "c": pa.table({"k": [10, 20, 30, 40], "z": ["p", "q", "r", "s"]}),
    }, {"a": ["id"], "b": ["id"], "c": ["k"]})
    job = sc.job("select c.k, c.z, s.id from src.c c left join (select a.id, a.k from src.a a where exists "
                 "(select 1 from src.b b where b.k = a.k and b.y >= a.x)) s on c.k = s.k", None)
    job.driver_rebuild_rows = 0
    m = sc.run(job, full_refresh=True)["metrics"][0]
    assert m["strategy"] == "recompute" and "on the driver" not in m["reason"], m
    rows = sorted((r["k"], r["id"]) for r in DeltaTable(job.target_path).to_pyarrow_table().to_pylist())
    assert rows == [(10, 1), (20, None), (30, None), (40, None)], rows
    sc.update("b", {"y": "5"}, "k = 20")
    assert sc.run(job)["metrics"][0]["strategy"] == "incremental"
    assert _versions_equal_batch_evaluation(spark, job) == 2


def test_a_change_too_large_for_the_driver_is_written_by_the_executors(spark, tmp_path, monkeypatch):
    """A rebuild on the driver reads no state, so nothing bounded its intermediate results:
    a join on a key with many rows on both sides (here 60,000 rows from 3,200 source rows)
    is stopped at ``MAX_DRIVER_ROWS`` rows by the local engine and written by the executors
    instead; an aggregate over the same join stays on the driver. Both targets equal batch
    evaluation, then after an incremental batch whose change blows up the same way."""
    monkeypatch.setattr(settings, "MAX_DRIVER_ROWS", 5000)
    sc = Scenario(spark, tmp_path, {
        "a": pa.table({"id": list(range(3000)), "k": [i % 10 for i in range(3000)]}),
        "b": pa.table({"j": list(range(200)), "k": [i % 10 for i in range(200)],
                       "name": [f"n{i % 3}" for i in range(200)]}),
    }, {"a": ["id"], "b": ["j"]})
    pairs = sc.job("select a.id, b.name from src.a a join src.b b on a.k = b.k", None, name="pairs")
    counts = sc.job("select b.name, count(*) as n from src.a a join src.b b on a.k = b.k group by b.name",
                    "name", name="counts")
    m = sc.run(pairs, full_refresh=True)["metrics"][0]
    assert "on the driver" in m["reason"] and m["changes_on_executors"] >= 1, m
    m = sc.run(counts, full_refresh=True)["metrics"][0]
    assert "on the driver" in m["reason"] and m["changes_on_executors"] == 0, m
    # 300 rows of a with k = 3 meet 20 new rows of b: 6,000 output rows, still exact
    sc.insert("b", pa.table({"j": list(range(200, 220)), "k": [3] * 20, "name": [f"new{i}" for i in range(20)]}))
    m = sc.run(pairs)["metrics"][0]
    assert m["strategy"] == "incremental" and m["changes_on_executors"] >= 1, m
    m = sc.run(counts)["metrics"][0]
    assert m["strategy"] == "incremental" and m["changes_on_executors"] == 0, m


def test_a_bag_counts_the_copies_of_its_retracted_rows_without_a_spark_job(spark, tmp_path):
    """A bag target has no key to look a retracted row up by: the driver's DuckDB scans its
    files for rows equal to one (NULLs equal), no Spark job. A floating point column, whose
    equality the engines may not share, is still looked up with Spark. Both stay exact."""
    n = 3000
    sc = Scenario(spark, tmp_path, {"t": pa.table({
        "id": list(range(n)), "g": [i % 10 for i in range(n)],
        "v": pa.array([None if i % 11 == 0 else i % 7 for i in range(n)], pa.int64()),
        "x": [float(i % 5) for i in range(n)]})}, {"t": ["id"]})
    ints = sc.job("select g, v from src.t", None, name="ints")
    floats = sc.job("select g, x from src.t", None, name="floats")
    for job in (ints, floats):
        sc.run(job, full_refresh=True)
    sc.delete("t", "id in (3, 10, 17, 22, 33)")   # (3, 3), (0, 3), (7, 3), (2, NULL), (3, NULL): many copies each
    m = sc.run(ints)["metrics"][0]
    assert m["strategy"] == "incremental" and m["spark_jobs"] == 0, m
    m = sc.run(floats)["metrics"][0]
    assert m["strategy"] == "incremental" and m["spark_jobs"] >= 1, m


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_rebuild_that_breaks_the_unique_key_commits_nothing(spark, tmp_path, where):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"id": [1, 2, 3], "g": ["a", "a", "b"], "h": [1, 2, 3]})},
                  {"t": ["id"]})
    job = sc.job("select g, h from src.t", "g")
    job.driver_rebuild_rows = 0 if where == "executors" else job.driver_rebuild_rows
    with pytest.raises(UniqueKeyViolation, match=r"model m: unique_key \['g'\] is not unique: key \{'g': 'a'\} "
                                                 r"has 2 rows in the output"):
        run_job(spark, job, full_refresh=True)
    assert not DeltaTableRef(job.target_path).exists()


@pytest.mark.parametrize("key", [["g"], None])
def test_a_rebuild_with_a_retraction_fails_its_write_and_commits_nothing(spark, tmp_path, key):
    """A rebuild's rows all have positive weights (a retraction there is a delta rule's bug):
    the check runs inside the write's job, keyed or bag, whose failure commits nothing."""
    rows = spark.createDataFrame([("a", 1, 1), ("b", 2, -1), ("c", 3, 2 if key is None else 1)],
                                 "g string, h long, __weight long")
    target = DeltaTableRef(str(tmp_path / "t"))
    with pytest.raises(CommitError, match=r"model m: the rebuild produced retractions; this is a bug"):
        commit_rebuild(target, rows, unique_key=key, partition_by=[], file_rows=100, txn=Txn("q", 1), metadata={},
                       model="m")
    assert not target.exists()
    ok = rows.where("__weight > 0")
    commit_rebuild(target, ok, unique_key=key, partition_by=[], file_rows=100, txn=Txn("q", 1), metadata={},
                   model="m")
    assert sorted(delta_pandas(target.path)["g"]) == (["a", "c"] if key else ["a", "c", "c"])


@pytest.mark.parametrize("key", [["g"], None])
def test_a_rebuilds_rows_not_yet_consolidated_are_summed_by_its_write(spark, tmp_path, key):
    """A rebuild's view whose rows are not known to be distinct (a join's output) is handed to
    the write unconsolidated: equal rows' weights are summed there (within the key's ranges,
    keyed; first, a bag), rows that cancel are not written and the checks see the sums."""
    rows = spark.createDataFrame([("a", 1, 1), ("b", 2, 1), ("b", 2, -1), ("c", 3, 1),
                                  ("c", 3, 1 if key is None else 0), ("d", 4, 2), ("d", 4, -1)],
                                 "g string, h long, __weight long")
    target = DeltaTableRef(str(tmp_path / "t"))
    commit_rebuild(target, rows, unique_key=key, partition_by=[], file_rows=100, txn=Txn("q", 1), metadata={},
                   model="m", consolidated=False)
    assert sorted(delta_pandas(target.path)["g"]) == (["a", "c", "d"] if key else ["a", "c", "c", "d"])
    twice = spark.createDataFrame([("a", 1, 1), ("a", 1, 1)], "g string, h long, __weight long")
    with pytest.raises(UniqueKeyViolation, match=r"key \{'g': 'a'\} has 2 rows in the output"):
        commit_rebuild(target, twice, unique_key=["g"], partition_by=[], file_rows=100, txn=Txn("q", 2),
                       metadata={}, model="m", consolidated=False)
    assert sorted(delta_pandas(target.path)["g"]) == (["a", "c", "d"] if key else ["a", "c", "c", "d"])


@pytest.mark.parametrize("bounds", [[20, 50], None])
def test_a_keyed_rebuild_is_sorted_once_by_its_write_into_files_sorted_by_the_key(spark, tmp_path, monkeypatch,
                                                                                   bounds):
    """The executors' write of a keyed rebuild sorts its rows once: the unique key's check (a
    window over the key's ranges) sorts each range by the key, the order the files need, so no
    second sort follows the check; every file holds its rows in key order."""
    from consistent_stream.delta import files as delta_files
    plans = []
    write = delta_files.write_spark

    def watched(df, *a, **kw):
        plans.append(df._jdf.queryExecution().executedPlan().toString())
        return write(df, *a, **kw)

    monkeypatch.setattr(delta_files, "write_spark", watched)
    rows = spark.range(0, 100, 1, 4).selectExpr("(id * 37) % 100 AS k", "id AS v", "CAST(1 AS BIGINT) AS __weight")
    target = DeltaTableRef(str(tmp_path / "t"))
    commit_rebuild(target, rows, unique_key=["k"], partition_by=[], file_rows=10, txn=Txn("q", 1), metadata={},
                   model="m", consolidated=False, key_bounds=bounds)
    assert len(plans) == 1 and plans[0].count("Sort [") == 1, plans
    dt = DeltaTable(target.path)
    keys = []
    for path in dt.file_uris():
        ks = pa.parquet.read_table(path).column("k").to_pylist()
        assert ks == sorted(ks), (path, ks)
        keys += ks
    assert sorted(keys) == list(range(100))


def test_a_run_without_source_changes_runs_no_spark_job_and_commits_nothing(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2, 2], "v": [10, 20, 30]}),
                                    "u": pa.table({"k": [1, 2], "w": ["a", "b"]})}, {"t": [], "u": ["k"]})
    job = sc.job("select t.k, u.w, sum(t.v) as s from src.t t join src.u u on t.k = u.k group by t.k, u.w", "k")
    sc.run(job, full_refresh=True)
    version = DeltaTableRef(job.target_path).latest_version()
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    summary = run_job(spark, job)
    assert summary["up_to_date"] and summary["batches"] == 0
    assert summary["freshness_s"] is not None
    assert set(tracker.getJobIdsForGroup(None)) == before, "a no-op run ran Spark jobs"
    assert DeltaTableRef(job.target_path).latest_version() == version
    sc.insert("t", pa.table({"k": [1], "v": [5]}))  # and the next change is picked up
    assert sc.run(job)["batches"] == 1


def _orders_per_segment(spark, tmp_path):
    """Orders ``o`` (id, c, amt) joined with customers ``c`` (c, seg), summed per segment:
    the scenario and its job."""
    sc = Scenario(spark, tmp_path, {"o": pa.table({"id": [0], "c": [0], "amt": [1]}),
                                    "c": pa.table({"c": [0, 1, 2], "seg": ["x", "y", "z"]})},
                  {"o": ["id"], "c": ["c"]})
    job = sc.job("select c.seg, count(*) as n, sum(o.amt) as total from src.o o join src.c c on o.c = c.c "
                 "group by c.seg", "seg")
    return sc, job


def test_a_backlog_is_split_into_batches_of_at_most_max_batch_rows_each_at_a_consistent_cut(spark, tmp_path):
    sc, job = _orders_per_segment(spark, tmp_path)
    job.max_batch_rows = 70
    job.recompute_threshold = 1000.0  # keep the backlog incremental
    sc.run(job, full_refresh=True)
    for i in range(10):  # 10 commits of 30 rows on o, and two on c between them
        sc.insert("o", pa.table({"id": list(range(1 + 30 * i, 31 + 30 * i)), "c": [j % 3 for j in range(30)],
                                 "amt": list(range(30))}))
        if i in (3, 7):
            sc.update("c", {"seg": f"'s{i}'"}, f"c = {i % 3}")
    summary = sc.run(job)
    assert summary["batches"] >= 5, summary
    assert all(m["changes_read"] <= 70 for m in summary["metrics"]), summary["metrics"]
    assert summary["cut"] == {k: DeltaTableRef(s.location).latest_version() for k, s in
                              ((s.key, s) for s in job.sources)}
    assert _versions_equal_batch_evaluation(spark, job) == 1 + summary["batches"]


def test_a_run_keeps_no_per_batch_files_in_its_checkpoint(spark, tmp_path):
    """What a query's checkpoint holds does not grow with its batches: its record, the
    definition, the plan and the state table; where a run goes on from is in the commits."""
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2], "v": [5, 6]})}, {"t": ["k"]})
    job = sc.job("select k, sum(v) as s from src.t group by k", "k")
    sc.run(job, full_refresh=True)
    for i in range(3):
        sc.insert("t", pa.table({"k": [3 + i], "v": [7]}))
        assert sc.run(job)["batches"] == 1
    assert sorted(os.listdir(job.checkpoint_location)) == ["_consistent_stream", "state"]
    assert sorted(os.listdir(os.path.join(job.checkpoint_location, "_consistent_stream"))) == \
        ["fingerprint", "job.json", "local_sql.json", "plan.json", "query.json"]


def test_a_backlog_is_worked_off_one_planned_cut_per_batch(spark, tmp_path):
    """A backlog of four commits of 10 rows with max_batch_rows 10: four batches, each ending
    at the next commit, each a version equal to batch evaluation at its cut."""
    sc = Scenario(spark, tmp_path, {"o": pa.table({"id": [0], "amt": [1]})}, {"o": ["id"]})
    job = sc.job("select count(*) as n, sum(amt) as total from src.o", None)
    job.max_batch_rows = 10
    job.recompute_threshold = 1000.0
    sc.run(job, full_refresh=True)
    first = DeltaTableRef(sc.path("o")).latest_version()
    for i in range(4):
        sc.insert("o", pa.table({"id": list(range(1 + 10 * i, 11 + 10 * i)), "amt": list(range(10))}))
    summary = sc.run(job)
    assert summary["batches"] == 4, summary
    assert [m["batch_id"] for m in summary["metrics"]] == [1, 2, 3, 4]
    assert _versions_equal_batch_evaluation(spark, job) == 5
    cuts = [BatchMeta.from_commit(c).cut["src.o"] for c in DeltaTableRef(job.target_path).history(4)]
    assert cuts == [first + 4, first + 3, first + 2, first + 1]


def test_a_backlog_s_commits_are_read_once_per_run_not_once_per_batch(spark, tmp_path, monkeypatch):
    """Planning one cut at a time must not re-read the backlog for every batch (quadratic:
    a 410,000-event pgbench backlog in 9 batches spent more time planning than processing)."""
    from consistent_stream.sources import backlog
    sc = Scenario(spark, tmp_path, {"o": pa.table({"id": [0], "amt": [1]})}, {"o": ["id"]})
    job = sc.job("select count(*) as n, sum(amt) as total from src.o", None)
    job.max_batch_rows = 10
    job.recompute_threshold = 1000.0
    sc.run(job, full_refresh=True)
    for i in range(5):
        sc.insert("o", pa.table({"id": list(range(1 + 10 * i, 11 + 10 * i)), "amt": list(range(10))}))
    plans = []
    plan_cuts = backlog.plan_cuts

    def counted(sources, start, end, **kw):
        cuts = plan_cuts(sources, start, end, **kw)
        plans.append(len(cuts))
        return cuts
    monkeypatch.setattr(backlog, "plan_cuts", counted)
    summary = sc.run(job)
    assert summary["batches"] == 5 and plans == [5], (summary, plans)
    assert _versions_equal_batch_evaluation(spark, job) == 1 + summary["batches"]


def test_a_change_larger_than_recompute_threshold_is_recomputed_from_snapshots(spark, tmp_path, caplog):
    """...in one version, max_batch_rows notwithstanding: the run log warns, naming the
    threshold that would split it."""
    sc = Scenario(spark, tmp_path, {"t": pa.table({"id": list(range(100)), "g": [i % 4 for i in range(100)],
                                                   "v": list(range(100))})}, {"t": ["id"]})
    job = sc.job("select g, count(*) as n, min(v) as lo, max(v) as hi from src.t group by g", "g")
    job.max_batch_rows = 500
    sc.run(job, full_refresh=True)
    for i in range(2):
        sc.insert("t", pa.table({"id": list(range(100 + 550 * i, 650 + 550 * i)), "g": [i % 5 for i in range(550)],
                                 "v": list(range(550))}))
    with caplog.at_level("WARNING", logger="consistent_stream.sources.backlog"):
        summary = sc.run(job)
    assert summary["batches"] == 1, summary
    m = summary["metrics"][0]
    assert m["strategy"] == "recompute" and "recompute_threshold" in m["reason"]
    assert "backlog of 1100 change rows > recompute_threshold 0.25 x 1200 source rows: one version to the cut, " \
           "recomputed from the snapshots (max_batch_rows 500 does not split it; a recompute_threshold above " \
           "0.917 would)" in caplog.text, caplog.text
    sc.delete("t", "id < 3")  # and it goes on incrementally from the rebuilt state
    summary = sc.run(job)
    assert summary["metrics"][0]["strategy"] == "incremental"


@pytest.mark.parametrize("policy", [CompactionPolicy(max_delta_files=2, merge_fraction=1e9, min_merge_rows=10 ** 9),
                                    CompactionPolicy(max_delta_files=4, merge_fraction=1e9, min_merge_rows=10 ** 9),
                                    CompactionPolicy(max_delta_files=100, merge_fraction=0.0, min_merge_rows=1)],
                         ids=["deltas-merged", "smallest-deltas-merged", "all-merged"])
@pytest.mark.parametrize("where", ["driver", "executors", "too-many-matches"])
def test_compaction_never_changes_what_state_reads_return(spark, tmp_path, monkeypatch, policy, where):
    """Updates leave an aggregate's accumulators with a zero count and non-zero sums: merging
    delta files must keep them (only a merge of the whole arrangement may drop dead groups).
    Change-sized compactions and keyed reads run on the driver with Arrow, others with Spark
    (and a driver-side keyed scan matching too many rows falls back to Spark): all checked."""
    monkeypatch.setattr(arrangement, "DEFAULT_POLICY", policy)
    if where == "executors":
        monkeypatch.setattr(arrangement, "DRIVER_READ_ROWS", 0)
        monkeypatch.setattr(settings, "DRIVER_SCAN_ROWS", 0)
    if where == "too-many-matches":
        monkeypatch.setattr(arrangement, "DRIVER_MATCH_ROWS", 0)
    sc = Scenario(spark, tmp_path, {"acct": pa.table({"id": list(range(6)), "br": [i % 2 for i in range(6)],
                                                      "bal": [100] * 6})}, {"acct": ["id"]})
    job = sc.job("select br, sum(bal) as total, count(*) as n, max(bal) as top from src.acct group by br", "br")
    sc.run(job, full_refresh=True)
    compacted = 0
    for i in range(4):
        src = pa.table({"id": [i, 5 - i], "d": [-(i + 1), i + 1]})
        (DeltaTable(sc.path("acct")).merge(src, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update({"bal": "t.bal + s.d"}).execute())
        summary = sc.run(job)  # checks the target against batch evaluation
        assert summary["batches"] == 1
        compacted += summary["totals"]["state_rows_compacted"]
    assert compacted > 0
    assert delta_pandas(job.target_path)["total"].sum() == 600


def test_a_change_its_own_commit_merges_is_written_once_merged(spark, tmp_path, monkeypatch):
    """With at most two delta files an arrangement's every batch after the first merges its
    change with the delta before it: the change is merged unwritten, so each arrangement
    writes one file a batch (not the change's file, then the merge's), and every version
    still equals batch evaluation, an accumulator of count 0 kept (only a whole merge drops
    it)."""
    monkeypatch.setattr(arrangement, "DEFAULT_POLICY",
                        CompactionPolicy(max_delta_files=2, merge_fraction=1e9, min_merge_rows=10 ** 9,
                                         min_driver_merge_rows=10 ** 9))
    writes: list[str] = []
    real = arrangement.write_arrow
    monkeypatch.setattr(arrangement, "write_arrow",
                        lambda path, rel, *a, **k: (writes.append(rel.split("/")[0]), real(path, rel, *a, **k))[1])
    sc = Scenario(spark, tmp_path, {"acct": pa.table({"id": list(range(6)), "br": [i % 2 for i in range(6)],
                                                      "bal": [100] * 6})}, {"acct": ["id"]})
    job = sc.job("select br, sum(bal) as total, count(*) as n from src.acct group by br", "br")
    sc.run(job, full_refresh=True)
    compacted = []
    for i in range(4):
        writes.clear()
        src = pa.table({"id": [i, 5 - i], "d": [-(i + 1), i + 1]})
        (DeltaTable(sc.path("acct")).merge(src, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update({"bal": "t.bal + s.d"}).execute())
        if i == 3:
            DeltaTable(sc.path("acct")).delete("br = 1")
        summary = sc.run(job)
        assert writes and len(writes) == len(set(writes)), writes   # one write per arrangement
        compacted.append(summary["totals"]["state_rows_compacted"])
    assert compacted[0] == 0 and all(compacted[1:]), compacted
    assert delta_pandas(job.target_path)["total"].sum() == 302   # branch 0: 99 + 101 + 102


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_small_arrangement_is_merged_into_its_base_at_the_driver_floor(spark, tmp_path, monkeypatch, where):
    """An update's retraction cancels its row only in the base, so delta merges alone let a
    small arrangement grow by every change. A merge on the driver has no job to amortize: its
    floor is ``min_driver_merge_rows``, not ``min_merge_rows``, and the complete merge drops the
    group that was deleted, so the state stays near its live rows; on the executors the Spark
    floor holds and the deltas pile up."""
    monkeypatch.setattr(arrangement, "DEFAULT_POLICY", CompactionPolicy(min_merge_rows=10 ** 9,
                                                                        min_driver_merge_rows=8))
    if where == "executors":
        monkeypatch.setattr(arrangement, "DRIVER_READ_ROWS", 0)
    sc = Scenario(spark, tmp_path, {"t": pa.table({"id": list(range(20)), "g": [i % 5 for i in range(20)],
                                                   "v": list(range(20))})}, {"t": ["id"]})
    job = sc.job("select g, count(*) as n, sum(v) as s from src.t group by g", "g")
    sc.run(job, full_refresh=True)

    def state() -> tuple[int, set]:
        table = DeltaTable(job.state_root)
        return table.to_pyarrow_table().num_rows, {f for f in table.file_uris() if "/base-" in f}
    built_rows, built_base = state()
    assert built_rows == 5
    sc.delete("t", "g = 4")
    rows, base = [], set()
    for _ in range(8):   # 3 delta rows, then 2 a batch
        sc.update("t", {"v": "v + 1"}, "g < 2")
        assert sc.run(job)["batches"] == 1   # checks the target against batch evaluation
        n, base = state()
        rows.append(n)
    if where == "driver":
        assert base != built_base and 4 in rows and max(rows) <= 5 + 8 + 2, rows
    else:
        assert base == built_base and 4 not in rows and max(rows) > 5 + 8 + 2, rows


def test_a_driver_merge_keeps_the_rows_that_pass_live():
    """A complete merge on the driver applies the arrangement's ``live`` predicate (Spark SQL)
    as Spark's WHERE would: a group whose count is 0 is dropped even when a sum is not (a
    change's leftover), a NULL predicate drops the row, the schema is kept."""
    from pyspark.sql.types import DecimalType, LongType, StringType, StructField, StructType
    import decimal
    schema = StructType([StructField("g", StringType()), StructField("n`x", LongType()),
                         StructField("s", DecimalType(20, 2))])
    a = arrangement.Arrangement("a_acc", schema, ("g",), ("n`x", "s"), live="`n``x` <> 0")
    rows = pa.table({"g": ["a", "b", "c", None], "n`x": [2, 0, None, 1],
                     "s": [decimal.Decimal("1.50"), decimal.Decimal("3.00"), None, decimal.Decimal("0")]},
                    schema=pa.schema([("g", pa.string()), ("n`x", pa.int64()), ("s", pa.decimal128(20, 2))]))
    kept = a.live_rows(rows)
    assert kept.schema == rows.schema
    assert kept.to_pylist() == [{"g": "a", "n`x": 2, "s": decimal.Decimal("1.50")},
                                {"g": None, "n`x": 1, "s": decimal.Decimal("0.00")}]


def test_a_delta_merge_takes_the_smallest_half_of_the_deltas():
    """Size-tiered: with ``max_delta_files`` deltas, the smallest half is merged, so a row is
    rewritten a logarithmic number of times before the base merge, not once every
    ``max_delta_files`` batches; and never fewer than two files."""
    from types import SimpleNamespace as F
    files = [F(name=n, rows=r) for n, r in [("a", 400), ("b", 10), ("c", 90), ("d", 12), ("e", 11), ("f", 200),
                                            ("g", 9), ("h", 800)]]
    picked = CompactionPolicy(max_delta_files=8).delta_merge(files)
    assert sorted(f.name for f in picked) == ["b", "d", "e", "g"]
    assert len(CompactionPolicy(max_delta_files=2).delta_merge(files[:2])) == 2
    assert len(CompactionPolicy(max_delta_files=3).delta_merge(files[:3])) == 2


def test_the_keyed_scans_on_the_driver_return_what_arrows_scan_returns(spark, tmp_path):
    """State files are written by Spark's executors (base) and by Arrow (deltas); the driver's
    keyed scan reads them on DuckDB, or reads small ones whole, holds them and filters them in
    memory. For every key type DuckDB's accepts, with NULLs among the keys and in the data, and
    for a two-column key (a superset per column), both return exactly the rows (and types)
    Arrow's ``is_in`` scan keeps; past ``limit`` matches they return None; a floating-point key
    is left to Arrow."""
    import datetime
    import decimal

    import pyarrow.parquet as pq
    from pyspark.sql.types import (DateType, DecimalType, LongType, StringType, StructField, StructType,
                                   TimestampType)
    from consistent_stream.duck import UNSUPPORTED, KeyedScan
    from consistent_stream.delta.files import HELD
    from consistent_stream.state.arrangement import _arrow_schema, arrow_scan, fetched_scan
    sschema = StructType([StructField("k", LongType()), StructField("s", StringType()),
                          StructField("d", DecimalType(38, 2)), StructField("day", DateType()),
                          StructField("ts", TimestampType()), StructField("__weight", LongType())])
    rows = [(None if i % 50 == 7 else i % 300, None if i % 40 == 3 else f"s{i % 90}",
             decimal.Decimal(i) / 4, datetime.date(2020, 1, 1) + datetime.timedelta(days=i % 60),
             datetime.datetime(2021, 5, 1, 12, 0) + datetime.timedelta(seconds=i), 1 + i % 3) for i in range(2000)]
    base = tmp_path / "base"
    spark.createDataFrame(rows, sschema).repartition(3).write.parquet(str(base))
    schema = _arrow_schema(sschema)
    delta = tmp_path / "delta.parquet"
    pq.write_table(pa.Table.from_pylist([dict(zip(sschema.fieldNames(), r)) for r in rows[:100]], schema), delta)
    paths = sorted(str(p) for p in base.glob("*.parquet")) + [str(delta)]
    sizes = [os.path.getsize(p) for p in paths]
    scan = KeyedScan()

    def canon(t: pa.Table):
        return sorted(t.to_pylist(), key=repr)

    for keys in ({"k": pa.array([5, 17, 299, 1000], pa.int64())},
                 {"k": pa.array([5, None, 17], pa.int64())},
                 {"s": pa.array(["s3", None, "nope"], pa.string())},
                 {"d": pa.array([decimal.Decimal("2.50"), decimal.Decimal("7")], pa.decimal128(38, 2))},
                 {"day": pa.array([datetime.date(2020, 1, 3)], pa.date32())},
                 {"k": pa.array([5, 6], pa.int64()), "s": pa.array(["s5", "s6"], pa.string())}):
        got = scan.scan(paths, schema, keys, None)
        assert got is not UNSUPPORTED and got.schema == schema, keys
        want = arrow_scan(paths, schema, keys)
        assert want.num_rows and canon(got) == canon(want), keys
        held = fetched_scan(paths, sizes, schema, keys)   # the files read whole, filtered in memory
        assert held.schema == schema and canon(held) == canon(want), keys
    assert scan.scan(paths, schema, {"k": pa.array([5], pa.int64())}, limit=3) is None
    assert fetched_scan(paths, sizes, schema, {"k": pa.array([5], pa.int64())}, limit=3) is None
    assert all(HELD.holds(p, n) for p, n in zip(paths, sizes))   # the next read of them is no read
    assert scan.scan(paths, schema, {"k": pa.array([5], pa.int64())}, limit=100).num_rows == \
        arrow_scan(paths, schema, {"k": pa.array([5], pa.int64())}).num_rows
    fschema = pa.schema([("f", pa.float64())])
    assert scan.scan(paths, fschema, {"f": pa.array([1.0])}, None) is UNSUPPORTED


def test_a_run_opens_each_delta_table_once(spark, tmp_path, monkeypatch):
    """The target and the state are opened once a run (their logs replayed from the last
    checkpoint once, here: consistent_stream.delta.log), shared by the batch, maintenance (a
    pass after this batch) and the catalog's publish, and delta-rs opens no table at all (the
    target's change-sized MERGE is done here too, sink.rewrite); the sources are not opened
    either: their change since the last cut is read from their logs' tails
    (consistent_stream.delta.tail). (A batch that reads another version than the newest, e.g.
    one of a backlog's batches ending before it, opens a snapshot at that version: time travel,
    not a reopen.)"""
    sc = Scenario(spark, tmp_path, {
        "c": pa.table({"id": [1, 2], "name": ["ann", "bob"]}),
        "o": pa.table({"oid": [10], "cid": [1], "amt": [5]}),
    }, {"c": ["id"], "o": ["oid"]})
    job = sc.job("select c.id, c.name, sum(o.amt) as total from src.c c join src.o o on c.id = o.cid "
                 "group by c.id, c.name", "id")
    sc.run(job, full_refresh=True)
    sc.insert("o", pa.table({"oid": [20], "cid": [2], "amt": [1]}))
    # the full refresh's maintenance pass set the state's table properties, a commit after the
    # state version its batch recorded: this run's batch reads that older version (time travel)
    sc.run(job)
    sc.insert("o", pa.table({"oid": [21, 22], "cid": [1, 2], "amt": [2, 3]}))
    opened: list[str] = []
    where: list[str] = []   # who opened it, for the failure message
    init = DeltaTable.__init__

    def counted(self, table_uri, *a, **kw):
        import traceback
        opened.append(os.path.realpath(str(table_uri)))
        where.append(" < ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(
            traceback.extract_stack()[:-1]) if "consistent_stream" in f.filename))
        init(self, table_uri, *a, **kw)
    monkeypatch.setattr(DeltaTable, "__init__", counted)
    replayed: list[str] = []
    load = OwnedLog.load

    def counted_load(self):
        replayed.append(os.path.realpath(self.path))
        return load(self)
    monkeypatch.setattr(OwnedLog, "load", counted_load)
    import consistent_stream.sink.maintenance as maintenance
    monkeypatch.setattr(maintenance, "EVERY_BATCHES", 1)   # and a maintenance pass after the batch
    summary = run_job(spark, job)
    monkeypatch.undo()
    assert summary["batches"] == 1 and summary["changes_read"] == 2, summary
    assert opened == [], list(zip(opened, where))
    tables = [job.target_path, job.state_root]
    assert sorted(replayed) == sorted(os.path.realpath(t) for t in tables)
    sc.check(job)


def test_a_full_refresh_keeps_the_local_engines_translations(spark, tmp_path):
    """The first incremental run translates its delta queries for DuckDB and keeps them
    beside the plan; a full refresh removes the checkpoint but keeps them (they depend on the
    SQL and its column types only), so the next incremental run finds them all."""
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2, 2], "v": [10, 20, 30]}),
                                    "u": pa.table({"k": [1, 2], "w": ["a", "b"]})}, {"t": [], "u": ["k"]})
    job = sc.job("select t.k, u.w, sum(t.v) as s from src.t t join src.u u on t.k = u.k group by t.k, u.w", "k")
    sc.run(job, full_refresh=True)
    sc.insert("t", pa.table({"k": [1], "v": [5]}))
    assert sc.run(job)["metrics"][0]["local_queries"] > 0
    with open(job.local_sql_path) as f:
        made = f.read()
    sc.run(job, full_refresh=True)
    with open(job.local_sql_path) as f:
        assert f.read() == made
    sc.insert("t", pa.table({"k": [2], "v": [7]}))
    sc.run(job)
    with open(job.local_sql_path) as f:
        assert f.read() == made   # nothing new to translate: the file is not rewritten


def test_the_plans_typing_analyzes_each_rule_over_its_inputs_schemas_not_their_sql(spark, monkeypatch):
    """type_plan's dry run (a model's first compile) analyzes each node's rule once, over empty
    relations of its inputs' analyzed schemas: no text Spark analyzes holds the rules below it.
    TPC-DS q77 (a ROLLUP over a union of three channels, each a left join of two aggregates of
    joins) is the deep plan: its top rules' nested text was 400,000 characters (16 s of Spark's
    analysis for the whole plan, where a batch of it runs in one)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from consistent_stream.changelog import Views
    from consistent_stream.exec.evaluator import type_plan
    from consistent_stream.plan import compile_model
    from consistent_stream.sources import SourceSpec
    from consistent_stream_testing.tpcds.generate import SCHEMAS
    from test_tpcds_queries import QUERY_DIR, tpcds_sources
    sql = (QUERY_DIR / "q77.sql").read_text()
    sources = [SourceSpec.from_dbt(d, "/tmp") for d in tpcds_sources("/tmp/tpcds", sql)]
    schemas = {s.key: from_arrow_schema(SCHEMAS[s.name]) for s in sources}
    compiled = compile_model(sql, sources, {k: v.fieldNames() for k, v in schemas.items()})
    analyzed = []
    sql_of = Views.sql
    monkeypatch.setattr(Views, "sql", lambda self, text: analyzed.append(len(text)) or sql_of(self, text))
    types = type_plan(spark, compiled.root, schemas)
    assert set(types.nodes) >= {compiled.root.id}
    assert max(analyzed) < 40_000, (len(analyzed), max(analyzed))
