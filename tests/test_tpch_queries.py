"""The 22 TPC-H queries as the specification writes them (``models/tpch``: ORDER BY and LIMIT,
comma joins in the specification's FROM order, OR-ed join conditions, subqueries in HAVING),
each a consistent_stream model, maintained through five refresh rounds: after the first build
and after every round, every committed version equals Spark's and DuckDB's answer to the same
SQL at its recorded cut (rows tied at a LIMIT's boundary compared by their ORDER BY values).

A round is the project's TPC-H refresh (RF1 inserts, RF2 deletes, updates of order statuses and
customer balances) plus updates of the tables the refresh leaves alone (part prices and sizes,
supplier balances, partsupp costs and quantities), so that every query's change reaches it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from consistent_stream.job import run_job
from consistent_stream.plan import compile_model
from consistent_stream.plan.logical import maintenance, walk
from consistent_stream.sources import SourceSpec
from consistent_stream_testing.tpch.generate import SCHEMAS, generate
from consistent_stream_testing.tpch.refresh import refresh_round, update_dimensions
from helpers import REPO, assert_target_equals_batch_evaluation, job_for, render_model, tpch_sources

ROUNDS = 5
MODELS = sorted((REPO / "models" / "tpch" / "models").glob("q*.sql"))


def _compiled(path: Path, data: str = "/tmp/tpch"):
    sql, _, used, _ = render_model(path)
    sources = [SourceSpec.from_dbt(d, "/tmp") for d in tpch_sources(data, used)]
    return compile_model(sql, sources, {s.key: list(SCHEMAS[s.name].names) for s in sources})


def test_every_tpch_query_compiles_as_written_and_every_operator_is_incremental():
    assert len(MODELS) == 22
    for path in MODELS:
        compiled = _compiled(path)
        modes = {maintenance(n)[0] for n in walk(compiled.root)}
        assert modes == {"incremental"}, f"{path.stem}: {modes}"


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch_queries")
    generate(0.01, root / "data")
    return root


def test_the_22_tpch_queries_equal_batch_evaluation_after_every_refresh_round(spark, tpch):
    jobs = []
    for path in MODELS:
        sql, _, used, _ = render_model(path)
        job = job_for(path.stem, sql, tpch_sources(str(tpch / "data"), used), None, tpch)
        summary = run_job(spark, job, full_refresh=True)
        assert summary["batches"] == 1
        assert_target_equals_batch_evaluation(spark, job, f"{job.model} initial")
        jobs.append(job)
    for r in range(1, ROUNDS + 1):
        refresh_round(tpch / "data", r)
        update_dimensions(tpch / "data", r)
        for job in jobs:
            summary = run_job(spark, job)
            assert summary["batches"] == 1, summary
            assert summary["strategies"] == ["incremental"], summary
            assert_target_equals_batch_evaluation(spark, job, f"{job.model} round {r}")
