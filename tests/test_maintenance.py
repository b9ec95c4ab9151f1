"""Table maintenance: after many small batches the target's and the state's logs have a
checkpoint and are cleaned below it, superseded state (and, under a short retention, target)
files are gone, processed cut files are gone, and the view still equals batch evaluation;
a restart continues from the checkpoint, and a replay that needs the state version the
target's last commit recorded still finds it."""
from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import consistent_stream.runtime as runtime
import consistent_stream.sink.maintenance as maintenance
from consistent_stream.delta import DeltaTableRef
from consistent_stream.job import run_job
from consistent_stream.runtime import BatchMeta
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation, job_for, model_ref
from scenario import Scenario

SQL = """
select c.id, c.name, count(*) as orders, sum(o.amount) as total
from src.customers c join src.orders o on c.id = o.cid
group by c.id, c.name
"""


def _scenario(spark, root):
    return Scenario(spark, root, {
        "customers": pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "cy"]}),
        "orders": pa.table({"oid": [10, 11, 12], "cid": [1, 1, 2], "amount": [5, 7, 1]}),
    }, {"customers": ["id"], "orders": ["oid"]})


def _log_versions(table: str) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(os.path.join(table, "_delta_log")) if n.endswith(".json"))


def _checkpoints(table: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(table, "_delta_log")) if n.endswith(".checkpoint.parquet")]


def _data_files(table: str) -> set[str]:
    out = set()
    for root, dirs, names in os.walk(table):
        dirs[:] = [d for d in dirs if not d.startswith("_") or "=" in d]   # partitions, not the log, CDF, catalog
        out |= {os.path.relpath(os.path.join(root, n), table) for n in names if n.endswith(".parquet")}
    return out




def _files_of(table: str, version: int) -> set[str]:
    return set(DeltaTable(table, version=version).get_add_actions(flatten=True).column("path").to_pylist())


def test_many_small_batches_leave_checkpointed_logs_and_no_superseded_files(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(maintenance, "EVERY_BATCHES", 3)
    sc = _scenario(spark, tmp_path)
    job = JobSpec(**{**sc.job(SQL, "id").__dict__, "checkpoint_interval": 5, "log_retention_hours": 0,
                     "deleted_file_retention_hours": 0, "state_retention_versions": 2})
    sc.run(job, full_refresh=True)
    continuous = JobSpec(**{**job.__dict__, "trigger": "processing_time:0.2"})

    def writer():  # about 40 small source commits in 6 s
        for i in range(20):
            sc.insert("orders", pa.table({"oid": [100 + i], "cid": [i % 3 + 1], "amount": [i]}))
            sc.update("orders", {"amount": f"{i}"}, f"oid = {10 + i % 3}")
            time.sleep(0.2)
    w = threading.Thread(target=writer)
    w.start()
    summary = run_job(spark, continuous, timeout_s=12)
    w.join()
    sc.insert("orders", pa.table({"oid": [99], "cid": [3], "amount": [9]}))
    monkeypatch.setattr(maintenance, "EVERY_BATCHES", 1)
    run_job(spark, job)  # the rest: at least one batch, and a pass after it (every batch is due now)
    target, state = job.target_path, job.state_root
    versions = DeltaTableRef(target).latest_version()
    assert summary["batches"] >= 4, summary["batches"]

    # both logs have a checkpoint and nothing below the newest one (retention 0)
    assert _checkpoints(target) and _checkpoints(state)
    assert _log_versions(target)[0] > 0 and _log_versions(state)[0] > 0
    # the state keeps the files of its last two versions, no others
    sv = BatchMeta.from_commit(DeltaTableRef(target).latest_commit()).state_version
    assert _data_files(state) <= _files_of(state, sv) | _files_of(state, sv - 1)
    # the target (deleted-file retention 0) keeps its live files and those the batches after
    # the last pass (at most EVERY_BATCHES of them) superseded, none older
    superseded = _data_files(target) - _files_of(target, versions)
    assert len(superseded) <= maintenance.EVERY_BATCHES, (superseded, versions)
    # the target was created with the model's retention as Delta's, so its checkpoints list only
    # the tombstones of files removed within deleted_file_retention_hours (0: about a second),
    # not every file the run ever removed
    conf = DeltaTable(target).metadata().configuration
    assert conf["delta.deletedFileRetentionDuration"] == "interval 1 seconds", conf
    assert conf["delta.logRetentionDuration"] == "interval 1 seconds", conf
    # and both tables with the model's checkpoint interval, which delta-rs' own hook keeps as
    # the run commits (maintenance only catches up on a table made without it)
    assert conf["delta.checkpointInterval"] == str(job.checkpoint_interval), conf
    state_conf = DeltaTable(state).metadata().configuration
    assert state_conf["delta.checkpointInterval"] == str(job.checkpoint_interval), state_conf
    assert state_conf["delta.deletedFileRetentionDuration"] == maintenance.STATE_TOMBSTONE_RETENTION, state_conf
    # (checked by age, not by count: at five batches a second, a second's tombstones are five)
    newest = os.path.join(target, "_delta_log", max(_checkpoints(target)))
    tombstones = [r for r in pq.read_table(newest, columns=["remove"]).column("remove").to_pylist() if r]
    written_ms = os.stat(newest).st_mtime * 1000
    old = [r["path"] for r in tombstones if r["deletionTimestamp"] < written_ms - 1000 - 2000]
    assert not old, (old, len(tombstones), versions)
    # no scratch directory is left
    assert not os.listdir(os.path.join(job.checkpoint_location, "scratch")) \
        if os.path.isdir(os.path.join(job.checkpoint_location, "scratch")) else True
    assert_target_equals_batch_evaluation(spark, job, job.model)

    # a restart opens both tables from their checkpoints and goes on
    sc.delete("orders", "oid = 11")
    sc.update("customers", {"name": "'bo'"}, "id = 2")
    again = sc.run(job)
    assert again["batches"] == 1 and again["target_version"] == versions + 1
    assert DeltaTableRef(target).latest_version() == versions + 1


def test_a_downstream_replay_finds_the_state_version_the_target_recorded(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(maintenance, "EVERY_BATCHES", 1)
    sc = _scenario(spark, tmp_path)
    keep1 = {"state_retention_versions": 1, "checkpoint_interval": 2}
    up = JobSpec(**{**sc.job(SQL, "id").__dict__, **keep1})
    sc.run(up, full_refresh=True)
    down = JobSpec(**{**job_for("d", "select orders, count(*) as n, sum(total) as s from tests.m group by orders",
                                [model_ref("m", tmp_path)], "orders", tmp_path).__dict__, **keep1})
    for i in range(6):  # checkpoints (interval 2), state vacuumed to one version after every batch
        sc.insert("orders", pa.table({"oid": [100 + i], "cid": [i % 3 + 1], "amount": [i]}))
        sc.run(up)
        sc.run(down)
    assert _checkpoints(up.state_root) and _checkpoints(down.state_root)
    down_target = DeltaTableRef(down.target_path)
    before = down_target.latest_version()

    # the downstream dies after its state commit, before its target commit ...
    sc.update("orders", {"amount": "50"}, "oid = 10")
    sc.run(up)

    def crash(*a, **k):
        raise RuntimeError("injected crash before the target commit")
    monkeypatch.setattr(runtime, "commit_changes", crash)
    with pytest.raises(RuntimeError, match="injected crash"):
        run_job(spark, down)
    monkeypatch.undo()
    monkeypatch.setattr(maintenance, "EVERY_BATCHES", 1)
    assert down_target.latest_version() == before
    # ... and Spark's replay reads the upstream's changes and its own state at the version the
    # target's last commit recorded (kept by maintenance) and commits the batch once
    summary = sc.run(down)
    assert summary["batches"] == 1 and down_target.latest_version() == before + 1
    assert_target_equals_batch_evaluation(spark, down, down.model)
