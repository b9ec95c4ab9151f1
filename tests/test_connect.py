"""consistent_stream models with dbt as a Spark Connect client (``method: connect``): the
example project (TPC-H SF 0.01: a view, a model on a model, aggregates and joins over Delta
sources) against a real Spark Connect server on a one-worker standalone cluster on loopback
(``consistent-stream-testing cluster start --connect-port``). dbt runs as a process of its own, as a
user's would; nothing in it may start a JVM (its descendants are watched while it runs). A
refresh round's run is SIGKILLed between the state and the target commit of a batch, and the
next run must lose nothing and apply nothing twice: every committed version of every model is
verified against batch evaluation at its cut, in this process's own classic session. Spark's
share goes over Connect as it would at scale: the initial build on the executors
(``driver_rebuild_rows: 0``), the last round's delta queries as Spark queries (``local_engine:
spark``), the others in the client's DuckDB."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consistent_stream_testing import cluster
from consistent_stream.daemons import free_port
from consistent_stream.delta import DeltaTableRef
from consistent_stream.storage import load_json
from consistent_stream.verify import index_path, verify_target
from helpers import dbt_watched, descendants, example_copy, example_env, tpch_refresh

BIN = Path(sys.executable).parent
MODELS = ("q3_revenue_per_order", "q1_pricing_summary", "customer_order_totals", "order_revenue", "nation_revenue")


# The server's tasks per stage sized to its one core, as the tests' own session sizes its
# shuffles (conftest.py): at Spark's 200 shuffle partitions and delta-spark's 50 partitions of
# a table's log state, each of dbt's small queries was hundreds of tasks on one core, and the
# test took 174 s alone where it takes 131 s so (2026-12-06). What runs is the same either way;
# ``make demo-connect`` runs the example at the server's defaults.
SERVER_CONF = {"spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"}


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("connect_cluster")
    c = cluster.start(workers=1, cores_per_worker=1, memory_per_worker="1g", port=free_port(),
                      webui_port=free_port(), connect_port=free_port(), directory=d, connect_conf=SERVER_CONF)
    yield c
    cluster.stop(d)


def _configure(project: Path, **configs) -> None:
    """Set model configs for every model of ``project`` (its dbt_project.yml)."""
    import yaml
    path = project / "dbt_project.yml"
    d = yaml.safe_load(path.read_text())
    d["models"][d["name"]].update({f"+{k}": v for k, v in configs.items()})
    path.write_text(yaml.safe_dump(d, sort_keys=False))


def test_the_example_project_over_spark_connect_with_no_jvm_in_dbt_and_a_killed_run(connect_server, spark, tmp_path):
    project, schema, data = example_copy(tmp_path, "connect")
    assert "method: connect" in (project / "profiles.yml").read_text()
    _configure(project, driver_rebuild_rows=0)
    env = example_env(project, data, SPARK_REMOTE=connect_server.connect_url)

    # the initial build: every model, view and data test (dbt's own statements) over Connect
    rc, out, started = dbt_watched(project, env, "build", "--full-refresh", target="connect")
    assert rc == 0, out[-6000:]
    assert "PASS=28" in out, out[-3000:]   # 21 data tests, 5 models, a view, the on-run-start hook
    assert "java" not in started, started

    # a refresh round whose run is killed after a batch's state commit, before its target
    # commit (the second batch committed in the run), then run again
    tpch_refresh(data, 1)
    rc, out, started = dbt_watched(project, {**env, "CONSISTENT_STREAM_FAULT": "state_committed@2"}, "run",
                                   target="connect")
    assert rc == -signal.SIGKILL, (rc, out[-4000:])
    assert "java" not in started, started
    rc, out, started = dbt_watched(project, env, "run", target="connect")
    assert rc == 0, out[-6000:]
    assert "java" not in started, started
    tpch_refresh(data, 2)
    _configure(project, local_engine="spark")
    rc, out, started = dbt_watched(project, env, "run", target="connect")
    assert rc == 0, out[-6000:]
    assert "incremental" in out and "java" not in started, (out[-3000:], started)

    # every committed version equals batch evaluation at its cut; the last is at the sources' newest
    newest = {t: DeltaTableRef(str(data / t)).latest_version() for t in ("orders", "lineitem", "customer")}
    for model in MODELS:
        target = DeltaTableRef(load_json(index_path(str(project), model))["target_path"])
        last = target.latest_version()
        assert last >= 2, (model, last)   # the build and both rounds committed (the killed run's batch once)
        for v in range(last + 1):
            res = verify_target(spark, target.path, version=v, model=model)
            assert res.ok, (model, v, res.to_json())
        cut = verify_target(spark, target.path, model=model).base_cut
        for t, version in newest.items():
            if f"tpch.{t}" in cut:
                assert cut[f"tpch.{t}"] == version, (model, cut, newest)


def test_the_watch_of_a_process_tree_sees_grandchildren():
    # what the check above relies on: a process started by a child of the watched one
    proc = subprocess.Popen(["bash", "-c", "sleep 2 & wait"])
    try:
        deadline = time.time() + 5
        while "sleep" not in descendants(proc.pid).values() and time.time() < deadline:
            time.sleep(0.05)
        assert "sleep" in descendants(proc.pid).values()
    finally:
        proc.wait()


_CLIENT = r"""
import json, logging, sys
from pyspark.sql.connect.session import SparkSession
from consistent_stream import metrics
from consistent_stream.changelog import Views
from consistent_stream.connect import default_parallelism, is_connect, sql_over
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
out = {"connect": is_connect(spark)}
# a view's DataFrame outlives the views: Connect analyzes it at the action, after drop()
views = Views(spark)
name = views.add(spark.range(5).selectExpr("id AS k", "id * 10 AS v"))
df = views.sql(f"SELECT k, v, '{{x}} }}' AS text FROM {name} WHERE k < 3")
views.drop()
out["rows"] = sorted(tuple(r) for r in df.collect())
out["views_left"] = [t.name for t in spark.catalog.listTables() if t.isTemporary]
out["parallelism"] = default_parallelism(spark)
# progress from Connect's handler, no job count
metrics.PROGRESS_AFTER_S = metrics.PROGRESS_EVERY_S = 0.0
lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
metrics.progress_log.addHandler(handler)
metrics.progress_log.setLevel(logging.INFO)
with metrics.counted_jobs(spark, "m batch 0") as jobs:
    # tasks that take seconds whatever the machine (Connect reports progress every 2 s, and a
    # quick query's only report is its last, done one): 4 tasks of 2.5 s on the worker's core
    spark.range(0, 4, 1, 4).selectExpr("reflect('java.lang.Thread', 'sleep', CAST(2500 AS BIGINT))").collect()
    out["jobs"] = jobs()
out["progress"] = lines[:3]
print(json.dumps(out))
"""


def test_queries_over_connect_carry_their_frames_and_report_progress_without_a_spark_context(connect_server):
    proc = subprocess.run([sys.executable, "-c", _CLIENT, connect_server.connect_url], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert out["connect"] is True
    # the rows, with the braces of a string literal kept as written
    assert [r[:2] for r in out["rows"]] == [[0, 0], [1, 10], [2, 20]]
    assert all(r[2] == "{x} }" for r in out["rows"]), out["rows"]
    assert out["views_left"] == [], out
    assert out["parallelism"] == 2   # the SparkContext's default on a cluster: max(its cores (1), 2)
    assert out["jobs"] is None
    assert out["progress"] and all(line.startswith("m batch 0: running for") for line in out["progress"]), out


def test_a_connect_profile_keeps_its_token_out_of_host_and_an_unreachable_server_fails_fast(monkeypatch):
    from dbt.adapters.consistent_spark.connect import reach
    from dbt.adapters.consistent_spark.connections import ConsistentSparkCredentials
    from dbt.adapters.exceptions.connection import FailedToConnectError
    from dbt_common.exceptions import DbtRuntimeError

    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:1/;token=s3cret;user_id=me")
    creds = ConsistentSparkCredentials.from_dict({"method": "connect", "schema": "s"})
    # host (what `dbt debug` prints) holds no token; the connection string has it all
    assert creds.host == creds.unique_field == "sc://127.0.0.1:1" and creds.token == "s3cret"
    assert creds.connect_url() == "sc://127.0.0.1:1/;user_id=me;token=s3cret"
    creds = ConsistentSparkCredentials.from_dict({"method": "connect", "schema": "s", "host": "sc://h:2",
                                                  "token": "t", "use_ssl": True})
    assert creds.connect_url() == "sc://h:2/;token=t;use_ssl=true"
    t0 = time.time()
    with pytest.raises(FailedToConnectError, match="127.0.0.1:1.*start-connect-server.sh.*on port 1\\)") as e:
        reach("sc://127.0.0.1:1")
    assert time.time() - t0 < 5 and "s3cret" not in str(e.value)
    with pytest.raises(DbtRuntimeError, match="not a Spark Connect address"):
        ConsistentSparkCredentials.from_dict({"method": "connect", "schema": "s", "host": "http://h:2"})
