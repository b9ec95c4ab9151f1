"""One writer per model, with real processes: while a continuous run of a model is up in
another process, a `dbt run`-style run of the same model fails at once naming the holder and
writes nothing; once that process is killed with SIGKILL, the next run takes the stale lock
over and commits."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import ConcurrentWriterError
from consistent_stream.job import run_job
from consistent_stream.sink.lock import WriterLock
from consistent_stream.spec import JobSpec
from helpers import delta_pandas
from scenario import Scenario

CONTINUOUS = textwrap.dedent("""
    import sys
    import consistent_stream
    from pyspark.sql import SparkSession
    from consistent_stream.job import run_job
    from consistent_stream.spec import JobSpec
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    run_job(spark, JobSpec.load(sys.argv[1]), timeout_s=300)
""")


def _wait(cond, what: str, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_second_writer_fails_naming_the_holder_and_a_killed_holders_lock_is_taken_over(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2], "v": [10, 20]})}, {"t": ["k"]})
    job = sc.job("select k, sum(v) as s from src.t group by k", "k")
    continuous = JobSpec(**{**job.__dict__, "trigger": "processing_time:1"})
    spec_file = tmp_path / "continuous.json"
    spec_file.write_text(continuous.to_json())
    lock = WriterLock(job.checkpoint_location, job.model)
    proc = subprocess.Popen([sys.executable, "-c", CONTINUOUS, str(spec_file)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: lock.holder().get("pid") == proc.pid, "the continuous run to take the lock")
        target = DeltaTableRef(job.target_path)
        _wait(lambda: target.exists(), "the continuous run's first commit")
        version = target.latest_version()
        with pytest.raises(ConcurrentWriterError, match=rf"pid {proc.pid} on host .* started .*Nothing was read"):
            run_job(spark, job)
        assert target.latest_version() == version          # nothing written by the refused run
        with pytest.raises(ConcurrentWriterError):          # a second continuous run is refused too
            run_job(spark, continuous, timeout_s=5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)                 # dbt, the JVM, Python workers: all of it
        proc.wait()
    assert lock.holder().get("pid") == proc.pid             # left behind by the killed process
    sc.insert("t", pa.table({"k": [3], "v": [30]}))
    summary = run_job(spark, job)                           # the stale lock is taken over
    assert summary["target_version"] is not None
    got = delta_pandas(job.target_path).sort_values("k")
    assert list(zip(got["k"], got["s"])) == [(1, 10), (2, 20), (3, 30)]
    assert lock.holder() == {}                              # released at the end of the run
