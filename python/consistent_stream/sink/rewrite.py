"""A change-sized MERGE into the target done here, committed through the target's replayed log
(:meth:`~consistent_stream.delta.DeltaTableRef.commit_rewrite`), instead of delta-rs' MERGE,
which opens the table (its whole log replay), reads each file it rewrites in several ranged
requests and rewrites every file it touches (delta-rs writes no deletion vectors).

What it does is what Delta's MERGE does, copy-on-write or merge-on-read per file (the Delta
protocol: a data file is never changed; its rows are retracted by removing it, or by
replacing its deletion vector, "Deletion Vectors"):

1. **pick** the target's files whose statistics (:func:`~consistent_stream.delta.files.
   stats_bounds`) may hold a row the change matches: by the unique key's values for an upsert
   or delete by key, by every column's for a bag's deletes (a bag's inserts match nothing);
2. **read** those files whole (one GET each, at once; a file this process wrote or read
   before is held, :data:`~consistent_stream.delta.files.HELD`, and not read again: batch
   after batch, the file the previous MERGE wrote), less the rows their deletion vectors
   already mark (:mod:`~consistent_stream.delta.deletion_vectors`), and split their rows into
   the matched and the kept ones (NULLs compare equal, as the MERGE's IS NOT DISTINCT FROM).
   With deletion vectors, a large file not held is first read by its key columns only
   (:func:`_probe`; held in :data:`~consistent_stream.delta.files.HELD_KEYS` for the next
   batch, and kept on this machine for the next process), and read whole only if it is to be
   rewritten; its matched rows (the Change Data
   Feed's pre-images) are the changelog's retractions at those keys, read by position only
   where the changelog lacks one (:func:`_preimages`). A large picked file with no matched
   row is left as it is, a small one (under ``settings.DV_MIN_ROWS`` rows) is rewritten with
   the others, so the small files batches add are folded together;
3. for each file with matched rows, choose (:func:`_marks`): **mark** them in its deletion
   vector (merge-on-read: the table allows vectors, ``target_deletion_vectors``, the file has
   at least ``settings.DV_MIN_ROWS`` rows and would have at most ``settings.DV_PURGE_SHARE``
   of them marked) or **rewrite** it (copy-on-write: its kept rows go into the new files; a
   file past the share is purged so);
4. **write** the rewritten files' kept rows (in their order) with the upserted or inserted
   ones (sorted by the key) as new files, written at once; the marked files' new vectors
   (inline when small, else one vector file, :func:`~consistent_stream.delta.
   deletion_vectors.write`); and the Change Data Feed rows (``delete``,
   ``update_preimage``/``update_postimage`` for a key upserted over a row, ``insert``) as one
   file under ``_change_data/`` when the table records its feed;
5. **commit** once: the rewritten files removed and the new ones added; each marked file
   removed with its old vector and added with its new one (same path, statistics no longer
   tight); the feed's file; the txn; and, the first time a vector is written, the protocol
   upgraded to the ``deletionVectors`` feature (reader 3, writer 7) with
   ``delta.enableDeletionVectors``. A vector file written for a commit that never happens (a
   crash) is named by no version: maintenance deletes it as Delta's VACUUM would.

Delta rule (keyed): target' = (target - rows at the change's keys) + upserted rows; a bag:
target' = (target - every copy of each deleted row) + inserted rows. The caller's changes
(:func:`~.target.sink_changes`, :func:`~.target.bag_changes`) are already the batch's whole
effect, at most one row per key.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import location, settings
from ..delta import DataFile, DeltaTableRef, Txn
from ..delta import deletion_vectors as dvs
from ..delta.files import (HELD, HELD_KEYS, ParquetRows, keep_keys, kept_keys, may_hold, new_dir, open_rows,
                           read_live, stats_bounds, wanted_values, write_arrow)
from ..faults import fault_point
from ..operators.keyed import key_in, sorted_key_positions
from ..threads import at_once

log = logging.getLogger(__name__)

OP = "__op"
FILE_ROWS = 500_000
"""At most this many rows in one file the rewrite writes (a target of a million rows or more
is written as several files at once)."""


def merge(target: DeltaTableRef, changes: pa.Table, key: list[str] | None, *, txn: Txn,
          metadata: dict | Callable[[], dict], deletion_vectors: bool = False,
          retracted: pa.Table | None = None) -> tuple[int, dict] | None:
    """Apply ``changes`` to ``target`` (a :meth:`~DeltaTableRef.rewritable` table) in ONE
    commit recording ``txn`` and ``metadata``; returns the new version and the MERGE's
    metrics (delta-rs' names: ``num_target_rows_copied``, ``_updated``, ``_deleted``,
    ``_inserted``, ``num_target_files_added`` / ``_removed``; and
    ``num_target_deletion_vectors_added``, the files whose rows it marked deleted), or None
    when the changes' columns do not cast to the target's (the caller's delta-rs MERGE says
    why) or the files the change touches hold more than ``settings.REWRITE_ROWS`` rows
    (delta-rs' MERGE streams them). ``deletion_vectors``: matched rows of large files may be
    marked in their deletion vectors instead of rewriting the files (module docstring).
    ``metadata``: the commit's, or a function that returns it, called once the MERGE's files
    are written, right before its commit (what must be committed first, the state, commits
    meanwhile; the function waits for it and raises what it raised: the MERGE then commits
    nothing, and its files are left for maintenance to remove).

    ``changes``: the target's columns plus ``__op``: with a ``key``, 'upsert' or 'delete' and
    one row per key; without (a bag), 'delete' (every copy of that row, distinct rows) or
    'insert' (one copy each). ``retracted``: with a ``key``, the batch's retracted rows (the
    output changelog's rows of weight -1: the view's rows before the batch at the keys it
    changes, target columns), whence the pre-images of rows marked in a vector come
    (:func:`_preimages`); None: they are read from the files. Raises CommitError when
    another writer took the version, ValueError when a deletion vector of the target does not
    match its descriptor."""
    version = target.version()
    schema = target.plain_arrow_schema()
    cols = schema.names
    rows = _as_target(changes, schema)
    if rows is None:
        return None
    ops = changes.column(OP)
    if key is not None:
        upserts = rows.filter(pc.equal(ops, "upsert"))
        lookup, match = rows, list(key)
    else:
        upserts = rows.filter(pc.equal(ops, "insert"))
        lookup, match = rows.filter(pc.equal(ops, "delete")), cols
    picked = _pick(target.data_files(version), schema, lookup, match)
    if sum(f.live_records for f in picked) > settings.REWRITE_ROWS:
        return None
    probed = _probe(target, picked, schema, lookup, match) if deletion_vectors else {}
    # the other files, and a probed one to be purged, are read whole: their kept rows may be rewritten
    whole = [i for i in range(len(picked)) if i not in probed or
             (len(probed[i].positions) and not _marks(picked[i], len(probed[i].positions)))]
    old, where, pos = _read(target, [picked[i] for i in whole], schema)
    where = np.asarray(whole, np.int32)[where]
    hit = key_in(old, lookup, match).to_numpy(zero_copy_only=False)
    hits = np.bincount(where[hit], minlength=len(picked))
    marked = [i for i in whole if hits[i] and deletion_vectors and _marks(picked[i], int(hits[i]))]
    # a small picked file goes into the new file even with no matched row: batch after batch the
    # small files the upserts make are folded together, not left to pile up
    small = {i for i in whole if picked[i].num_records < settings.DV_MIN_ROWS}
    rewritten = sorted((set(np.flatnonzero(hits).tolist()) | small) - set(marked))
    positions = {i: pos[hit & (where == i)] for i in marked}
    probed_marked = [i for i, p in probed.items() if i not in whole and len(p.positions)]
    before = dict(zip(marked, _vectors(target, [picked[i] for i in marked])))
    before.update({i: probed[i].deleted for i in probed_marked})
    marked += probed_marked
    positions.update({i: probed[i].positions for i in probed_marked})
    retracted = _as_target(retracted, schema) if probed_marked and key is not None else None
    gone = [old.filter(pa.array(hit))] + at_once(lambda i: _preimages(probed[i], schema, match, retracted),
                                                  probed_marked, "merge-take")
    kept = old.filter(pa.array(~hit & np.isin(where, rewritten)))
    gone = pa.concat_tables(gone)
    if key is not None:
        pre = key_in(gone, upserts, match)
        post = key_in(upserts, gone, match)
        parts = [(gone.filter(pc.invert(pre)), "delete"), (gone.filter(pre), "update_preimage"),
                 (upserts.filter(post), "update_postimage"), (upserts.filter(pc.invert(post)), "insert")]
    else:
        parts = [(gone, "delete"), (upserts, "insert")]
    if key is not None and upserts.num_rows:
        upserts = upserts.take(pc.sort_indices(upserts, [(c, "ascending") for c in key]))
    feed = pa.concat_tables([t.append_column("_change_type", pa.array([kind] * t.num_rows, pa.string()))
                             for t, kind in parts])
    feed_on = feed.num_rows and target.change_feed_on()
    # the new rows' files, the deletion vectors and the Change Data Feed's file: written at once
    # (on an object store, one round trip for all)
    written, vectors, cdc = at_once(lambda write: write(), [
        lambda: _write(target, pa.concat_tables([kept, upserts])),
        lambda: _mark(target, [picked[i] for i in marked], [dvs.union(before[i], positions[i]) for i in marked]),
        lambda: [write_arrow(target.path, "_change_data", feed)] if feed_on else []], "merge-write")
    adds = written + vectors
    counts = {kind: t.num_rows for t, kind in parts}
    removed = [picked[i] for i in rewritten + marked]
    metrics = {"num_source_rows": changes.num_rows, "num_target_rows_copied": kept.num_rows,
               "num_target_rows_updated": counts.get("update_preimage", 0),
               "num_target_rows_deleted": counts["delete"], "num_target_rows_inserted": counts["insert"],
               "num_target_files_added": len(adds) - len(marked), "num_target_files_removed": len(rewritten),
               "num_target_deletion_vectors_added": len(marked),
               "num_output_rows": kept.num_rows + upserts.num_rows}
    fault_point("files_written")
    version = target.commit_rewrite(adds, removed, cdc, txn=txn, metadata=resolved(metadata), metrics=metrics,
                                    deletion_vectors=bool(marked))
    removed_paths = [target.file_path(picked[i].path) for i in rewritten]
    HELD.drop(removed_paths)
    HELD_KEYS.drop(removed_paths)
    return version, metrics


def resolved(metadata: dict | Callable[[], dict]) -> dict:
    """A commit's metadata given as is or as the function that returns it (called now)."""
    return metadata() if callable(metadata) else metadata


class Probed(NamedTuple):
    """What :func:`_probe` found in one file: ``positions`` of its live rows that match (int64,
    ascending), those rows' ``keys`` (the match columns, in the same order), ``take``, which
    reads the file's rows (every column of the target's schema) at given positions, and the
    positions its deletion vector marked ``deleted`` already."""
    positions: np.ndarray
    keys: pa.Table
    take: Callable[[np.ndarray], pa.Table]
    deleted: np.ndarray


def _probe(target: DeltaTableRef, files: list[DataFile], schema: pa.Schema, lookup: pa.Table,
           match: list[str]) -> dict[int, Probed]:
    """The files of ``files`` that may keep their rows (at least ``settings.DV_MIN_ROWS``
    rows, not held in memory) looked at by their ``match`` columns only, by index into
    ``files``. The match columns come from :data:`~consistent_stream.delta.files.HELD_KEYS`
    where it holds them, else from this machine's copy of them (a new process's,
    :func:`~consistent_stream.delta.files.kept_keys`), else are read from the file (on an
    object store one GET, whose bytes serve a later ``take`` too) and kept in both; ``take``
    reads only the pages that hold the
    rows (:meth:`~consistent_stream.delta.files.ParquetRows.take`). A file sorted by one
    integer key (a rebuild writes the target so) is searched for the lookup's keys
    (:func:`~consistent_stream.operators.keyed.sorted_key_positions`), any other probed with
    a hash set of them over its live rows (:func:`~consistent_stream.operators.keyed.key_in`)."""
    at = [i for i, f in enumerate(files) if f.num_records >= settings.DV_MIN_ROWS
          and HELD.get(target.file_path(f.path), f.size) is None]
    if not at:
        return {}
    deleted = _vectors(target, [files[i] for i in at])
    key_schema = pa.schema([schema.field(c) for c in match])
    types = {f.name: f.type for f in schema}

    def one(i: int, gone: np.ndarray):
        f, opened = files[i], []

        def rows():
            if not opened:
                opened.append(open_rows(target.path, f.path, f.size))
            return opened[0]

        keys = _key_columns(target, f, key_schema, rows)

        def take(positions: np.ndarray) -> pa.Table:
            return rows().take(schema.names, positions, types).cast(schema)

        found = sorted_key_positions(keys, lookup, match)
        if found is not None:   # a file sorted by its key: searched, not probed row by row
            if len(gone):
                found = found[dvs.live(keys.num_rows, gone)[found]]
            return i, Probed(found, keys.take(pa.array(found)), take, gone)
        live = np.arange(keys.num_rows, dtype=np.int64)
        if len(gone):
            live = np.flatnonzero(dvs.live(keys.num_rows, gone))
            keys = keys.take(pa.array(live))
        hit = key_in(keys, lookup, match)
        return i, Probed(live[hit.to_numpy(zero_copy_only=False)], keys.filter(hit), take, gone)

    return dict(at_once(lambda args: one(*args), list(zip(at, deleted)), "merge-probe"))


def _key_columns(target: DeltaTableRef, f: DataFile, key_schema: pa.Schema,
                 rows: Callable[[], ParquetRows]) -> pa.Table:
    """The columns ``key_schema`` of data file ``f``, every row of it (before its deletion
    vector): from :data:`~consistent_stream.delta.files.HELD_KEYS`, else from this machine's
    copy (:func:`~consistent_stream.delta.files.kept_keys`), else read from the file
    (``rows()``, the file opened) and kept in both."""
    full = target.file_path(f.path)
    match = key_schema.names
    keys = HELD_KEYS.get(full, f.size)
    if keys is None or not set(match) <= set(keys.column_names):
        keys = kept_keys(full, f.size, key_schema)   # a new process's: this machine's copy
        if keys is None:
            keys = rows().read(match).cast(key_schema)
            keep_keys(full, f.size, keys)
        HELD_KEYS.put(full, f.size, keys)
    return keys.select(match)


def keep_rebuilt_keys(target: DeltaTableRef, files: list[DataFile], key: list[str]) -> None:
    """After a rebuild committed ``files`` (the target's whole new version, keyed by ``key``) on
    local disk: the key columns of those the next MERGE may probe (at least
    ``settings.DV_MIN_ROWS`` rows) read now and kept (:func:`_key_columns`), so that the first
    incremental batch after a build does not read them (its MERGE probes every file whose key
    range holds a key the batch changed: a change spread over the keys probes them all). Only
    the key column chunks are read. Nothing is read for a target this module does not MERGE
    into (:meth:`~DeltaTableRef.rewritable`: a partitioned one, ...) nor on an object store (a
    file there is one GET, whole: the MERGE reads it when it needs it). A failure is logged and
    the MERGE reads the keys itself: the rebuild is committed already."""
    if location.is_remote(target.path) or target.rewritable() is not None:
        return
    at = [f for f in files if f.num_records >= settings.DV_MIN_ROWS]
    if not at:
        return
    try:
        schema = target.plain_arrow_schema()
        key_schema = pa.schema([schema.field(c) for c in key])
        at_once(lambda f: _key_columns(target, f, key_schema, lambda: open_rows(target.path, f.path)), at,
                "keep-keys")
    except (OSError, pa.ArrowException, KeyError) as e:
        log.warning("the key columns of %s's rebuilt files were not kept (the next MERGE reads them): %s",
                    target.path, e)


def _preimages(found: Probed, schema: pa.Schema, match: list[str], retracted: pa.Table | None) -> pa.Table:
    """The rows of a probed file at its matched positions (the MERGE's pre-images, for the
    Change Data Feed), read as little as possible: a bag's matched key columns are all its
    columns; a keyed view's are the changelog's ``retracted`` rows at the keys where it holds
    one (the central contract: the view's rows before the batch are the target's rows); the
    others, and all of them when it holds a key twice, are read by position."""
    if set(match) == set(schema.names):
        return found.keys.select(schema.names)
    if retracted is None or not retracted.num_rows:
        return found.take(found.positions)
    before = retracted.filter(key_in(retracted, found.keys, match))
    have = key_in(found.keys, before, match).to_numpy(zero_copy_only=False)
    if before.num_rows != int(have.sum()):   # a key retracted twice: not one row per key
        return found.take(found.positions)
    if have.all():
        return before
    return pa.concat_tables([before, found.take(found.positions[~have])])


def _as_target(rows: pa.Table | None, schema: pa.Schema) -> pa.Table | None:
    """``rows`` with the target's columns and types; None when they do not cast (the
    pre-images are then read from the files)."""
    try:
        return rows.select(schema.names).cast(schema) if rows is not None else None
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _marks(f: DataFile, hits: int) -> bool:
    """Whether ``hits`` more rows of file ``f`` are marked in its deletion vector (else it is
    rewritten): a file of at least ``settings.DV_MIN_ROWS`` rows that would keep more than
    ``1 - settings.DV_PURGE_SHARE`` of them."""
    return (f.num_records >= settings.DV_MIN_ROWS
            and f.num_records - f.live_records + hits <= settings.DV_PURGE_SHARE * f.num_records)


def _vectors(target: DeltaTableRef, files: list[DataFile]) -> list[np.ndarray]:
    """The positions (int64, ascending) each of ``files``' deletion vectors marks deleted;
    empty for a file without one."""
    return dvs.read_many(target.path, [dvs.descriptor_of(f.deletion_vector) for f in files])


def _mark(target: DeltaTableRef, files: list[DataFile], vectors: list[np.ndarray]) -> list[DataFile]:
    """``files`` as their adds with the rows at ``vectors[i]`` (positions in the file's
    Parquet: those marked before and the batch's) marked in their deletion vectors; the
    vectors written (:func:`~consistent_stream.delta.deletion_vectors.write`). Statistics stay
    (Delta's ``numRecords`` counts the file's rows) but are no longer tight (``tightBounds``)."""
    if not files:
        return []
    written = dvs.write(target.path, vectors, inline_bytes=settings.DV_INLINE_BYTES)
    return [replace(f, stats=_wide(f), deletion_vector=d.to_action()) for f, d in zip(files, written)]


def _wide(f: DataFile) -> str:
    """``f``'s statistics JSON with ``tightBounds: false`` (the protocol's "Per-file
    Statistics": with rows marked deleted, a bound may be of a deleted row)."""
    try:
        stats = json.loads(f.stats) if f.stats else {}
    except ValueError:
        stats = {}
    stats.setdefault("numRecords", f.num_records)
    stats["tightBounds"] = False
    return json.dumps(stats, separators=(",", ":"))


def _write(target: DeltaTableRef, rows: pa.Table) -> list[DataFile]:
    """``rows`` as new data files of ``FILE_ROWS`` rows at most, written at once (each file's
    encoding runs on a core of its own)."""
    parts = [rows.slice(i, FILE_ROWS) for i in range(0, rows.num_rows, FILE_ROWS)]
    return at_once(lambda p: write_arrow(target.path, new_dir("part"), p, hold=True), parts, "merge-write",
                   limit=os.cpu_count() or 2)


def _pick(files: list[DataFile], schema: pa.Schema, lookup: pa.Table, match: list[str]) -> list[DataFile]:
    """The files that may hold a row matching one of ``lookup``'s on columns ``match``."""
    if not lookup.num_rows:
        return []
    wanted = wanted_values(lookup, match)
    if wanted is None:
        return list(files)
    return [f for f in files if may_hold(stats_bounds(f.stats, schema), f.num_records, wanted)]


def _read(target: DeltaTableRef, files: list[DataFile], schema: pa.Schema) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The rows of ``files`` as ``schema``, less those their deletion vectors mark
    (:func:`~consistent_stream.delta.files.read_live`: one read each, at once, of the files
    the process does not hold), and for each row its file (index into ``files``, int32) and
    its position in that file's Parquet (int64)."""
    if not files:
        return schema.empty_table(), np.zeros(0, np.int32), np.zeros(0, np.int64)
    live = read_live(target.path, files, schema.names, name="merge-read")
    return (pa.concat_tables([t.cast(schema) for t, _ in live]),
            np.concatenate([np.full(len(p), i, np.int32) for i, (_, p) in enumerate(live)]),
            np.concatenate([p for _, p in live]))
