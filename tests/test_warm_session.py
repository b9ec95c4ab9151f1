"""A warm session (``warm_session: true`` on a ``method: session`` profile;
:mod:`consistent_stream.warm_session`): the first `dbt run` starts a local Spark Connect server
with the profile's confs in the project's directory, later runs are its Connect clients and
start no JVM, and the server goes when it is idle, is stopped, or other confs need its place.
Real servers (pyspark's ``SparkConnectServer``), real dbt processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consistent_stream import warm_session
from consistent_stream.daemons import process_alive
from consistent_stream.delta import DeltaTableRef
from consistent_stream.storage import load_json
from consistent_stream.verify import index_path, verify_target
from helpers import dbt_watched, example_copy, example_env, tpch_refresh

BIN = Path(sys.executable).parent


@pytest.fixture
def warm_dir(tmp_path, monkeypatch):
    d = tmp_path / "warm"
    monkeypatch.setenv("CONSISTENT_STREAM_WARM_DIR", str(d))
    yield d
    for server in d.glob("*"):
        warm_session.stop(directory=server)


def _old(server: warm_session.WarmServer, seconds: float) -> None:
    """Make ``server``'s last client ``seconds`` old."""
    t = time.time() - seconds
    os.utime(Path(server.dir, warm_session.HEARTBEAT), (t, t))


def _gone(server: warm_session.WarmServer, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(server.server_pid) and not process_alive(server.supervisor_pid):
            return True
        time.sleep(0.2)
    return False


_CLIENT = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
spark.sql("CREATE TABLE w (x INT) USING delta")
spark.sql("INSERT INTO w VALUES (1)")
print(spark.conf.get("spark.sql.catalog.spark_catalog"), spark.conf.get("spark.sql.catalogImplementation"),
      spark.sql("SELECT x FROM w").collect()[0].x)
try:   # without the server's token: refused
    SparkSession.builder.remote(sys.argv[2]).create().sql("SELECT 1").collect()
    print("served")
except Exception as e:
    print("refused" if "UNAUTHENTICATED" in str(e) or "authenticat" in str(e).lower() else repr(e)[:300])
"""


def test_a_server_is_reused_kept_while_in_use_replaced_when_idle_and_stopped_after_its_idle_time(warm_dir, tmp_path):
    cwd = tmp_path / "project"
    cwd.mkdir()
    gone = tmp_path / "gone"      # a temporary project's server, stopped, its directory removed since
    gone.mkdir()
    stale = warm_session.server_dir(gone)
    stale.mkdir(parents=True)
    (stale / "confs.json").write_text(json.dumps({"cwd": str(gone), "confs": {}, "idle_s": 1}))
    gone.rmdir()
    confs = {"spark.master": "local[1]", "spark.sql.warehouse.dir": "spark-warehouse",
             "spark.sql.session.timeZone": "UTC"}
    first = warm_session.ensure(confs, cwd, idle_s=600)
    assert not stale.exists()   # pruned when a server starts
    try:
        assert warm_session.ensure(confs, cwd).server_pid == first.server_pid   # reused
        # the server is the session the profile's confs describe: Delta's catalog, Hive's, in
        # cwd (a client of its own process: pyspark's remote() marks the whole process as Connect)
        out = subprocess.run([sys.executable, "-c", _CLIENT, first.url, first.address], capture_output=True,
                             text=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"})
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split() == ["org.apache.spark.sql.delta.catalog.DeltaCatalog", "hive", "1", "refused"], \
            out.stdout
        assert (cwd / "spark-warehouse" / "w" / "_delta_log").is_dir() and (cwd / "metastore_db").is_dir()

        # other confs while a client used it within two heartbeats: refused, naming the conf
        warm_session.touch(first)
        other = {**confs, "spark.sql.shuffle.partitions": "3"}
        with pytest.raises(warm_session.WarmSessionError, match=r"in use.*spark\.sql\.shuffle\.partitions.*"
                                                                 r"warm-session stop"):
            warm_session.ensure(other, cwd)
        with pytest.raises(warm_session.WarmSessionError, match="in use"):
            warm_session.release(cwd)
        assert process_alive(first.server_pid)

        # idle: replaced by a server with the new confs (the old one stopped first: one Derby)
        _old(first, 3 * warm_session.HEARTBEAT_S)
        second = warm_session.ensure(other, cwd, idle_s=3)
    finally:
        warm_session.stop(cwd)
    assert _gone(first)
    assert second.server_pid != first.server_pid and second.confs["spark.sql.shuffle.partitions"] == "3"
    # (stop above ended the second too; start it once more to see the idle timeout)
    third = warm_session.ensure(other, cwd, idle_s=3)
    assert warm_session.status(cwd)["running"]
    _old(third, 10)
    assert _gone(third, timeout_s=30), "the supervisor did not stop an idle server"
    assert not warm_session.status(cwd)["running"] and warm_session.load(third.dir) is None
    assert "idle for" in Path(third.dir, "supervisor.log").read_text()


def test_dbt_runs_after_the_first_reuse_the_warm_session_and_start_no_jvm(warm_dir, spark, tmp_path):
    project, schema, data = example_copy(tmp_path, "warm")
    assert "warm_session: true" in (project / "profiles.yml").read_text()
    env = example_env(project, data, CONSISTENT_STREAM_WARM_DIR=str(warm_dir))

    rc, out, _ = dbt_watched(project, env, "run", "--full-refresh", target="warm")
    assert rc == 0, out[-6000:]
    assert "PASS=7" in out, out[-3000:]   # 5 models, a view, the on-run-start hook
    server = warm_session.load(warm_session.server_dir(project))
    assert server is not None and server.alive() and server.cwd == os.path.realpath(project)

    # a refresh round's run: a client of the server (the run after it, dbt test, is another)
    tpch_refresh(data, 1)
    rc, out, started = dbt_watched(project, env, "run", target="warm")
    assert rc == 0, out[-6000:]
    assert "java" not in started, started          # no JVM of its own: the server's session
    assert warm_session.load(server.dir).server_pid == server.server_pid
    newest = {t: DeltaTableRef(str(data / t)).latest_version() for t in ("orders", "lineitem", "customer")}
    for model in ("customer_order_totals", "q3_revenue_per_order", "nation_revenue"):
        target = DeltaTableRef(load_json(index_path(str(project), model))["target_path"])
        res = verify_target(spark, target.path, model=model)
        assert res.ok, (model, res.to_json())
        assert all(res.base_cut[f"tpch.{t}"] == v for t, v in newest.items() if f"tpch.{t}" in res.base_cut)

    # dbt test over the same server, then the CLI stops it
    rc, out, started = dbt_watched(project, env, "test", target="warm")
    assert rc == 0 and "java" not in started, out[-3000:]
    p = subprocess.run([str(BIN / "consistent-stream"), "warm-session", "stop", "--project-dir", str(project)],
                       env=env, capture_output=True, text=True, check=True)
    assert str(server.server_pid) in p.stdout
    assert _gone(server)
    p = subprocess.run([str(BIN / "consistent-stream"), "warm-session", "status", "--project-dir", str(project)],
                       env=env, capture_output=True, text=True, check=True)
    assert '"running": false' in p.stdout
