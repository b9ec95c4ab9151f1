"""The clock: ``current_date()``, ``current_timestamp()``, ``now()``, ``curdate()``,
``localtimestamp()`` and ``unix_timestamp()`` without arguments, bound per batch to one instant.

Each micro-batch takes one instant (:class:`Instant`: microseconds since the epoch and the
session time zone that decides ``current_date()``, as in Spark), recorded in its commit
beside the cut; every version of the target equals the model's SQL at its cut with the clock's
functions returning that instant. Binding replaces each call by a literal of that value
(:func:`bind`), so the same text runs in Spark, in DuckDB and in the oracle.

In the plan, an operator whose expressions read the clock is maintained by its own rule:
a filter is a :class:`~.logical.TemporalFilter` and a projection a
:class:`~.logical.TemporalProject` (:func:`temporal_operators`, run after lowering); the
lowering sends any other use (a join key, an aggregate's argument, a window) to the
recompute floor.

A temporal filter's *time key* (Materialize's temporal filters): when every conjunct that
reads the clock compares one clock-free expression ``k`` of the row with clock-only
expressions ``b`` (``k >= b``, ``k < b``, ``k = b``, ``k BETWEEN b1 AND b2``, either side),
a row's verdict can only change between instants ``t0`` and ``t1`` if ``k`` lies between
``b(t0)`` and ``b(t1)`` for one of the bounds, so a batch reads only those rows.

>>> i = Instant(1_700_000_000_123_456, "UTC")
>>> bind("SELECT * FROM t WHERE d >= date_sub(current_date(), 7)", i)
"SELECT * FROM t WHERE d >= DATE_ADD(CAST('2023-11-14' AS DATE), 7 * -1)"
>>> bind("SELECT * FROM t WHERE ts < now()", i)
"SELECT * FROM t WHERE ts < CAST('2023-11-14 22:13:20.123456' AS TIMESTAMP)"
>>> analyze_time_key("`d` >= DATE_SUB(CURRENT_DATE, 7) AND `x` > 1")
('`d`', ['DATE_ADD(CURRENT_DATE, 7 * -1)'])
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import sqlglot
from sqlglot import exp

from ..errors import CompileError
from .logical import (Aggregate, Dedup, Filter, Join, Node, Project, Recompute, TemporalFilter, TemporalProject,
                      Window, walk)

_ANONYMOUS = {"now": "timestamp", "curdate": "date", "localtimestamp": "timestamp_ntz",
              "current_timestamp": "timestamp", "current_date": "date"}


def clock_kind(node: exp.Expression) -> str | None:
    """``timestamp``, ``date``, ``timestamp_ntz`` or ``unix`` when ``node`` is a call of the
    clock, else None."""
    if isinstance(node, exp.CurrentTimestamp) or isinstance(node, exp.CurrentDatetime):
        return "timestamp"
    if isinstance(node, exp.CurrentDate):
        return "date"
    if isinstance(node, exp.Localtimestamp):
        return "timestamp_ntz"
    if isinstance(node, exp.StrToUnix) and isinstance(node.this, exp.CurrentTimestamp):
        return "unix"   # unix_timestamp() without arguments
    if isinstance(node, exp.Anonymous) and node.name.lower() in _ANONYMOUS and not node.expressions:
        return _ANONYMOUS[node.name.lower()]
    return None


def uses_clock(e: exp.Expression | str | None) -> bool:
    """Whether ``e`` (an AST, or Spark SQL text) calls the clock."""
    if e is None:
        return False
    if isinstance(e, str):
        if not any(w in e.lower() for w in ("current", "now", "curdate", "localtimestamp", "unix_timestamp")):
            return False
        e = sqlglot.parse_one(e, read="spark")
    return any(clock_kind(n) is not None for n in e.walk())


@dataclass(frozen=True)
class Instant:
    """One batch's instant: ``micros`` since the epoch (UTC) and the session ``time_zone``
    (an IANA name or a fixed offset as Spark accepts it) in which ``current_date()`` and
    ``localtimestamp()`` are read."""
    micros: int
    time_zone: str = "UTC"

    def local(self) -> datetime.datetime:
        """The instant as a wall-clock time in the session time zone."""
        utc = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=self.micros)
        return utc.astimezone(_zone(self.time_zone))

    def literal(self, kind: str) -> exp.Expression:
        """The value of a clock call of ``kind`` (:func:`clock_kind`) at this instant, as a Spark
        SQL literal (a timestamp literal is read in the session time zone, as Spark reads it)."""
        t = self.local()
        if kind == "date":
            return exp.cast(exp.Literal.string(t.date().isoformat()), "date")
        if kind == "unix":
            return exp.cast(exp.Literal.number(self.micros // 1_000_000), "bigint")
        text = t.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        return exp.cast(exp.Literal.string(text), "timestamp_ntz" if kind == "timestamp_ntz" else "timestamp")

    def to_json(self) -> dict:
        return {"micros": self.micros, "time_zone": self.time_zone}

    @staticmethod
    def from_json(d: dict | None) -> "Instant | None":
        if not d:
            return None
        return Instant(int(d["micros"]), str(d.get("time_zone") or "UTC"))


def commit_instants(metadata: dict) -> tuple[Instant | None, dict[str, Instant]]:
    """From a target commit's consistent_stream metadata (values decoded or JSON text): the
    batch's instant and those of the upstream models' versions it read, by model name (None
    and {} in commits that recorded none)."""
    import json

    def decoded(v):
        return json.loads(v) if isinstance(v, str) else v
    ups = decoded(metadata.get("upstream_instants")) or {}
    return (Instant.from_json(decoded(metadata.get("instant"))),
            {name: Instant.from_json(i) for name, i in ups.items() if i})


def _zone(name: str) -> datetime.tzinfo:
    """A Spark session time zone as a tzinfo: an IANA region, ``UTC``/``Z``, or an offset
    (``+01:00``, ``GMT+1``, ``UTC-05:30``)."""
    n = name.strip()
    if n.upper() in ("UTC", "Z", "GMT"):
        return datetime.timezone.utc
    for prefix in ("UTC", "GMT"):
        if n.upper().startswith(prefix) and len(n) > len(prefix):
            n = n[len(prefix):]
    if n[:1] in "+-":
        sign = -1 if n[0] == "-" else 1
        hh, _, mm = n[1:].partition(":")
        return datetime.timezone(sign * datetime.timedelta(hours=int(hh), minutes=int(mm or 0)))
    return ZoneInfo(n)


def bind_ast(ast: exp.Expression, instant: Instant) -> exp.Expression:
    """A copy of ``ast`` with every clock call replaced by its value at ``instant``."""
    def fn(n):
        kind = clock_kind(n)
        return instant.literal(kind) if kind is not None else n
    return ast.copy().transform(fn)


def bind(sql: str, instant: Instant | None) -> str:
    """Spark SQL ``sql`` with every clock call replaced by its value at ``instant`` (``sql``
    unchanged when it reads no clock, or when ``instant`` is None)."""
    if instant is None or not uses_clock(sql):
        return sql
    return bind_ast(sqlglot.parse_one(sql, read="spark"), instant).sql(dialect="spark")


def clock_values(sql: str, instant: Instant) -> tuple[str, ...]:
    """The literals the clock calls of ``sql`` take at ``instant``, in order: two instants
    with equal values give every expression of ``sql`` the same value (``current_date()``
    moves once a day)."""
    ast = sqlglot.parse_one(sql, read="spark")
    return tuple(instant.literal(clock_kind(n)).sql(dialect="spark") for n in ast.walk() if clock_kind(n))


def analyze_time_key(predicate: str) -> tuple[str | None, list[str]]:
    """The time key and bounds of a temporal filter's ``predicate`` (Spark SQL): ``(key,
    [bound, ..])`` when every conjunct that reads the clock compares one clock-free
    expression ``key`` with clock-only bounds (see the module docstring), else ``(None, [])``.
    """
    from .expressions import conjuncts
    key, bounds = None, []
    for c in conjuncts(sqlglot.parse_one(predicate, read="spark")):
        if not uses_clock(c):
            continue
        pairs = _compared(c)
        if pairs is None:
            return None, []
        for k, b in pairs:
            ks = k.sql(dialect="spark")
            if key is not None and ks != key:
                return None, []
            key = ks
            bounds.append(b.sql(dialect="spark"))
    return key, bounds


def _compared(c: exp.Expression) -> list[tuple[exp.Expression, exp.Expression]] | None:
    """``[(key, bound)]`` when ``c`` compares a clock-free key with clock-only bounds."""
    while isinstance(c, exp.Paren):
        c = c.this
    if isinstance(c, exp.Not):
        return _compared(c.this)
    if isinstance(c, exp.Between):
        key, lo, hi = c.this, c.args["low"], c.args["high"]
        if uses_clock(key) or _reads_columns(lo) or _reads_columns(hi):
            return None
        return [(key, b) for b in (lo, hi) if uses_clock(b)]
    if isinstance(c, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
        a, b = c.this, c.expression
        if uses_clock(a) and not _reads_columns(a) and not uses_clock(b):
            return [(b, a)]
        if uses_clock(b) and not _reads_columns(b) and not uses_clock(a):
            return [(a, b)]
    return None


def _reads_columns(e: exp.Expression) -> bool:
    return e.find(exp.Column) is not None


def temporal_operators(node: Node) -> Node:
    """The plan with every Filter and Project whose expressions read the clock replaced by a
    :class:`~.logical.TemporalFilter` / :class:`~.logical.TemporalProject` (in place below
    ``node``; returns the new root)."""
    for attr in ("child", "left", "right"):
        c = getattr(node, attr, None)
        if isinstance(c, Node):
            setattr(node, attr, temporal_operators(c))
    inputs = getattr(node, "inputs", None)
    if isinstance(inputs, list):
        node.inputs = [temporal_operators(i) for i in inputs]
    if isinstance(node, (Join, Aggregate, Window, Dedup)) and _reads_clock(node):
        raise CompileError(type(node).__name__, "current_date()/current_timestamp() reached an operator without "
                           "a temporal rule (a bug: the lowering sends such a query to the recompute floor)")
    if isinstance(node, Filter) and uses_clock(node.predicate):
        key, bounds = analyze_time_key(node.predicate)
        return TemporalFilter(columns=list(node.columns), child=node.child, predicate=node.predicate,
                              time_key=key, bounds=bounds)
    if isinstance(node, Project) and any(uses_clock(e) for e in node.exprs):
        return TemporalProject(columns=list(node.columns), child=node.child, exprs=list(node.exprs))
    return node


def _reads_clock(node: Node) -> bool:
    texts = []
    if isinstance(node, Join):
        texts = [node.residual, *node.left_keys, *node.right_keys]
    elif isinstance(node, Aggregate):
        texts = [*node.group_exprs, *[a.arg for a in node.aggs]]
    elif isinstance(node, Window):
        texts = [c.func for c in node.calls]
    return any(uses_clock(t) for t in texts if t)


def plan_reads_clock(root: Node) -> bool:
    """Whether a batch of the plan under ``root`` depends on its instant (a temporal
    operator, or a recomputed block that reads the clock)."""
    return any(isinstance(n, (TemporalFilter, TemporalProject)) or (isinstance(n, Recompute) and uses_clock(n.sql))
               for n in walk(root))
