"""Sources whose Delta protocol needs a reader feature the engine cannot read exactly.

Databricks turns deletion vectors on for every new table (Runtime 14.1+): the table's
protocol then lists the ``deletionVectors`` reader feature. Here delta-rs itself (a real
writer) adds that feature to a source's protocol, as such a table has it. A run must refuse
the source with a SourceError that names it, the table, the feature and what to do, never
blame the model's SQL, and write nothing."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.table import TableFeatures

from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import CompileError, SourceError
from consistent_stream.job import run_job
from scenario import Scenario

SQL = "select o.cust, count(*) as n, sum(o.amount) as amount from src.orders o group by o.cust"


def _orders(ids) -> pa.Table:
    return pa.table({"o_id": pa.array(ids, pa.int64()), "cust": pa.array([i % 3 for i in ids], pa.int64()),
                     "amount": pa.array([10 * i for i in ids], pa.int64())})


def _add_deletion_vectors(path: str) -> None:
    DeltaTable(path).alter.add_feature([TableFeatures.DeletionVectors], allow_protocol_versions_increase=True)
    assert "deletionVectors" in (DeltaTable(path).protocol().reader_features or [])


def _assert_refused(e: pytest.ExceptionInfo, sc: Scenario) -> None:
    msg = str(e.value)
    assert not isinstance(e.value, CompileError) and "model SQL" not in msg, msg
    assert "src.orders" in msg and sc.path("orders") in msg and "deletionVectors" in msg, msg
    assert "DROP FEATURE deletionVectors" in msg and "nothing was read or written" in msg, msg


def test_a_source_with_deletion_vectors_is_refused_naming_the_source_not_the_sql(spark, tmp_path):
    sc = Scenario(spark, tmp_path / "dv_first", {"orders": _orders(range(1, 20))}, {"orders": ["o_id"]})
    _add_deletion_vectors(sc.path("orders"))
    job = sc.job(SQL, "cust")
    with pytest.raises(SourceError) as e:
        run_job(spark, job)
    _assert_refused(e, sc)
    assert not DeltaTableRef(job.target_path).exists()


def test_deletion_vectors_turned_on_after_a_run_stop_the_next_run_before_it_reads(spark, tmp_path):
    sc = Scenario(spark, tmp_path / "dv_later", {"orders": _orders(range(1, 20))}, {"orders": ["o_id"]})
    job = sc.job(SQL, "cust")
    sc.run(job)
    sc.insert("orders", _orders([20, 21]))
    before = DeltaTableRef(job.target_path).latest_version()
    _add_deletion_vectors(sc.path("orders"))
    with pytest.raises(SourceError) as e:
        run_job(spark, job)
    _assert_refused(e, sc)
    assert DeltaTableRef(job.target_path).latest_version() == before
