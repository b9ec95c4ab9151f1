"""The local engine: a change-sized delta query whose every relation is on the driver runs
in-process on DuckDB instead of as a Spark job.

Why. A batch's delta rules are a few SQL queries over a few thousand rows. Spark runs each
as at least one job, and a job has a fixed cost of planning, scheduling and Arrow transfer
whatever it computes (a LocalRelation ``SELECT *`` alone pays it), which dwarfs a
change-sized query; DuckDB runs the same query in-process, without that cost. So when every
relation a query reads is an Arrow table on the driver (the batch's consolidated source
changes, driver-side state reads, earlier materializations), the query runs here.
Anything table-sized still runs on the executors: this path never sees a relation that is not
already on the driver.

Exactness. The result must be the one Spark would give, bit for bit, or the batch would not
equal the model's SQL at its cut. A query runs here only when every construct in it has the
same semantics in both engines; anything else falls back to Spark (the reason is logged at
debug level). The query is parsed as Spark SQL by sqlglot, its columns typed from the Arrow
schemas (``qualify`` + ``annotate_types``), and it must pass :func:`check`:

* relations: only the driver-side views it was given (no other table, no function table);
* column types: integers, DECIMAL, STRING, DATE, BOOLEAN (no floating point: the two engines
  may sum in different orders; no timestamps: time zones);
* operators: SELECT/JOIN (inner, outer, cross)/WHERE/GROUP BY/HAVING/UNION, column
  references, literals, ``+ - * /`` and unary minus, comparisons, ``<=>``, AND/OR/NOT, IS
  [NOT] NULL, IN (list), BETWEEN, LIKE with a string pattern without backslashes, a DATE
  literal plus or minus an interval of days, weeks, months or years (folded to the DATE Spark
  computes), EXTRACT of the year, quarter, month or day of a DATE, SUBSTRING of a string at
  positive literal positions, CASE, IF, COALESCE,
  GREATEST, LEAST (both skip NULLs in
  both engines), SUM, COUNT, MIN, MAX, the window functions ROW_NUMBER, RANK, DENSE_RANK,
  NTILE, LAG, LEAD and SUM, COUNT, MIN, MAX over a window, with its frame (sqlglot writes
  Spark's NULL ordering explicitly), CAST;
* decimal arithmetic that Spark computes without loss of precision (Spark's
  ``DecimalPrecision`` rules: a result wider than 38 digits only loses scale when its scale
  exceeds 6; such a query falls back); a decimal division runs as :class:`SparkDivision`,
  Spark's own rounding re-done in Python (DuckDB divides decimals as doubles); a division of
  two integers (a double in Spark) falls back;
* casts with one result in both engines: to the same type, widening integers, integers and
  DECIMALs to DECIMAL (a smaller scale rounds HALF_UP in both), NULL to anything, a
  'YYYY-MM-DD' literal to DATE (Spark truncates DECIMAL to INT where DuckDB rounds: such
  casts fall back);
* comparisons, and the branches of COALESCE/CASE/IF/GREATEST/LEAST, between operands of
  one family (numbers, strings, dates, booleans): no implicit casts between families, which
  the engines resolve differently; arithmetic on numbers only (Spark's ``date - date`` is an
  interval, DuckDB's a number of days).

Spark's ``CAST`` (which sqlglot reads as TRY_CAST, Spark 3's non-ANSI meaning) runs as a
strict ``CAST``: an error in DuckDB (an overflow, a failed cast) makes the query fall back to
Spark, which then raises or not as its own ANSI setting says. The result is cast to the
Spark schema the caller expects with Arrow's safe cast (an overflow or a lost digit falls
back too), so a value DuckDB computes is either exactly Spark's or not used.

Turned off per model with ``local_engine='spark'``, and for a session that sets
``spark.sql.decimalOperations.allowPrecisionLoss`` to false.
"""
from __future__ import annotations

import functools
import logging
import re

import pyarrow as pa
from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

LOCAL_ROWS = 2_000_000
"""Input rows (all relations of one query) up to which a query may run on the driver."""

ENGINES = ("duckdb", "spark")


def session_supported(spark) -> bool:
    """Whether the session computes decimals as the local engine reproduces them
    (``spark.sql.decimalOperations.allowPrecisionLoss``, default true). With it off, every
    delta query runs on Spark."""
    return str(spark.conf.get("spark.sql.decimalOperations.allowPrecisionLoss", "true")).lower() == "true"


class NotLocal(Exception):
    """The query has a construct whose semantics may differ between DuckDB and Spark."""


class TooLarge(Exception):
    """The query's result has more rows than the driver may hold (``max_out``): it is not
    kept there; the caller runs it on the executors."""


def _arrow_sql_type(t: pa.DataType) -> str | None:
    """The Spark SQL type of an Arrow column type the local engine accepts (None: not one)."""
    if pa.types.is_int8(t):
        return "TINYINT"
    if pa.types.is_int16(t):
        return "SMALLINT"
    if pa.types.is_int32(t):
        return "INT"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_decimal128(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "STRING"
    if pa.types.is_date32(t):
        return "DATE"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    return None


class LocalEngine:
    """Runs eligible change-sized queries on a cursor of the process's DuckDB database for
    ``threads`` threads (:mod:`..duck`; None: DuckDB's default, one per core; the autoscaler's
    parallelism otherwise). One engine per batch evaluator: a cursor is not shared between
    threads.

    A relation a query reads is registered on the cursor under its view name and stays
    registered until :meth:`close` (the batch's end): the batch's later queries that read the
    same Arrow table under that name do not register it again (a register and an unregister
    are a catalog change each, a share of a few-row query's run worth saving), and one that reads
    another table under it registers that one in its place. (The batch's views hold those
    tables until its end anyway.)"""

    def __init__(self, max_rows: int = LOCAL_ROWS, threads: int | None = None,
                 translations: "Translations | None" = None):
        from ..duck import database
        self.db = database(threads)
        self.con = self.db.cursor()
        self.max_rows = max_rows
        self.translations = translations if translations is not None else Translations()
        self._registered: dict[str, pa.Table] = {}

    def close(self) -> None:
        """Drop the cursor and, with it, the relations registered on it."""
        self._registered.clear()
        self.con.close()

    def run(self, sql: str, tables: dict[str, pa.Table], schema: StructType,
            max_out: int | None = None) -> pa.Table | None:
        """The rows of the Spark SELECT ``sql`` over the driver-side ``tables`` (view name ->
        Arrow table), as an Arrow table of ``schema`` (the Spark schema the caller expects;
        columns by position). None when the query is not eligible or DuckDB could not run it
        exactly: the caller then runs it on Spark.

        Raises TooLarge when the result has more than ``max_out`` rows. The query then runs
        under ``LIMIT max_out + 1``, so a result that blows up (a join on a key with many
        rows on both sides) stops there instead of filling the driver's memory; inputs are
        bounded by ``max_rows``."""
        import duckdb

        from ..changelog import Views
        from ..duck import arrow
        stable = {Views.stable(n): t for n, t in tables.items()}
        if len(stable) == len(tables):   # the cursor is this engine's: any names will do
            sql, tables = Views.stable(sql), stable
        try:
            duck_sql, used, divisions = translate(sql, tables, self.max_rows, self.translations)
        except NotLocal as e:
            log.debug("query runs on Spark: %s", e)
            return None
        from ..delta.deltars import arrow_schema
        target = arrow_schema(schema)
        try:
            for sig in divisions:
                self.db.function(SparkDivision.name(sig), lambda con, sig=sig: SparkDivision.register(con, sig))
            for name in used:
                if self._registered.get(name) is not tables[name]:
                    self._registered.pop(name, None)   # (a failed register leaves nothing known)
                    self.con.register(name, tables[name])
                    self._registered[name] = tables[name]
            if max_out is not None:
                duck_sql = f"SELECT * FROM ({duck_sql}) LIMIT {max_out + 1}"
            out = arrow(self.con, duck_sql)
            if max_out is not None and out.num_rows > max_out:
                raise TooLarge(f"more than {max_out} result rows")
            if out.num_columns != len(target) or [c.lower() for c in out.column_names] != \
                    [f.name.lower() for f in target]:
                raise NotLocal(f"columns {out.column_names} are not {target.names}")
            out = out.rename_columns(target.names).cast(target, safe=True)
        except (duckdb.Error, pa.ArrowException, NotLocal) as e:
            log.debug("query runs on Spark: DuckDB could not run it exactly: %s", e)
            return None
        return out


def translate(sql: str, tables: dict[str, pa.Table], max_rows: int = LOCAL_ROWS,
              translations: "Translations | None" = None) -> tuple[str, list[str], set]:
    """The DuckDB form of the Spark SELECT ``sql``, the views it reads and the decimal
    divisions it calls (:class:`SparkDivision` signatures). Raises NotLocal
    when a relation is not in ``tables``, the inputs exceed ``max_rows`` rows, or a construct
    is outside what :func:`check` accepts.

    The translation depends only on ``sql`` and the column types of the views it reads; it
    is looked up in ``translations`` and made only when missing there (see
    :class:`Translations`)."""
    translations = translations if translations is not None else Translations()
    used = translations.relations(sql)
    missing = [n for n in used if n not in tables]
    if missing:
        raise NotLocal(f"relations not on the driver: {missing}")
    if sum(tables[n].num_rows for n in used) > max_rows:
        raise NotLocal(f"more than {max_rows} input rows")
    schema = []
    for n in used:
        cols = []
        for f in tables[n].schema:
            t = _arrow_sql_type(f.type)
            if t is None:
                raise NotLocal(f"column {f.name} of {n} has type {f.type}")
            cols.append([f.name, t])
        schema.append([n, cols])
    duck_sql, divisions = translations.translated(sql, schema)
    return duck_sql, list(used), divisions


def _parse(sql: str):
    """The Spark SELECT ``sql`` parsed by sqlglot; NotLocal when it cannot be."""
    import sqlglot
    try:
        return sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.SqlglotError as e:
        raise NotLocal(f"sqlglot cannot parse it: {e}") from None


def _relations(tree) -> list[str]:
    """The views the parsed query ``tree`` reads (its tables other than its CTEs), sorted."""
    from sqlglot import exp
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    used = sorted({t.name for t in tree.find_all(exp.Table)} - ctes)
    if not used and tree.find(exp.Table):
        raise NotLocal("relations not on the driver: only CTEs")
    return used


def _translated(tree, schema: list) -> tuple[str, list]:
    """The DuckDB SQL of the parsed query ``tree`` over views of ``schema`` ([[view,
    [[column, Spark SQL type], ..]], ..]) and its divisions' signatures; NotLocal as
    :func:`check` raises it. ``tree`` is typed in place (``check(copy=False)``): the caller
    gives it up."""
    from sqlglot import exp
    typed, divisions = check(tree, {n: dict(cols) for n, cols in schema}, copy=False)
    for node in list(typed.find_all(exp.TryCast)):
        node.replace(exp.Cast(this=node.this, to=node.args["to"]))
    return typed.sql(dialect="duckdb", copy=False), sorted(divisions)   # (typed: this call's own)


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """What a translation was made by: this module's source, sqlglot's and DuckDB's
    versions. A translation made by other code is not used."""
    import hashlib

    import duckdb
    import sqlglot
    with open(__file__, "rb") as f:
        code = hashlib.sha256(f.read()).hexdigest()[:16]
    return f"{code}/sqlglot {sqlglot.__version__}/duckdb {duckdb.__version__}"


class Translations:
    """The local engine's translations of one model's delta queries: Spark SQL (with the
    batch taken out of its view names, ``Views.stable``) -> the views it reads; (SQL, the
    views' column types) -> DuckDB SQL and divisions. Kept for the query's life and, with
    ``path``, in a JSON file beside the model's plan (``JobSpec.local_sql_path``), so a
    ``dbt run`` in a new process does not translate again.

    Why. Parsing and typing a delta query with sqlglot costs more than DuckDB's evaluation of
    it (done every batch, it was most of a small batch's evaluation), and every batch of a
    plan runs the same few delta queries.

    Exactness: a translation is a function of the SQL and the column types only (the row
    count bound is checked on every call), and the file is used only when it was made by
    the same code (:func:`_code_version`); an unreadable file is ignored. A query that is
    not eligible is not cached: it raises NotLocal again on every call."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._relations: dict[str, list[str]] = {}
        self._translated: dict[str, list] = {}
        self._trees: dict = {}   # SQL -> sqlglot tree, parsed once by this object (not kept in the file)
        self._dirty = False
        self.made = 0   # translations made (not found) by this object
        if path:
            from ..storage import read_json
            d = read_json(path)
            try:
                if d is not None and d.get("version") == _code_version():
                    self._relations, self._translated = dict(d["relations"]), dict(d["translated"])
            except (OSError, ValueError, KeyError, TypeError):
                pass

    def _tree(self, sql: str):
        tree = self._trees.get(sql)
        if tree is None:
            tree = self._trees[sql] = _parse(sql)
        return tree

    def relations(self, sql: str) -> list[str]:
        used = self._relations.get(sql)
        if used is None:
            used = self._relations[sql] = _relations(self._tree(sql))
            self._dirty = True
        return used

    def translated(self, sql: str, schema: list) -> tuple[str, set]:
        import json
        key = json.dumps([sql, schema])
        hit = self._translated.get(key)
        if hit is None:
            tree = self._tree(sql)
            self._trees.pop(sql, None)   # typed in place below: parsed again if ever needed
            hit = self._translated[key] = list(_translated(tree, schema))
            self._dirty = True
            self.made += 1
        duck_sql, divisions = hit
        return duck_sql, {tuple(d) for d in divisions}

    def save(self) -> None:
        """Write the file when translations were made since it was read (atomically,
        :func:`~consistent_stream.storage.replace_text`; a failure is logged, the next run
        translates again)."""
        if not self.path or not self._dirty:
            return
        import json
        from ..storage import replace_text
        try:
            replace_text(self.path, json.dumps({"version": _code_version(), "relations": self._relations,
                                                "translated": self._translated}))
            self._dirty = False
        except OSError as e:
            log.warning("could not keep the local engine's translations in %s: %s", self.path, e)


class SparkDivision:
    """Spark's DECIMAL division ``a / b`` (``Divide`` with ``allowPrecisionLoss``, the default),
    as a DuckDB scalar function of a DECIMAL(p1, s1) and a DECIMAL(p2, s2) (operands of other
    numeric types are cast as Spark casts them first). DuckDB's own ``/`` divides decimals as
    doubles, so the local engine calls this instead.

    Result type: scale ``max(6, s1 + p2 + 1)``, precision ``p1 - s1 + s2 + scale``, bounded
    to 38 digits keeping at least min(scale, 6) of scale (``DecimalType.adjustPrecisionScale``).
    Value: the quotient rounded to 38 significant digits, HALF_UP
    (``BigDecimal.divide(_, MathContext(38, HALF_UP))`` in ``Decimal./``), then to the result
    scale, HALF_UP (``toPrecision``). A zero divisor or a result that does not fit raises, so
    the query falls back to Spark, which returns NULL or raises as its ANSI setting says."""

    @staticmethod
    def result_type(p1: int, s1: int, p2: int, s2: int) -> tuple[int, int]:
        scale = max(6, s1 + p2 + 1)
        return _adjust_precision_scale(p1 - s1 + s2 + scale, scale)

    @staticmethod
    def name(sig: tuple[int, int, int, int]) -> str:
        return "__cs_spark_div_" + "_".join(map(str, sig))

    @staticmethod
    def register(con, sig: tuple[int, int, int, int]) -> None:
        """Create the function of signature ``(p1, s1, p2, s2)`` on DuckDB connection ``con``."""
        import decimal

        import duckdb
        p, s = SparkDivision.result_type(*sig)
        ctx = decimal.Context(prec=38, rounding=decimal.ROUND_HALF_UP)
        exact = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)
        quantum = decimal.Decimal(1).scaleb(-s)
        limit = decimal.Decimal(10) ** (p - s)

        def divide(a, b):
            if b == 0:
                raise ZeroDivisionError("decimal division by zero")
            r = ctx.divide(a, b).quantize(quantum, context=exact)
            if abs(r) >= limit:
                raise OverflowError(f"{a} / {b} does not fit DECIMAL({p}, {s})")
            return r
        con.create_function(SparkDivision.name(sig), divide,
                            [duckdb.decimal_type(sig[0], sig[1]), duckdb.decimal_type(sig[2], sig[3])],
                            duckdb.decimal_type(p, s))


# ---- the check ---------------------------------------------------------------------------------
_DATE_LITERAL = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _allowed():
    from sqlglot import exp
    return (exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Union, exp.Subquery,
            exp.Table, exp.TableAlias, exp.Alias, exp.Column, exp.Identifier, exp.Star, exp.Paren,
            exp.Distinct, exp.DataType, exp.DataTypeParam, exp.Literal, exp.Null, exp.Boolean,
            exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
            exp.NullSafeEQ, exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between, exp.Case, exp.If,
            exp.Coalesce, exp.Greatest, exp.Least, exp.Cast, exp.TryCast, exp.Sum, exp.Count, exp.Min, exp.Max,
            exp.Window, exp.WindowSpec) + _window_functions() + (exp.Order, exp.Ordered)


def _window_functions():
    """The window functions both engines compute alike (given the same total order of a
    partition's rows, which every window of a plan has or needs none)."""
    from sqlglot import exp
    return (exp.RowNumber, exp.Rank, exp.DenseRank, exp.Ntile, exp.Lag, exp.Lead)


def check(tree, schema: dict[str, dict[str, str]], copy: bool = True):
    """Raise NotLocal unless every construct of the parsed Spark query ``tree`` has the same
    result in DuckDB (the rules of the module docstring). ``schema``: view -> column -> Spark
    SQL type. Returns the query qualified and typed, each decimal division replaced by a
    call of its :class:`SparkDivision`, and the set of those divisions' signatures.
    ``copy``: type a copy of ``tree`` (False: ``tree`` itself, which the caller then gives
    up, and no copy is made: copying a tree costs as much as a large part of its check)."""
    from sqlglot import exp
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify
    allowed = _allowed()
    tree = _folded_date_arithmetic(tree.copy() if copy else tree)   # typed below in place
    for node in tree.walk():
        if isinstance(node, exp.Like) and _plain_pattern(node):
            continue
        if isinstance(node, exp.Extract) and node.name.upper() in _EXTRACT_UNITS or (
                isinstance(node, exp.Var) and isinstance(node.parent, exp.Extract)):
            continue
        if isinstance(node, exp.Substring) and _positive_literal(node.args.get("start")) and (
                node.args.get("length") is None or _positive_literal(node.args["length"], zero=True)):
            continue
        if not isinstance(node, allowed):
            raise NotLocal(f"{type(node).__name__} ({node.sql('spark')[:80]})")
        if isinstance(node, exp.Join) and (node.args.get("kind") or "").upper() in ("SEMI", "ANTI"):
            raise NotLocal("semi/anti join")
        if isinstance(node, (exp.Sum, exp.Count, exp.Min, exp.Max)) and node.find(exp.Distinct):
            raise NotLocal("DISTINCT aggregate")
        if isinstance(node, exp.Window) and not isinstance(node.this, _window_functions() + (exp.Sum, exp.Count,
                                                                                         exp.Min, exp.Max)):
            raise NotLocal(f"window function {node.this.sql('spark')[:40]}")
    try:
        typed = qualify(tree, schema=schema, dialect="spark", validate_qualify_columns=True,
                        quote_identifiers=False)
        typed = annotate_types(_typed_decimal_literals(typed), schema=schema, dialect="spark")
        _mark_derived_columns(typed)
    except Exception as e:  # sqlglot raises several error types for a query it cannot resolve
        raise NotLocal(f"sqlglot cannot type it: {e}") from None
    for node in typed.walk():
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Sum, exp.Coalesce, exp.Case, exp.If,
                             exp.Greatest, exp.Least)):
            _dec(node)
            if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
                # date arithmetic differs (Spark: date - date is an interval, DuckDB: days)
                _numbers(node, [node.this, node.expression])
            elif isinstance(node, exp.Neg):
                _numbers(node, [node.this])
            else:
                _same_family(node, _branches(node))
        elif isinstance(node, (exp.Cast, exp.TryCast)):
            _check_cast(node)
        elif isinstance(node, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ)):
            _same_family(node, [node.this, node.expression])
        elif isinstance(node, exp.In):
            _same_family(node, [node.this, *node.expressions])
        elif isinstance(node, exp.Like):
            _same_family(node, [node.this, node.expression])
        elif isinstance(node, exp.Substring) and _family(node.this) != "string":
            raise NotLocal(f"SUBSTRING of a {_family(node.this)}: {node.sql('spark')[:80]}")
        elif isinstance(node, exp.Extract) and _family(node.expression) != "date":
            raise NotLocal(f"EXTRACT from a {_family(node.expression)}: {node.sql('spark')[:80]}")
        elif isinstance(node, exp.Between):
            _same_family(node, [node.this, node.args["low"], node.args["high"]])
    divs = list(typed.find_all(exp.Div))  # outer divisions before the ones inside them
    sigs = []
    for node in divs:
        a, b = node.this, node.expression
        _numbers(node, [a, b])
        da, db = _dec(a), _dec(b)
        if da is None or db is None or (_type(a).this.name in _INT_DIGITS and _type(b).this.name in _INT_DIGITS):
            raise NotLocal(f"division that Spark computes in floating point: {node.sql('spark')[:80]}")
        sigs.append((*da, *db))
    for node, sig in reversed(list(zip(divs, sigs))):  # innermost first: each outer one wraps them
        node.replace(exp.Anonymous(this=SparkDivision.name(sig), expressions=[
            exp.Cast(this=node.this, to=exp.DataType.build(f"DECIMAL({sig[0]}, {sig[1]})")),
            exp.Cast(this=node.expression, to=exp.DataType.build(f"DECIMAL({sig[2]}, {sig[3]})"))]))
    return typed, set(sigs)


_EXTRACT_UNITS = ("YEAR", "QUARTER", "MONTH", "DAY")
"""Fields of a DATE both engines extract alike (not the day of the week: Sunday is 1 in
Spark, 0 in DuckDB)."""
_INTERVAL_UNITS = {"DAY": "days", "DAYS": "days", "WEEK": "weeks", "WEEKS": "weeks", "MONTH": "months",
                   "MONTHS": "months", "YEAR": "years", "YEARS": "years"}


def _folded_date_arithmetic(tree):
    """``tree`` with each ``DATE 'yyyy-mm-dd' ± INTERVAL 'n' <DAY|WEEK|MONTH|YEAR>`` replaced by
    the DATE Spark computes (a month or year added as Spark's ``add_months``: a day past the
    new month's end is its last day), where DuckDB would compute a TIMESTAMP. Other interval
    arithmetic is left alone (and runs on Spark). ``tree`` is changed in place (the caller's
    copy)."""
    import datetime

    from sqlglot import exp

    def date_literal(n):
        return (isinstance(n, exp.Cast) and n.args["to"].this == exp.DataType.Type.DATE
                and isinstance(n.this, exp.Literal) and n.this.is_string and _DATE_LITERAL.match(n.this.this))

    def fn(node):
        if not isinstance(node, (exp.Add, exp.Sub)) or not date_literal(node.this):
            return node
        iv = node.expression
        unit = iv.args.get("unit").name.upper() if isinstance(iv, exp.Interval) and iv.args.get("unit") else None
        amount = iv.this.this if isinstance(iv, exp.Interval) and isinstance(iv.this, exp.Literal) else None
        if unit not in _INTERVAL_UNITS or amount is None or not str(amount).lstrip("-").isdigit():
            return node
        n = int(amount) * (-1 if isinstance(node, exp.Sub) else 1)
        d = datetime.date.fromisoformat(node.this.this.this)
        kind = _INTERVAL_UNITS[unit]
        if kind in ("days", "weeks"):
            d = d + datetime.timedelta(**{kind: n})
        else:
            months = d.year * 12 + d.month - 1 + (n * 12 if kind == "years" else n)
            y, m = divmod(months, 12)
            last = (datetime.date(y + (m + 1) // 12, (m + 1) % 12 + 1, 1) - datetime.timedelta(days=1)).day
            d = datetime.date(y, m + 1, min(d.day, last))
        return exp.cast(exp.Literal.string(d.isoformat()), "date")
    # innermost first: DATE 'x' + INTERVAL .. + INTERVAL .. (a query with nothing to fold, most
    # of them, is only walked: neither copied nor compared)
    while any(fn(node) is not node for node in tree.walk()):
        tree = tree.transform(fn, copy=False)
    return tree


def _positive_literal(node, zero: bool = False) -> bool:
    """Whether ``node`` is an integer literal above 0 (``zero``: or 0): a SUBSTRING position
    both engines read alike (Spark reads 0 as 1 and counts negative ones from the end)."""
    from sqlglot import exp
    return isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and (zero or int(node.this) > 0)


def _plain_pattern(node) -> bool:
    """Whether a LIKE compares with a string literal without backslashes (Spark's escape
    character; DuckDB has none by default): then both engines match alike."""
    from sqlglot import exp
    pattern = node.expression
    return isinstance(pattern, exp.Literal) and pattern.is_string and "\\" not in pattern.this \
        and not node.args.get("escape")


def _mark_derived_columns(tree) -> None:
    """Mark each column that reads a derived table's output with the expression computing it
    (``meta["cs_source"]``): its decimal type is that expression's (:func:`_dec`), which
    sqlglot's typing leaves without precision and scale after a division."""
    from sqlglot import exp
    outputs = {}
    for sub in tree.find_all(exp.Subquery):
        inner = sub.this
        if sub.alias and isinstance(inner, exp.Select):
            for e in inner.expressions:
                outputs[(sub.alias.lower(), e.alias_or_name.lower())] = e.unalias() if isinstance(e, exp.Alias) else e
    for col in tree.find_all(exp.Column):
        src = outputs.get((col.table.lower(), col.name.lower()))
        if src is not None:
            col.meta["cs_source"] = src


def _typed_decimal_literals(tree):
    """``tree`` with each numeric literal that has a decimal point and no exponent cast to the
    DECIMAL Spark reads it as (``0.2`` DECIMAL(1, 1), ``100.00`` DECIMAL(5, 2)): sqlglot types
    it DOUBLE, which would make every expression over it look like floating point. The cast
    changes no value in either engine (DuckDB reads the literal as a DECIMAL too); the
    operations' types are Spark's by :func:`_dec`."""
    from sqlglot import exp

    def fn(node):
        if not isinstance(node, exp.Literal) or node.is_string or isinstance(node.parent, exp.Cast):
            return node
        digits = node.this.lstrip("-")
        if "." not in digits or "e" in digits.lower():
            return node
        whole, _, frac = digits.partition(".")
        p = max(1, len(whole.lstrip("0")) + len(frac), len(frac))
        return exp.Cast(this=node.copy(), to=exp.DataType.build(f"DECIMAL({p}, {len(frac)})"))
    return tree.transform(fn, copy=False)   # (``tree``: check's own)


def _type(node):
    from sqlglot import exp
    t = node.type
    if t is None or t.this == exp.DataType.Type.UNKNOWN:
        raise NotLocal(f"the type of {node.sql('spark')[:80]} is unknown")
    return t


_INT_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INT": 10, "BIGINT": 20}


def _family(node) -> str:
    from sqlglot import exp
    if isinstance(node, exp.Null):
        return "null"
    t = _type(node)
    name = t.this.name
    if name in _INT_DIGITS or name == "DECIMAL":
        return "number"
    if name in ("VARCHAR", "TEXT", "CHAR"):
        return "string"
    if name in ("DATE", "BOOLEAN", "NULL"):
        return name.lower()
    raise NotLocal(f"type {t.sql('spark')} of {node.sql('spark')[:80]}")


def _numbers(node, operands) -> None:
    fams = {_family(o) for o in operands} - {"null", "number"}
    if fams:
        raise NotLocal(f"arithmetic on {sorted(fams)} in {node.sql('spark')[:80]}")


def _branches(node) -> list:
    """The value operands of COALESCE, GREATEST, LEAST, CASE, IF (not their conditions)."""
    from sqlglot import exp
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Case):
        return [i.args["true"] for i in node.args.get("ifs", [])] + \
            ([node.args["default"]] if node.args.get("default") is not None else [])
    if isinstance(node, exp.If):
        return [node.args["true"]] + ([node.args["false"]] if node.args.get("false") is not None else [])
    return [node.this, *getattr(node, "expressions", [])]


def _same_family(node, operands) -> None:
    fams = {_family(o) for o in operands} - {"null"}
    if len(fams) > 1:
        raise NotLocal(f"implicit cast between {sorted(fams)} in {node.sql('spark')[:80]}")


def _dec_of_type(t, node) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type as Spark widens it for decimal arithmetic
    (``DecimalType.forType``); None for non-numeric types."""
    name = t.this.name
    if name in _INT_DIGITS:
        from sqlglot import exp
        if isinstance(node, exp.Literal):
            return max(1, len(node.this.lstrip("-"))), 0
        return _INT_DIGITS[name], 0
    if name == "DECIMAL":
        params = [int(p.this.this) for p in t.expressions]
        if len(params) != 2:
            raise NotLocal(f"decimal without precision and scale: {node.sql('spark')[:80]}")
        return params[0], params[1]
    return None


def _adjust_precision_scale(p: int, s: int) -> tuple[int, int]:
    """Spark's ``DecimalType.adjustPrecisionScale`` (allowPrecisionLoss): a result of more
    than 38 digits keeps at least min(scale, 6) digits of scale."""
    if p <= 38:
        return p, s
    return 38, max(38 - (p - s), min(s, 6))


def _bounded(p: int, s: int, node) -> tuple[int, int]:
    """:func:`_adjust_precision_scale`, raising NotLocal where Spark would round."""
    p2, s2 = _adjust_precision_scale(p, s)
    if s2 < s:
        raise NotLocal(f"Spark rounds {node.sql('spark')[:80]} to scale {s2}")
    return p2, s2


def _dec(node) -> tuple[int, int] | None:
    """Spark's decimal (precision, scale) of a numeric ``node`` (None: not numeric or not
    decimal arithmetic), checking that Spark loses no digit computing it."""
    from sqlglot import exp
    if isinstance(node, exp.Paren):
        return _dec(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal) and not node.is_string:
        digits = node.this.lstrip("-")
        if "e" in digits.lower():
            raise NotLocal(f"floating literal {node.this}")
        whole, _, frac = digits.partition(".")
        return max(1, len(whole.lstrip("0")) + len(frac)), len(frac)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        a, b = _dec(node.this), _dec(node.expression)
        if a is None or b is None:
            return _dec_of_type(_type(node), node) if _family(node) == "number" else None
        (p1, s1), (p2, s2) = a, b
        if isinstance(node, exp.Mul):
            return _bounded(p1 + p2 + 1, s1 + s2, node)
        s = max(s1, s2)
        return _bounded(max(p1 - s1, p2 - s2) + s + 1, s, node)
    if isinstance(node, exp.Div):
        a, b = _dec(node.this), _dec(node.expression)
        return None if a is None or b is None else SparkDivision.result_type(*a, *b)
    if isinstance(node, exp.Neg):
        return _dec(node.this)
    if isinstance(node, exp.Sum):
        d = _dec(node.this)
        return None if d is None else (min(38, d[0] + 10), d[1])
    if isinstance(node, exp.Column) and "cs_source" in node.meta and _type(node).this.name == "DECIMAL" \
            and not _type(node).expressions:
        return _dec(node.meta["cs_source"])   # a derived table's output: its expression's type
    if isinstance(node, (exp.Coalesce, exp.Case, exp.If, exp.Greatest, exp.Least)):
        decs = [d for d in (_dec(b) for b in _branches(node)) if d is not None]
        if not decs:
            return None
        s = max(d[1] for d in decs)
        p = max(d[0] - d[1] for d in decs) + s
        if p > 38:
            raise NotLocal(f"Spark bounds the decimal type of {node.sql('spark')[:80]}")
        return p, s
    return _dec_of_type(_type(node), node)


def _check_cast(node) -> None:
    from sqlglot import exp
    src, to = node.this, node.args["to"]
    if isinstance(src, exp.Null):
        return
    if to.this.name == "DATE" and isinstance(src, exp.Literal) and src.is_string:
        if _DATE_LITERAL.match(src.this):
            return
        raise NotLocal(f"date literal {src.this!r}")
    if isinstance(src, exp.Literal) and not src.is_string and "e" not in src.this.lower() and to.this.name == "DECIMAL":
        return   # a number literal to a DECIMAL: exact, or rounded HALF_UP to a smaller scale in both
    t_name = to.this.name
    if isinstance(src, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Paren)) and t_name == "DECIMAL" \
            and _dec(src) is not None:
        return   # decimal arithmetic (Spark's type, :func:`_dec`) to a DECIMAL: as below
    st = _type(src)
    if st == to or st.sql("spark") == to.sql("spark"):   # (equal trees first: generating SQL costs more)
        return
    s_name = st.this.name
    if s_name in _INT_DIGITS and t_name in _INT_DIGITS and _INT_DIGITS[t_name] >= _INT_DIGITS[s_name]:
        return
    d_src = _dec(src) if s_name in _INT_DIGITS or s_name == "DECIMAL" else None
    if d_src is not None and t_name == "DECIMAL":
        # exact, or rounded HALF_UP (away from zero) to a smaller scale in both engines, or
        # an overflow (an error in DuckDB: the query falls back)
        return
    if d_src is not None and t_name in _INT_DIGITS and d_src[1] == 0:
        return      # an integral value: exact, or an overflow error
    raise NotLocal(f"cast {st.sql('spark')} -> {to.sql('spark')}: {node.sql('spark')[:80]}")
