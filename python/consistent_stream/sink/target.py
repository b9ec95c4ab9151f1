"""The target commit: exactly one Delta commit per micro-batch, idempotent by txn.

Incremental batches: the batch's consolidated output changelog (size of the change) is on
the driver as Arrow. With a unique key (configured, or inferred from the plan) it becomes, per
key value, an upsert (the key has a +1 row) or a delete (only a -1 row). A view without a
unique key is a bag: a row whose weight is +w gets w more copies, and a row with -w, whose
multiplicity before the batch was m, has its m copies deleted and m - w inserted again.
Either way one MERGE (delta-rs) applies it, with txn ``(app id, batch id)``; a replayed
batch whose txn the target already holds is skipped by the caller.

Rebuilds (the first batch of a query, every full refresh, a batch recomputed from snapshots)
and incremental changes too large for the driver replace the target instead: Spark's
executors write the new files, and one commit removes the old ones and adds these, with the
txn. The driver only lists files; or, for a rebuild small enough to run on the driver
(the model's ``driver_rebuild_rows``), writes the few files itself.

The changes are sorted by all columns before the commit, so the same input gives the same
commit whatever Spark's partitioning and shuffle order were.
"""
from __future__ import annotations

import json
import re
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .. import settings
from ..changelog import WEIGHT, consolidate
from ..connect import default_parallelism
from ..delta import DeltaTableRef, Docs, Txn
from ..errors import CommitError, UniqueKeyViolation
from ..ranges import range_partitioned
from ..operators.keyed import key_condition, key_in, row_keys
from ..settings import spark_confs
from . import rewrite

OP = "__op"


def sink_changes(delta: pa.Table, unique_key: list[str], model: str, *, first: bool) -> pa.Table:
    """Consolidated output changelog (target columns + ``__weight``) -> target changes: the
    target's columns + ``__op`` ('upsert' | 'delete'), one row per key.

    Raises UniqueKeyViolation when a key has two output rows (also when one row appears
    twice), CommitError when the first batch holds a retraction.
    """
    w = delta.column(WEIGHT)
    if delta.num_rows and pc.max(pc.abs(w)).as_py() > 1:
        i = pc.index(pc.greater(pc.abs(w), 1), True).as_py()
        row = {k: delta.column(k)[i].as_py() for k in unique_key}
        raise UniqueKeyViolation(
            f"model {model}: unique_key {unique_key} is not unique: the output has "
            f"{abs(w[i].as_py())} identical rows with key {row}. Fix the model SQL or the "
            f"unique_key config; nothing was committed for this batch")
    plus = delta.filter(pc.greater(w, 0)).drop_columns([WEIGHT])
    minus = retractions(delta)
    if first and minus.num_rows:
        raise CommitError(f"model {model}: the first batch produced retractions; this is a bug")
    _check_one_row_per_key(plus, unique_key, model)
    # a key with a -1 row and no +1 row is deleted. NULL keys compare equal, as in the MERGE
    # (IS NOT DISTINCT FROM)
    deletes = minus.filter(pc.invert(key_in(minus, plus, unique_key))) if minus.num_rows else minus
    deletes = deletes.select(plus.column_names).cast(plus.schema)
    ops = pa.concat_tables([
        plus.append_column(OP, pa.array(["upsert"] * plus.num_rows, pa.string())),
        deletes.append_column(OP, pa.array(["delete"] * deletes.num_rows, pa.string())),
    ])
    return _sorted(ops)


def retractions(delta: pa.Table) -> pa.Table:
    """The rows of weight -1 of a consolidated output changelog (target columns +
    ``__weight``), without the weight: by the central contract, the target's rows the batch
    retracts."""
    return delta.filter(pc.less(delta.column(WEIGHT), 0)).drop_columns([WEIGHT])


def _check_one_row_per_key(rows: pa.Table, unique_key: list[str], model: str, weight: str | None = None) -> None:
    """Raise UniqueKeyViolation naming the first key of ``rows`` that has more than one row
    (a row counting as ``weight`` rows when that column is given)."""
    if not rows.num_rows:
        return
    agg, n = ([(weight, "sum")], f"{weight}_sum") if weight else ([([], "count_all")], "count_all")
    counts = rows.group_by(unique_key, use_threads=False).aggregate(agg)
    dup = counts.filter(pc.greater(counts.column(n), 1))
    if dup.num_rows:
        raise _duplicate_key(model, unique_key, {k: dup.column(k)[0].as_py() for k in unique_key},
                             dup.column(n)[0].as_py())


def _duplicate_key(model: str, unique_key: list[str], key, rows) -> UniqueKeyViolation:
    """The error of an output with ``rows`` rows at ``key`` (its values by column)."""
    return UniqueKeyViolation(
        f"model {model}: unique_key {unique_key} is not unique: key {key} has {rows} rows in the output. Fix the "
        f"model SQL or the unique_key config; nothing was committed for this batch")


def _rebuilt_retraction(model: str) -> CommitError:
    """The error of a rebuild whose rows hold a retraction (a delta rule's bug)."""
    return CommitError(f"model {model}: the rebuild produced retractions; this is a bug")


def _sorted(t: pa.Table) -> pa.Table:
    """``t`` in a total order of its columns (NULLs last): a deterministic file layout."""
    keys = [(c, "ascending") for c in t.column_names
            if not (pa.types.is_nested(t.schema.field(c).type) or pa.types.is_dictionary(t.schema.field(c).type))]
    return t.sort_by(keys) if keys and t.num_rows > 1 else t


def bag_changes(delta: pa.Table, old_counts: pa.Table | None, model: str, *, first: bool) -> pa.Table:
    """Consolidated output changelog of a bag view -> the MERGE's source rows: target
    columns + ``__op`` ('delete': remove every copy of the row; 'insert': add one copy).

    ``old_counts``: for the rows with a negative weight, their multiplicity before the batch
    (data columns + ``__count`` int64); rows missing there have none. Raises CommitError when
    a retraction exceeds the row's multiplicity (the view and the target disagree).
    """
    cols = [c for c in delta.column_names if c != WEIGHT]
    w = delta.column(WEIGHT).to_pylist()
    old = dict(zip(row_keys(old_counts, cols), old_counts.column("__count").to_pylist())) \
        if old_counts is not None and old_counts.num_rows else {}
    take, delete_rows = [], []
    for i, (row, wi) in enumerate(zip(row_keys(delta, cols), w)):
        if wi > 0:
            take += [i] * wi
            continue
        if first:
            raise CommitError(f"model {model}: the first batch produced retractions; this is a bug")
        m = old.get(row, 0)
        if m + wi < 0:
            raise CommitError(
                f"model {model}: the batch retracts {-wi} copies of a row the target holds {m} times "
                f"({dict(zip(cols, row))}); the target was changed outside consistent_stream. Run "
                f"dbt run --full-refresh. Nothing was committed for this batch")
        delete_rows.append(i)
        take += [i] * (m + wi)
    data = delta.select(cols)
    out = pa.concat_tables([
        data.take(pa.array(delete_rows, pa.int64())).append_column(
            OP, pa.array(["delete"] * len(delete_rows), pa.string())),
        data.take(pa.array(take, pa.int64())).append_column(OP, pa.array(["insert"] * len(take), pa.string())),
    ])
    return _sorted(out)


def multiplicities(spark, target: DeltaTableRef, version: int, delta: pa.Table) -> pa.Table | None:
    """For the rows of a bag's consolidated output changelog ``delta`` (target columns +
    ``__weight``) with a negative weight, their number of copies in the target at
    ``version``: those columns + ``__count`` (int64), for :func:`bag_changes`; rows the target
    lacks are missing. None when no row has a negative weight.

    A bag has no key to look rows up by, so every column is one: the driver's DuckDB scans
    the target's files for the rows whose every column holds one of the retracted rows'
    values (:class:`~consistent_stream.duck.KeyedScan`), then keeps the rows equal to a
    retracted one (NULLs equal, as the MERGE's IS NOT DISTINCT FROM) and counts them. No
    Spark job, where Spark's semi join over the target ran 3, each with a fixed scheduling
    cost that dwarfs a change-sized lookup. Spark scans instead when DuckDB cannot answer
    exactly (a floating point or nested column, a partitioned or remote target), when the
    files hold more than ``DRIVER_SCAN_ROWS`` rows, or when more than ``MAX_DRIVER_ROWS`` rows
    match."""
    neg = delta.filter(pc.less(delta.column(WEIGHT), 0)).drop_columns([WEIGHT])
    if neg.num_rows == 0:
        return None
    counts = _multiplicities_on_driver(target, version, neg)
    return counts if counts is not None else _multiplicities_on_spark(spark, target, version, neg)


def _multiplicities_on_driver(target: DeltaTableRef, version: int, neg: pa.Table) -> pa.Table | None:
    """:func:`multiplicities` on the driver's DuckDB; None when it cannot answer (see there)."""
    from ..duck import UNSUPPORTED, KeyedScan
    if "://" in target.path or target.partition_columns():
        return None
    if target.num_records(version) > settings.DRIVER_SCAN_ROWS:
        return None
    cols = neg.column_names
    schema = target.plain_arrow_schema(version)
    if any(schema.get_field_index(c) < 0 for c in cols):
        return None
    schema = pa.schema([schema.field(c) for c in cols])
    paths = [target.file_path(p) for p in target.files(version)]
    if not paths:
        return pa.table({**{c: pa.array([], schema.field(c).type) for c in cols}, "__count": pa.array([], pa.int64())})
    try:
        neg = neg.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    scan = KeyedScan()
    try:
        found = scan.scan(paths, schema, {c: neg.column(c) for c in cols}, settings.MAX_DRIVER_ROWS)
    finally:
        scan.close()
    if found is None or found is UNSUPPORTED:
        return None
    found = found.filter(key_in(found, neg, cols))
    counts = found.group_by(cols, use_threads=False).aggregate([([], "count_all")])
    return counts.select(cols + ["count_all"]).rename_columns(cols + ["__count"])


def _multiplicities_on_spark(spark, target: DeltaTableRef, version: int, neg: pa.Table) -> pa.Table:
    """:func:`multiplicities` with Spark: a semi join of the target's rows with the retracted
    ones (broadcast), grouped."""
    from ..changelog import Views, arrow_to_spark, cols_sql
    cols = neg.column_names
    views = Views(spark)
    try:
        rows = target.read_snapshot(spark, version, cols)
        t = views.add(rows)
        k = views.add(F.broadcast(arrow_to_spark(spark, neg, rows.schema)))
        sql = (f"SELECT {cols_sql(cols)}, COUNT(1) AS `__count` FROM (SELECT s.* FROM {t} s LEFT SEMI JOIN {k} k "
               f"ON {key_condition('s', cols, 'k', cols, True)}) GROUP BY {cols_sql(cols)}")
        return spark.sql(sql).toArrow()
    finally:
        views.drop()


def commit_changes(target: DeltaTableRef, changes: pa.Table, *, unique_key: list[str] | None, txn: Txn,
                   metadata: dict | Callable[[], dict], deletion_vectors: bool = False,
                   retracted: pa.Table | None = None) -> tuple[int, int, int]:
    """An incremental batch's commit: ONE MERGE of the change-sized ``changes`` (from
    :func:`sink_changes` with a ``unique_key``, or :func:`bag_changes` for a bag): done here,
    through the target's replayed log (:mod:`.rewrite`; with ``deletion_vectors``, a large
    file's retracted rows marked in its deletion vector, else the file rewritten) where the
    table allows it (:meth:`~DeltaTableRef.rewritable`), else by delta-rs. Returns
    ``(new version, rows written, target rows rewritten)``; the last counts the rows the MERGE
    copied unchanged into new files plus those it changed. ``retracted``: the changelog's
    retractions (:func:`retractions`), whence the MERGE takes the pre-images of the rows it
    marks deleted (:func:`.rewrite.merge`). ``metadata``: the commit's, or a function that
    returns it, called right before the commit (after the MERGE's files are written)."""
    done = rewrite.merge(target, changes, unique_key, txn=txn, metadata=metadata,
                         deletion_vectors=deletion_vectors, retracted=retracted) \
        if changes.num_rows and target.rewritable() is None else None
    if done is not None:
        version, m = done
    elif unique_key is None:
        version, m = target.merge_bag(changes, txn=txn, metadata=rewrite.resolved(metadata))
    else:
        version, m = target.merge_by_key(changes, unique_key, txn=txn, metadata=rewrite.resolved(metadata))
    rewritten = sum(int(m.get(k, 0) or 0) for k in ("num_target_rows_copied", "num_target_rows_updated",
                                                      "num_target_rows_deleted", "num_target_rows_inserted"))
    return version, changes.num_rows, rewritten


_REBUILD_FAULT = "consistent-stream rebuild check:"
"""The prefix of the message a rebuild's folded-in check raises on the executors
(:func:`_checked_rebuild`), which :func:`_write_rebuilt_spark` turns back into its error."""


def _checked_rebuild(rows: DataFrame, unique_key: list[str] | None, also: list[str] = ()) -> DataFrame:
    """``rows`` (a rebuilt view's consolidated or positive rows: columns + ``__weight``; a keyed
    view's range-partitioned by the key already) with the rebuild's checks folded in, so the write
    that consumes them checks them and no job of their own evaluates the view again: every
    weight positive, and a keyed view one row per key (a sum of weights over the key, a window
    whose partitioning the range partitioning by the key already satisfies: no shuffle; it
    is partitioned by ``also`` too, the range column of a partitioning by estimated bounds,
    a function of the key). A failing row fails the write's job with ``raise_error`` and a
    message that starts with ``_REBUILD_FAULT``: ``retraction`` or ``duplicate <key as JSON>
    <rows>``."""
    w = F.col(WEIGHT)
    ok = F.when(w < 0, F.raise_error(F.lit(f"{_REBUILD_FAULT} retraction ~")))
    if unique_key:
        key = [F.col(f"`{k}`") for k in unique_key]
        rows = rows.withColumn("__n", F.sum(w).over(Window.partitionBy(*[F.col(c) for c in also], *key)))
        n = F.col("__n")
        named = F.to_json(F.struct(*key), {"ignoreNullFields": "false"})
        ok = ok.when(n > 1, F.raise_error(F.concat(F.lit(f"{_REBUILD_FAULT} duplicate "), named, F.lit(" "),
                                                   n.cast("string"), F.lit(" ~"))))
    # a column, not a WHERE: Spark allows no window function in a filter
    return rows.withColumn("__ok", ok.otherwise(F.lit(True))).where(F.col("__ok")).drop("__ok", "__n")


def _rebuild_fault(e: Exception, unique_key: list[str] | None, model: str) -> Exception | None:
    """The error a write's failure stands for when :func:`_checked_rebuild`'s check raised
    it; None when it is another failure."""
    found = re.search(re.escape(_REBUILD_FAULT) + r" (retraction|duplicate (\{.*?\}) (\d+)) ~", str(e))
    if found is None:
        return None
    if found.group(1) == "retraction":
        return _rebuilt_retraction(model)
    try:
        key = json.loads(found.group(2))
    except ValueError:
        key = found.group(2)
    return _duplicate_key(model, unique_key, key, found.group(3))


def commit_rebuild(target: DeltaTableRef, output: DataFrame | pa.Table, *, unique_key: list[str] | None,
                   partition_by: list[str], file_rows: int, txn: Txn, metadata: dict,
                   model: str, properties: dict[str, str] | None = None,
                   docs: Docs | None = None, consolidated: bool = True, positive: bool = False,
                   key_bounds: list | None = None, deletion_vectors: bool = False) -> tuple[int, int, int]:
    """A rebuilt view (first batch, full refresh, a recomputed batch) replaces the target in
    ONE commit: ``output`` (the view's rows + ``__weight``, consolidated unless
    ``consolidated`` is False: a Spark DataFrame whose equal rows' weights are still to be
    summed, unless ``positive``: every weight positive, a row's copies written as they come,
    the checks summing their weights per key) is written, clustered by the unique key, as
    files of at most ``file_rows`` rows;
    the commit removes
    every file of the current version and adds these, with ``txn``. A Spark DataFrame is
    written by Spark's executors; an Arrow table (a rebuild small enough for the driver, with
    the target's Arrow types, unpartitioned) from the driver. A target created by this
    commit gets the Change Data Feed on and the table ``properties``; the commit sets the
    table's and columns' descriptions ``docs`` (dbt's ``persist_docs``) when they differ.
    ``key_bounds``: the bounds of the key's ranges the executors write (the first key
    column's values, from the sources' statistics: :mod:`consistent_stream.ranges`;
    None: Spark samples the rows for them). ``deletion_vectors``: the target's later MERGEs may
    mark rows in deletion vectors; the new files' key columns are then kept for the first of
    them (:func:`.rewrite.keep_rebuilt_keys`).
    Returns ``(new version, rows written, target rows rewritten)``.

    Raises UniqueKeyViolation (a key with two rows) or CommitError (a retraction) before
    anything is committed."""
    if isinstance(output, pa.Table):
        if partition_by:
            raise ValueError("a partitioned target is rebuilt from a Spark DataFrame")
        files, schema = _write_rebuilt_arrow(target, output, unique_key, file_rows, model)
    else:
        files, schema = _write_rebuilt_spark(target, output, unique_key, partition_by, file_rows, model,
                                             consolidated or positive, key_bounds)
    removes = []
    if target.exists():
        target.refresh()
        removes = _current_files(target)
    version = target.commit_files(files, removes, schema=schema, txn=txn, metadata=metadata,
                                  partition_by=partition_by,
                                  configuration={**(properties or {}), "delta.enableChangeDataFeed": "true"},
                                  docs=docs)
    if unique_key and deletion_vectors:
        rewrite.keep_rebuilt_keys(target, files, list(unique_key))
    written = sum(f.num_records for f in files)
    return version, written, written


def _write_rebuilt_spark(target: DeltaTableRef, output: DataFrame, unique_key: list[str] | None,
                         partition_by: list[str], file_rows: int, model: str,
                         consolidated: bool = True, key_bounds: list | None = None) -> tuple[list, pa.Schema]:
    """:func:`commit_rebuild`'s files, written by Spark's executors; and their Arrow schema.

    A keyed view's rows are range-partitioned by the key (by ``key_bounds`` when given:
    :func:`~consistent_stream.ranges.range_partitioned`); rows not ``consolidated`` yet (nor
    positive: :func:`commit_rebuild`) are consolidated within those ranges (a range of the
    key holds every copy of its rows), so the write makes one exchange of them where
    consolidating first and partitioning the result takes two. A bag's rows are consolidated
    first."""
    from ..delta.deltars import arrow_schema
    from ..delta.files import new_dir, write_spark
    data_cols = [c for c in output.columns if c != WEIGHT]
    rows = output.select(*[F.col(f"`{c}`") for c in data_cols], F.col(WEIGHT))
    also: list[str] = []
    if unique_key:
        key = [F.col(f"`{k}`") for k in unique_key]
        rows, also = range_partitioned(rows, list(unique_key), default_parallelism(rows.sparkSession), key_bounds)
    if not consolidated:
        rows = consolidate(rows)   # (grouped by every column: the range column too)
    rows = _checked_rebuild(rows, unique_key, also)
    if unique_key:
        # the order the check's window sorts its partitions in (the range column, one value
        # per partition, then the key): Spark finds it satisfied and sorts once, where a sort
        # by the key alone after the copies below is a second sort of every row
        rows = rows.sortWithinPartitions(*[F.col(c) for c in also], *key)
    # a bag's row of weight w is w rows of the table (in the order they come)
    rows = rows.withColumn("__copy", F.explode(F.array_repeat(F.lit(1), F.col(WEIGHT).cast("int")))) \
        .select(*[F.col(f"`{c}`") for c in data_cols])
    spark = rows.sparkSession
    try:
        with spark_confs(spark, {"spark.sql.files.maxRecordsPerFile": str(file_rows)}):
            files = write_spark(rows, target.path, new_dir("part"), partition_by=partition_by)
    except Exception as e:
        fault = _rebuild_fault(e, unique_key, model)
        if fault is None:
            raise
        raise fault from None
    return files, arrow_schema(output.select(*[F.col(f"`{c}`") for c in data_cols]).schema)


def _write_rebuilt_arrow(target: DeltaTableRef, output: pa.Table, unique_key: list[str] | None,
                         file_rows: int, model: str) -> tuple[list, pa.Schema]:
    """:func:`commit_rebuild`'s files, written from the driver (``output``: small, with the
    target's Arrow types); and their Arrow schema. The same checks as the executors' path."""
    import numpy as np
    from ..delta.files import new_dir, write_arrow
    w = output.column(WEIGHT)
    if output.num_rows and pc.min(w).as_py() < 0:
        raise _rebuilt_retraction(model)
    data = output.drop_columns([WEIGHT])
    if unique_key and output.num_rows:
        _check_one_row_per_key(output, unique_key, model, weight=WEIGHT)
        data = data.sort_by([(k, "ascending") for k in unique_key])
    elif not unique_key and output.num_rows:
        # a bag's row of weight w is w rows of the table
        data = data.take(pa.array(np.repeat(np.arange(output.num_rows), w.to_numpy()), pa.int64()))
    rel = new_dir("part")
    step = max(1, file_rows)
    files = [write_arrow(target.path, rel, data.slice(i, step)) for i in range(0, data.num_rows, step)]
    return files, data.schema


def commit_bulk_merge(target: DeltaTableRef, prev_version: int, changes: DataFrame, *,
                      unique_key: list[str] | None, partition_by: list[str], file_rows: int, txn: Txn,
                      metadata: dict, model: str) -> tuple[int, int, int]:
    """An incremental batch whose change is too large for the driver: the target at
    ``prev_version`` plus ``changes`` (consolidated, columns + ``__weight``) is rewritten by
    the executors in ONE commit (copy-on-write of every file)."""
    spark = changes.sparkSession
    cols = [c for c in changes.columns if c != WEIGHT]
    old = target.read_snapshot(spark, prev_version, cols).withColumn(WEIGHT, F.lit(1).cast("bigint"))
    from ..changelog import consolidate
    new = consolidate(old.unionByName(changes))
    version, written, _ = commit_rebuild(target, new, unique_key=unique_key, partition_by=partition_by,
                                         file_rows=file_rows, txn=txn, metadata=metadata, model=model)
    return version, written, written


def _current_files(target: DeltaTableRef) -> list:
    """The files of the target's current version, each with its deletion vector (a remove
    must name the file and vector it removes, or the file stays in the table): from the
    replayed log, else from delta-rs' add actions (a table delta-rs serves, whose files this
    package never gave vectors)."""
    from ..delta.deltars import DataFile
    replayed = target.data_files(target.version())
    if replayed is not None:
        return replayed
    actions = target.add_actions(target.version())
    parts = [c for c in actions.column_names if c.startswith("partition.")]
    out = []
    for a in actions.to_pylist():
        out.append(DataFile(a["path"], int(a["size_bytes"]), int(a["num_records"] or 0),
                            {c[len("partition."):]: (None if a[c] is None else str(a[c])) for c in parts}))
    return out
