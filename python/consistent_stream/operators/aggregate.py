"""GROUP BY aggregation under retractions: SUM, COUNT, COUNT(*), AVG, the variances and
standard deviations (VAR_SAMP, VAR_POP, STDDEV_SAMP, STDDEV_POP), the covariances and the
correlation (COVAR_POP, COVAR_SAMP, CORR), MIN, MAX, PERCENTILE,
PERCENTILE_DISC, COLLECT_LIST, COLLECT_SET and the DISTINCT forms COUNT/SUM/AVG(DISTINCT x).

State (two kinds of arrangement, both additive, keyed by the group columns):

* ``acc``: per group the linear accumulators ``<op>__count = sum(w)`` and per argument
  ``<op>__s<i> = sum(x*w)``, ``<op>__n<i> = sum(w) over non-NULL x``. Linear aggregates are
  differences of these: SUM = s (NULL when n = 0), COUNT(x) = n, COUNT(*) = count,
  AVG = s / n. A batch appends its partial accumulators; a read sums them per group. For a
  FLOAT or DOUBLE argument, ``s`` is a compensated pair ``<op>__s<i>`` + ``<op>__s<i>_lo``
  over the finite values, with the weights of +Infinity, -Infinity and NaN values counted
  apart (``_pinf``, ``_ninf``, ``_nan``), so that retractions cancel to within ``eps**2`` of
  the magnitudes summed and a retracted infinity leaves nothing behind
  (:mod:`consistent_stream.fsum`); a batch's partial sums are taken per bucket of rows first
  (:func:`~consistent_stream.fsum.bucket_sql`), then per group. A variance's argument has
  its own ``<op>__m<i>`` accumulators over the value as DOUBLE: the compensated sum, the
  compensated sum of squares (each square an exact pair) and the non-finite counts
  (:func:`_moment_sql`). A co-moment aggregate's argument (the struct of its two DOUBLEs) has
  ``<op>__c<i>`` accumulators over the rows where both are non-NULL: their count, the
  compensated sums of x, y, x*x, y*y and x*y (each product an exact pair) and the count of
  rows with a value that is not finite (:func:`_comoment_sql`).
* ``vals<i>`` for each MIN/MAX/PERCENTILE/COLLECT/DISTINCT argument: the multiset of (group, value) with counts
  (``__weight``), consolidated per batch, so that when the current extreme is retracted the
  next one is known (Flink's MinWithRetract / MaxWithRetract accumulators, kept as a Z-set
  instead of a map), and the distinct values of a group are those with a positive count.
  These aggregates are Spark's own functions over the live values of the touched groups, so
  their types and rounding are batch evaluation's.

A change kept on the executors (a rebuild's snapshot) feeds both kinds from one pass over it:
with one multiset argument and no compensated pair, it is first grouped by the group columns
and that argument, and each of those rows is both a partial accumulator (summed again per
group: every accumulator is then an exact SUM) and a value with its weight (its count). With
several such arguments or a compensated pair, the change is written once and read by each
arrangement.

Delta rule, for the set G of groups touched by the batch (the groups of its partials):

    d(agg(A)) = + rows(agg(A_old + dA) over G where count > 0)
                - rows(agg(A_old) over G where count > 0)

consolidated, so an untouched value cancels; state is read only at G. A global aggregate (no
GROUP BY) has exactly one output row at every version, with SQL's values for an empty input
(COUNT 0, others NULL).

Example: A_old = {(g=a, x=5)}, dA = {(a, 7): +1} -> d(sum(x) by g) = {(a, 12): +1, (a, 5): -1}.

In: the input changelog, already projected to the group columns and one column per distinct
argument expression (``args``), + ``__weight``. Out: a SELECT of the group columns, one
column per aggregate, ``__weight``; None when the change is known to be empty.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from pyspark.sql.types import DataType, DecimalType, DoubleType, FloatType, StringType, StructField, StructType

from ..changelog import WEIGHT, Changelog, cols_sql, consolidate_sql, q
from ..fsum import ZERO, bucket_sql, finite_sql, nonfinite_counts_sql, pair_sum_sql, two_product_sql, value_sql
from ..plan.logical import COMOMENT_AGGS, LINEAR_AGGS, MOMENT_AGGS, MULTISET_AGGS, AggCall
from .keyed import Lookup, key_condition, union_keys

_MULTISET_FN = {"min": "MIN", "max": "MAX", "count_distinct": "COUNT", "sum_distinct": "SUM", "avg_distinct": "AVG"}
W = q(WEIGHT)


class OperatorState(Protocol):
    """The arrangements of one operator, by role (``acc``, ``vals0``, ``left``, ...).

    ``stage(role, sql, columns, key, additive, live, consolidated, compensated)``: the batch's
    change to arrangement ``role`` (a SELECT with ``columns``; consolidated by the additive
    columns, ``compensated`` pairs summed as double-doubles, unless ``consolidated``),
    materialized once (on the driver when change-sized, else by executors) and returned as a
    changelog to compute with. ``old(role)``: that arrangement as of the previous batch.
    """

    def stage(self, role: str, sql: str, columns: list[str], key: list[str], additive: tuple[str, ...] = (WEIGHT,),
              live: str | None = None, consolidated: bool = False,
              compensated: tuple[tuple[str, str], ...] = ()) -> Changelog: ...

    def old(self, role: str) -> Lookup: ...


@dataclass
class AggregateSpec:
    """What one aggregate computes: ``group`` columns, ``aggs``, ``args`` (aggregate name ->
    the input column holding its argument; aggregates over one expression share it and its
    value multiset), ``arg_types`` (input column -> Spark type) and ``out_types`` (aggregate
    name -> the SQL type of its result)."""
    op_id: str
    group: list[str]
    aggs: list[AggCall]
    args: dict[str, str]
    arg_types: dict[str, DataType]
    out_types: dict[str, str]


def _sum_sql(s: str, arg_type: DataType) -> str:
    """SUM as Spark types it, from the accumulated sum ``s``: for DECIMAL(p, s) a
    DECIMAL(p+10, s) (the accumulator, a sum of ``x * __weight``, is wider; an expression over
    the SUM, a division, would round at another scale), overflowing as Spark's SUM does."""
    if isinstance(arg_type, DecimalType):
        return f"CAST({s} AS DECIMAL({min(38, arg_type.precision + 10)}, {arg_type.scale}))"
    return s


def _avg_sql(s: str, n: str, arg_type: DataType) -> str:
    """AVG as Spark computes it, from the sum expression ``s`` and the count expression ``n``:
    for DECIMAL(p, s) the sum is DECIMAL(p+10, s) divided by a DECIMAL(20, 0) count, the
    result DECIMAL(p+4, s+4); otherwise DOUBLE."""
    if isinstance(arg_type, DecimalType):
        p, sc = arg_type.precision, arg_type.scale
        return (f"CAST(CAST({s} AS DECIMAL({min(38, p + 10)}, {sc})) / CAST({n} AS DECIMAL(20, 0)) "
                f"AS DECIMAL({min(38, p + 4)}, {min(38, sc + 4)}))")
    return f"CAST({s} AS DOUBLE) / CAST({n} AS DOUBLE)"


@dataclass
class _Accumulators:
    """The value columns of the ``acc`` arrangement: ``count`` (sum of weights), per linear
    argument its ``s`` (sum of x*w, only for SUM and AVG) and ``n`` (sum of w over non-NULL x)
    columns, and for a floating-point argument its compensated pair (``s`` and ``lo``) and its
    non-finite counts (``nonfinite``: +Infinity, -Infinity, NaN); ``exprs`` their aggregate
    expressions over the input, ``value_cols`` their names in order."""
    count: str
    s_col: dict[str, str]
    n_col: dict[str, str]
    exprs: list[str]
    value_cols: list[str]
    lo_col: dict[str, str]
    nonfinite: dict[str, tuple[str, str, str]]
    moments: dict[str, tuple[str, ...]]
    comoments: dict[str, tuple[str, ...]]

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        return (tuple((self.s_col[x], lo) for x, lo in self.lo_col.items())
                + tuple(p for m in self.moments.values() for p in (m[0:2], m[2:4]))
                + tuple(c[i:i + 2] for c in self.comoments.values() for i in range(0, 10, 2)))

    def sum_sql(self, column: str) -> str:
        """The aggregate expression combining ``column``'s partial accumulators of a group."""
        for hi, lo in self.pairs:
            if column in (hi, lo):
                return pair_sum_sql(q(hi), q(lo))[0 if column == hi else 1]
        return f"SUM({q(column)})"

    def value_sql(self, alias: str, x: str) -> str:
        """The sum of argument ``x`` from the accumulators of ``alias``."""
        s = f"{alias}.{q(self.s_col[x])}"
        if x not in self.lo_col:
            return s
        return value_sql(s, f"{alias}.{q(self.lo_col[x])}", *[f"{alias}.{q(c)}" for c in self.nonfinite[x]])


def _floating(t: DataType) -> bool:
    return isinstance(t, (DoubleType, FloatType))


def _both_present(x: str) -> str:
    """SQL: both fields of a co-moment aggregate's argument struct ``x`` are non-NULL."""
    return f"{q(x)}.x IS NOT NULL AND {q(x)}.y IS NOT NULL"


def _accumulators(spec: AggregateSpec, linear: list[AggCall]) -> _Accumulators:
    count = f"{spec.op_id}__count"
    linear_args = list(dict.fromkeys(spec.args[a.name] for a in linear))
    s_col = {x: f"{spec.op_id}__s{i}" for i, x in enumerate(linear_args)}
    n_col = {x: f"{spec.op_id}__n{i}" for i, x in enumerate(linear_args)}
    exprs = [f"CAST(SUM({W}) AS BIGINT) AS {q(count)}"]
    value_cols = [count]
    lo_col, nonfinite = {}, {}
    comoment_args = {spec.args[a.name] for a in linear if a.func in COMOMENT_AGGS}
    for x in linear_args:
        if any(a.func in ("sum", "avg") and spec.args[a.name] == x for a in linear):
            if _floating(spec.arg_types[x]) or isinstance(spec.arg_types[x], StringType):
                # Spark sums a string argument as DOUBLE (its implicit cast: SUM(CAST(x AS DOUBLE)))
                v = q(x) if _floating(spec.arg_types[x]) else f"CAST({q(x)} AS DOUBLE)"
                lo_col[x] = f"{s_col[x]}_lo"
                nonfinite[x] = (f"{s_col[x]}_pinf", f"{s_col[x]}_ninf", f"{s_col[x]}_nan")
                hi, lo = pair_sum_sql(f"{finite_sql(v)} * {W}")
                exprs += [f"{hi} AS {q(s_col[x])}", f"{lo} AS {q(lo_col[x])}"]
                exprs += [f"{e} AS {q(c)}" for e, c in zip(nonfinite_counts_sql(v, W), nonfinite[x])]
                value_cols += [s_col[x], lo_col[x], *nonfinite[x]]
            else:
                exprs.append(f"SUM({q(x)} * {W}) AS {q(s_col[x])}")
                value_cols.append(s_col[x])
        present = _both_present(x) if x in comoment_args else f"{q(x)} IS NOT NULL"
        exprs.append(f"CAST(SUM(CASE WHEN {present} THEN {W} ELSE 0 END) AS BIGINT) AS {q(n_col[x])}")
        value_cols.append(n_col[x])
    moments = {}
    for i, x in enumerate(linear_args):
        if any(a.func in MOMENT_AGGS and spec.args[a.name] == x for a in linear):
            # the sum of the values and of their squares (each square an exact pair), over DOUBLE
            # as Spark computes these, and the weights of the non-finite values
            m = f"{spec.op_id}__m{i}"
            moments[x] = (f"{m}_s", f"{m}_s_lo", f"{m}_q", f"{m}_q_lo", f"{m}_pinf", f"{m}_ninf", f"{m}_nan")
            v = f"CAST({q(x)} AS DOUBLE)"
            sq, sq_err = two_product_sql(finite_sql(v), finite_sql(v))
            sums = pair_sum_sql(f"{finite_sql(v)} * {W}") + pair_sum_sql(f"{sq} * {W}", f"{sq_err} * {W}")
            exprs += [f"{e} AS {q(c)}" for e, c in zip(sums + nonfinite_counts_sql(v, W), moments[x])]
            value_cols += list(moments[x])
    comoments = {}
    for i, x in enumerate(linear_args):
        if x in comoment_args:
            # over the rows where both arguments are non-NULL (Spark skips the others): the sums
            # of x, y, x*x, y*y and x*y (each product an exact pair), then the weight of the
            # rows with a value that is not finite; n counts those rows
            c = f"{spec.op_id}__c{i}"
            comoments[x] = tuple(f"{c}_{p}{lo}" for p in ("x", "y", "xx", "yy", "xy") for lo in ("", "_lo")) \
                + (f"{c}_nonfinite",)
            both = _both_present(x)
            fx, fy = (finite_sql(f"{q(x)}.{f}") for f in ("x", "y"))
            vx, vy = (f"CASE WHEN {both} THEN {v} END" for v in (fx, fy))
            sums = pair_sum_sql(f"{vx} * {W}") + pair_sum_sql(f"{vy} * {W}")
            for a, b in ((vx, vx), (vy, vy), (vx, vy)):
                p, e = two_product_sql(a, b)
                sums += pair_sum_sql(f"{p} * {W}", f"{e} * {W}")
            bad = f"({both}) AND ({fx} IS NULL OR {fy} IS NULL)"
            sums += (f"CAST(SUM(CASE WHEN {bad} THEN {W} ELSE 0 END) AS BIGINT)",)
            exprs += [f"{e} AS {q(c)}" for e, c in zip(sums, comoments[x])]
            value_cols += list(comoments[x])
    return _Accumulators(count, s_col, n_col, exprs, value_cols, lo_col, nonfinite, moments, comoments)


def _centred_sql(nd: str, s2: str, s2_lo: str, a: str, a_lo: str, b: str, b_lo: str) -> str:
    """SQL: ``n * S2 - Sa * Sb`` (``nd`` the count as DOUBLE; ``S2``, ``Sa``, ``Sb`` compensated
    sums as hi/lo pairs), both products exact pairs (:func:`~consistent_stream.fsum.two_product_sql`)
    so their cancellation is exact (Sterbenz), the low parts' first-order terms added: ``n``
    times the centred second moment (``Sa = Sb``) or co-moment of a group."""
    p1, e1 = two_product_sql(nd, s2)
    p2, e2 = two_product_sql(a, b)
    cross = f"2 * {a} * {a_lo}" if (a, a_lo) == (b, b_lo) else f"{a} * {b_lo} + {b} * {a_lo}"
    return f"(({p1} - {p2}) + (({e1} + {nd} * {s2_lo}) - ({e2} + {cross})))"


def _moment_sql(func: str, n: str, m: list[str]) -> str:
    """VAR_SAMP, VAR_POP, STDDEV_SAMP or STDDEV_POP (``func``) of a group from its count of
    non-NULL values ``n`` and its moment accumulators ``m`` (sum and sum of squares as pairs,
    then the +Infinity, -Infinity and NaN counts): ``n * M2 = n * S2 - S1**2``, both products
    exact pairs (:func:`~consistent_stream.fsum.two_product_sql`), so the cancellation between
    them is exact (Sterbenz); the variance is ``n * M2 / (n * n)`` or ``/ (n * (n - 1))``.
    NULL for no values, and for one value in the sample forms (Spark's default); NaN when a
    value is not finite, as Spark's moment updates give."""
    s, s_lo, sq, sq_lo, pinf, ninf, nan = m
    nd = f"CAST({n} AS DOUBLE)"
    nm2 = f"GREATEST({_centred_sql(nd, sq, sq_lo, s, s_lo, s, s_lo)}, {ZERO})"
    sample = func.endswith("_samp")
    var = f"{nm2} / ({nd} * ({nd} - 1))" if sample else f"{nm2} / ({nd} * {nd})"
    value = f"SQRT({var})" if func.startswith("stddev") else var
    return (f"CASE WHEN {n} = 0{f' OR {n} = 1' if sample else ''} THEN CAST(NULL AS DOUBLE) "
            f"WHEN {pinf} <> 0 OR {ninf} <> 0 OR {nan} <> 0 THEN CAST('NaN' AS DOUBLE) ELSE {value} END")


def _comoment_sql(func: str, n: str, c: list[str]) -> str:
    """COVAR_POP, COVAR_SAMP or CORR (``func``) of a group from its count ``n`` of rows where
    both arguments are non-NULL and its co-moment accumulators ``c`` (the sums of x, y, x*x,
    y*y and x*y as pairs, then the count of rows with a value that is not finite):
    ``n * C = n * Sxy - Sx * Sy`` and ``n * Mx = n * Sxx - Sx**2`` (likewise for y), each
    product an exact pair (:func:`~consistent_stream.fsum.two_product_sql`) as in
    :func:`_moment_sql`; the covariance is ``n * C / (n * n)`` or ``/ (n * (n - 1))``, the
    correlation ``n * C / SQRT(n * Mx * n * My)``. As Spark's own (Spark's Covariance and Corr):
    NULL for no rows, and for one row in COVAR_SAMP and CORR; NaN when a value is not finite;
    CORR of a group where x or y does not vary divides by zero, which raises
    ``[DIVIDE_BY_ZERO]`` under ANSI mode (Spark's default) and is NULL without it, in the
    batch as in Spark's CORR."""
    sx, sx_lo, sy, sy_lo, sxx, sxx_lo, syy, syy_lo, sxy, sxy_lo, bad = c
    nd = f"CAST({n} AS DOUBLE)"
    nc = _centred_sql(nd, sxy, sxy_lo, sx, sx_lo, sy, sy_lo)
    if func == "corr":
        nmx = f"GREATEST({_centred_sql(nd, sxx, sxx_lo, sx, sx_lo, sx, sx_lo)}, {ZERO})"
        nmy = f"GREATEST({_centred_sql(nd, syy, syy_lo, sy, sy_lo, sy, sy_lo)}, {ZERO})"
        value = f"{nc} / SQRT({nmx} * {nmy})"
    else:
        value = f"{nc} / ({nd} * ({nd} - 1))" if func == "covar_samp" else f"{nc} / ({nd} * {nd})"
    few = f"{n} = 0" if func == "covar_pop" else f"{n} = 0 OR {n} = 1"
    return (f"CASE WHEN {few} THEN CAST(NULL AS DOUBLE) WHEN {bad} <> 0 THEN CAST('NaN' AS DOUBLE) "
            f"ELSE {value} END")


def aggregate_delta(spec: AggregateSpec, delta: Changelog, state: OperatorState, first: bool,
                    materialize: Callable[[str, StructType], Changelog]) -> str | None:
    """The aggregate's output changelog for one batch, as a SELECT; stages its arrangements.

    ``first``: no earlier version of the output exists (a global aggregate then has no
    previous row to retract). ``materialize(sql, schema)``: used for the input when several
    arrangements are computed from it (``schema``: the Spark types of the SELECT's result).
    """
    g = spec.group
    if delta.is_empty and not (first and not g):
        return None
    linear = [a for a in spec.aggs if a.func in LINEAR_AGGS]
    multiset_args = list(dict.fromkeys(spec.args[a.name] for a in spec.aggs if a.func in MULTISET_AGGS))
    acc = _accumulators(spec, linear)
    count, value_cols = acc.count, acc.value_cols
    gsel = f"{cols_sql(g)}, " if g else ""
    group_by = f" GROUP BY {cols_sql(g)}" if g else ""
    by_value = False   # the input is grouped by the group and the one multiset argument (below)
    if multiset_args and delta.arrow is None and delta.rows is None and not delta.local:
        if len(multiset_args) == 1 and not acc.pairs:
            # one pass for both arrangements: the accumulators per (group, value), which summed
            # again per group are the group's (every one is an exact SUM), and whose count is
            # the value's weight in the group's multiset
            by = cols_sql(g + multiset_args)
            grouped = f"SELECT {by}, {', '.join(acc.exprs)} FROM {delta.sql} GROUP BY {by}"
            types = delta.views.sql(grouped).schema   # (analysis only)
            delta, by_value = materialize(grouped, types), True
        else:
            schema = StructType([StructField(c, spec.arg_types[c], True) for c in delta.columns])
            delta = materialize(f"SELECT * FROM {delta.sql}", schema)  # read by acc and by each multiset

    # a group whose accumulators did not move (an update of a column the aggregate does not
    # read) is not touched: no state read, no output row for it
    moved = " OR ".join(f"COALESCE({q(c)} <> 0, FALSE)" for c in value_cols)
    if by_value:   # each sum of sums typed as the sums (the arrangement's types, whatever the path)
        sums = ", ".join(f"CAST(SUM({q(c)}) AS {types[c].dataType.simpleString()}) AS {q(c)}" for c in value_cols)
        partial_sql = f"SELECT * FROM (SELECT {gsel}{sums} FROM {delta.sql}{group_by}) WHERE {moved}"
    elif acc.pairs:   # per bucket of rows, then (stage's consolidation) per group: short lists to fold
        bucket = bucket_sql([q(c) for c in delta.columns])
        partial_sql = (f"SELECT {gsel}{', '.join(acc.exprs)} FROM (SELECT *, {bucket} AS `__fs_bucket` "
                       f"FROM {delta.sql}) GROUP BY {cols_sql(g + ['__fs_bucket'])}")
    else:
        partial_sql = f"SELECT * FROM (SELECT {gsel}{', '.join(acc.exprs)} FROM {delta.sql}{group_by}) WHERE {moved}"
    partial = state.stage("acc", partial_sql, g + value_cols, g, additive=tuple(value_cols),
                          live=f"{q(count)} <> 0", consolidated=not acc.pairs, compensated=acc.pairs)
    vals = {}
    for i, x in enumerate(multiset_args):
        if by_value:   # each (group, value) once already
            vals_sql = (f"SELECT {gsel}{q(x)}, {q(count)} AS {W} FROM {delta.sql} "
                        f"WHERE {q(x)} IS NOT NULL AND {q(count)} <> 0")
        else:
            vals_sql = consolidate_sql(f"(SELECT {gsel}{q(x)}, {W} FROM {delta.sql} WHERE {q(x)} IS NOT NULL)",
                                       g + [x])
        vals[x] = state.stage(f"vals{i}", vals_sql, g + [x, WEIGHT], g, consolidated=True)
    # the groups whose accumulators or value multisets moved
    touched = union_keys([partial.keys(g)] + [v.keys(g) for v in vals.values()]) if g else None

    def summed(rel: str) -> str:
        return _summed(g, acc, rel)

    def old_rows(role: str) -> str | None:
        lookup = state.old(role)
        if lookup.empty or first or (touched is not None and touched.empty):
            return None
        read = lookup.read(touched) if g else lookup.read(None)
        return None if read.is_empty else read.sql

    if g and not first and touched is not None and not touched.empty:
        # the value multisets are read at the same groups as the accumulators: at once
        for i in range(len(multiset_args)):
            lookup = state.old(f"vals{i}")
            if not lookup.empty:
                lookup.prefetch(touched)
    acc_old = old_rows("acc")
    all_cols = cols_sql(g + value_cols)
    if acc_old is None and g and partial.consolidated:
        # one row per group already (the staged change, consolidated by its groups; a
        # rebuild's accumulators as its GROUP BY gave them): nothing to sum again
        acc_new = f"(SELECT {all_cols} FROM {partial.sql})"
    else:
        acc_new = summed(partial.sql if acc_old is None else
                         f"(SELECT {all_cols} FROM {acc_old} UNION ALL SELECT {all_cols} FROM {partial.sql})")
    acc_before = summed(acc_old) if acc_old is not None else None
    ext_new, ext_old = _multiset_aggregates(spec, multiset_args, vals, old_rows)

    new_rows = _rows(spec, acc, acc_new, ext_new, 1)
    if first or (acc_before is None and g):
        return new_rows
    if acc_before is None:  # a global aggregate whose old state was empty: its row of SQL's empty values
        acc_before = summed(f"(SELECT * FROM {partial.sql} WHERE FALSE)")
    out_cols = g + [a.name for a in spec.aggs]
    both = f"(SELECT * FROM ({new_rows}) UNION ALL SELECT * FROM ({_rows(spec, acc, acc_before, ext_old, -1)}))"
    return consolidate_sql(both, out_cols)


def _summed(g: list[str], acc: _Accumulators, rel: str) -> str:
    """The accumulators of ``rel`` (rows of the ``acc`` arrangement, not consolidated) summed
    per group (a FROM item)."""
    sums = ", ".join(f"{acc.sum_sql(c)} AS {q(c)}" for c in acc.value_cols)
    return f"(SELECT {cols_sql(g) + ', ' if g else ''}{sums} FROM {rel}{f' GROUP BY {cols_sql(g)}' if g else ''})"


def output_from_accumulators(spec: AggregateSpec) -> bool:
    """Whether the aggregate's output rows are a function of its ``acc`` arrangement alone,
    group by group: it has group columns and no multiset aggregate (MIN, MAX, DISTINCT, ..
    read their ``vals`` arrangements too)."""
    return bool(spec.group) and all(a.func == "count_star" or a.func in LINEAR_AGGS for a in spec.aggs)


class OutputLookup:
    """The aggregate's output as of the previous batch, as a :class:`~.keyed.Lookup` over its
    ``acc`` arrangement (an aggregate of :func:`output_from_accumulators`): what a join whose
    side is that output, looked up by all of its group columns, reads instead of keeping an
    arrangement of the output itself (the output is a function of the accumulators, group by
    group, so the rows of one group are those of its accumulators).

    ``acc``: the ``acc`` arrangement's lookup; ``key_map``: each key column of the reader ->
    the group column it is; ``project``: the reader's rows from a FROM item of the output rows
    (a projection of plain columns above the aggregate; None: the output as it is).
    ``read(keys)``: the ``acc`` rows of those groups, summed per group, one output row of
    weight 1 per group whose count is positive, projected: the reader's columns and
    ``__weight``, consolidated."""

    def __init__(self, spec: AggregateSpec, acc: Lookup, key_map: dict[str, str], columns: list[str],
                 project: Callable[[str], str] | None = None):
        self.spec, self.acc, self.key_map, self.columns, self.project = spec, acc, key_map, columns, project

    @property
    def empty(self) -> bool:
        return self.acc.empty

    def group_keys(self, keys):
        """``keys`` (a :class:`~consistent_stream.changelog.KeySet` of the reader's key
        columns) as tuples of the group columns, in the ``acc`` arrangement's order."""
        return _reordered(keys, [self.key_map[c] for c in keys.columns], self.spec.group)

    def read(self, keys, null_safe: bool = True) -> Changelog:
        if keys is not None:
            keys = self.group_keys(keys)
        rows = self.acc.read(keys, null_safe=null_safe)
        if rows.is_empty:
            return rows
        linear = [a for a in self.spec.aggs if a.func in LINEAR_AGGS]
        acc = _accumulators(self.spec, linear)
        out = _rows(self.spec, acc, _summed(self.spec.group, acc, rows.sql), {}, 1)
        if self.project is not None:
            out = self.project(f"({out})")
        ch = Changelog.of_query(rows.views, out, self.columns)
        ch.consolidated = True
        return ch

    def prefetch(self, keys, null_safe: bool = True) -> None:
        return None   # (its read asks the accumulators for other keys: the groups')

    def read_range(self, ranges):
        raise NotImplementedError("an aggregate's output is looked up by its groups, not by range")

    def read_prefix(self, column, descending, nulls_first, need):
        raise NotImplementedError("an aggregate's output is looked up by its groups, not by prefix")


def _reordered(keys, names: list[str], order: list[str]):
    """``keys`` (a :class:`~consistent_stream.changelog.KeySet`) with its columns named
    ``names`` and put in the order of ``order`` (the same names)."""
    keys = keys.renamed(names)
    if names == list(order):
        return keys
    if keys.arrow is not None:
        return type(keys)(keys.views, list(order), keys.arrow.select(list(order)), None)
    return type(keys)(keys.views, list(order), None, f"(SELECT {cols_sql(list(order))} FROM {keys.sql})")


def _multiset_aggregates(spec: AggregateSpec, multiset_args: list[str], vals: dict[str, Changelog],
                         old_rows: Callable[[str], str | None]):
    """Per multiset argument, one query of all its aggregates (MIN and MAX of one column share
    a scan and a GROUP BY) over the live values: new (old + change) and old. Returns
    ``(new, old)``, each argument -> (SELECT of the group columns and the aggregates, the
    aggregates' names); an argument with no old values has no old entry."""
    g = spec.group
    gsel = f"{cols_sql(g)}, " if g else ""
    group_by = f" GROUP BY {cols_sql(g)}" if g else ""
    ext_new: dict[str, tuple[str, list[str]]] = {}
    ext_old: dict[str, tuple[str, list[str]]] = {}
    for i, x in enumerate(multiset_args):
        old = old_rows(f"vals{i}")
        vcols = cols_sql(g + [x, WEIGHT])
        mine = [a for a in spec.aggs if a.func in MULTISET_AGGS and spec.args[a.name] == x]
        # PERCENTILE_DISC takes no frequencies: each value repeated its count, every aggregate of
        # the argument then over rows of weight 1
        rows = any(a.func.startswith("percentile_disc") for a in mine)
        fns = ", ".join(f"{_multiset_sql(a, q(x), rows)} AS {q(a.name)}" for a in mine)
        srcs = ((old, ext_old), (vals[x].sql if old is None else
                                 f"(SELECT {vcols} FROM {old} UNION ALL SELECT {vcols} FROM {vals[x].sql})", ext_new))
        for src, out in srcs:
            if src is None:
                continue
            live = f"({consolidate_sql(src, g + [x])})"  # each live (group, value) once
            if rows:
                live = (f"(SELECT {gsel}{q(x)}, 1 AS {W} FROM {live} LATERAL VIEW "
                        f"EXPLODE(ARRAY_REPEAT(1, CAST({W} AS INT))) `__rep` AS `__one`)")
            out[x] = (f"(SELECT {gsel}{fns} FROM {live} WHERE {W} > 0{group_by})", [a.name for a in mine])
    return ext_new, ext_old


def _multiset_sql(a: AggCall, x: str, rows: bool = False) -> str:
    """Spark's aggregate ``a`` over the live values ``x`` of a group, each row a distinct value
    with its count ``__weight``: the function itself (MIN, MAX and the DISTINCT forms ignore
    the counts), PERCENTILE with the counts as its frequencies (exact, as over the rows),
    COLLECT_LIST with each value repeated its count (Spark gives no element order either),
    PERCENTILE_DISC over the rows again (each value repeated its count). ``rows``: the input
    is such rows, each of weight 1 (the DISTINCT forms then say DISTINCT)."""
    if a.func == "percentile":
        return f"PERCENTILE({x}, {a.param}, {W})"
    if a.func.startswith("percentile_disc"):   # over the rows (see _multiset_aggregates)
        return f"PERCENTILE_DISC({a.param}) WITHIN GROUP (ORDER BY {x}{' DESC' if a.func.endswith('desc') else ''})"
    if a.func == "collect_list":   # each value as often as it is in the group
        return f"ARRAY_COMPACT(FLATTEN(COLLECT_LIST(ARRAY_REPEAT({x}, CAST({W} AS INT)))))"  # no NULLs, typed so
    if a.func == "collect_set":
        return f"COLLECT_SET({x})"
    if rows and a.func.endswith("_distinct"):
        return f"{_MULTISET_FN[a.func]}(DISTINCT {x})"
    return f"{_MULTISET_FN[a.func]}({x})"


def _rows(spec: AggregateSpec, acc: _Accumulators, acc_rel: str, exts: dict[str, tuple[str, list[str]]],
          weight: int) -> str:
    """The output rows, with ``weight``, of the groups in ``acc_rel`` (summed accumulators)
    joined with the multiset aggregates ``exts`` (:func:`_multiset_aggregates`): one row per
    group whose count is positive, or the one row of a global aggregate."""
    g, count = spec.group, acc.count
    if not g:
        # a global aggregate always has its one row, even over an empty input
        frm = f"(SELECT 1 AS `__one`) base LEFT JOIN {acc_rel} acc ON TRUE"
        for i, (e, _) in enumerate(exts.values()):
            frm += f" LEFT JOIN {e} e{i} ON TRUE"
        where = ""
    else:
        frm = f"{acc_rel} acc"
        for i, (e, _) in enumerate(exts.values()):
            frm += f" LEFT JOIN {e} e{i} ON {key_condition('acc', g, f'e{i}', g, True)}"
        where = f" WHERE acc.{q(count)} > 0"
    ext_alias = {name: f"e{i}" for i, (_, names) in enumerate(exts.values()) for name in names}
    cols = [f"acc.{q(c)}" for c in g]
    for a in spec.aggs:
        if a.func == "count_star":
            cols.append(f"CAST(COALESCE(acc.{q(count)}, 0) AS BIGINT) AS {q(a.name)}")
        elif a.func == "count_distinct":
            v = f"{ext_alias[a.name]}.{q(a.name)}" if a.name in ext_alias else "NULL"
            cols.append(f"CAST(COALESCE({v}, 0) AS BIGINT) AS {q(a.name)}")
        elif a.func in ("collect_list", "collect_set"):   # no values: an empty array, as Spark's
            v = (f"COALESCE({ext_alias[a.name]}.{q(a.name)}, ARRAY())" if a.name in ext_alias
                 else f"CAST(ARRAY() AS {spec.out_types[a.name]})")
            cols.append(f"{v} AS {q(a.name)}")
        elif a.func in MULTISET_AGGS:
            v = (f"{ext_alias[a.name]}.{q(a.name)}" if a.name in ext_alias
                 else f"CAST(NULL AS {spec.out_types[a.name]})")
            cols.append(f"{v} AS {q(a.name)}")
        else:
            x = spec.args[a.name]
            n = f"COALESCE(acc.{q(acc.n_col[x])}, 0)"
            if a.func == "count":
                cols.append(f"CAST({n} AS BIGINT) AS {q(a.name)}")
            elif a.func in MOMENT_AGGS:
                m = [f"COALESCE(acc.{q(c)}, 0)" for c in acc.moments[x]]
                cols.append(f"{_moment_sql(a.func, n, m)} AS {q(a.name)}")
            elif a.func in COMOMENT_AGGS:
                c = [f"COALESCE(acc.{q(c)}, 0)" for c in acc.comoments[x]]
                cols.append(f"{_comoment_sql(a.func, n, c)} AS {q(a.name)}")
            elif a.func == "sum":
                cols.append(f"CASE WHEN {n} > 0 THEN {_sum_sql(acc.value_sql('acc', x), spec.arg_types[x])} END "
                            f"AS {q(a.name)}")
            else:
                avg = _avg_sql(acc.value_sql("acc", x), f"acc.{q(acc.n_col[x])}", spec.arg_types[x])
                cols.append(f"CASE WHEN {n} > 0 THEN {avg} END AS {q(a.name)}")
    return f"SELECT {', '.join(cols)}, CAST({weight} AS BIGINT) AS {W} FROM {frm}{where}"
