"""Sources whose Delta protocol needs a reader feature neither engine reads (here type
widening, which delta-spark writes and this project does not read yet).

A run must refuse the source with a SourceError that names it, the table, the feature and what
to do, never blame the model's SQL, and write nothing; a feature turned on after a run stops
the next run before it reads. (Deletion vectors, column mapping and v2 checkpoints are read:
``test_spark_written_sources.py``.)"""
from __future__ import annotations

import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import CompileError, SourceError
from consistent_stream.job import run_job
from spark_written import SparkWritten

WIDENING = "ALTER TABLE {orders} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')"


def _assert_refused(e: pytest.ExceptionInfo, sw: SparkWritten) -> None:
    msg = str(e.value)
    assert not isinstance(e.value, CompileError) and "model SQL" not in msg, msg
    assert "src.orders" in msg and sw.path("orders") in msg and "typeWidening" in msg, msg
    assert "DROP FEATURE" in msg and "nothing was read or written" in msg, msg


def test_a_source_with_a_feature_neither_engine_reads_is_refused_naming_the_source_not_the_sql(spark, tmp_path):
    sw = SparkWritten(spark, tmp_path / "widening_first", "'delta.enableTypeWidening' = 'true'")
    job = sw.job()
    with pytest.raises(SourceError) as e:
        run_job(spark, job)
    _assert_refused(e, sw)
    assert not DeltaTableRef(job.target_path).exists()


def test_a_feature_turned_on_after_a_run_stops_the_next_run_before_it_reads(spark, tmp_path):
    sw = SparkWritten(spark, tmp_path / "widening_later", "'delta.enableDeletionVectors' = 'true'")
    job = sw.job()
    run_job(spark, job)
    sw.sql("INSERT INTO {orders} VALUES (500, 1, 5, 'w')")
    before = DeltaTableRef(job.target_path).latest_version()
    sw.sql(WIDENING)
    with pytest.raises(SourceError) as e:
        run_job(spark, job)
    _assert_refused(e, sw)
    assert DeltaTableRef(job.target_path).latest_version() == before
