"""The process's in-memory DuckDB databases, shared by the driver's change-sized work (the
local engine's delta queries, :mod:`.plan.local`, and the keyed state scan,
:mod:`.state.arrangement`).

Opening a DuckDB database costs 10-20 ms (``duckdb.connect()``, measured on this project's
2-core VM), and a batch opened two; a cursor of an open database costs microseconds. So each
user takes its own cursor (:meth:`SharedDatabase.cursor`) of one database per process and
thread count, and closes the cursor when done:

* a cursor is a connection of its own: the Arrow tables a cursor registers are visible to it
  only, and cursors may run at once from different threads (two models of one ``dbt run``);
* ``SET threads`` is a setting of the database, not of a cursor, so each thread count (the
  autoscaler's parallelism, None for DuckDB's default of one per core) has its database;
* scalar functions are created in the database's catalog, visible to every cursor, and a
  Python function created through a cursor dangles once that cursor is closed (DuckDB
  2.0.1 crashes the process when another cursor then calls it). They are created once per
  database through its own connection, which stays open (:meth:`SharedDatabase.function`).

The batch-evaluation oracle (:mod:`.oracle`) keeps its own connection: it is the
independent engine the results are checked against.

A ``dbt run`` is a new process, and its first batch paid for importing DuckDB (30-70 ms),
opening the database (15-30 ms) and loading sqlglot's DuckDB dialect (about 10 ms) before
its first delta query: py-spy put 0.06-0.08 s of a 0.25 s first batch there (SF 0.1).
:func:`prewarm` does that in a background thread while the run plans and Spark starts the
query (the Python side waits on the JVM then).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_DATABASES: dict = {}


class SharedDatabase:
    """One in-memory DuckDB database of the process, with ``threads`` threads."""

    def __init__(self, threads: int | None):
        import duckdb
        self._con = duckdb.connect()
        if threads:
            self._con.execute(f"SET threads = {int(threads)}")
        self._functions: set[str] = set()
        self._lock = threading.Lock()

    def cursor(self):
        """A new connection to this database (close it when done)."""
        with self._lock:
            return self._con.cursor()

    def function(self, name: str, create: Callable) -> None:
        """Create scalar function ``name`` unless it exists: ``create(connection)`` is called
        once per database, with the database's own connection, which is never closed."""
        with self._lock:
            if name not in self._functions:
                create(self._con)
                self._functions.add(name)


def database(threads: int | None = None) -> SharedDatabase:
    """The process's database for ``threads`` threads (None: DuckDB's default), opened on
    first use."""
    key = int(threads) if threads else None
    with _LOCK:
        db = _DATABASES.get(key)
        if db is None:
            db = _DATABASES[key] = SharedDatabase(key)
        return db


def prewarm(threads: int | None = None) -> threading.Thread | None:
    """Import DuckDB, open the process's database for ``threads`` and load the sqlglot
    dialects the local engine translates between (Spark, DuckDB), in a daemon thread;
    returns it (None when the database is open already). A failure there is only logged:
    the batch opens what it needs itself and reports its own errors."""
    key = int(threads) if threads else None
    if key in _DATABASES:
        return None

    def work() -> None:
        try:
            database(key)
            import importlib
            from sqlglot import Dialect
            for module in ("sqlglot.optimizer.annotate_types", "sqlglot.optimizer.qualify"):
                importlib.import_module(module)
            Dialect.get_or_raise("spark")
            Dialect.get_or_raise("duckdb")
        except Exception as e:  # noqa: BLE001
            log.debug("DuckDB prewarm failed (the batch will open it): %s", e)

    t = threading.Thread(target=work, name="consistent-stream-duckdb-prewarm", daemon=True)
    t.start()
    return t
