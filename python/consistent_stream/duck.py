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
"""
from __future__ import annotations

import threading
from typing import Callable

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
