"""A throwaway local PostgreSQL 15 server for tests and benchmarks (never for production).

``LocalPostgres.start()`` runs ``initdb`` in a fresh temporary directory and ``pg_ctl start``
on a free TCP port on 127.0.0.1, configured for logical decoding:

* ``wal_level = logical``, ``max_replication_slots`` / ``max_wal_senders`` = 10;
* trust authentication for local TCP connections (user ``postgres``), replication included;
* wal2json enabled for decoding: this Debian build only lets the output plugins listed in
  ``output_plugin_libraries`` decode (see DESIGN.md), so the server runs
  ``ALTER SYSTEM SET output_plugin_libraries = 'wal2json'`` and reloads.

The server refuses to run as root, so when the caller is root every server command runs as the
``postgres`` OS user (``runuser -u postgres -- ...``) and the directory is handed to it.
Binaries come from ``/usr/lib/postgresql/15/bin`` (Debian's ``postgresql-15`` package; run
``scripts/ensure_postgres.sh`` to install it and ``postgresql-15-wal2json``).

Raises ``RuntimeError`` naming the command and its output when a step fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from consistent_stream.daemons import free_port

PG_BIN = os.environ.get("CONSISTENT_STREAM_PG_BIN", "/usr/lib/postgresql/15/bin")


def available() -> str | None:
    """None when PostgreSQL 15 and wal2json are installed, else what is missing."""
    if not os.path.exists(os.path.join(PG_BIN, "initdb")):
        return f"{PG_BIN}/initdb not found: run scripts/ensure_postgres.sh (installs postgresql-15)"
    lib = subprocess.run([os.path.join(PG_BIN, "pg_config"), "--pkglibdir"], capture_output=True, text=True)
    if not os.path.exists(os.path.join(lib.stdout.strip() or "/usr/lib/postgresql/15/lib", "wal2json.so")):
        return "wal2json.so not found: run scripts/ensure_postgres.sh (installs postgresql-15-wal2json)"
    return None


class LocalPostgres:
    """One running server: ``dsn`` (libpq key/value string), ``port``, ``datadir``; ``stop()``."""

    def __init__(self, root: str, port: int):
        self.root, self.port = root, port
        self.datadir = os.path.join(root, "data")
        self.dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    def _as_pg(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(self._as_pg(args), capture_output=True, text=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stdout}{p.stderr}")
        return p

    @classmethod
    def start(cls, root: str | None = None) -> "LocalPostgres":
        """initdb + start on a free port; returns when the server accepts connections."""
        missing = available()
        if missing:
            raise RuntimeError(missing)
        root = root or tempfile.mkdtemp(prefix="cs-pg-")
        os.makedirs(root, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
            os.chmod(root, 0o700)
        srv = cls(root, free_port())
        srv._run([os.path.join(PG_BIN, "initdb"), "-D", srv.datadir, "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync"])
        conf = (f"\nport = {srv.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n"
                "wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 64MB\n")
        with open(os.path.join(srv.datadir, "postgresql.conf"), "a") as f:
            f.write(conf)
        srv._run([os.path.join(PG_BIN, "pg_ctl"), "-D", srv.datadir, "-l", os.path.join(root, "server.log"),
                  "-w", "-t", "60", "start"])
        srv.execute("ALTER SYSTEM SET output_plugin_libraries = 'wal2json'")
        srv.execute("SELECT pg_reload_conf()")
        time.sleep(0.2)
        return srv

    def connect(self, **kw):
        """A psycopg2 connection (autocommit) to the server's ``postgres`` database."""
        return connect(self.dsn, **kw)

    def execute(self, sql: str, params=None):
        """Run one statement in autocommit; returns its rows (or None)."""
        return execute(self.dsn, sql, params)

    def bin(self, name: str) -> str:
        return os.path.join(PG_BIN, name)

    def stop(self) -> None:
        self._run([os.path.join(PG_BIN, "pg_ctl"), "-D", self.datadir, "-m", "immediate", "-w", "stop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def connect(dsn: str, **kw):
    """A psycopg2 connection to ``dsn`` in autocommit."""
    import psycopg2
    conn = psycopg2.connect(dsn, **kw)
    conn.autocommit = True
    return conn


def execute(dsn: str, sql: str, params=None):
    """Run one statement on ``dsn`` in autocommit; returns its rows (or None)."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()
