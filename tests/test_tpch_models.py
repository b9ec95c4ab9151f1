"""The central contract on the example models under TPC-H refresh rounds.

For every example model, after the initial run and after each of five refresh rounds
(RF1 inserts, RF2 deletes, updates of balances and statuses), the target at its committed
version equals batch evaluation of the model's SQL on the sources at the recorded cut, in
Spark and in DuckDB.
"""
from __future__ import annotations

import pytest

from consistent_stream.job import run_job
from consistent_stream.tpch.generate import generate
from consistent_stream.tpch.refresh import refresh_round
from consistent_stream.verify import verify_target
from helpers import EXAMPLE_MODELS, assert_target_equals_batch_evaluation, job_for, render_model, tpch_sources

ROUNDS = 5
MODELS = sorted(p.stem for p in EXAMPLE_MODELS.glob("*.sql"))


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch")
    generate(0.01, root / "data")
    return root


def _check(spark, job, label):
    assert_target_equals_batch_evaluation(spark, job, label)
    res = verify_target(spark, job.target_path)
    assert res.ok, res.to_json()


def test_example_models_equal_batch_evaluation_after_every_refresh_round(spark, tpch):
    jobs = []
    for name in MODELS:
        sql, config, used = render_model(EXAMPLE_MODELS / f"{name}.sql")
        jobs.append(job_for(name, sql, tpch_sources(str(tpch / "data"), used), config["unique_key"], tpch))
    for job in jobs:
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
