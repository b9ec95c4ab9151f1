"""A local Spark standalone cluster (one master, N workers) from pyspark's own distribution.

    consistent-stream-testing cluster start --workers 2     # prints the master URL
    consistent-stream-testing cluster status
    consistent-stream-testing cluster stop

pyspark's wheel ships ``bin/spark-class``; this module runs
``spark-class org.apache.spark.deploy.master.Master`` and, per worker,
``spark-class org.apache.spark.deploy.worker.Worker <master URL>``, each as a daemon in its own
process group, with its log, pid and work directory under ``--dir`` (default
``$CONSISTENT_STREAM_CLUSTER_DIR``, else ``<tmp>/consistent-stream-cluster-<uid>``).

Loopback by default: every daemon gets ``SPARK_LOCAL_IP=127.0.0.1`` and ``--host 127.0.0.1``,
so their RPC endpoints and web UIs (Spark's ``WebUI`` binds to ``SPARK_LOCAL_IP``) listen on
127.0.0.1, and so do the executors the workers launch (they inherit the worker's environment
and host name). A driver joins with ``spark.master=spark://127.0.0.1:<port>`` plus
``spark.driver.host`` / ``spark.driver.bindAddress`` = 127.0.0.1
(:func:`consistent_stream.session.driver_conf`; the example project's ``cluster`` target sets
them).

Nodes of their own: ``--host`` (the master's address), ``--worker-hosts`` (one address per
worker), ``--launcher`` (a command prefix each daemon's command line is run through, with
``{daemon}`` replaced by ``master``, ``worker-1`` ...) and ``--user`` (the account the daemons
run as; their work directories are its own, mode 0700) place each daemon where the launcher
puts it: ``make demo-cluster-s3`` runs each in a network namespace of its own
(``scripts/netns_cluster.sh exec cs-{daemon} --``) as an unprivileged user, sharing nothing
with the driver but the object store.

What the executors need, and have on this machine: the same Python (``PYSPARK_PYTHON``,
which ``import consistent_stream`` sets to the interpreter that has the package; the
driver sends it with every Python function), and the same paths (Delta tables, checkpoints
and the warehouse on a file system every node resolves: on the loopback cluster the local
one). On separate machines that means the package installed at the same path on every node
and table URIs on shared storage: an object store (``s3://``, whose connector jars the
session brings: :mod:`consistent_stream.session`), as ``make demo-cluster-s3`` shows with
nodes that share nothing else.

Errors: :class:`ClusterError` names what failed and the log to read (a port in use, a daemon
that exited, workers that did not register within the timeout).
"""
from __future__ import annotations

import json
import os
import pwd
import shlex
import socket
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from consistent_stream.daemons import process_alive
from consistent_stream.errors import ConsistentStreamError
# a driver's confs for a standalone cluster and pyspark's distribution are the engine's own
# (the CLI and warm sessions use them); re-exported for the cluster's callers
from consistent_stream.session import driver_conf, spark_home  # noqa: F401

from . import jvm

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"


class ClusterError(ConsistentStreamError):
    """The local standalone cluster could not be started, reached or stopped."""


def default_dir() -> Path:
    """Where the cluster keeps its pids, logs and work directories."""
    env = os.environ.get("CONSISTENT_STREAM_CLUSTER_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / f"consistent-stream-cluster-{os.getuid()}"


@dataclass
class Cluster:
    """A running cluster, as ``cluster.json`` in its directory records it."""
    dir: str
    master_url: str
    webui_url: str
    workers: int
    cores_per_worker: int
    memory_per_worker: str
    pids: dict[str, int] = field(default_factory=dict)  # daemon name -> pid (= its process group)
    connect_url: str | None = None  # sc://127.0.0.1:<port> when a Spark Connect server runs
    hosts: dict[str, str] = field(default_factory=dict)  # daemon name -> the address it binds
    launcher: str | None = None  # the command prefix of every daemon ({daemon}: its name)
    user: str | None = None  # the account the daemons run as (None: this process's)

    def save(self) -> None:
        jvm.write_state(Path(self.dir, STATE_FILE), asdict(self), indent=2)

    @classmethod
    def load(cls, directory: str | Path) -> "Cluster | None":
        state = jvm.read_state(Path(directory, STATE_FILE))
        return cls(**state) if state is not None else None

    def alive_pids(self) -> dict[str, int]:
        return {name: pid for name, pid in self.pids.items() if process_alive(pid)}

    def master_state(self, timeout: float = 2.0) -> dict:
        """The master's JSON status (``<web UI>/json/``): workers, their state, cores,
        applications. Raises ClusterError when the master does not answer, or answers with
        something else than JSON: while its web UI starts, ``/json/`` can be served by the
        HTML page at ``/`` (seen once in the suite, a second after "Bound MasterWebUI")."""
        try:
            with urllib.request.urlopen(self.webui_url.rstrip("/") + "/json/", timeout=timeout) as r:
                body = r.read().decode()
        except OSError as e:
            raise ClusterError(f"the cluster's master at {self.webui_url} does not answer ({e}); "
                               f"see {Path(self.dir, 'master.log')}") from e
        try:
            return json.loads(body)
        except ValueError:
            raise ClusterError(f"the cluster's master at {self.webui_url} answered /json/ with no JSON "
                               f"(starting, or another service on that port): {body[:80]!r}; see "
                               f"{Path(self.dir, 'master.log')}") from None


def _port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _env(directory: Path, host: str = HOST, user: str | None = None) -> dict[str, str]:
    """The environment of a daemon bound to ``host`` (run as ``user``: its HOME, USER)."""
    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON: the interpreter with the package)
    home = spark_home()
    env = dict(os.environ)
    if user is not None:
        pw = pwd.getpwnam(user)
        env.update({"HOME": pw.pw_dir, "USER": user, "LOGNAME": user})
    env.update({"SPARK_HOME": str(home), "SPARK_LOCAL_IP": host, "SPARK_LOG_DIR": str(directory),
                "SPARK_WORKER_DIR": str(directory / "work"), "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
                # the master's REST submission server (port 6066) is not needed: jobs come from drivers
                "SPARK_MASTER_OPTS": (os.environ.get("SPARK_MASTER_OPTS", "")
                                      + " -Dspark.master.rest.enabled=false").strip()})
    return env


def _prefix(name: str, launcher: str | None, user: str | None) -> list[str]:
    """The command prefix of daemon ``name``: ``launcher`` (``{daemon}`` replaced by ``name``),
    then a switch to ``user`` (util-linux ``setpriv``, which execs: the daemon keeps the pid
    and process group :func:`stop` signals)."""
    out = [a.replace("{daemon}", name) for a in shlex.split(launcher)] if launcher else []
    if user is not None:
        pw = pwd.getpwnam(user)
        out += ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--"]
    return out


def _spawn(name: str, args: list[str], directory: Path, env: dict[str, str], prefix: list[str] | None = None) -> int:
    return jvm.spawn([*(prefix or []), str(spark_home() / "bin" / "spark-class"), *args], directory / f"{name}.log",
                     env=env).pid


def _work_dir(d: Path, name: str, user: str | None) -> Path:
    """Worker ``name``'s work directory (its executors' logs and files), created; with
    ``user``, owned by that account, mode 0700 (no other account reads it)."""
    w = d / "work" / name
    w.mkdir(parents=True, exist_ok=True)
    if user is not None:
        pw = pwd.getpwnam(user)
        os.chown(w, pw.pw_uid, pw.pw_gid)
        w.chmod(0o700)
    return w


def _check_placement(user: str | None) -> None:
    """Raise ClusterError for a ``user`` that cannot be used (see :func:`start`)."""
    if user is not None:
        if os.geteuid() != 0:
            raise ClusterError(f"--user {user}: only root can start the daemons as another account")
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise ClusterError(f"--user {user}: no such account (create it, e.g. useradd --system {user})") from None


def start(*, workers: int = 2, cores_per_worker: int = 1, memory_per_worker: str = "2g", port: int = 7077,
          webui_port: int = 8080, connect_port: int | None = None, directory: str | Path | None = None,
          timeout_s: float = 60.0, host: str = HOST, worker_hosts: list[str] | None = None,
          launcher: str | None = None, user: str | None = None,
          connect_conf: dict[str, str] | None = None) -> Cluster:
    """Start a master and ``workers`` workers (each offering ``cores_per_worker`` cores and
    ``memory_per_worker`` for executors), and wait until every worker has registered with the
    master. With ``connect_port``, also a Spark Connect server
    (``org.apache.spark.sql.connect.service.SparkConnectServer`` from pyspark's
    ``spark-connect`` jar, through ``spark-submit``) whose driver runs on the cluster, listening
    on ``sc://<host>:<connect_port>`` (placed as the master is: ``launcher`` with ``{daemon}``
    = ``master``, as ``user``), with the project's jars, Delta's catalog and a Hive
    metastore (:func:`connect_server_conf`; ``connect_conf``: Spark confs of its own, e.g. the
    store's S3A settings). Returns the :class:`Cluster` (``master_url`` is what
    ``spark.master`` takes, ``connect_url`` what ``SparkSession.builder.remote`` takes).

    Where the daemons run: the master binds ``host`` (default 127.0.0.1), worker ``i`` binds
    ``worker_hosts[i - 1]`` (default ``host``; a list of ``workers`` addresses); each is
    started through ``launcher`` (a command prefix, ``{daemon}`` replaced by the daemon's
    name: ``master``, ``worker-1`` ...; e.g. ``ip netns exec cs-{daemon}``) and, with
    ``user`` (root only), as that account, its work directory its own. The ports are checked
    on this machine's side only without a launcher (a launcher's namespace has ports of its
    own); the master's web UI must answer from here at ``http://<host>:<webui_port>``.

    Raises ClusterError when a cluster from ``directory`` is still running (stop it first), a
    port is in use, ``worker_hosts`` does not name one address per worker, ``user`` is not an
    account (or this process is not root), or a daemon exits or the workers do not register
    within ``timeout_s`` seconds; daemons already started are stopped again."""
    d = Path(directory) if directory else default_dir()
    d.mkdir(parents=True, exist_ok=True)
    old = Cluster.load(d)
    if old is not None and old.alive_pids():
        raise ClusterError(f"a cluster from {d} is running ({old.master_url}, pids "
                           f"{sorted(old.alive_pids().values())}); run `consistent-stream-testing cluster stop"
                           f" --dir {d}` first")
    if workers < 1 or cores_per_worker < 1:
        raise ClusterError("--workers and --cores-per-worker must be at least 1")
    worker_hosts = list(worker_hosts) if worker_hosts else [host] * workers
    if len(worker_hosts) != workers:
        raise ClusterError(f"--worker-hosts names {len(worker_hosts)} address(es) for {workers} workers")
    _check_placement(user)
    if launcher is None:
        for p, what in ((port, "--port"), (webui_port, "--webui-port"), (connect_port, "--connect-port")):
            if p is not None and not _port_free(p, host):
                raise ClusterError(f"port {p} on {host} is in use; pick another with {what}")
    hosts = {"master": host, **{f"worker-{i}": h for i, h in enumerate(worker_hosts, 1)}}
    c = Cluster(dir=str(d), master_url=f"spark://{host}:{port}", webui_url=f"http://{host}:{webui_port}",
                workers=workers, cores_per_worker=cores_per_worker, memory_per_worker=memory_per_worker,
                hosts=hosts, launcher=launcher, user=user)
    c.pids["master"] = _spawn("master", ["org.apache.spark.deploy.master.Master", "--host", host,
                                         "--port", str(port), "--webui-port", str(webui_port)], d,
                              _env(d, host, user), _prefix("master", launcher, user))
    c.save()
    try:
        _wait(c, lambda s: True, timeout_s, "the master to start")
        for i in range(1, workers + 1):
            name = f"worker-{i}"
            work = _work_dir(d, name, user)
            c.pids[name] = _spawn(name, [
                "org.apache.spark.deploy.worker.Worker", "--host", hosts[name], "--port", "0", "--webui-port", "0",
                "--cores", str(cores_per_worker), "--memory", memory_per_worker,
                "--work-dir", str(work), c.master_url], d, _env(d, hosts[name], user),
                _prefix(name, launcher, user))
            c.save()
        _wait(c, lambda s: sum(w.get("state") == "ALIVE" for w in s.get("workers", [])) >= workers,
              timeout_s, f"{workers} workers to register")
        if connect_port is not None:
            c.pids["connect"] = _spawn_connect(c, host, connect_port, _env(d, host, user), connect_conf,
                                               _prefix("master", launcher, user), user)
            c.connect_url = f"sc://{host}:{connect_port}"
            c.save()
            _wait_for_port(c, host, connect_port, timeout_s, "the Spark Connect server to listen")
    except BaseException:
        stop(d)
        raise
    return c


def connect_server_conf(c: Cluster, host: str, port: int, home: Path,
                        extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark confs of the cluster's Spark Connect server, a driver of ``c`` at ``host``:
    listening on ``host:port``; delta-spark's, S3A's and Kafka's jars (``spark.jars``, which
    the executors fetch from it), Delta's SQL extension and catalog
    (:func:`consistent_stream.session.delta_confs`); a Hive metastore (Derby) and warehouse
    under ``home`` (its work directory), as dbt-spark's session method has them; UTC.
    ``extra`` (``--connect-conf``: the warehouse on S3, the store's ``spark.hadoop.fs.s3a.*``
    settings) comes first, so what it sets wins."""
    from consistent_stream.session import delta_confs
    conf = {"spark.master": c.master_url, "spark.driver.host": host, "spark.driver.bindAddress": host,
            "spark.ui.enabled": "false", "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port), "spark.sql.session.timeZone": "UTC",
            "spark.sql.catalogImplementation": "hive", "spark.sql.warehouse.dir": str(home / "warehouse"),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={home / 'metastore'}"}
    conf.update(extra or {})
    conf.update(delta_confs(conf, c.master_url))
    return conf


def _spawn_connect(c: Cluster, host: str, port: int, env: dict[str, str], extra: dict[str, str] | None,
                   prefix: list[str], user: str | None) -> int:
    d = Path(c.dir)
    home = _work_dir(d, "connect", user)
    args = [str(spark_home() / "bin" / "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "Spark Connect server"]
    for k, v in connect_server_conf(c, host, port, home, extra).items():
        args += ["--conf", f"{k}={v}"]
    return jvm.spawn([*prefix, *args, "spark-internal"], d / "connect.log", env=env, cwd=home).pid


def _wait_for_port(c: Cluster, host: str, port: int, timeout_s: float, what: str) -> None:
    """Wait until ``host:port`` accepts a connection from here."""
    deadline = time.monotonic() + timeout_s
    while True:
        if jvm.port_open(host, port, timeout=1):
            return
        dead = [n for n, pid in c.pids.items() if not process_alive(pid)]
        if dead:
            raise ClusterError(f"{', '.join(dead)} exited while waiting for {what}; see "
                               + ", ".join(str(Path(c.dir, f'{n}.log')) for n in dead))
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}; "
                               f"see {Path(c.dir, 'connect.log')}")
        time.sleep(0.3)


def _wait(c: Cluster, ready, timeout_s: float, what: str) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        dead = [n for n, pid in c.pids.items() if not process_alive(pid)]
        if dead:
            raise ClusterError(f"{', '.join(dead)} exited while waiting for {what}; see "
                               + ", ".join(str(Path(c.dir, f'{n}.log')) for n in dead))
        try:
            state = c.master_state(timeout=1.0)
            if ready(state):
                return state
        except ClusterError:
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}; see the logs in {c.dir}")
        time.sleep(0.3)


def stop(directory: str | Path | None = None, timeout_s: float = 20.0) -> list[int]:
    """Stop the cluster of ``directory``: SIGTERM to each daemon's process group (a worker's
    executors are in its group), SIGKILL after ``timeout_s``. Returns the pids that were
    running. Idempotent."""
    d = Path(directory) if directory else default_dir()
    c = Cluster.load(d)
    if c is None:
        return []
    running = jvm.terminate(c.pids.values(), timeout_s)
    Path(d, STATE_FILE).unlink(missing_ok=True)
    return sorted(running)


def status(directory: str | Path | None = None) -> dict:
    """The cluster's master URL, daemons and, from the master, its workers (state, cores,
    memory) and applications; ``{"running": False}`` when none was started from
    ``directory``."""
    d = Path(directory) if directory else default_dir()
    c = Cluster.load(d)
    if c is None or not c.alive_pids():
        return {"running": False, "dir": str(d)}
    s = c.master_state()
    return {"running": True, "dir": str(d), "master_url": c.master_url, "webui_url": c.webui_url,
            "connect_url": c.connect_url, "hosts": c.hosts, "user": c.user,
            "daemons": c.alive_pids(),
            "workers": [{k: w.get(k) for k in ("id", "host", "state", "cores", "coresused", "memory", "memoryused")}
                        for w in s.get("workers", [])],
            "active_apps": [{k: a.get(k) for k in ("id", "name", "cores", "state")} for a in s.get("activeapps", [])]}


def executor_tasks(directory: str | Path | None = None) -> list[dict]:
    """Per executor the workers launched (any application since the cluster started): its
    application, executor id, worker and the number of tasks it finished, read from the
    executor's log (``work/worker-N/<app>/<executor id>/stderr``, Spark's default INFO
    ``Executor: Finished task`` lines), and the worker's address (``host``; None when the
    cluster's record is gone). Executor ids are never ``driver``: a count > 0 is a task that
    ran on a worker."""
    d = Path(directory) if directory else default_dir()
    c = Cluster.load(d)
    hosts = c.hosts if c is not None else {}
    out = []
    for stderr in sorted((d / "work").glob("worker-*/app-*/*/stderr")):
        text = stderr.read_text(errors="replace")
        out.append({"worker": stderr.parts[-4], "host": hosts.get(stderr.parts[-4]), "app": stderr.parts[-3],
                    "executor_id": stderr.parts[-2], "tasks_finished": text.count("Executor: Finished task")})
    return out


# ---- the command line ---------------------------------------------------------------------------
def _confs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k.strip():
            raise ClusterError(f"--connect-conf {p!r}: expected KEY=VALUE, e.g. spark.hadoop.fs.s3a.endpoint=http://...")
        out[k.strip()] = v
    return out


def _cmd(args) -> int:
    import sys
    try:
        if args.action == "start":
            c = start(workers=args.workers, cores_per_worker=args.cores_per_worker,
                      memory_per_worker=args.memory_per_worker, port=args.port, webui_port=args.webui_port,
                      connect_port=args.connect_port, directory=args.dir, host=args.host,
                      worker_hosts=[h for h in (args.worker_hosts or "").split(",") if h] or None,
                      launcher=args.launcher, user=args.user, connect_conf=_confs(args.connect_conf))
            print(json.dumps({"command": "cluster start", "master_url": c.master_url, "webui_url": c.webui_url,
                              "connect_url": c.connect_url,
                              "dir": c.dir, "workers": c.workers, "pids": c.pids}))
        elif args.action == "stop":
            print(json.dumps({"command": "cluster stop", "stopped_pids": stop(args.dir)}))
        elif args.action == "status":
            print(json.dumps(status(args.dir)))
        else:  # tasks
            executors = executor_tasks(args.dir)
            by_worker: dict[str, int] = {}
            for e in executors:
                by_worker[e["worker"]] = by_worker.get(e["worker"], 0) + e["tasks_finished"]
            print(json.dumps({"command": "cluster tasks", "executors": executors, "tasks_by_worker": by_worker}))
            busy = sorted({e["worker"] for e in executors if e["tasks_finished"]})
            if len(busy) < args.require_workers:
                print(f"cluster tasks: error: tasks ran on {len(busy)} worker(s) {busy}, expected at least "
                      f"{args.require_workers}", file=sys.stderr)
                return 1
    except ClusterError as e:
        print(f"cluster {args.action}: error: {e}", file=sys.stderr)
        return 2
    return 0


def add_cluster_command(subparsers) -> None:
    """Register ``cluster start|stop|status|tasks`` on the ``consistent-stream-testing`` CLI."""
    c = subparsers.add_parser("cluster", help="a local Spark standalone cluster (master + workers, on 127.0.0.1 "
                                              "unless placed elsewhere) from pyspark's distribution")
    c.add_argument("action", choices=["start", "stop", "status", "tasks"],
                   help="start / stop the cluster, show its workers, or count the tasks each executor ran")
    c.add_argument("--dir", default=None,
                   help="pids, logs and work directories (default: $CONSISTENT_STREAM_CLUSTER_DIR, "
                        "else <tmp>/consistent-stream-cluster-<uid>)")
    c.add_argument("--workers", type=int, default=2, help="workers to start (default 2)")
    c.add_argument("--cores-per-worker", type=int, default=1, help="cores each worker offers (default 1)")
    c.add_argument("--memory-per-worker", default="2g", help="memory each worker offers executors (default 2g)")
    c.add_argument("--port", type=int, default=7077, help="the master's port (default 7077)")
    c.add_argument("--webui-port", type=int, default=8080, help="the master's web UI port, on --host (default 8080)")
    c.add_argument("--host", default=HOST, help="the address the master binds (default 127.0.0.1)")
    c.add_argument("--worker-hosts", default=None,
                   help="comma-separated address each worker binds, one per worker (default: --host)")
    c.add_argument("--launcher", default=None,
                   help="command prefix each daemon runs through, {daemon} replaced by master, worker-1, ... "
                        "(e.g. 'ip netns exec cs-{daemon}')")
    c.add_argument("--user", default=None,
                   help="run the daemons as this account (root only); their work directories are its own")
    c.add_argument("--require-workers", type=int, default=0,
                   help="tasks: exit 1 unless executors on at least this many workers finished tasks")
    c.add_argument("--connect-port", type=int, default=None,
                   help="also start a Spark Connect server on the cluster (placed as the master), "
                        "on sc://<host>:<port> (e.g. 15002)")
    c.add_argument("--connect-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark conf of the Connect server (repeatable), e.g. spark.hadoop.fs.s3a.endpoint=...")
    c.set_defaults(func=_cmd)


def main(argv: list[str] | None = None) -> int:
    """``python -m consistent_stream_testing.cluster start|stop|status|tasks ...`` (the same as
    ``consistent-stream-testing cluster ...``)."""
    import argparse
    import sys
    p = argparse.ArgumentParser(prog="python -m consistent_stream_testing.cluster")
    sub = p.add_subparsers(dest="command", required=True)
    add_cluster_command(sub)
    args = p.parse_args(["cluster", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    import sys
    sys.exit(main())
