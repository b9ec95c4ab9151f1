"""Property test of the SQL analytics models are written in: window functions, top-N, the
clock and the recompute floor, over random change streams (:mod:`change_streams`); after every
micro-batch the target equals batch evaluation of the model's SQL in Spark and in DuckDB (a
top-N's rows tied at its boundary compared by their ORDER BY values).

The streams update rows' ``k`` and ``g``, so rows move between partitions (a LAG/LEAD of the
partition they leave and of the one they join both change) and in and out of a top-N. The
temporal shapes run on a clock that moves between batches and once more after each batch with
no source change, across the bounds of their filters (``make test``: one seeded stream and
``CS_PROPERTY_EXAMPLES`` hypothesis streams per shape, as ``test_properties``).
"""
from __future__ import annotations

import datetime

import pytest

from change_streams import check_shape

UTC = datetime.timezone.utc

SHAPES = {
    # ranking, per partition and over the whole input
    "row_number_per_partition": "select id, k, x, row_number() over (partition by k order by x desc, id) as rn "
                                "from src.a",
    "ranks_with_ties": "select id, k, x, rank() over (partition by k order by x) as r, "
                       "dense_rank() over (partition by k order by x) as dr, "
                       "percent_rank() over (partition by k order by x) as pr, "
                       "cume_dist() over (partition by k order by x) as cd, "
                       "ntile(2) over (partition by k order by x, id) as nt from src.a",
    "global_window": "select id, x, sum(x) over () as total, rank() over (order by x desc nulls last) as r from src.a",
    # aggregates over frames: running, moving, whole partition; two partitionings
    "framed_aggregates": "select id, k, g, sum(x) over (partition by k order by seq, id rows between unbounded "
                         "preceding and current row) as running, "
                         "count(*) over (partition by k order by seq) as peers_so_far, "
                         "avg(x) over (partition by k order by seq, id rows between 1 preceding and 1 following) "
                         "as moving, min(x) over (partition by k) as lo, "
                         "max(amt) over (partition by g order by d range between unbounded preceding and current row) "
                         "as hi from src.a",
    # offsets, also across rows moving between partitions
    "offsets": "select id, k, lag(x) over (partition by k order by seq, id) as prev, "
               "lead(x, 2, -1) over (partition by k order by seq, id) as next2, "
               "first_value(x) over (partition by k order by seq, id) as first_x, "
               "last_value(x) ignore nulls over (partition by k order by seq, id rows between unbounded preceding "
               "and unbounded following) as last_x, "
               "nth_value(x, 2) over (partition by k order by seq, id rows between unbounded preceding "
               "and current row) as second_x from src.a",
    "window_over_aggregate": "select g, sum(x) as s, rank() over (order by sum(x) desc nulls last) as r, "
                             "sum(sum(x)) over () as total from src.a group by g",
    "bag_window": "select k, z, row_number() over (partition by k order by z) as rn, count(*) over (partition by k) "
                  "as n from src.c",
    # top-N: ORDER BY .. LIMIT, with ties at the boundary, an OFFSET, in a CTE, ranking filters
    "top_n_global": "select id, k, x from src.a order by x desc nulls last, id limit 3",
    "top_n_ties_at_the_boundary": "select k, x from src.a order by x limit 2",
    "top_n_offset": "select id, x from src.a order by x, id limit 2 offset 1",
    "top_n_in_a_cte_joined": "with top2 as (select id, k from src.a order by x desc nulls last, id limit 2) "
                             "select b.id, t.id as aid from src.b b join top2 t on b.k = t.k",
    "rank_filter_per_partition": "select k, x, r from (select k, x, rank() over (partition by k order by x desc) as r "
                                 "from src.a) t where r <= 2",
    "row_number_between": "select id, k from (select id, k, row_number() over (partition by k order by seq desc, id) "
                          "as rn from src.a) t where rn between 2 and 3",
    "qualify_dense_rank": "select id, g, x from src.a qualify dense_rank() over (partition by g order by x) = 1",
    # the recompute floor, and a theta join
    "recompute_floor": "select g, stddev_samp(x) as sd, median(x) as med, count(distinct k, x) as kx "
                       "from src.a group by g",
    "theta_join": "select a.id, b.id as bid from src.a a join src.b b on a.x < b.y",
}

TEMPORAL = {
    "temporal_filter_date": "select id, d from src.a where d >= date_sub(current_date(), 30)",
    "temporal_filter_between": "select id, ts from src.a where ts between current_timestamp() - interval 1 day "
                               "and current_timestamp()",
    "temporal_projection": "select id, datediff(current_date(), d) as age from src.a",
    "temporal_having": "select g, max(d) as last_d from src.a group by g "
                       "having max(d) > current_date() - interval 40 days",
    "temporal_recomputed": "select g, sum(case when d < current_date() then 1 else 0 end) as past, "
                           "median(x) as med from src.a group by g",
}
CLOCK = [datetime.datetime(2023, 12, 31, 12, tzinfo=UTC), datetime.datetime(2024, 1, 1, 0, tzinfo=UTC),
         datetime.datetime(2024, 1, 1, 12, tzinfo=UTC), datetime.datetime(2024, 1, 30, tzinfo=UTC),
         datetime.datetime(2024, 3, 1, 12, tzinfo=UTC), datetime.datetime(2024, 3, 1, 13, tzinfo=UTC),
         datetime.datetime(2024, 6, 30, 12, tzinfo=UTC), datetime.datetime(2024, 7, 1, 0, tzinfo=UTC)]
"""Instants across the bounds of the temporal shapes over the streams' dates (2024-01-01,
2024-02-29, 1999-12-31) and timestamps (2024-01-01 00:00, 2024-06-30 23:59:59.999999)."""


def local_engine(shape: str) -> str:
    """Every third shape evaluates its delta queries with Spark only."""
    return "spark" if sorted(SHAPES).index(shape) % 3 == 0 else "duckdb"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_windows_and_top_n_stay_equal_to_batch_evaluation(spark, shape, monkeypatch):
    check_shape(spark, shape, SHAPES[shape], monkeypatch, local_engine=local_engine(shape))


@pytest.mark.parametrize("shape", sorted(TEMPORAL))
def test_temporal_models_equal_batch_evaluation_at_each_batch_instant(spark, shape, monkeypatch):
    check_shape(spark, shape, TEMPORAL[shape], monkeypatch, clock=CLOCK)
