"""The central contract on the example models under TPC-H refresh rounds.

For every example model, after the initial run and after each of three refresh rounds
(RF1 inserts, RF2 deletes, updates of balances and statuses), the target at its committed
version equals batch evaluation of the model's SQL on the sources at the recorded cut, in
Spark and in DuckDB. The ref() chain (stg_lineitem, a view, expanded into order_revenue;
nation_revenue over order_revenue) runs in DAG order and is checked against batch
evaluation of the whole chain at each version's base cut.
"""
from __future__ import annotations

import pytest

from consistent_stream.job import run_job
from consistent_stream_testing.tpch.generate import generate
from consistent_stream_testing.tpch.refresh import refresh_round
from consistent_stream.verify import verify_target
from consistent_stream.plan.expand import expand_views
from helpers import (EXAMPLE_MODELS, assert_target_equals_batch_evaluation, job_for, model_ref, render_model,
                     tpch_sources)

ROUNDS = 3
RENDERED = {p.stem: render_model(p) for p in sorted(EXAMPLE_MODELS.glob("*.sql"))}
VIEWS = {n: r for n, r in RENDERED.items() if r[1].get("materialized") == "view"}


def dag_order() -> list[str]:
    """The consistent_stream models, every model after the ones it refs."""
    out: list[str] = []
    todo = [n for n in RENDERED if n not in VIEWS]
    while todo:
        ready = [n for n in todo if all(m in out or m in VIEWS for m in RENDERED[n][3])]
        out += ready
        todo = [n for n in todo if n not in ready]
    return out


def job_of(name: str, root):
    """``name``'s job as the materialization builds it: views expanded, their sources added,
    upstream models read through ref()."""
    sql, config, used, refs = RENDERED[name]
    sql = expand_views(sql, {("tests", v): VIEWS[v][0] for v in refs if v in VIEWS})
    used = used + [u for v in refs if v in VIEWS for u in VIEWS[v][2]]
    ups = [model_ref(m, root) for m in refs if m not in VIEWS]
    return job_for(name, sql, tpch_sources(str(root / "data"), used) + ups, config["unique_key"], root)


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch")
    generate(0.01, root / "data")
    return root


def _check(spark, job, label):
    """The target against DuckDB's evaluation and Spark's types (the helper), and against
    Spark's rows by ``verify`` (one Spark evaluation a check: each builds its own broadcast
    relations on the driver)."""
    assert_target_equals_batch_evaluation(spark, job, label, spark_rows=False)
    res = verify_target(spark, job.target_path)
    assert res.ok, res.to_json()


def test_example_models_equal_batch_evaluation_after_every_refresh_round(spark, tpch):
    jobs = []
    for name in dag_order():
        job = job_of(name, tpch)   # after its upstreams ran: ref() reads their targets
        jobs.append(job)
        summary = run_job(spark, job, full_refresh=True)
        assert summary["batches"] == 1
        _check(spark, job, f"{job.model} initial")
    for r in range(1, ROUNDS + 1):
        refresh_round(tpch / "data", r)
        for job in jobs:
            summary = run_job(spark, job)
            assert summary["batches"] == 1, summary
            assert summary["changes_read"] > 0
            _check(spark, job, f"{job.model} round {r}")
