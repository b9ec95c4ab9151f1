"""Bad inputs and bad state, catalogued (docs/troubleshooting.md): each case fails
with an error naming the table, file or config key and what to do, or recovers by itself;
in every case the target's committed versions are left as they were, and after the fix or
the recovery the target equals batch evaluation of the model at the sources' latest
versions.

Real Spark (the shared session; a case that loses its JVM runs in a process of its own),
real Delta tables, real file systems: read-only and full disks are small tmpfs mounts (the
tests run as root; without the privilege those two are skipped).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

import consistent_stream.runtime as runtime
from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import (CommitError, ConfigError, ConsistentStreamError, SourceError,
                                      UniqueKeyViolation)
from consistent_stream.job import run_job
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation, job_for
from scenario import Scenario

SQL = "select g, count(*) as n, sum(v) as s from src.t group by g"
ROWS = {"k": [1, 2, 3], "g": ["a", "a", "b"], "v": [10, 20, 30]}


# ---- helpers ----------------------------------------------------------------------------------
def _model(spark, tmp_path: Path, sql: str = SQL, key="g", rows: dict | None = None, pk=("k",)):
    """A source ``src.t`` (primary key ``pk``) and a model over it, run once (full refresh).
    Returns the scenario, the job and the target's history (see :func:`_history`)."""
    sc = Scenario(spark, tmp_path, {"t": pa.table(rows or ROWS)}, {"t": list(pk)})
    job = sc.job(sql, key)
    run_job(spark, job, full_refresh=True)
    return sc, job, _history(job)


def _rows(path: str, version: int) -> list[tuple]:
    t = pa.table(DeltaTable(path, version=version).to_pyarrow_table())
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


def _history(job) -> dict[int, list[tuple]]:
    """Every committed version of the target and its rows."""
    latest = DeltaTable(job.target_path).version()
    return {v: _rows(job.target_path, v) for v in range(latest + 1)}


def _assert_intact(job, before: dict) -> None:
    """Nothing was committed by the failed run, and every version before it reads as before."""
    assert _history(job) == before


def _assert_recovered(spark, job, before: dict | None = None) -> None:
    """The target equals batch evaluation at the sources' latest versions, and the versions
    committed before the bad input still read as they did."""
    assert_target_equals_batch_evaluation(spark, job, job.model)
    meta = DeltaTableRef(job.target_path).latest_commit().metadata
    cut = json.loads(meta["cut"]) if isinstance(meta["cut"], str) else meta["cut"]
    assert cut == {s.key: DeltaTable(s.location).version() for s in job.sources}
    if before is not None:
        now = _history(job)
        assert {v: now[v] for v in before} == before


def _with(job, **changes) -> JobSpec:
    return JobSpec(**{**job.__dict__, **changes})


def _at_root(job, root: str) -> JobSpec:
    """``job`` with ``location_root: root`` (target and default checkpoint under it)."""
    target = os.path.join(root, job.identifier)
    return _with(job, target_path=target, checkpoint_location=target + "__checkpoint")


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _overwrite(sc, name: str, data: pa.Table) -> None:
    """Rewrite a source with a new schema (dropped, renamed or retyped columns)."""
    write_deltalake(sc.path(name), data, mode="overwrite", schema_mode="overwrite")


# ---- sources ----------------------------------------------------------------------------------
def test_missing_source_table_names_its_location_and_meta_key(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    sc.insert("t", pa.table({"k": [4], "g": ["b"], "v": [1]}))
    shutil.move(sc.path("t"), str(tmp_path / "moved"))
    with pytest.raises(SourceError, match=r"src\.t.*no Delta table at .*src/t.*meta\.consistent_stream\.location"):
        run_job(spark, job)
    _assert_intact(job, before)
    shutil.move(str(tmp_path / "moved"), sc.path("t"))
    run_job(spark, job)
    _assert_recovered(spark, job, before)


def test_source_that_is_not_a_delta_table_names_its_location(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    shutil.move(sc.path("t"), str(tmp_path / "delta"))
    os.makedirs(sc.path("t"))
    pq.write_table(pa.table(ROWS), os.path.join(sc.path("t"), "part-0.parquet"))   # plain Parquet
    with pytest.raises(SourceError, match=r"src\.t.*not a Delta table.*_delta_log.*meta\.consistent_stream\.location"):
        run_job(spark, job)
    _assert_intact(job, before)
    shutil.rmtree(sc.path("t"))
    shutil.move(str(tmp_path / "delta"), sc.path("t"))
    run_job(spark, job)
    _assert_recovered(spark, job, before)


def test_change_data_feed_turned_off_reads_the_change_from_the_log(spark, tmp_path):
    """Not a bad input any more: a table without the Change Data Feed (turned off after a
    run, or never on) is read from its log, exactly."""
    sc, job, before = _model(spark, tmp_path)
    DeltaTable(sc.path("t")).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})
    sc.update("t", {"v": "99"}, "k = 1")                      # written without a change feed
    run_job(spark, job)
    _assert_recovered(spark, job, before)
    write_deltalake(str(tmp_path / "plain"), pa.table(ROWS))   # created without it
    fresh = job_for("fresh", SQL, [{"source_name": "src", "name": "t", "relation": "src.t",
                                    "meta": {"location": str(tmp_path / "plain")}}], "g", tmp_path)
    run_job(spark, fresh)
    DeltaTable(str(tmp_path / "plain")).delete("k = 2")
    run_job(spark, fresh)
    _assert_recovered(spark, fresh)


def test_vacuumed_source_versions_name_the_versions_and_full_refresh(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    sc.insert("t", pa.table({"k": [4, 5], "g": ["c", "c"], "v": [1, 2]}))
    sc.delete("t", "k = 4")                                    # rewrites the file version 1 added
    DeltaTable(sc.path("t")).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    with pytest.raises(SourceError, match=r"src/t for versions 1\.\.\d+: .*vacuumed.*--full-refresh"):
        run_job(spark, job)
    _assert_intact(job, before)
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job, before)


def test_cleaned_up_source_log_names_the_versions_and_full_refresh(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
    sc.update("t", {"v": "7"}, "k = 2")
    dt = DeltaTable(sc.path("t"))
    dt.create_checkpoint()
    log = os.path.join(sc.path("t"), "_delta_log")
    for v in range(dt.version()):                              # the commits before the checkpoint
        os.remove(os.path.join(log, f"{v:020d}.json"))
    with pytest.raises(SourceError, match=r"src/t: versions 1\.\.\d+ cannot be read: .*cleaned up.*--full-refresh"):
        run_job(spark, job)
    _assert_intact(job, before)
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job, before)


def test_source_column_added_goes_on_unless_the_model_reads_it(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    star = sc.job("select * from src.t", "k", name="star")
    run_job(spark, star, full_refresh=True)
    star_before = _history(star)
    write_deltalake(sc.path("t"), pa.table({"k": [4], "g": ["b"], "v": [5], "w": [1]}), mode="append",
                    schema_mode="merge")
    summary = run_job(spark, job)                              # does not read w: incremental
    assert summary["batches"] == 1 and summary["strategies"] == ["incremental"]
    _assert_recovered(spark, job, before)
    with pytest.raises(ConfigError, match=r"(?s)on_schema_change is 'fail'.*src\.t.*column w.*added.*"
                                          r"--full-refresh -s star"):
        run_job(spark, _with(star, on_schema_change="fail"))
    _assert_intact(star, star_before)
    assert run_job(spark, star)["configuration_change"]["action"] == "apply"   # dbt's default: rebuilt
    _assert_recovered(spark, star, star_before)


def test_source_column_dropped_names_the_column_and_full_refresh(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    _overwrite(sc, "t", pa.table({"k": [1, 2, 3], "g": ["a", "a", "b"]}))
    with pytest.raises(ConfigError, match=r"(?s)src\.t .*column v \(bigint\) is gone \(dropped or renamed\).*"
                                          r"--full-refresh -s m"):
        run_job(spark, _with(job, on_schema_change="fail"))
    _assert_intact(job, before)
    fixed = _with(job, sql="select g, count(*) as n from src.t group by g")
    run_job(spark, fixed, full_refresh=True)
    _assert_recovered(spark, fixed, before)


def test_source_column_type_changed_names_both_types_and_full_refresh(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    _overwrite(sc, "t", pa.table({"k": [1, 2, 3], "g": ["a", "a", "b"], "v": [10.5, 20.0, 30.25]}))
    with pytest.raises(ConfigError, match=r"(?s)src\.t.*column v.*bigint.*double.*--full-refresh -s m"):
        run_job(spark, _with(job, on_schema_change="fail"))
    _assert_intact(job, before)
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job, before)


def test_source_column_renamed_names_the_old_and_new_column(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    _overwrite(sc, "t", pa.table({"k": [1, 2, 3], "g": ["a", "a", "b"], "amount": [10, 20, 30]}))
    with pytest.raises(ConfigError, match=r"(?s)src\.t .*column v \(bigint\) is gone \(dropped or renamed; its new "
                                          r"columns: amount\).*--full-refresh -s m"):
        run_job(spark, _with(job, on_schema_change="fail"))
    _assert_intact(job, before)
    fixed = _with(job, sql="select g, count(*) as n, sum(amount) as s from src.t group by g")
    run_job(spark, fixed, full_refresh=True)
    _assert_recovered(spark, fixed, before)


def test_duplicate_source_primary_key_fails_the_batch_naming_the_source_key(spark, tmp_path):
    """The declared primary key is trusted to infer the target's key; a duplicate shows up as
    two output rows for one key, and the message points at the source's primary_key."""
    sc, job, before = _model(spark, tmp_path, sql="select k, g, v from src.t", key=None)
    sc.insert("t", pa.table({"k": [1], "g": ["z"], "v": [99]}))
    with pytest.raises(UniqueKeyViolation, match=r"key \{'k': 1\}.*src\.t \['k'\].*primary_key.*--full-refresh -s m"):
        run_job(spark, job)
    _assert_intact(job, before)
    sc.delete("t", "g = 'z'")                                  # the source fixed
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job, before)


def test_nulls_in_a_source_key_and_in_join_and_group_keys_follow_sql(spark, tmp_path):
    """A NULL primary key value is one key value (merged with IS NOT DISTINCT FROM); NULL join
    keys match nothing and NULL group keys form one group, as in batch SQL."""
    sc = Scenario(spark, tmp_path, {
        "t": pa.table({"k": [1, 2, 3], "g": ["a", None, "b"], "v": [10, 20, 30]}),
        "d": pa.table({"g": ["a", "b", None], "label": ["A", "B", "N"]}),
    }, {"t": ["k"], "d": ["g"]})
    job = sc.job("select t.k, t.g, d.label, t.v from src.t t left join src.d d on t.g = d.g", None)
    grouped = sc.job(SQL, "g", name="grouped")
    run_job(spark, job, full_refresh=True)
    run_job(spark, grouped, full_refresh=True)
    before, grouped_before = _history(job), _history(grouped)
    sc.insert("t", pa.table({"k": [None, 4], "g": [None, None], "v": [5, 6]}, schema=pa.schema(
        [("k", pa.int64()), ("g", pa.string()), ("v", pa.int64())])))
    sc.update("t", {"v": "7"}, "k IS NULL")
    run_job(spark, job)
    run_job(spark, grouped)
    _assert_recovered(spark, job, before)
    _assert_recovered(spark, grouped, grouped_before)


# ---- the target -------------------------------------------------------------------------------
def test_deleted_target_fails_naming_it_and_full_refresh_rebuilds_it(spark, tmp_path):
    sc, job, _ = _model(spark, tmp_path)
    shutil.rmtree(job.target_path)
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
    with pytest.raises(CommitError, match=r"target .*targets/m does not exist.*checkpoint.*--full-refresh -s m"):
        run_job(spark, job)
    assert not os.path.exists(job.target_path)                 # nothing half-made in its place
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job)


def test_target_written_by_someone_else_fails_naming_the_commit_and_full_refresh(spark, tmp_path):
    sc, job, _ = _model(spark, tmp_path)
    write_deltalake(job.target_path, pa.table({"g": ["x"], "n": [1], "s": [1]}), mode="append")
    before = _history(job)                                     # the foreign version is kept too
    with pytest.raises(CommitError, match=r"targets/m.*version 1 .*not written by.*--full-refresh -s m"):
        run_job(spark, job)                                    # no source change: still refused
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
    with pytest.raises(CommitError, match=r"targets/m.*version 1 .*not written by"):
        run_job(spark, job)
    _assert_intact(job, before)
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job, before)


# ---- the checkpoint ---------------------------------------------------------------------------
def test_deleted_checkpoint_rebuilds_the_target_from_the_snapshots(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    shutil.rmtree(job.checkpoint_location)
    sc.update("t", {"v": "5"}, "k = 3")
    summary = run_job(spark, job)                              # a new query: its first batch rebuilds
    assert summary["strategies"] == ["recompute"] and summary["target_version"] == max(before) + 1
    _assert_recovered(spark, job, before)


@pytest.mark.parametrize("damage", ["emptied", "cut short", "not a record"])
def test_damaged_query_record_names_the_file_and_full_refresh(spark, tmp_path, damage):
    sc, job, before = _model(spark, tmp_path)
    path = Path(job.query_path)
    path.write_text({"emptied": "", "cut short": path.read_text()[:9], "not a record": "[1, 2]"}[damage])
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
    with pytest.raises(CommitError, match=r"_consistent_stream/query\.json.*damaged.*--full-refresh -s m"):
        run_job(spark, job)
    _assert_intact(job, before)
    run_job(spark, job, full_refresh=True)
    _assert_recovered(spark, job, before)


def test_checkpoint_of_another_model_is_refused_even_with_full_refresh(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    other = _with(sc.job("select g, max(v) as top from src.t group by g", "g", name="other"),
                  checkpoint_location=job.checkpoint_location)   # config checkpoint_location copied
    for full_refresh in (False, True):
        with pytest.raises(ConfigError, match=r"checkpoint_location .*m__checkpoint holds the checkpoint of "
                                              r"model m .*own checkpoint_location"):
            run_job(spark, other, full_refresh=full_refresh)
    assert not os.path.exists(other.target_path)
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
    run_job(spark, job)                                        # model m's checkpoint was left alone
    _assert_recovered(spark, job, before)
    run_job(spark, _with(other, checkpoint_location=other.target_path + "__checkpoint"))
    _assert_recovered(spark, other)


def test_changed_sql_or_sources_without_full_refresh_name_the_model_and_full_refresh(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    changed_sql = _with(job, sql=SQL.replace("sum(v)", "max(v)"))
    shutil.copytree(sc.path("t"), str(tmp_path / "copy"))
    moved = [s.__class__(**{**s.__dict__, "location": str(tmp_path / "copy")}) for s in job.sources]
    for changed in (changed_sql, _with(job, sources=moved)):
        with pytest.raises(ConfigError, match=r"(?s)model m: its definition changed .*on_configuration_change is "
                                              r"'fail'.*--full-refresh -s m"):
            run_job(spark, _with(changed, on_configuration_change="fail"))
        _assert_intact(job, before)
    run_job(spark, changed_sql, full_refresh=True)
    _assert_recovered(spark, changed_sql, before)


def test_unique_key_violated_by_the_sql_fails_the_batch_and_a_fixed_key_replays_it(spark, tmp_path):
    sql = "select g, h, count(*) as n from src.t group by g, h"
    sc, job, before = _model(spark, tmp_path, sql=sql, key="g",
                             rows={"k": [1, 2, 3], "g": ["a", "a", "b"], "h": ["x", "x", "y"]})
    sc.insert("t", pa.table({"k": [4], "g": ["a"], "h": ["z"]}))
    with pytest.raises(UniqueKeyViolation, match=r"model m: unique_key \['g'\] is not unique: key \{'g': 'a'\}"):
        run_job(spark, job)
    _assert_intact(job, before)
    fixed = _with(job, unique_key=["g", "h"])                  # the config fixed: the batch is replayed
    assert run_job(spark, fixed)["batches"] == 1
    _assert_recovered(spark, fixed, before)


# ---- the machine ------------------------------------------------------------------------------
def test_read_only_location_root_names_the_path_and_writes_nothing(spark, tmp_path):
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "32m")
    try:
        sc = Scenario(spark, tmp_path / "s", {"t": pa.table(ROWS)}, {"t": ["k"]})
        job = _at_root(sc.job(SQL, "g"), str(mnt))
        run_job(spark, job, full_refresh=True)
        before = _history(job)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
        with pytest.raises(ConsistentStreamError, match=rf"model m: cannot write {mnt}.*Read-only file system.*"
                                                        r"location_root.*writable"):
            run_job(spark, job)
        _assert_intact(job, before)
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
        run_job(spark, job)
        _assert_recovered(spark, job, before)
    finally:
        _umount(mnt)


def test_disk_full_during_the_target_commit_commits_nothing_and_the_next_run_replays(spark, tmp_path,
                                                                                      monkeypatch):
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "32m")
    try:
        sc = Scenario(spark, tmp_path / "s", {"t": pa.table(ROWS)}, {"t": ["k"]})
        job = _at_root(sc.job(SQL, "g"), str(mnt))
        run_job(spark, job, full_refresh=True)
        before = _history(job)
        sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
        filler = mnt / "filler"
        real_commit = runtime.commit_changes

        def fill_then_commit(*a, **k):                         # the state is committed; fill the disk
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
                except OSError as e:
                    assert e.errno == errno.ENOSPC
            return real_commit(*a, **k)
        monkeypatch.setattr(runtime, "commit_changes", fill_then_commit)
        with pytest.raises(ConsistentStreamError, match=rf"model m: cannot write .*{mnt}.*: No space left on device.*"
                                                        r"run again"):
            run_job(spark, job)
        monkeypatch.undo()
        _assert_intact(job, before)
        os.remove(filler)
        assert run_job(spark, job)["batches"] == 1                # the batch is replayed and committed
        _assert_recovered(spark, job, before)
    finally:
        _umount(mnt)


LOSE_JVM = textwrap.dedent("""
    import os, signal, sys
    import consistent_stream
    import consistent_stream.job as J
    import consistent_stream.query as Q
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    from consistent_stream.spec import JobSpec
    spark = (with_delta(SparkSession.builder, master="local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    real = Q.process_batch

    def lose_the_jvm(*a, **k):                                 # mid-batch: the cut is read, nothing written
        os.kill(jvm_pid, signal.SIGKILL)
        return real(*a, **k)
    Q.process_batch = lose_the_jvm
    try:
        J.run_job(spark, JobSpec.load(sys.argv[1]))
    except BaseException as e:
        print("ERROR", type(e).__name__, str(e)[:2000], flush=True)
        os._exit(3)
    os._exit(0)
""")


def test_spark_session_lost_mid_batch_commits_nothing_and_the_next_run_recovers(spark, tmp_path):
    sc, job, before = _model(spark, tmp_path)
    sc.update("t", {"v": "11"}, "k = 1")
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [1]}))
    spec = tmp_path / "job.json"
    spec.write_text(job.to_json())
    r = subprocess.run([sys.executable, "-c", LOSE_JVM, str(spec)], capture_output=True, text=True, timeout=240,
                       start_new_session=True)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    assert "Spark session" in r.stdout and "run again" in r.stdout, r.stdout
    _assert_intact(job, before)
    assert run_job(spark, job)["batches"] == 1                    # the lost batch, replayed
    _assert_recovered(spark, job, before)
