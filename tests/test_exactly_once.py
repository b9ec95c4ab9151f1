"""The exactly-once protocol: replays of committed batches change nothing, and a crash
between the state commit and the target commit is repaired by the next run, which replays
that batch at the cut its state commit recorded."""
from __future__ import annotations


import pyarrow as pa
import pytest

import consistent_stream.runtime as runtime
from consistent_stream.delta import DeltaTableRef
from consistent_stream.sources import Cut
from helpers import delta_pandas
from scenario import Scenario

SQL = """
select c.id, c.name, count(o.oid) as orders, sum(o.amount) as total
from src.customers c left join src.orders o on c.id = o.cid
group by c.id, c.name
"""


def _scenario(spark, tmp_path):
    return Scenario(spark, tmp_path, {
        "customers": pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "cy"]}),
        "orders": pa.table({"oid": [10, 11, 12], "cid": [1, 1, 2], "amount": [5, 7, 1]}),
    }, {"customers": ["id"], "orders": ["oid"]})


def test_replaying_a_committed_batch_leaves_the_target_unchanged(spark, tmp_path):
    sc = _scenario(spark, tmp_path)
    job = sc.job(SQL, "id")
    sc.run(job, full_refresh=True)
    sc.insert("orders", pa.table({"oid": [13], "cid": [3], "amount": [4]}))
    sc.run(job)
    target = DeltaTableRef(job.target_path)
    version = target.latest_version()
    before = delta_pandas(job.target_path)
    meta = target.commit_at(version).metadata

    # 1. the batch function called again for batch 1 with the same cuts: skipped
    from consistent_stream.job import compile_job
    compiled, schema, types = compile_job(spark, job, Cut.from_json(meta["cut"]))
    query = runtime.QueryRuntime(spark, job, compiled, schema, types)
    res = query.process_batch(meta["app_id"], 1, Cut({k: -1 for k in meta["cut"]}), Cut.from_json(meta["cut"]))
    assert res.skipped and target.latest_version() == version

    # 2. a run finds batch 1 committed: nothing to do, nothing written
    from consistent_stream.job import run_job
    summary = run_job(spark, job)
    assert summary["up_to_date"] and summary["batches"] == 0
    assert target.latest_version() == version
    assert delta_pandas(job.target_path).sort_values("id").equals(before.sort_values("id"))

    # and the query goes on exactly from there
    sc.delete("orders", "oid = 10")
    sc.run(job)
    assert target.latest_version() == version + 1


def test_crash_after_state_commit_before_target_commit_is_repaired_by_replay(spark, tmp_path, monkeypatch):
    sc = _scenario(spark, tmp_path)
    job = sc.job(SQL, "id")
    sc.run(job, full_refresh=True)
    target = DeltaTableRef(job.target_path)
    version = target.latest_version()
    sc.update("orders", {"amount": "100"}, "oid = 11")
    sc.insert("orders", pa.table({"oid": [14], "cid": [2], "amount": [3]}))

    def crash(*a, **k):
        raise RuntimeError("injected crash before the target commit")
    monkeypatch.setattr(runtime, "commit_changes", crash)
    from consistent_stream.job import run_job
    with pytest.raises(RuntimeError, match="injected crash"):
        run_job(spark, job)
    assert target.latest_version() == version  # nothing visible
    app_id = target.commit_at(version).metadata["app_id"]
    assert DeltaTableRef(job.state_root).txn_version(app_id) == 1  # the state committed batch 1

    monkeypatch.undo()
    # the sources move on meanwhile: the replay still ends at batch 1's planned cut (what its
    # committed state reflects), and a second batch takes the new change
    planned = DeltaTableRef(sc.path("orders")).latest_version()
    sc.insert("orders", pa.table({"oid": [15], "cid": [3], "amount": [9]}))
    summary = sc.run(job)  # batch 1 replayed: state commit skipped, target committed once; then batch 2
    assert summary["batches"] == 2
    assert runtime.BatchMeta.from_commit(target.commit_at(version + 1)).cut["src.orders"] == planned
    assert target.latest_version() == version + 2
    assert DeltaTableRef(job.state_root).txn_version(app_id) == 2
    sc.delete("orders", "oid = 12")
    sc.run(job)
