"""A continuous run that reaches its timeout during a batch lets that batch finish (stopping
never interrupts a batch) and stops before the next one; the next run goes on from there."""
from __future__ import annotations

import time

import pyarrow as pa

import consistent_stream.job as job_module
import consistent_stream.query as query_module
from consistent_stream.delta import DeltaTableRef
from consistent_stream.spec import JobSpec
from scenario import Scenario


def test_timeout_during_a_batch_lets_it_commit_then_stops(spark, tmp_path, monkeypatch):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2], "v": [10, 20]})}, {"t": ["k"]})
    job = sc.job("select k, sum(v) as s from src.t group by k", "k")
    sc.run(job, full_refresh=True)
    target = DeltaTableRef(job.target_path)
    v0 = target.latest_version()
    sc.insert("t", pa.table({"k": [3], "v": [30]}))

    real = query_module.process_batch

    def slow(*a, **k):
        time.sleep(6)  # the timeout below falls inside this batch
        return real(*a, **k)
    monkeypatch.setattr(query_module, "process_batch", slow)
    continuous = JobSpec(**{**job.__dict__, "trigger": "processing_time:0.5"})
    summary = job_module.run_job(spark, continuous, timeout_s=2)  # must not raise
    monkeypatch.undo()
    assert summary["batches"] == 1 and target.latest_version() == v0 + 1
    sc.check(job)

    sc.insert("t", pa.table({"k": [1], "v": [5]}))
    assert sc.run(job)["batches"] == 1 and target.latest_version() == v0 + 2
