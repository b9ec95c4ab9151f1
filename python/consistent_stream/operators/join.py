"""Join delta rules: inner, left/full outer, semi and anti joins, with an optional residual
(non-equi) predicate that is part of the join condition.

Inner join, bilinear in its inputs (DBSP; the classic IVM delta rule):

    d(L join R) = dL join R_old + L_old join dR + dL join dR

with the output weight the product of the input weights. ``L_old``/``R_old`` are the
arrangements (integrals) as of the previous batch, read only at the keys the batch touches
(``K_L`` = keys of ``dL``, ``K_R`` = keys of ``dR``); they may be unconsolidated, since the
join distributes over Z-set addition. A term whose change is empty is not computed, and its
state is not read.

Everything else is built from the *unmatched* part of one side. For a row ``l`` of L, its
number of associations ``c(l, R)`` is the summed weight of the R rows matching it (key
equality and residual); ``unmatched(L, R)`` is the rows of L with ``c = 0`` (Flink's outer
join state keeps ``numOfAssociations`` per row for the same purpose). It is linear in L for
a fixed R, and R only changes at ``K_R``, so

    d unmatched = unmatched(dL, R_new) + unmatched(L_old|K_R, R_new|K_R) - unmatched(L_old|K_R, R_old|K_R)

which retracts the NULL-padded row of ``l`` exactly when its associations go from 0 to 1 or
more and emits it again when they fall back to 0 (the last two terms are computed in one
pass, counting each row's associations before and after). Then

* left outer  = inner + unmatched(L, R) padded with NULLs for R's columns;
* full outer  = left outer + unmatched(R, L) padded with NULLs for L's columns;
* anti (NOT EXISTS) = unmatched(L, R);
* semi (EXISTS, IN) = L - unmatched(L, R), so ``d semi = dL - d anti``.

Each L row appears once in a semi join, with its own multiplicity, however many R rows match.
NULL keys never match (SQL ``=``), unless the join is ``null_safe`` (set operations).

Without old rows on either side (a first batch, a rebuild: both arrangements hold no file),
changes that are consolidated, or known to be positive (``Changelog.positive``: a snapshot's
rows, copies included), are the whole relations ``L`` and ``R``, whose weights are positive,
so a row of L is unmatched exactly when no row of R meets it (no copy of a row can cancel
another). A left or full outer join is then SQL's own outer join, one join instead of the
inner term, the unmatched rows' counting join and its aggregation: ``l.w * coalesce(r.w, 1)``
(left), ``coalesce(l.w, 1) * coalesce(r.w, 1)`` (full), the padding NULLs the outer join's own
(:func:`whole_outer`); its weights are positive. A left one's rows are consolidated when both
sides are: each is a distinct pair of distinct rows, or a distinct L row padded once (a full
one's are not always: an unmatched L row of NULLs and an unmatched R row of NULLs pad to the
same row).

A range join (an inner join without an equality whose condition bounds a column of one side
by the other: ``o.day between p.valid_from and p.valid_to``, ``a.x < b.y``) has the same rule
on one constant key; what changes is what a term reads. Each side is arranged by its first
band column, so its files hold disjoint, sorted ranges of it (Delta min/max statistics per
file), and ``R_old`` is read for ``dL`` only in the files whose ranges of the band columns
can meet the values ``dL`` brings: per band ``l op r``, ``r >= min(l)`` or ``r <= max(l)``,
and where two bands bound one column from both sides, per row of the change its interval
(merged). The reads are supersets (rows out of range are dropped by the condition), which the
bilinear rule allows; outer, semi and anti joins, whose unmatched counts need every match of
a row read, read the whole side.

Example (inner, key k): L_old = {(k=1, a): +1}, R_old = {}, dR = {(k=1, x): +1} ->
d = L_old join dR = {(1, a, 1, x): +1}.

Columns in: each side's changelog holds its data columns, its key columns (the evaluated join
keys) and ``__weight``, consolidated (a rebuild's: or positive, a relation's rows and their
copies); the lookups return rows of the same columns, not always consolidated. Out (a
Spark SQL SELECT): left data columns, right data columns (none for semi/anti),
``__weight``; not consolidated; None when the change is known to be empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..changelog import WEIGHT, Changelog, KeySet, cols_sql, consolidate_sql, q
from ..plan.logical import FLIPPED
from .keyed import Lookup, key_condition, union_keys

JOIN_KINDS = ("inner", "left", "full", "semi", "anti")
W = q(WEIGHT)


@dataclass
class JoinSide:
    """One input of the join: its change, key columns, data columns and their SQL types (for
    NULL padding), and its old rows at the touched keys once read (None: none)."""
    delta: Changelog
    keys: list[str]
    cols: list[str]
    types: list[str]
    bands: list[str] = field(default_factory=list)   # per band of a range join, the column of this side
    old: Changelog | None = None
    _keys: KeySet | None = field(default=None, repr=False)

    def change_keys(self, null_safe: bool) -> KeySet:
        """The distinct key tuples of the change (a NULL key left out unless ``null_safe``),
        computed once."""
        if self._keys is None:
            self._keys = self.delta.keys(self.keys, drop_null=not null_safe)
        return self._keys

    def null_padding(self) -> str:
        return ", ".join(f"CAST(NULL AS {t}) AS {q(c)}" for c, t in zip(self.cols, self.types))


def _on(a: str, a_side: JoinSide, b: str, b_side: JoinSide, residual: str | None, null_safe: bool) -> str:
    cond = key_condition(a, a_side.keys, b, b_side.keys, null_safe)
    return f"{cond} AND ({residual})" if residual else cond


def _inner(l_rel: str, left: JoinSide, r_rel: str, right: JoinSide, residual, null_safe) -> str:
    """One term of the bilinear rule: ``l join r``, weights multiplied."""
    return (f"SELECT {cols_sql(left.cols, 'l')}, {cols_sql(right.cols, 'r')}, l.{W} * r.{W} AS {W} "
            f"FROM {l_rel} l JOIN {r_rel} r ON {_on('l', left, 'r', right, residual, null_safe)}")


def _associations(a_rel: str, a: JoinSide, b_rel: str, b: JoinSide, residual, null_safe, sums: dict) -> str:
    """Per row of ``a_rel`` (consolidated: distinct rows), sums over the rows of ``b_rel`` it
    matches: ``sums`` maps an output name to an expression over ``__wb`` and ``__tag_old``
    (a row without a match sums to 0). Out: ``a.cols + a.keys``, ``__wa``, the sums."""
    a_cols = a.cols + a.keys
    agg = ", ".join(f"SUM(COALESCE({e}, 0)) AS {q(n)}" for n, e in sums.items())
    return (f"SELECT {cols_sql(a_cols, 'a')}, a.{W} AS `__wa`, {agg} "
            f"FROM {a_rel} a LEFT JOIN {b_rel} b ON {_on('a', a, 'b', b, residual, null_safe)} "
            f"GROUP BY {cols_sql(a_cols, 'a')}, a.{W}")


def _unmatched_delta(a: JoinSide, b: JoinSide, residual, null_safe) -> str | None:
    """The change of unmatched(A, B) in this batch (see the module docstring), in two parts:

    * the rows of ``dA`` with no association in ``B_old + dB``;
    * the rows of ``A_old`` at the keys ``dB`` touches whose associations go from 0 to
      more (retracted) or from more to 0 (emitted): one join of ``consolidate(A_old)``
      with ``B_old`` (tagged old) and ``dB``, counting before and after in one pass.

    Out: a SELECT of ``a.cols`` + ``__weight``.
    """
    parts = []
    b_cols = b.cols + b.keys
    if not a.delta.is_empty:
        b_new = f"(SELECT {cols_sql(b_cols)}, {W} AS `__wb` FROM {b.delta.sql}" + (
            f" UNION ALL SELECT {cols_sql(b_cols)}, {W} FROM {b.old.sql})" if b.old is not None else ")")
        fresh = _associations(a.delta.sql, a, b_new, b, residual, null_safe, {"__assoc": "`__wb`"})
        parts.append(f"SELECT {cols_sql(a.cols)}, `__wa` AS {W} FROM ({fresh}) WHERE `__assoc` = 0")
    if not b.delta.is_empty and a.old is not None:
        a_old = f"({consolidate_sql(a.old.sql, a.cols + a.keys)})"
        b_k = f"(SELECT {cols_sql(b_cols)}, {W} AS `__wb`, 0 AS `__tag_old` FROM {b.delta.sql}" + (
            f" UNION ALL SELECT {cols_sql(b_cols)}, {W}, 1 FROM {b.old.sql})" if b.old is not None else ")")
        counts = _associations(a_old, a, b_k, b, residual, null_safe,
                               {"__c_old": "`__wb` * `__tag_old`", "__c_new": "`__wb`"})
        parts.append(f"SELECT {cols_sql(a.cols)}, CASE WHEN `__c_new` = 0 THEN `__wa` ELSE -`__wa` END AS {W} "
                     f"FROM ({counts}) WHERE (`__c_old` = 0) <> (`__c_new` = 0)")
    return _union(parts)


def _union(parts: list[str]) -> str | None:
    if not parts:
        return None
    return " UNION ALL ".join(f"SELECT * FROM ({p})" for p in parts) if len(parts) > 1 else parts[0]


def join_delta(kind: str, left: JoinSide, right: JoinSide, left_old: Lookup, right_old: Lookup,
               residual: str | None, null_safe: bool = False, bands: list[str] = ()) -> str | None:
    """The join's output changelog for one batch, as a SELECT (see the module docstring).

    ``kind``: inner, left, full, semi or anti. ``residual``: Spark SQL over the data columns
    of both sides (names are unique in a plan), or None. ``left_old``/``right_old``: the
    arrangements as of the previous batch. ``bands``: for an inner range join, the operator
    of each band ``left.bands[i] op right.bands[i]`` (the residual holds the same
    conditions): the old rows are then read by range. Returns None when the change is known
    to be empty.
    """
    if kind not in JOIN_KINDS:
        raise ValueError(f"join kind {kind!r}: expected one of {', '.join(JOIN_KINDS)}")
    dl, dr = left.delta, right.delta
    if dl.is_empty and dr.is_empty:
        return None
    if whole_outer(kind, left, right, left_old, right_old):
        return _whole_outer(kind, left, right, residual, null_safe)
    inner = kind in ("inner", "left", "full")
    unmatched_l = kind in ("left", "full", "semi", "anti")
    unmatched_r = kind == "full"
    if bands and kind == "inner":   # a range join: old rows read by the ranges the change bounds
        right.old = None if dl.is_empty else _read_in_range(right_old, right.bands, [FLIPPED[o] for o in bands],
                                                           dl, left.bands)
        left.old = None if dr.is_empty else _read_in_range(left_old, left.bands, list(bands), dr, right.bands)
    else:   # old rows read once per side, at every key a term needs
        k_l = None if dl.is_empty else left.change_keys(null_safe)
        k_r = None if dr.is_empty else right.change_keys(null_safe)
        r_at: list[KeySet] = []
        if k_l is not None:
            r_at.append(k_l.renamed(right.keys))
        if k_r is not None and unmatched_l:
            r_at.append(k_r)
        l_at: list[KeySet] = []
        if k_r is not None:
            l_at.append(k_r.renamed(left.keys))
        if k_l is not None and unmatched_r:
            l_at.append(k_l)
        r_keys, l_keys = _read_keys(right_old, r_at), _read_keys(left_old, l_at)
        if r_keys is not None and l_keys is not None:
            left_old.prefetch(l_keys, null_safe)   # (read while the right side is read here)
        right.old = _read(right_old, r_keys, null_safe)
        left.old = _read(left_old, l_keys, null_safe)

    parts: list[str] = []
    if inner:
        if right.old is not None and not dl.is_empty:
            parts.append(_inner(dl.sql, left, right.old.sql, right, residual, null_safe))
        if left.old is not None and not dr.is_empty:
            parts.append(_inner(left.old.sql, left, dr.sql, right, residual, null_safe))
        if not dl.is_empty and not dr.is_empty:
            parts.append(_inner(dl.sql, left, dr.sql, right, residual, null_safe))
    if unmatched_l:
        unmatched = _unmatched_delta(left, right, residual, null_safe)
        if kind == "anti":
            if unmatched is not None:
                parts.append(unmatched)
        elif kind == "semi":
            if not dl.is_empty:
                parts.append(f"SELECT {cols_sql(left.cols)}, {W} FROM {dl.sql}")
            if unmatched is not None:
                parts.append(f"SELECT {cols_sql(left.cols)}, -{W} AS {W} FROM ({unmatched})")
        elif unmatched is not None:
            parts.append(f"SELECT {cols_sql(left.cols)}, {right.null_padding()}, {W} FROM ({unmatched})")
    if unmatched_r:
        unmatched_r_sql = _unmatched_delta(right, left, residual, null_safe)
        if unmatched_r_sql is not None:
            parts.append(f"SELECT {left.null_padding()}, {cols_sql(right.cols)}, {W} FROM ({unmatched_r_sql})")
    return _union(parts)


def whole_outer(kind: str, left: JoinSide, right: JoinSide, left_old: Lookup, right_old: Lookup) -> bool:
    """Whether :func:`join_delta` computes a left or full outer join as SQL's outer join of
    its two changes: both consolidated or positive, and not empty, and no old rows on either
    side (the module docstring)."""
    dl, dr = left.delta, right.delta
    return (kind in ("left", "full") and left_old.empty and right_old.empty and not dl.is_empty
            and not dr.is_empty and (dl.consolidated or dl.positive) and (dr.consolidated or dr.positive))


def _whole_outer(kind: str, left: JoinSide, right: JoinSide, residual, null_safe) -> str:
    """A left or full outer join of two whole relations (the changes of a batch without old
    rows, consolidated or positive: positive weights), as SQL's outer join (the module
    docstring)."""
    lw = f"COALESCE(l.{W}, 1)" if kind == "full" else f"l.{W}"
    return (f"SELECT {cols_sql(left.cols, 'l')}, {cols_sql(right.cols, 'r')}, {lw} * COALESCE(r.{W}, 1) AS {W} "
            f"FROM {left.delta.sql} l {kind.upper()} OUTER JOIN {right.delta.sql} r "
            f"ON {_on('l', left, 'r', right, residual, null_safe)}")


def _read_keys(lookup: Lookup, at: list[KeySet]) -> KeySet | None:
    """The keys one side's old rows are read at: the union of ``at`` (None: no read needed,
    or none stored)."""
    if not at or lookup.empty:
        return None
    keys = union_keys(at)
    return None if keys.empty else keys


def _read(lookup: Lookup, keys: KeySet | None, null_safe: bool) -> Changelog | None:
    """The old rows of one side at ``keys`` (:func:`_read_keys`; None: none)."""
    if keys is None:
        return None
    old = lookup.read(keys, null_safe=null_safe)
    return None if old.is_empty else old


#: At most this many disjoint intervals per column are looked up; more are merged into as many
#: hulls of neighbours (a superset).
MAX_INTERVALS = 64


def _read_in_range(lookup: Lookup, columns: list[str], ops: list[str], change: Changelog,
                   values: list[str]) -> Changelog | None:
    """The old rows of one side of a range join that can meet a row of the other side's
    ``change``: per band ``i``, the condition ``columns[i] ops[i] values[i]`` (a column of
    this side, one of ``change``). None when none can (every row of the change has a NULL
    in a band) or none is stored.

    Per column of this side: a lower bound (``>``, ``>=``: the change's minimum) and/or an
    upper bound (``<``, ``<=``: its maximum); with both, each row of the change on the
    driver gives its own interval (its lower value, its upper value), merged. A change on
    the executors gives the hull (one Spark job); one of unknown size (the plan's dry run)
    reads every row."""
    if lookup.empty:
        return None
    lows: dict[str, list[str]] = {}
    highs: dict[str, list[str]] = {}
    for c, op, v in zip(columns, ops, values):
        (lows if op in (">", ">=") else highs).setdefault(c, []).append(v)
    used = sorted({v for vs in (*lows.values(), *highs.values()) for v in vs})
    if change.arrow is not None:
        rows = [r for r in change.arrow.select(used).to_pylist() if all(r[v] is not None for v in used)]
        if not rows:
            return None
        ranges = {}
        for c in dict.fromkeys(columns):
            try:
                intervals = [(max(r[v] for v in lows[c]) if c in lows else None,
                              min(r[v] for v in highs[c]) if c in highs else None) for r in rows]
                ranges[c] = merge_intervals(intervals)
            except TypeError:   # values that do not compare in Python: this column bounds nothing
                continue
    elif change.rows is not None:
        where = " AND ".join(f"{q(v)} IS NOT NULL" for v in used)
        sel = [f"MIN({_extreme('GREATEST', lows[c])}) AS {q('lo_' + c)}" for c in lows] + \
              [f"MAX({_extreme('LEAST', highs[c])}) AS {q('hi_' + c)}" for c in highs]
        hull = change.views.sql(f"SELECT {', '.join(sel)}, COUNT(*) AS `__n` FROM {change.sql} WHERE {where}") \
            .collect()[0].asDict()
        if not hull["__n"]:
            return None
        ranges = {c: [(hull.get("lo_" + c), hull.get("hi_" + c))] for c in dict.fromkeys(columns)}
    else:
        ranges = {}
    old = lookup.read_range(ranges) if ranges else lookup.read(None)
    return None if old.is_empty else old


def _extreme(func: str, columns: list[str]) -> str:
    return f"{func}({', '.join(q(v) for v in columns)})" if len(columns) > 1 else q(columns[0])


def merge_intervals(intervals: list[tuple[object, object]], most: int = MAX_INTERVALS) -> list[tuple[object, object]]:
    """Inclusive ``(lo, hi)`` intervals (None: unbounded on that end) as at most ``most``
    disjoint ones covering them, in order; an empty interval (``lo > hi``) is dropped.

    >>> merge_intervals([(5, 7), (1, 2), (2, 3), (9, None), (4, 1)])
    [(1, 3), (5, 7), (9, None)]
    >>> merge_intervals([(1, 1), (3, 3), (5, 5), (7, 7)], most=2)
    [(1, 3), (5, 7)]
    """
    lo_key = lambda p: (p[0] is not None, p[0])  # noqa: E731 (None first: unbounded below)
    kept = sorted((p for p in intervals if p[0] is None or p[1] is None or not p[0] > p[1]), key=lo_key)
    out: list[list[object]] = []
    for lo, hi in kept:
        if out and (out[-1][1] is None or (lo is not None and lo <= out[-1][1])):
            if out[-1][1] is not None and (hi is None or hi > out[-1][1]):
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    if len(out) > most:
        step = -(-len(out) // most)
        out = [[g[0][0], g[-1][1]] for g in (out[i:i + step] for i in range(0, len(out), step))]
    return [tuple(p) for p in out]
