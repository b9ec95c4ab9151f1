"""The process's in-memory DuckDB databases, shared by the driver's change-sized work (the
local engine's delta queries, :mod:`.exec.local`, the keyed state scan,
:mod:`.state.arrangement`, and the rows of a source's data file by position,
:mod:`.delta.log_changes`).

Opening a DuckDB database (``duckdb.connect()``) has a fixed cost that a change-sized batch
notices, and a batch opened two; a cursor of an open database costs next to nothing. So each
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

A ``dbt run`` is a new process, and its first batch paid for importing DuckDB, opening the
database and loading sqlglot's DuckDB dialect before its first delta query: a large part of a
small first batch (py-spy). :func:`prewarm` does that in a background thread while the run
plans and Spark starts the query (the Python side waits on the JVM then).

Every query here runs through :func:`arrow`: one statement planned once.
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_DATABASES: dict = {}

COPY_WARNING = "Arrow output on a DB-API result"
warnings.filterwarnings("ignore", message=COPY_WARNING, category=UserWarning)
"""DuckDB 2.0 warns that Arrow from ``execute`` copies the rows once more than
``sql(...).to_arrow_table()``; :func:`arrow` takes ``execute`` on purpose (it plans the
statement once where ``sql`` plans it twice) and was faster at every result size measured
(a few rows to a million). A process-wide filter of that one message: a filter set and
restored around each call (``warnings.catch_warnings``) is not safe with the threads of a
``dbt run``."""


def arrow(con, sql: str) -> pa.Table:
    """The rows of the SELECT ``sql`` on cursor ``con``, as an Arrow table (DuckDB's types).

    ``con.sql(sql).to_arrow_table()`` binds and plans the statement once to learn its schema
    and again to run it; ``execute`` plans it once. For the few-row delta queries of a batch,
    whose plans cost more than their execution, that is most of each query (the comparison is
    in the docs' benchmark pages). When reading the result fails, the rest of it is cancelled, so
    the cursor takes other work again. Raises what DuckDB raises (``duckdb.Error``)."""
    result = con.execute(sql)
    try:
        return result.to_arrow_table()
    except BaseException:
        try:
            con.abort()
        except Exception as e:  # noqa: BLE001  (the first error is the one to report)
            log.debug("cancelling a failed result: %s", e)
        raise


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
    """Import DuckDB, open the process's database for ``threads``, load the sqlglot
    dialects the local engine translates between (Spark, DuckDB) and run Arrow's Parquet
    reader, hash aggregation, filter and join once on a few rows (:func:`_warm_arrow`), in a
    daemon thread; returns it (None when the database is open already). A failure there is
    only logged: the batch opens what it needs itself and reports its own errors."""
    key = int(threads) if threads else None
    if key in _DATABASES:
        return None

    def work() -> None:
        try:
            database(key)
            _warm_arrow()
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


def _warm_arrow() -> None:
    """Arrow's paths a batch takes on the driver (a change file's Parquet read, the
    consolidation's hash aggregation, a filter, a join), run once on three rows. Their first use
    in a process loads their libraries' code (Acero, Parquet) and starts Arrow's CPU thread
    pool: work a first batch would otherwise wait for."""
    import io

    import pyarrow.parquet as pq
    t = pa.table({"k": pa.array([1, 2, 1], pa.int64()), "w": pa.array([1, -1, 1], pa.int64())})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    t = pq.read_table(pa.BufferReader(buf.getvalue()))
    summed = t.group_by(["k"]).aggregate([("w", "sum")])
    t.filter(pc.not_equal(t.column("w"), 0)).join(summed, keys=["k"], join_type="left anti")


def dq(name: str) -> str:
    """An identifier double-quoted as ANSI SQL does (DuckDB, delta-rs' DataFusion)."""
    return '"' + name.replace('"', '""') + '"'


UNSUPPORTED = object()


class KeyedScan:
    """A keyed scan of local Parquet files on the driver's DuckDB (the state's keyed reads,
    :mod:`.state.arrangement`; a bag target's retracted rows, :mod:`.sink.target`): the rows
    whose key columns hold one of the given values (per column, so a superset for several
    columns).

    Why DuckDB. Its Parquet reader evaluates the key filter on the key columns first and
    decodes the other columns only where rows match, on every core, and skips the row groups
    whose statistics hold no key. Arrow's dataset scanner decodes every column of every row
    group before it filters, so it costs the same whatever the keys. Measured against it by
    ``benchmarks/keyed_read.py`` on an arrangement shaped like q3's lineitem one at SF 10 (34M
    rows in 34 files), at 15,000 random keys (every row group holds one: no row group is
    skipped, only the decoding is saved) and at a contiguous range of 15,000 keys.

    Exactness: the result is cast to the caller's Arrow schema with a safe cast; key types
    whose equality could differ from Arrow's (floating point, anything nested or binary) and
    any DuckDB error return ``UNSUPPORTED``, and the caller scans another way (the state with
    Arrow's scanner, a bag target with Spark).
    A NULL among a column's values also keeps the rows where that column is NULL, as
    Arrow's ``is_in`` does.
    """

    KEY_TYPES = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_decimal,
                 pa.types.is_date, pa.types.is_boolean)

    def __init__(self):
        self.con = database().cursor()

    def close(self) -> None:
        self.con.close()

    def scan(self, paths: list[str], schema: pa.Schema, keys: dict[str, pa.ChunkedArray | pa.Array],
             limit: int | None):
        """Rows of the Parquet files ``paths`` whose column ``c`` holds one of ``keys[c]``,
        for every key column, as an Arrow table of ``schema``; None when more than ``limit``
        rows match; ``UNSUPPORTED`` when this scan cannot answer exactly."""
        import duckdb

        if not all(any(ok(schema.field(c).type) for ok in self.KEY_TYPES) for c in keys):
            return UNSUPPORTED
        names, conds = [], []
        try:
            for i, (c, values) in enumerate(keys.items()):
                name = f"__keys_{i}"
                values = pc.unique(values)
                self.con.register(name, pa.table({"v": values.drop_null()}))
                names.append(name)
                cond = f"s.{dq(c)} IN (SELECT v FROM {name})"
                if values.null_count:
                    cond = f"({cond} OR s.{dq(c)} IS NULL)"
                conds.append(cond)
            files = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
            cols = ", ".join(f"s.{dq(f.name)}" for f in schema)
            sql = (f"SELECT {cols} FROM read_parquet([{files}], union_by_name = true) s WHERE "
                   + " AND ".join(conds) + (f" LIMIT {int(limit) + 1}" if limit is not None else ""))
            out = arrow(self.con, sql)
            if limit is not None and out.num_rows > limit:
                return None
            return out.rename_columns(schema.names).cast(schema, safe=True)
        except (duckdb.Error, pa.ArrowException) as e:
            log.debug("keyed scan on Arrow: DuckDB could not read %d files exactly: %s", len(paths), e)
            return UNSUPPORTED
        finally:
            for name in names:
                self.con.unregister(name)


def exact_by_position(t: pa.DataType) -> bool:
    """Whether DuckDB's Parquet reader gives a column of Arrow type ``t`` (as pyarrow reads the
    file) back exactly after a safe cast: flat types only, and no nanosecond timestamps
    (INT96 and TIMESTAMP_NANOS, which DuckDB may read at microseconds)."""
    if pa.types.is_timestamp(t):
        return t.unit != "ns"
    return any(ok(t) for ok in (pa.types.is_integer, pa.types.is_floating, pa.types.is_string,
                                pa.types.is_large_string, pa.types.is_string_view, pa.types.is_binary,
                                pa.types.is_large_binary, pa.types.is_binary_view,
                                pa.types.is_decimal, pa.types.is_date, pa.types.is_boolean))


def rows_at(path: str, schema: pa.Schema, positions) -> pa.Table | object:
    """The rows at ``positions`` (ascending, distinct 0-based row numbers; a numpy integer
    array) of the local Parquet file ``path``, in ``schema``'s columns (names as in the file,
    types cast to), in that order; ``UNSUPPORTED`` when a column's type is not read exactly
    this way (:func:`exact_by_position`) or DuckDB fails, and the caller decodes the file with
    pyarrow instead. The caller checks the types the file stores with
    :func:`exact_by_position` too.

    Why DuckDB. pyarrow decodes a row group's column chunks whole, so a few rows of a file of
    one large row group (delta-spark writes such files) cost the whole file. DuckDB's reader
    filters on ``file_row_number`` while it scans: the pages holding none of the rows are
    skipped, and the other columns are decoded only where rows match. The change of a file
    whose deletion vector grew, or of a copy-on-write rewrite, is a few rows of a large file
    (:mod:`.delta.log_changes`; the comparison is ``benchmarks/no_cdf_batch.py``)."""
    import duckdb
    import numpy as np
    if not schema.names or not all(exact_by_position(f.type) for f in schema):
        return UNSUPPORTED
    con = database().cursor()
    try:
        con.register("__positions", pa.table({"r": pa.array(np.asarray(positions, dtype=np.int64))}))
        cols = ", ".join(f"s.{dq(n)}" for n in schema.names)
        file = "'" + path.replace("'", "''") + "'"
        out = arrow(con, f"SELECT {cols} FROM read_parquet({file}, file_row_number = true) s "
                         f"SEMI JOIN __positions p ON s.file_row_number = p.r ORDER BY s.file_row_number")
        if out.num_rows != len(positions):
            log.debug("rows by position: %s gave %d rows for %d positions", path, out.num_rows, len(positions))
            return UNSUPPORTED
        return out.rename_columns(schema.names).cast(schema, safe=True)
    except (duckdb.Error, pa.ArrowException) as e:
        log.debug("rows by position: DuckDB could not read %s exactly: %s", path, e)
        return UNSUPPORTED
    finally:
        con.close()
