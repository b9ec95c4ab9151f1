"""A continuous model whose batches are slower than its trigger interval still keeps up: each
batch takes every change that arrived while the previous one ran, instead of one small cut
per interval queued behind it."""
from __future__ import annotations

import threading
import time

import pyarrow as pa

import consistent_stream.job as job_module
from consistent_stream.delta import DeltaTableRef
from consistent_stream.runtime import BatchMeta
from consistent_stream.spec import JobSpec
from scenario import Scenario


def test_a_continuous_model_slower_than_its_trigger_catches_up_once_the_sources_stop(spark, tmp_path, monkeypatch):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [0], "v": [0]})}, {"t": ["k"]})
    job = sc.job("select k % 3 as g, count(*) as n, sum(v) as s from src.t group by k % 3", "g")
    sc.run(job, full_refresh=True)

    real = job_module.process_batch

    def slow(*a, **k):
        time.sleep(1.0)  # every batch takes five trigger intervals
        return real(*a, **k)
    monkeypatch.setattr(job_module, "process_batch", slow)

    def writer():  # 30 source commits in about 3 s
        for i in range(1, 31):
            sc.insert("t", pa.table({"k": [i], "v": [i]}))
            time.sleep(0.1)
    w = threading.Thread(target=writer)
    w.start()
    continuous = JobSpec(**{**job.__dict__, "trigger": "processing_time:0.2"})
    summary = job_module.run_job(spark, continuous, timeout_s=12)
    w.join()
    monkeypatch.undo()

    source = job.sources[0]
    latest = DeltaTableRef(source.location).latest_version()
    meta = BatchMeta.from_commit(DeltaTableRef(job.target_path).latest_commit())
    # queued one cut per interval, 30 commits would have needed about 15 one-second batches
    assert meta.cut == {source.key: latest}, (meta.cut, latest, summary["batches"])
    assert summary["batches"] < 12, summary["batches"]
    sc.check(job)
