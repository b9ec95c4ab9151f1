"""Arrangements: the stored inputs (integrals) of stateful operators, all of one query in ONE
Delta table, read by key.

Layout. The query's state table (``<checkpoint>/state``) is partitioned by
``__arrangement``; its schema is the union of every arrangement's columns (plan column names
are unique in a plan, operator-private columns carry the operator id). An arrangement is a
Z-set whose rows are *additive*: reading it sums its ``additive`` columns per value of the
others (``__weight`` for rows; the accumulators of an aggregate), so a batch's change is
appended as it is, and consolidation is a rewrite that never changes what a read returns.
Its files come in two levels, like a two-level LSM tree:

* ``base``: written by a rebuild or a compaction, by Spark's executors: consolidated,
  range-partitioned and sorted by the arrangement's key, at most ``file_rows`` rows a file, so
  the files' key ranges (Delta min/max statistics) are narrow and disjoint;
* ``delta``: one file per incremental batch, written by the driver (the batch's change is
  change-sized), sorted by key.

Keyed reads. ``lookup(name).read(keys)`` picks the files whose min/max statistics may hold one
of the keys (driver only: no file is opened), then reads just those and keeps the rows at the
keys: a scan on the driver that holds only the matches (up to ``settings.DRIVER_SCAN_ROWS`` picked rows
and ``DRIVER_MATCH_ROWS`` matches; DuckDB's Parquet reader, which filters on the key columns
before it decodes the others, or Arrow's for key types DuckDB may compare differently; files the
process holds, and on local disk unheld ones of at most ``WHOLE_READ_ROWS`` rows, read whole
and filtered in memory), else Spark's executors and a broadcast semi join. The rows of the picked files are the batch's
*state rows read* (DuckDB may skip some of their row groups; they are still counted). A
key change localized in the key space (new ids above the old ones, one customer) reads a few
files; keys spread over the whole key space read most files, which is what any min/max layout
can do (a block of B rows is skipped only when none of the batch's K keys falls in it: with
random keys, K x B >= the arrangement's rows reads all of it); the scan's cost per row is
what keeps such a read cheap.

Compaction (in the batch's commit, same txn): when an arrangement has ``max_delta_files``
delta files its smallest deltas are merged into one delta file (cost: those deltas); when its
delta rows reach ``merge_fraction`` of its base rows (and a floor), everything is merged into
new base files (cost: the arrangement, amortized over the ``merge_fraction`` x base rows of
change that triggered it). Merges of at most ``DRIVER_READ_ROWS`` rows run on the driver with
Arrow, larger ones on Spark's executors. See :class:`CompactionPolicy`. A driver-side merge is
planned before the batch's change is written (:meth:`StateStore._planned`) and written with it:
a change the merge takes is merged without being written first, and on an object store all of
a batch's state files go out in one round trip.

Exactly once: the state table's one commit per batch carries txn ``(app id, batch id)`` (step 3
of the exactly-once protocol, docs/concepts/exactly-once.md); reads happen at the version the
target recorded for the previous batch, never at "latest".
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (BooleanType, DateType, DecimalType, DoubleType, FloatType, IntegralType, StructField,
                               StructType, TimestampNTZType, TimestampType)

from ..changelog import WEIGHT, Changelog, KeySet, Views, cols_sql, consolidate_arrow, q
from ..connect import default_parallelism
from ..delta import DataFile, DeltaTableRef, Txn
from ..delta.files import HELD, may_hold, new_dir, read_whole, stats_bounds, wanted_values, write_arrow, write_spark
from ..duck import UNSUPPORTED, KeyedScan, arrow, database
from .. import ranges
from ..ranges import Bounds, range_partitioned
from ..errors import CommitError
from ..faults import fault_point
from ..threads import at_once, begin
from ..fsum import pair_sum_sql
from .. import location, settings, storage
from ..settings import STATE_FILE_ROWS, spark_confs

log = logging.getLogger(__name__)

ARRANGEMENT = "__arrangement"


@dataclass(frozen=True)
class CompactionPolicy:
    """When an arrangement's files are merged (see the module docstring): everything into
    base files once the delta rows reach ``merge_fraction`` of the base rows and a floor,
    ``min_merge_rows`` when the merge runs on Spark's executors (more than
    ``DRIVER_READ_ROWS`` rows in all), ``min_driver_merge_rows`` (never above
    ``min_merge_rows``) when it runs on the driver; else, once there are ``max_delta_files``
    delta files, the smallest half of them into one delta file (size-tiered, as Cassandra's
    and RocksDB's universal compaction: a delta row is rewritten a logarithmic number of times
    before the base merge, not once per ``max_delta_files`` batches).

    Why two floors: a merge on Spark has a fixed cost (a job, a second at a process's first)
    that ``min_merge_rows`` amortizes; a merge on the driver costs its rows (Arrow, a few
    milliseconds for thousands) and one file written. Delta merges alone cannot keep a small
    arrangement small: an update's retraction cancels its row only in the base, so between
    base merges every changed row stays twice in the deltas, and under the Spark floor a
    thousand-row arrangement would grow to ``min_merge_rows`` before its first base merge.
    The driver floor keeps a tiny arrangement (an aggregate of a few groups, whose every batch
    changes more rows than it holds) from a base merge every batch, one more file written
    each.

    Why ``merge_fraction`` is 0.5 (it was 0.1): a keyed read scans the picked files on DuckDB
    at a cost ``r`` a row (measured by ``benchmarks/keyed_read.py``), a merge into base
    rewrites the arrangement on Spark at a cost ``w`` a row, orders of magnitude above ``r``
    (and more inside a batch's commit, more again as a process's first Spark job). With ``d``
    delta rows a batch over ``B`` base rows, the merge costs ``w x d x (1 + f) / f`` a batch
    amortized and the deltas add ``r x f x B / 2`` to a read: from f = 0.1 to 0.5 the merge's
    amortized cost falls to 3/11 and a read's added cost grows fivefold, and at SF 10
    (customer_order_totals' 1M-row join state, 60k delta rows a batch) the read's stays far
    below the merge's."""
    max_delta_files: int = 8
    merge_fraction: float = 0.5
    min_merge_rows: int = 100_000
    min_driver_merge_rows: int = 1_000

    def merges_into_base(self, base_rows: int, delta_rows: int) -> bool:
        """Whether an arrangement of ``base_rows`` base and ``delta_rows`` delta rows is
        merged into base files now."""
        floor = self.min_merge_rows
        if base_rows + delta_rows <= DRIVER_READ_ROWS:
            floor = min(floor, self.min_driver_merge_rows)
        return delta_rows > 0 and delta_rows >= max(self.merge_fraction * base_rows, floor)

    def delta_merge(self, deltas: list) -> list:
        """The delta files (``.rows``) a delta merge takes: the ``max_delta_files // 2`` (at
        least 2) with the fewest rows. Rows are additive, so any subset merges correctly."""
        n = max(2, self.max_delta_files // 2)
        return sorted(deltas, key=lambda f: f.rows)[:n]


DEFAULT_POLICY = CompactionPolicy()
OBJECT_STORE_POLICY = CompactionPolicy(max_delta_files=4)
"""The policy of a state table on an object store: a keyed read reads every delta file whose
key range holds a changed key (a batch's keys are spread, so most of them), one GET each,
every batch, while a delta merge of files the process already holds (:func:`fetched_scan`:
:data:`~consistent_stream.delta.files.HELD`) costs one PUT: fewer delta files read cost fewer
requests than the merges add."""
DRIVER_READ_ROWS = 250_000
"""A read of whole files (no keys on the driver, an arrangement without a key, a compaction)
holding at most this many rows runs on the driver."""
DRIVER_MATCH_ROWS = 1_000_000
"""Matches a driver-side keyed scan may hold; past it the read goes to Spark's executors."""


@dataclass(frozen=True)
class Arrangement:
    """One operator input kept as state.

    ``schema``: the stored columns (plan names; ``additive`` ones summed on read);
    ``key``: the columns reads look rows up by (empty: one group, every read reads all);
    ``live``: SQL predicate over a consolidated row deciding whether it is kept (default:
    some additive column is non-zero); ``compensated``: pairs ``(hi, lo)`` of additive DOUBLE
    columns that are compensated floating-point accumulators, summed as one double-double
    (:mod:`consistent_stream.fsum`).
    """
    name: str
    schema: StructType
    key: tuple[str, ...]
    additive: tuple[str, ...] = (WEIGHT,)
    live: str | None = None
    compensated: tuple[tuple[str, str], ...] = ()

    def sum_sql(self, column: str) -> str:
        """The aggregate expression summing additive ``column`` over a group's rows: SUM, or
        its part of a compensated pair's sum."""
        for hi, lo in self.compensated:
            if column in (hi, lo):
                return pair_sum_sql(q(hi), q(lo))[0 if column == hi else 1]
        return f"SUM({q(column)})"

    def consolidate_sql(self, relation: str, complete: bool = True) -> str:
        """SQL form of :meth:`consolidate` over the FROM item ``relation``."""
        g = self.group_columns
        sums = ", ".join(f"CAST({self.sum_sql(c)} AS {self.schema[c].dataType.simpleString()}) AS {q(c)}"
                         for c in self.additive)
        group = f" GROUP BY {cols_sql(g)}" if g else ""
        inner = f"SELECT {cols_sql(g) + ', ' if g else ''}{sums} FROM {relation}{group}"
        if self.live and complete:
            cond = self.live
        else:
            cond = " OR ".join(f"COALESCE({q(c)} <> 0, FALSE)" for c in self.additive)
        return f"SELECT {cols_sql(self.schema.fieldNames())} FROM ({inner}) WHERE {cond}"

    def live_rows(self, rows: pa.Table) -> pa.Table:
        """The rows of ``rows`` (consolidated, this arrangement's columns) that pass ``live``,
        on the driver: the predicate, Spark SQL, translated to DuckDB's by sqlglot and
        evaluated by the process's DuckDB database over the Arrow table (a row where it is
        NULL is dropped, as Spark's WHERE drops it). Out: ``rows``' schema."""
        import sqlglot
        cond = sqlglot.transpile(self.live, read="spark", write="duckdb")[0]
        cur = database().cursor()
        try:
            cur.register("__rows", rows)
            keep = arrow(cur, f"SELECT COALESCE({cond}, FALSE) AS keep FROM __rows").column("keep")
        finally:
            cur.close()
        return rows.filter(keep)

    @property
    def group_columns(self) -> list[str]:
        return [f.name for f in self.schema.fields if f.name not in self.additive]

    def consolidate(self, df: DataFrame, complete: bool = True, also: list[str] = ()) -> DataFrame:
        """Sum the additive columns per value of the others (NULLs equal) and drop rows that
        add nothing. ``complete``: ``df`` is the whole arrangement (not a change), so rows
        failing ``live`` are dropped too. ``also``: columns of ``df`` that are functions of
        the key, grouped by too and kept (a rebuild's range column,
        :func:`consistent_stream.ranges.range_partitioned`). Out: the arrangement's
        columns, in order, then ``also``."""
        sums = [F.expr(self.sum_sql(c)).cast(self.schema[c].dataType).alias(c) for c in self.additive]
        g = [F.col(f"`{c}`") for c in [*self.group_columns, *also]]
        out = df.groupBy(*g).agg(*sums) if g else df.groupBy().agg(*sums)
        out = out.select(*[F.col(f"`{c}`") for c in [*self.schema.fieldNames(), *also]])
        if self.live and complete:
            return out.where(self.live)
        cond = None
        for c in self.additive:
            e = F.coalesce(F.col(f"`{c}`") != 0, F.lit(False))
            cond = e if cond is None else cond | e
        return out.where(cond)


@dataclass
class _File:
    """A state file as the driver knows it: relative path, rows, level and key bounds."""
    data: DataFile
    level: str                # "base" or "delta"
    lo: dict = field(default_factory=dict)
    hi: dict = field(default_factory=dict)
    nulls: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.data.num_records


def _delta_encoded(schema: StructType) -> bool:
    """Whether an arrangement of ``schema`` is written with Parquet's delta encodings
    (:func:`~consistent_stream.delta.files.write_spark` ``delta_encoded``): when every column
    is a number, date, timestamp or boolean stored as one (decimals of at most 18 digits are
    64-bit integers in Parquet). Its sorted key then takes a few bits a row where plain values
    take eight bytes, so a keyed read decodes (and, from a cold page cache, reads) a fraction
    of the bytes. A string or wide decimal column would fall back to ``DELTA_BYTE_ARRAY``,
    whose values are decoded one after another from the page's start: a keyed read that
    wants a few rows of such a column decodes all of them (slower than plain values, which
    are skipped), so such an arrangement keeps plain values."""
    def plain_number(t) -> bool:
        if isinstance(t, DecimalType):
            return t.precision <= 18
        return isinstance(t, (IntegralType, DateType, TimestampType, TimestampNTZType, BooleanType, FloatType,
                              DoubleType))
    return all(plain_number(f.dataType) for f in schema.fields)


def _level(path: str) -> str:
    return "delta" if "/delta-" in "/" + path else "base"


@dataclass
class _Merge:
    """A compaction planned before a batch's writes (:meth:`StateStore._planned`): its committed
    ``targets`` merged into ``level`` files, with the batch's ``change`` (the rows held on the
    driver) when the merge takes it; ``files``, the merged files once written."""
    targets: list
    level: str
    change: pa.Table | None
    files: list | None = None


@dataclass
class StateMetrics:
    """What a batch did to its state: rows in the files its keyed reads opened, those files,
    and the rows and files its compactions rewrote."""
    rows_read: int = 0
    files_read: int = 0
    rows_compacted: int = 0
    compactions: list = field(default_factory=list)


class Lookup:
    """Read access to one arrangement as of the previous batch (what a delta rule's ``old``
    argument is). ``empty``: the arrangement holds no row (a rule skips terms over it).
    ``read(keys)``: its consolidated-or-not rows at ``keys`` (a :class:`KeySet` whose columns
    are the arrangement's key columns), or all rows when ``keys`` is None."""

    def __init__(self, store: "StateStore", arrangement: Arrangement):
        self.store, self.arrangement = store, arrangement

    @property
    def empty(self) -> bool:
        return not self.store.files_of(self.arrangement.name)

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog:
        return self.store.read(self.arrangement, keys, null_safe)

    def prefetch(self, keys: KeySet | None, null_safe: bool = True) -> None:
        """Start the read of ``keys`` now (:meth:`StateStore.prefetch`)."""
        self.store.prefetch(self.arrangement, keys, null_safe)

    def read_range(self, ranges: dict[str, list[tuple[object, object]]]) -> Changelog:
        """Its rows whose columns may lie in ``ranges`` (per column, inclusive ``(lo, hi)``
        Python values, None unbounded): the rows of the files whose statistics meet one
        range of every column."""
        return self.store.read_range(self.arrangement, ranges)

    def read_prefix(self, column: str, descending: bool, nulls_first: bool, need: int) -> Changelog:
        """Its first rows in the order of ``column`` (:meth:`StateStore.read_prefix`)."""
        return self.store.read_prefix(self.arrangement, column, descending, nulls_first, need)


class StateStore:
    """All arrangements of one query: keyed reads as of the previous batch, staged changes,
    compaction and the one idempotent state commit of a batch.

    Lives as long as the query runs (across micro-batches in continuous mode): it knows the
    state's files after each of its commits without reading the Delta log again.
    """

    def __init__(self, spark: SparkSession, path: str, arrangements: dict[str, Arrangement], *,
                 file_rows: int = STATE_FILE_ROWS, policy: CompactionPolicy | None = None,
                 properties: dict[str, str] | None = None, table: DeltaTableRef | None = None):
        self.spark, self.path, self.file_rows = spark, path, file_rows
        self.properties = dict(properties or {})   # Delta table properties the state table is created with
        self.policy = policy or DEFAULT_POLICY
        # written only by the run holding the writer lock (``table``: its handle, already opened)
        self.table = table if table is not None else DeltaTableRef(path, own_log=True)
        self.arrangements = dict(arrangements)
        self.version: int | None = None
        self._files: dict[str, list[_File]] = {}
        self.metrics = StateMetrics()
        self._staged: dict[str, tuple[str, object]] = {}   # name -> ("append", Changelog) | ("replace", files)
        self.rebuilding = False
        self.views: Views | None = None
        self.bounds: Bounds | None = None
        self._keyed_scan: KeyedScan | None = None
        # arrangement name -> (keys, null_safe, files, wait for the rows) of a read started early
        self._prefetched: dict[str, tuple[KeySet, bool, list[_File], Callable[[], pa.Table | None]]] = {}

    # ---- the state as of the previous batch --------------------------------------------------
    def open(self, version: int | None, views: Views, *, rebuild: bool = False, bounds: Bounds | None = None) -> None:
        """Start a batch on the state at ``version`` (None: no state yet); its reads become
        relations among ``views``. ``rebuild``: the batch recomputes every arrangement from
        snapshots; reads see no state and the commit replaces every file of ``version``.
        ``bounds``: the key ranges of the batch's executor writes, per column, where the
        sources' statistics give them (:class:`consistent_stream.ranges.SourceBounds`;
        else Spark samples each write's input)."""
        self.views = views
        self.bounds = bounds
        self.metrics = StateMetrics()
        self._staged = {}
        self.rebuilding = rebuild
        if version == self.version:
            return
        self.version = version
        self._files = {}
        if version is None:
            return
        known = self.table.data_files(version)
        if known is not None:   # the replayed log's files (the state table's, at its newest version)
            for f in known:
                name = f.partition_values.get(ARRANGEMENT)
                arrangement = self.arrangements.get(name)
                if arrangement is None:   # an arrangement the plan no longer has: kept, never read
                    self._files.setdefault(name, []).append(_File(f, _level(f.path), {}, {}, {}))
                else:
                    self._files.setdefault(name, []).append(self._known(f, arrangement))
            return
        actions = self.table.add_actions(version)
        for a in actions.to_pylist():
            name = a[f"partition.{ARRANGEMENT}"]
            lo = {k[4:]: v for k, v in a.items() if k.startswith("min.") and v is not None}
            hi = {k[4:]: v for k, v in a.items() if k.startswith("max.") and v is not None}
            nulls = {k[11:]: v for k, v in a.items() if k.startswith("null_count.")}
            f = DataFile(a["path"], int(a["size_bytes"]), int(a["num_records"] or 0), {ARRANGEMENT: name})
            self._files.setdefault(name, []).append(_File(f, _level(a["path"]), lo, hi, nulls))

    def end_batch(self) -> None:
        """End the batch :meth:`open` started: close the DuckDB cursor of its keyed reads (a
        cursor costs microseconds to open; one kept by a store that outlives its run, held by
        Spark's foreachBatch callback, was only closed by the garbage collector). A read
        started early (:meth:`prefetch`) and never asked for is waited for: it closes its own."""
        for *_, wait in self._prefetched.values():
            try:
                wait()
            except Exception as e:  # noqa: BLE001  (nobody asked for its rows)
                log.debug("an unread prefetch failed: %s", e)
        self._prefetched.clear()
        if self._keyed_scan is not None:
            self._keyed_scan.close()
            self._keyed_scan = None

    def lookup(self, arrangement: Arrangement) -> Lookup:
        """Read access to ``arrangement`` for a delta rule."""
        return Lookup(self, arrangement)

    def total_rows(self) -> int:
        """Rows of every arrangement at the version opened, from the files' statistics (no read)."""
        return sum(f.rows or 0 for fs in self._files.values() for f in fs)

    def files_of(self, name: str) -> list[_File]:
        """The files of arrangement ``name`` a read of this batch sees (none when rebuilding)."""
        return [] if self.rebuilding else self._files.get(name, [])

    # ---- keyed reads -------------------------------------------------------------------------
    def _pick(self, arrangement: Arrangement, keys: KeySet | None, null_safe: bool) -> list[_File]:
        files = self.files_of(arrangement.name)
        if keys is None or keys.arrow is None or not arrangement.key:
            return files
        wanted = wanted_values(keys.arrow, list(arrangement.key), null_safe)
        if wanted is None:
            return files
        return [f for f in files if may_hold((f.lo, f.hi, f.nulls), f.rows, wanted)]

    def read(self, arrangement: Arrangement, keys: KeySet | None, null_safe: bool = True) -> Changelog:
        """Rows of ``arrangement`` at ``keys`` (all rows when None) as of the previous batch;
        not consolidated across files, and possibly with rows of other keys of the picked
        files. Counts the picked files' rows as state rows read. Where it runs: keys on the
        driver and picked files of at most ``settings.DRIVER_SCAN_ROWS`` rows: a streaming scan on the
        driver keeping the rows at the keys (up to ``DRIVER_MATCH_ROWS`` of them); whole files
        of at most ``DRIVER_READ_ROWS`` rows: read on the driver; otherwise Spark's executors
        read the files and a semi join keeps the rows at the keys. A read :meth:`prefetch`
        started for the same ``keys`` (the same object), or for keys that cover them (every
        tuple of ``keys`` is one of them: the rows of the others are rows of other keys, as
        above), takes its rows from there."""
        early = self._prefetched.get(arrangement.name)   # (one for other keys: waited for at the batch's end)
        if early is not None and (early[0] is keys and early[1] == null_safe
                                  or keys is not None and early[0].covers(keys)):
            del self._prefetched[arrangement.name]
            return self._read(arrangement, early[2], keys, null_safe, scanned=early[3])
        return self._read(arrangement, self._pick(arrangement, keys, null_safe), keys, null_safe)

    def prefetch(self, arrangement: Arrangement, keys: KeySet | None, null_safe: bool = True) -> None:
        """Start the :meth:`read` of ``arrangement`` at ``keys`` on the process's threads when
        it is a keyed scan on the driver (the files it picks hold at most
        ``settings.DRIVER_SCAN_ROWS`` rows): a delta rule that reads two arrangements (a
        join's two sides, an aggregate's accumulators and value multisets) then scans both at
        once. DuckDB's scan and Arrow's decoding release the GIL, so the two overlap on the
        driver's cores, and on an object store their GETs share a round trip. The scan runs on
        a DuckDB cursor of its own; the read still counts the rows and makes the changelog.
        Anything else (Spark's reads, ranges) starts nothing and is read when asked for."""
        if (keys is None or keys.arrow is None or not arrangement.key or not keys.arrow.num_rows
                or arrangement.name in self._prefetched):
            return
        files = self._pick(arrangement, keys, null_safe)
        if not files or sum(f.rows for f in files) > settings.DRIVER_SCAN_ROWS:
            return

        def scan() -> pa.Table | None:
            own = KeyedScan()
            try:
                return self._read_local(arrangement, files, keys, limit=DRIVER_MATCH_ROWS, scan=own)
            finally:
                own.close()
        self._prefetched[arrangement.name] = (keys, null_safe, files, begin(scan, "state-read"))

    def read_range(self, arrangement: Arrangement, ranges: dict[str, list[tuple[object, object]]]) -> Changelog:
        """Rows of ``arrangement`` as of the previous batch in the files whose min/max
        statistics meet, for every column of ``ranges``, one of its inclusive ``(lo, hi)``
        ranges (None: unbounded on that end); a file without statistics for a column, or
        whose values do not compare with the range's, is read. Counted as state rows read
        like a keyed read."""
        def meets(f: _File, column: str, spans: list[tuple[object, object]]) -> bool:
            a, b = f.lo.get(column), f.hi.get(column)
            if a is None or b is None:
                return f.nulls.get(column) != f.rows   # (a file of NULLs holds no value in a range)
            try:
                return any(not ((lo is not None and b < lo) or (hi is not None and a > hi)) for lo, hi in spans)
            except TypeError:
                return True
        files = [f for f in self.files_of(arrangement.name) if all(meets(f, c, r) for c, r in ranges.items())]
        return self._read(arrangement, files, None, True)

    def read_prefix(self, arrangement: Arrangement, column: str, descending: bool, nulls_first: bool,
                    need: int) -> Changelog:
        """The rows of ``arrangement`` (as of the previous batch) that come before a bound in the
        order of ``column`` (``descending``, NULLs ``nulls_first``), such that at least ``need``
        of them are live (sum of positive weights after consolidation), or every row: every
        row before the bound is in the result, and none after it (a top-N's prefix,
        :mod:`consistent_stream.operators.window`).

        The arrangement is keyed by ``column``, so its base files hold disjoint, sorted ranges
        of it: the files are taken in the order of their first value (Delta min/max
        statistics) until the live rows before the next file's first value reach ``need``,
        doubling the files taken each time. Files that may hold NULLs are taken too when
        NULLs come first. Reads everything (the rule is the same,
        its cost the input's) when a file has no statistics for ``column`` or it is floating
        point, when there are at most 4 x ``need`` rows, and when the files taken exceed
        ``DRIVER_READ_ROWS``."""
        import pyarrow.compute as pc
        files = self.files_of(arrangement.name)
        arrow_type = _arrow_schema(arrangement.schema).field(column).type
        valued = [(_first_value(f, column, descending, arrow_type), f) for f in files
                  if f.nulls.get(column) != f.rows]
        if (sum(f.rows for f in files) <= 4 * need or any(v is None for v, _ in valued)
                or pa.types.is_floating(arrow_type)):   # (NaN sorts last in Spark, nowhere in the statistics)
            return self._read(arrangement, files, None, True)
        try:
            valued.sort(key=lambda p: p[0], reverse=descending)
        except TypeError:
            return self._read(arrangement, files, None, True)
        nullish = [f for f in files if nulls_first and f.nulls.get(column, f.rows) != 0]
        k = next((i + 1 for i in range(len(valued)) if sum(f.rows for _, f in valued[:i + 1]) >= need), len(valued))
        while k < len(valued):
            taken = [f for _, f in valued[:k]] + [f for f in nullish if all(f is not t for _, t in valued[:k])]
            if sum(f.rows for f in taken) > DRIVER_READ_ROWS:
                break
            self.metrics.rows_read += sum(f.rows for f in taken)
            self.metrics.files_read += len(taken)
            data = self._read_local(arrangement, taken, None)
            bound = pa.scalar(valued[k][0], arrow_type)
            col = data.column(column)
            data = data.filter(pc.fill_null(pc.greater(col, bound) if descending else pc.less(col, bound),
                                            nulls_first))
            weights = consolidate_arrow(data, arrangement.additive, arrangement.compensated).column(WEIGHT)
            if (pc.sum(pc.max_element_wise(weights, 0)).as_py() or 0) >= need:
                return Changelog.of_arrow(self.views, data, schema=arrangement.schema)
            k *= 2
        return self._read(arrangement, files, None, True)

    def _read(self, arrangement: Arrangement, files: list[_File], keys: KeySet | None, null_safe: bool,
              scanned: Callable[[], pa.Table | None] | None = None) -> Changelog:
        """:meth:`read` of the picked ``files``; ``scanned``: waits for their keyed scan on the
        driver, started by :meth:`prefetch`."""
        schema = arrangement.schema
        rows = sum(f.rows for f in files)
        self.metrics.rows_read += rows
        self.metrics.files_read += len(files)
        if not files:
            return Changelog.empty(self.views, schema)
        keyed = keys is not None and keys.arrow is not None and bool(arrangement.key)
        if keyed and rows <= settings.DRIVER_SCAN_ROWS:
            data = scanned() if scanned is not None else \
                self._read_local(arrangement, files, keys, limit=DRIVER_MATCH_ROWS)
            if data is not None:
                return Changelog.of_arrow(self.views, data, schema=schema)
        elif rows <= DRIVER_READ_ROWS and (keys is None or keys.arrow is not None):
            return Changelog.of_arrow(self.views, self._read_local(arrangement, files, keys), schema=schema)
        df = self.spark.read.schema(schema).parquet(*[self.table.file_uri(f.data.path) for f in files])
        rel = self.views.add(df)
        if keys is None or not arrangement.key:
            return Changelog(rel, schema.fieldNames(), self.views)
        from ..operators.keyed import key_condition
        sql = (f"SELECT s.* FROM {rel} s LEFT SEMI JOIN {keys.relation()} k ON "
               + key_condition("s", list(arrangement.key), "k", keys.columns, null_safe))
        return Changelog.of_query(self.views, sql, schema.fieldNames())

    def _read_local(self, arrangement: Arrangement, files: list[_File], keys: KeySet | None,
                    limit: int | None = None, scan: KeyedScan | None = None) -> pa.Table | None:
        """The rows of ``files`` (at ``keys`` when given: per key column, its values; a
        superset for several columns), read on the driver batch by batch. None when more
        than ``limit`` rows match. ``scan``: the DuckDB cursor to scan with (default: the
        batch's, :meth:`_duck`; one thread at a time).

        A keyed read on local disk filters the rows in memory (:func:`fetched_scan`) when the
        files the process does not hold yet (:data:`~consistent_stream.delta.files.HELD`) have
        at most ``WHOLE_READ_ROWS`` rows: read whole and held, so the next batch's read of them
        is no read; else DuckDB's keyed scan decodes only the matching rows of every file."""
        import pyarrow.fs as pafs

        fs, base = location.pyarrow_filesystem(self.table.file_uri(""))
        from urllib.parse import unquote
        paths = [base.rstrip("/") + "/" + unquote(f.data.path) for f in files]
        schema = _arrow_schema(arrangement.schema)
        keyed = {c: keys.arrow.column(c) for c in arrangement.key} \
            if keys is not None and arrangement.key and keys.arrow.num_rows else None
        sizes = [f.data.size for f in files]
        whole = [self.table.file_path(f.data.path) for f in files]
        if keyed and isinstance(fs, pafs.LocalFileSystem):
            if _held_or_small(whole, files):
                return fetched_scan(whole, sizes, schema, keyed, limit)
            found = (scan or self._duck()).scan(paths, schema, keyed, limit)
            if found is not UNSUPPORTED:
                return found
        if not isinstance(fs, pafs.LocalFileSystem) and max(sizes, default=0) <= WHOLE_OBJECT_BYTES:
            return fetched_scan(whole, sizes, schema, keyed, limit)
        infos = [pafs.FileInfo(p, type=pafs.FileType.File, size=n) for p, n in zip(paths, sizes)]
        return arrow_scan(infos, schema, keyed, limit, fs)

    def _duck(self) -> "KeyedScan":
        if self._keyed_scan is None:
            self._keyed_scan = KeyedScan()
        return self._keyed_scan

    def read_all(self, arrangement: Arrangement) -> DataFrame:
        """Every row of ``arrangement`` (compaction, rebuild checks); not counted as a keyed read."""
        files = self.files_of(arrangement.name)
        if not files:
            return self.spark.createDataFrame([], arrangement.schema)
        return self.spark.read.schema(arrangement.schema).parquet(
            *[self.table.file_uri(f.data.path) for f in files])

    # ---- staged changes -----------------------------------------------------------------------
    def stage(self, arrangement: Arrangement, change: Changelog) -> None:
        """The batch's change to ``arrangement`` (its columns; additive), appended at commit.
        A change on the driver becomes one delta file; one on executors is written as delta
        files by Spark."""
        if arrangement.name in self._staged:
            raise ValueError(f"state {arrangement.name} staged twice in one batch")
        if change.is_empty:
            return
        self._staged[arrangement.name] = ("append", change)

    def rebuild(self, arrangement: Arrangement, sql: str, *, consolidate: bool = True,
                consolidated: bool = False) -> Changelog:
        """Replace ``arrangement`` by the rows of the SELECT ``sql`` (a rebuild from snapshots),
        written now by Spark's executors as base files; returns the written rows as a changelog
        read back from those files (so the caller never computes ``sql`` twice), consolidated
        when ``consolidate`` or ``consolidated``.

        ``consolidated``: the rows of ``sql`` are consolidated already (an aggregate's
        accumulators, one row per group; a consolidated change): they are written as they come,
        and the read-back is flagged consolidated, as a staged change of the same rows is in an
        incremental batch (:meth:`stage`). No exchange or hash aggregation is spent on them
        beyond the range partitioning and sort of the layout.

        A keyed arrangement's rows are consolidated within the ranges of the key they are
        partitioned by (:meth:`_write_base` ``merge``): one exchange of the rows, where
        consolidating first and range-partitioning the result takes two. An arrangement
        without a key is written as one range, so its rows are consolidated first, by all
        the executors.

        ``consolidate=False`` writes the rows as they come (range-partitioned and sorted all
        the same), for an arrangement whose every reader sums the weights of the rows it
        finds: a row stored twice reads as the row with weight 2, a row and its retraction as
        no row (a join side's lookups, :mod:`consistent_stream.operators.join`). That saves a
        hash aggregation of all its rows, most of the write of a large side; a later
        compaction that re-bases the arrangement consolidates its base with its deltas."""
        consolidate = consolidate and not consolidated   # (rows already distinct: nothing to merge)
        if arrangement.key:
            files = self._write_base(arrangement, self.views.sql(sql), merge=consolidate)
        elif consolidate:
            files = self._write_base(arrangement, self.views.sql(arrangement.consolidate_sql(f"({sql})")))
        else:
            files = self._write_base(arrangement, self.views.sql(sql))
        self._staged[arrangement.name] = ("replace", files)
        rows = sum(f.num_records for f in files)
        if not files:
            return Changelog.empty(self.views, arrangement.schema)
        out = self.spark.read.schema(arrangement.schema).parquet(*[self.table.file_uri(f.path) for f in files])
        ch = Changelog.of_frame(self.views, out, rows=rows)
        ch.consolidated = consolidate or consolidated
        return ch

    def _write_base(self, arrangement: Arrangement, df: DataFrame, *, merge: bool = False) -> list[DataFile]:
        """Write ``df`` (the arrangement's columns) as base files: range-partitioned and sorted
        by the key, at most ``file_rows`` rows a file, by Spark's executors.

        ``merge``: ``df`` is not consolidated (a compaction's files, a keyed rebuild's rows).
        They are range-partitioned by the key first and consolidated within each range, which
        needs no second shuffle (a range of the key holds all rows of its groups): one
        shuffle instead of two, each an exchange of all the arrangement's rows. The ranges'
        bounds come from the sources' statistics where :attr:`bounds` gives them for the
        key's first column (:mod:`consistent_stream.ranges`: the consolidation groups by
        the range column too); otherwise Spark samples ``df`` for them first, a job of its
        own (the exchanges ``df``'s query makes are not made again by the write's job, which
        reuses their output).

        Rows written as they come (not ``merge``) whose scan reads them clustered by the key
        are not exchanged at all (:meth:`_in_scan_order`): each task sorts the rows it read,
        so its files hold narrow ranges, if not disjoint ones. When the written files turn out
        to overlap more than :data:`~consistent_stream.ranges.CLUSTERED_FILES_PER_KEY` (a
        task that read several files of distant ranges), they are written again, ranged, from
        the files themselves (and removed)."""
        cols = [F.col(f"`{f.name}`") for f in arrangement.schema.fields]
        df = df.select(*cols)
        key = [F.col(f"`{c}`") for c in arrangement.key]
        if key and not merge and self._in_scan_order(df, arrangement):
            files = self._write_files(arrangement, df.sortWithinPartitions(*key))
            first = arrangement.key[0]
            spread = ranges.files_per_key([(f.lo.get(first), f.hi.get(first), f.rows)
                                           for f in (self._known(d, arrangement) for d in files)])
            if spread is None or spread <= ranges.CLUSTERED_FILES_PER_KEY:
                return files
            log.info("state %s: %s's files as its scan read them hold a key in %.1f files on average: "
                     "written again in ranges", self.path, arrangement.name, spread)
            written = files
            df = self.spark.read.schema(arrangement.schema).parquet(*[self.table.file_uri(f.path) for f in files])
            files = self._write_ranged(arrangement, df, merge=False)
            storage.remove_many([self.table.file_path(f.path) for f in written])
            return files
        return self._write_ranged(arrangement, df, merge=merge)

    def _write_ranged(self, arrangement: Arrangement, df: DataFrame, *, merge: bool) -> list[DataFile]:
        """:meth:`_write_base` with the key's range exchange (or one range, without a key)."""
        key = [F.col(f"`{c}`") for c in arrangement.key]
        also: list[str] = []
        if key:
            first = arrangement.key[0]
            bounds = self.bounds(first, arrangement.schema[first].dataType) if self.bounds is not None else None
            df, also = range_partitioned(df, list(arrangement.key), default_parallelism(self.spark), bounds)
        else:
            df = df.coalesce(1)
        if merge:
            df = arrangement.consolidate(df, also=also)
        if key:
            df = df.sortWithinPartitions(*key)
        return self._write_files(arrangement, df.drop(*also))

    def _write_files(self, arrangement: Arrangement, df: DataFrame) -> list[DataFile]:
        """``df``'s partitions written as base files of at most ``file_rows`` rows each."""
        with spark_confs(self.spark, {"spark.sql.files.maxRecordsPerFile": str(self.file_rows)}):
            return write_spark(df, self.path, f"{ARRANGEMENT}={arrangement.name}/{new_dir('base')}",
                               partition_values={ARRANGEMENT: arrangement.name},
                               delta_encoded=_delta_encoded(arrangement.schema))

    def _in_scan_order(self, df: DataFrame, arrangement: Arrangement) -> bool:
        """Whether ``df``'s rows come in the partitions its one file scan reads (its physical
        plan exchanges nothing) from a Delta source whose files hold the key's first column
        clustered: a value in at most :data:`~consistent_stream.ranges.CLUSTERED_FILES_PER_KEY`
        of their ``[min, max]`` on average (the source's statistics at the rebuild's cut,
        :meth:`~consistent_stream.ranges.SourceBounds.files_per_key`). False whenever it is
        not known (no statistics, a Spark Connect session's plan)."""
        if not isinstance(self.bounds, ranges.SourceBounds):
            return False
        spread = self.bounds.files_per_key(arrangement.key[0])
        if spread is None or spread > ranges.CLUSTERED_FILES_PER_KEY:
            return False
        try:
            plan = df._jdf.queryExecution().executedPlan().toString()
        except Exception as e:  # noqa: BLE001 (no JVM handle: a Connect session; ranged as before)
            log.debug("no physical plan for %s: %s", arrangement.name, e)
            return False
        return "Exchange" not in plan and plan.count("FileScan") == 1

    # ---- the commit ---------------------------------------------------------------------------
    def schema(self) -> StructType:
        """The state table's schema: every arrangement's columns (nullable), then
        ``__arrangement``."""
        fields: dict[str, StructField] = {}
        for a in sorted(self.arrangements.values(), key=lambda a: a.name):
            for f in a.schema.fields:
                prev = fields.get(f.name)
                if prev is not None and prev.dataType != f.dataType:
                    raise CommitError(f"state {self.path}: column {f.name} has types {prev.dataType} and "
                                      f"{f.dataType} in two arrangements")
                fields.setdefault(f.name, StructField(f.name, f.dataType, True))
        return StructType(list(fields.values()) + [StructField(ARRANGEMENT, _string(), True)])

    def pending_batch(self, app_id: str, after: int) -> tuple[int, dict | None] | None:
        """The batch of query ``app_id`` this state holds beyond batch ``after - 1`` (the state
        one batch ahead of the target: its txn version is at least ``after``), and what its
        commit recorded of the batch (``start`` and ``end``: the planned cut, as the runtime
        writes them, and ``instant``, the batch's instant ({} when not recorded); None when
        the commit records no cut). None in the common case, known from
        the state's txn alone (no commit read): the state holds no later batch of that query.
        Else read from the state's newest commits (maintenance may have committed after it)."""
        if not self.arrangements or not self.table.exists():
            return None
        self.table.refresh()
        done = self.table.txn_version(app_id)
        if done is None or done < after:
            return None
        for c in self.table.history(10):
            if c.metadata.get("app_id") == app_id and str(c.metadata.get("batch_id")) == str(done):
                start, end = c.metadata.get("start"), c.metadata.get("end")
                if start is None or end is None:
                    return done, None

                def js(v):
                    return json.loads(v) if isinstance(v, str) else v

                return done, {"start": js(start), "end": js(end), "instant": js(c.metadata.get("instant") or "{}")}
        return done, None

    def commit(self, txn: Txn, metadata: dict) -> int | None:
        """Step 3 of the exactly-once protocol: ONE commit of every staged change (and of the
        compactions they trigger) with ``txn``. A table already holding ``txn`` was committed by
        a crashed attempt of this batch: skipped (the replay is deterministic). Returns the
        state version the next batch reads (None: no state)."""
        if not self.arrangements:
            return None
        done = None
        if self.table.exists():
            self.table.refresh()
            done = self.table.txn_version(txn.app_id)
        if done is not None and done >= txn.version:
            log.info("state %s already holds batch %s; commit skipped", self.path, txn.version)
            version = self.table.latest_version()
            self.open(version, self.views)
            return version
        adds: list[DataFile] = []
        removes: list[DataFile] = []
        new_files = {n: list(fs) for n, fs in self._files.items()}
        if self.rebuilding:
            removes = [f.data for fs in new_files.values() for f in fs]
            new_files = {}
        merges = {} if self.rebuilding else self._planned(new_files)
        appended = self._append_staged(merges)
        kept = []   # the arrangements whose files the batch keeps: compacted when the policy says
        for name, arrangement in sorted(self.arrangements.items()):
            kind, payload = self._staged.get(name, (None, None))
            old = new_files.get(name, [])
            if name in merges:   # compacted with the batch's writes (the change among them, or beside)
                m = merges[name]
                added = m.files + appended.get(name, [])
                removes += [f.data for f in m.targets]
                adds += [f.data for f in added]
                new_files[name] = [f for f in old if all(f is not t for t in m.targets)] + added
                continue
            if kind == "replace":
                if not self.rebuilding:
                    removes += [f.data for f in old]
                added = [self._known(f, arrangement) for f in payload]
                adds += payload
                new_files[name] = added
                continue
            if kind == "append":
                added = appended[name]
                adds += [f.data for f in added]
                new_files[name] = old + added
            kept.append(name)
        for name, compacted in self._compact([(n, new_files.get(n, [])) for n in kept]).items():
            if compacted is not None:
                dropped, kept_new = compacted
                removes += [f.data for f in dropped if all(f.data is not a for a in adds)]
                adds = [a for a in adds if all(a is not f.data for f in dropped)]
                adds += [f.data for f in kept_new]
                new_files[name] = [f for f in new_files[name] if all(f is not d for d in dropped)] + kept_new
        schema = self.schema()
        version = self.table.commit_files(adds, removes, schema=_arrow_schema(schema), txn=txn,
                                          metadata=metadata, partition_by=[ARRANGEMENT],
                                          configuration=self.properties or None)
        self.version = version
        self._files = {n: fs for n, fs in new_files.items() if fs}
        self._staged = {}
        self.rebuilding = False
        return version

    def _planned(self, files: dict[str, list[_File]]) -> dict[str, _Merge]:
        """The compactions of the commit that can be written with the batch's changes, known
        before those are written: of each arrangement with a staged change held on the driver,
        :meth:`_compaction` of its ``files`` and the change as one more delta file, when it
        runs on the driver (at most ``DRIVER_READ_ROWS`` rows). A merge that takes the change
        merges it unwritten (its delta file is never written, then merged); one of other files
        is written beside it. So each arrangement's writes of a batch go out together: on an
        object store one round trip for all, and one PUT less for a merged change."""
        out = {}
        for name in sorted(self.arrangements):
            kind, change = self._staged.get(name, (None, None))
            if kind != "append" or change.arrow is None:
                continue
            pending = _File(DataFile("", 0, change.arrow.num_rows, {}), "delta")
            planned = self._compaction(files.get(name, []) + [pending])
            if planned is None or sum(f.rows for f in planned[0]) > DRIVER_READ_ROWS:
                continue
            targets, level = planned
            out[name] = _Merge([f for f in targets if f is not pending], level,
                               change.arrow if any(f is pending for f in targets) else None)
        return out

    def _append_staged(self, merges: dict[str, _Merge]) -> dict[str, list[_File]]:
        """Write every staged change (:meth:`_append`) and the ``merges`` planned with them
        (:meth:`_planned`, :meth:`_compact_local`; the merged files set in ``files``): returns
        arrangement name -> the change's new files (none for a change merged unwritten). A
        merge Arrow cannot consolidate is taken out of ``merges`` (its change written as a
        change after all; :meth:`_compact` then plans it as before). On an object store the
        writes the driver holds go out at once (a PUT each: one round trip for all)."""
        staged = {n: (a, self._staged[n][1]) for n, a in sorted(self.arrangements.items())
                  if self._staged.get(n, (None,))[0] == "append"}
        jobs = [("append", n) for n in staged if n not in merges or merges[n].change is None] + \
            [("merge", n) for n in merges]

        def run(job: tuple[str, str]) -> list[_File] | None:
            kind, name = job
            arrangement = self.arrangements[name]
            if kind == "append":
                return self._append(arrangement, staged[name][1])
            m = merges[name]
            files = self._compact_local(arrangement, m.targets, m.level, complete=m.level == "base", change=m.change)
            return None if files is None else [self._known(f, arrangement) for f in files]
        remote = location.is_remote(self.path)
        parallel = [j for j in jobs if j[0] == "merge" or staged[j[1]][1].arrow is not None] if remote else []
        done = dict(zip(parallel, at_once(run, parallel, "state-append", limit=8))) if len(parallel) > 1 else {}
        for j in jobs:
            if j not in done:
                done[j] = run(j)
        out = {n: done[("append", n)] for n in staged if ("append", n) in done}
        for name in list(merges):
            m = merges[name]
            m.files = done[("merge", name)]
            if m.files is None:
                del merges[name]
                if m.change is not None:
                    out[name] = self._append(self.arrangements[name], staged[name][1])
                continue
            fault_point("compacted")
            self._compacted(name, m.targets, m.level, None if m.change is None else m.change.num_rows)
        return out

    def _append(self, arrangement: Arrangement, change: Changelog) -> list[_File]:
        """Write a staged change: one delta file (sorted by key) from the driver, or delta
        files written by Spark. A rebuild on the driver (every read saw no state) writes its
        change as the arrangement's base files instead, as :meth:`_write_base` would:
        consolidated, sorted by key, at most ``file_rows`` rows a file."""
        if self.rebuilding and change.arrow is None:
            df = self.views.sql(f"SELECT {cols_sql(arrangement.schema.fieldNames())} FROM {change.sql}")
            return [self._known(f, arrangement) for f in self._write_base(arrangement, df, merge=True)]
        rel = f"{ARRANGEMENT}={arrangement.name}/{new_dir('base' if self.rebuilding else 'delta')}"
        if change.arrow is not None:
            data = change.arrow.select([f.name for f in arrangement.schema.fields])
            step = max(1, data.num_rows)
            if self.rebuilding:
                try:
                    data = consolidate_arrow(data, arrangement.additive, arrangement.compensated)
                except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    pass   # a key type Arrow cannot group by: reads consolidate what they read
                step = max(1, self.file_rows)
            if arrangement.key:
                data = data.sort_by([(c, "ascending") for c in arrangement.key])
            files = [write_arrow(self.path, rel, data.slice(i, step), {ARRANGEMENT: arrangement.name},
                                 hold=True)   # for later reads: no read
                     for i in range(0, data.num_rows, step)]
        else:
            df = self.views.sql(f"SELECT {cols_sql(arrangement.schema.fieldNames())} FROM {change.sql}")
            if arrangement.key:
                df = df.sortWithinPartitions(*[F.col(f"`{c}`") for c in arrangement.key])
            files = write_spark(df, self.path, rel, partition_values={ARRANGEMENT: arrangement.name},
                                delta_encoded=_delta_encoded(arrangement.schema))
        return [self._known(f, arrangement) for f in files]

    def _known(self, f: DataFile, arrangement: Arrangement) -> _File:
        lo, hi, nulls = stats_bounds(f.stats, _arrow_schema(arrangement.schema))
        return _File(f, _level(f.path), lo, hi, nulls)

    def _compaction(self, files: list[_File]) -> tuple[list[_File], str] | None:
        """(the files to merge, the level of the result: ``base`` or ``delta``) when the
        compaction policy fires for an arrangement of ``files``, else None."""
        deltas = [f for f in files if f.level == "delta"]
        if not deltas:
            return None
        base_rows = sum(f.rows for f in files if f.level == "base")
        delta_rows = sum(f.rows for f in deltas)
        p = self.policy
        if p.merges_into_base(base_rows, delta_rows):
            return files, "base"
        if len(deltas) >= p.max_delta_files:
            return p.delta_merge(deltas), "delta"
        return None

    def _compact(self, arrangements: list[tuple[str, list[_File]]]) -> dict[str, tuple | None]:
        """Each of ``arrangements`` (name, its files) compacted when the policy fires: name ->
        (files replaced, new files), or None. The change-sized compactions run on the driver
        at once (on an object store their files' PUTs share a round trip); the others with
        Spark, one after another, on this thread (their jobs in its job group)."""
        planned = {n: c for n, c in ((n, self._compaction(files)) for n, files in arrangements) if c is not None}

        def local(name: str) -> list[DataFile] | None:
            targets, level = planned[name]
            # only a merge of every file is the whole arrangement: deltas alone are a change,
            # whose rows may fail ``live`` (an update: count 0, sums not 0) and must be kept
            if sum(f.rows for f in targets) > DRIVER_READ_ROWS:
                return None
            return self._compact_local(self.arrangements[name], targets, level, complete=level == "base")
        written = dict(zip(planned, at_once(local, list(planned), "state-compact")))
        out: dict[str, tuple | None] = {n: None for n, _ in arrangements}
        for name, (targets, level) in planned.items():
            arrangement = self.arrangements[name]
            if written[name] is None:
                written[name] = self._compact_spark(arrangement, targets, level)
            fault_point("compacted")
            self._compacted(name, targets, level)
            out[name] = targets, [self._known(f, arrangement) for f in written[name]]
        return out

    def _compacted(self, name: str, targets: list[_File], level: str, change_rows: int | None = None) -> None:
        """Count (:attr:`metrics`) and log a compaction of ``targets`` into ``level`` files, with
        the batch's change of ``change_rows`` rows when it was merged unwritten."""
        rows = sum(f.rows for f in targets) + (change_rows or 0)
        files = len(targets) + (change_rows is not None)
        self.metrics.rows_compacted += rows
        self.metrics.compactions.append({"arrangement": name, "into": level, "files": files, "rows": rows})
        log.info("state %s: compacted %d files (%d rows) of %s into %s files%s", self.path, files, rows, name, level,
                 " (the batch's change among them, merged unwritten)" if change_rows is not None else "")

    def _compact_spark(self, arrangement: Arrangement, targets: list[_File], level: str) -> list[DataFile]:
        """A compaction of ``targets`` into files of ``level`` by Spark."""
        df = self.spark.read.schema(arrangement.schema).parquet(*[self.table.file_uri(f.data.path) for f in targets])
        if level == "base":
            return self._write_base(arrangement, df, merge=True)
        merged = arrangement.consolidate(df, complete=False)
        rel = f"{ARRANGEMENT}={arrangement.name}/{new_dir('delta')}"
        if arrangement.key:
            merged = merged.coalesce(1).sortWithinPartitions(*[F.col(f"`{c}`") for c in arrangement.key])
        return write_spark(merged, self.path, rel, partition_values={ARRANGEMENT: arrangement.name},
                           delta_encoded=_delta_encoded(arrangement.schema))


    def _compact_local(self, arrangement: Arrangement, targets: list[_File], level: str,
                       complete: bool, change: pa.Table | None = None) -> list[DataFile] | None:
        """A change-sized compaction (at most ``DRIVER_READ_ROWS`` rows) on the driver, with
        Arrow: no Spark job. The files of :meth:`_write_base` or of a delta merge (sorted by
        key, at most ``file_rows`` rows a file); a complete merge keeps the rows that pass
        ``live`` (:meth:`Arrangement.live_rows`). ``change``: rows (the arrangement's columns,
        at least) merged with the files' as one more file would be. None when Arrow cannot
        consolidate it (key types Arrow cannot group by, a change whose types do not cast to
        the arrangement's): the caller then compacts with Spark."""
        schema = _arrow_schema(arrangement.schema)
        try:
            data = self._read_local(arrangement, targets, None) if targets else schema.empty_table()
            if change is not None:
                try:
                    change = change.select(schema.names).cast(data.schema)
                except pa.ArrowInvalid:
                    return None
                data = pa.concat_tables([data, change])
            data = consolidate_arrow(data, arrangement.additive, arrangement.compensated)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if complete and arrangement.live:
            data = arrangement.live_rows(data)
        if arrangement.key:
            data = data.sort_by([(c, "ascending") for c in arrangement.key])
        rel = f"{ARRANGEMENT}={arrangement.name}/{new_dir(level)}"
        step = max(1, self.file_rows)
        return [write_arrow(self.path, rel, data.slice(i, step), {ARRANGEMENT: arrangement.name}, hold=True)
                for i in range(0, data.num_rows, step)]


def _first_value(f: _File, column: str, descending: bool, arrow_type: pa.DataType):
    """A bound the file's values of ``column`` do not pass in the order (at or below its
    minimum, or for ``descending`` at or above its maximum), as a value of ``arrow_type``,
    from its statistics (a decimal's, a double outside the bound, rounded outwards to its
    scale); None when unknown."""
    v = (f.hi if descending else f.lo).get(column)
    if v is None or not pa.types.is_decimal(arrow_type):
        return v
    import decimal
    unit = decimal.Decimal(1).scaleb(-arrow_type.scale)
    d = decimal.Decimal(v).quantize(unit, rounding=decimal.ROUND_CEILING if descending else decimal.ROUND_FLOOR)
    limit = decimal.Decimal(10) ** (arrow_type.precision - arrow_type.scale) - unit
    return max(-limit, min(limit, d))


def _string():
    from pyspark.sql.types import StringType
    return StringType()


WHOLE_OBJECT_BYTES = 16 << 20
"""State files on an object store up to this size are read whole, one GET each, all of a read's
files at once (:func:`fetched_scan`); larger ones by Arrow's scanner in ranged GETs."""
WHOLE_READ_ROWS = 250_000
"""A keyed read on local disk reads its files whole and filters them in memory when those the
process does not hold have at most this many rows (:func:`_held_or_small`).

Why. DuckDB's keyed scan costs a statement (a plan, the files' footers) whatever the rows it
keeps, more than decoding such files whole; and once held, the files of an arrangement read
batch after batch (a continuous model, a benchmark's rounds) are filtered without a read.
Larger arrangements keep DuckDB's scan, which decodes only the matching rows. The figures are
in ``benchmarks/keyed_read.py``'s output."""


def _held_or_small(paths: list[str], files: list) -> bool:
    """Whether the ``files`` (``_File`` s, at full ``paths``) that :data:`~consistent_stream.
    delta.files.HELD` does not hold have at most :data:`WHOLE_READ_ROWS` rows."""
    return sum(f.rows for p, f in zip(paths, files) if not HELD.holds(p, f.data.size)) <= WHOLE_READ_ROWS


def _key_filter(keys: dict | None):
    import pyarrow.dataset as pads
    expr = None
    for c, values in (keys or {}).items():
        e = pads.field(c).isin(pc.unique(values))
        expr = e if expr is None else expr & e
    return expr


def fetched_scan(paths: list[str], sizes: list[int], schema: pa.Schema, keys: dict | None,
                 limit: int | None = None) -> pa.Table | None:
    """:func:`arrow_scan` of files read whole and filtered in memory: on an object store one
    GET a file (its size is known from the log, so no HEAD), every file at once (a read costs
    one round trip, not one per file); the files the process already holds (written or read
    before: a file never changes) are not read again
    (:func:`~consistent_stream.delta.files.read_whole`), and the ones read are held.
    ``sizes``: the files' bytes, from the log."""
    tables = read_whole(paths, sizes, schema.names, name="state-read")
    if not tables:
        return schema.empty_table()
    try:   # the rows at the keys first, cast after: the held files' types are the plain ones
        wanted = {c: pc.unique(values) for c, values in keys.items()} if keys else None
        data = pa.concat_tables([(t.filter(_key_mask(t, wanted)) if wanted else t).cast(schema) for t in tables])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        import pyarrow.dataset as pads
        data = pads.dataset([t.cast(schema) for t in tables], schema=schema).to_table(filter=_key_filter(keys))
    return None if limit is not None and data.num_rows > limit else data


def _key_mask(t: pa.Table, wanted: dict):
    """The rows of ``t`` whose column ``c`` holds one of ``wanted[c]`` (distinct values) for
    every key column, as a boolean mask (``is_in``: a NULL among the values matches NULLs, as
    :func:`_key_filter`)."""
    mask = None
    for c, values in wanted.items():
        col = t.column(c)
        m = pc.is_in(col, value_set=values.cast(col.type))
        mask = m if mask is None else pc.and_(mask, m)
    return mask


def arrow_scan(paths: list, schema: pa.Schema, keys: dict | None, limit: int | None = None,
               filesystem=None) -> pa.Table | None:
    """Rows of the Parquet files ``paths`` (paths, or ``FileInfo`` s with their sizes: no
    HEAD per file; Arrow table of ``schema``) whose column ``c`` holds one of ``keys[c]`` for
    every key column (all rows when ``keys`` is None), read with Arrow's dataset scanner a
    batch at a time; None when more than ``limit`` rows match. A NULL among a column's values
    matches NULLs (``is_in``)."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    expr = _key_filter(keys)
    if paths and isinstance(paths[0], pafs.FileInfo):
        dataset = pads.FileSystemDatasetFactory(filesystem, paths, pads.ParquetFileFormat()).finish(schema)
    else:
        dataset = pads.dataset(paths, schema=schema, format="parquet", filesystem=filesystem)
    scanner = dataset.scanner(filter=expr)
    if limit is None:
        return scanner.to_table()
    batches, n = [], 0
    for b in scanner.to_batches():
        n += b.num_rows
        if n > limit:
            return None
        if b.num_rows:
            batches.append(b)
    return pa.Table.from_batches(batches, schema=schema)


@functools.lru_cache(maxsize=256)
def _arrow_schema(schema: StructType) -> pa.Schema:
    """``schema`` as Arrow's (cached: a Spark type hashes by its string form)."""
    from ..delta.deltars import arrow_schema
    return arrow_schema(schema)
