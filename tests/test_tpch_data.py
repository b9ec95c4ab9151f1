"""TPC-H source data: generated Delta tables and the refresh stream's Change Data Feed.

No Spark: delta-rs (deltalake) and pyarrow only, SF 0.01.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from consistent_stream_testing.tpch.generate import ALL, SCHEMAS, generate
from consistent_stream_testing.tpch.refresh import RefreshResult, is_refresh_orderkey, refresh_round

SF = 0.01
SF001_ROWS = {
    "region": 5,
    "nation": 25,
    "supplier": 100,
    "customer": 1500,
    "part": 2000,
    "partsupp": 8000,
    "orders": 15000,
    "lineitem": 60175,
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("tpch") / "sf001"
    return root, generate(SF, root)


@pytest.fixture()
def root(generated, tmp_path) -> Path:
    """A private copy of the generated tables (Delta logs use relative paths)."""
    dst = tmp_path / "tpch"
    shutil.copytree(generated[0], dst)
    return dst


def _table(root: Path, name: str, version: int | None = None, columns=None) -> pa.Table:
    dt = DeltaTable(str(root / name), version=version)
    return dt.to_pyarrow_dataset().to_table(columns=columns)


def _cdf(root: Path, name: str, start: int, end: int, columns=None) -> pa.Table:
    reader = DeltaTable(str(root / name)).load_cdf(
        starting_version=start, ending_version=end, columns=columns
    )
    t = pa.table(reader.read_all())
    return t.cast(
        pa.schema(
            [f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in t.schema]
        )
    )


def _keys(t: pa.Table, col: str) -> set[int]:
    return set(t.column(col).to_pylist())


def _pairs(t: pa.Table, a: str, b: str) -> list[tuple]:
    return list(zip(t.column(a).to_pylist(), t.column(b).to_pylist()))


def _assert_referentially_consistent(root: Path, v_orders=None, v_lineitem=None) -> None:
    okeys = _keys(_table(root, "orders", v_orders, ["o_orderkey"]), "o_orderkey")
    lkeys = _keys(_table(root, "lineitem", v_lineitem, ["l_orderkey"]), "l_orderkey")
    assert lkeys <= okeys, f"lineitems without order: {sorted(lkeys - okeys)[:10]}"


def test_generate(generated):
    root, counts = generated
    assert counts == SF001_ROWS
    for name in ALL:
        dt = DeltaTable(str(root / name))
        assert dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
        t = dt.to_pyarrow_dataset().to_table()
        assert t.num_rows == counts[name]
        assert t.schema.names == SCHEMAS[name].names
        # Plain types (no string_view / large types) so Spark's Parquet reader works.
        for f in t.schema:
            assert f.type == SCHEMAS[name].field(f.name).type, (name, f)
    orders = _table(root, "orders", columns=["o_orderkey"])
    assert not any(is_refresh_orderkey(k) for k in orders.column("o_orderkey").to_pylist())
    _assert_referentially_consistent(root)


def test_generate_overwrites_existing_table(root):
    before = DeltaTable(str(root / "nation")).version()
    assert generate(SF, root, tables=["nation"]) == {"nation": 25}
    dt = DeltaTable(str(root / "nation"))
    assert dt.version() == before + 1
    assert dt.count() == 25
    assert dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"


def test_generate_without_cdf_turns_the_feed_off_and_back_on(root):
    """``without_cdf`` writes the table with the feed off, also over a table that had it on;
    generated again without it, the feed is on again."""
    generate(SF, root, tables=["nation"], without_cdf=["nation"])
    assert DeltaTable(str(root / "nation")).metadata().configuration.get("delta.enableChangeDataFeed") == "false"
    generate(SF, root, tables=["nation"])
    assert DeltaTable(str(root / "nation")).metadata().configuration.get("delta.enableChangeDataFeed") == "true"


def _check_round(root: Path, res: RefreshResult, prev_max: int) -> dict[str, set[int]]:
    """Check one round's CDF against its RefreshResult; return the keys it touched."""
    assert [(c.table, c.operation) for c in res.commits] == [
        ("orders", "insert"),
        ("lineitem", "insert"),
        ("lineitem", "delete"),
        ("orders", "delete"),
        ("orders", "update"),
        ("customer", "update"),
    ]
    n = res.n
    assert n == 15  # max(1, round(0.001 * 15000))
    assert res.inserted_orders == res.deleted_orders == res.updated_orders == n
    assert res.updated_customers == n
    assert n <= res.inserted_lineitems <= 7 * n

    # Per table: the round's CDF counts equal the reported ones, commit by commit too.
    cdf = {}
    for table, start in res.start_versions.items():
        end = res.end_versions[table]
        cdf[table] = _cdf(root, table, start + 1, end)
        got = Counter(cdf[table].column("_change_type").to_pylist())
        assert dict(got) == res.expected_changes()[table], table
    kind = {
        "insert": {"insert"},
        "delete": {"delete"},
        "update": {"update_preimage", "update_postimage"},
    }
    for c in res.commits:
        types = Counter(
            _cdf(root, c.table, c.version, c.version, ["_change_type"])
            .column("_change_type")
            .to_pylist()
        )
        assert set(types) == kind[c.operation], c
        assert sum(types.values()) == (2 * c.rows if c.operation == "update" else c.rows), c

    def rows(table, change_type):
        t = cdf[table]
        return t.filter(pc.equal(t.column("_change_type"), change_type))

    ins_orders = rows("orders", "insert")
    new_keys = _keys(ins_orders, "o_orderkey")
    assert len(new_keys) == n and min(new_keys) > prev_max
    assert all(is_refresh_orderkey(k) for k in new_keys)
    ins_lines = rows("lineitem", "insert")
    assert _keys(ins_lines, "l_orderkey") == new_keys
    # l_linenumber is 1..k per new order.
    per_order: dict[int, list[int]] = {}
    for k, ln in _pairs(ins_lines, "l_orderkey", "l_linenumber"):
        per_order.setdefault(k, []).append(ln)
    assert all(sorted(v) == list(range(1, len(v) + 1)) and len(v) <= 7 for v in per_order.values())
    assert all(s in {"O", "F", "P"} for s in ins_orders.column("o_orderstatus").to_pylist())

    # Foreign keys of the new rows.
    custkeys = _keys(_table(root, "customer", columns=["c_custkey"]), "c_custkey")
    assert _keys(ins_orders, "o_custkey") <= custkeys
    ps = _table(root, "partsupp", columns=["ps_partkey", "ps_suppkey"])
    ps_pairs = set(_pairs(ps, "ps_partkey", "ps_suppkey"))
    assert set(_pairs(ins_lines, "l_partkey", "l_suppkey")) <= ps_pairs

    # Deletes: whole orders with all their lineitems; none left afterwards.
    del_keys = _keys(rows("orders", "delete"), "o_orderkey")
    assert len(del_keys) == n and not (del_keys & new_keys)
    assert _keys(rows("lineitem", "delete"), "l_orderkey") == del_keys
    assert not (_keys(_table(root, "orders", columns=["o_orderkey"]), "o_orderkey") & del_keys)
    assert not (_keys(_table(root, "lineitem", columns=["l_orderkey"]), "l_orderkey") & del_keys)

    # Updates: pre/post images of the same keys, status changed, never a deleted order.
    pre, post = rows("orders", "update_preimage"), rows("orders", "update_postimage")
    upd_keys = _keys(pre, "o_orderkey")
    assert upd_keys == _keys(post, "o_orderkey") and len(upd_keys) == n
    assert not (upd_keys & del_keys) and not (upd_keys & new_keys)
    pre_status = dict(_pairs(pre, "o_orderkey", "o_orderstatus"))
    post_status = dict(_pairs(post, "o_orderkey", "o_orderstatus"))
    assert all(pre_status[k] != post_status[k] for k in upd_keys)
    cpre, cpost = rows("customer", "update_preimage"), rows("customer", "update_postimage")
    bal_pre = dict(_pairs(cpre, "c_custkey", "c_acctbal"))
    bal_post = dict(_pairs(cpost, "c_custkey", "c_acctbal"))
    assert bal_pre.keys() == bal_post.keys() and len(bal_pre) == n
    assert all(bal_pre[k] != bal_post[k] for k in bal_pre)

    # Referential consistency after the round and at every intermediate commit.
    _assert_referentially_consistent(root)
    v = {"orders": res.start_versions["orders"], "lineitem": res.start_versions["lineitem"]}
    for c in res.commits:
        if c.table in v:
            v[c.table] = c.version
            _assert_referentially_consistent(root, v["orders"], v["lineitem"])
    return {"inserted": new_keys, "deleted": del_keys, "updated": upd_keys}


def test_two_refresh_rounds(root):
    def max_orderkey() -> int:
        return pc.max(_table(root, "orders", columns=["o_orderkey"]).column("o_orderkey")).as_py()

    m0 = max_orderkey()
    r1 = refresh_round(root, 1, seed=3)
    k1 = _check_round(root, r1, m0)
    m1 = max_orderkey()
    assert m1 == max(k1["inserted"])
    r2 = refresh_round(root, 2, seed=3)
    assert r2.start_versions == r1.end_versions
    k2 = _check_round(root, r2, m1)
    # Orders inserted in round 1 are deleted and updated in round 2 (a tenth of n, >= 1).
    assert k2["deleted"] & k1["inserted"]
    assert k2["updated"] & k1["inserted"]
    # Deleted orders are gone for good: never updated or deleted again.
    assert not (k1["deleted"] & (k2["updated"] | k2["deleted"]))
    assert _table(root, "orders").num_rows == SF001_ROWS["orders"]


def test_refresh_is_deterministic(generated, tmp_path):
    results = []
    for copy in ("a", "b"):
        dst = tmp_path / copy
        shutil.copytree(generated[0], dst)
        counts = [refresh_round(dst, r, seed=11).to_dict() for r in (1, 2)]
        tables = {
            t: _table(dst, t).sort_by([(c, "ascending") for c in SCHEMAS[t].names[:4]])
            for t in ("orders", "lineitem", "customer")
        }
        results.append((counts, tables))
    (ca, ta), (cb, tb) = results
    assert ca == cb
    for t in ta:
        assert ta[t].equals(tb[t]), t
    # A different seed gives a different stream.
    dst = tmp_path / "c"
    shutil.copytree(generated[0], dst)
    other = refresh_round(dst, 1, seed=12)
    assert _keys(_cdf(dst, "orders", 1, other.end_versions["orders"]), "o_orderkey") != _keys(
        _cdf(tmp_path / "a", "orders", 1, ca[0]["end_versions"]["orders"]), "o_orderkey"
    )
