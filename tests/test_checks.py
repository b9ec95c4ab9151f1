"""The checks themselves can fail: the central check (``helpers.assert_target_equals_batch_
evaluation``) rejects an engine that stalls (a test double that commits nothing new, only a
fresh batch at the old cut), a target whose rows were tampered with (a row added, a value
changed by a cent, a timestamp moved by a microsecond), and a target whose column type
differs from the model's; the same check passes on the untouched target."""
from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from consistent_stream.delta import DeltaTableRef, Txn
from consistent_stream.runtime import BatchMeta
from helpers import assert_same_rows, assert_target_equals_batch_evaluation
from scenario import Scenario

T0 = datetime.datetime(2024, 3, 1, 12, 0, 0, 123456, tzinfo=datetime.timezone.utc)
SQL = "select k, sum(amt) as amt, max(at) as last_at, count(*) as n from src.t group by k"


def _table(ks, amts, ats) -> pa.Table:
    return pa.table({"id": pa.array(range(1, len(ks) + 1), pa.int64()), "k": pa.array(ks, pa.int64()),
                     "amt": pa.array([decimal.Decimal(a) for a in amts], pa.decimal128(9, 2)),
                     "at": pa.array(ats, pa.timestamp("us", tz="UTC"))})


@pytest.fixture()
def built(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {"t": _table([1, 1, 2], ["1.25", "2.50", "3.00"],
                                                [T0, T0 + datetime.timedelta(seconds=1), T0])}, {"t": ["id"]})
    job = sc.job(SQL, "k")
    sc.run(job, full_refresh=True)
    return sc, job


def _stalled_run(job) -> None:
    """A test double of an engine that stalls: it commits the next batch of its query at the
    cut of the last one (no data change), as if no source had changed."""
    target = DeltaTableRef(job.target_path)
    meta = BatchMeta.from_commit(target.latest_commit())
    nxt = BatchMeta(**{**meta.__dict__, "batch_id": meta.batch_id + 1})
    target.commit_empty(txn=Txn(meta.app_id, nxt.batch_id), metadata=nxt.to_metadata())


def test_a_stalled_engine_fails_the_central_check(spark, built):
    sc, job = built
    sc.insert("t", _table([3], ["4.00"], [T0]).set_column(0, "id", pa.array([10], pa.int64())))
    _stalled_run(job)
    with pytest.raises(AssertionError, match="changes were not taken in"):
        assert_target_equals_batch_evaluation(spark, job, "stalled")
    sc.run(job, full_refresh=True)   # the real engine (a new query) takes it in: the check passes


@pytest.mark.parametrize("tamper", ["extra_row", "value_by_a_cent", "timestamp_by_a_microsecond", "decimal_as_double"])
def test_a_tampered_target_fails_the_comparison(spark, built, tamper):
    sc, job = built
    assert_target_equals_batch_evaluation(spark, job, "untouched")
    dt = DeltaTable(job.target_path)
    meta = {k: v for k, v in (dt.history(1)[0].items()) if k.startswith("consistent_stream.")}
    from deltalake import CommitProperties
    props = CommitProperties(custom_metadata=meta)   # the tampering keeps the batch's metadata
    if tamper == "extra_row":
        row = dt.to_pyarrow_table().slice(0, 1).set_column(0, "k", pa.array([99], pa.int64()))
        write_deltalake(job.target_path, row, mode="append", commit_properties=props)
    elif tamper == "value_by_a_cent":
        dt.update(updates={"amt": "amt + 0.01"}, predicate="k = 2", commit_properties=props)
    elif tamper == "timestamp_by_a_microsecond":
        dt.update(updates={"last_at": "last_at + INTERVAL '1 microsecond'"}, predicate="k = 2",
                  commit_properties=props)
    else:
        t = dt.to_pyarrow_table()
        t = t.set_column(t.column_names.index("amt"), "amt", t.column("amt").cast(pa.float64()))
        write_deltalake(job.target_path, t, mode="overwrite", schema_mode="overwrite", commit_properties=props)
    with pytest.raises(AssertionError, match="differs|rows !=|types"):
        assert_target_equals_batch_evaluation(spark, job, tamper, at_latest=False)


def test_the_comparison_tells_types_apart():
    day = datetime.date(2024, 3, 1)
    with pytest.raises(AssertionError, match="differs"):
        assert_same_rows(pa.table({"d": [day]}), pa.table({"d": [datetime.datetime(2024, 3, 1)]}), "date vs ts")
    with pytest.raises(AssertionError, match="differs"):
        assert_same_rows(pa.table({"x": ["1"]}), pa.table({"x": [1]}), "string vs number")
    with pytest.raises(AssertionError, match="columns"):
        assert_same_rows(pa.table({"x": [1], "extra": [2]}), pa.table({"x": [1]}), "extra column")
    assert_same_rows(pa.table({"x": pa.array([decimal.Decimal("1.50")], pa.decimal128(9, 2))}),
                     pa.table({"x": pa.array([decimal.Decimal("1.5")], pa.decimal128(20, 1))}), "same decimal")
