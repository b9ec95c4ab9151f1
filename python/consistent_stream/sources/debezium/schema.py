"""Kafka Connect's JSON schemas as the column types of a captured table: the schema envelope
of a Debezium change event (``schemas.enable=true``) -> :class:`~..landing.TableSchema`, the
converters its encodings need, and the Spark SQL type names a source declares in
``meta.consistent_stream.columns`` (without the envelope). Used by :mod:`..kafka` and :mod:`.columns`."""
from __future__ import annotations

import base64
import decimal

from ...errors import ConfigError, SourceError
from ..landing import ColumnSchema, TableSchema, arrow_type

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"

# Kafka Connect schema types -> the column types of .landing (Debezium's logical names first)
_LOGICAL = {"io.debezium.time.Date": "date", "io.debezium.time.MicroTimestamp": "timestamp",
            "io.debezium.time.Timestamp": "timestamp", "io.debezium.time.NanoTimestamp": "timestamp",
            "io.debezium.time.ZonedTimestamp": "timestamptz", "org.apache.kafka.connect.data.Date": "date",
            "org.apache.kafka.connect.data.Timestamp": "timestamp"}
_PRIMITIVE = {"int8": "int16", "int16": "int16", "int32": "int32", "int64": "int64", "float32": "float32",
              "float64": "float64", "float": "float32", "double": "float64", "boolean": "bool", "string": "string"}
# what a timestamp's integer counts, in microseconds
_TIME_SCALE = {"io.debezium.time.Timestamp": 1000, "org.apache.kafka.connect.data.Timestamp": 1000,
               "io.debezium.time.NanoTimestamp": 0.001}
# Spark SQL type names (meta.consistent_stream.columns) -> the column types of .landing
_SPARK_TYPES = {"tinyint": "int16", "byte": "int16", "smallint": "int16", "short": "int16", "int": "int32",
                "integer": "int32", "bigint": "int64", "long": "int64", "float": "float32", "real": "float32",
                "double": "float64", "boolean": "bool", "string": "string", "varchar": "string", "date": "date",
                "timestamp": "timestamptz", "timestamp_ntz": "timestamp"}

def column_type(name: str, type_name: str, label: str) -> str:
    """A declared column type (Spark SQL's ``int``, ``decimal(12,2)``, ... or the landing's
    ``int32``) -> the column type of :mod:`.landing`. ConfigError naming ``label``."""
    t = type_name.strip().lower()
    t = _SPARK_TYPES.get(t, t)
    try:
        arrow_type(t)
    except SourceError:
        raise ConfigError(f"{label}: column {name!r} has type {type_name!r}; use a Spark SQL type (int, bigint, "
                          f"double, boolean, string, date, timestamp, decimal(p,s), ...)") from None
    return t


def source_decimal(params: dict) -> str | None:
    """``decimal(p,s)`` for a column the database declares ``NUMERIC(p,s)`` / ``DECIMAL(p,s)``
    (1 <= p <= 38), from the parameters Debezium adds to its schema with
    ``column.propagate.source.type`` (``__debezium.source.column.type``, ``.length``,
    ``.scale``); None otherwise (no such parameters, a ``numeric`` without precision).
    ``decimal.handling.mode=string`` or ``double`` then still give the database's exact type."""
    if str(params.get("__debezium.source.column.type", "")).upper() not in ("NUMERIC", "DECIMAL"):
        return None
    try:
        p, s = int(params.get("__debezium.source.column.length", 0)), int(params["__debezium.source.column.scale"])
    except (KeyError, TypeError, ValueError):
        return None
    return f"decimal({p},{s})" if 1 <= p <= 38 and 0 <= s <= p else None


def schema_from_envelope(table: str, schema: dict, primary_key: tuple, where: str) -> TableSchema:
    """The table's schema from a change event's Kafka Connect schema (the envelope's
    ``schema``: a struct whose ``after`` field is the row's struct); each column's
    ``source_type`` is its Connect logical type name (or type), from which :func:`converters`
    knows how its JSON values are encoded. Decimals are ``decimal(p,s)`` in each of
    Debezium's ``decimal.handling.mode`` values: ``precise`` from Connect's ``Decimal`` (its
    ``connect.decimal.precision`` and ``scale``), ``string`` and ``double`` from the source
    type Debezium propagates (:func:`source_decimal`); without it they are a string or a
    double (declare the table's ``columns`` to type them). SourceError naming ``where`` when
    the schema has no row struct or a column type this reader does not know."""
    fields = {f.get("field"): f for f in schema.get("fields") or [] if isinstance(f, dict)}
    row = fields.get("after") or fields.get("before")
    if not isinstance(row, dict) or row.get("type") != "struct":
        raise SourceError(f"{where}: the event's schema has no 'after' struct; is this a Debezium change topic?")
    cols = []
    for f in row.get("fields") or []:
        name, logical, kind = f["field"], f.get("name"), f.get("type")
        params = f.get("parameters") or {}
        if logical == DECIMAL:
            scale = int(params.get("scale", 0))
            precision = int(params.get("connect.decimal.precision", 38))
            t = f"decimal({max(precision, scale, 1)},{scale})"
        elif logical in _LOGICAL:
            t = _LOGICAL[logical]
        elif logical == VARIABLE_DECIMAL:
            t = "string"
        elif kind in ("string", "double", "float64") and source_decimal(params):
            t = source_decimal(params)
        elif kind in _PRIMITIVE:
            t = _PRIMITIVE[kind]
        elif kind == "bytes":
            raise SourceError(f"{where}: column {name!r} of {table} is bytes ({logical or 'no logical type'}); "
                              f"set the connector's binary.handling.mode=base64 or hex to read it as a string")
        else:
            raise SourceError(f"{where}: column {name!r} of {table} has the Connect type {kind!r} "
                              f"({logical or 'no logical type'}), which format: kafka does not read")
        cols.append(ColumnSchema(name, t, logical or kind, bool(f.get("optional", True))))
    return TableSchema(table, tuple(cols), tuple(primary_key))


def converters(ts: TableSchema) -> dict:
    """Column -> the function that turns its JSON value into what the column type's
    conversion (:mod:`.events`) takes, for the columns whose Connect encoding needs
    one (``source_type``: base64 decimals, millisecond or nanosecond timestamps)."""
    out = {}
    for c in ts.columns:
        if c.source_type == DECIMAL:
            out[c.name] = _decimal_from_bytes(int(c.type.split(",")[1].rstrip(")")))
        elif c.source_type in _TIME_SCALE:
            out[c.name] = _scaled(_TIME_SCALE[c.source_type])
        elif c.source_type == VARIABLE_DECIMAL:
            out[c.name] = _variable_decimal
    return out


def _decimal_from_bytes(scale: int):
    def convert(v):
        if v is None or not isinstance(v, str):
            return v
        unscaled = int.from_bytes(base64.b64decode(v), "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-scale)
    return convert


def _scaled(factor):
    def convert(v):
        return v if v is None or not isinstance(v, int) else int(v * factor)
    return convert


def _variable_decimal(v):
    if not isinstance(v, dict):
        return v
    unscaled = int.from_bytes(base64.b64decode(v["value"]), "big", signed=True)
    return str(decimal.Decimal(unscaled).scaleb(-int(v["scale"])))
