"""dbt's adapter conformance suite (``dbt-tests-adapter``) against ``type: consistent_spark``.

The profile is dbt-spark's ``session`` method: dbt runs in this process on the test
process's one SparkSession. The session-scoped ``spark`` fixture of tests/conftest.py starts
it first (local[2], a temporary warehouse, an in-memory catalog), so its static confs are the
same whether this directory runs alone or inside ``pytest tests``; the profile sets only
runtime confs, to the values that fixture set, so nothing leaks into other tests. dbt's
``project`` fixture gives every test class a schema of its own and drops it at the end.

dbt's fixtures come from ``pytest_plugins`` in tests/conftest.py.
"""
from __future__ import annotations

import os

import pytest
from dbt_common.tests import disable_test_caching

RUNTIME_CONFS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
}


@pytest.fixture(scope="session", autouse=True)
def _spark_started_by_the_tests(spark):
    """dbt-spark's session method then finds this session (``getOrCreate``)."""
    return spark


@pytest.fixture(scope="package", autouse=True)
def _dbt_test_caching_off_afterwards(spark):
    """dbt's ``project`` fixture turns on its parse caches for the process; the tests after
    this directory run dbt as users do. And the temporary views dbt's unit tests leave in the
    session (``<test>__dbt_tmp``) are dropped: every later ``listTables`` would show them."""
    yield
    disable_test_caching()
    for table in spark.catalog.listTables():
        if table.isTemporary:
            spark.catalog.dropTempView(table.name)


@pytest.fixture(scope="class")
def dbt_profile_target():
    # A new dict per class: dbt's ``dbt_profile_data`` writes the class's schema into it.
    return {
        "type": "consistent_spark",
        "method": "session",
        "host": "NA",
        "schema": "overwritten_by_unique_schema",
        "threads": 1,
        "server_side_parameters": dict(RUNTIME_CONFS),
    }


@pytest.fixture(scope="class")
def logs_dir(tmp_path_factory):
    """dbt's logs in a temporary directory instead of ``<rootdir>/logs`` (dbt's default)."""
    path = str(tmp_path_factory.mktemp("dbt_logs"))
    os.environ["DBT_LOG_PATH"] = path
    yield path
    del os.environ["DBT_LOG_PATH"]
