"""A TPC-DS refresh stream on the Delta tables written by :mod:`.generate`.

One *round* (:func:`refresh_round`) changes the fact tables and the dimensions the queries
read, in about 30 delta-rs commits, each one operation on one table. With ``fraction`` (default
0.01) and ``n(t) = max(1, round(fraction * rows of t))``:

Each sales channel (store, catalog, web: its sales table and its returns table), a sale and
its returns identified by the ticket or order number:

1. insert: whole tickets (orders) of about ``n(sales)`` lines, copies of existing tickets
   under new ticket numbers above the largest in either table; a copy's sold (and ship) date
   is a random existing ticket's, its returns are the copied ticket's returns moved by the
   same number of days. One append commit on the sales table, then one on the returns table.
2. delete: whole tickets of about ``n(sales) / 2`` lines (never the largest ticket number, so
   numbers are never reused), their returns first, plus ``n(returns) / 2`` other returns. One
   delete commit on the returns table, then one on the sales table.
3. update: the measures (every column that is not a key: quantities, prices, costs, taxes,
   discounts, net paid, net profit, ...) of ``n(sales)`` sales lines and of ``n(returns)``
   returns, each row taking all its measures from one other row of its table (a donor), so
   values stay in each column's domain and consistent with each other. One commit on each.

``inventory``: insert ``n`` rows (copies of existing rows one to six days later, on dates
that have no inventory row of that item and warehouse yet), delete ``n / 2`` rows, update
``inv_quantity_on_hand`` of ``n`` rows (from donors): three commits.

Dimensions, ``dimension_rows`` rows each (default 10; fewer when the table is smaller):
updates of the attributes the TPC-DS queries filter and group by, each group of columns taken
from one donor row of the same table (so a city comes with its county, state, zip and GMT
offset; a brand with its class, category and manufacturer): ``item`` (price and cost; brand,
class, category and manufacturer; color, units, size and manager), ``customer`` (birth
country; birth date; preferred flag; current address; current demographics; name),
``customer_address`` (the address; the location type), ``customer_demographics`` and
``household_demographics`` (each column from its own donor), ``store`` (location; name; size
and company), ``promotion`` (one channel flag flipped Y/N per row), ``warehouse``,
``ship_mode``, ``web_site``, ``call_center`` (name, location or type). ``item``,
``customer`` and ``customer_address`` also get two new rows each (copies of existing rows
under a new surrogate key above the largest and a new business id starting ``CSNEW``), and
lose one row such a round inserted earlier (no fact row references those). ``date_dim``,
``time_dim`` and the other small dimensions stay fixed.

Deletes and updates are delta-rs ``MERGE`` commits (``when_matched_delete`` /
``when_matched_update`` against a small keyed table), inserts append ``WRITE`` commits, so
every commit is in the table's Change Data Feed. Every table keeps its primary key
(:data:`.generate.PRIMARY_KEYS`) unique.

Determinism: given the tables' contents at the start of a round, the round depends only on
``(seed, round_no)``. Each commit carries custom metadata ``tpcds_refresh_round``,
``tpcds_refresh_seed`` and ``tpcds_refresh_op``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from consistent_stream import location

from .generate import PRIMARY_KEYS, SCHEMAS, table_path

__all__ = ["NEW_ID_PREFIX", "RefreshCommit", "RefreshResult", "refresh_round"]

_CDF_KEY = "delta.enableChangeDataFeed"

#: Business ids (``i_item_id``, ``c_customer_id``, ``ca_address_id``) of dimension rows a
#: round inserts start with this (TPC-DS's are 16 letters ``A``..``P``).
NEW_ID_PREFIX = "CSNEW"

# (sales, returns, sales order column, returns order column, sales item, returns item,
#  sales date columns moved with a copy, returns date columns moved with a copy)
_CHANNELS = (
    ("store_sales", "store_returns", "ss_ticket_number", "sr_ticket_number",
     ("ss_sold_date_sk",), ("sr_returned_date_sk",)),
    ("catalog_sales", "catalog_returns", "cs_order_number", "cr_order_number",
     ("cs_sold_date_sk", "cs_ship_date_sk"), ("cr_returned_date_sk",)),
    ("web_sales", "web_returns", "ws_order_number", "wr_order_number",
     ("ws_sold_date_sk", "ws_ship_date_sk"), ("wr_returned_date_sk",)),
)

# Dimension updates: table -> groups of columns, each group taken from one donor row.
_DIMENSION_GROUPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "item": (
        ("i_current_price", "i_wholesale_cost"),
        ("i_brand_id", "i_brand", "i_class_id", "i_class", "i_category_id", "i_category",
         "i_manufact_id", "i_manufact"),
        ("i_color", "i_units", "i_size", "i_manager_id"),
    ),
    "customer": (
        ("c_birth_country",),
        ("c_birth_day", "c_birth_month", "c_birth_year"),
        ("c_preferred_cust_flag",),
        ("c_current_addr_sk",),
        ("c_current_cdemo_sk", "c_current_hdemo_sk"),
        ("c_salutation", "c_first_name", "c_last_name"),
    ),
    "customer_address": (
        ("ca_street_number", "ca_street_name", "ca_street_type", "ca_suite_number", "ca_city",
         "ca_county", "ca_state", "ca_zip", "ca_country", "ca_gmt_offset"),
        ("ca_location_type",),
    ),
    "customer_demographics": tuple(
        (c,) for c in ("cd_gender", "cd_marital_status", "cd_education_status", "cd_purchase_estimate",
                       "cd_credit_rating", "cd_dep_count", "cd_dep_employed_count", "cd_dep_college_count")
    ),
    "household_demographics": tuple(
        (c,) for c in ("hd_income_band_sk", "hd_buy_potential", "hd_dep_count", "hd_vehicle_count")
    ),
    "store": (
        ("s_city", "s_county", "s_state", "s_zip", "s_country", "s_gmt_offset"),
        ("s_store_name",),
        ("s_number_employees", "s_floor_space", "s_hours", "s_manager", "s_market_id",
         "s_company_id", "s_company_name"),
    ),
    "warehouse": (
        ("w_warehouse_name",),
        ("w_city", "w_county", "w_state", "w_zip", "w_country", "w_gmt_offset"),
    ),
    "ship_mode": (("sm_type",), ("sm_carrier",)),
    "web_site": (("web_name",), ("web_company_name",)),
    "call_center": (("cc_name",), ("cc_county",), ("cc_manager",)),
}

# Dimension rows inserted (and earlier inserts deleted) per round: table -> business id column.
_DIMENSION_INSERTS: dict[str, str] = {
    "item": "i_item_id",
    "customer": "c_customer_id",
    "customer_address": "ca_address_id",
}

# Which dimension rows updates pick: those the facts or customers reference, where the
# dimension is much larger than what references it (customer_demographics has 1.9 M rows).
_REFERENCED_BY: dict[str, tuple[tuple[str, str], ...]] = {
    "customer_demographics": (("customer", "c_current_cdemo_sk"), ("store_sales", "ss_cdemo_sk")),
    "household_demographics": (("customer", "c_current_hdemo_sk"), ("store_sales", "ss_hdemo_sk")),
}

_PROMOTION_FLAGS = ("p_channel_dmail", "p_channel_email", "p_channel_catalog", "p_channel_tv",
                    "p_channel_radio", "p_channel_press", "p_channel_event", "p_channel_demo",
                    "p_discount_active")


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
    """What one :func:`refresh_round` did: the versions of every table before it
    (``start_versions``) and its commits in order. The round's Change Data Feed of table ``t``
    is ``DeltaTable(root/t).load_cdf(starting_version=start_versions[t] + 1)``."""

    round_no: int
    seed: int
    start_versions: Mapping[str, int]
    commits: tuple[RefreshCommit, ...] = field(default=())

    @property
    def end_versions(self) -> dict[str, int]:
        """Version of each touched table after the round."""
        return {c.table: c.version for c in self.commits}

    def rows(self) -> dict[str, dict[str, int]]:
        """Rows changed per table per operation (``insert``, ``delete``, ``update``)."""
        out: dict[str, dict[str, int]] = {}
        for c in self.commits:
            d = out.setdefault(c.table, {})
            d[c.operation] = d.get(c.operation, 0) + c.rows
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable summary."""
        return {"round": self.round_no, "seed": self.seed, "start_versions": dict(self.start_versions),
                "end_versions": self.end_versions, "rows": self.rows(),
                "commits": [{"table": c.table, "operation": c.operation, "version": c.version, "rows": c.rows}
                            for c in self.commits]}


# --------------------------------------------------------------------------- helpers


def _open(root: str, table: str):
    from deltalake import DeltaTable

    path = table_path(root, table)
    options = location.delta_storage_options(path)
    if not DeltaTable.is_deltatable(path, storage_options=options):
        raise FileNotFoundError(
            f"no Delta table at {path}; generate the TPC-DS tables first "
            "(consistent_stream_testing.tpcds.generate.generate)")
    t = DeltaTable(path, storage_options=options)
    if t.metadata().configuration.get(_CDF_KEY) != "true":
        raise ValueError(f"Change Data Feed is off on {path} ({_CDF_KEY} is not 'true')")
    return t


def _read(table, columns: list[str] | None = None) -> pa.Table:
    """Current snapshot (of ``columns``), view types cast to plain ones, sorted by nothing:
    callers sort what they sample from."""
    t = table.to_pyarrow_dataset().to_table(columns=columns)
    fields = [f.with_type(pa.string()) if pa.types.is_string_view(f.type)
              else f.with_type(pa.binary()) if pa.types.is_binary_view(f.type) else f for f in t.schema]
    return t.cast(pa.schema(fields))


def _sorted(t: pa.Table, cols) -> pa.Table:
    return t.take(pc.sort_indices(t, sort_keys=[(c, "ascending") for c in cols]))


def _size(rows: int, fraction: float) -> int:
    return max(1, round(fraction * rows))


def _pick_orders(rnd: random.Random, orders: pa.Array, rows: int, exclude: set) -> list[int]:
    """Whole orders (distinct values of ``orders``, a column with one value per line) of at
    least ``rows`` lines in all, drawn at random, none in ``exclude``."""
    counts = pc.value_counts(orders)
    lines = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))
    candidates = sorted(k for k in lines if k is not None and k not in exclude)
    rnd.shuffle(candidates)
    picked, total = [], 0
    for k in candidates:
        if total >= rows:
            break
        picked.append(k)
        total += lines[k]
    return sorted(picked)


def _sample_rows(rnd: random.Random, t: pa.Table, k: int) -> pa.Table:
    """``min(k, rows)`` distinct rows of ``t`` (in ``t``'s order)."""
    k = max(0, min(k, t.num_rows))
    return t.take(pa.array(sorted(rnd.sample(range(t.num_rows), k)), pa.int64()))


def _donors(rnd: random.Random, t: pa.Table, k: int) -> pa.Table:
    """``k`` rows of ``t`` drawn with replacement (donors of values)."""
    return t.take(pa.array([rnd.randrange(t.num_rows) for _ in range(k)], pa.int64()))


def _not_in(t: pa.Table, column: str, values) -> pa.Table:
    return t.filter(pc.invert(pc.is_in(t.column(column), pa.array(sorted(values), t.schema.field(column).type))))


def _key_not_in(t: pa.Table, keys: list[str], other: pa.Table) -> pa.Table:
    """Rows of ``t`` whose ``keys`` are not a row of ``other`` (same key columns)."""
    if other.num_rows == 0 or t.num_rows == 0:
        return t
    marked = other.select(keys).append_column("__hit", pa.array([True] * other.num_rows))
    joined = t.join(marked, keys=keys, join_type="left outer", use_threads=False)
    return joined.filter(pc.is_null(joined.column("__hit"))).drop_columns(["__hit"]).select(t.column_names)


def _shift(col: pa.ChunkedArray, by: pa.Array) -> pa.Array:
    """``col + by`` (a date surrogate key moved by a number of days), NULL staying NULL."""
    return pc.cast(pc.add(pc.cast(col, pa.int64()), by), pa.int32())


class _Committer:
    """Commits one round's operations, recording each."""

    def __init__(self, root: str, round_no: int, seed: int):
        self.root, self.round_no, self.seed = root, round_no, seed
        self.commits: list[RefreshCommit] = []
        self.tables: dict[str, Any] = {}

    def table(self, name: str):
        if name not in self.tables:
            self.tables[name] = _open(self.root, name)
        return self.tables[name]

    def _props(self, op: str):
        from deltalake import CommitProperties
        return CommitProperties(custom_metadata={"tpcds_refresh_round": str(self.round_no),
                                                 "tpcds_refresh_seed": str(self.seed), "tpcds_refresh_op": op})

    def _record(self, name: str, operation: str, rows: int, planned: int | None) -> None:
        if planned is not None and rows != planned:
            raise RuntimeError(f"{operation} on {name} changed {rows} rows, planned {planned} "
                               f"(round {self.round_no}, seed {self.seed})")
        self.commits.append(RefreshCommit(name, operation, self.table(name).version(), rows))

    def insert(self, name: str, rows: pa.Table) -> None:
        from deltalake import write_deltalake
        if rows.num_rows == 0:
            return
        rows = rows.select(SCHEMAS[name].names).cast(SCHEMAS[name])
        t = self.table(name)
        write_deltalake(t, rows, mode="append", commit_properties=self._props(f"insert_{name}"))
        t.update_incremental()
        self._record(name, "insert", rows.num_rows, rows.num_rows)

    def _merge(self, name: str, source: pa.Table, keys: list[str], op: str, update: dict | None):
        t = self.table(name)
        on = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        m = t.merge(source, on, source_alias="s", target_alias="t", streamed_exec=False,
                    commit_properties=self._props(op))
        m = m.when_matched_update(update) if update else m.when_matched_delete()
        out = m.execute()
        t.update_incremental()
        return out

    def delete(self, name: str, keys: pa.Table, planned: int | None = None) -> None:
        """Delete the rows whose key columns (``keys``' columns) equal a row of ``keys``."""
        if keys.num_rows == 0:
            return
        m = self._merge(name, keys, keys.column_names, f"delete_{name}", None)
        self._record(name, "delete", int(m["num_target_rows_deleted"]), planned)

    def update(self, name: str, rows: pa.Table, keys: list[str]) -> None:
        """Set the non-key columns of ``rows`` on the rows of the same key."""
        if rows.num_rows == 0:
            return
        cols = [c for c in rows.column_names if c not in keys]
        m = self._merge(name, rows, keys, f"update_{name}", {c: f"s.{c}" for c in cols})
        self._record(name, "update", int(m["num_target_rows_updated"]), rows.num_rows)


# ----------------------------------------------------------------------------- facts


def _channel(c: _Committer, rnd: random.Random, spec, fraction: float) -> None:
    sales_name, returns_name, s_order, r_order, s_dates, r_dates = spec
    s_item, r_item = PRIMARY_KEYS[sales_name][0], PRIMARY_KEYS[returns_name][0]
    sales = _sorted(_read(c.table(sales_name)), [s_order, s_item])
    returns = _sorted(_read(c.table(returns_name)), [r_order, r_item])
    if sales.num_rows == 0:
        return
    top = max(pc.max(sales.column(s_order)).as_py() or 0,
              (pc.max(returns.column(r_order)).as_py() or 0) if returns.num_rows else 0)

    # 1. inserts: copies of whole tickets under new numbers, moved to a donor ticket's date
    n = _size(sales.num_rows, fraction)
    sources = _pick_orders(rnd, sales.column(s_order), n, set())
    first_date = s_dates[0]
    dated = sales.filter(pc.is_valid(sales.column(first_date)))
    dates = dated.column(first_date).to_pylist() if dated.num_rows else [None]
    new_number = {old: top + 1 + i for i, old in enumerate(sources)}
    move = {}
    for old in sources:
        move[old] = rnd.choice(dates)
    copied = sales.filter(pc.is_in(sales.column(s_order), pa.array(sources, pa.int64())))
    orders = copied.column(s_order).to_pylist()
    old_date = {}
    for o, d in zip(orders, copied.column(first_date).to_pylist()):
        old_date.setdefault(o, d)
    days = pa.array([(move[o] - old_date[o]) if move[o] is not None and old_date[o] is not None else 0
                     for o in orders], pa.int64())
    new_sales = copied.set_column(copied.schema.get_field_index(s_order), s_order,
                                  pa.array([new_number[o] for o in orders], pa.int64()))
    for col in s_dates:
        new_sales = new_sales.set_column(new_sales.schema.get_field_index(col), col,
                                         _shift(new_sales.column(col), days))
    r_copied = returns.filter(pc.is_in(returns.column(r_order), pa.array(sources, pa.int64())))
    r_orders = r_copied.column(r_order).to_pylist()
    r_days = pa.array([(move[o] - old_date[o]) if move[o] is not None and old_date[o] is not None else 0
                       for o in r_orders], pa.int64())
    new_returns = r_copied.set_column(r_copied.schema.get_field_index(r_order), r_order,
                                      pa.array([new_number[o] for o in r_orders], pa.int64()))
    for col in r_dates:
        new_returns = new_returns.set_column(new_returns.schema.get_field_index(col), col,
                                             _shift(new_returns.column(col), r_days))
    c.insert(sales_name, new_sales)
    c.insert(returns_name, new_returns)

    # 2. deletes: whole tickets (returns first) and some returns alone
    doomed = _pick_orders(rnd, sales.column(s_order), max(1, n // 2), {top})
    doomed_returns = returns.filter(pc.is_in(returns.column(r_order), pa.array(doomed, pa.int64())))
    other_returns = _not_in(returns, r_order, doomed)
    lone = _sample_rows(rnd, other_returns, max(1, _size(returns.num_rows, fraction) // 2)) \
        if other_returns.num_rows else other_returns
    r_keys = list(PRIMARY_KEYS[returns_name])
    c.delete(returns_name, pa.concat_tables([doomed_returns.select(r_keys), lone.select(r_keys)]),
             doomed_returns.num_rows + lone.num_rows)
    c.delete(sales_name, pa.table({s_order: pa.array(doomed, pa.int64())}),
             sales.filter(pc.is_in(sales.column(s_order), pa.array(doomed, pa.int64()))).num_rows)

    # 3. updates of the measures, each row from one donor row
    s_keys = list(PRIMARY_KEYS[sales_name])
    live = _not_in(sales, s_order, doomed)
    _update_measures(c, rnd, sales_name, live, s_keys, n)
    live_r = _key_not_in(_not_in(returns, r_order, doomed), r_keys, lone)
    if live_r.num_rows:
        _update_measures(c, rnd, returns_name, live_r, r_keys, _size(returns.num_rows, fraction))


def _measures(table: str) -> list[str]:
    """A fact table's measure columns: every column that is neither a surrogate key nor the
    ticket or order number."""
    keys = set(PRIMARY_KEYS[table])
    return [f for f in SCHEMAS[table].names if not f.endswith("_sk") and f not in keys]


def _update_measures(c: _Committer, rnd: random.Random, name: str, live: pa.Table, keys: list[str],
                     k: int) -> None:
    chosen = _sample_rows(rnd, live, k)
    donors = _donors(rnd, live, chosen.num_rows)
    rows = chosen.select(keys)
    for m in _measures(name):
        rows = rows.append_column(m, donors.column(m))
    c.update(name, rows, keys)


def _inventory(c: _Committer, rnd: random.Random, fraction: float) -> None:
    keys = list(PRIMARY_KEYS["inventory"])
    inv = _sorted(_read(c.table("inventory")), keys)
    if inv.num_rows == 0:
        return
    n = _size(inv.num_rows, fraction)
    # inserts: copies one to six days later, on keys not present
    base = _sample_rows(rnd, inv, n)
    later = pa.array([rnd.randint(1, 6) for _ in range(base.num_rows)], pa.int64())
    fresh = base.set_column(0, "inv_date_sk", _shift(base.column("inv_date_sk"), later))
    fresh = fresh.set_column(3, "inv_quantity_on_hand",
                             _donors(rnd, inv, fresh.num_rows).column("inv_quantity_on_hand"))
    fresh = _key_not_in(fresh, keys, inv)
    # two copies may land on one key: keep the first
    seen, keep = set(), []
    for key in zip(*(fresh.column(k).to_pylist() for k in keys)):
        keep.append(key not in seen)
        seen.add(key)
    c.insert("inventory", fresh.filter(pa.array(keep)))
    doomed = _sample_rows(rnd, inv, max(1, n // 2))
    c.delete("inventory", doomed.select(keys), doomed.num_rows)
    live = _key_not_in(inv, keys, doomed)
    _update_measures(c, rnd, "inventory", live, keys, n)


# ------------------------------------------------------------------------ dimensions


def _dimension(c: _Committer, rnd: random.Random, name: str, rows: int, referenced: pa.Table | None) -> None:
    key = PRIMARY_KEYS[name][0]
    t = _sorted(_read(c.table(name)), [key])
    if t.num_rows == 0:
        return
    pool = t
    if referenced is not None and referenced.num_rows:
        pool = t.filter(pc.is_in(t.column(key), referenced.column(0)))
        if pool.num_rows == 0:
            pool = t
    chosen = _sample_rows(rnd, pool, min(rows, pool.num_rows))
    out = chosen.select([key])
    for group in _DIMENSION_GROUPS[name]:
        donors = _donors(rnd, t, chosen.num_rows)
        for col in group:
            out = out.append_column(col, donors.column(col))
    c.update(name, out, [key])


def _promotion(c: _Committer, rnd: random.Random, rows: int) -> None:
    t = _sorted(_read(c.table("promotion")), ["p_promo_sk"])
    if t.num_rows == 0:
        return
    chosen = _sample_rows(rnd, t, min(rows, t.num_rows))
    flag = rnd.choice(_PROMOTION_FLAGS)
    flipped = ["N" if v == "Y" else "Y" for v in chosen.column(flag).to_pylist()]
    c.update("promotion", pa.table({"p_promo_sk": chosen.column("p_promo_sk"), flag: pa.array(flipped, pa.string())}),
             ["p_promo_sk"])


def _dimension_inserts(c: _Committer, rnd: random.Random, name: str) -> tuple[pa.Table, pa.Table]:
    """Two new rows of ``name`` (copies under a new key and business id) and one row an
    earlier round inserted, to delete (keys only)."""
    key, bid = PRIMARY_KEYS[name][0], _DIMENSION_INSERTS[name]
    t = _sorted(_read(c.table(name)), [key])
    top = pc.max(t.column(key)).as_py() or 0
    copies = _sample_rows(rnd, t, 2)
    keys = [top + 1 + i for i in range(copies.num_rows)]
    copies = copies.set_column(copies.schema.get_field_index(key), key, pa.array(keys, pa.int32()))
    copies = copies.set_column(copies.schema.get_field_index(bid), bid,
                               pa.array([f"{NEW_ID_PREFIX}{k:011d}" for k in keys], pa.string()))
    earlier = t.filter(pc.starts_with(t.column(bid), NEW_ID_PREFIX))
    return copies, _sample_rows(rnd, earlier, 1).select([key])


# ----------------------------------------------------------------------------- round


def refresh_round(root: str | Path, round_no: int, *, seed: int = 0, fraction: float = 0.01,
                  dimension_rows: int = 10) -> RefreshResult:
    """Apply one refresh round (module docstring) to the TPC-DS Delta tables under ``root``.

    Args:
        root: directory (or S3 URI) with the Delta tables written by ``generate``.
        round_no: round number (>= 1 by convention), part of the seed.
        seed: stream seed; the same ``(seed, round_no)`` on the same data makes the same
            changes.
        fraction: share of each fact table's rows inserted and updated in the round (half as
            many deleted).
        dimension_rows: rows updated per dimension table.

    Returns:
        A :class:`RefreshResult` with the commits and the versions before the round.

    Raises:
        FileNotFoundError: a table is missing under ``root``.
        ValueError: Change Data Feed is off on a table, or ``fraction`` is not in (0, 1].
        RuntimeError: a commit changed a different number of rows than planned.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    root = location.normalize(str(root), key="--dir")
    location.check_reachable(root, key="--dir")
    c = _Committer(root, round_no, seed)
    touched = ([t for ch in _CHANNELS for t in ch[:2]] + ["inventory"] + list(_DIMENSION_GROUPS) + ["promotion"])
    start = {t: c.table(t).version() for t in touched}
    # the stream's name from before the package moved (consistent_stream.*): kept, so every round's rows stay the same
    rnd = random.Random(f"consistent_stream.tpcds.refresh:{seed}:{round_no}")
    for spec in _CHANNELS:
        _channel(c, rnd, spec, fraction)
    _inventory(c, rnd, fraction)
    # dimension rows in and out first: their updates then pick from the rows of the round
    doomed: dict[str, pa.Table] = {}
    for name in _DIMENSION_INSERTS:
        new, doomed[name] = _dimension_inserts(c, rnd, name)
        c.insert(name, new)
    for name in _DIMENSION_GROUPS:
        referenced = None
        if name in _REFERENCED_BY:
            referenced = pa.table({"k": pa.concat_arrays([
                pc.unique(_read(c.table(t), [col]).column(col).combine_chunks().drop_null())
                for t, col in _REFERENCED_BY[name]])})
        _dimension(c, rnd, name, dimension_rows, referenced)
    _promotion(c, rnd, 1)
    for name, keys in doomed.items():
        c.delete(name, keys, keys.num_rows)
    return RefreshResult(round_no=round_no, seed=seed, start_versions=MappingProxyType(start),
                         commits=tuple(c.commits))
