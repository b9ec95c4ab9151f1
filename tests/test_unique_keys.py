"""Unique keys inferred through the plan decide the target's merge key; views without one
are bags."""
from __future__ import annotations

import pytest

from consistent_stream.plan import compile_model
from consistent_stream.sources import SourceSpec

SOURCES = [SourceSpec(name="orders", relation="src.orders", location="/x/orders", source_name="src",
                      primary_key=("oid",)),
           SourceSpec(name="customers", relation="src.customers", location="/x/customers", source_name="src",
                      primary_key=("id",)),
           SourceSpec(name="events", relation="src.events", location="/x/events", source_name="src")]
SCHEMAS = {"src.orders": ["oid", "cid", "amount"], "src.customers": ["id", "name"],
           "src.events": ["eid", "oid", "seq"]}


@pytest.mark.parametrize("sql, key", [
    ("select oid, amount from src.orders where amount > 1", ["oid"]),
    ("select amount, oid as order_id from src.orders", ["order_id"]),
    ("select amount from src.orders", None),
    ("select cid, count(*) as n from src.orders group by cid", ["cid"]),
    ("select count(*) as n, sum(amount) as s from src.orders", ["n", "s"]),
    ("select distinct cid, amount from src.orders", ["cid", "amount"]),
    # the customer side's join key is its primary key: one customer per order
    ("select o.oid, c.name from src.orders o join src.customers c on o.cid = c.id", ["oid"]),
    ("select o.oid, c.name from src.orders o left join src.customers c on o.cid = c.id", ["oid"]),
    ("select o.oid, c.id from src.customers c left join src.orders o on o.cid = c.id", ["oid", "id"]),
    ("select c.id from src.customers c where exists (select 1 from src.orders o where o.cid = c.id)", ["id"]),
    ("select oid, seq from (select e.*, row_number() over (partition by e.oid order by e.seq desc) as rn "
     "from src.events e) d where rn = 1", ["oid"]),
    ("select oid from src.orders union all select id from src.customers", None),
    ("select eid, oid from src.events", None),
])
def test_the_smallest_inferred_key_or_none_for_a_bag(sql, key):
    assert compile_model(sql, SOURCES, SCHEMAS).unique_key == key


def test_key_in_matches_keys_with_nulls_equal_for_one_or_several_key_columns():
    import pyarrow as pa

    from consistent_stream.operators.keyed import key_in
    t = pa.table({"a": pa.array([1, None, 3, 4], pa.int64()), "b": ["x", "y", None, "w"]})
    other = pa.table({"a": pa.array([None, 3, 9], pa.int32()), "b": ["y", None, "w"]})   # int32: cast
    assert key_in(t, other, ["a"]).to_pylist() == [False, True, True, False]
    assert key_in(t, other, ["a", "b"]).to_pylist() == [False, True, True, False]
    assert key_in(t, other, ["b"]).to_pylist() == [False, True, True, True]
    assert key_in(t, other.slice(0, 0), ["a"]).to_pylist() == [False] * 4
    both = pa.table({"a": pa.array([4, 1, 4, None], pa.int32()), "b": ["w", "z", "w", "y"]})   # joined rows
    assert key_in(t, both, ["a", "b"]).to_pylist() == [False, True, False, True]
    assert key_in(t, pa.table({"a": ["four"], "b": ["w"]}), ["a", "b"]).to_pylist() == [False] * 4   # no cast


def test_a_sorted_key_columns_positions_are_the_rows_key_in_matches():
    """``sorted_key_positions``: on a file sorted by one integer key (repeats and all), the
    positions ``key_in`` marks, whatever the other side holds (NULLs, repeats, other integer
    types); None where a binary search does not apply (unsorted, NULL keys, several columns)."""
    import numpy as np
    import pyarrow as pa

    from consistent_stream.operators.keyed import key_in, sorted_key_positions
    rng = np.random.default_rng(7)
    for trial in range(200):
        t = pa.table({"k": pa.array(np.sort(rng.integers(0, 40, int(rng.integers(1, 80)))), pa.int32())})
        values = rng.integers(-5, 45, int(rng.integers(0, 12))).tolist() + ([None] if trial % 3 == 0 else [])
        other = pa.table({"k": pa.array(values, pa.int64())})
        want = np.flatnonzero(key_in(t, other, ["k"]).to_numpy(zero_copy_only=False))
        assert sorted_key_positions(t, other, ["k"]).tolist() == want.tolist()
    assert sorted_key_positions(pa.table({"k": [3, 1]}), pa.table({"k": [1]}), ["k"]) is None
    assert sorted_key_positions(pa.table({"k": pa.array([1, None])}), pa.table({"k": [1]}), ["k"]) is None
    assert sorted_key_positions(pa.table({"k": [1], "j": [2]}), pa.table({"k": [1], "j": [2]}), ["k", "j"]) is None
