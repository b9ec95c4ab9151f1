"""A change-sized MERGE into the target done here, copy-on-write, and committed through the
target's replayed log (:meth:`~consistent_stream.delta.DeltaTableRef.commit_rewrite`), instead
of delta-rs' MERGE, which opens the table (its whole log replay) and reads each file it
rewrites in several ranged requests: on an object store most of a small batch's requests.

What it does is what Delta's copy-on-write MERGE does (the Delta protocol: a file is never
changed, only removed and replaced):

1. **pick** the target's files whose statistics (:func:`~consistent_stream.delta.files.
   stats_bounds`) may hold a row the change matches: by the unique key's values for an upsert
   or delete by key, by every column's for a bag's deletes (a bag's inserts match nothing);
2. **read** those files whole (one GET each, at once; a file this process wrote or read
   before is held, :data:`~consistent_stream.delta.files.HELD`, and not read again: batch
   after batch, the file the previous MERGE wrote) and split their rows into the matched
   and the kept ones (NULLs compare equal, as the MERGE's IS NOT DISTINCT FROM);
3. **write** the kept rows (in their order) with the upserted or inserted ones (sorted by the
   key) as new files, written at once, and the Change Data Feed rows
   (``delete``, ``update_preimage``/``update_postimage`` for a key upserted over a row,
   ``insert``) as one file under ``_change_data/`` when the table records its feed;
4. **commit** once: the picked files removed, the new ones added, the feed's file, the txn.

Delta rule (keyed): target' = (target - rows at the change's keys) + upserted rows; a bag:
target' = (target - every copy of each deleted row) + inserted rows. The caller's changes
(:func:`~.target.sink_changes`, :func:`~.target.bag_changes`) are already the batch's whole
effect, at most one row per key.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from .. import settings
from ..delta import DataFile, DeltaTableRef, Txn
from ..delta.files import HELD, may_hold, new_dir, read_whole, stats_bounds, wanted_values, write_arrow
from ..faults import fault_point
from .unique import key_in

OP = "__op"
FILE_ROWS = 500_000
"""At most this many rows in one file the rewrite writes (a target of a million rows or more
is written as several files at once)."""


def merge(target: DeltaTableRef, changes: pa.Table, key: list[str] | None, *, txn: Txn,
          metadata: dict) -> tuple[int, dict] | None:
    """Apply ``changes`` to ``target`` (a :meth:`~DeltaTableRef.rewritable` table) in ONE
    commit recording ``txn`` and ``metadata``; returns the new version and the MERGE's
    metrics (delta-rs' names: ``num_target_rows_copied``, ``_updated``, ``_deleted``,
    ``_inserted``, ``num_target_files_added`` / ``_removed``), or None when the changes'
    columns do not cast to the target's (the caller's delta-rs MERGE says why) or the files
    the change touches hold more than ``settings.REWRITE_ROWS`` rows (delta-rs' MERGE streams
    them).

    ``changes``: the target's columns plus ``__op``: with a ``key``, 'upsert' or 'delete' and
    one row per key; without (a bag), 'delete' (every copy of that row, distinct rows) or
    'insert' (one copy each). Raises CommitError when another writer took the version."""
    version = target.version()
    schema = target.plain_arrow_schema()
    cols = schema.names
    try:
        rows = changes.select(cols).cast(schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    ops = changes.column(OP)
    if key is not None:
        upserts = rows.filter(pc.equal(ops, "upsert"))
        lookup, match = rows, list(key)
    else:
        upserts = rows.filter(pc.equal(ops, "insert"))
        lookup, match = rows.filter(pc.equal(ops, "delete")), cols
    picked = _pick(target.data_files(version), schema, lookup, match)
    if sum(f.num_records for f in picked) > settings.REWRITE_ROWS:
        return None
    old = _read(target, picked, schema)
    hit = key_in(old, lookup, match)
    kept, gone = old.filter(pc.invert(hit)), old.filter(hit)
    if key is not None:
        pre = key_in(gone, upserts, match)
        post = key_in(upserts, gone, match)
        parts = [(gone.filter(pc.invert(pre)), "delete"), (gone.filter(pre), "update_preimage"),
                 (upserts.filter(post), "update_postimage"), (upserts.filter(pc.invert(post)), "insert")]
    else:
        parts = [(gone, "delete"), (upserts, "insert")]
    if key is not None and upserts.num_rows:
        upserts = upserts.take(pc.sort_indices(upserts, [(c, "ascending") for c in key]))
    adds = _write(target, pa.concat_tables([kept, upserts]))
    cdc = []
    feed = pa.concat_tables([t.append_column("_change_type", pa.array([kind] * t.num_rows, pa.string()))
                             for t, kind in parts])
    if feed.num_rows and target.change_feed_on():
        cdc = [write_arrow(target.path, "_change_data", feed)]
    counts = {kind: t.num_rows for t, kind in parts}
    metrics = {"num_source_rows": changes.num_rows, "num_target_rows_copied": kept.num_rows,
               "num_target_rows_updated": counts.get("update_preimage", 0),
               "num_target_rows_deleted": counts["delete"], "num_target_rows_inserted": counts["insert"],
               "num_target_files_added": len(adds), "num_target_files_removed": len(picked),
               "num_output_rows": kept.num_rows + upserts.num_rows}
    fault_point("files_written")
    version = target.commit_rewrite(adds, picked, cdc, txn=txn, metadata=metadata, metrics=metrics)
    HELD.drop([target.file_path(f.path) for f in picked])
    return version, metrics


def _write(target: DeltaTableRef, rows: pa.Table) -> list[DataFile]:
    """``rows`` as new data files of ``FILE_ROWS`` rows at most, written at once (each file's
    encoding runs on a core of its own)."""
    parts = [rows.slice(i, FILE_ROWS) for i in range(0, rows.num_rows, FILE_ROWS)]
    if len(parts) < 2:
        return [write_arrow(target.path, new_dir("part"), p, hold=True) for p in parts]
    with ThreadPoolExecutor(max_workers=min(len(parts), os.cpu_count() or 2), thread_name_prefix="merge-write") as pool:
        return list(pool.map(lambda p: write_arrow(target.path, new_dir("part"), p, hold=True), parts))


def _pick(files: list[DataFile], schema: pa.Schema, lookup: pa.Table, match: list[str]) -> list[DataFile]:
    """The files that may hold a row matching one of ``lookup``'s on columns ``match``."""
    if not lookup.num_rows:
        return []
    wanted = wanted_values(lookup, match)
    if wanted is None:
        return list(files)
    return [f for f in files if may_hold(stats_bounds(f.stats, schema), f.num_records, wanted)]


def _read(target: DeltaTableRef, files: list[DataFile], schema: pa.Schema) -> pa.Table:
    """The rows of ``files``, whole, as ``schema`` (one read each, at once, of the files the
    process does not hold: :func:`~consistent_stream.delta.files.read_whole`)."""
    if not files:
        return schema.empty_table()
    tables = read_whole([target.file_path(f.path) for f in files], [f.size for f in files], schema.names,
                        name="merge-read")
    return pa.concat_tables([t.cast(schema) for t in tables])

