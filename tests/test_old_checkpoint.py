"""A checkpoint written by an earlier release is still read: the next run goes on from it
incrementally (same query, same txn app id), not with a rebuild.

The fixture (``fixtures/old_checkpoint.tar.gz``, made by ``fixtures/make_old_checkpoint.py``
with the release its ``made_by.json`` names) holds two Delta sources, the target and the
checkpoint (job spec, fingerprint, plan, translations, operator state, Spark's checkpoint and
cut log) after a rebuild and one incremental batch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from decimal import Decimal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from consistent_stream.delta import DeltaTableRef
from consistent_stream.job import run_job
from consistent_stream.runtime import BatchMeta
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = "/tmp/consistent-stream-old-checkpoint"   # where the fixture was made: checkpoints hold absolute paths


def _unpack() -> JobSpec:
    shutil.rmtree(ROOT, ignore_errors=True)
    subprocess.run(["tar", "-xzf", os.path.join(HERE, "fixtures", "old_checkpoint.tar.gz"), "-C",
                    os.path.dirname(ROOT)], check=True)
    with open(os.path.join(ROOT, "made_by.json")) as f:
        assert json.load(f)["commit"], "the fixture names the release that made it"
    return JobSpec.load(os.path.join(ROOT, "t", "old_m__checkpoint", "_consistent_stream", "job.json"))


def test_a_checkpoint_of_an_earlier_release_is_resumed_incrementally(spark):
    job = _unpack()
    target = DeltaTableRef(job.target_path)
    before = BatchMeta.from_commit(target.latest_commit())
    assert before is not None and before.batch_id == 1

    # nothing changed: the old checkpoint says the target is up to date; the target is
    # registered as a Delta table, and the hard-link snapshot directory the old release
    # published is removed
    snapshots = os.path.join(job.target_path, "_consistent_stream", "snapshots")
    assert os.path.isdir(snapshots)
    assert run_job(spark, job)["up_to_date"]
    assert not os.path.exists(snapshots)
    assert spark.table(f"{job.schema}.{job.identifier}").count() == target.num_records(target.version())

    orders = os.path.join(ROOT, "src", "orders")
    write_deltalake(orders, pa.table({"o_id": pa.array([43, 44], pa.int64()), "cust": pa.array([4, 6], pa.int64()),
                                      "amount": pa.array([Decimal("120.50"), Decimal("-3.00")],
                                                         pa.decimal128(12, 2))}), mode="append")
    DeltaTable(orders).update(updates={"amount": "amount + 1"}, predicate="cust = 5")
    DeltaTable(os.path.join(ROOT, "src", "customers")).update(updates={"region": "'east'"}, predicate="c_id = 1")
    summary = run_job(spark, job)
    assert summary["batches"] == 1 and summary["strategies"] == ["incremental"], summary
    after = BatchMeta.from_commit(target.latest_commit())
    assert after.app_id == before.app_id and after.batch_id == before.batch_id + 1
    assert_target_equals_batch_evaluation(spark, job, "old checkpoint resumed")
    shutil.rmtree(ROOT, ignore_errors=True)
