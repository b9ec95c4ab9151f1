"""``on_configuration_change`` and ``on_schema_change`` (consistent_stream.config_change): a
model whose SQL, sources, unique_key, partition_by or target changed since its checkpoint is
rebuilt (``apply``, dbt's default), kept as it is (``continue``) or fails naming the changes
(``fail``); drift of a source's schema counts only when the model reads the column.

Real Spark (the shared session), real Delta tables; every committed version is checked to
stay readable as it was, and every rebuilt view equals batch evaluation of the new SQL.
"""
from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from consistent_stream.errors import ConfigError
from consistent_stream.job import run_job
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation
from scenario import Scenario

SQL = "select g, count(*) as n, sum(v) as s from src.t group by g"
ROWS = {"k": [1, 2, 3], "g": ["a", "a", "b"], "v": [10, 20, 30]}


def _with(job, **changes) -> JobSpec:
    return JobSpec(**{**job.__dict__, **changes})


def _history(job) -> dict[int, list]:
    latest = DeltaTable(job.target_path).version()
    return {v: sorted(map(repr, DeltaTable(job.target_path, version=v).to_pyarrow_table().to_pylist()))
            for v in range(latest + 1)}


@pytest.fixture()
def model(spark, tmp_path):
    sc = Scenario(spark, tmp_path, {"t": pa.table(ROWS)}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    run_job(spark, job, full_refresh=True)
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [5]}))
    return sc, job


def test_changed_sql_is_rebuilt_by_default_and_the_summary_names_the_change(spark, model):
    sc, job = model
    before = _history(job)
    changed = _with(job, sql=SQL.replace("sum(v)", "max(v)"))
    summary = run_job(spark, changed)
    assert summary["configuration_change"]["action"] == "apply"
    [change] = summary["configuration_change"]["changes"]
    assert change.startswith("sql:") and "-select g, count(*) as n, sum(v) as s" in change \
        and "+select g, count(*) as n, max(v) as s" in change
    assert summary["full_refresh"] and summary["batches"] == 1
    assert_target_equals_batch_evaluation(spark, changed, "rebuilt")
    after = _history(job)
    assert {v: after[v] for v in before} == before              # time travel to the old view still works
    sc.insert("t", pa.table({"k": [5], "g": ["a"], "v": [100]}))
    again = run_job(spark, changed)                             # and the new definition is maintained
    assert "configuration_change" not in again and again["strategies"] == ["incremental"]
    assert_target_equals_batch_evaluation(spark, changed, "maintained")


def test_continue_keeps_the_view_and_its_checkpoint_as_they_are(spark, model):
    sc, job = model
    before = _history(job)
    changed = _with(job, sql=SQL.replace("sum(v)", "max(v)"), on_configuration_change="continue")
    summary = run_job(spark, changed)
    assert summary["configuration_change"]["action"] == "continue" and summary["batches"] == 0
    assert summary["target_version"] == max(before)
    assert _history(job) == before
    # the checkpoint still holds the old definition: with it, the run goes on incrementally
    summary = run_job(spark, job)
    assert summary["batches"] == 1 and summary["strategies"] == ["incremental"]
    assert_target_equals_batch_evaluation(spark, job, "old definition")


def test_fail_names_every_change_and_writes_nothing(spark, model, tmp_path):
    sc, job = model
    before = _history(job)
    shutil.copytree(sc.path("t"), str(tmp_path / "copy"))
    moved = [s.__class__(**{**s.__dict__, "location": str(tmp_path / "copy")}) for s in job.sources]
    for change, expected in [
        ({"unique_key": ["g", "n"]}, r"unique_key: \['g'\] -> \['g', 'n'\]"),
        ({"partition_by": ["g"]}, r"partition_by: none -> \['g'\]"),
        ({"sources": moved}, r"sources: src\.t delta \S+/src/t primary_key \['k'\] -> delta \S+/copy primary_key"),
    ]:
        with pytest.raises(ConfigError, match=rf"(?s)model m: its definition changed since the checkpoint .* "
                                              rf"on_configuration_change is 'fail':\n  - {expected}.*Nothing was "
                                              rf"read or written.*--full-refresh -s m"):
            run_job(spark, _with(job, **change, on_configuration_change="fail"))
        assert _history(job) == before


def test_a_new_target_location_is_built_there_and_the_old_target_left_as_it_is(spark, model, tmp_path):
    sc, job = model
    before = _history(job)
    moved = _with(job, target_path=str(tmp_path / "elsewhere" / "m"), on_configuration_change="fail")
    summary = run_job(spark, moved)      # a new relation, as dbt creates one whatever the config says
    assert summary["configuration_change"]["changes"][0].startswith("target: ")
    assert_target_equals_batch_evaluation(spark, moved, "new location")
    assert _history(job) == before


def test_partition_by_change_is_applied_to_the_delta_table(spark, model):
    sc, job = model
    changed = _with(job, partition_by=["g"])
    assert run_job(spark, changed)["configuration_change"]["action"] == "apply"
    assert DeltaTable(job.target_path).metadata().partition_columns == ["g"]
    assert_target_equals_batch_evaluation(spark, changed, "partitioned")
    sc.update("t", {"v": "v + 1"}, "k = 1")
    assert run_job(spark, changed)["strategies"] == ["incremental"]
    assert_target_equals_batch_evaluation(spark, changed, "partitioned, maintained")


def test_source_drift_of_a_read_column_follows_on_schema_change(spark, model):
    sc, job = model
    before = _history(job)
    write_deltalake(sc.path("t"), pa.table({"k": [1, 2, 3, 4], "g": ["a", "a", "b", "c"],
                                            "v": [10.5, 20.0, 30.25, 5.0]}), mode="overwrite", schema_mode="overwrite")
    with pytest.raises(ConfigError, match=r"(?s)on_schema_change is 'fail':\n  - source_schema: src\.t \(\S+\): "
                                          r"column v changed type from bigint to double.*sync_all_columns"):
        run_job(spark, _with(job, on_schema_change="fail"))
    kept = run_job(spark, _with(job, on_configuration_change="continue"))  # ignore: on_configuration_change decides
    assert kept["configuration_change"]["action"] == "continue"
    assert _history(job) == before
    summary = run_job(spark, _with(job, on_schema_change="sync_all_columns", on_configuration_change="fail"))
    assert summary["configuration_change"]["action"] == "apply"
    assert summary["configuration_change"]["changes"][0].startswith("source_schema: src.t")
    assert_target_equals_batch_evaluation(spark, job, "rebuilt over the new types")


def test_source_drift_the_model_cannot_compile_against_fails_naming_the_drift(spark, model):
    sc, job = model
    before = _history(job)
    write_deltalake(sc.path("t"), pa.table({"k": [1], "g": ["a"], "amount": [1]}), mode="overwrite",
                    schema_mode="overwrite")
    with pytest.raises(ConfigError,
                       match=r"(?s)rebuilding the view after its definition changed failed.*"
                             r"column v \(bigint\) is gone \(dropped or renamed; its new columns: amount\)"):
        run_job(spark, job)
    assert _history(job) == before


def test_a_column_the_model_does_not_read_changes_nothing(spark, model):
    sc, job = model
    write_deltalake(sc.path("t"), pa.table({"k": [6], "g": ["a"], "v": [1], "note": ["new"]}), mode="append",
                    schema_mode="merge")
    summary = run_job(spark, _with(job, on_configuration_change="fail", on_schema_change="fail"))
    assert "configuration_change" not in summary and summary["strategies"] == ["incremental"]
    assert_target_equals_batch_evaluation(spark, job, "unused column added")


def test_invalid_policy_names_the_config_key(tmp_path):
    with pytest.raises(ConfigError, match=r"model m: config on_configuration_change must be one of apply, continue, "
                                          r"fail; got 'rebuild'"):
        JobSpec.from_dbt(project_root=str(tmp_path), schema="s", identifier="m", model_name="m", sql="select 1",
                         sources=[], config={"on_configuration_change": "rebuild"}, warehouse_dir=str(tmp_path))


def test_a_checkpoint_planned_with_other_operators_is_rebuilt_once(spark, model):
    # what a checkpoint of an earlier version looks like when that version recomputed a construct
    # this one maintains by a delta rule: its saved plan names other operators
    import json

    from consistent_stream import storage
    sc, job = model
    saved = storage.read_json(job.plan_path)
    types = json.loads(saved["types"])
    types["nodes"] = {k.replace("aggregate", "recompute"): v for k, v in types["nodes"].items()}
    storage.replace_text(job.plan_path, json.dumps({**saved, "types": json.dumps(types)}))
    summary = run_job(spark, job)
    assert summary["configuration_change"]["action"] == "apply" and summary["full_refresh"]
    [change] = summary["configuration_change"]["changes"]
    assert change.startswith("state_format:") and "recompute" in change, change
    assert_target_equals_batch_evaluation(spark, job, "rebuilt")
    sc.insert("t", pa.table({"k": [5], "g": ["a"], "v": [100]}))
    again = run_job(spark, job)
    assert "configuration_change" not in again and again["strategies"] == ["incremental"]
