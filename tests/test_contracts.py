"""dbt contracts and constraints on a consistent_stream target (consistent_stream.sink.constraints):
an enforced contract is checked against the SQL's output before anything is written; not_null
and check constraints fail the batch that violates them, naming the rows, with nothing of it
committed (and again when it is replayed: same source versions); a full refresh after the
data is fixed recovers. Real Spark, real Delta."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from consistent_stream.errors import ConfigError, ConstraintViolation
from consistent_stream.job import run_job
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation
from scenario import Scenario

SQL = "select g, count(*) as n, sum(v) as s, max(note) as note from src.t group by g"
CONTRACT = [{"name": "g", "data_type": "string"}, {"name": "n", "data_type": "bigint"},
            {"name": "s", "data_type": "bigint"}, {"name": "note", "data_type": "string"}]


def _with(job, **changes) -> JobSpec:
    return JobSpec(**{**job.__dict__, **changes})


@pytest.fixture()
def scenario(spark, tmp_path):
    return Scenario(spark, tmp_path, {"t": pa.table({"k": [1, 2, 3], "g": ["a", "a", "b"], "v": [10, 20, 30],
                                                     "note": ["x", "y", "z"]})}, {"t": ["k"]})


def test_an_enforced_contract_that_differs_from_the_output_fails_before_anything_is_written(spark, scenario):
    job = scenario.job(SQL, "g")
    wrong = CONTRACT[:1] + [{"name": "n", "data_type": "int"}, {"name": "total", "data_type": "bigint"}] + CONTRACT[3:]
    with pytest.raises(ConfigError, match=r"(?s)model m: its contract is enforced and does not match.*"
                                          r"\| n \| bigint \| int \| data type mismatch \|.*"
                                          r"\| s \| bigint \| - \| missing in the contract \|.*"
                                          r"\| total \| - \| bigint \| missing in the model's output \|"):
        run_job(spark, _with(job, contract=wrong))
    assert not DeltaTable.is_deltatable(job.target_path)
    with pytest.raises(ConfigError, match=r"\| s \| bigint \| long integer \| Spark cannot parse this data_type \|"):
        run_job(spark, _with(job, contract=CONTRACT[:2] + [{"name": "s", "data_type": "long integer"}] + CONTRACT[3:]))
    # Spark's spellings of one type are one type (long = bigint, STRING = string)
    same = [{"name": "G", "data_type": "STRING"}, {"name": "n", "data_type": "long"}] + CONTRACT[2:]
    run_job(spark, _with(job, contract=same))
    assert_target_equals_batch_evaluation(spark, job, "contract kept")


def test_a_batch_violating_not_null_or_check_fails_naming_the_rows_and_commits_nothing(spark, scenario):
    constraints = [{"type": "not_null", "columns": ["note"], "expression": None, "name": None},
                   {"type": "check", "columns": [], "expression": "s < 1000", "name": "small_sums"}]
    job = _with(scenario.job(SQL, "g"), contract=CONTRACT, constraints=constraints)
    run_job(spark, job, full_refresh=True)
    before = DeltaTable(job.target_path).version()
    scenario.insert("t", pa.table({"k": [4, 5], "g": ["c", "b"], "v": [1, 2000], "note": [None, "w"]}))
    with pytest.raises(ConstraintViolation, match=r"(?s)model m: the batch's rows violate the constraint\(s\) "
                                                  r"not_null on \['note'\]; small_sums: check \(s < 1000\); nothing "
                                                  r"of the batch was committed(?=.*\{'g': 'c', 'n': 1, 's': 1, "
                                                  r"'note': None\})(?=.*\{'g': 'b', 'n': 2, 's': 2030, "
                                                  r"'note': 'z'\})"):
        run_job(spark, job)
    assert DeltaTable(job.target_path).version() == before
    with pytest.raises(ConstraintViolation):   # replayed as planned: the same source versions, the same rows
        run_job(spark, job)
    assert DeltaTable(job.target_path).version() == before
    scenario.update("t", {"note": "'fixed'"}, "k = 4")
    scenario.update("t", {"v": "20"}, "k = 5")
    assert run_job(spark, job, full_refresh=True)["batches"] == 1
    assert_target_equals_batch_evaluation(spark, job, "data fixed")
    scenario.insert("t", pa.table({"k": [6], "g": ["a"], "v": [1], "note": ["ok"]}))
    assert run_job(spark, job)["strategies"] == ["incremental"]      # a batch within the constraints commits
    assert_target_equals_batch_evaluation(spark, job, "maintained")


def test_a_new_constraint_rebuilds_and_checks_the_rows_already_there(spark, scenario):
    job = scenario.job(SQL, "g")
    run_job(spark, job, full_refresh=True)
    before = DeltaTable(job.target_path).version()
    stricter = _with(job, constraints=[{"type": "check", "columns": [], "expression": "n < 2", "name": None}])
    with pytest.raises(ConfigError, match=r"(?s)constraints: none -> \['check \(n < 2\)'\]"):
        run_job(spark, _with(stricter, on_configuration_change="fail"))
    with pytest.raises(ConstraintViolation, match=r"(?s)check \(n < 2\).*'g': 'a'"):
        run_job(spark, stricter)            # on_configuration_change apply: the rebuild checks every row
    assert DeltaTable(job.target_path).version() == before
