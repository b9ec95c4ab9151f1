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

# The files that take minutes, in the order ``make test`` starts them. It runs ``-n 2 --dist
# loadfile --no-loadscope-reorder``: each of its two workers takes the next file in collection
# order when it is (almost) done with its last, so a long file taken late is the run's tail.
# xdist's default order (by number of tests) took the crash campaign (one test, 430 s) last,
# and the suite took 1,699 s (xdist's rule replayed on its per-test durations, ``--junitxml``:
# 1,684 s of work on one worker, 1,442 s on the other); this order, replayed the same way,
# 1,588 s, and a clean clone ran it in 1,651 s the same afternoon. Seconds per file on 2026-11-25:
# properties 622, crash campaign 430, cluster 293, bad inputs 234, writer lock 192, cost 191,
# TPC-H models 152, pgbench 147, chains 126, operators 90; the rest under 70 each. Since small
# rebuilds run on the driver (same machine, a faster day, old code against new): 1,664 s of
# test time against 1,364 s, the suite 843 s against 684-743 s; crash campaign 289, properties
# 281, cluster 138, pgbench 114, cost 94, writer lock 74, TPC-H models 62, bad inputs 49.
LONG_FIRST = ("test_properties.py", "test_crash_campaign.py", "test_cluster.py", "test_object_store.py",
              "test_kafka_debezium.py",
              "test_bad_inputs.py", "test_writer_lock.py", "test_cost.py", "test_tpch_models.py",
              "test_pgbench_consistency.py", "test_chains.py", "test_cdf_schema_changes.py", "test_operators.py",
              "test_float_sums.py", "test_compare.py")


def pytest_collection_modifyitems(config, items):
    """Start the long files first (``LONG_FIRST``); the others keep their collection order."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    wh = tmp_path_factory.mktemp("warehouse")
    s = (with_delta(SparkSession.builder).master("local[2]").appName("consistent-stream-tests")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.warehouse.dir", str(wh))
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
