"""Generate the TPC-H source tables as Delta tables, with Change Data Feed on (or off, per table).

The data comes from ``tpchgen-cli`` (PyPI package ``tpchgen-cli``, a Rust port of
TPC-H ``dbgen``), written as Parquet into a temporary directory and then copied into
one Delta table per TPC-H table with :func:`deltalake.write_deltalake`. The tables' root is
a local directory or an S3 URI (``s3://bucket/prefix``): delta-rs reaches it with
:func:`consistent_stream.location.delta_storage_options` (the AWS chain's endpoint and
credentials, conditional-put commits).

Column names are TPC-H's, lower case (``o_orderkey``, ``l_extendedprice`` ...). Types
are the ones ``tpchgen-cli`` produces, with ``string_view`` turned into plain
``string`` (Spark's Parquet reader does not know the view types) and the Parquet
field-id metadata dropped:

* keys (``*_custkey``, ``*_orderkey``, ``*_partkey``, ``*_suppkey``, ``*_nationkey``,
  ``*_regionkey``): ``int64``
* small integers (``l_linenumber``, ``o_shippriority``, ``p_size``, ``ps_availqty``):
  ``int32``
* money, quantities and rates (``*_acctbal``, ``*_price``, ``l_quantity``,
  ``l_discount``, ``l_tax``, ``p_retailprice``, ``ps_supplycost``):
  ``decimal128(15, 2)``; money is in dollars, discount and tax are fractions (0.05 = 5 %)
* dates (``o_orderdate``, ``l_shipdate``, ``l_commitdate``, ``l_receiptdate``):
  ``date32`` (days)
* everything else: ``string``

All columns are NOT NULL. The exact Arrow schemas are in :data:`SCHEMAS`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from consistent_stream import location, storage

__all__ = [
    "ALL",
    "CDF_CONFIGURATION",
    "SCHEMAS",
    "TpchGenError",
    "generate",
    "table_path",
    "tpchgen_executable",
]

#: All TPC-H tables, in dependency order (referenced tables first).
ALL: tuple[str, ...] = (
    "region",
    "nation",
    "supplier",
    "customer",
    "part",
    "partsupp",
    "orders",
    "lineitem",
)

#: Table properties every generated table gets.
CDF_CONFIGURATION: dict[str, str] = {"delta.enableChangeDataFeed": "true"}

_I64 = pa.int64()
_I32 = pa.int32()
_STR = pa.string()
_DEC = pa.decimal128(15, 2)
_DATE = pa.date32()


def _schema(*cols: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(name, typ, nullable=False) for name, typ in cols])


#: Arrow schema of every Delta table this module writes (all fields NOT NULL).
SCHEMAS: dict[str, pa.Schema] = {
    "region": _schema(("r_regionkey", _I64), ("r_name", _STR), ("r_comment", _STR)),
    "nation": _schema(
        ("n_nationkey", _I64), ("n_name", _STR), ("n_regionkey", _I64), ("n_comment", _STR)
    ),
    "supplier": _schema(
        ("s_suppkey", _I64),
        ("s_name", _STR),
        ("s_address", _STR),
        ("s_nationkey", _I64),
        ("s_phone", _STR),
        ("s_acctbal", _DEC),
        ("s_comment", _STR),
    ),
    "customer": _schema(
        ("c_custkey", _I64),
        ("c_name", _STR),
        ("c_address", _STR),
        ("c_nationkey", _I64),
        ("c_phone", _STR),
        ("c_acctbal", _DEC),
        ("c_mktsegment", _STR),
        ("c_comment", _STR),
    ),
    "part": _schema(
        ("p_partkey", _I64),
        ("p_name", _STR),
        ("p_mfgr", _STR),
        ("p_brand", _STR),
        ("p_type", _STR),
        ("p_size", _I32),
        ("p_container", _STR),
        ("p_retailprice", _DEC),
        ("p_comment", _STR),
    ),
    "partsupp": _schema(
        ("ps_partkey", _I64),
        ("ps_suppkey", _I64),
        ("ps_availqty", _I32),
        ("ps_supplycost", _DEC),
        ("ps_comment", _STR),
    ),
    "orders": _schema(
        ("o_orderkey", _I64),
        ("o_custkey", _I64),
        ("o_orderstatus", _STR),
        ("o_totalprice", _DEC),
        ("o_orderdate", _DATE),
        ("o_orderpriority", _STR),
        ("o_clerk", _STR),
        ("o_shippriority", _I32),
        ("o_comment", _STR),
    ),
    "lineitem": _schema(
        ("l_orderkey", _I64),
        ("l_partkey", _I64),
        ("l_suppkey", _I64),
        ("l_linenumber", _I32),
        ("l_quantity", _DEC),
        ("l_extendedprice", _DEC),
        ("l_discount", _DEC),
        ("l_tax", _DEC),
        ("l_returnflag", _STR),
        ("l_linestatus", _STR),
        ("l_shipdate", _DATE),
        ("l_commitdate", _DATE),
        ("l_receiptdate", _DATE),
        ("l_shipinstruct", _STR),
        ("l_shipmode", _STR),
        ("l_comment", _STR),
    ),
}

# Rows per Arrow batch streamed from Parquet into delta-rs (bounds memory at SF >= 1).
_BATCH_ROWS = 256 * 1024


class TpchGenError(RuntimeError):
    """``tpchgen-cli`` is missing, failed, or produced something unexpected."""


def table_path(root: str | Path, table: str) -> str:
    """Location of the Delta table of TPC-H ``table`` (lower-case name) under ``root``, a
    local directory or an S3 URI: ``root/table`` as a string (:func:`location.join`)."""
    return location.join(str(root), table)


def tpchgen_executable() -> str:
    """Path of the ``tpchgen-cli`` console script.

    Looks next to the running Python interpreter first (the virtual environment's
    ``bin``), then on ``PATH``.

    Raises:
        TpchGenError: if it is not installed (``pip install tpchgen-cli``).
    """
    local = Path(sys.executable).parent / "tpchgen-cli"
    if local.is_file():
        return str(local)
    found = shutil.which("tpchgen-cli")
    if found:
        return found
    raise TpchGenError(
        "tpchgen-cli not found next to the Python interpreter "
        f"({local.parent}) nor on PATH; it is installed by the PyPI package "
        "'tpchgen-cli' (pip install tpchgen-cli)"
    )


def _normalize_tables(tables: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tables, str):
        tables = [tables]
    wanted = {t.lower() for t in tables}
    unknown = sorted(wanted - set(ALL))
    if unknown:
        raise ValueError(f"unknown TPC-H table(s) {unknown}; expected a subset of {list(ALL)}")
    if not wanted:
        raise ValueError("no tables to generate")
    return tuple(t for t in ALL if t in wanted)


def _run_tpchgen(sf: float, out_dir: Path, tables: tuple[str, ...]) -> None:
    cmd = [
        tpchgen_executable(),
        "parquet",
        f"--scale-factor={sf}",
        f"--output-dir={out_dir}",
        f"--tables={','.join(tables)}",
        "--quiet",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TpchGenError(
            f"tpchgen-cli failed with exit code {proc.returncode}: {' '.join(cmd)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )


def _parquet_files(out_dir: Path, table: str) -> list[Path]:
    single = out_dir / f"{table}.parquet"
    if single.is_file():
        return [single]
    parts = sorted((out_dir / table).glob("*.parquet")) if (out_dir / table).is_dir() else []
    if not parts:
        raise TpchGenError(f"tpchgen-cli produced no Parquet file for table {table!r} in {out_dir}")
    return parts


def _cast_batches(files: list[Path], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for f in files:
        pf = pq.ParquetFile(f)
        got = pf.schema_arrow.names
        if got != schema.names:
            raise TpchGenError(
                f"unexpected columns in {f}: {got}; expected {schema.names} "
                "(a different tpchgen-cli version?)"
            )
        for batch in pf.iter_batches(batch_size=_BATCH_ROWS):
            # Casting also replaces the schema, dropping PARQUET:field_id metadata.
            yield batch.cast(schema)


def _prepare_target(path: str) -> bool:
    """Return whether ``path`` already holds a Delta table; refuse to clobber other data."""
    from deltalake import DeltaTable

    if DeltaTable.is_deltatable(path, storage_options=location.delta_storage_options(path)):
        return True
    if storage.exists(path) and (not storage.is_dir(path) or storage.list_dir(path)):
        raise FileExistsError(
            f"{path} exists and is not a Delta table; refusing to overwrite it"
        )
    return False


def _write_delta(path: str, files: list[Path], schema: pa.Schema, *, cdf: bool = True) -> int:
    from deltalake import DeltaTable, write_deltalake

    existed = _prepare_target(path)
    storage.make_dirs(path)
    options = location.delta_storage_options(path)
    reader = pa.RecordBatchReader.from_batches(schema, _cast_batches(files, schema))
    write_deltalake(
        path,
        reader,
        mode="overwrite",
        schema_mode="overwrite" if existed else None,
        configuration=CDF_CONFIGURATION if cdf else None,
        storage_options=options,
    )
    dt = DeltaTable(path, storage_options=options)
    on = dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    if on != cdf:
        # Overwriting an existing table may keep its old properties: set the feed as asked.
        dt.alter.set_table_properties({"delta.enableChangeDataFeed": "true" if cdf else "false"})
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def generate(
    sf: float,
    root: str | Path,
    *,
    tables: Iterable[str] = ALL,
    without_cdf: Iterable[str] = (),
) -> dict[str, int]:
    """Generate TPC-H at scale factor ``sf`` as Delta tables under ``root``.

    Each table is written to ``root/<table>`` (``region``, ``nation``, ``supplier``,
    ``customer``, ``part``, ``partsupp``, ``orders``, ``lineitem``) with table property
    ``delta.enableChangeDataFeed=true`` (``false`` for those in ``without_cdf``), in one
    ``WRITE`` commit. A table that already exists there is overwritten by a new version (it
    stays a Delta table, its history is kept, the feed is set as asked); with the feed on,
    delta-rs 1.6 records that overwrite in the Change Data Feed as a ``delete`` of every old
    row plus an ``insert`` of every new one. Schemas:
    :data:`SCHEMAS` (see the module docstring).

    Row counts follow TPC-H: e.g. at SF 1, 150 000 customers, 1 500 000 orders,
    about 6 000 000 lineitems, 200 000 parts, 800 000 partsupps, 10 000 suppliers,
    25 nations, 5 regions. Generated order keys are sparse like dbgen's: only keys with
    ``o_orderkey % 32 < 8`` are used.

    Args:
        sf: TPC-H scale factor (> 0; 1 is about 1 GB of text data). Fractions such as
            0.01 work.
        root: directory holding one Delta table per TPC-H table, created if missing; or an
            S3 URI ``s3://bucket/prefix`` (the bucket must exist; endpoint and credentials
            from the AWS chain, see :mod:`consistent_stream.location`).
        tables: which tables to (re)generate (lower-case names); default all 8.
        without_cdf: tables written with the Change Data Feed off
            (``delta.enableChangeDataFeed=false``): their changes exist only in the Delta
            log's added and removed files, as on a table whose owner never turned the feed on.

    Returns:
        Rows written per table, e.g. ``{"orders": 15000, ...}`` at SF 0.01.

    Raises:
        ValueError: ``sf`` is not positive or a table name is unknown.
        TpchGenError: ``tpchgen-cli`` is missing (PyPI package ``tpchgen-cli``) or failed.
        FileExistsError: ``root/<table>`` exists but is not a Delta table.
        ConfigError: ``root`` is a URI of a scheme other than ``s3://`` / ``file://``.
        StorageError: ``root``'s bucket does not exist or refuses the credentials.
        OSError: the object store cannot be read or written.
    """
    if not sf > 0:
        raise ValueError(f"scale factor must be > 0, got {sf!r}")
    names = _normalize_tables(tables)
    plain = set(_normalize_tables(without_cdf)) if without_cdf else set()
    root = location.normalize(str(root), key="--dir")
    storage.make_dirs(root)
    location.check_reachable(root, key="--dir")
    for t in names:  # fail before generating anything
        _prepare_target(table_path(root, t))
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="tpchgen-") as tmp:
        out_dir = Path(tmp)
        _run_tpchgen(sf, out_dir, names)
        for t in names:
            counts[t] = _write_delta(table_path(root, t), _parquet_files(out_dir, t), SCHEMAS[t],
                                     cdf=t not in plain)
    return counts
