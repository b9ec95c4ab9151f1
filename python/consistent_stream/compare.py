"""A target compared with batch evaluation: the one rule every check of the central contract
uses (``verify``, the tests' central check, the crash campaign, the benchmarks).

Two results are equal when their rows match as a multiset: each row of one side is paired
with at most one row of the other, such that in every pair

* every *exact* column is equal: integers, decimals (``1.50 == 1.5``), strings, booleans,
  dates, timestamps to the microsecond (time-zone-aware ones as the instant), binary, nested
  values; NULL equals only NULL, a date never equals a timestamp, a string never a number;
* every *floating-point* column agrees within a tolerance (:class:`FloatTolerance`): FLOAT and
  DOUBLE columns, and any other column the caller names as computed from them (an ``inexact``
  column: a DECIMAL or integer cast or rounded from a double, where a last-bit difference may
  cross a rounding boundary, so it may also differ by one unit in its last place).

Why a tolerance and never rounding: floating-point addition is not associative, so a SUM or
AVG over doubles maintained incrementally (accumulated batch by batch, retractions
subtracted) and the same aggregate evaluated in batch (in another order) may differ in their
last bits; two values one ulp apart can round to different digits at any number of digits
(``1167.448435`` and ``1167.4484349999998`` at 9 significant digits), so only a distance
says whether they agree.

The matching: rows equal in every column cancel first (a multiset difference); the rest are
grouped by their exact columns, and within a group paired by their floating-point columns
(sorted order first, then maximum bipartite matching where the sorted pairing leaves rows
unpaired), so the answer does not depend on row order. NaN equals NaN, infinities only
themselves, ``-0.0`` equals ``0.0``.

In: two Arrow tables with the same column names in the same order (:func:`compare_tables`).
Out: a :class:`Comparison`: rows left unmatched on each side, examples of them (each with its
nearest row of the same exact values on the other side and the difference), and the largest
difference seen between matched floating-point values.

>>> import pyarrow as pa
>>> r = compare_tables(pa.table({"k": [1, 2], "x": [1167.448435, 0.5]}),
...                    pa.table({"k": [2, 1], "x": [0.5, 1167.4484349999998]}))
>>> r.ok, r.largest_difference["column"]
(True, 'x')
"""
from __future__ import annotations

import datetime
import decimal
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

DEFAULT_RELATIVE = 1e-9
DEFAULT_ABSOLUTE = 1e-12


@dataclass(frozen=True)
class FloatTolerance:
    """When two floating-point values agree: ``|a - b| <= max(relative * max(|a|, |b|),
    absolute)``. ``relative`` is dimensionless, ``absolute`` in the column's own units (it
    only matters near zero)."""
    relative: float = DEFAULT_RELATIVE
    absolute: float = DEFAULT_ABSOLUTE

    def __post_init__(self):
        for name in ("relative", "absolute"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"float tolerance: {name} must be a finite number >= 0, not {v!r}")

    @staticmethod
    def parse(text: str) -> "FloatTolerance":
        """``"REL"`` or ``"REL,ABS"`` (e.g. ``1e-6`` or ``1e-6,1e-9``), as ``--float-tolerance``
        takes it. Raises ValueError naming the text."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            if len(parts) == 1:
                return FloatTolerance(float(parts[0]))
            if len(parts) == 2:
                return FloatTolerance(float(parts[0]), float(parts[1]))
        except ValueError as e:
            raise ValueError(f"--float-tolerance {text!r}: {e}; give REL or REL,ABS, e.g. 1e-9 or 1e-9,1e-12") from e
        raise ValueError(f"--float-tolerance {text!r}: give REL or REL,ABS, e.g. 1e-9 or 1e-9,1e-12")

    def to_json(self) -> dict:
        return {"relative": self.relative, "absolute": self.absolute}


@dataclass
class Comparison:
    """What :func:`compare_tables` found. ``missing``: rows of the expected side (batch
    evaluation) left unmatched; ``unexpected``: rows of the compared side (the target) left
    unmatched; ``examples``: up to the requested number of each, as ``{"missing": row}`` or
    ``{"unexpected": row}``, with ``"nearest"`` (the closest unmatched row on the other side
    with the same exact values) and ``"difference"`` (per floating-point column: both values,
    absolute and relative difference) when there is one. ``largest_difference``: among matched
    pairs, the floating-point difference of largest relative size (``column``, ``target``,
    ``expected``, ``absolute``, ``relative``), None when all matched values were equal.
    ``inexact_columns``: the columns compared with the tolerance."""
    rows_target: int
    rows_expected: int
    missing: int
    unexpected: int
    tolerance: FloatTolerance
    inexact_columns: list[str]
    examples: list = field(default_factory=list)
    largest_difference: dict | None = None

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.unexpected == 0

    def describe(self, what: str = "target") -> str:
        """One paragraph for an assertion or a log line."""
        head = (f"{what}: {self.rows_target} rows, batch evaluation {self.rows_expected}; {self.missing} missing, "
                f"{self.unexpected} unexpected (floating-point columns {self.inexact_columns or 'none'} within "
                f"relative {self.tolerance.relative:g}, absolute {self.tolerance.absolute:g})")
        return "\n".join([head] + [f"  {e}" for e in self.examples])


def arrow_inexact_columns(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` whose type is floating point (float16/32/64)."""
    return [f.name for f in schema if pa.types.is_floating(f.type)]


def compare_tables(target: pa.Table, expected: pa.Table, *, tolerance: FloatTolerance | None = None,
                   inexact: list[str] | tuple[str, ...] = (), unit: dict[str, float] | None = None,
                   examples: int = 5) -> Comparison:
    """Compare ``target`` with ``expected`` as multisets by the module's rule.

    ``inexact``: columns computed from floating point besides those whose Arrow type is
    floating on either side (those always are); ``unit``: per such column one unit in its last
    place (``10 ** -scale`` for a DECIMAL, 1 for an integer), a difference the rounding of a
    value computed from floating point may make on its own. Raises ValueError when the two
    tables do not have the same column names in the same order."""
    tolerance = tolerance or FloatTolerance()
    if target.column_names != expected.column_names:
        raise ValueError(f"columns differ: target {target.column_names}, batch evaluation {expected.column_names}")
    names = target.column_names
    floats = set(arrow_inexact_columns(target.schema)) | set(arrow_inexact_columns(expected.schema)) | set(inexact)
    fidx = [i for i, c in enumerate(names) if c in floats]
    eidx = [i for i, c in enumerate(names) if c not in floats]
    units = [float((unit or {}).get(names[i], 0.0)) for i in fidx]
    got, want = Counter(_rows(target)), Counter(_rows(expected))
    left_got, left_want = got - want, want - got   # rows equal in every column cancel
    result = Comparison(rows_target=target.num_rows, rows_expected=expected.num_rows, missing=0, unexpected=0,
                        tolerance=tolerance, inexact_columns=[names[i] for i in fidx])
    groups: dict = defaultdict(lambda: ([], []))
    for side, rows in ((0, left_got), (1, left_want)):
        for row, n in rows.items():
            groups[tuple(row[i] for i in eidx)][side].extend([tuple(_as_float(row[i]) for i in fidx)] * n)
    matcher = _Matcher(tolerance, units)
    for key, (g, w) in groups.items():
        pairs, lone_g, lone_w = matcher.match(g, w)
        for a, b in pairs:
            matcher.note_difference(a, b, [names[i] for i in fidx])
        result.unexpected += len(lone_g)
        result.missing += len(lone_w)
        for kind, lone, other in (("missing", lone_w, lone_g), ("unexpected", lone_g, lone_w)):
            for vals in lone:
                if sum(1 for e in result.examples if kind in e) >= examples:
                    break
                result.examples.append(_example(kind, names, eidx, fidx, key, vals, other, matcher))
    result.largest_difference = matcher.largest
    return result


@dataclass(frozen=True)
class TopN:
    """The outermost ``ORDER BY .. LIMIT`` of a model: its keys as ``(output column position,
    descending, NULLs first)`` and whether it has an OFFSET (:func:`consistent_stream.plan.topn.model_top_n`)."""
    keys: tuple[tuple[int, bool, bool], ...]
    offset: bool = False


def compare_top_n(target: pa.Table, expected: pa.Table, top: TopN, **kw) -> Comparison:
    """:func:`compare_tables` of two results of one top-N as SQL allows them to differ: rows
    whose ORDER BY values tie at a boundary of the LIMIT (the last kept values; with an OFFSET
    the first kept values too) may be any of the tied rows. So both sides must keep the same
    multiset of ORDER BY values, and every row whose values are not at a boundary must match;
    rows at a boundary are compared by their ORDER BY values only. A row is at a boundary when
    its keys equal the boundary's by the module's rule: a key that is FLOAT or DOUBLE on
    either side (DuckDB's DOUBLE of a division Spark types DECIMAL) within the tolerance,
    others exactly."""
    if target.column_names != expected.column_names:
        raise ValueError(f"columns differ: target {target.column_names}, batch evaluation {expected.column_names}")
    names = [target.column_names[i] for i, _, _ in top.keys]
    keys = compare_tables(target.select(names), expected.select(names), **kw)
    if not keys.ok or not expected.num_rows:
        return keys

    def key(row):
        return tuple(canonical(v) for v in row)
    def order(row):   # Spark's order of the keys, NULLs placed as the ORDER BY asks
        return [(0 if nulls_first else 2, None) if row[i] is None else (1, _Reverse(row[i]) if desc else row[i])
                for i, desc, nulls_first in top.keys]
    rows = sorted(expected.to_pylist(), key=lambda r: order([r[c] for c in expected.column_names]))
    pick = [rows[-1]] + ([rows[0]] if top.offset else [])
    boundary = [key([r[c] for c in names]) for r in pick]
    tol = kw.get("tolerance") or FloatTolerance()

    def same(a, b) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            if a is None or b is None or isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
                return False
            try:
                x, y = float(a), float(b)
            except (TypeError, ValueError):
                return False
            return x == y or abs(x - y) <= max(tol.relative * max(abs(x), abs(y)), tol.absolute)
        return a == b

    def at_boundary(k) -> bool:
        k = key(k)
        return any(all(same(a, b) for a, b in zip(k, bk)) for bk in boundary)

    def inside(t: pa.Table) -> pa.Table:
        keep = [not at_boundary(k) for k in zip(*[t.column(c).to_pylist() for c in names])]
        return t.filter(pa.array(keep, pa.bool_())) if t.num_rows else t
    rest = compare_tables(inside(target), inside(expected), **kw)
    rest.rows_target, rest.rows_expected = target.num_rows, expected.num_rows
    return rest


@dataclass(frozen=True)
class _Reverse:
    """A value that sorts in descending order."""
    v: object

    def __lt__(self, other: "_Reverse") -> bool:
        return other.v < self.v


def _example(kind: str, names, eidx, fidx, key, vals, other, matcher) -> dict:
    row = _assemble(names, eidx, fidx, key, vals)
    out = {kind: row}
    if other and fidx:
        near = min(other, key=lambda o: matcher.distance(vals, o))
        out["nearest"] = _assemble(names, eidx, fidx, key, near)
        a, b = (near, vals) if kind == "missing" else (vals, near)   # (target, expected)
        out["difference"] = {names[i]: _difference(x, y) for i, x, y in zip(fidx, a, b) if not _same_float(x, y)}
    return out


def _assemble(names, eidx, fidx, key, vals) -> dict:
    row = [None] * len(names)
    for i, v in zip(eidx, key):
        row[i] = _shown(v)
    for i, v in zip(fidx, vals):
        row[i] = v
    return dict(zip(names, row))


def _shown(v):
    return v[1] if isinstance(v, tuple) and len(v) == 2 and v[0] == _NESTED else v


def _difference(target, expected) -> dict:
    d = {"target": target, "expected": expected}
    if target is not None and expected is not None and math.isfinite(target) and math.isfinite(expected):
        d["absolute"], scale = _gap(target, expected)
        d["relative"] = d["absolute"] / scale if scale else 0.0
    return d


def _same_float(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


class _Matcher:
    """Pairs rows of floating-point values within a tolerance, remembering the largest
    difference of the pairs it made."""

    MAX_BIPARTITE = 2000
    """Rows per side past which a group keeps the sorted pairing only (the bipartite search is
    quadratic); reached only by groups of thousands of rows equal in every exact column."""

    def __init__(self, tolerance: FloatTolerance, units: list[float]):
        self.tol, self.units = tolerance, units
        self.largest: dict | None = None

    def close(self, a: tuple, b: tuple) -> bool:
        return all(self._close(x, y, u) for x, y, u in zip(a, b, self.units))

    def _close(self, x, y, unit: float) -> bool:
        if x is None or y is None:
            return x is None and y is None
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        if math.isinf(x) or math.isinf(y):
            return x == y
        diff, scale = _gap(x, y)
        return diff <= max(self.tol.relative * scale, self.tol.absolute, unit)

    def distance(self, a: tuple, b: tuple) -> float:
        """How far apart two rows' values are (for picking the nearest row in a report)."""
        d = 0.0
        for x, y in zip(a, b):
            if x is None or y is None or math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
                d += 0.0 if _same_float(x, y) else math.inf
            else:
                diff, scale = _gap(x, y)
                d += diff / max(scale, 1e-300)
        return d

    def note_difference(self, target: tuple, expected: tuple, columns: list[str]) -> None:
        for c, x, y in zip(columns, target, expected):
            if _same_float(x, y) or x is None or not math.isfinite(x) or y is None or not math.isfinite(y):
                continue
            d = _difference(x, y)
            if self.largest is None or d["relative"] > self.largest["relative"]:
                self.largest = {"column": c, **d}

    def match(self, got: list[tuple], want: list[tuple]):
        """(pairs (got row, want row), unpaired got rows, unpaired want rows)."""
        if not got or not want:
            return [], got, want
        if not self.units:   # no floating-point column: rows equal in all columns already cancelled
            return [], got, want
        g, w = sorted(got, key=_float_key), sorted(want, key=_float_key)
        pairs, lone_g, lone_w = [], [], []
        i = j = 0
        while i < len(g) and j < len(w):   # sorted order: exact for one column, usually for more
            if self.close(g[i], w[j]):
                pairs.append((g[i], w[j]))
                i, j = i + 1, j + 1
            elif _float_key(g[i]) < _float_key(w[j]):
                lone_g.append(g[i])
                i += 1
            else:
                lone_w.append(w[j])
                j += 1
        lone_g += g[i:]
        lone_w += w[j:]
        if lone_g and lone_w and len(g) <= self.MAX_BIPARTITE and len(w) <= self.MAX_BIPARTITE:
            return self._bipartite(g, w)
        return pairs, lone_g, lone_w

    def _bipartite(self, g: list[tuple], w: list[tuple]):
        """Maximum matching (Kuhn's augmenting paths) of rows within the tolerance."""
        adj = [[j for j, b in enumerate(w) if self.close(a, b)] for a in g]
        owner = [-1] * len(w)

        def augment(i: int, seen: list[bool]) -> bool:
            for j in adj[i]:
                if not seen[j]:
                    seen[j] = True
                    if owner[j] < 0 or augment(owner[j], seen):
                        owner[j] = i
                        return True
            return False

        for i in range(len(g)):
            augment(i, [False] * len(w))
        matched_g = {i for i in owner if i >= 0}
        pairs = [(g[i], w[j]) for j, i in enumerate(owner) if i >= 0]
        return (pairs, [a for i, a in enumerate(g) if i not in matched_g],
                [b for j, b in enumerate(w) if owner[j] < 0])


def _as_float(v) -> float | decimal.Decimal | None:
    """A value of an inexact column as a number to measure: a float, or a Decimal kept exact
    (a DECIMAL computed from floating point, whose unit in the last place is measured
    exactly); None for NULL."""
    return None if v is None else v if isinstance(v, (float, decimal.Decimal)) else float(v)


def _gap(x, y) -> tuple[float, float]:
    """``(|x - y|, max(|x|, |y|))`` as floats, the difference taken exactly for two Decimals."""
    if not (isinstance(x, decimal.Decimal) and isinstance(y, decimal.Decimal)):
        x, y = float(x), float(y)
    return float(abs(x - y)), float(max(abs(x), abs(y)))


def _float_key(row: tuple) -> tuple:
    """Sort order of floating-point values: NULL first, NaN last."""
    return tuple((0, 0.0) if v is None else (2, 0.0) if math.isnan(v) else (1, v) for v in row)


_NESTED = "__nested__"


def _rows(table: pa.Table) -> list[tuple]:
    """The rows of ``table`` as tuples of canonical Python values (:func:`canonical`)."""
    types = [f.type for f in table.schema]
    cols = [[canonical(v, t) for v in c.to_pylist()] for c, t in zip(table.columns, types)]
    return list(zip(*cols)) if cols else []


def canonical(v, typ: pa.DataType | None = None):
    """A cell as a hashable Python value compared by the module's rule: None for NULL; floats
    as floats (``-0.0`` as ``0.0``; NaN kept, matched by the tolerance step); time-zone-aware
    timestamps as naive UTC; nested values (lists, structs, maps) as tuples tagged so they
    never equal a scalar; decimals and integers as they are (``Decimal('1.50') == 1.5`` is
    false but ``Decimal('1.50') == Decimal('1.5')`` and ``Decimal(1) == 1`` are true)."""
    if v is None:
        return None
    if isinstance(v, float):
        return 0.0 if v == 0 else v
    if isinstance(v, bool) or isinstance(v, (int, str, bytes, decimal.Decimal, datetime.date, datetime.time,
                                             datetime.timedelta)) and not isinstance(v, datetime.datetime):
        return v
    if isinstance(v, datetime.datetime):
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None) if v.tzinfo is not None else v
    return (_NESTED, _frozen(v))


def _frozen(v):
    if isinstance(v, dict):
        return tuple(sorted((str(k), _frozen(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    if isinstance(v, float) and v == 0:
        return 0.0
    return v
