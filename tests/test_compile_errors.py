"""Unsupported SQL fails at compile time, naming the construct and its line, and nothing is
written."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest

from consistent_stream.errors import CompileError, NoDeltaRule
from consistent_stream.plan import compile_model
from consistent_stream.plan.logical import explain, maintenance, walk
from consistent_stream.sources import SourceSpec

SOURCES = [SourceSpec(name="orders", relation="src.orders", location="/nonexistent/orders", source_name="src",
                      primary_key=("oid",)),
           SourceSpec(name="customers", relation="src.customers", location="/nonexistent/customers",
                      source_name="src", primary_key=("id",))]
SCHEMAS = {"src.orders": ["oid", "cid", "amount", "day"], "src.customers": ["id", "name"]}


def compile_sql(sql):
    return compile_model(sql, SOURCES, SCHEMAS)


@pytest.mark.parametrize("sql, construct, line", [
    ("select * from (select oid, row_number() over (partition by cid) as rn from src.orders) d where rn = 1",
     "ROW_NUMBER() without ORDER BY", 1),
    ("select oid,\n  lag(amount) over (partition by cid) as prev from src.orders", "LAG() without ORDER BY", 2),
    ("select oid, last_value(amount) over (partition by cid\n order by day) as l from src.orders",
     "LAST_VALUE() over a RANGE frame", 1),
    ("select oid from src.orders\nlimit 5", "LIMIT without ORDER BY", 2),
    ("select oid from src.orders union all select id, name from src.customers", "different numbers of columns", 1),
    ("select oid, rand() as r from src.orders", "rand()", 1),
    ("select oid from src.orders tablesample (10 percent)", "TABLESAMPLE", 1),
    ("select * from src.payments", "relation", 1),
    ("select oid, amount from src.orders group by oid", "amount", 1),
    ("select distinct cid from src.orders order by amount limit 3", "ORDER BY", 1),
    ("select sum(amount) s from src.orders group by cid limit 5", "LIMIT without ORDER BY", 1),
    ("select cid, grouping(cid) from src.orders group by cid", "grouping()", 1),
    ("select o.cid, c.id as cid\nfrom src.orders o join src.customers c on o.cid = c.id",
     "duplicate output column cid (o.cid and c.id)", 1),
    ("select cid, grouping(day) from src.orders group by rollup(cid)", "grouping(orders.day)", 1),
    ("select cid, grouping_id(day) from src.orders group by cid, day with cube", "grouping_id()", 1),
    ("select cid,\n first(amount) as f from src.orders group by cid", "aggregate FIRST", 2),
    ("select cid, any_value(amount) as f from src.orders group by cid", "aggregate ANY_VALUE", 1),
    ("select cid, percentile_approx(amount, 0.5) as p from src.orders group by cid", "aggregate PERCENTILE_APPROX", 1),
])
def test_sql_without_meaning_at_a_cut_names_the_construct_and_its_line(sql, construct, line):
    with pytest.raises(CompileError) as e:
        compile_sql(sql)
    assert construct.lower() in str(e.value).lower(), str(e.value)
    assert e.value.line == line, str(e.value)


NO_RULE = [
    ("select cid, count(distinct oid, day) from src.orders group by cid", "COUNT(DISTINCT", 1),
    ("select oid from src.orders o where o.amount > (select amount from src.customers c where c.id = o.cid)",
     "scalar subquery without an aggregate", 1),
    ("select oid from src.orders o where o.amount > (select max(id) from src.customers c where c.id < o.cid)",
     "correlated scalar subquery condition", 1),
    ("select oid from src.orders o\nwhere o.cid not in (select c.id from src.customers c where c.name = o.day)",
     "correlated NOT IN", 2),
    ("select oid from src.orders o where o.cid in (select c.id from src.customers c group by c.id having "
     "count(*) > o.oid) or o.oid > 3", "subquery here", 1),
    ("select cid,\n kurtosis(amount) from src.orders group by cid", "aggregate KURTOSIS", 2),
    ("select cid, explode(array(max(day))) as d from src.orders group by cid",
     "a generator in an aggregating query's select list", 1),
    ("select day, count(*) from src.orders\ngroup by day having exists (select 1 from src.customers c\n"
     "where c.id = day)", "subquery", 2),
]


@pytest.mark.parametrize("sql, construct, line", NO_RULE)
def test_a_construct_without_a_delta_rule_is_recomputed_and_refused_with_incremental_only(sql, construct, line):
    m = compile_sql(sql)
    modes = {maintenance(n)[0] for n in walk(m.root)}
    assert "recompute" in modes, explain(m.root, costs=True)
    with pytest.raises(NoDeltaRule) as e:
        compile_model(sql, SOURCES, SCHEMAS, incremental_only=True)
    assert construct.lower() in str(e.value).lower(), str(e.value)
    assert e.value.line == line, str(e.value)


@pytest.mark.parametrize("sql", [
    "select o.oid, c.name from src.orders o, src.customers c where o.cid = c.id and o.amount > 1",
    "with t as (select cid, sum(amount) s from src.orders group by cid) "
    "select c.id, t.s from src.customers c left join t on c.id = t.cid",
    "select c.id, o.oid from src.orders o right join src.customers c on o.cid = c.id and o.amount > 3",
    "select cid, count(*) n, avg(amount) a from src.orders where day is not null group by cid having count(*) > 1",
    "select upper(c.name) as n, coalesce(o.amount, 0) * 2 as a2 from src.customers c join src.orders o on c.id = o.cid",
    "select count(*) as n, sum(amount) as s, min(day) as d from src.orders",
    "select distinct cid from src.orders",
    "select oid as k from src.orders union all select id from src.customers union select 1 from src.orders",
    "select oid from src.orders intersect select id from src.customers",
    "select cid from src.orders except all select id from src.customers",
    "select cid, count(distinct day) d, sum(amount) filter (where day > 3) s from src.orders group by cid",
    "select o.oid, c.name from src.orders o full outer join src.customers c on o.cid = c.id and o.amount > 1",
    "select o.oid from src.orders o left join src.customers c on o.cid = c.id and o.amount > c.id",
    "select c.id, (select count(*) from src.orders o where o.cid = c.id) as n from src.customers c",
    "select oid from src.orders where amount > (select avg(amount) from src.orders)",
    "select * from src.customers c where exists (select 1 from src.orders o where o.cid = c.id and o.amount > 2)",
    "select * from src.customers c where c.id not in (select cid from src.orders)",
    "select * from src.customers c left anti join src.orders o on c.id = o.cid",
    "select oid, cid from (select *, row_number() over (partition by cid order by day desc, oid) as rn "
    "from src.orders) d where rn = 1",
    # windows, top-N, ORDER BY, the clock, cross and theta joins, subqueries in HAVING
    "select oid,\n  row_number() over (partition by cid order by day) as rn\nfrom src.orders",
    "select oid from src.orders\norder by oid",
    "select * from (select oid, cid,\n  row_number() over (partition by cid order by oid) as rn\n  from src.orders) d",
    "select oid, 1 as rn from src.orders union all\n"
    "select oid, row_number() over (partition by cid order by oid) as rn from src.orders",
    "select * from (select oid, rank() over (partition by cid order by amount desc) as r from src.orders) d "
    "where r <= 3",
    "select oid, sum(amount) over (partition by cid order by day rows between unbounded preceding and current row) "
    "run, avg(amount) over (partition by cid) a, lag(day, 2) over (partition by cid order by oid) p, "
    "dense_rank() over (order by amount) dr from src.orders",
    "select oid, cid from src.orders qualify row_number() over (partition by cid order by day desc) = 1",
    "select cid, sum(amount) s from src.orders group by cid order by s desc limit 3",
    "select oid from src.orders order by amount desc, oid limit 10 offset 5",
    "select oid from src.orders union select id from src.customers order by oid limit 2",
    "select cid, sum(amount) / (select sum(amount) from src.orders) share from src.orders group by cid",
    "select day, count(*) from src.orders group by day having count(*) > (select count(*) from src.customers c "
    "where c.id = day)",
    "select o.oid from src.orders o\ncross join src.customers c",
    "select o.oid from src.orders o join src.customers c on o.cid < c.id",
    "select oid from src.orders where day >= date_sub(current_date(), 30)",
    "select oid, datediff(current_date(), day) age from src.orders",
    "select cid from src.orders group by cid having max(day) > current_date() - interval 7 days",
    # grouping sets, moments, a LIMIT that keeps the one row
    "select cid, day, grouping_id() g, sum(amount) s from src.orders group by rollup(cid, day)\n"
    "order by g, s desc limit 5",
    "select cid, day, count(*) from src.orders group by cube(cid, day)",
    "select cid, day, grouping_id(cid, day) g from src.orders group by cid, day with rollup",
    "select cid, day, count(*) from src.orders group by grouping sets ((cid), (day), ())",
    "select cid, stddev(amount) s, var_pop(amount) v, std(oid) t from src.orders group by cid",
    "select cid, median(amount) m, percentile(oid, 0.25) p, percentile_cont(0.9) within group (order by amount) "
    "pc, count_if(amount > 3) c, bool_and(amount > 1) b, bool_or(oid > 2) o, every(oid > 1) e, some(oid > 1) s "
    "from src.orders group by cid",
    "select sum(amount) s from src.orders limit 5",
    "select oid, d from src.orders lateral view explode(array(day, amount)) t as d",
    "select oid, posexplode_outer(array(day, amount)) as (p, v) from src.orders",
    "select oid from src.orders o where o.cid in (select c.id from src.customers c) or o.oid > 3",
    "select oid from src.orders o where not exists (select 1 from src.customers c where c.id = o.cid) or o.oid > 3",
    "select oid from src.orders where day = (select distinct name from src.customers where id = 3)",
    "select cid, avg(amount) from src.orders group by cid having avg(amount) > (select avg(amount) from src.orders\n"
    "where cid = 4 group by cid)",
    "select * from (select count(*) n from src.orders) a, (select max(id) m from src.customers) b limit 1",
])
def test_supported_sql_compiles_and_every_operator_is_incremental(sql):
    m = compile_sql(sql)
    assert m.output_columns
    assert {maintenance(n)[0] for n in walk(m.root)} == {"incremental"}, explain(m.root, costs=True)


def test_a_model_refused_by_incremental_only_writes_nothing(spark, tmp_path):
    from deltalake import write_deltalake

    from consistent_stream.job import run_job
    from helpers import job_for
    src = tmp_path / "orders"
    write_deltalake(str(src), pa.table({"oid": [1], "cid": [1]}), configuration={"delta.enableChangeDataFeed": "true"})
    job = job_for("kurtosis_model", "select cid, kurtosis(oid) s from src.orders group by cid",
                  [{"source_name": "src", "name": "orders", "relation": "src.orders",
                    "meta": {"location": str(src), "primary_key": ["oid"]}}], "cid", tmp_path)
    job.incremental_only = True
    with pytest.raises(NoDeltaRule, match="aggregate KURTOSIS"):
        run_job(spark, job)
    assert not os.path.exists(job.target_path)
    assert not os.path.exists(job.checkpoint_location)
    assert not spark.catalog.tableExists("tests.kurtosis_model")


def test_a_scalar_subquery_of_several_rows_fails_the_batch_as_spark_does(spark, tmp_path):
    from deltalake import write_deltalake

    from consistent_stream.job import run_job
    from helpers import job_for
    paths = {}
    for name, data in (("orders", {"oid": [1, 2], "cid": [1, 2]}), ("customers", {"id": [1], "name": ["a"]})):
        paths[name] = str(tmp_path / name)
        write_deltalake(paths[name], pa.table(data), configuration={"delta.enableChangeDataFeed": "true"})
    sources = [{"source_name": "src", "name": n, "relation": f"src.{n}",
                "meta": {"location": paths[n], "primary_key": [k]}}
               for n, k in (("orders", "oid"), ("customers", "id"))]
    job = job_for("scalar_rows", "select oid from src.orders where cid = (select id from src.customers)",
                  sources, "oid", tmp_path)
    run_job(spark, job)
    assert sorted(r.oid for r in spark.read.format("delta").load(job.target_path).collect()) == [1]
    write_deltalake(paths["customers"], pa.table({"id": [2], "name": ["b"]}), mode="append")
    with pytest.raises(Exception, match="SCALAR_SUBQUERY_TOO_MANY_ROWS"):
        run_job(spark, job)
    assert sorted(r.oid for r in spark.read.format("delta").load(job.target_path).collect()) == [1]
    with pytest.raises(Exception, match="SCALAR_SUBQUERY_TOO_MANY_ROWS"):
        spark.sql(f"select oid from delta.`{paths['orders']}` where cid = "
                  f"(select id from delta.`{paths['customers']}`)").collect()
