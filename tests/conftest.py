"""One SparkSession per test process (real local Spark, no mocks), shared by all tests."""
from __future__ import annotations

import os
import sys

import pytest

import consistent_stream  # noqa: F401  (sets PYSPARK_PYTHON for Spark's Python workers)

sys.path.insert(0, os.path.dirname(__file__))

# dbt's functional-test fixtures (``project``, ``unique_schema``, ``models``, ...) for the
# adapter conformance suite in tests/functional. pytest refuses ``pytest_plugins`` in a
# conftest it finds while collecting (``pytest tests`` finds tests/functional/conftest.py so),
# so it is declared here. They are only fixtures: a module that defines one of the same name
# (test_dbt_plugin.py's ``project``) uses its own.
pytest_plugins = ["dbt.tests.fixtures.project"]


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession
    wh = tmp_path_factory.mktemp("warehouse")
    s = (SparkSession.builder.master("local[2]").appName("consistent-stream-tests")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.warehouse.dir", str(wh))
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
