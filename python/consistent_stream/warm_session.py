"""A warm session: a local Spark Connect server that outlives one process and serves the
next, so that a short-lived client (a ``dbt run``) does not start a JVM, a SparkSession and
Hive's metastore each time.

    consistent-stream warm-session status [--project-dir D]
    consistent-stream warm-session stop [--project-dir D]

A classic session is built in the process that asks for it: every ``dbt run`` pays the JVM's
launch, Spark's context and session, Delta's extension and Hive's embedded metastore (Derby,
DataNucleus) before its first statement, and the first Spark job's warm-up in its first Spark
query (the docs' benchmark pages give the seconds). :func:`ensure` instead starts, once, a Spark Connect
server (``org.apache.spark.sql.connect.service.SparkConnectServer`` from pyspark's own
distribution, through ``spark-submit``) with exactly the confs the in-process session would
have had (the caller's, plus :func:`consistent_stream.session.delta_confs`, plus Hive's
catalog), in the caller's working directory (so a relative warehouse or Derby path is the
same one), on a free port of 127.0.0.1; later callers from the same directory with the same
confs connect to it (``sc://127.0.0.1:<port>``) and run as Spark Connect clients
(:mod:`consistent_stream.connect`).

**Lifetime.** The server is owned by a supervisor process (``python -m
consistent_stream.warm_session serve``, detached, its own session) that stops it after
``idle_s`` seconds without a client: each client touches the server's ``heartbeat`` file when
it connects and every :data:`HEARTBEAT_S` seconds while it runs (:func:`keep_alive`), so a
long ``dbt run`` keeps it up and an idle one lets it go. The supervisor also goes when the
server dies (its record removed: the next client starts a new one), and on SIGTERM
(:func:`stop`) stops the server first. One server per working directory: its Derby metastore
can be booted by one JVM only.

**Confs.** The server's static confs are fixed at its start. A client asking for other confs
(another profile target, an edited profile) gets a new server when the running one is idle
(no heartbeat for ``2 * HEARTBEAT_S``): it is stopped first. When it is in use,
:class:`WarmSessionError` names the confs that differ and how to stop it. A classic session
wanting the same directory's metastore calls :func:`release` first (the same rule).

Where things live: ``$CONSISTENT_STREAM_WARM_DIR`` (default ``~/.cache/consistent-stream/warm``)
``/<hash of the working directory>/``: ``server.json`` (the record: pids, port, confs, token),
``confs.json``, ``spark.properties``, ``heartbeat``, ``server.log`` (the server's output),
``supervisor.log``, ``lock``; the directory is this account's only (mode 0700). Starting a server
removes the directories of stopped servers whose working directory is gone.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from .daemons import free_port, process_alive as _alive
from .errors import ConsistentStreamError
from .session import spark_home

HOST = "127.0.0.1"
RECORD = "server.json"
HEARTBEAT = "heartbeat"
SPEC = "confs.json"
"""What a server directory's server is started for: ``{"cwd", "confs", "idle_s"}``, written
before its supervisor starts (:func:`_read_spec`)."""
HEARTBEAT_S = 15.0
"""How often a client touches the heartbeat while it runs (seconds)."""
IDLE_S = 1800.0
"""How long a server stays up without a client by default (seconds)."""
START_TIMEOUT_S = 180.0
"""How long :func:`ensure` waits for a new server to accept connections (seconds)."""
STOP_TIMEOUT_S = 20.0


class WarmSessionError(ConsistentStreamError):
    """The warm session's server could not be started, reached, replaced or stopped."""


@dataclass
class WarmServer:
    """A running server, as its directory's ``server.json`` records it."""
    dir: str
    cwd: str
    port: int
    supervisor_pid: int
    server_pid: int
    confs: dict
    started: float
    idle_s: float
    token: str

    @property
    def url(self) -> str:
        """Spark Connect's connection string of the server, with its token (``localhost``:
        pyspark then sends the token over gRPC's local credentials, without TLS)."""
        return f"sc://localhost:{self.port}/;token={self.token}"

    @property
    def address(self) -> str:
        """Where the server listens, without its token (for messages)."""
        return f"sc://localhost:{self.port}"

    def alive(self) -> bool:
        return _alive(self.supervisor_pid) and _alive(self.server_pid)

    def idle_for_s(self) -> float:
        """Seconds since a client last touched the heartbeat."""
        try:
            return time.time() - Path(self.dir, HEARTBEAT).stat().st_mtime
        except FileNotFoundError:
            return time.time() - self.started


def base_dir() -> Path:
    env = os.environ.get("CONSISTENT_STREAM_WARM_DIR")
    return Path(env) if env else Path.home() / ".cache" / "consistent-stream" / "warm"


def server_dir(cwd: str | Path | None = None) -> Path:
    """The directory of the server for working directory ``cwd`` (default: this process's)."""
    real = os.path.realpath(str(cwd or os.getcwd()))
    return base_dir() / hashlib.sha256(real.encode()).hexdigest()[:16]


def load(directory: str | Path) -> WarmServer | None:
    p = Path(directory, RECORD)
    try:
        return WarmServer(**json.loads(p.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def server_confs(confs: dict[str, str]) -> dict[str, str]:
    """What the server starts with for a caller's session ``confs`` (the profile's
    ``server_side_parameters``): those, Delta's, S3A's and Kafka's
    (:func:`~consistent_stream.session.delta_confs`), Hive's catalog (as
    ``enableHiveSupport()``), and no web UI unless asked for."""
    from .session import delta_confs
    out = {"spark.sql.catalogImplementation": "hive", "spark.ui.enabled": "false", **confs}
    out.update(delta_confs(out))
    return out


def ensure(confs: dict[str, str], cwd: str | Path | None = None, *, idle_s: float = IDLE_S,
           timeout_s: float = START_TIMEOUT_S) -> WarmServer:
    """The server for working directory ``cwd`` (default: this process's) with session confs
    ``confs``: the running one when its confs are these, else a new one (a running one with
    other confs stopped first when idle). Touches its heartbeat. Raises WarmSessionError when
    the running one has other confs and is in use, or a new one does not start within
    ``timeout_s`` seconds (naming its log)."""
    cwd = os.path.realpath(str(cwd or os.getcwd()))
    d = server_dir(cwd)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.chmod(0o700)   # its confs may hold the store's keys
    wanted = server_confs(confs)
    with _locked(d):
        s = load(d)
        if s is not None and s.alive() and _reachable(s.port):
            if s.confs == wanted:
                touch(s)
                return s
            _replace_idle(s, f"session confs {_differing(s.confs, wanted)}")
        elif s is not None:
            _stop(s)
        return _start(d, cwd, wanted, idle_s, timeout_s)


def release(cwd: str | Path | None = None) -> None:
    """Stop the server of ``cwd`` (default: this process's directory) unless it is in use, so
    that a classic session can boot the same Derby metastore; raises WarmSessionError when it
    is in use. Nothing to do when none runs."""
    d = server_dir(cwd)
    if not Path(d, RECORD).exists():
        return
    with _locked(d):
        s = load(d)
        if s is None:
            return
        if s.alive():
            _replace_idle(s, "a session in this process (method: session without warm_session)")
        else:
            _stop(s)


def touch(server: WarmServer) -> None:
    """Record that a client uses ``server`` now."""
    Path(server.dir, HEARTBEAT).touch()


def keep_alive(server: WarmServer) -> threading.Thread:
    """Touch ``server``'s heartbeat now and every :data:`HEARTBEAT_S` seconds for as long as this
    process runs (a daemon thread), so that its supervisor does not stop it under a run."""
    def beat() -> None:
        while True:
            try:
                touch(server)
            except OSError:
                pass
            time.sleep(HEARTBEAT_S)
    t = threading.Thread(target=beat, name="consistent-stream-warm-heartbeat", daemon=True)
    t.start()
    return t


def stop(cwd: str | Path | None = None, directory: str | Path | None = None) -> list[int]:
    """Stop the server of ``cwd`` (or of server directory ``directory``) and its supervisor,
    in use or not; returns the pids that were running. Idempotent."""
    d = Path(directory) if directory else server_dir(cwd)
    if not d.exists():
        return []
    with _locked(d):
        s = load(d)
        return _stop(s) if s is not None else []


def status(cwd: str | Path | None = None) -> dict:
    """The server of ``cwd``: whether it runs, its address, pids, idle seconds, log."""
    d = server_dir(cwd)
    s = load(d)
    if s is None or not s.alive():
        return {"running": False, "dir": str(d)}
    return {"running": True, "address": s.address, "dir": str(d), "cwd": s.cwd, "supervisor_pid": s.supervisor_pid,
            "server_pid": s.server_pid, "idle_s": round(s.idle_for_s(), 1), "idle_timeout_s": s.idle_s,
            "log": str(Path(d, "server.log"))}


def _replace_idle(s: WarmServer, wanted_by: str) -> None:
    """Stop ``s`` when idle (no heartbeat for two periods); else raise WarmSessionError."""
    idle = s.idle_for_s()
    if idle < 2 * HEARTBEAT_S:
        raise WarmSessionError(
            f"the warm session's Spark Connect server for {s.cwd} ({s.address}, pid {s.server_pid}) is in use "
            f"(a client {idle:.0f} s ago) and {wanted_by} needs another one; wait for its clients to end, or stop it: "
            f"consistent-stream warm-session stop --project-dir {s.cwd}")
    _stop(s)


def _differing(have: dict, want: dict) -> str:
    keys = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"differ from the running server's ({shown})"


def _prune(keep: Path) -> None:
    """Remove the directories of servers that no longer run for a working directory that no
    longer exists (a temporary project's): their logs and confs would stay forever."""
    for other in base_dir().iterdir():
        if other == keep or not other.is_dir():
            continue
        try:
            cwd = _read_spec(other)[0]
        except (OSError, ValueError, KeyError):
            continue
        s = load(other)
        if not os.path.isdir(cwd) and (s is None or not s.alive()):
            shutil.rmtree(other, ignore_errors=True)


def _read_spec(d: Path) -> tuple[str, dict[str, str], float]:
    """The working directory, confs and idle seconds server directory ``d`` was started for
    (:data:`SPEC`). Raises OSError when it cannot be read, ValueError or KeyError when it is
    not what :func:`_start` writes."""
    spec = json.loads(Path(d, SPEC).read_text())
    return spec["cwd"], spec["confs"], float(spec["idle_s"])


def _start(d: Path, cwd: str, confs: dict, idle_s: float, timeout_s: float) -> WarmServer:
    _prune(d)
    Path(d, RECORD).unlink(missing_ok=True)
    Path(d, SPEC).write_text(json.dumps({"cwd": cwd, "confs": confs, "idle_s": idle_s}))
    Path(d, HEARTBEAT).touch()
    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON: this interpreter, which has the package)
    with open(d / "supervisor.log", "ab") as log:
        p = subprocess.Popen([sys.executable, "-m", "consistent_stream.warm_session", "serve", "--dir", str(d)],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                             start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        s = load(d)
        if s is not None and _reachable(s.port):
            return s
        if p.poll() is not None:
            raise WarmSessionError(f"the warm session's Spark Connect server did not start (its supervisor exited "
                                   f"with {p.returncode}): {_tail(d / 'server.log') or _tail(d / 'supervisor.log')}"
                                   f" — see {d / 'server.log'}")
        if time.monotonic() > deadline:
            os.kill(p.pid, signal.SIGTERM)
            raise WarmSessionError(f"the warm session's Spark Connect server did not accept connections within "
                                   f"{timeout_s:.0f} s; see {d / 'server.log'}")
        time.sleep(0.2)


def _stop(s: WarmServer) -> list[int]:
    """SIGTERM to the supervisor (which stops the server) and to the server's process group,
    SIGKILL after :data:`STOP_TIMEOUT_S`; the record removed."""
    running = [pid for pid in (s.supervisor_pid, s.server_pid) if _alive(pid)]
    for pid in running:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(_alive(p) for p in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in running:
        _signal_group(pid, signal.SIGKILL)
    Path(s.dir, RECORD).unlink(missing_ok=True)
    return running


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@contextmanager
def _locked(d: Path):
    with open(d / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _reachable(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1).close()
        return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return ""
    errors = [line for line in text if "Exception" in line or "Error" in line]
    return " | ".join((errors or text)[-lines:])


def serve(d: Path) -> int:
    """The supervisor: start the server of ``d/confs.json``, record it, and stop it when no
    client touched the heartbeat for its idle time, when it dies, or on SIGTERM."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())   # before the server exists: never orphaned
    cwd, confs, idle_s = _read_spec(d)
    port = free_port(HOST)
    # the confs in a file of this account's only, not on the command line (the profile's
    # S3A keys may be among them): spark-submit's --properties-file
    props = Path(d, "spark.properties")
    props.write_text("".join(f"{_escaped(k)}={_escaped(v)}\n" for k, v in
                             {**confs, "spark.connect.grpc.binding.address": HOST,
                              "spark.connect.grpc.binding.port": str(port)}.items()))
    props.chmod(0o600)
    args = [str(spark_home() / "bin" / "spark-submit"), "--properties-file", str(props), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "consistent-stream warm session"]
    # a token only this account can read (the record's directory is its own): without it
    # any local account could run SQL, and read files, as this one through the port
    token = secrets.token_urlsafe(32)
    env = dict(os.environ, SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=os.environ["PYSPARK_PYTHON"],
               SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
    with open(d / "server.log", "wb") as log:
        server = subprocess.Popen([*args, "spark-internal"], stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
    record = WarmServer(dir=str(d), cwd=cwd, port=port, supervisor_pid=os.getpid(), server_pid=server.pid,
                        confs=confs, started=time.time(), idle_s=idle_s, token=token)
    try:
        while not _reachable(port):
            if server.poll() is not None or stopping.is_set():
                print(f"the server exited ({server.returncode}) before accepting connections", flush=True)
                return 1
            time.sleep(0.2)
        tmp = Path(d, RECORD + ".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(asdict(record)))
        tmp.replace(Path(d, RECORD))
        print(f"serving {record.address} (pid {server.pid}) for {cwd}; idle timeout {idle_s:.0f} s", flush=True)
        while not stopping.wait(min(5.0, max(0.5, idle_s / 4))):
            if server.poll() is not None:
                print(f"the server exited ({server.returncode})", flush=True)
                return 1
            if record.idle_for_s() > idle_s and _retire_if_idle(d, record, server):
                return 0
        print("stopped (SIGTERM)", flush=True)
        return 0
    finally:
        _end(server)
        current = load(d)
        if current is not None and current.supervisor_pid == os.getpid():
            Path(d, RECORD).unlink(missing_ok=True)


def _retire_if_idle(d: Path, record: WarmServer, server: subprocess.Popen) -> bool:
    """Under the directory's lock, unless a client holds it now (:func:`ensure` checks and
    touches under it): when still idle, remove the record and stop the server. So a client
    either finds the record gone and starts a new server, or its touch keeps this one."""
    with open(d / "lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if record.idle_for_s() <= record.idle_s:
                return False
            print(f"idle for {record.idle_for_s():.0f} s: stopping", flush=True)
            Path(d, RECORD).unlink(missing_ok=True)
            _end(server)
            return True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _escaped(text: str) -> str:
    """``text`` as a key or value of a Java properties file."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return ("\\" + out) if out[:1] in (" ", "\t") else out


def _end(server: subprocess.Popen) -> None:
    if server.poll() is None:
        _signal_group(server.pid, signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _signal_group(server.pid, signal.SIGKILL)
            server.wait()


def _cmd(args) -> int:
    cwd = os.path.abspath(args.project_dir)
    try:
        if args.action == "stop":
            print(json.dumps({"command": "warm-session stop", "stopped_pids": stop(cwd)}))
        else:
            print(json.dumps(status(cwd)))
    except WarmSessionError as e:
        print(f"warm-session {args.action}: error: {e}", file=sys.stderr)
        return 2
    return 0


def add_warm_session_command(subparsers) -> None:
    """Register ``warm-session status|stop`` on the ``consistent-stream`` CLI."""
    w = subparsers.add_parser("warm-session", help="the local Spark Connect server a profile's warm_session: true "
                                                   "keeps between dbt runs")
    w.add_argument("action", choices=["status", "stop"], help="show the project directory's server, or stop it")
    w.add_argument("--project-dir", default=".", help="the directory dbt runs in (default: .)")
    w.set_defaults(func=_cmd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consistent_stream.warm_session")
    p.add_argument("action", choices=["serve"])
    p.add_argument("--dir", required=True)
    args = p.parse_args(argv)
    return serve(Path(args.dir))


if __name__ == "__main__":
    sys.exit(main())
