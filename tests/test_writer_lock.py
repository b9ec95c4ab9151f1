"""One writer per model, with real processes: while a continuous run of a model is up in
another process, a `dbt run`-style run of the same model fails at once naming the holder and
writes nothing, and so does a second continuous run; once that process is killed with
SIGKILL, the next run takes the stale lock over and commits. The same with two real
``dbt run`` processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import ConcurrentWriterError
from consistent_stream.job import run_job
from consistent_stream.sink.lock import WriterLock
from consistent_stream.spec import JobSpec
from helpers import REPO, delta_pandas
from scenario import Scenario

CONTINUOUS = textwrap.dedent("""
    import sys
    import consistent_stream
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    from consistent_stream.job import run_job
    from consistent_stream.spec import JobSpec
    spark = (with_delta(SparkSession.builder, master="local[1]").config("spark.ui.enabled", "false")
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
        with pytest.raises(ConcurrentWriterError, match=rf"pid {proc.pid} on host .* started .*Nothing of the model"):
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


def _dbt_project(root):
    """A dbt project (the crash campaign's profile and sources) with one model, ``totals``,
    whose trigger comes from ``--vars``; its sources written by the campaign's ``Shop``."""
    import random
    sys.path.insert(0, str(REPO / "benchmarks"))
    import crash_campaign as cc
    shop = cc.Shop(root, random.Random(20261123))
    sql, key = cc.MODELS["totals"]
    cfg = (f"materialized='consistent_stream', unique_key='{key}', location_root='{root / 'targets'}', "
           f"trigger=var('trigger', 'available_now')")
    files = {"dbt_project.yml": cc.PROJECT, "profiles.yml": cc.PROFILE.format(schema=cc.SCHEMA, root=root),
             "models/sources.yml": cc.SOURCES.format(root=root),
             "models/totals.sql": "{{ config(" + cfg + ") }}\n" + sql.format(
                 orders="{{ source('shop', 'orders') }}", customers="{{ source('shop', 'customers') }}") + "\n"}
    project = root / "project"
    for rel, text in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    other = root / "other_scheduler"      # its own Spark catalog: embedded Derby admits one JVM
    other.mkdir()
    (other / "profiles.yml").write_text(cc.PROFILE.format(schema=cc.SCHEMA, root=other))
    return shop, project, other


def test_two_dbt_runs_of_one_model_at_once_the_second_fails_naming_the_first(tmp_path):
    """Two ``dbt run`` processes of one model: the first (a continuous model, so it keeps the
    lock) runs; the second fails at once naming the first's pid and writes nothing; after the
    first is killed with SIGKILL, a ``dbt run`` takes its stale lock over and commits. The
    second scheduler has its own Spark catalog (a profile of its own): two JVMs cannot share
    one embedded Derby metastore, whose second session fails before any model runs."""
    shop, project, other = _dbt_project(tmp_path)
    dbt = [str(Path(sys.executable).parent / "dbt"), "run", "--project-dir", str(project), "-s", "totals",
           "--profiles-dir"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    first = subprocess.Popen(dbt + [str(project), "--vars", "{trigger: 'processing_time:1'}"], env=env,
                             cwd=str(project), start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    targets = tmp_path / "targets"
    try:
        def holder() -> dict:
            locks = list(targets.rglob("*.lock"))
            return WriterLock(str(locks[0])[:-len(".lock")], "totals").holder() if locks else {}
        _wait(lambda: holder().get("pid") == first.pid, "the first dbt run to take the lock", timeout=240)
        lock = next(targets.rglob("*.lock"))
        target = DeltaTableRef(str(lock)[:-len("__checkpoint.lock")])    # the default checkpoint_location
        _wait(lambda: target.exists(), "the first dbt run's first commit", timeout=240)
        version = target.latest_version()
        second = subprocess.run(dbt + [str(other)], env=env, cwd=str(project), capture_output=True, text=True,
                                timeout=600)
        out = second.stdout + second.stderr
        assert second.returncode != 0, out[-3000:]
        assert f"pid {first.pid} on host" in out and "Nothing of the model was read" in out, out[-3000:]
        assert target.latest_version() == version           # nothing written by the refused run
        assert holder().get("pid") == first.pid             # the first still holds the lock
    finally:
        os.killpg(first.pid, signal.SIGKILL)                # dbt, the JVM, Python workers: all of it
        first.wait()
    assert holder().get("pid") == first.pid                 # left behind by the killed process
    shop.change(3)
    again = subprocess.run(dbt + [str(other)], env=env, cwd=str(project), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert target.latest_version() > version                # the stale lock taken over, the change committed
    assert holder() == {}
