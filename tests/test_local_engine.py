"""The local engine (DuckDB on the driver) gives exactly Spark's result or declines.

Eligible queries are run by both engines over the same Arrow tables and must agree row for
row, with exact decimals; ineligible constructs (where the two engines' semantics differ)
must be declined, so that Spark runs them. The end-to-end checks (every model batch equals
batch evaluation at its cut) run in the property test, whose shapes use both engines.
"""
from __future__ import annotations

import json
import random
from decimal import Decimal

import pyarrow as pa
import pytest

from consistent_stream.changelog import arrow_to_spark
from consistent_stream.exec.local import LocalEngine, NotLocal, Translations, translate

A = pa.table({
    "k": pa.array([1, 2, 2, None, 5, 7], pa.int64()),
    "g": pa.array(["x", "y", None, "x", "z", "y"], pa.string()),
    "p": pa.array([Decimal("1.25"), Decimal("-3.10"), None, Decimal("0.05"), Decimal("99999.99"),
                   Decimal("2.50")], pa.decimal128(15, 2)),
    "d": pa.array([Decimal("0.04"), Decimal("0.10"), Decimal("0.00"), None, Decimal("0.07"),
                   Decimal("0.03")], pa.decimal128(15, 2)),
    "i": pa.array([3, None, -4, 10, 0, 2], pa.int32()),
    "__weight": pa.array([1, -1, 2, 1, -1, 1], pa.int64()),
})
B = pa.table({
    "k": pa.array([2, 2, None, 5, 8], pa.int64()),
    "s": pa.array(["a", "b", "c", None, "e"], pa.string()),
    "dt": pa.array([18000, 18001, None, 18002, 18003], pa.date32()),
    "__weight": pa.array([1, 1, 1, -1, 1], pa.int64()),
})
F = pa.table({"k": pa.array([1], pa.int64()), "f": pa.array([1.5], pa.float64())})
_rng = random.Random(8)
D = pa.table({
    # sums and counts as an aggregate's accumulators hold them: AVG's exact rounding
    "s": pa.array([Decimal(_rng.randrange(-10**12, 10**12)).scaleb(-2) for _ in range(3000)], pa.decimal128(38, 2)),
    "n": pa.array([_rng.choice([1, 3, 6, 7, 11, 12, 13, 97, 1024, 999983]) for _ in range(3000)], pa.int64()),
    "q": pa.array([Decimal(_rng.randrange(1, 10**6)).scaleb(-4) for _ in range(3000)], pa.decimal128(15, 4)),
})
TABLES = {"va": A, "vb": B, "vf": F, "vd": D}

AGREE = {
    "join_group_decimal_product":
        "SELECT a.g, SUM(a.p * (1 - a.d) * (1 + a.d) * a.__weight) AS rev, "
        "CAST(SUM(a.__weight * b.__weight) AS BIGINT) AS w FROM va a JOIN vb b ON a.k = b.k GROUP BY a.g "
        "HAVING SUM(a.__weight) <> 0",
    "left_join_nulls_coalesce":
        "SELECT a.k, COALESCE(b.s, 'none') AS s, COALESCE(a.p, 0) AS p, CASE WHEN b.k IS NULL THEN -a.__weight "
        "ELSE a.__weight END AS __weight FROM va a LEFT JOIN vb b ON a.k = b.k",
    "null_safe_full_join":
        "SELECT a.k AS ak, b.k AS bk, a.i, b.dt FROM va a FULL OUTER JOIN vb b ON a.k <=> b.k",
    "union_all_consolidate":
        "SELECT k, CAST(SUM(__weight) AS BIGINT) AS __weight FROM (SELECT k, __weight FROM va UNION ALL "
        "SELECT k, -__weight FROM vb) GROUP BY k HAVING SUM(__weight) <> 0",
    "filters_in_between_dates":
        "SELECT k, g, i FROM va WHERE (g IN ('x', 'z') OR i BETWEEN -5 AND 2) AND NOT (k = 7) AND p IS NOT NULL",
    "date_literal_and_casts":
        "SELECT k, s, CAST(k AS DECIMAL(25, 2)) AS kd, CAST(i AS BIGINT) AS ib FROM vb LEFT JOIN va USING (k) "
        "WHERE dt >= DATE '2019-04-14' OR dt IS NULL",
    "min_max_count":
        "SELECT g, MIN(p) AS lo, MAX(d) AS hi, COUNT(*) AS n, COUNT(i) AS ni, SUM(i) AS si FROM va GROUP BY g",
    "greatest_least_skip_nulls":
        "SELECT k, GREATEST(i - COALESCE(k, 0), 0) AS gr, LEAST(p, d) AS le, GREATEST(p, d, 1) AS g3 FROM va",
    "row_number_null_ordering":
        "SELECT k, g, ROW_NUMBER() OVER (PARTITION BY g ORDER BY k DESC, i) AS r1, "
        "ROW_NUMBER() OVER (PARTITION BY k ORDER BY g ASC NULLS LAST, i DESC) AS r2 FROM va",
    "window_aggregates_over_frames":
        "SELECT k, g, i, SUM(i) OVER (PARTITION BY g ORDER BY k) AS running_peers, "
        "SUM(p) OVER (PARTITION BY g ORDER BY k, i ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS moving, "
        "COUNT(*) OVER (PARTITION BY g) AS n, MIN(d) OVER (PARTITION BY g ORDER BY k ROWS BETWEEN UNBOUNDED "
        "PRECEDING AND UNBOUNDED FOLLOWING) AS lo, MAX(i) OVER () AS hi FROM va",
    "ranks_and_offsets":
        "SELECT k, g, RANK() OVER (PARTITION BY g ORDER BY k) AS r, DENSE_RANK() OVER (ORDER BY g NULLS LAST) AS dr, "
        "NTILE(3) OVER (PARTITION BY g ORDER BY k, i, p) AS nt, LAG(i) OVER (PARTITION BY g ORDER BY k, i, p) AS lg, "
        "LEAD(p, 2, 0) OVER (PARTITION BY g ORDER BY k, i, p) AS ld FROM va",
    "decimal_literals_are_decimals":
        "SELECT k, 0.2 * p AS fifth, CASE WHEN i IS NULL THEN 0.2 * NULL ELSE p END AS c, 100.00 * p AS pct, "
        "p - 0.5 AS less FROM va",
    "decimal_literal_division":
        "SELECT CAST(s / 7.0 AS DECIMAL(30, 6)) AS per_week, q * 0.0001000000 AS tiny, s / 2.5 AS halves FROM vd",
    "like_and_date_arithmetic":
        "SELECT k, s LIKE 'x%' AS lx, s NOT LIKE '_z' AS nz FROM vb WHERE dt >= DATE '2019-04-14' - INTERVAL '90' DAY "
        "AND dt < DATE '2019-01-31' + INTERVAL '1' MONTH + INTERVAL '1' YEAR OR dt IS NULL",
    "substring_at_literal_positions":
        "SELECT k, SUBSTRING(s, 1, 1) AS first, SUBSTR(s, 2) AS rest, SUBSTRING(s, 1, 2) IN ('a', 'b') AS ab FROM vb",
    "extract_date_fields":
        "SELECT k, EXTRACT(YEAR FROM dt) AS y, EXTRACT(MONTH FROM dt) AS m, EXTRACT(DAY FROM dt) AS d, "
        "EXTRACT(QUARTER FROM dt) AS q FROM vb",
    "decimal_division_as_avg":
        "SELECT s, n, CAST(CAST(s AS DECIMAL(25, 2)) / CAST(n AS DECIMAL(20, 0)) AS DECIMAL(19, 6)) AS avg_like, "
        "s / n AS plain, s / q AS by_decimal, q / 7 AS by_literal, -q / (n * q) AS nested, "
        "(s / n) / (q / 3) AS division_of_divisions FROM vd",
    "decimal_scale_narrowing_rounds_half_up":
        "SELECT CAST(p AS DECIMAL(10, 1)) AS r1, CAST(-p AS DECIMAL(10, 0)) AS r2, CAST(q AS DECIMAL(12, 1)) AS r3, "
        "CAST(s AS DECIMAL(38, 0)) AS r4 FROM va, vd WHERE va.k = 5 OR va.k IS NULL",
    "decimal_division_guarded":
        "SELECT k, CASE WHEN d <> 0 THEN p / d END AS r, CASE WHEN i <> 0 THEN p / i END AS r2 FROM va",
    "empty_relation":
        "SELECT * FROM (SELECT CAST(NULL AS BIGINT) AS k, CAST(NULL AS DECIMAL(38, 2)) AS p WHERE FALSE) "
        "UNION ALL SELECT k, p FROM va",
}

DECLINE = {
    "integer_division": "SELECT k / i AS r FROM va",
    "floating_point_column": "SELECT f FROM vf",
    "decimal_to_int_cast": "SELECT CAST(p AS INT) AS r FROM va",
    "string_number_comparison": "SELECT k FROM va WHERE g = 1",
    "relation_not_on_driver": "SELECT k FROM some_table",
    "window_function_of_doubles": "SELECT k, AVG(i) OVER (PARTITION BY g ORDER BY k) AS r FROM va",
    "window_value_function": "SELECT k, FIRST_VALUE(i) OVER (PARTITION BY g ORDER BY k) AS r FROM va",
    "like_with_an_escape": "SELECT k FROM va WHERE g LIKE 'x\\\\%'",
    "like_of_a_number": "SELECT k FROM va WHERE k LIKE '1%'",
    "substring_from_the_end": "SELECT k, SUBSTRING(s, -2, 1) AS x FROM vb",
    "day_of_week": "SELECT k, EXTRACT(DAYOFWEEK FROM dt) AS w FROM vb",
    "interval_of_hours": "SELECT k FROM vb WHERE dt < DATE '2019-01-31' + INTERVAL '3' HOUR",
    "function": "SELECT upper(g) AS u FROM va",
    "spark_rounds_the_product": "SELECT CAST(p AS DECIMAL(38, 10)) * CAST(d AS DECIMAL(38, 10)) AS r FROM va",
    "distinct_aggregate": "SELECT COUNT(DISTINCT g) AS n FROM va",
    "date_arithmetic": "SELECT dt - dt AS days FROM vb",
    "case_branches_of_two_types": "SELECT CASE WHEN k > 1 THEN s ELSE k END AS v FROM vb",
}


@pytest.fixture(scope="module")
def views(spark):
    for name, t in TABLES.items():
        arrow_to_spark(spark, t).createOrReplaceTempView(name)
    yield
    for name in TABLES:
        spark.catalog.dropTempView(name)


def _rows(t: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


@pytest.mark.parametrize("name", sorted(AGREE))
def test_an_eligible_query_gives_exactly_sparks_rows(spark, views, name):
    sql = AGREE[name]
    df = spark.sql(sql)
    engine = LocalEngine()
    try:
        local = engine.run(sql, TABLES, df.schema)
    finally:
        engine.close()
    assert local is not None, f"{name} should run locally: {translate.__name__} declined it"
    assert local.schema.names == df.schema.fieldNames()
    expected = df.toArrow()
    assert [f.type for f in local.schema] == [f.type for f in expected.schema]
    assert _rows(local) == _rows(expected), name


@pytest.mark.parametrize("name", sorted(DECLINE))
def test_a_construct_whose_semantics_differ_is_left_to_spark(name):
    with pytest.raises(NotLocal):
        translate(DECLINE[name], TABLES)


def test_a_duckdb_error_falls_back_instead_of_returning_rows(spark, views):
    # BIGINT overflow: an error in DuckDB, so the engine declines and Spark decides
    sql = "SELECT k * 9223372036854775807 AS big FROM va"
    engine = LocalEngine()
    try:
        assert engine.run(sql, TABLES, spark.sql("SELECT CAST(1 AS BIGINT) AS big").schema) is None
    finally:
        engine.close()


def test_engines_share_one_database_but_not_their_views_nor_a_closed_engines_functions(spark, views):
    # A division registers a Python function in the shared database. Created through a
    # cursor, it would dangle once that engine closed, and the next engine's call would crash
    # the process; it must be the database's own, and a view registered by one engine must
    # stay invisible to another.
    import duckdb
    sql = AGREE["decimal_division_guarded"]
    df = spark.sql(sql)
    expected = _rows(df.toArrow())
    first = LocalEngine()
    assert _rows(first.run(sql, TABLES, df.schema)) == expected
    first.close()
    second, third = LocalEngine(), LocalEngine()
    try:
        assert second.db is third.db
        assert _rows(second.run(sql, TABLES, df.schema)) == expected
        second.con.register("only_second", A)
        with pytest.raises(duckdb.CatalogException):
            third.con.sql("SELECT * FROM only_second").fetchall()
    finally:
        second.close()
        third.close()
    assert LocalEngine(threads=1).db is not second.db   # SET threads is the database's


def test_a_batchs_queries_register_a_relation_once_and_read_the_table_its_name_has_now():
    # the engine keeps what it registered until it closes: the same table under the same name
    # is not registered again, another table under that name replaces it
    from pyspark.sql.types import LongType, StructField, StructType
    count = StructType([StructField("n", LongType())])
    engine = LocalEngine()
    real, registered = engine.con, []

    class Watched:
        def register(self, name, table):
            registered.append(name)
            return real.register(name, table)

        def __getattr__(self, attr):
            return getattr(real, attr)

    engine.con = Watched()
    try:
        sql = "SELECT COUNT(*) AS n FROM vb b JOIN va a ON a.k = b.k"
        assert engine.run(sql, TABLES, count).column("n").to_pylist() == [5]
        assert sorted(registered) == ["va", "vb"]
        assert engine.run("SELECT COUNT(*) AS n FROM vb", TABLES, count).column("n").to_pylist() == [5]
        assert sorted(registered) == ["va", "vb"]   # vb is the same table: not registered again
        fewer = {**TABLES, "vb": B.slice(0, 2)}
        assert engine.run("SELECT COUNT(*) AS n FROM vb", fewer, count).column("n").to_pylist() == [2]
        assert engine.run(sql, fewer, count).column("n").to_pylist() == [4]
        assert sorted(registered) == ["va", "vb", "vb"]
    finally:
        engine.close()
    import duckdb
    other = LocalEngine()
    try:
        with pytest.raises(duckdb.CatalogException, match="vb"):
            other.con.sql("SELECT * FROM vb").fetchall()
    finally:
        other.close()


def test_translations_are_kept_per_sql_and_column_types_and_read_back_from_their_file(tmp_path):
    sql = "SELECT p / d AS r FROM va"
    wider = {**TABLES, "va": A.set_column(A.schema.get_field_index("p"), "p", A["p"].cast(pa.decimal128(20, 4)))}
    path = str(tmp_path / "local_sql.json")
    first = Translations(path)
    assert translate(sql, TABLES, translations=first)[2] == {(15, 2, 15, 2)}
    assert translate(sql, wider, translations=first)[2] == {(20, 4, 15, 2)}   # other types: not reused
    assert translate(sql, TABLES, translations=first)[2] == {(15, 2, 15, 2)}
    assert first.made == 2
    first.save()
    again = Translations(path)   # a dbt run in a new process
    assert translate(sql, wider, translations=again) == translate(sql, wider)
    assert again.made == 0
    with open(path) as f:
        d = json.load(f)
    d["version"] = "made by other code"
    with open(path, "w") as f:
        json.dump(d, f)
    other = Translations(path)
    translate(sql, TABLES, translations=other)
    assert other.made == 1


def test_a_translation_types_its_own_parse_and_check_leaves_a_given_tree_as_it_was():
    """``Translations`` hands ``check`` its parsed tree to type in place (no copy): the same
    SQL over other column types, and a query that is not local, are parsed again each time."""
    from consistent_stream.exec.local import _parse, check
    sql = "SELECT p / d AS r, CAST(p AS DECIMAL(20, 4)) AS w FROM va"
    tree = _parse(sql)
    before = tree.sql("spark")
    check(tree, {"va": {"p": "DECIMAL(15, 2)", "d": "DECIMAL(15, 2)"}})
    assert tree.sql("spark") == before
    wider = {**TABLES, "va": A.set_column(A.schema.get_field_index("p"), "p", A["p"].cast(pa.decimal128(20, 4)))}
    t = Translations()
    assert translate(sql, TABLES, translations=t) == translate(sql, TABLES)
    assert translate(sql, wider, translations=t) == translate(sql, wider)
    assert translate(sql, TABLES, translations=t) == translate(sql, TABLES)
    assert t.made == 2
    not_local = "SELECT CAST(p AS INT) AS r FROM va"   # Spark truncates, DuckDB rounds: declined
    for _ in range(2):
        with pytest.raises(NotLocal):
            translate(not_local, TABLES, translations=t)
