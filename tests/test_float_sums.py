"""SUM and AVG over doubles stay bounded under retractions (consistent_stream.fsum): a large
value inserted and retracted later leaves nothing behind, nor does a retracted infinity, and a
history of large updates whose sum cancels keeps the result within the comparison's tolerance
of batch evaluation through compactions on the driver and on Spark. Each test also shows what
plain floating-point accumulation of the same changes would have answered, so that it could
fail."""
from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest

from consistent_stream.state import arrangement
from consistent_stream.state.arrangement import CompactionPolicy
from helpers import delta_pandas
from scenario import Scenario

SQL = "select g, sum(x) as s, avg(x) as a, count(*) as n from src.t group by g"


def _table(rows: list[tuple]) -> pa.Table:
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "g": [r[1] for r in rows],
                     "x": pa.array([r[2] for r in rows], pa.float64())})


def _sums(job) -> dict:
    return {r["g"]: r["s"] for r in delta_pandas(job.target_path).to_dict("records")}


def test_a_large_value_retracted_later_leaves_nothing_behind(spark, tmp_path):
    # the rebuild sums 1e17 + 1 + 2 (= 1e17 in doubles); retracting the 1e17 must leave 3, where
    # a plain accumulator is left with 1e17 - 1e17 = 0
    assert (1e17 + 1.0 + 2.0) - 1e17 == 0.0
    sc = Scenario(spark, tmp_path, {"t": _table([(1, "a", 1e17), (2, "a", 1.0), (3, "a", 2.0), (4, "b", 0.1)])},
                  {"t": ["k"]})
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    sc.delete("t", "k = 1")
    sc.insert("t", _table([(5, "b", 1e20), (6, "b", 0.2)]))      # an incremental batch: 0.1 + 1e20 + 0.2
    sc.run(job)
    assert _sums(job)["a"] == 3.0
    sc.delete("t", "k = 5")
    sc.run(job)
    assert _sums(job)["b"] == pytest.approx(0.1 + 0.2, rel=1e-15)


def test_a_retracted_infinity_or_nan_leaves_nothing_behind(spark, tmp_path):
    inf, nan = float("inf"), float("nan")
    sc = Scenario(spark, tmp_path, {"t": _table([(1, "a", 1.5), (2, "a", inf), (3, "b", 2.5), (4, "c", inf)])},
                  {"t": ["k"]})
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    sc.insert("t", _table([(5, "a", -inf), (6, "b", nan), (7, "c", 1.0)]))   # a: inf - inf = NaN, b: NaN
    sc.run(job)
    assert all(math.isnan(v) for v in (_sums(job)["a"], _sums(job)["b"])) and _sums(job)["c"] == inf
    assert (inf + -inf) - -inf != (inf + -inf) - -inf                        # plain: NaN for good
    sc.delete("t", "k in (2, 5, 6, 4)")
    sc.run(job)
    assert _sums(job) == {"a": 1.5, "b": 2.5, "c": 1.0}


@pytest.mark.parametrize("compact_on", ["driver", "spark"])
def test_a_long_history_of_large_updates_stays_within_the_tolerance(spark, tmp_path, monkeypatch, compact_on):
    # 200 keys hold values near 1e15 that every batch replaces by others; the small values of
    # group "small" are all that is left at the end. Plain accumulation of the same partial
    # sums drifts by whole units (computed beside, as the foil); the engine stays exact to the
    # comparison's tolerance at every version (Scenario.run checks each against batch
    # evaluation), and its compactions run every other batch
    monkeypatch.setattr(arrangement, "DEFAULT_POLICY",
                        CompactionPolicy(max_delta_files=2, merge_fraction=0.5, min_merge_rows=1))
    if compact_on == "spark":
        monkeypatch.setattr(arrangement, "DRIVER_READ_ROWS", 0)
    rnd = random.Random(7)
    big = {k: rnd.uniform(1e15, 9e15) for k in range(1, 201)}
    small = [(1000 + i, "small", rnd.uniform(0, 1)) for i in range(20)]
    sc = Scenario(spark, tmp_path, {"t": _table([(k, "g", v) for k, v in big.items()] + small)}, {"t": ["k"]})
    job = sc.job("select sum(x) as s, count(*) as n from src.t", None)
    sc.run(job, full_refresh=True)
    plain = sum(big.values()) + sum(v for _, _, v in small)
    for _ in range(4):
        new = {k: rnd.uniform(1e15, 9e15) for k in big}
        sc.delete("t", "k <= 200")
        sc.insert("t", _table([(k, "g", v) for k, v in new.items()]))
        plain += sum(new.values()) - sum(big.values())
        big = new
        sc.run(job)
    sc.delete("t", "k <= 200")
    plain -= sum(big.values())
    sc.run(job)
    exact = math.fsum(v for _, _, v in small)
    [got] = delta_pandas(job.target_path)["s"].tolist()
    assert abs(plain - exact) > 1.0                 # the foil: plain accumulation is off by units
    assert got == pytest.approx(exact, rel=1e-12)


def test_a_checkpoint_with_plain_float_accumulators_is_rebuilt_once(spark, tmp_path):
    # a checkpoint of an earlier version: its plan's accumulator arrangement has no
    # compensated pair; the next run says so and rebuilds (only such models do)
    import json
    sc = Scenario(spark, tmp_path, {"t": _table([(1, "a", 1.5), (2, "b", 2.5)])}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    with open(job.plan_path) as f:
        plan = json.load(f)
    types = json.loads(plan["types"])
    assert any(a["compensated"] for a in types["arrangements"].values())
    for a in types["arrangements"].values():
        a.pop("compensated")
    plan["types"] = json.dumps(types)
    with open(job.plan_path, "w") as f:
        json.dump(plan, f)
    sc.insert("t", _table([(3, "a", 0.25)]))
    summary = sc.run(job)
    assert summary["strategies"] == ["recompute"] and "configuration_change" in summary, summary
    assert any("compensated accumulators" in c for c in summary["configuration_change"]["changes"])
    sc.insert("t", _table([(4, "b", 0.5)]))
    assert sc.run(job)["strategies"] == ["incremental"]


def test_sum_and_avg_of_a_string_column_are_doubles_as_spark_computes_them(spark, tmp_path):
    """Spark sums a string argument as DOUBLE (``SUM(CAST(s AS DOUBLE))``; ``s * 2`` would cast
    it to BIGINT): the engine's accumulators do the same, through a first build, an insert and
    a delete. (DuckDB, the tests' second engine, has no SUM over VARCHAR: checked by Spark.)"""
    from consistent_stream.job import run_job
    from consistent_stream.verify import verify_target
    sc = Scenario(spark, tmp_path, {"t": pa.table({"id": [1, 2, 3], "g": [1, 1, 2], "s": ["0.10", "0.20", "0.30"]})},
                  {"t": ["id"]})
    job = sc.job("select g, sum(s) as total, avg(s) as mean, count(*) as n from src.t group by g", "g")
    run_job(spark, job, full_refresh=True)
    for change in (lambda: sc.insert("t", pa.table({"id": [4], "g": [1], "s": ["1.5"]})),
                   lambda: sc.delete("t", "id = 1")):
        change()
        run_job(spark, job)
        assert verify_target(spark, job.target_path).ok
    got = {r["g"]: (r["total"], r["mean"], r["n"]) for r in delta_pandas(job.target_path).to_dict("records")}
    assert got[2] == (0.3, 0.3, 1) and got[1][2] == 2 and math.isclose(got[1][0], 1.7) and math.isclose(got[1][1], 0.85)
