"""A TPC-H refresh stream on the Delta tables written by :mod:`.generate`.

One *round* (:func:`refresh_round`) is, in the spirit of TPC-H's refresh functions plus
updates, with ``n = max(1, round(0.001 * number of orders))`` (150 at SF 0.1):

1. RF1 insert: ``n`` new orders with 1..7 lineitems each. One append commit on
   ``orders``, then one on ``lineitem``.
2. RF2 delete: ``n`` existing orders and all their lineitems. One delete commit on
   ``lineitem``, then one on ``orders``.
3. Update ``o_orderstatus`` and ``o_orderpriority`` of ``n`` existing orders (one
   commit on ``orders``).
4. Update ``c_acctbal`` of ``n`` customers (one commit on ``customer``).

Six Delta commits per round, in this order: orders insert, lineitem insert, lineitem
delete, orders delete, orders update, customer update. Because orders are inserted before
and deleted after their lineitems, the tables after any prefix of these commits are
referentially consistent (each lineitem's order exists). The status update does not
touch lineitems, so ``o_orderstatus`` need not agree with ``l_linestatus`` afterwards.

Deletes and updates are written with delta-rs ``MERGE`` (``when_matched_delete`` /
``when_matched_update`` against a small key table, ``streamed_exec=False``), inserts
with an append ``WRITE``; on a table with the Change Data Feed on, delta-rs 1.6 writes it for
all three (``insert``; ``delete``; ``update_preimage`` + ``update_postimage``), which
``load_cdf`` returns. A table generated without the feed gets the same commits, without it.

Determinism: given the table contents at the start of the round, the round depends only
on ``(seed, round_no)``; a sequence of rounds from the same generated data is therefore
reproducible. Rules that keep the stream meaningful over many rounds:

* new order keys are above the current maximum and, unlike dbgen's keys (which satisfy
  ``o_orderkey % 32 < 8``), satisfy ``o_orderkey % 32 >= 8``, so
  :func:`is_refresh_orderkey` tells inserted orders from generated ones;
* the order with the largest key is never deleted, so keys are never reused;
* about a tenth of each round's deletes and order updates pick orders inserted by
  earlier rounds (when there are any), so inserted orders are later updated and deleted;
* deletes and updates only pick orders live at the start of the round, and updates
  never pick an order deleted in the same round: a deleted order is never touched again.

:func:`update_dimensions` changes the tables a round leaves alone (``part``, ``supplier``,
``partsupp``), so that every TPC-H query's inputs change.

Each commit carries custom commit metadata ``tpch_refresh_round``,
``tpch_refresh_seed`` and ``tpch_refresh_op`` (visible in ``DeltaTable.history()``).

The tables' root is a local directory or an S3 URI, as for :mod:`.generate` (delta-rs opens
each table with :func:`consistent_stream.location.delta_storage_options`).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from consistent_stream import location

from .generate import SCHEMAS, table_path

__all__ = [
    "RefreshCommit",
    "RefreshResult",
    "is_refresh_orderkey",
    "refresh_round",
    "refresh_size",
    "update_dimensions",
]

# TPC-H constants (spec 4.2.3 / dbgen).
_START_DATE = dt.date(1992, 1, 1)
_END_ORDER_DATE = dt.date(1998, 8, 2)  # ENDDATE - 151 days: last o_orderdate
_CURRENT_DATE = dt.date(1995, 6, 17)
_PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
_SHIP_INSTRUCT = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
_SHIP_MODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
_WORDS = (
    "furiously sly careful blithe quick fluffy slow quiet ruthless thin close dogged "
    "daring brave stealthy permanent enticing idle busy regular final ironic even bold "
    "silent pending special express unusual packages requests accounts deposits foxes "
    "ideas theodolites pinto beans instructions dependencies excuses platelets asymptotes "
    "courts dolphins sleep wake are cajole haggle nag use boost affix detect integrate "
    "maintain nod was lose sublate solve thrash promise engage above across along among "
    "about after against"
).split()
_CENT = Decimal("0.01")
_DEC = pa.decimal128(15, 2)


def _loaded_result(state: dict) -> "RefreshResult":
    """A pickled :class:`RefreshResult` loaded, its ``start_versions`` read-only again."""
    return RefreshResult(**{**state, "start_versions": MappingProxyType(state["start_versions"])})


def is_refresh_orderkey(orderkey: int) -> bool:
    """Whether ``orderkey`` was assigned by :func:`refresh_round` (not by dbgen)."""
    return orderkey % 32 >= 8


def refresh_size(num_orders: int) -> int:
    """Orders inserted, deleted and updated (and customers updated) per round:
    ``max(1, round(0.001 * num_orders))``, as in TPC-H RF1/RF2."""
    return max(1, round(0.001 * num_orders))


@dataclass(frozen=True)
class RefreshCommit:
    """One Delta commit of a round: ``table`` at ``version``, ``operation`` one of
    ``insert``, ``delete``, ``update``, touching ``rows`` rows."""

    table: str
    operation: str
    version: int
    rows: int


@dataclass(frozen=True)
class RefreshResult:
    """What one :func:`refresh_round` did.

    Counts are rows. ``start_versions`` are the versions of the touched tables
    (``orders``, ``lineitem``, ``customer``) before the round; ``commits`` lists the
    round's commits in order. The round's Change Data Feed of table ``t`` (one with the feed on) is
    ``DeltaTable(root/t).load_cdf(starting_version=start_versions[t] + 1,
    ending_version=end_versions[t])`` and its counts per ``_change_type`` are
    :meth:`expected_changes` ``[t]``.
    """

    round_no: int
    seed: int
    n: int
    inserted_orders: int
    inserted_lineitems: int
    deleted_orders: int
    deleted_lineitems: int
    updated_orders: int
    updated_customers: int
    start_versions: Mapping[str, int]
    commits: tuple[RefreshCommit, ...] = field(default=())

    def __reduce__(self):
        """Pickled (a round run in a child process, :mod:`consistent_stream_testing.apart`)
        with ``start_versions`` as a dict, since a read-only mapping view does not pickle."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        return _loaded_result, ({**state, "start_versions": dict(self.start_versions)},)

    @property
    def versions(self) -> dict[str, tuple[int, ...]]:
        """New Delta versions per touched table, in commit order."""
        out: dict[str, tuple[int, ...]] = {}
        for c in self.commits:
            out[c.table] = out.get(c.table, ()) + (c.version,)
        return out

    @property
    def end_versions(self) -> dict[str, int]:
        """Version of each touched table after the round."""
        return {t: v[-1] for t, v in self.versions.items()}

    def expected_changes(self) -> dict[str, dict[str, int]]:
        """Rows per table per CDF ``_change_type`` this round wrote (zeros omitted)."""
        exp = {
            "orders": {
                "insert": self.inserted_orders,
                "delete": self.deleted_orders,
                "update_preimage": self.updated_orders,
                "update_postimage": self.updated_orders,
            },
            "lineitem": {"insert": self.inserted_lineitems, "delete": self.deleted_lineitems},
            "customer": {
                "update_preimage": self.updated_customers,
                "update_postimage": self.updated_customers,
            },
        }
        return {t: {k: v for k, v in d.items() if v} for t, d in exp.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable summary."""
        return {
            "round": self.round_no,
            "seed": self.seed,
            "n": self.n,
            "inserted_orders": self.inserted_orders,
            "inserted_lineitems": self.inserted_lineitems,
            "deleted_orders": self.deleted_orders,
            "deleted_lineitems": self.deleted_lineitems,
            "updated_orders": self.updated_orders,
            "updated_customers": self.updated_customers,
            "start_versions": dict(self.start_versions),
            "end_versions": self.end_versions,
            "commits": [
                {"table": c.table, "operation": c.operation, "version": c.version, "rows": c.rows}
                for c in self.commits
            ],
        }


# --------------------------------------------------------------------------- helpers


def _open(root: str, table: str):
    from deltalake import DeltaTable

    path = table_path(root, table)
    options = location.delta_storage_options(path)
    if not DeltaTable.is_deltatable(path, storage_options=options):
        raise FileNotFoundError(
            f"no Delta table at {path}; generate the TPC-H tables first "
            "(consistent_stream_testing.tpch.generate.generate or `consistent-stream-testing tpch-generate`)"
        )
    return DeltaTable(path, storage_options=options)


def _read(table, columns: list[str], filter=None) -> pa.Table:
    """Current snapshot of ``columns``, view types cast to plain ones."""
    t = table.to_pyarrow_dataset().to_table(columns=columns, filter=filter)
    fields = [
        f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in t.schema
    ]
    return t.cast(pa.schema(fields))


def _is_refresh_key(keys: pa.ChunkedArray) -> pa.ChunkedArray:
    """Vectorized :func:`is_refresh_orderkey`."""
    return pc.greater_equal(pc.bit_wise_and(keys, 31), 8)


def _sample(rnd: random.Random, t: pa.Table, k: int) -> pa.Table:
    """``min(k, rows)`` distinct rows of ``t``, in ``t``'s order."""
    k = max(0, min(k, t.num_rows))
    return t.take(pa.array(sorted(rnd.sample(range(t.num_rows), k)), pa.int64()))


def _pick_orders(rnd: random.Random, t: pa.Table, k: int, k_pref: int) -> pa.Table:
    """``k`` distinct rows of orders table ``t`` (sorted by key), up to ``k_pref`` of
    them orders inserted by earlier rounds; result sorted by ``o_orderkey``."""
    mask = _is_refresh_key(t.column("o_orderkey"))
    pref, rest = t.filter(mask), t.filter(pc.invert(mask))
    a = _sample(rnd, pref, k_pref)
    b = _sample(rnd, rest, k - a.num_rows)
    parts = [a, b]
    if a.num_rows + b.num_rows < k:  # rest too small: top up from preferred
        left = pref.filter(pc.invert(pc.is_in(pref.column("o_orderkey"), a.column("o_orderkey"))))
        parts.append(_sample(rnd, left, k - a.num_rows - b.num_rows))
    out = pa.concat_tables(parts)
    return out.take(pc.sort_indices(out, sort_keys=[("o_orderkey", "ascending")]))


def _sorted(t: pa.Table, *cols: str) -> pa.Table:
    return t.take(pc.sort_indices(t, sort_keys=[(c, "ascending") for c in cols]))


def _text(rnd: random.Random, lo: int, hi: int) -> str:
    target = rnd.randint(lo, hi)
    words: list[str] = []
    while len(" ".join(words)) < target:
        words.append(rnd.choice(_WORDS))
    return " ".join(words)[:target]


def _money(x: Decimal) -> Decimal:
    return x.quantize(_CENT, rounding=ROUND_HALF_UP)


def _new_orderkeys(current_max: int, n: int) -> list[int]:
    keys: list[int] = []
    k = current_max
    while len(keys) < n:
        k += 1
        if is_refresh_orderkey(k):
            keys.append(k)
    return keys


def _build_inserts(
    rnd: random.Random,
    keys: list[int],
    custkeys: pa.ChunkedArray,
    partsupp: pa.Table,
    part,
    clerks: int,
) -> tuple[pa.Table, pa.Table]:
    """RF1 rows: orders with keys ``keys`` and their 1..7 lineitems each.

    ``custkeys``: customers to draw ``o_custkey`` from; ``partsupp``: rows
    (``ps_partkey``, ``ps_suppkey``) to draw lineitem parts and suppliers from, in a
    stable order; ``part``: the part DeltaTable (retail prices of the drawn parts).
    """
    span = (_END_ORDER_DATE - _START_DATE).days
    o: dict[str, list] = {name: [] for name in SCHEMAS["orders"].names}
    li: dict[str, list] = {name: [] for name in SCHEMAS["lineitem"].names}
    ps_rows: list[int] = []
    lines_per_order: list[int] = []
    for key in keys:
        odate = _START_DATE + dt.timedelta(days=rnd.randint(0, span))
        k = rnd.randint(1, 7)
        lines_per_order.append(k)
        statuses = set()
        for line in range(1, k + 1):
            ps_rows.append(rnd.randrange(partsupp.num_rows))
            qty = rnd.randint(1, 50)
            ship = odate + dt.timedelta(days=rnd.randint(1, 121))
            commit = odate + dt.timedelta(days=rnd.randint(30, 90))
            receipt = ship + dt.timedelta(days=rnd.randint(1, 30))
            status = "O" if ship > _CURRENT_DATE else "F"
            statuses.add(status)
            for col, val in (
                ("l_orderkey", key),
                ("l_linenumber", line),
                ("l_quantity", Decimal(qty).quantize(_CENT)),
                ("l_discount", (Decimal(rnd.randint(0, 10)) / 100).quantize(_CENT)),
                ("l_tax", (Decimal(rnd.randint(0, 8)) / 100).quantize(_CENT)),
                ("l_returnflag", rnd.choice("RA") if receipt <= _CURRENT_DATE else "N"),
                ("l_linestatus", status),
                ("l_shipdate", ship),
                ("l_commitdate", commit),
                ("l_receiptdate", receipt),
                ("l_shipinstruct", rnd.choice(_SHIP_INSTRUCT)),
                ("l_shipmode", rnd.choice(_SHIP_MODES)),
                ("l_comment", _text(rnd, 10, 43)),
            ):
                li[col].append(val)
        for col, val in (
            ("o_orderkey", key),
            ("o_custkey", custkeys[rnd.randrange(len(custkeys))].as_py()),
            ("o_orderstatus", statuses.pop() if len(statuses) == 1 else "P"),
            ("o_orderdate", odate),
            ("o_orderpriority", rnd.choice(_PRIORITIES)),
            ("o_clerk", f"Clerk#{rnd.randint(1, clerks):09d}"),
            ("o_shippriority", 0),
            ("o_comment", _text(rnd, 19, 78)),
        ):
            o[col].append(val)

    # Prices: l_extendedprice = l_quantity * p_retailprice; o_totalprice as in dbgen.
    drawn = partsupp.take(pa.array(ps_rows, pa.int64()))
    li["l_partkey"] = drawn.column("ps_partkey").to_pylist()
    li["l_suppkey"] = drawn.column("ps_suppkey").to_pylist()
    needed = sorted(set(li["l_partkey"]))
    prices = _read(part, ["p_partkey", "p_retailprice"], pc.field("p_partkey").isin(needed))
    retail = dict(
        zip(prices.column("p_partkey").to_pylist(), prices.column("p_retailprice").to_pylist())
    )
    missing = set(needed) - retail.keys()
    if missing:
        raise ValueError(f"partsupp references parts missing from part: {sorted(missing)[:10]}")
    li["l_extendedprice"] = [
        _money(retail[p] * q) for p, q in zip(li["l_partkey"], li["l_quantity"])
    ]
    i = 0
    for k in lines_per_order:
        total = sum(
            (
                li["l_extendedprice"][j] * (1 + li["l_tax"][j]) * (1 - li["l_discount"][j])
                for j in range(i, i + k)
            ),
            Decimal(0),
        )
        o["o_totalprice"].append(_money(total))
        i += k
    return (
        pa.table(o, schema=SCHEMAS["orders"]),
        pa.table(li, schema=SCHEMAS["lineitem"]),
    )


# ----------------------------------------------------------------------------- round


def refresh_round(root: str | Path, round_no: int, *, seed: int = 0, size: int | None = None) -> RefreshResult:
    """Apply one refresh round to the TPC-H Delta tables under ``root``.

    Touches ``root/orders`` (3 commits: insert, delete, update of ``o_orderstatus``
    and ``o_orderpriority``), ``root/lineitem`` (2 commits: insert, delete) and
    ``root/customer`` (1 commit: update of ``c_acctbal``, dollars, decimal(15,2),
    drawn from TPC-H's range -999.99 .. 9999.99); reads ``part``, ``partsupp`` and
    ``supplier``. See the module docstring for the rules. Inserted rows have the
    schemas of :data:`consistent_stream_testing.tpch.generate.SCHEMAS`, valid foreign keys
    (``o_custkey`` of a customer with ``c_custkey % 3 != 0`` as in dbgen,
    ``(l_partkey, l_suppkey)`` of a ``partsupp`` row), dates in TPC-H's ranges,
    ``l_extendedprice = l_quantity * p_retailprice`` and ``o_totalprice`` and
    ``o_orderstatus`` derived from the lineitems as in dbgen.

    Args:
        root: directory (or S3 URI) with the Delta tables written by ``generate``.
        round_no: round number (>= 1 by convention; any int works), part of the seed.
        seed: stream seed; the same ``(seed, round_no)`` on the same data makes the
            same changes.
        size: orders inserted, deleted and updated (and customers updated) in the round;
            default :func:`refresh_size` (0.1 % of the orders, as TPC-H's RF1/RF2).

    Returns:
        A :class:`RefreshResult` with the counts and the new Delta versions.

    Raises:
        FileNotFoundError: a needed table is missing under ``root``.
        ValueError: ``orders``, ``customer`` or ``partsupp`` is empty.
        RuntimeError: a commit changed a different number of rows than planned.
        ConfigError: ``root`` is a URI of a scheme other than ``s3://`` / ``file://``.
        StorageError: ``root``'s bucket does not exist or refuses the credentials.
    """
    root = location.normalize(str(root), key="--dir")
    location.check_reachable(root, key="--dir")
    orders = _open(root, "orders")
    lineitem = _open(root, "lineitem")
    customer = _open(root, "customer")
    start_versions = {
        "orders": orders.version(),
        "lineitem": lineitem.version(),
        "customer": customer.version(),
    }
    # the stream's name from before the package moved (consistent_stream.*): kept, so every round's rows stay the same
    rnd = random.Random(f"consistent_stream.tpch.refresh:{seed}:{round_no}")
    plan = _plan_round(root, orders, customer, rnd, size)
    commits, deleted_lines = _commit_round(orders, lineitem, customer, plan, round_no, seed)
    return RefreshResult(
        round_no=round_no,
        seed=seed,
        n=plan.n,
        inserted_orders=plan.new_orders.num_rows,
        inserted_lineitems=plan.new_lines.num_rows,
        deleted_orders=len(plan.del_keys),
        deleted_lineitems=deleted_lines,
        updated_orders=plan.orders_upd.num_rows,
        updated_customers=plan.cust_upd.num_rows,
        start_versions=MappingProxyType(start_versions),
        commits=tuple(commits),
    )


@dataclass(frozen=True)
class _RoundPlan:
    """One round's changes, planned from the snapshot at its start: ``n`` (the round's
    size), the order keys to delete (RF2), the orders' new status and priority and the
    customers' new balances (keyed tables of the changed columns), and the inserted orders
    and lineitems (RF1)."""
    n: int
    del_keys: pa.ChunkedArray
    orders_upd: pa.Table
    cust_upd: pa.Table
    new_orders: pa.Table
    new_lines: pa.Table


def _plan_round(root: str, orders, customer, rnd: random.Random, size: int | None) -> _RoundPlan:
    """Plan a round (the rules in :func:`refresh_round` and the module docstring); ``rnd``
    is drawn from in a fixed order, so the same seed plans the same changes."""
    live = _sorted(_read(orders, ["o_orderkey", "o_orderstatus", "o_orderpriority"]), "o_orderkey")
    if live.num_rows == 0:
        raise ValueError(f"{table_path(root, 'orders')} is empty")
    n = size if size is not None else refresh_size(live.num_rows)
    if n < 1:
        raise ValueError(f"refresh size must be at least 1, got {size}")
    n_pref = max(1, n // 10)
    max_key = live.column("o_orderkey")[-1].as_py()

    # RF2: never delete the largest key, so new keys never reuse a deleted one.
    to_delete = _pick_orders(rnd, live.slice(0, live.num_rows - 1), n, n_pref)
    del_keys = to_delete.column("o_orderkey")

    # Order updates: status moves forward (O -> P -> F); F orders are reopened (-> O)
    # only when too few open ones are left. Priority changes to another value.
    remaining = live.filter(pc.invert(pc.is_in(live.column("o_orderkey"), del_keys)))
    is_open = pc.not_equal(remaining.column("o_orderstatus"), "F")
    to_update = _pick_orders(rnd, remaining.filter(is_open), n, n_pref)
    if to_update.num_rows < n:
        closed = _sample(rnd, remaining.filter(pc.invert(is_open)), n - to_update.num_rows)
        to_update = _sorted(pa.concat_tables([to_update, closed]), "o_orderkey")
    next_status = {"O": "P", "P": "F", "F": "O"}
    orders_upd = pa.table(
        {
            "o_orderkey": to_update.column("o_orderkey"),
            "o_orderstatus": [
                next_status.get(s, "O") for s in to_update.column("o_orderstatus").to_pylist()
            ],
            "o_orderpriority": [
                rnd.choice([p for p in _PRIORITIES if p != old])
                for old in to_update.column("o_orderpriority").to_pylist()
            ],
        }
    )

    # Customer balance updates.
    cust = _sorted(_read(customer, ["c_custkey", "c_acctbal"]), "c_custkey")
    if cust.num_rows == 0:
        raise ValueError(f"{table_path(root, 'customer')} is empty")
    chosen = _sample(rnd, cust, n)
    new_bal = []
    for old in chosen.column("c_acctbal").to_pylist():
        b = old
        while b == old:
            b = (Decimal(rnd.randint(-99999, 999999)) / 100).quantize(_CENT)
        new_bal.append(b)
    cust_upd = pa.table(
        {"c_custkey": chosen.column("c_custkey"), "c_acctbal": pa.array(new_bal, _DEC)}
    )

    # RF1 rows.
    partsupp = _sorted(
        _read(_open(root, "partsupp"), ["ps_partkey", "ps_suppkey"]),
        "ps_partkey",
        "ps_suppkey",
    )
    if partsupp.num_rows == 0:
        raise ValueError(f"{table_path(root, 'partsupp')} is empty")
    n_supp = _open(root, "supplier").to_pyarrow_dataset().count_rows()
    ckeys = cust.column("c_custkey")
    # dbgen gives no orders to customers whose key is a multiple of 3.
    order_custkeys = ckeys.filter(pc.not_equal(pc.remainder(ckeys, 3), 0))
    if len(order_custkeys) == 0:
        order_custkeys = ckeys
    new_orders, new_lines = _build_inserts(
        rnd,
        _new_orderkeys(max_key, n),
        order_custkeys,
        partsupp,
        _open(root, "part"),
        clerks=max(1, n_supp // 10),
    )
    return _RoundPlan(n, del_keys, orders_upd, cust_upd, new_orders, new_lines)


def _commit_round(orders, lineitem, customer, plan: _RoundPlan, round_no: int,
                  seed: int) -> tuple[list[RefreshCommit], int]:
    """Commit a planned round: RF1 (orders before lineitems), RF2 (lineitems before
    orders), then the updates, each commit tagged with the round, the seed and the
    operation. Returns the commits and the lineitems deleted. Raises RuntimeError when a
    commit changed a different number of rows than planned."""
    from deltalake import CommitProperties, write_deltalake

    commits: list[RefreshCommit] = []

    def props(op: str) -> CommitProperties:
        return CommitProperties(
            custom_metadata={
                "tpch_refresh_round": round_no,
                "tpch_refresh_seed": seed,
                "tpch_refresh_op": op,
            }
        )

    def record(table, name: str, operation: str, rows: int, planned: int) -> None:
        if rows != planned:
            raise RuntimeError(
                f"{operation} on {name} changed {rows} rows, planned {planned} "
                f"(round {round_no}, seed {seed})"
            )
        commits.append(RefreshCommit(name, operation, table.version(), rows))

    def merge(table, source: pa.Table, on: str, op: str, update: dict | None = None) -> dict:
        m = table.merge(
            source,
            on,
            source_alias="s",
            target_alias="t",
            streamed_exec=False,  # small in-memory source: allow source stats pruning
            commit_properties=props(op),
        )
        return (m.when_matched_update(update) if update else m.when_matched_delete()).execute()

    new_orders, new_lines = plan.new_orders, plan.new_lines
    # RF1: orders before lineitems.
    write_deltalake(orders, new_orders, mode="append", commit_properties=props("rf1_insert_orders"))
    record(orders, "orders", "insert", new_orders.num_rows, new_orders.num_rows)
    write_deltalake(
        lineitem, new_lines, mode="append", commit_properties=props("rf1_insert_lineitem")
    )
    record(lineitem, "lineitem", "insert", new_lines.num_rows, new_lines.num_rows)

    # RF2: lineitems before orders.
    del_src = pa.table({"k": plan.del_keys})
    deleted_lines = int(merge(lineitem, del_src, "t.l_orderkey = s.k", "rf2_delete_lineitem")
                        ["num_target_rows_deleted"])
    record(lineitem, "lineitem", "delete", deleted_lines, deleted_lines)
    m = merge(orders, del_src, "t.o_orderkey = s.k", "rf2_delete_orders")
    record(orders, "orders", "delete", int(m["num_target_rows_deleted"]), len(plan.del_keys))

    # Updates.
    m = merge(orders, plan.orders_upd, "t.o_orderkey = s.o_orderkey", "update_orders",
              {"o_orderstatus": "s.o_orderstatus", "o_orderpriority": "s.o_orderpriority"})
    record(orders, "orders", "update", int(m["num_target_rows_updated"]), plan.orders_upd.num_rows)
    m = merge(customer, plan.cust_upd, "t.c_custkey = s.c_custkey", "update_customer",
              {"c_acctbal": "s.c_acctbal"})
    record(customer, "customer", "update", int(m["num_target_rows_updated"]), plan.cust_upd.num_rows)
    return commits, deleted_lines


def update_dimensions(root: str | Path, round_no: int, *, seed: int = 0, rows: int = 5) -> dict[str, int]:
    """Update the tables a refresh round leaves alone, one commit each: ``p_retailprice`` and
    ``p_size`` of ``rows`` parts, ``s_acctbal`` of ``rows`` suppliers and ``ps_supplycost`` and
    ``ps_availqty`` of the partsupp rows of ``rows`` parts (values in TPC-H's ranges, decimals
    in dollars). The same ``(seed, round_no)`` on the same data makes the same changes.
    Returns the rows updated per table. Raises FileNotFoundError when a table is missing."""
    from deltalake import CommitProperties

    root = location.normalize(str(root), key="--dir")
    # the stream's name from before the package moved (consistent_stream.*): kept, so every round's rows stay the same
    rnd = random.Random(f"consistent_stream.tpch.update_dimensions:{seed}:{round_no}")
    out = {}

    def money(lo: int, hi: int) -> str:
        return f"CAST('{Decimal(rnd.randint(lo, hi)).scaleb(-2)}' AS DECIMAL(15, 2))"
    for table, key, values in (
            ("part", "p_partkey", lambda: {"p_retailprice": money(90000, 200000),
                                            "p_size": str(rnd.choice([3, 9, 14, 15, 19, 23, 36, 45, 49]))}),
            ("supplier", "s_suppkey", lambda: {"s_acctbal": money(-99999, 999999)}),
            ("partsupp", "ps_partkey", lambda: {"ps_supplycost": money(100, 100000),
                                                 "ps_availqty": str(rnd.randint(1, 9999))})):
        t = _open(root, table)
        keys = pc.unique(_read(t, [key]).column(key)).to_pylist()
        picked = sorted(rnd.sample(sorted(keys), min(rows, len(keys))))
        m = t.update(updates=values(), predicate=f"{key} IN ({', '.join(map(str, picked))})",
                     commit_properties=CommitProperties(custom_metadata={
                         "tpch_refresh_round": str(round_no), "tpch_refresh_seed": str(seed),
                         "tpch_refresh_op": f"update_{table}"}))
        out[table] = int(m.get("num_updated_rows", 0))
    return out
