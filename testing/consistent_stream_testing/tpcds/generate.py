"""Generate the TPC-DS source tables as Delta tables with Change Data Feed on.

The data comes from ``tpcgen-cli`` (PyPI package ``tpcgen-cli``, a Rust port of TPC-DS
``dsdgen``; ``tpcgen-cli tpcds parquet -s SF --output-dir DIR`` writes ``DIR/<table>.parquet``),
copied into one Delta table per TPC-DS table with :func:`deltalake.write_deltalake`, table
property ``delta.enableChangeDataFeed=true``. The root is a local directory or an S3 URI, as
for :mod:`consistent_stream_testing.tpch.generate`.

The 24 tables of the TPC-DS schema are written (:data:`ALL`; ``dbgen_version``, the
generator's own metadata, is not). Column names are TPC-DS's, lower case. Types are the ones
``tpcgen-cli`` 4 writes, with ``string_view`` turned into plain ``string`` (Spark's Parquet
reader does not know the view types) and no Parquet field ids: surrogate keys and other
integers ``int32``, ticket and order numbers ``int64``, money and measures
``decimal128(7, 2)`` (``decimal128(5, 2)`` for GMT offsets and tax percentages,
``decimal128(15, 2)`` for ``p_cost``), dates ``date32``. Surrogate keys (``*_sk`` of a
dimension, the key columns of a fact table) and business ids (``*_id``) are NOT NULL, every
other column nullable, as in the TPC-DS specification. The exact Arrow schemas are in
:data:`SCHEMAS`, the primary keys in :data:`PRIMARY_KEYS` (checked unique in the generated
data at SF 0.01 and 0.1).

At SF 0.01 ``tpcgen-cli`` writes 120,527 ``store_sales`` rows, 89,807 ``catalog_sales``,
11,876 ``web_sales``, 261,261 ``inventory`` and the fixed-size dimensions (1,920,800
``customer_demographics``, 73,049 ``date_dim``, 86,400 ``time_dim``), in about a second.
``sample=k`` keeps a consistent subset for tests that need data of a few thousand rows (see
:func:`generate`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from consistent_stream import location, storage

__all__ = [
    "ALL",
    "CDF_CONFIGURATION",
    "DIMENSIONS",
    "FACTS",
    "PRIMARY_KEYS",
    "SAMPLE_KEYS",
    "SCHEMAS",
    "TpcdsGenError",
    "generate",
    "table_path",
    "tpcgen_executable",
]

#: The dimension tables, referenced tables first.
DIMENSIONS: tuple[str, ...] = (
    "date_dim",
    "time_dim",
    "income_band",
    "household_demographics",
    "customer_demographics",
    "customer_address",
    "customer",
    "item",
    "promotion",
    "reason",
    "ship_mode",
    "store",
    "warehouse",
    "call_center",
    "catalog_page",
    "web_site",
    "web_page",
)

#: The fact tables: each channel's sales before its returns, then inventory.
FACTS: tuple[str, ...] = (
    "store_sales",
    "store_returns",
    "catalog_sales",
    "catalog_returns",
    "web_sales",
    "web_returns",
    "inventory",
)

#: All TPC-DS tables, in dependency order (referenced tables first).
ALL: tuple[str, ...] = DIMENSIONS + FACTS

#: Table properties every generated table gets.
CDF_CONFIGURATION: dict[str, str] = {"delta.enableChangeDataFeed": "true"}

#: Each table's primary key: a dimension's surrogate key, a sales or returns line's item and
#: ticket or order number, an inventory row's date, item and warehouse. Every one is unique in
#: the data ``tpcgen-cli`` 4 writes (checked at SF 0.01 and 0.1) and stays so through
#: :func:`consistent_stream_testing.tpcds.refresh.refresh_round`.
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "date_dim": ("d_date_sk",),
    "time_dim": ("t_time_sk",),
    "income_band": ("ib_income_band_sk",),
    "household_demographics": ("hd_demo_sk",),
    "customer_demographics": ("cd_demo_sk",),
    "customer_address": ("ca_address_sk",),
    "customer": ("c_customer_sk",),
    "item": ("i_item_sk",),
    "promotion": ("p_promo_sk",),
    "reason": ("r_reason_sk",),
    "ship_mode": ("sm_ship_mode_sk",),
    "store": ("s_store_sk",),
    "warehouse": ("w_warehouse_sk",),
    "call_center": ("cc_call_center_sk",),
    "catalog_page": ("cp_catalog_page_sk",),
    "web_site": ("web_site_sk",),
    "web_page": ("wp_web_page_sk",),
    "store_sales": ("ss_item_sk", "ss_ticket_number"),
    "store_returns": ("sr_item_sk", "sr_ticket_number"),
    "catalog_sales": ("cs_item_sk", "cs_order_number"),
    "catalog_returns": ("cr_item_sk", "cr_order_number"),
    "web_sales": ("ws_item_sk", "ws_order_number"),
    "web_returns": ("wr_item_sk", "wr_order_number"),
    "inventory": ("inv_date_sk", "inv_item_sk", "inv_warehouse_sk"),
}

#: The column ``generate(sample=k)`` keeps a fact row by (``column % k == 0``): the ticket or
#: order number (a sale and its returns are kept together), an inventory row's item.
SAMPLE_KEYS: dict[str, str] = {
    "store_sales": "ss_ticket_number",
    "store_returns": "sr_ticket_number",
    "catalog_sales": "cs_order_number",
    "catalog_returns": "cr_order_number",
    "web_sales": "ws_order_number",
    "web_returns": "wr_order_number",
    "inventory": "inv_item_sk",
}

# The columns referencing customer_demographics: with ``sample``, the rows they reference.
_CDEMO_REFERENCES: dict[str, tuple[str, ...]] = {
    "customer": ("c_current_cdemo_sk",),
    "store_sales": ("ss_cdemo_sk",),
    "store_returns": ("sr_cdemo_sk",),
    "catalog_sales": ("cs_bill_cdemo_sk", "cs_ship_cdemo_sk"),
    "catalog_returns": ("cr_refunded_cdemo_sk", "cr_returning_cdemo_sk"),
    "web_sales": ("ws_bill_cdemo_sk", "ws_ship_cdemo_sk"),
    "web_returns": ("wr_refunded_cdemo_sk", "wr_returning_cdemo_sk"),
}

_TYPES = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "str": pa.string(),
    "date": pa.date32(),
    "dec(5,2)": pa.decimal128(5, 2),
    "dec(7,2)": pa.decimal128(7, 2),
    "dec(15,2)": pa.decimal128(15, 2),
}


def _schema(spec: str) -> pa.Schema:
    """``"name type[!], ..."`` (``!``: NOT NULL) as an Arrow schema."""
    fields = []
    for col in re.split(r",\s+", spec.strip()):
        name, typ = col.split()
        fields.append(pa.field(name, _TYPES[typ.rstrip("!")], nullable=not typ.endswith("!")))
    return pa.schema(fields)


_SPECS: dict[str, str] = {
    "date_dim": (
        "d_date_sk int!, d_date_id str!, d_date date, d_month_seq int, d_week_seq int, "
        "d_quarter_seq int, d_year int, d_dow int, d_moy int, d_dom int, d_qoy int, d_fy_year "
        "int, d_fy_quarter_seq int, d_fy_week_seq int, d_day_name str, d_quarter_name str, "
        "d_holiday str, d_weekend str, d_following_holiday str, d_first_dom int, d_last_dom int, "
        "d_same_day_ly int, d_same_day_lq int, d_current_day str, d_current_week str, "
        "d_current_month str, d_current_quarter str, d_current_year str"
    ),
    "time_dim": (
        "t_time_sk int!, t_time_id str!, t_time int, t_hour int, t_minute int, t_second int, "
        "t_am_pm str, t_shift str, t_sub_shift str, t_meal_time str"
    ),
    "income_band": (
        "ib_income_band_sk int!, ib_lower_bound int, ib_upper_bound int"
    ),
    "household_demographics": (
        "hd_demo_sk int!, hd_income_band_sk int, hd_buy_potential str, hd_dep_count int, "
        "hd_vehicle_count int"
    ),
    "customer_demographics": (
        "cd_demo_sk int!, cd_gender str, cd_marital_status str, cd_education_status str, "
        "cd_purchase_estimate int, cd_credit_rating str, cd_dep_count int, cd_dep_employed_count "
        "int, cd_dep_college_count int"
    ),
    "customer_address": (
        "ca_address_sk int!, ca_address_id str!, ca_street_number str, ca_street_name str, "
        "ca_street_type str, ca_suite_number str, ca_city str, ca_county str, ca_state str, "
        "ca_zip str, ca_country str, ca_gmt_offset dec(5,2), ca_location_type str"
    ),
    "customer": (
        "c_customer_sk int!, c_customer_id str!, c_current_cdemo_sk int, c_current_hdemo_sk int, "
        "c_current_addr_sk int, c_first_shipto_date_sk int, c_first_sales_date_sk int, "
        "c_salutation str, c_first_name str, c_last_name str, c_preferred_cust_flag str, "
        "c_birth_day int, c_birth_month int, c_birth_year int, c_birth_country str, c_login str, "
        "c_email_address str, c_last_review_date_sk int"
    ),
    "item": (
        "i_item_sk int!, i_item_id str!, i_rec_start_date date, i_rec_end_date date, i_item_desc "
        "str, i_current_price dec(7,2), i_wholesale_cost dec(7,2), i_brand_id int, i_brand str, "
        "i_class_id int, i_class str, i_category_id int, i_category str, i_manufact_id int, "
        "i_manufact str, i_size str, i_formulation str, i_color str, i_units str, i_container "
        "str, i_manager_id int, i_product_name str"
    ),
    "promotion": (
        "p_promo_sk int!, p_promo_id str!, p_start_date_sk int, p_end_date_sk int, p_item_sk int, "
        "p_cost dec(15,2), p_response_target int, p_promo_name str, p_channel_dmail str, "
        "p_channel_email str, p_channel_catalog str, p_channel_tv str, p_channel_radio str, "
        "p_channel_press str, p_channel_event str, p_channel_demo str, p_channel_details str, "
        "p_purpose str, p_discount_active str"
    ),
    "reason": (
        "r_reason_sk int!, r_reason_id str!, r_reason_desc str"
    ),
    "ship_mode": (
        "sm_ship_mode_sk int!, sm_ship_mode_id str!, sm_type str, sm_code str, sm_carrier str, "
        "sm_contract str"
    ),
    "store": (
        "s_store_sk int!, s_store_id str!, s_rec_start_date date, s_rec_end_date date, "
        "s_closed_date_sk int, s_store_name str, s_number_employees int, s_floor_space int, "
        "s_hours str, s_manager str, s_market_id int, s_geography_class str, s_market_desc str, "
        "s_market_manager str, s_division_id int, s_division_name str, s_company_id int, "
        "s_company_name str, s_street_number str, s_street_name str, s_street_type str, "
        "s_suite_number str, s_city str, s_county str, s_state str, s_zip str, s_country str, "
        "s_gmt_offset dec(5,2), s_tax_precentage dec(5,2)"
    ),
    "warehouse": (
        "w_warehouse_sk int!, w_warehouse_id str!, w_warehouse_name str, w_warehouse_sq_ft int, "
        "w_street_number str, w_street_name str, w_street_type str, w_suite_number str, w_city "
        "str, w_county str, w_state str, w_zip str, w_country str, w_gmt_offset dec(5,2)"
    ),
    "call_center": (
        "cc_call_center_sk int!, cc_call_center_id str!, cc_rec_start_date date, cc_rec_end_date "
        "date, cc_closed_date_sk int, cc_open_date_sk int, cc_name str, cc_class str, "
        "cc_employees int, cc_sq_ft int, cc_hours str, cc_manager str, cc_mkt_id int, "
        "cc_mkt_class str, cc_mkt_desc str, cc_market_manager str, cc_division int, "
        "cc_division_name str, cc_company int, cc_company_name str, cc_street_number str, "
        "cc_street_name str, cc_street_type str, cc_suite_number str, cc_city str, cc_county str, "
        "cc_state str, cc_zip str, cc_country str, cc_gmt_offset dec(5,2), cc_tax_percentage "
        "dec(5,2)"
    ),
    "catalog_page": (
        "cp_catalog_page_sk int!, cp_catalog_page_id str!, cp_start_date_sk int, cp_end_date_sk "
        "int, cp_department str, cp_catalog_number int, cp_catalog_page_number int, "
        "cp_description str, cp_type str"
    ),
    "web_site": (
        "web_site_sk int!, web_site_id str!, web_rec_start_date date, web_rec_end_date date, "
        "web_name str, web_open_date_sk int, web_close_date_sk int, web_class str, web_manager "
        "str, web_mkt_id int, web_mkt_class str, web_mkt_desc str, web_market_manager str, "
        "web_company_id int, web_company_name str, web_street_number str, web_street_name str, "
        "web_street_type str, web_suite_number str, web_city str, web_county str, web_state str, "
        "web_zip str, web_country str, web_gmt_offset dec(5,2), web_tax_percentage dec(5,2)"
    ),
    "web_page": (
        "wp_web_page_sk int!, wp_web_page_id str!, wp_rec_start_date date, wp_rec_end_date date, "
        "wp_creation_date_sk int, wp_access_date_sk int, wp_autogen_flag str, wp_customer_sk int, "
        "wp_url str, wp_type str, wp_char_count int, wp_link_count int, wp_image_count int, "
        "wp_max_ad_count int"
    ),
    "store_sales": (
        "ss_sold_date_sk int, ss_sold_time_sk int, ss_item_sk int!, ss_customer_sk int, "
        "ss_cdemo_sk int, ss_hdemo_sk int, ss_addr_sk int, ss_store_sk int, ss_promo_sk int, "
        "ss_ticket_number bigint!, ss_quantity int, ss_wholesale_cost dec(7,2), ss_list_price "
        "dec(7,2), ss_sales_price dec(7,2), ss_ext_discount_amt dec(7,2), ss_ext_sales_price "
        "dec(7,2), ss_ext_wholesale_cost dec(7,2), ss_ext_list_price dec(7,2), ss_ext_tax "
        "dec(7,2), ss_coupon_amt dec(7,2), ss_net_paid dec(7,2), ss_net_paid_inc_tax dec(7,2), "
        "ss_net_profit dec(7,2)"
    ),
    "store_returns": (
        "sr_returned_date_sk int, sr_return_time_sk int, sr_item_sk int!, sr_customer_sk int, "
        "sr_cdemo_sk int, sr_hdemo_sk int, sr_addr_sk int, sr_store_sk int, sr_reason_sk int, "
        "sr_ticket_number bigint!, sr_return_quantity int, sr_return_amt dec(7,2), sr_return_tax "
        "dec(7,2), sr_return_amt_inc_tax dec(7,2), sr_fee dec(7,2), sr_return_ship_cost dec(7,2), "
        "sr_refunded_cash dec(7,2), sr_reversed_charge dec(7,2), sr_store_credit dec(7,2), "
        "sr_net_loss dec(7,2)"
    ),
    "catalog_sales": (
        "cs_sold_date_sk int, cs_sold_time_sk int, cs_ship_date_sk int, cs_bill_customer_sk int, "
        "cs_bill_cdemo_sk int, cs_bill_hdemo_sk int, cs_bill_addr_sk int, cs_ship_customer_sk "
        "int, cs_ship_cdemo_sk int, cs_ship_hdemo_sk int, cs_ship_addr_sk int, cs_call_center_sk "
        "int, cs_catalog_page_sk int, cs_ship_mode_sk int, cs_warehouse_sk int, cs_item_sk int!, "
        "cs_promo_sk int, cs_order_number bigint!, cs_quantity int, cs_wholesale_cost dec(7,2), "
        "cs_list_price dec(7,2), cs_sales_price dec(7,2), cs_ext_discount_amt dec(7,2), "
        "cs_ext_sales_price dec(7,2), cs_ext_wholesale_cost dec(7,2), cs_ext_list_price dec(7,2), "
        "cs_ext_tax dec(7,2), cs_coupon_amt dec(7,2), cs_ext_ship_cost dec(7,2), cs_net_paid "
        "dec(7,2), cs_net_paid_inc_tax dec(7,2), cs_net_paid_inc_ship dec(7,2), "
        "cs_net_paid_inc_ship_tax dec(7,2), cs_net_profit dec(7,2)"
    ),
    "catalog_returns": (
        "cr_returned_date_sk int, cr_returned_time_sk int, cr_item_sk int!, "
        "cr_refunded_customer_sk int, cr_refunded_cdemo_sk int, cr_refunded_hdemo_sk int, "
        "cr_refunded_addr_sk int, cr_returning_customer_sk int, cr_returning_cdemo_sk int, "
        "cr_returning_hdemo_sk int, cr_returning_addr_sk int, cr_call_center_sk int, "
        "cr_catalog_page_sk int, cr_ship_mode_sk int, cr_warehouse_sk int, cr_reason_sk int, "
        "cr_order_number bigint!, cr_return_quantity int, cr_return_amount dec(7,2), "
        "cr_return_tax dec(7,2), cr_return_amt_inc_tax dec(7,2), cr_fee dec(7,2), "
        "cr_return_ship_cost dec(7,2), cr_refunded_cash dec(7,2), cr_reversed_charge dec(7,2), "
        "cr_store_credit dec(7,2), cr_net_loss dec(7,2)"
    ),
    "web_sales": (
        "ws_sold_date_sk int, ws_sold_time_sk int, ws_ship_date_sk int, ws_item_sk int!, "
        "ws_bill_customer_sk int, ws_bill_cdemo_sk int, ws_bill_hdemo_sk int, ws_bill_addr_sk "
        "int, ws_ship_customer_sk int, ws_ship_cdemo_sk int, ws_ship_hdemo_sk int, "
        "ws_ship_addr_sk int, ws_web_page_sk int, ws_web_site_sk int, ws_ship_mode_sk int, "
        "ws_warehouse_sk int, ws_promo_sk int, ws_order_number bigint!, ws_quantity int, "
        "ws_wholesale_cost dec(7,2), ws_list_price dec(7,2), ws_sales_price dec(7,2), "
        "ws_ext_discount_amt dec(7,2), ws_ext_sales_price dec(7,2), ws_ext_wholesale_cost "
        "dec(7,2), ws_ext_list_price dec(7,2), ws_ext_tax dec(7,2), ws_coupon_amt dec(7,2), "
        "ws_ext_ship_cost dec(7,2), ws_net_paid dec(7,2), ws_net_paid_inc_tax dec(7,2), "
        "ws_net_paid_inc_ship dec(7,2), ws_net_paid_inc_ship_tax dec(7,2), ws_net_profit dec(7,2)"
    ),
    "web_returns": (
        "wr_returned_date_sk int, wr_returned_time_sk int, wr_item_sk int!, "
        "wr_refunded_customer_sk int, wr_refunded_cdemo_sk int, wr_refunded_hdemo_sk int, "
        "wr_refunded_addr_sk int, wr_returning_customer_sk int, wr_returning_cdemo_sk int, "
        "wr_returning_hdemo_sk int, wr_returning_addr_sk int, wr_web_page_sk int, wr_reason_sk "
        "int, wr_order_number bigint!, wr_return_quantity int, wr_return_amt dec(7,2), "
        "wr_return_tax dec(7,2), wr_return_amt_inc_tax dec(7,2), wr_fee dec(7,2), "
        "wr_return_ship_cost dec(7,2), wr_refunded_cash dec(7,2), wr_reversed_charge dec(7,2), "
        "wr_account_credit dec(7,2), wr_net_loss dec(7,2)"
    ),
    "inventory": (
        "inv_date_sk int!, inv_item_sk int!, inv_warehouse_sk int!, inv_quantity_on_hand int"
    ),
}

#: Arrow schema of every Delta table this module writes, by table name.
SCHEMAS: dict[str, pa.Schema] = {t: _schema(_SPECS[t]) for t in ALL}

# Rows per Arrow batch streamed from Parquet into delta-rs (bounds memory at large SF).
_BATCH_ROWS = 256 * 1024


class TpcdsGenError(RuntimeError):
    """``tpcgen-cli`` is missing, failed, or produced something unexpected."""


def table_path(root: str | Path, table: str) -> str:
    """Location of the Delta table of TPC-DS ``table`` under ``root``, a local directory or an
    S3 URI: ``root/table`` (:func:`location.join`)."""
    return location.join(str(root), table)


def tpcgen_executable() -> str:
    """Path of the ``tpcgen-cli`` console script: next to the running Python interpreter (the
    virtual environment's ``bin``), else on ``PATH``.

    Raises:
        TpcdsGenError: if it is not installed (``pip install tpcgen-cli``).
    """
    local = Path(sys.executable).parent / "tpcgen-cli"
    if local.is_file():
        return str(local)
    found = shutil.which("tpcgen-cli")
    if found:
        return found
    raise TpcdsGenError(
        "tpcgen-cli not found next to the Python interpreter "
        f"({local.parent}) nor on PATH; it is installed by the PyPI package "
        "'tpcgen-cli' (pip install tpcgen-cli)"
    )


def _normalize_tables(tables: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tables, str):
        tables = [tables]
    wanted = {t.lower() for t in tables}
    unknown = sorted(wanted - set(ALL))
    if unknown:
        raise ValueError(f"unknown TPC-DS table(s) {unknown}; expected a subset of {list(ALL)}")
    if not wanted:
        raise ValueError("no tables to generate")
    return tuple(t for t in ALL if t in wanted)


def _run_tpcgen(sf: float, out_dir: Path, tables: tuple[str, ...]) -> None:
    cmd = [
        tpcgen_executable(),
        "tpcds",
        "parquet",
        f"--scale-factor={sf}",
        f"--output-dir={out_dir}",
        f"--tables={','.join(tables)}",
        "--field-ids=false",
        "--quiet",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TpcdsGenError(
            f"tpcgen-cli failed with exit code {proc.returncode}: {' '.join(cmd)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )


def _parquet_files(out_dir: Path, table: str) -> list[Path]:
    single = out_dir / f"{table}.parquet"
    if single.is_file():
        return [single]
    parts = sorted((out_dir / table).glob("*.parquet")) if (out_dir / table).is_dir() else []
    if not parts:
        raise TpcdsGenError(f"tpcgen-cli produced no Parquet file for table {table!r} in {out_dir}")
    return parts


def _batches(files: list[Path], table: str, keep=None) -> Iterator[pa.RecordBatch]:
    """The rows of ``files`` in :data:`SCHEMAS` ``[table]`` (the cast also drops Parquet field
    metadata), only those ``keep(batch)`` marks when given."""
    schema = SCHEMAS[table]
    for f in files:
        pf = pq.ParquetFile(f)
        got = pf.schema_arrow.names
        if got != schema.names:
            raise TpcdsGenError(
                f"unexpected columns in {f}: {got}; expected {schema.names} "
                "(a different tpcgen-cli version?)"
            )
        for batch in pf.iter_batches(batch_size=_BATCH_ROWS):
            batch = batch.cast(schema)
            if keep is not None:
                batch = batch.filter(keep(batch))
            yield batch


def _prepare_target(path: str) -> bool:
    """Return whether ``path`` already holds a Delta table; refuse to clobber other data."""
    from deltalake import DeltaTable

    if DeltaTable.is_deltatable(path, storage_options=location.delta_storage_options(path)):
        return True
    if storage.exists(path) and (not storage.is_dir(path) or storage.list_dir(path)):
        raise FileExistsError(f"{path} exists and is not a Delta table; refusing to overwrite it")
    return False


def _write_delta(path: str, table: str, batches: Iterator[pa.RecordBatch]) -> int:
    from deltalake import DeltaTable, write_deltalake

    existed = _prepare_target(path)
    storage.make_dirs(path)
    options = location.delta_storage_options(path)
    rows = [0]

    def counted() -> Iterator[pa.RecordBatch]:
        for b in batches:
            rows[0] += b.num_rows
            yield b
    write_deltalake(
        path,
        pa.RecordBatchReader.from_batches(SCHEMAS[table], counted()),
        mode="overwrite",
        schema_mode="overwrite" if existed else None,
        configuration=CDF_CONFIGURATION,
        storage_options=options,
    )
    dt = DeltaTable(path, storage_options=options)
    if dt.metadata().configuration.get("delta.enableChangeDataFeed") != "true":
        # Overwriting an existing table may keep its old properties: turn CDF on.
        dt.alter.set_table_properties(CDF_CONFIGURATION)
    return rows[0]


def _sample_filter(table: str, k: int):
    column = SAMPLE_KEYS[table]
    return lambda batch: pc.equal(pc.remainder(batch.column(column), k), 0)


def _cdemo_filter(referenced: pa.Array):
    return lambda batch: pc.is_in(batch.column("cd_demo_sk"), referenced)


def _referenced_cdemo(out_dir: Path, k: int) -> pa.Array:
    """The ``cd_demo_sk`` values the sampled fact rows and the customers reference."""
    seen: list[pa.Array] = []
    for table, columns in _CDEMO_REFERENCES.items():
        keep = _sample_filter(table, k) if table in SAMPLE_KEYS else None
        for batch in _batches(_parquet_files(out_dir, table), table, keep):
            seen += [pc.unique(batch.column(c).drop_null()) for c in columns]
    return pc.unique(pa.chunked_array(seen, pa.int32())) if seen else pa.array([], pa.int32())


def generate(
    sf: float,
    root: str | Path,
    *,
    tables: Iterable[str] = ALL,
    sample: int | None = None,
) -> dict[str, int]:
    """Generate TPC-DS at scale factor ``sf`` as Delta tables under ``root``.

    Each table is written to ``root/<table>`` (:data:`ALL`) with table property
    ``delta.enableChangeDataFeed=true``, in one ``WRITE`` commit. A table that already exists
    there is overwritten by a new version (it stays a Delta table, CDF stays on). Schemas:
    :data:`SCHEMAS`; keys: :data:`PRIMARY_KEYS`.

    Args:
        sf: TPC-DS scale factor (> 0; 1 is about 1 GB). ``tpcgen-cli`` takes fractions such
            as 0.01.
        root: directory holding one Delta table per TPC-DS table, created if missing; or an S3
            URI ``s3://bucket/prefix``.
        tables: which tables to (re)generate; default all 24.
        sample: keep one in ``sample`` of the fact rows, a consistent subset: the sales lines
            and returns of the tickets and orders whose number is a multiple of ``sample`` (a
            sale's returns stay with it), the inventory of the items whose ``inv_item_sk`` is
            one; and of ``customer_demographics`` only the rows that the kept fact rows or a
            customer reference. The other dimensions are whole. None (default): everything
            ``tpcgen-cli`` writes.

    Returns:
        Rows written per table.

    Raises:
        ValueError: ``sf`` is not positive, ``sample`` is below 1, or a table name is unknown.
        TpcdsGenError: ``tpcgen-cli`` is missing (PyPI package ``tpcgen-cli``) or failed.
        FileExistsError: ``root/<table>`` exists but is not a Delta table.
    """
    if not sf > 0:
        raise ValueError(f"scale factor must be > 0, got {sf!r}")
    if sample is not None and (not isinstance(sample, int) or sample < 1):
        raise ValueError(f"sample must be a positive integer, got {sample!r}")
    names = _normalize_tables(tables)
    root = location.normalize(str(root), key="--dir")
    storage.make_dirs(root)
    location.check_reachable(root, key="--dir")
    for t in names:  # fail before generating anything
        _prepare_target(table_path(root, t))
    wanted = names
    if sample is not None and "customer_demographics" in names:
        # its rows are the ones the facts and customers reference: generate those too
        wanted = tuple(t for t in ALL if t in names or t in _CDEMO_REFERENCES)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="tpcgen-") as tmp:
        out_dir = Path(tmp)
        _run_tpcgen(sf, out_dir, wanted)
        for t in names:
            keep = None
            if sample is not None and sample > 1 and t in SAMPLE_KEYS:
                keep = _sample_filter(t, sample)
            elif sample is not None and sample > 1 and t == "customer_demographics":
                keep = _cdemo_filter(_referenced_cdemo(out_dir, sample))
            counts[t] = _write_delta(table_path(root, t), t, _batches(_parquet_files(out_dir, t), t, keep))
    return counts
