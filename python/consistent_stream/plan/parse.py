"""Pass 1: parse the model SQL (Spark dialect), reject what is not maintained incrementally,
check its relations and qualify its columns, before anything is planned.

:func:`parse` turns the text into one query AST and rejects unsupported constructs anywhere
in it (:func:`reject_unsupported`); :func:`resolve` checks that every relation is a source
or a CTE (:func:`check_relations`) and qualifies every column with its relation (sqlglot's
``qualify``), which is what lowering (:mod:`.lower`) expects. Every error is a CompileError
naming the construct and, when known, its line and column (:func:`position`).

Example::

    select oid from src.orders
    limit 10

raises ``CompileError: line 2, col 5: LIMIT without ORDER BY is not supported by
consistent_stream: which rows it keeps is up to the engine, ..``.
"""
from __future__ import annotations

import re
from collections.abc import Collection

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.qualify import qualify

from ..errors import CompileError, NoDeltaRule
from ..sources import SourceSpec

def _spark_writes_within_group() -> None:
    """Make sqlglot write ``percentile_cont/percentile_disc(p) WITHIN GROUP (ORDER BY x)`` back
    as Spark SQL as it was read. Its Spark writer (inherited from Spark 2's, which had no WITHIN
    GROUP) turns them into ``PERCENTILE_APPROX(x, p)``, another function with other results,
    and every place that writes a model's SQL back (batch evaluation, the recompute floor)
    would evaluate that instead. Spark 3.4+ reads WITHIN GROUP itself."""
    from sqlglot.generators.spark import SparkGenerator
    SparkGenerator.TRANSFORMS = {k: v for k, v in SparkGenerator.TRANSFORMS.items() if k is not exp.WithinGroup}


_spark_writes_within_group()

AGGREGATES: dict[type, str] = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Count: "count",
                               exp.Stddev: "stddev_samp", exp.StddevSamp: "stddev_samp",
                               exp.StddevPop: "stddev_pop", exp.Variance: "var_samp", exp.VariancePop: "var_pop",
                               exp.Quantile: "percentile", exp.ArrayAgg: "collect_list",
                               exp.ArrayUniqueAgg: "collect_set", exp.PercentileDisc: "percentile_disc",
                               exp.CovarPop: "covar_pop", exp.CovarSamp: "covar_samp", exp.Corr: "corr"}
"""The supported aggregate functions and their names in :class:`~.logical.AggCall`."""

# constructs with no meaning at a cut: rejected anywhere in the query
_NONDETERMINISTIC: list[tuple[type, str, str]] = [
    (exp.TableSample, "TABLESAMPLE", "a sample has no incremental meaning: every evaluation draws another"),
    (exp.Rand, "rand()", "non-deterministic functions have no meaning at a cut"),
    (exp.Uuid, "uuid()", "non-deterministic functions have no meaning at a cut"),
]
_NONDETERMINISTIC_NAMES = {"rand", "random", "randn", "uuid", "monotonically_increasing_id", "spark_partition_id",
                           "shuffle", "input_file_name", "rand_str", "randstr", "uniform", "try_aes_decrypt"}

def position(node: exp.Expression, sql: str) -> tuple[int | None, int | None]:
    """``(line, col)`` (1-based) of ``node`` in ``sql``: from the parser's positions of the
    node or its first descendant that has one (for a set operation, of its right-hand query,
    which its keyword precedes), else of the first occurrence of the construct's first
    keyword in the text; ``(None, None)`` when neither is found."""
    if isinstance(node, exp.SetOperation):  # the keyword stands before its right-hand query
        node = node.expression
    for n in [node, *node.walk()]:
        m = getattr(n, "meta", None) or {}
        if "line" in m:
            return m["line"], m.get("col")
        if isinstance(n, exp.Identifier) and n.meta.get("line"):
            return n.meta["line"], n.meta.get("col")
    # fall back to the first keyword of the construct in the text
    word = re.escape(node.sql(dialect="spark").split("(")[0].split()[0]) if node.sql() else None
    if word:
        m = re.search(word, sql, re.IGNORECASE)
        if m:
            line = sql.count("\n", 0, m.start()) + 1
            return line, m.start() - (sql.rfind("\n", 0, m.start()) + 1) + 1
    return None, None


def err(construct: str, detail: str, node: exp.Expression | None, sql: str) -> CompileError:
    """The CompileError for ``construct`` (with ``detail``: why, what to do instead) located
    at ``node`` in ``sql`` (see :func:`position`); unlocated when ``node`` is None."""
    line, col = position(node, sql) if node is not None else (None, None)
    return CompileError(construct, detail, line, col)


def no_rule(construct: str, detail: str, node: exp.Expression | None, sql: str) -> NoDeltaRule:
    """The NoDeltaRule for ``construct`` (see :func:`err`): maintained by recomputing the
    query holding it, or an error with ``incremental_only: true``."""
    line, col = position(node, sql) if node is not None else (None, None)
    return NoDeltaRule(construct, detail, line, col)


def parse(sql: str) -> exp.Expression:
    """The AST of the model ``sql``: exactly one query (a SELECT or a set operation of
    queries) in which :func:`reject_unsupported` found nothing.

    Raises CompileError for a syntax error (with the parser's line and column), for more or
    fewer than one statement, for a statement that is not a query, and for every construct
    :func:`reject_unsupported` rejects.
    """
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except ParseError as e:
        error = e.errors[0] if e.errors else {}
        raise CompileError("SQL syntax", error.get("description", str(e)), error.get("line"), error.get("col")) from e
    if len(statements) != 1:
        raise CompileError("multiple statements", "a model is exactly one SELECT")
    ast = statements[0].transform(_spark_aliases)
    reject_unsupported(ast, sql)
    if not isinstance(ast, (exp.Select, exp.SetOperation)):
        raise err(type(ast).__name__.upper(), "a model is one query (SELECT, or a UNION, INTERSECT "
                  "or EXCEPT of queries)", ast, sql)
    return ast


def _spark_aliases(n: exp.Expression) -> exp.Expression:
    """Aggregates that are others by Spark's definition, written as those: ``std(x)`` as
    ``stddev(x)``; ``count_if(c)`` as ``count(CASE WHEN c THEN 1 END)``; ``bool_and`` and
    ``every`` as ``min`` and ``bool_or``, ``some`` and ``any`` as ``max`` of the boolean (FALSE
    sorts before TRUE; NULLs are skipped and no rows give NULL in both); ``max_by(x, y)`` and
    ``min_by(x, y)`` as the field ``v`` of ``max``/``min`` of ``named_struct('o', y, 'v', x)``
    over the rows whose ``y`` is not NULL (Spark skips those too): where several rows share the
    extreme ``y``, Spark returns the ``x`` of whichever it met first (no defined order), and
    this the greatest (``max_by``) or least (``min_by``) of their ``x``, NULL least; ``median(x)`` and
    ``percentile_cont(p) WITHIN GROUP (ORDER BY x [DESC])`` as ``percentile(x, p)`` (``1 - p``
    descending), which is how Spark evaluates them."""
    name = n.name.lower() if isinstance(n, exp.Anonymous) else ""
    if name == "std" and len(n.expressions) == 1:
        return exp.Stddev(this=n.expressions[0])
    if isinstance(n, exp.CountIf):
        return exp.Count(this=exp.Case(ifs=[exp.If(this=n.this, true=exp.Literal.number(1))]))
    if isinstance(n, exp.LogicalAnd) or (name == "every" and len(n.expressions) == 1):
        return exp.Min(this=n.this if isinstance(n, exp.LogicalAnd) else n.expressions[0])
    if isinstance(n, exp.LogicalOr) or (name in ("some", "bool_or") and len(n.expressions) == 1):
        return exp.Max(this=n.this if isinstance(n, exp.LogicalOr) else n.expressions[0])
    if isinstance(n, exp.Any) and not isinstance(n.this, exp.Subquery) and not isinstance(
            n.parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like)):
        return exp.Max(this=n.this.unnest())
    if isinstance(n, (exp.ArgMax, exp.ArgMin)) and n.expression is not None and not n.args.get("count"):
        fn = "max" if isinstance(n, exp.ArgMax) else "min"
        by = f"({fn}(CASE WHEN ({n.expression.sql('spark')}) IS NOT NULL THEN named_struct('o', " \
             f"{n.expression.sql('spark')}, 'v', {n.this.sql('spark')}) END)).v"
        return sqlglot.parse_one(by, read="spark")
    if isinstance(n, exp.Median):
        return exp.Quantile(this=n.this, quantile=exp.Literal.number("0.5"))
    if isinstance(n, exp.WithinGroup) and isinstance(n.this, exp.PercentileCont) \
            and len(n.expression.expressions) == 1:
        order = n.expression.expressions[0]
        p = n.this.this
        if order.args.get("desc"):   # Spark's reverse order: the percentile at the double 1 - p
            p = exp.Literal.number(repr(1 - float(p.this))) if isinstance(p, exp.Literal) and not p.is_string \
                else exp.Sub(this=exp.Literal.number(1), expression=p)
        return exp.Quantile(this=order.this, quantile=p)
    return n


def reject_unsupported(ast: exp.Expression, sql: str) -> None:
    """Raise CompileError at the first node of ``ast`` (parsed from ``sql``) that has no
    meaning at a cut: a non-deterministic function or a TABLESAMPLE (every evaluation gives
    another answer, so no version could equal the SQL at its cut), an aggregate whose answer
    depends on the order of the rows (FIRST, LAST, ANY_VALUE, PERCENTILE_APPROX), and ``LIMIT`` without
    ``ORDER BY`` (which rows it keeps is up to the engine) unless it keeps every row. Constructs that are deterministic
    but have no delta rule are found per query block by :func:`.recompute.check_block`."""
    for node in ast.walk():
        for typ, name, hint in _NONDETERMINISTIC:
            if isinstance(node, typ):
                raise err(name, hint, node, sql)
        if isinstance(node, exp.Anonymous) and node.name.lower() in _NONDETERMINISTIC_NAMES:
            raise err(f"{node.name}()", "non-deterministic functions have no meaning at a cut", node, sql)
        if isinstance(node, _ORDER_DEPENDENT_AGGREGATES) and not _in_window(node):
            name = node.sql(dialect="spark").split("(")[0].upper()
            raise err(f"aggregate {name}", "its answer depends on the order Spark meets the rows in, not on the "
                      "rows, so no version could equal the SQL; use MIN/MAX, MAX_BY/MIN_BY (the value at the "
                      "greatest or least of another column) or an exact PERCENTILE", node, sql)
        if isinstance(node, exp.Distinct) and node.args.get("on"):
            raise err("DISTINCT ON", "not Spark SQL; use ROW_NUMBER() .. = 1 (dedup_before_join)", node, sql)
        if isinstance(node, exp.Limit) and isinstance(node.parent, (exp.Select, exp.SetOperation)) \
                and not node.parent.args.get("order") and not _keeps_every_row(node):
            raise err("LIMIT without ORDER BY", "which rows it keeps is up to the engine, so no version could "
                      "equal the SQL; add an ORDER BY that says which rows to keep", node, sql)


_ORDER_DEPENDENT_AGGREGATES = (exp.First, exp.Last, exp.AnyValue, exp.ApproxQuantile)
"""Aggregates whose batch answer is not a function of the rows of a group (FIRST, LAST and
ANY_VALUE take the row met first or last; PERCENTILE_APPROX's sketch depends on the order
values arrive and partitions merge). APPROX_COUNT_DISTINCT is a function of the set of values
(HyperLogLog++), so it is maintained (recomputed)."""


def _in_window(node: exp.Expression) -> bool:
    """Whether aggregate ``node`` is a window function (``first(x) [IGNORE NULLS] OVER (..)``)."""
    p = node.parent
    while isinstance(p, (exp.IgnoreNulls, exp.RespectNulls)):
        p = p.parent
    return isinstance(p, exp.Window)


def _keeps_every_row(limit: exp.Limit) -> bool:
    """Whether ``limit`` (without ORDER BY) is at least 1 over a query proven to return at
    most one row (:func:`_at_most_one_row`): then it keeps every row, whichever the engine
    picks (TPC-DS's ``select sum(..) .. limit 100``)."""
    n = limit.expression
    return isinstance(n, exp.Literal) and n.is_int and int(n.this) >= 1 and _at_most_one_row(limit.parent)


def _at_most_one_row(q: exp.Expression) -> bool:
    """Whether the query ``q`` returns at most one row by its form: a SELECT with aggregates
    and no GROUP BY (a global aggregate), or a SELECT without GROUP BY, aggregates or
    generators whose every relation in FROM is such a query (a cross join of one-row derived
    tables), WHERE and HAVING only removing rows."""
    if isinstance(q, exp.Subquery):
        q = q.this
    if not isinstance(q, exp.Select) or q.args.get("group") is not None:
        return False
    for e in q.expressions:
        for a in e.find_all(exp.AggFunc):
            if a.find_ancestor(exp.Window, exp.Subquery, exp.Select) is q:
                return True
    if any(e.find(exp.Explode, exp.Posexplode, exp.Window) for e in q.expressions):
        return False
    from_ = q.args.get("from") or q.args.get("from_")
    rels = ([from_.this] if from_ else []) + [j.this for j in q.args.get("joins") or []]
    return bool(rels) and all(isinstance(r, exp.Subquery) and _at_most_one_row(r.this) for r in rels)


def check_relations(ast: exp.Expression, relations: Collection[tuple[str, ...]], sql: str) -> None:
    """Raise CompileError at the first table of ``ast`` that is neither a CTE name nor one of
    ``relations`` (the sources' lower-case name parts, e.g. ``("src", "orders")``)."""
    ctes = {c.alias_or_name.lower() for c in ast.find_all(exp.CTE)}
    for t in ast.find_all(exp.Table):
        parts = tuple(p.name.lower() for p in t.parts)
        if len(parts) == 1 and parts[0] in ctes:
            continue
        if parts not in relations:
            raise err(f"relation {t.sql(dialect='spark')}",
                      "it is neither a dbt source nor a ref() of a model (a relation named in a model's "
                      "SQL by hand is not a changelog the engine knows: declare it as a dbt source and "
                      "read it through source(), or read a model through ref())", t, sql)


_SESSION_PREFIX = ("spark_catalog", "default")
"""What a relation named without its catalog (and schema) stands for: Spark's session catalog."""


def resolve(ast: exp.Expression, sources: dict[tuple[str, ...], SourceSpec], schemas: dict[str, list[str]],
            sql: str) -> exp.Expression:
    """``ast`` (from :func:`parse`) with every column qualified by its relation's alias
    (``select oid from src.orders`` -> ``SELECT orders.oid AS oid FROM src.orders AS orders``)
    and every select-list item named. ``sources``: the sources by their lower-case name parts;
    ``schemas[source.key]``: their columns.

    Raises CompileError for an unknown relation (:func:`check_relations`) or column.
    """
    schema: dict = {}
    depth = max((len(parts) for parts in sources), default=0)
    for parts, src in sources.items():
        # sqlglot's schema has one nesting level: a two-part name among three-part ones is the
        # session catalog's (``shop.t`` is ``spark_catalog.shop.t``), found by its suffix
        parts = _SESSION_PREFIX[:depth - len(parts)] + tuple(parts) \
            if len(parts) < depth else parts
        d = schema
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = {c: "string" for c in schemas[src.key]}
    check_relations(ast, sources, sql)
    try:
        return qualify(ast, schema=schema, dialect="spark", quote_identifiers=False,
                       validate_qualify_columns=True, identify=False)
    except OptimizeError as e:
        raise CompileError("column reference", f"{e} (check the column names against the sources)") from e
