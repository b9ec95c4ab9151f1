"""A Delta table's changelog between two versions derived from its log, with or without the
Change Data Feed: the change's cost, not the table's.

The Delta protocol's own rule for the Change Data Feed ("Change Data Files") is the delta
rule here: a commit with ``cdc`` actions has its change rows in those files (``_change_type``
insert / update_postimage at weight +1, delete / update_preimage at -1); a commit without them
changes the rows of the files it adds (+1) and removes (-1) with ``dataChange: true``. A file
with a deletion vector holds its rows less those the vector marks, so

* a copy-on-write UPDATE / DELETE / MERGE (a file removed, its rewrite added) gives the
  removed file's rows at -1 and the rewrite's at +1, and the rows it kept cancel;
* a merge-on-read one (``remove`` of the file with its old vector, ``add`` of the same file
  with the new vector) gives the rows the new vector marks and the old did not, at -1;
* an overwrite or ``CREATE OR REPLACE`` (every file removed, new ones added) gives the whole
  table's difference: the batch reads both versions' files (:attr:`LogChanges.whole_table`);
* OPTIMIZE, REORG and other ``dataChange: false`` commits change nothing and are not read.

A copy-on-write rewrite of one file into another of as many rows (an UPDATE) is compared row
by row (:func:`rewrite_pairs`): writers keep a file's row order when they rewrite it, so the rows
equal at the same position cancel there and only the others go on, which spares consolidating
two whole files. (Were the order not kept, more rows would differ and consolidation would cancel
them: the pairing is a cost, never a correctness, matter.) A column stored byte for byte the
same in both files (delta-spark re-encodes the columns an UPDATE left alone identically) holds
the same values and is not decoded to compare; it is read only at the rows that differ.

Over a range of commits the add and remove actions are netted first, by file and deletion
vector: a file added and removed inside the range is never read, and a file whose vector
changed twice is read once, with the vector it had before the range (its rows at -1) and the
one it has at the end (+1): only the rows the two disagree on are kept, read by position
(DuckDB's reader skips the pages that hold none of them; on an object store, the row groups
that hold them are decoded). What is left is read (all at once; a local file by path, so only
the column chunks decoded are read; a file on an object store in one GET), its rows less the
rows of its deletion vector, and consolidated: rows that appear at +1 and -1 cancel, so the changelog is
the change, whichever way the writer wrote it. Rows of a type Arrow cannot group (lists, maps,
structs) are left unconsolidated (a Z-set either way).

Deletion vectors are read by delta-rs (``DeltaTable.deletion_vectors``: each file's keep mask
at a version); the data files by pyarrow, by their physical column names under column mapping
(a column missing from an older file, added since, is NULL).

Out (:class:`LogChanges`): the requested columns (as the caller's Arrow schema) plus
``__weight`` (int64).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import changelog as _changelog
from ..threads import at_once
from .files import ParquetRows, open_rows

WEIGHT = "__weight"
_SIGN = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}
_WHOLE_TABLE_OPERATIONS = ("CREATE OR REPLACE TABLE", "REPLACE TABLE", "CREATE OR REPLACE TABLE AS SELECT",
                           "REPLACE TABLE AS SELECT", "TRUNCATE")
"""Operations (``commitInfo.operation``) that rewrite a table whole; a ``WRITE`` does when its
``mode`` is ``Overwrite`` (delta-spark) or ``overwrite`` (delta-rs)."""


class CommitActions(Protocol):
    """One commit as its log file holds it: ``version``, ``timestamp_ms`` and ``actions``
    (the decoded JSON lines: ``add``, ``remove``, ``cdc``, ``metaData``, ``commitInfo``, ...)."""
    version: int
    timestamp_ms: int
    actions: tuple


class UnpairedUpdate(Exception):
    """A commit's Change Data Feed files hold a different number of update_preimage and
    update_postimage rows (a writer bug: the feed does not describe the update)."""

    def __init__(self, version: int, pre: int, post: int):
        super().__init__(f"version {version}: {pre} update_preimage rows, {post} update_postimage rows")
        self.version, self.pre, self.post = version, pre, post


@dataclass
class LogChanges:
    """The changelog of a range: ``data`` (the columns asked for plus ``__weight``), the files
    it opened and their rows (``files_read``, ``rows_read``), the rows it decoded of them
    (``rows_decoded``: fewer where it read rows by position or compared only the columns a
    rewrite changed), the versions that rewrote the table whole (``whole_table``), whether
    any commit of the range had Change Data Feed files (``used_cdc``) and whether any file
    was read with a deletion vector (``used_deletion_vectors``); ``commit_ms``: the commit time
    (ms since epoch) of the newest commit of the range that changed rows, None when the
    changelog is empty."""
    data: pa.Table
    files_read: int = 0
    rows_read: int = 0
    rows_decoded: int = 0
    whole_table: list = field(default_factory=list)
    used_cdc: bool = False
    used_deletion_vectors: bool = False
    commit_ms: int | None = None

    @property
    def change_rows(self) -> int:
        """The change rows of the range, as a Change Data Feed would count them: the sum of
        the consolidated weights' magnitudes (a row inserted twice counts 2; an update of one
        row in a rewritten file counts 2, its pre- and post-image)."""
        if not self.data.num_rows:
            return 0
        return int(pc.sum(pc.abs(self.data.column(WEIGHT))).as_py())


@dataclass(frozen=True)
class _Part:
    """One file to read: relative ``path``; ``weight`` of its rows (+n / -n); ``mask_at``:
    the version whose deletion vector of the file applies (None: the file has none);
    ``cdc``: a Change Data Feed file (weights from its ``_change_type``); its partition values."""
    path: str
    weight: int
    mask_at: int | None
    cdc: bool
    partition_values: tuple
    version: int
    num_records: int | None = None


def _dv_key(action: dict) -> str | None:
    dv = action.get("deletionVector")
    if not dv:
        return None
    return f"{dv.get('storageType')}:{dv.get('pathOrInlineDv')}:{dv.get('offset')}"


def _num_records(action: dict) -> int | None:
    """``numRecords`` of an add or remove action's statistics (None when it has none)."""
    try:
        return int(json.loads(action.get("stats") or "{}").get("numRecords"))
    except (TypeError, ValueError):
        return None


def rewrite_pairs(parts: list[_Part]) -> list[tuple[_Part, _Part]]:
    """Copy-on-write rewrites among ``parts``: a file removed whole (weight -1, no deletion
    vector) and a file added whole (+1) by the same commit with the same partition values (an
    UPDATE rewrites each file it touches into one of as many rows). Within a commit and
    partition, files whose statistics give the same number of rows are paired first, then
    those whose count is unknown (a ``remove`` often carries no statistics); a pair whose
    files turn out to differ in length is read whole. Each part is in at most one pair."""
    def whole(p: _Part, w: int) -> bool:
        return not p.cdc and p.weight == w and p.mask_at is None

    removed: dict[tuple, list[_Part]] = {}
    for p in parts:
        if whole(p, -1):
            removed.setdefault((p.version, p.partition_values), []).append(p)
    pairs, unmatched = [], []
    for p in parts:
        if whole(p, 1):
            candidates = removed.get((p.version, p.partition_values), [])
            match = next((r for r in candidates if r.num_records is not None and r.num_records == p.num_records),
                         None)
            if match is not None:
                candidates.remove(match)
                pairs.append((match, p))
            else:
                unmatched.append(p)
    for p in unmatched:
        candidates = removed.get((p.version, p.partition_values), [])
        match = next((r for r in candidates if r.num_records is None or p.num_records is None), None)
        if match is not None:
            candidates.remove(match)
            pairs.append((match, p))
    return pairs


def whole_table_rewrite(commit: CommitActions) -> bool:
    """Whether ``commit`` rewrote its table whole (an overwrite, ``CREATE OR REPLACE``,
    ``TRUNCATE``), by its ``commitInfo``."""
    info = next((a["commitInfo"] for a in commit.actions if "commitInfo" in a), {})
    op = str(info.get("operation") or "").upper()
    mode = str((info.get("operationParameters") or {}).get("mode") or "").strip('"').lower()
    return op in _WHOLE_TABLE_OPERATIONS or (op == "WRITE" and mode == "overwrite")


def plan_parts(commits: Iterable[CommitActions], start: int, end: int, *,
               use_cdc: bool = True) -> tuple[list[_Part], list[int], bool]:
    """The files the changelog of ``commits`` (the range ``(start, end]``) reads: each commit's
    ``cdc`` files, else its ``add`` / ``remove`` files with ``dataChange`` netted by (path,
    deletion vector) over the range; a netted ``add`` takes the file's deletion vector at the
    version of its last add, a netted ``remove`` at the version before its last remove (a
    later ``dataChange: false`` commit, as OPTIMIZE, may have removed the file since, its rows
    moved to another without a change). Returns the parts, the whole-table versions and
    whether any commit had ``cdc`` files. ``use_cdc=False`` derives every commit's change from
    its ``add`` and ``remove`` files, its ``cdc`` files ignored (what the Change Data Feed is
    checked against)."""
    cdc_parts: list[_Part] = []
    net: Counter = Counter()
    info: dict = {}
    whole, used_cdc = [], False
    for c in commits:
        if whole_table_rewrite(c):
            whole.append(c.version)
        cdc = [a["cdc"] for a in c.actions if "cdc" in a] if use_cdc else []
        if cdc:
            used_cdc = True
            cdc_parts += [_Part(f["path"], 1, None, True, tuple(sorted((f.get("partitionValues") or {}).items())),
                                c.version) for f in cdc]
            continue
        for a in c.actions:
            for kind, sign in (("add", 1), ("remove", -1)):
                f = a.get(kind)
                if f is None or not f.get("dataChange", True):
                    continue
                key = (unquote(f["path"]), _dv_key(f))
                net[key] += sign
                values, seen, rows = info.get(key, (None, {}, None))
                info[key] = (f.get("partitionValues") or {}, {**seen, kind: c.version}, _num_records(f) or rows)
    parts = []
    for (path, dv), n in sorted(net.items(), key=lambda kv: kv[0][0] + "\0" + (kv[0][1] or "")):
        if n == 0:
            continue
        values, seen, rows = info[(path, dv)]
        # the file had this deletion vector right after its add, and right before its remove
        at = seen["add"] if n > 0 else seen["remove"] - 1
        parts.append(_Part(path, n, at if dv else None, False, tuple(sorted(values.items())),
                           seen["add" if n > 0 else "remove"], rows))
    return cdc_parts + parts, whole, used_cdc


def changelog(table_path: str, commits: list[CommitActions], start: int, end: int, schema: pa.Schema,
              partition_columns: list[str], *, physical: dict[str, str] | None = None,
              deletion_vectors: Callable[[int], dict[str, np.ndarray]] | None = None,
              use_cdc: bool = True) -> LogChanges:
    """The changelog of the table at ``table_path`` over ``commits`` (every commit of ``(start,
    end]``, in order; the module docstring): ``schema``'s columns (``physical``: logical name
    -> the name in the files, under column mapping) plus ``__weight``, consolidated.

    ``deletion_vectors(version)``: the keep masks of the table's files with a deletion vector
    at ``version``, by path relative to the table (called once for each version a file to
    read had its vector at: for one commit, at most the versions before and after it). Raises
    FileNotFoundError (or the object store's error) naming a file that is gone (vacuumed),
    ValueError when a file with a deletion vector has none at its version, and
    :class:`UnpairedUpdate`. ``use_cdc``: as
    :func:`plan_parts`'s."""
    parts, whole, used_cdc = plan_parts(commits, start, end, use_cdc=use_cdc)
    out_schema = pa.schema(list(schema) + [pa.field(WEIGHT, pa.int64())])
    result = LogChanges(out_schema.empty_table(), whole_table=whole, used_cdc=used_cdc)
    if not parts:
        return result
    masks: dict[int, dict[str, np.ndarray]] = {}
    for at in sorted({p.mask_at for p in parts if p.mask_at is not None}):
        masks[at] = deletion_vectors(at) if deletion_vectors is not None else {}
        result.used_deletion_vectors = True
    physical = physical or {}
    names = [f.name for f in schema]
    file_cols = {n: physical.get(n, n) for n in names if n not in partition_columns}
    file_types = {file_cols[f.name]: f.type for f in schema if f.name in file_cols}

    def columns_of(part: _Part, pf: pq.ParquetFile, raw: pa.Table) -> dict:
        """The columns asked for of ``raw`` (rows of ``part``'s file): partition values from
        the action, file columns by physical name, a column the file lacks as NULLs."""
        present = set(pf.schema_arrow.names)
        values = dict(part.partition_values)
        cols = {}
        for f in schema:
            if f.name in partition_columns:
                v = values.get(physical.get(f.name, f.name), values.get(f.name))
                cols[f.name] = pc.cast(pa.array([v] * raw.num_rows, pa.string()), f.type)
            elif file_cols[f.name] in present:
                cols[f.name] = raw.column(file_cols[f.name]).cast(f.type)
            else:   # a column added after the file was written
                cols[f.name] = pa.nulls(raw.num_rows, f.type)
        return cols

    def weights(group: list[_Part], n: int) -> np.ndarray:
        """Each row's weight in a file of ``n`` rows: the sum over the group's parts of the
        part's weight where its deletion vector keeps the row."""
        weight = np.zeros(n, dtype=np.int64)
        for part in group:
            if part.mask_at is None:
                weight += part.weight
                continue
            mask = masks[part.mask_at].get(part.path)
            if mask is None:
                raise ValueError(f"{table_path}: {part.path} has a deletion vector in the log but none at version "
                                 f"{part.mask_at}")
            keep = np.ones(n, dtype=np.int64)
            keep[:min(n, len(mask))] = np.asarray(mask[:n], dtype=bool)
            weight += part.weight * keep
        return weight

    def read(group: list[_Part]) -> tuple[pa.Table, int, int, Counter]:
        """The weighted rows of one file, read once for all its parts (:func:`weights`):
        the table, the file's rows, the rows decoded and the update images of a Change Data
        Feed file. Where few of the file's rows have a weight (a file whose deletion vector
        changed: -1 with the old vector, +1 with the new, the other rows cancel), only those
        rows are read (:meth:`ParquetRows.take`)."""
        first = group[0]
        f = open_rows(table_path, first.path)
        wanted = f.present(file_cols.values()) + (["_change_type"] if first.cdc else [])
        n = f.pf.metadata.num_rows
        weight = None if first.cdc else weights(group, n)
        if weight is not None and np.count_nonzero(weight) * _FEW < n:
            at = np.flatnonzero(weight)
            raw, weight = f.take(wanted, at, file_types), weight[at]
        else:
            raw = f.pf.read(columns=wanted)
        cols = columns_of(first, f.pf, raw)
        images: Counter = Counter()
        if first.cdc:
            kinds = raw.column("_change_type")
            unknown = pc.invert(pc.is_in(kinds, pa.array(list(_SIGN))))
            if raw.num_rows and pc.any(unknown).as_py():
                raise ValueError(f"{table_path}: unknown Change Data Feed _change_type "
                                 f"{pc.filter(kinds, unknown)[0].as_py()!r} in {first.path}")
            images = Counter({k: pc.sum(pc.cast(pc.equal(kinds, k), pa.int64())).as_py() or 0
                              for k in ("update_preimage", "update_postimage")})
            cols[WEIGHT] = pc.if_else(pc.is_in(kinds, pa.array(["insert", "update_postimage"])), 1, -1).cast(pa.int64())
            return pa.table(cols, schema=out_schema), n, raw.num_rows, images
        cols[WEIGHT] = pa.array(weight, pa.int64())
        data = pa.table(cols, schema=out_schema)
        return data.filter(pa.array(weight != 0)), n, raw.num_rows, images

    def at_weight(t: pa.Table, w: int) -> pa.Table:
        """``t`` (the columns asked for) with every row at weight ``w``, as ``out_schema``."""
        return t.append_column(WEIGHT, pa.array(np.full(t.num_rows, w, dtype=np.int64))).cast(out_schema)

    def read_pair(pair: tuple[_Part, _Part]) -> tuple[pa.Table, int, int, Counter]:
        """A copy-on-write rewrite (:func:`rewrite_pairs`): the two files compared row by row
        in the columns asked for. Rows equal at the same position cancel; the others are the
        old rows at -1 and the new at +1. Exact whatever the row order (a writer that reorders
        makes more rows differ, which consolidation then cancels), and the change is what
        differs, not the files' rows.

        A column whose chunks are byte for byte the same in both files (:func:`_same_chunks`:
        a writer that rewrites a file re-encodes its unchanged columns identically, as
        delta-spark does) holds the same values in both, so it cannot tell the rows apart: only
        the other columns are decoded and compared, and the equal columns are read at the rows
        that differ, once (:meth:`ParquetRows.take`)."""
        old_f, new_f = (open_rows(table_path, p.path) for p in pair)
        cols = old_f.present(file_cols.values())
        n_old, n_new = old_f.pf.metadata.num_rows, new_f.pf.metadata.num_rows
        if n_old != n_new or cols != new_f.present(file_cols.values()):
            # the statistics did not tell the truth, or the files' columns differ: no pairing
            halves = [at_weight(pa.table(columns_of(part, f.pf, f.pf.read(columns=f.present(file_cols.values())))), w)
                      for part, f, w in ((pair[0], old_f, -1), (pair[1], new_f, 1))]
            return pa.concat_tables(halves), n_old + n_new, n_old + n_new, Counter()
        same = [c for c in cols if _same_chunks(old_f, new_f, c)]
        compared = [c for c in cols if c not in same]
        # as the caller's types (a file may store a string as string_view)
        decoded = [f.pf.read(columns=compared).cast(pa.schema([pa.field(c, file_types[c]) for c in compared]))
                   for f in (old_f, new_f)] if compared else []
        differ = np.zeros(n_old, dtype=bool)
        for c in compared:
            a, b = decoded[0].column(c), decoded[1].column(c)
            ne = pc.fill_null(pc.not_equal(a, b), False)
            differ |= pc.or_(ne, pc.xor(pc.is_null(a), pc.is_null(b))).to_numpy(zero_copy_only=False)
        at = np.flatnonzero(differ)
        kept = new_f.take(same, at, file_types) if same else None
        halves = []
        for part, f, t, w in ((pair[0], old_f, decoded[0] if decoded else None, -1),
                              (pair[1], new_f, decoded[1] if decoded else None, 1)):
            raw = {}
            for c in cols:
                raw[c] = kept.column(c) if c in same else t.column(c).take(pa.array(at))
            raw = pa.table(raw) if cols else pa.table({"__rows": pa.nulls(len(at))})
            halves.append(at_weight(pa.table(columns_of(part, f.pf, raw)), w))
        decoded_rows = (2 * n_old if compared else 0) + (len(at) if same else 0)
        return pa.concat_tables(halves), n_old + n_new, decoded_rows, Counter()

    pairs = rewrite_pairs(parts)
    paired = {id(p) for pair in pairs for p in pair}
    groups: dict[tuple, list[_Part]] = {}
    for part in parts:
        if id(part) not in paired:
            groups.setdefault((part.path, part.cdc, part.version if part.cdc else None), []).append(part)
    jobs = [(read, g) for g in groups.values()] + [(read_pair, pair) for pair in pairs]
    read_jobs = at_once(lambda job: job[0](job[1]), jobs, "delta-log-changes", limit=16)
    read_groups = read_jobs[:len(groups)]
    per_version: dict[int, Counter] = {}
    for group, (_, _, _, images) in zip(groups.values(), read_groups):
        if group[0].cdc:
            per_version.setdefault(group[0].version, Counter()).update(images)
    for version, images in sorted(per_version.items()):
        if images["update_preimage"] != images["update_postimage"]:
            raise UnpairedUpdate(version, images["update_preimage"], images["update_postimage"])
    result.files_read = len(groups) + 2 * len(pairs)
    result.rows_read = sum(n for _, n, _, _ in read_jobs)
    result.rows_decoded = sum(n for _, _, n, _ in read_jobs)
    result.data = consolidate(pa.concat_tables([t for t, _, _, _ in read_jobs]))
    if result.data.num_rows:
        newest = max(p.version for p in parts)
        result.commit_ms = next(c.timestamp_ms for c in commits if c.version == newest)
    return result


def consolidate(zset: pa.Table) -> pa.Table:
    """``zset`` (columns plus ``__weight``) with equal rows summed and rows of weight 0
    dropped (:func:`consistent_stream.changelog.consolidate_arrow`, on Arrow's threads);
    unchanged when a column's type cannot be a grouping key (list, map, struct)."""
    cols = [c for c in zset.column_names if c != WEIGHT]
    if not zset.num_rows or not cols:
        return zset
    if any(pa.types.is_nested(zset.schema.field(c).type) for c in cols):
        return zset
    return _changelog.consolidate_arrow(zset, use_threads=True)


_FEW = 8
"""A file's rows are read by position (:meth:`ParquetRows.take`) when fewer than one in
``_FEW`` of them are wanted; above that, decoding the file whole costs about as much."""


def _same_chunks(old: ParquetRows, new: ParquetRows, column: str) -> bool:
    """Whether top-level ``column`` is stored byte for byte the same in both files: the same
    row groups of the same row counts, and each of its leaf columns' chunks the same bytes with
    the same physical type and codec (equal bytes then decode to equal values)."""
    mo, mn = old.pf.metadata, new.pf.metadata
    if "." in column or mo.num_row_groups != mn.num_row_groups or \
            old.pf.schema_arrow.field(column).type != new.pf.schema_arrow.field(column).type:
        return False
    leaves = _leaves(mo, column)
    if not leaves or leaves != _leaves(mn, column):
        return False
    for g in range(mo.num_row_groups):
        if mo.row_group(g).num_rows != mn.row_group(g).num_rows:
            return False
        for j in leaves:
            a, b = mo.row_group(g).column(j), mn.row_group(g).column(j)
            if (a.physical_type, a.compression, a.total_compressed_size) != \
                    (b.physical_type, b.compression, b.total_compressed_size):
                return False
            if old.chunk(g, j) != new.chunk(g, j):
                return False
    return True


def _leaves(meta: pq.FileMetaData, column: str) -> list[int]:
    """The indexes of top-level ``column``'s leaf columns in a file's metadata."""
    return [j for j in range(meta.num_columns) if meta.schema.column(j).path.split(".")[0] == column]
