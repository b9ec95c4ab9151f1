"""Eager aggregation (consistent_stream.plan.eager): an aggregate that only sums and counts one
side of an inner join gets a partial aggregate of that side by its join key, and the plan stays
exact. The plans it applies to and those it must leave alone, then a change stream over real
Delta tables checked against batch evaluation (Spark and DuckDB, same types) at every commit,
with the rebuild and the batches on the driver and again on Spark."""
from __future__ import annotations

import dataclasses
import datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from consistent_stream.plan import compile_model
from consistent_stream.plan.logical import Aggregate, Join, walk
from consistent_stream.sources import SourceSpec
from scenario import Scenario

SOURCES = [SourceSpec(name="o", relation="src.o", location="/nonexistent/o", source_name="src", primary_key=("ok",)),
           SourceSpec(name="l", relation="src.l", location="/nonexistent/l", source_name="src",
                      primary_key=("ok", "ln"))]
SCHEMAS = {"src.o": ["ok", "ck", "day"], "src.l": ["ok", "ln", "price", "disc", "qty", "note"]}

SQL = """
select l.ok, o.ck, o.day,
       sum(l.price * (1 - l.disc)) as revenue,
       sum(l.price) / 7.0001 as seventh,
       sum(l.qty) as qty,
       count(l.note) as notes,
       count(*) as lines
from src.o as o
join src.l as l on l.ok = o.ok
group by l.ok, o.ck, o.day
"""


def _partials(sql: str) -> list[Aggregate]:
    """The aggregates of ``sql``'s plan that are a join's side (the pushed partial aggregates)."""
    root = compile_model(sql, SOURCES, SCHEMAS).root
    return [side for n in walk(root) if isinstance(n, Join) for side in (n.left, n.right)
            if isinstance(side, Aggregate)]


def test_the_summed_side_is_aggregated_by_its_join_key_below_the_join():
    root = compile_model(SQL, SOURCES, SCHEMAS).root
    (join,) = [n for n in walk(root) if isinstance(n, Join)]
    assert isinstance(join.right, Aggregate) and join.right.group_exprs == ["`l__ok`"], join.right
    assert [a.func for a in join.right.aggs] == ["sum", "sum", "sum", "count", "count_star"]
    upper = next(n for n in walk(root) if isinstance(n, Aggregate) and n.child is join)
    assert [(a.func, a.merge) for a in upper.aggs] == [("sum", True)] * 3 + [("sum", False)] * 2
    # count(*) only: either side would do; the one that is not unique on its key is taken
    (p,) = _partials("select o.ok, count(*) n from src.o o join src.l l on l.ok = o.ok group by o.ok")
    assert p.group_exprs == ["`l__ok`"]


@pytest.mark.parametrize("sql", [
    # the side is unique on its join key: nothing to sum
    "select l.ok, l.ln, sum(o.ck) s from src.l l join src.o o on o.ok = l.ok group by l.ok, l.ln",
    # a group column of the summed side that is not its join key
    "select l.ok, l.ln, o.ck, sum(l.price) s from src.o o join src.l l on l.ok = o.ok group by l.ok, l.ln, o.ck",
    # an aggregate that is not completed by a SUM of partials
    "select o.ck, avg(l.price) a from src.o o join src.l l on l.ok = o.ok group by o.ck",
    "select o.ck, count(distinct l.ln) a from src.o o join src.l l on l.ok = o.ok group by o.ck",
    "select o.ck, max(l.price) a, sum(l.qty) s from src.o o join src.l l on l.ok = o.ok group by o.ck",
    # arguments from both sides
    "select o.ck, sum(l.price * o.ck) s from src.o o join src.l l on l.ok = o.ok group by o.ck",
    # an outer join, a residual over the summed side, a computed key, a global aggregate
    "select o.ck, sum(l.price) s from src.o o left join src.l l on l.ok = o.ok group by o.ck",
    "select o.ck, sum(l.price) s from src.o o join src.l l on l.ok = o.ok and l.qty > o.ck group by o.ck",
    "select o.ck, sum(l.price) s from src.o o join src.l l on l.ok + 1 = o.ok group by o.ck",
    "select sum(l.price) s from src.o o join src.l l on l.ok = o.ok",
])
def test_plans_it_must_leave_alone(sql):
    assert _partials(sql) == []


def _orders(rows) -> pa.Table:
    return pa.table({"ok": pa.array([r[0] for r in rows], pa.int64()), "ck": pa.array([r[1] for r in rows], pa.int64()),
                     "day": pa.array([r[2] for r in rows], pa.date32())})


def _lines(rows) -> pa.Table:
    return pa.table({"ok": pa.array([r[0] for r in rows], pa.int64()), "ln": pa.array([r[1] for r in rows], pa.int32()),
                     "price": pa.array([None if r[2] is None else Decimal(r[2]) for r in rows], pa.decimal128(12, 2)),
                     "disc": pa.array([Decimal(r[3]) for r in rows], pa.decimal128(4, 2)),
                     "qty": pa.array([r[4] for r in rows], pa.float64()),
                     "note": pa.array([r[5] for r in rows], pa.string())})


D = datetime.date(2026, 1, 1)


@pytest.mark.parametrize("where", ["driver", "spark"])
def test_a_change_stream_through_the_partial_aggregate_equals_batch_evaluation(spark, tmp_path, where):
    orders = _orders([(1, 10, D), (2, 10, D), (3, 20, D), (4, 30, D)])
    lines = _lines([(1, 1, "10.05", "0.10", 1.5, "a"), (1, 2, "3.33", "0.00", 2.25, None),
                    (1, 3, "7.77", "0.05", 1e17, "c"), (2, 1, None, "0.00", 1.0, None),
                    (2, 2, None, "0.50", -1.0, None), (3, 1, "99999.99", "0.01", 0.1, "x"),
                    (5, 1, "1.00", "0.00", 3.0, "orphan"), (None, 1, "2.00", "0.00", 4.0, "no order")])
    sc = Scenario(spark, tmp_path, {"o": orders, "l": lines}, {"o": ["ok"], "l": ["ok", "ln"]})
    job = sc.job(SQL, ["ok"])
    if where == "spark":
        job = dataclasses.replace(job, driver_rebuild_rows=0, local_engine="spark")
    sc.run(job, full_refresh=True)
    # lines of an existing order, of a new order, of the orphan's order arriving
    sc.insert("l", _lines([(1, 4, "0.01", "0.00", 0.2, "d"), (4, 1, "5.50", "0.20", 2.0, None),
                           (6, 1, "8.00", "0.00", 1.0, "e")]))
    sc.insert("o", _orders([(5, 40, D), (6, 40, D + datetime.timedelta(days=1))]))
    sc.run(job)
    # the large value retracted, a NULL price becoming a value, a line leaving its order
    sc.delete("l", "ok = 1 and ln = 3")
    sc.update("l", {"price": "'4.40'"}, "ok = 2 and ln = 1")
    sc.update("l", {"ok": "3"}, "ok = 1 and ln = 2")
    sc.run(job)
    # an order moved to another customer (the other side of the join), an order deleted
    sc.update("o", {"ck": "50"}, "ok = 3")
    sc.delete("o", "ok = 4")
    sc.run(job)
    # every line of an order gone: its group with it
    sc.delete("l", "ok = 2")
    sc.run(job)
