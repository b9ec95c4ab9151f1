"""One real PostgreSQL 15 server per test session (its own initdb on a free port), shared by
the CDC tests; each test gets its own database. Installed by ``scripts/ensure_postgres.sh``
(``make test`` runs it)."""
from __future__ import annotations

import atexit
import itertools
import os
import signal
import subprocess
import sys
import time

from consistent_stream_testing import localpg
from consistent_stream_testing.localpg import LocalPostgres

_SERVER: LocalPostgres | None = None
_DB = itertools.count(1)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(os.path.dirname(sys.executable), "consistent-stream")


def shared_server() -> LocalPostgres:
    global _SERVER
    if _SERVER is None:
        _SERVER = LocalPostgres.start()
        atexit.register(_SERVER.stop)
    return _SERVER


class Database:
    """A fresh database on the shared server: ``dsn``, ``execute(sql, params)``, ``connect()``."""

    def __init__(self):
        srv = shared_server()
        self.name = f"t{os.getpid()}_{next(_DB)}"
        srv.execute(f"CREATE DATABASE {self.name}")
        self.server = srv
        self.dsn = srv.dsn.replace("dbname=postgres", f"dbname={self.name}")

    def connect(self):
        return localpg.connect(self.dsn)

    def execute(self, sql: str, params=None):
        return localpg.execute(self.dsn, sql, params)

    def drop_replication_slot(self, slot: str, timeout_s: float) -> bool:
        """Drop logical replication slot ``slot`` of this database once nothing uses it (a
        stopped connector or capture lets go of it a moment later); returns whether it is gone
        within ``timeout_s``. The shared server has ``max_replication_slots`` = 10 for every
        test's captures and connectors, and Debezium keeps its slot after it stops."""
        deadline = time.time() + timeout_s
        while True:
            try:
                self.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE slot_name = %s AND NOT active", (slot,))
                if not self.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)):
                    return True
            except Exception:
                pass
            if time.time() > deadline:
                return False
            time.sleep(0.2)


def start_capture(dsn: str | None, tables: str, slot: str, landing: str, *extra: str, env: dict | None = None,
                  log_path: str | None = None) -> subprocess.Popen:
    """``consistent-stream capture postgres`` as a subprocess (stdout: its JSON summary);
    without ``dsn``, no ``--dsn`` (the connection comes from the environment)."""
    err = open(log_path, "ab") if log_path else subprocess.DEVNULL
    dsn_args = ["--dsn", dsn] if dsn is not None else []
    return subprocess.Popen([CLI, "capture", "postgres", *dsn_args, "--tables", tables, "--slot", slot,
                             "--landing", landing, "--flush-interval", "0.1", *extra],
                            stdout=subprocess.PIPE, stderr=err, env={**os.environ, **(env or {})})


def stop_capture(p: subprocess.Popen, timeout: float = 30) -> str:
    """SIGTERM (graceful: flushes and exits 0); returns its stdout."""
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"capture exited {p.returncode}"
    return out.decode()


def wait_for(cond, timeout: float = 60, what: str = "condition") -> None:
    """Poll ``cond()`` until true; an exception counts as not yet (the last one is reported)."""
    t0, last = time.time(), None
    while time.time() - t0 < timeout:
        try:
            if cond():
                return
        except Exception as e:  # e.g. the landing directory does not exist yet
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")
