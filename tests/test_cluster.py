"""The same models on a Spark standalone cluster (one master, two workers, started from
pyspark's distribution on 127.0.0.1): the driver plans and commits, the workers' executors run
the tasks, and every committed version equals batch evaluation at its cut."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from consistent_stream_testing import cluster
from consistent_stream.daemons import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    c = cluster.start(workers=2, cores_per_worker=1, memory_per_worker="1g", port=free_port(),
                      webui_port=free_port(), directory=d)
    yield c
    cluster.stop(d)


def test_the_cluster_has_two_alive_workers_on_the_loopback_address(standalone):
    s = cluster.status(standalone.dir)
    assert s["running"] and s["master_url"].startswith("spark://127.0.0.1:")
    assert [w["state"] for w in s["workers"]] == ["ALIVE", "ALIVE"]
    assert {w["host"] for w in s["workers"]} == {"127.0.0.1"}


def test_a_second_start_from_the_same_directory_is_refused(standalone):
    with pytest.raises(cluster.ClusterError, match="is running"):
        cluster.start(workers=1, directory=standalone.dir, port=free_port(), webui_port=free_port())


def test_a_port_in_use_is_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(cluster.ClusterError, match=f"port {s.getsockname()[1]} .* in use"):
            cluster.start(workers=1, port=s.getsockname()[1], webui_port=free_port(), directory=tmp_path)


def test_joins_and_aggregates_on_the_cluster_match_batch_evaluation_at_every_version(standalone, tmp_path):
    # the driver in a process of its own (this process's SparkSession is local), as dbt's
    # would be: TPC-H SF 0.01, q3 (a 3-way join + GROUP BY: join and aggregate state), the
    # initial build then three refresh rounds. The initial build's 76,675 source rows would
    # rebuild on the driver: driver_rebuild_rows 0 sends it to the executors
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "cluster_vs_local.py"), "--one", "--master",
         standalone.master_url, "--label", "cluster", "--sf", "0.01", "--root", str(tmp_path), "--rounds", "3",
         "--models", "q3_revenue_per_order", "--driver-rebuild-rows", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in recs] == ["initial_build", "refresh_round_1", "refresh_round_2", "refresh_round_3"]
    assert recs[0]["strategies"] == ["recompute: first batch of the query"], recs[0]   # not "on the driver"
    for r in recs:
        assert r["versions_wrong"] == [], r
        assert r["versions_verified"] == len(r["versions"]), r
        assert r["versions"], r  # every round changes orders, so every model commits
    # the tasks ran in the workers' executors (ids are never "driver"), on both workers
    tasks = cluster.executor_tasks(standalone.dir)
    busy = {t["worker"] for t in tasks if t["tasks_finished"] > 0}
    assert busy == {"worker-1", "worker-2"}, tasks


def test_a_web_ui_that_answers_json_with_html_is_not_taken_for_the_masters_state(tmp_path):
    """While the master's web UI starts, ``/json/`` may be served by the HTML page at ``/``
    (it happened once in the suite): that is "not answering yet", a ClusterError that
    ``start`` waits out, not a JSONDecodeError that ends it."""
    import http.server
    import threading

    class Html(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = b"<!DOCTYPE html><html><body>Spark Master</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        c = cluster.Cluster(str(tmp_path), "spark://127.0.0.1:1", f"http://127.0.0.1:{server.server_port}", 1, 1, "1g")
        with pytest.raises(cluster.ClusterError, match=r"answered /json/ with no JSON .*master\.log"):
            c.master_state(timeout=2.0)
    finally:
        server.shutdown()
