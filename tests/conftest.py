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


def pytest_configure(config):
    # what runs on an object store keep on this machine (consistent_stream.local_cache): the
    # tests' own, not the account's, and inherited by the runs they start as processes
    import tempfile
    os.environ.setdefault("CONSISTENT_STREAM_CACHE_DIR", tempfile.mkdtemp(prefix="cs-test-cache-"))
    # the one DuckDB warning the package filters process-wide (consistent_stream.duck.arrow
    # reads results through execute on purpose); pytest resets filters around each test
    from consistent_stream.duck import COPY_WARNING
    config.addinivalue_line("filterwarnings", f"ignore:{COPY_WARNING}:UserWarning")


# The files that take minutes, in the order ``make test`` starts them. It runs ``-n 2 --dist
# loadfile --no-loadscope-reorder``: each of its two workers takes the next file in collection
# order when it is (almost) done with its last, so a long file taken late is the run's tail:
# longest first (but Debezium on Kafka, whose continuous runs' version counts depend on the
# load, where it ran in the runs that passed). Seconds per file in a run of the whole suite on
# 2026-12-02 (``--junitxml``, the two workers contending): Spark Connect 656, properties 550,
# Debezium on Kafka 541, TPC-DS 521 (3 rounds), decision-support properties 432, TPC-H queries
# 409 (5 rounds), warm session 312, crash campaign 283, window properties 196, object store
# 186, Spark-written sources 181, pgbench 168, session 161, cluster 152, writer lock 143; the
# rest under 95 each. The files of tests/functional stay where collection puts them: their
# package fixture turns dbt's caches off after the last of them.
LONG_FIRST = ("test_connect.py", "test_properties.py", "test_tpch_queries.py", "test_tpcds_queries.py",
              "test_decision_support_properties.py", "test_warm_session.py",
              "test_crash_campaign.py", "test_window_properties.py", "test_spark_written_sources.py", "test_cluster.py",
              "test_object_store.py", "test_kafka_debezium.py", "test_writer_lock.py", "test_pgbench_consistency.py",
              "test_tpch_models.py", "test_cost.py", "test_cdf_schema_changes.py", "test_dbt_refs.py",
              "test_example_project.py", "test_dbt_plugin.py", "test_dbt_end_to_end.py",
              "test_chains.py", "test_bad_inputs.py", "test_continuous.py", "test_kafka_stack.py", "test_float_sums.py",
              "test_maintenance.py", "test_operators.py")


def pytest_collection_modifyitems(config, items):
    """Start the long files first (``LONG_FIRST``); the others keep their collection order."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))


@pytest.fixture(scope="module", autouse=True)
def _jvm_caches_per_file():
    """After each test file, the shared session's caches emptied: delta-spark's DeltaLog cache
    (a snapshot and its cached state for every table the JVM opened, up to 10,000 tables for
    an hour) and Spark's cached DataFrames. A user's `dbt run` process opens a project's
    tables; the tests' one JVM opens thousands over half an hour. (Two CI runs' TPC-H check
    failed with Spark's "Not enough memory to build and broadcast the table": its cause was
    in that test, broadcast hash relations of 32 MiB each built four times a check, see
    ``verify.compare_frames``, not what earlier files left.)"""
    yield
    from pyspark.sql import SparkSession
    s = SparkSession.getActiveSession()
    if s is not None:
        s.catalog.clearCache()
        s._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    wh = tmp_path_factory.mktemp("warehouse")
    s = (with_delta(SparkSession.builder, master="local[2]").appName("consistent-stream-tests")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.warehouse.dir", str(wh))
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
