"""Property test of what decision-support queries (TPC-DS) use beyond the basics: grouping
sets, the moment aggregates, percentiles (PERCENTILE_CONT and PERCENTILE_DISC), the boolean
aggregates, max_by/min_by, collect_list/collect_set, generators (LATERAL VIEW [OUTER], explode
in the select list), NATURAL JOIN and USING, range joins (BETWEEN, a comparison in WHERE,
against a one-row aggregate), a cross join, comma joins in an order Spark reorders, scalar
subqueries that are not aggregates, EXISTS and IN nested in a condition, correlated
subqueries whose correlation sits in every branch of an OR, over random change streams
(:mod:`change_streams`): after every micro-batch the target equals batch evaluation of the
model's SQL in Spark and in DuckDB.

The streams update rows' ``k`` and ``g`` (NULL often), so rows move between the groups of every
grouping set at once, and a key that is NULL in the data meets the NULL a grouping set puts in
its place (told apart by ``grouping()``). The moments run over an integer, a DECIMAL and a
DOUBLE column, with groups of zero, one and several values.

Over an empty input a grouping set ``()`` has no row in Spark (no group exists) where DuckDB
and PostgreSQL give a grand total: the shapes whose stream can empty the table say ``HAVING
count(*) > 0``, which both engines answer alike.
"""
from __future__ import annotations

import pytest

from change_streams import check_shape

SHAPES = {
    "rollup_with_grouping": "select k, g, grouping(k) as gk, grouping_id() as gid, grouping_id(k, g) as gkg, "
                            "count(*) as n, sum(x) as s, avg(amt) as a from src.a group by rollup(k, g) "
                            "having count(*) > 0",
    "cube": "select k, g, count(x) as n, max(x) as hi from src.a group by cube(k, g) having count(*) > 0",
    "grouping_sets_and_a_plain_key": "select g, k, d, sum(x) as s from src.a group by g, grouping sets ((k), (d), ())",
    "grouping_sets_repeated": "select k, g, sum(x) as s from src.a group by grouping sets ((k), (k), (g), ()) "
                              "having count(*) > 0",
    "rollup_ranked_in_its_level": "select k, g, sum(x) as s, grouping(k) + grouping(g) as lvl, "
                                  "rank() over (partition by grouping(k) + grouping(g), "
                                  "case when grouping(g) = 0 then k end order by sum(x) desc nulls last) as r "
                                  "from src.a group by rollup(k, g) having count(*) > 0",
    "rollup_top_n": "select k, g, count(*) as n from src.a group by rollup(k, g) having count(*) > 0 "
                    "order by n desc, k nulls first, g nulls first limit 3",
    "moments": "select g, stddev_samp(x) as sd, stddev_pop(x) as sdp, var_samp(amt) as va, var_pop(r) as vr, "
               "variance(x) as v, stddev(r) as sr, stddev(x) filter (where k > 0) as sdk from src.a group by g",
    "scalar_subquery_of_at_most_one_row": "select id, x from src.a where k = (select distinct b.k from src.b b "
                                          "where b.id = 1) or x > (select y from src.b where id = 2)",
    "exists_under_or": "select a.id, a.x from src.a a where a.x > 2 or exists (select 1 from src.b b "
                       "where b.k = a.k and b.y > 1) or not exists (select * from src.c c where c.k = a.x)",
    "in_under_or_and_not": "select a.id from src.a a where a.g = 'p' or not (a.x in (select b.y from src.b b))",
    "correlation_in_every_branch": "select a.id, (select count(*) from src.b b where (b.k = a.k and b.y > 1) "
                                   "or (b.k = a.k and b.y is null)) as n from src.a a",
    "percentiles_and_boolean_aggregates": "select g, median(x) as med, "
                                          "percentile_cont(0.25) within group (order by seq) as p25, "
                                          "percentile_cont(0.9) within group (order by x desc) as p90, "
                                          "count_if(x > 1) as c, bool_and(x > 0) as ba, bool_or(k = 1) as bo "
                                          "from src.a group by g having count(x) > 0",
    "percentile_disc": "select g, percentile_disc(0.25) within group (order by x) as p25, "
                       "percentile_disc(0.5) within group (order by amt desc) as p50, "
                       "percentile_disc(1.0) within group (order by seq) filter (where k > 0) as pk, "
                       "min(x) as lo, count(distinct x) as dx from src.a group by g having count(x) > 0",
    "lateral_view_outer": "select a.id, t.v, a.g from src.a a lateral view outer explode(case when a.x > 0 "
                          "then sequence(1, a.x) end) t as v where t.v is null or t.v <> 2",
    "select_list_posexplode_grouped": "select p, count(*) as n, sum(v) as s from (select a.id, "
                                      "posexplode(array(a.k, a.x, a.seq)) as (p, v) from src.a a) t group by p",
    "collected_values": "select g, array_join(array_sort(collect_list(x)), ',') as xs, "
                        "array_join(array_sort(collect_set(x)), ',') as xset, size(array_agg(x)) as n "
                        "from src.a group by g having count(x) > 0",
    "natural_and_using_joins": "select id, k, y, z from src.b natural join (select k, z from src.c) c "
                               "where exists (select 1 from src.a a left join src.c using (k) where a.id = b.y)",
    "max_by_min_by": "select g, max_by(x, id) as last_x, min_by(amt, id * 2) as first_amt, "
                      "max_by(d, case when k > 0 then id end) as d_of_max from src.a group by g",
    "range_join_between": "select a.id, b.id as bid, a.x, b.y from src.a a join src.b b on a.x between b.k and b.y",
    "band_join_in_where_and_one_row_cross_join": "select a.id, b.id as bid, s.m from src.a a, src.b b, "
                                                 "(select max(y) as m from src.b) s where a.seq < b.y + 1 "
                                                 "and a.x >= s.m and a.g = 'p'",
    "cross_join": "select a.id, c.z, a.x from src.a a cross join src.c c where a.k = 1",
    "reordered_comma_joins": "select a.id, c.z, b.y from src.a a, src.c c, src.b b where a.k = b.k and b.y = c.k",
    "comoments": "select g, covar_pop(x, seq) as cp, covar_samp(amt, r) as cs, "
                 "corr(x + id / 1000.0, seq - id / 7.0) as c, covar_pop(r, x) filter (where k > 0) as cpk "
                 "from src.a group by g having count(*) > 0",
    "global_comoments": "select corr(seq + id / 100.0, id) as c, covar_samp(x, r) as cs, count(*) as n from src.a",
    "global_moments_limit": "select stddev(x) as sd, var_pop(amt) as v, count(*) as n from src.a limit 5",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_decision_support_constructs_stay_equal_to_batch_evaluation(spark, shape, monkeypatch):
    check_shape(spark, shape, SHAPES[shape], monkeypatch,
                local_engine="spark" if sorted(SHAPES).index(shape) % 3 == 0 else "duckdb")
