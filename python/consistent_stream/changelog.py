"""Changelogs as Z-sets: rows plus an integer weight column ``__weight``.

+1 is an insertion, -1 a retraction; an update is ``-old, +new``. A Z-set is *consolidated*
when every distinct full row appears once with its summed, non-zero weight (DBSP's
``consolidate``; Flink's changelog normal form without UPDATE_BEFORE/AFTER pairs).

A :class:`Changelog` is one operator's change in one micro-batch, as a *relation of Spark
SQL*: a query text over the batch's temporary views. The delta rules compose these texts, so
a whole chain of operators up to the next materialization is one ``spark.sql`` call and one
Spark job (the DataFrame API would cost a JVM round trip per column and per step: 5,000 of
them for a TPC-H Q3 batch). Where the change lives:

* on the driver as Arrow when it is change-sized (then its size and emptiness are known
  without a Spark job, and it reaches Spark as a broadcast relation);
* on the executors, as files or a lazy plan (a rebuild from snapshots, or a change too large
  for the driver).
"""
from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from .connect import is_connect, sql_over

WEIGHT = "__weight"

BROADCAST_BYTES = 64 << 20
"""Driver-side changelogs up to this size (Arrow bytes) are broadcast to the joins that use
them; Spark cannot size a relation made from Arrow batches on its own."""
SINGLE_PARTITION_ROWS = 100_000
"""Driver-side changelogs up to this many rows reach Spark as ONE partition: a query over
such relations only needs no shuffle at all (a single partition satisfies every required
distribution), so a delta rule's GROUP BYs, joins and UNIONs run as one stage instead of one
stage per exchange, each stage a fixed scheduling cost that dwarfs a change-sized query's work
(a q1 aggregate output over a 12k-row change: 7 exchanges -> 1)."""


def q(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def cols_sql(columns: list[str], alias: str | None = None) -> str:
    """``a.`c1`, a.`c2``` (no alias: unqualified)."""
    p = f"{alias}." if alias else ""
    return ", ".join(f"{p}{q(c)}" for c in columns)


def arrow_to_spark(spark: SparkSession, data: pa.Table, schema=None) -> DataFrame:
    """An Arrow table as a Spark DataFrame (``schema``: the Spark schema to give it; default
    from Arrow). Use this, never ``spark.createDataFrame(table)`` directly: pyspark 4.2.1
    silently drops every record batch that follows an empty batch (a table whose batches hold
    1, 0 and 1 rows arrives with 1 row), and tables concatenated or filtered by pyarrow often
    carry empty batches."""
    if schema is None:
        from pyspark.sql.pandas.types import from_arrow_schema
        schema = from_arrow_schema(data.schema)
    if data.num_rows == 0:
        return spark.createDataFrame([], schema)
    batches = [b for b in data.to_batches() if b.num_rows]
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=data.schema), schema=schema)


def arrow_has_types(data: pa.Table, schema: StructType) -> bool:
    """Whether the Arrow columns of ``data`` have the Spark types of ``schema`` (nullability
    aside)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    try:
        have = from_arrow_schema(data.schema)
    except (TypeError, NotImplementedError):
        return False
    return [(f.name, f.dataType) for f in have.fields] == [(f.name, f.dataType) for f in schema.fields]


def consolidate_arrow(z: pa.Table, additive: tuple[str, ...] = (WEIGHT,),
                      pairs: tuple[tuple[str, str], ...] = (), use_threads: bool = False) -> pa.Table:
    """Sum the ``additive`` columns (default ``__weight``) per value of the other columns
    (nulls equal) and drop rows whose sums are all zero or NULL (Arrow, no Spark). ``pairs``:
    additive ``(hi, lo)`` columns of compensated floating-point accumulators, summed exactly
    (:func:`consistent_stream.fsum.consolidate_pairs_arrow`). ``use_threads``: group on
    Arrow's threads (a large change read on its own, :mod:`.delta.log_changes`; the rows come
    out in another order). Out: ``z``'s columns and types, sums cast back (an overflow
    raises). Raises ``pa.ArrowNotImplementedError`` for column types Arrow cannot group by
    (nested)."""
    import pyarrow.compute as pc
    if z.num_rows == 0:
        return z
    cols = [c for c in z.column_names if c not in additive]
    if pairs:
        from .fsum import consolidate_pairs_arrow
        paired = {c for pair in pairs for c in pair}
        out_table = consolidate_pairs_arrow(z, cols, list(pairs), [c for c in additive if c not in paired])
        out = {c: out_table.column(c) for c in z.column_names}
    else:
        if cols:
            g = z.group_by(cols, use_threads=use_threads).aggregate([(c, "sum") for c in additive])
        else:
            g = pa.table({f"{c}_sum": [pc.sum(z.column(c)).as_py()] for c in additive})
        out = {c: g.column(c) for c in cols}
        for c in additive:
            out[c] = pc.cast(g.column(f"{c}_sum"), z.schema.field(c).type)
    keep = None
    for c in additive:
        nz = pc.fill_null(pc.not_equal(out[c], pa.scalar(0).cast(out[c].type)), False)
        keep = nz if keep is None else pc.or_(keep, nz)
    return pa.table([out[c] for c in z.column_names], schema=z.schema).filter(keep)


def data_columns(df: DataFrame) -> list[str]:
    """The columns of ``df`` other than the weight."""
    return [c for c in df.columns if c != WEIGHT]


def consolidate(df: DataFrame) -> DataFrame:
    """Sum the weights of equal rows and drop rows whose weight is zero (DataFrame form).

    In: any columns plus ``__weight`` (bigint). Out: the same columns, one row per distinct
    data row, ``__weight`` != 0. Rows compare with SQL GROUP BY semantics (NULLs equal).
    """
    cols = data_columns(df)
    if not cols:
        return df.groupBy().agg(F.sum(WEIGHT).cast("bigint").alias(WEIGHT)).where(F.col(WEIGHT) != 0)
    return (df.groupBy(*[F.col(f"`{c}`") for c in cols])
            .agg(F.sum(WEIGHT).cast("bigint").alias(WEIGHT))
            .where(F.col(WEIGHT) != 0))


def consolidate_sql(relation: str, columns: list[str]) -> str:
    """SQL form of :func:`consolidate` over ``relation`` (a FROM item) whose data columns are
    ``columns``."""
    keys = cols_sql(columns)
    sel = f"{keys}, " if columns else ""
    group = f" GROUP BY {keys}" if columns else ""
    return (f"SELECT {sel}CAST(SUM({q(WEIGHT)}) AS BIGINT) AS {q(WEIGHT)} FROM {relation}{group} "
            f"HAVING SUM({q(WEIGHT)}) <> 0")


def with_weight(df: DataFrame, weight: int = 1) -> DataFrame:
    """Turn a plain relation into a Z-set: every row gets ``__weight = weight``."""
    return df.withColumn(WEIGHT, F.lit(weight).cast("bigint"))


class Views:
    """The temporary views one batch's SQL reads (driver-side changes, state reads, source
    snapshots), named uniquely and dropped by :meth:`drop` when the batch ends.

    A driver-side change is registered with Spark only when a Spark query first reads it
    (:meth:`sql`): a change the local engine consumes never costs a ``createDataFrame`` (an
    Arrow transfer to the JVM and a plan, each time). Run every Spark query over these views
    through :meth:`sql`. Over Spark Connect no view is created: each query carries the
    DataFrames it reads (:func:`consistent_stream.connect.sql_over`), so what it returns stays
    valid after :meth:`drop`."""
    _ids = itertools.count()
    _PREFIX = re.compile(r"\b__cs\d+_(?=\d+\b)")

    @staticmethod
    def stable(text: str) -> str:
        """``text`` with the batch taken out of every view name (``__cs7_3`` -> ``__cs_3``): a
        plan's delta queries then read the same in every batch, for what is cached by SQL
        (the local engine's translation). Names of two ``Views`` may then collide; a caller
        mapping names must check."""
        return Views._PREFIX.sub("__cs_", text)

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.prefix = f"__cs{next(Views._ids)}_"
        self.names: list[str] = []
        self._naming = threading.Lock()
        self.arrow: dict[str, pa.Table] = {}
        """The views whose rows are on the driver: name -> the same rows as Arrow, with the
        view's Spark types (what :mod:`consistent_stream.exec.local` may read)."""
        self._pending: dict[str, Callable[[], DataFrame]] = {}
        self._frames: dict[str, DataFrame] | None = {} if is_connect(spark) else None
        """Over Connect: the views' DataFrames by name (nothing registered in the session)."""

    def _name(self) -> str:
        with self._naming:   # (a batch reads its sources' changes on several threads)
            name = f"{self.prefix}{len(self.names)}"
            self.names.append(name)
        return name

    def add(self, df: DataFrame, arrow: pa.Table | None = None) -> str:
        """Register ``df`` as a new view; ``arrow``: the same rows on the driver, if they are."""
        name = self._name()
        if self._frames is not None:
            self._frames[name] = df
        else:
            df.createOrReplaceTempView(name)
        if arrow is not None:
            self.arrow[name] = arrow
        return name

    def add_lazy(self, make_df: Callable[[], DataFrame], arrow: pa.Table | None = None) -> str:
        """A new view whose DataFrame ``make_df()`` is only built (and registered) when a
        Spark query reads it; ``arrow``: its rows on the driver, for the local engine."""
        name = self._name()
        self._pending[name] = make_df
        if arrow is not None:
            self.arrow[name] = arrow
        return name

    def sql(self, text: str) -> DataFrame:
        """``spark.sql(text)``, after registering the lazy views ``text`` names."""
        for name in [n for n in self._pending if re.search(rf"\b{n}\b", text)]:
            df = self._pending.pop(name)()
            if self._frames is not None:
                self._frames[name] = df
            else:
                df.createOrReplaceTempView(name)
        if self._frames is None:
            return self.spark.sql(text)
        return sql_over(self.spark, text, {n: df for n, df in self._frames.items() if re.search(rf"\b{n}\b", text)})

    def drop(self) -> None:
        for n in self.names:
            if n not in self._pending and self._frames is None:
                self.spark.catalog.dropTempView(n)
        self.names.clear()
        if self._frames is not None:
            self._frames.clear()
        self.arrow.clear()
        self._pending.clear()


@dataclass
class Changelog:
    """One batch's change of one plan node (``columns``, the last being ``__weight``).

    ``sql``: a FROM item (a view name or a parenthesized query) over ``views``. ``arrow``:
    the same rows on the driver, when the change was materialized there. ``rows``: the number
    of rows when known without a job (None: unknown). ``consolidated``: each distinct row
    once, non-zero weights. ``unique_by``: for a consolidated change, data columns whose values
    already tell its rows apart (the other columns are functions of them: a left outer join's
    left columns when each left row meets at most one right row); None when only all of its
    data columns do. ``local``: linear operators over driver-side relations only, so
    evaluating it again costs less than materializing it. ``positive``: every weight is
    positive, a relation rather than a change (a source's snapshot, every row +1, and what
    operators that only add rows make of it: filters, projections, joins of such relations);
    consolidating it changes how a row's copies are written, ``(r, 1), (r, 1)`` or
    ``(r, 2)``, never which rows there are.
    """
    sql: str
    columns: list[str]
    views: Views
    arrow: pa.Table | None = None
    rows: int | None = None
    consolidated: bool = False
    local: bool = False
    unique_by: tuple[str, ...] | None = None
    positive: bool = False
    _df: DataFrame | None = field(default=None, repr=False)

    @staticmethod
    def of_query(views: Views, sql: str, columns: list[str], rows: int | None = None) -> "Changelog":
        """A lazy change: the SELECT ``sql`` (parenthesized here)."""
        return Changelog(f"({sql})", list(columns), views, rows=rows)

    @staticmethod
    def of_frame(views: Views, df: DataFrame, rows: int | None = None, arrow: pa.Table | None = None) -> "Changelog":
        """A change that is ``df``; ``arrow``: the same rows on the driver, with ``df``'s types."""
        return Changelog(views.add(df, arrow), list(df.columns), views, arrow=arrow, rows=rows,
                         local=arrow is not None, _df=df)

    @staticmethod
    def of_arrow(views: Views, data: pa.Table, schema: StructType | None = None,
                 consolidated: bool = False) -> "Changelog":
        """A driver-side change (broadcast to the joins that read it when small). Spark sees
        it only once a Spark query reads it (:meth:`Views.sql`)."""
        def make_df() -> DataFrame:
            df = arrow_to_spark(views.spark, data, schema)
            if 0 < data.num_rows <= SINGLE_PARTITION_ROWS:
                df = df.coalesce(1)
            if data.num_rows and data.nbytes <= BROADCAST_BYTES:
                df = F.broadcast(df)
            return df
        # a change whose Arrow types are not its Spark types is left to Spark
        local = data if schema is None or arrow_has_types(data, schema) else None
        columns = data.column_names if schema is None else schema.fieldNames()
        return Changelog(views.add_lazy(make_df, local), columns, views, arrow=data, rows=data.num_rows,
                         consolidated=consolidated, local=True)

    @staticmethod
    def of_source_change(views: Views, data: pa.Table, schema: StructType | None = None,
                         grouped: bool = False) -> "Changelog":
        """A source's change read on the driver (source columns + ``__weight``), consolidated
        here with Arrow: an update of columns the model does not read cancels out, so the
        change is known to be empty and its terms cost no Spark job. Floating-point columns
        are summed but not flagged consolidated (Arrow and Spark may group NaN and -0.0
        differently; Spark consolidates again where it matters). ``grouped``: the reader
        consolidated ``data`` already, as :func:`consolidate_arrow` would (the Delta log's
        reader, :func:`consistent_stream.delta.log_changes.consolidate`, which leaves a
        change with nested columns as it is), so it is not grouped a second time."""
        if grouped:
            if any(pa.types.is_nested(f.type) for f in data.schema):
                return Changelog.of_arrow(views, data, schema=schema)
        else:
            try:
                data = consolidate_arrow(data)
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return Changelog.of_arrow(views, data, schema=schema)
        exact = not any(pa.types.is_floating(f.type) for f in data.schema)
        return Changelog.of_arrow(views, data, schema=schema, consolidated=exact)

    @staticmethod
    def empty(views: Views, schema: StructType) -> "Changelog":
        """The empty change of ``schema`` (no Spark job, no view)."""
        sel = ", ".join(f"CAST(NULL AS {f.dataType.simpleString()}) AS {q(f.name)}" for f in schema.fields)
        return Changelog(f"(SELECT {sel} WHERE FALSE)", schema.fieldNames(), views, rows=0, consolidated=True)

    @property
    def is_empty(self) -> bool:
        """Known to hold no row."""
        return self.rows == 0

    @property
    def data_columns(self) -> list[str]:
        return [c for c in self.columns if c != WEIGHT]

    @property
    def df(self) -> DataFrame:
        if self._df is None:
            self._df = self.views.sql(f"SELECT * FROM {self.sql}")
        return self._df

    @property
    def small(self) -> bool:
        return self.arrow is not None and self.arrow.nbytes <= BROADCAST_BYTES

    def consolidated_sql(self) -> str:
        """A FROM item of this change, consolidated."""
        if self.consolidated:
            return self.sql
        return f"({consolidate_sql(self.sql, self.data_columns)})"

    def keys(self, columns: list[str], *, drop_null: bool = False) -> "KeySet":
        """The distinct values of ``columns`` in this change (the keys a batch touches), as
        columns named ``columns``. ``drop_null``: leave out tuples with a NULL (SQL ``=`` keys
        never match them)."""
        if self.arrow is not None:
            t = self.arrow.select(columns)
            if drop_null and t.num_rows:
                import pyarrow.compute as pc
                mask = None
                for c in columns:
                    m = pc.is_valid(t.column(c))
                    mask = m if mask is None else pc.and_(mask, m)
                t = t.filter(mask)
            if t.num_rows:
                t = t.group_by(columns, use_threads=False).aggregate([])
            return KeySet(self.views, list(columns), t, None)
        where = (" WHERE " + " AND ".join(f"{q(c)} IS NOT NULL" for c in columns)) if drop_null else ""
        return KeySet(self.views, list(columns), None, f"(SELECT DISTINCT {cols_sql(columns)} FROM {self.sql}{where})")


@dataclass
class KeySet:
    """Key tuples a batch touches (``columns``): on the driver (``arrow``: state reads can
    skip files by their statistics) or as a FROM item (``sql``)."""
    views: Views
    columns: list[str]
    arrow: pa.Table | None
    sql: str | None

    @property
    def small(self) -> bool:
        return self.arrow is not None and self.arrow.nbytes <= BROADCAST_BYTES

    @property
    def empty(self) -> bool:
        return self.arrow is not None and self.arrow.num_rows == 0

    def covers(self, keys: "KeySet") -> bool:
        """Whether every tuple of ``keys`` (columns named as this set's) is one of this set's,
        both on the driver; a tuple with a NULL is not covered."""
        if self.arrow is None or keys.arrow is None:
            return False
        if keys.arrow.num_rows == 0:
            return True
        try:
            missing = keys.arrow.select(self.columns).cast(self.arrow.schema) \
                .join(self.arrow, keys=list(self.columns), join_type="left anti")
        except (KeyError, ValueError, pa.ArrowException):
            return False
        return missing.num_rows == 0

    def renamed(self, columns: list[str]) -> "KeySet":
        """The same tuples under other column names (the other side's key columns)."""
        if self.arrow is not None:
            return KeySet(self.views, list(columns), self.arrow.rename_columns(list(columns)), None)
        sel = ", ".join(f"{q(a)} AS {q(b)}" for a, b in zip(self.columns, columns))
        return KeySet(self.views, list(columns), None, f"(SELECT {sel} FROM {self.sql})")

    def relation(self) -> str:
        """A FROM item of the keys (a broadcast view when they are on the driver)."""
        if self.sql is None:
            arrow, small, spark = self.arrow, self.small, self.views.spark

            def make_df() -> DataFrame:
                df = arrow_to_spark(spark, arrow)
                return F.broadcast(df) if small else df
            self.sql = self.views.add_lazy(make_df, arrow)
        return self.sql
