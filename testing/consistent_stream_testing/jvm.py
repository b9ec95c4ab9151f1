"""What the launchers of this package's services share (s3proxy: :mod:`.s3server`; the Kafka
broker and Kafka Connect: :mod:`.kafka_stack`; a standalone Spark cluster's daemons:
:mod:`.cluster`): a jar fetched once from Maven Central into the jar cache
(:func:`consistent_stream.session.jars_root`) and checked against its SHA-1; a daemon started
detached (its own session, so its pid is its process group and a test's signal to the caller
does not reach it), its output appended to its log; a wait for its port; its state file
(JSON, this account's only), from which another process finds it; and its stop: SIGTERM to its
process group, SIGKILL after a timeout, until it is gone.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from consistent_stream.daemons import process_alive

MAVEN = os.environ.get("MAVEN_REPOSITORY", "https://repo1.maven.org/maven2").rstrip("/")
"""The Maven repository jars are fetched from (``$MAVEN_REPOSITORY``, default Maven Central)."""


def fetch_maven_jar(url: str, path: Path, error: type[Exception]) -> Path:
    """Fetch ``url`` into ``path`` (written beside it, then renamed: never half a jar), checked
    against the repository's ``<url>.sha1``. Raises ``error`` when it cannot be fetched or its
    SHA-1 differs."""
    try:
        with urllib.request.urlopen(url + ".sha1", timeout=60) as r:
            want = r.read().decode().split()[0].strip()
        with urllib.request.urlopen(url, timeout=600) as r:
            data = r.read()
    except OSError as e:
        raise error(f"cannot fetch {url}: {e}") from e
    got = hashlib.sha1(data).hexdigest()
    if got != want:
        raise error(f"{url}: SHA-1 {got} does not match the repository's {want}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    return path


def spawn(command: list[str], log: Path, *, env: dict[str, str] | None = None,
          cwd: str | Path | None = None) -> subprocess.Popen:
    """Start ``command`` detached: its own session (its pid is its process group, which
    :func:`terminate` signals), no stdin, stdout and stderr appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=cwd, start_new_session=True)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether ``host:port`` accepts a TCP connection from here now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, n: int = 3000) -> str:
    """The last ``n`` bytes of log ``path`` (for an error message)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - n))
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids: list[int], timeout_s: float, interval: float) -> list[int]:
    deadline = time.time() + timeout_s
    left = [p for p in pids if process_alive(p, reap=True)]
    while left and time.time() < deadline:
        time.sleep(interval)
        left = [p for p in left if process_alive(p, reap=True)]
    return left


def kill(pids: int | Iterable[int]) -> None:
    """SIGKILL the process groups of ``pids``; returns when they are gone (10 s at most)."""
    pids = [pids] if isinstance(pids, int) else list(pids)
    _signal(pids, signal.SIGKILL)
    _wait_gone(pids, 10.0, 0.05)


def terminate(pids: int | Iterable[int], timeout_s: float) -> list[int]:
    """Stop the daemons ``pids`` (each its process group: a worker's executors with it): SIGTERM
    to all at once, SIGKILL to those still running after ``timeout_s`` s; returns when they are
    gone (a zombie child of this process is reaped). Returns the pids that were running."""
    pids = [pids] if isinstance(pids, int) else list(pids)
    running = [p for p in pids if process_alive(p, reap=True)]
    if running:
        _signal(running, signal.SIGTERM)
        if _wait_gone(running, timeout_s, 0.1):
            kill(running)
    return running


def write_state(path: Path, state: dict, indent: int | None = None) -> None:
    """Write a daemon's state file (JSON), readable by this account only (it may hold
    credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(state, indent=indent))
    os.chmod(path, 0o600)


def read_state(path: Path) -> dict | None:
    """A state file's JSON (None when it is missing or not JSON)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
