"""A continuous model whose batches are slower than its trigger interval still keeps up: each
batch takes every change that arrived while the previous one ran, instead of one small cut
per interval queued behind it."""
from __future__ import annotations

import dataclasses
import threading
import time

import pyarrow as pa

import consistent_stream.job as job_module
import consistent_stream.query as query_module
from consistent_stream.delta import DeltaTableRef
from consistent_stream.runtime import BatchMeta
from consistent_stream.spec import JobSpec
from scenario import Scenario


def test_a_continuous_model_slower_than_its_trigger_catches_up_once_the_sources_stop(spark, tmp_path, monkeypatch):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [0], "v": [0]})}, {"t": ["k"]})
    job = sc.job("select k % 3 as g, count(*) as n, sum(v) as s from src.t group by k % 3", "g")
    sc.run(job, full_refresh=True)

    real = query_module.process_batch

    def slow(*a, **k):
        time.sleep(1.0)  # every batch takes five trigger intervals
        return real(*a, **k)
    monkeypatch.setattr(query_module, "process_batch", slow)

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


def test_a_growing_lag_scales_a_continuous_model_up_at_a_batch_boundary(spark, tmp_path, monkeypatch):
    """The autoscaler in a continuous run (consistent_stream.autoscale): real Delta commits,
    the lag measured from their commit times, a batch cost of 0.05 core-seconds per change row
    (a sleep divided by the parallelism, so that the run means the same on any machine). A
    writer committing every 0.03 s (until a batch ran with 2) outruns one core: the lag
    passes 0.5 s and parallelism goes 1 -> 2, logged with its inputs; the batches after it run
    with 2, the ones before with 1, and the view stays equal to batch evaluation. (Scaling down
    is the policy's unit test's: how many batches a slow phase gets depends on the machine.)"""
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [0], "v": [0]})}, {"t": ["k"]})
    job = sc.job("select k % 3 as g, count(*) as n, sum(v) as s from src.t group by k % 3", "g")
    sc.run(job, full_refresh=True)

    real = query_module.process_batch
    ran_with: list[int | None] = []

    def costly(runtime, *a, **k):
        ran_with.append(runtime.parallelism)
        result = real(runtime, *a, **k)
        pause = 0.05 * result.changes_read / (runtime.parallelism or 1)
        time.sleep(pause)
        return dataclasses.replace(result, seconds=result.seconds + pause)
    monkeypatch.setattr(query_module, "process_batch", costly)

    def writer():  # until a batch runs with parallelism 2 (or 17 s on a slow machine)
        i, t0 = 0, time.time()
        while 2 not in ran_with and time.time() - t0 < 17:
            i += 1
            sc.insert("t", pa.table({"k": [i], "v": [i]}))
            time.sleep(0.03)
    w = threading.Thread(target=writer)
    w.start()
    continuous = JobSpec(**{**job.__dict__, "trigger": "processing_time:0.2",
                            "autoscale": {"min_parallelism": 1, "max_parallelism": 2, "lag_threshold_s": 0.5,
                                          "stable_s": 0, "window": 2}})
    summary = job_module.run_job(spark, continuous, timeout_s=20)
    w.join()
    monkeypatch.undo()

    log = summary["autoscale"]
    assert log and log[0]["reason"].startswith("collecting metrics"), log
    ups = [d for d in log if d["action"] == "up"]
    assert ups and (ups[0]["previous"], ups[0]["parallelism"]) == (1, 2), log
    up = ups[0]
    assert up["lag_s"] > 0.5 and up["inputs"]["target"] >= 2 and up["inputs"]["tps_current"] > 0
    assert "lag_threshold_s" in up["reason"]
    # applied at the next batch boundary: every batch before it ran with 1, the next with 2
    at = [d["batch_id"] for d in log].index(up["batch_id"])
    assert ran_with[:at + 1] == [1] * (at + 1) and ran_with[at + 1] == 2, (ran_with, log)
    sc.run(job)   # the rest of the changes, then the view equals batch evaluation
    sc.check(job)
