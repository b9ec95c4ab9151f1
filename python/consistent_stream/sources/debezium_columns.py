"""Debezium change events on Kafka parsed into columns where Spark runs.

:class:`~.kafka.KafkaReader` reads Kafka records through a Spark query (:mod:`.kafka_log`);
:func:`projection` is the part of that query that parses each value, on the executors, into
the columns the reader's bookkeeping needs and each data topic's row images into typed
columns of its table. The driver receives Arrow and never parses JSON per event: it walks
scalar columns (op, table, transaction id, ...) to assemble transactions and takes the rows'
images by index (:func:`images`), converting Kafka Connect's encodings vectorized.

A value is Kafka Connect's ``JsonConverter`` output, with the ``{"schema", "payload"}``
envelope or without it. Out of :func:`projection`, one row per record (every column a string
unless said otherwise; null where the record does not have it):

=====================  ==============================================================
``topic``              string; ``partition`` int32; ``offset`` int64; ``timestamp``
                       (the record's) timestamp
``kind``               ``tombstone`` (a null value, or an envelope whose payload is
                       null), ``other`` (not a JSON object: the reader names it), ``event``
``op``                 the change event's ``op``
``other_table``        the event's table (``source.schema`` + ``.`` + ``source.table``) where
                       it is not its topic's table (null where it is; empty without one)
``s_<field>``          on snapshot reads (and every event without transaction metadata):
                       its ``source`` block's ``snapshot``, ``ts_ms`` and the snapshot
                       attempt's fields (:data:`.kafka_snapshot.ATTEMPT_FIELDS`), as JSON text
``tx_id``              ``transaction.id``; ``total_order``: ``transaction.total_order``
``has_before``         bool: a ``before`` image is there; ``has_after`` likewise
``images_ok``          bool: each image has exactly the table's columns (schema changes of
                       captured tables are not read) and every value fits its column's type
``t_status``           transaction metadata (the transaction topic): ``status``, ``id``,
                       ``ts_ms``; ``t_collections`` its ``data_collections`` as JSON text
``b<i>_<j>``           data topic ``i``'s ``before`` image, column ``j`` of its table
                       (the Spark type of :func:`_cast`, else the JSON text; base64 decimals
                       as binary); ``a<i>_<j>`` the ``after`` image
=====================  ==============================================================

Each value is parsed once (``from_json`` of a struct that holds both the envelope and the bare
event's fields; the envelope's schema, most of a value's bytes, is skipped), each image as a
map of its columns' JSON text, cast to the column types. Strictness: malformed JSON fails the
read (``FAILFAST``: Spark's ``MALFORMED_RECORD_IN_PARSING``); a value that does not fit its
column's type (``try_cast`` gives null where the text was not) or an image with other columns
clears ``images_ok``, whatever ``spark.sql.ansi.enabled`` is. The reader then reads the range again as raw values and names the first
bad record with the driver's parser (:meth:`~.kafka.KafkaReader.diagnose`): topic, partition,
offset and what is wrong, as before any of this ran on executors.
"""
from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SourceError
from .debezium_events import _convert_column
from .kafka_schema import _TIME_SCALE, DECIMAL, VARIABLE_DECIMAL, _variable_decimal
from .kafka_snapshot import ATTEMPT_FIELDS
from .landing import TableSchema, arrow_type

SOURCE_FIELDS = ("schema", "table", "snapshot", "ts_ms") + ATTEMPT_FIELDS
_SOURCE_DDL = "struct<" + ", ".join(f"`{f}`: string" for f in SOURCE_FIELDS) + ">"
_TX_FIELDS = "status string, id string, ts_ms string, data_collections string"
_FAILFAST = {"mode": "FAILFAST"}
_SPARK = {"int16": "smallint", "int32": "int", "int64": "bigint", "float32": "float", "float64": "double",
          "bool": "boolean", "string": "string"}


def _cast(c) -> str | None:
    """The Spark type an image's column is cast to from its JSON text: numbers, booleans and
    decimals as themselves; None for what Connect encodes (base64 decimals, dates,
    timestamps, variable-scale decimals), converted on the driver by :func:`images`."""
    if c.type.startswith("decimal("):
        return None if c.source_type == DECIMAL else c.type
    return _SPARK.get(c.type)


_EVENT_FIELDS = ("op string, before map<string, string>, after map<string, string>, source " + _SOURCE_DDL
                 + ", transaction struct<id: string, total_order: string>")


def _value_ddl(fields: str) -> str:
    """A value with or without Kafka Connect's envelope, in one parse: the envelope's
    ``schema`` (only whether it is there: its subtree is skipped) and ``payload``, and the
    same fields at the top level."""
    return f"schema struct<type: string>, payload struct<{fields}>, {fields}"


def projection(data: list[tuple[str, str, TableSchema | None]], tx_topic: str | None):
    """The function that turns Spark's Kafka source DataFrame (``topic``, ``partition``,
    ``offset``, ``value`` binary, ``timestamp``, ...) into the columns of the module
    docstring. ``data``: the data topics in order (``i`` of ``b<i>_<j>``), each with its
    table (``<schema>.<table>``) and schema (None while unknown: no image columns);
    ``tx_topic``: the transaction topic, or None (per-topic positions: every event's ``source``
    fields are kept). Each value is parsed once; an image is a map of its columns' JSON text, so its
    keys are checked against the table's and each column is cast to its type."""
    from pyspark.sql import functions as F

    def project(df):
        df = df.select("topic", "partition", "offset", "timestamp", F.col("value").cast("string").alias("text"))
        is_tx = (F.col("topic") == F.lit(tx_topic)) if tx_topic else F.lit(False)
        df = df.select("topic", "partition", "offset", "timestamp", "text",
                       F.when(~is_tx, F.from_json("text", _value_ddl(_EVENT_FIELDS), _FAILFAST)).alias("v"),
                       (F.when(is_tx, F.from_json("text", _value_ddl(_TX_FIELDS), _FAILFAST)) if tx_topic
                        else F.lit(None).cast(f"struct<{_value_ddl(_TX_FIELDS)}>")).alias("vt"))

        def either(v: str, field: str):
            """``field`` of the envelope's payload, else of the value itself."""
            return F.when(F.col(f"{v}.schema").isNotNull(), F.col(f"{v}.payload.{field}")).otherwise(
                F.col(f"{v}.{field}"))

        enveloped = F.when(is_tx, F.col("vt.schema").isNotNull()).otherwise(F.col("v.schema").isNotNull())
        payload_null = F.when(is_tx, F.col("vt.payload").isNull()).otherwise(F.col("v.payload").isNull())
        kind = (F.when(F.col("text").isNull() | (enveloped & payload_null), F.lit("tombstone"))
                .when(~F.ltrim(F.col("text")).startswith("{"), F.lit("other")).otherwise(F.lit("event")))
        cols = [F.col(c) for c in ("topic", "partition", "offset", "timestamp")]
        source, txb = either("v", "source"), either("v", "transaction")
        cols += [kind.alias("kind"), either("v", "op").alias("op")]
        # the event's table, only where it is not its topic's
        table = F.when(source.getField("schema").isNotNull() & (source.getField("schema") != F.lit("")),
                       F.concat_ws(".", source.getField("schema"), source.getField("table"))).otherwise(
            source.getField("table"))
        expected = F.lit(None).cast("string")
        for topic, name, _ in data:
            expected = F.when(F.col("topic") == F.lit(topic), F.lit(name)).otherwise(expected)
        cols.append(F.when(~table.eqNullSafe(expected), F.coalesce(table, F.lit(""))).alias("other_table"))
        # the snapshot's fields, only on snapshot reads (every event's without transaction metadata)
        snapshot_read = (either("v", "op") == F.lit("r")) & txb.isNull() if tx_topic else F.lit(True)
        cols += [F.when(snapshot_read, source.getField(f)).alias(f"s_{f}") for f in SOURCE_FIELDS[2:]]
        cols += [txb.getField("id").alias("tx_id"), txb.getField("total_order").alias("total_order")]
        cols += [F.coalesce(either("v", side).isNotNull(), F.lit(False)).alias(f"has_{side}")
                 for side in ("before", "after")]
        cols += [either("vt", f).alias(name) for f, name in (("status", "t_status"), ("id", "t_id"),
                                                              ("ts_ms", "t_ts_ms"),
                                                              ("data_collections", "t_collections"))]
        images_ok = F.lit(True)
        for i, (topic, _, ts) in enumerate(data):
            if ts is None:
                continue
            mine = F.col("topic") == F.lit(topic)
            names = F.array(*[F.lit(n) for n in sorted(ts.column_names)])
            for side, prefix in (("before", "b"), ("after", "a")):
                image = F.when(mine, either("v", side))
                images_ok = images_ok & F.coalesce(F.array_sort(F.map_keys(image)) == names, F.lit(True))
                for j, c in enumerate(ts.columns):
                    text = image.getItem(c.name)
                    x, cast = text, _cast(c)
                    if cast is not None:
                        # try_cast, whatever spark.sql.ansi.enabled says: a value that does not
                        # fit is null here, and flagged
                        x = text.try_cast(cast)
                        images_ok = images_ok & (text.isNull() | x.isNotNull())
                    elif c.source_type == DECIMAL:
                        x = F.unbase64(text)
                    cols.append(x.alias(f"{prefix}{i}_{j}"))
        cols.append(images_ok.alias("images_ok"))
        return df.select(*cols)
    return project


def images(records: pa.Table, i: int, ts: TableSchema, prefix: str) -> pa.Table:
    """Data topic ``i``'s ``prefix`` (``b`` before, ``a`` after) images in ``records``
    (:func:`projection`'s output), one row per record (null for other records), as a table
    of ``ts``'s columns and Arrow types (:mod:`.landing`). Raises SourceError (naming the
    column and the first value) for a value its type cannot hold; the reader then names the
    record (:meth:`~.kafka.KafkaReader.diagnose`)."""
    arrays = [_typed(records.column(f"{prefix}{i}_{j}").combine_chunks(), c.type, c.source_type, c.name)
              for j, c in enumerate(ts.columns)]
    return pa.Table.from_arrays(arrays, names=ts.column_names)


def _typed(a: pa.Array, type_name: str, source_type: str, column: str) -> pa.Array:
    """One image column as it came from Spark -> the column's Arrow type."""
    t = arrow_type(type_name)
    if pa.types.is_decimal(t) and source_type == DECIMAL:
        return decimals_from_bytes(a, t, column)
    if source_type == VARIABLE_DECIMAL:
        return pa.array([None if v is None else _variable_decimal(orjson.loads(v)) for v in a.to_pylist()], t)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        try:
            n = pc.cast(a, pa.int64())
        except pa.ArrowInvalid:   # ISO 8601 text (ZonedTimestamp, declared columns): parsed one by one
            return _convert_column(a.to_pylist(), type_name, "", column)
        if pa.types.is_date(t):
            return pc.cast(n, pa.int32()).cast(t)
        scale = _TIME_SCALE.get(source_type)
        if scale is not None:
            n = pc.multiply(n, int(scale)) if scale >= 1 else pc.divide(n, int(round(1 / scale)))
        return n.cast(t)
    if a.type == t:
        return a
    try:
        return a.cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SourceError(f"column {column!r}: a value is not a {type_name}: {e}") from None


def decimals_from_bytes(a: pa.Array, t: pa.Decimal128Type, column: str = "") -> pa.Array:
    """Kafka Connect's ``Decimal`` (the unscaled value as big-endian two's-complement bytes,
    base64 in JSON and decoded by Spark's ``unbase64``) -> ``t`` (``decimal128(p, s)``, the
    scale from the schema), vectorized: each value is sign-extended to 16 bytes and
    reversed into Arrow's little-endian decimal128 layout. Raises SourceError for a value of
    more than 16 bytes or more digits than ``t``'s precision."""
    a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    n = len(a)
    if a.type != pa.binary():
        a = a.cast(pa.binary())
    offsets = np.frombuffer(a.buffers()[1], dtype=np.int32, count=n + 1, offset=a.offset * 4)
    data = np.frombuffer(a.buffers()[2], dtype=np.uint8) if a.buffers()[2] is not None else np.zeros(0, np.uint8)
    lens = np.diff(offsets)
    if n and lens.max(initial=0) > 16:
        raise SourceError(f"column {column!r}: a decimal of {int(lens.max())} bytes; at most 16 (precision 38) "
                          f"fit a decimal column")
    starts = offsets[:-1]
    has = lens > 0
    neg = np.zeros(n, dtype=bool)
    neg[has] = data[starts[has]] >= 0x80
    out = np.zeros((n, 16), dtype=np.uint8)
    out[neg] = 0xFF
    rows = np.repeat(np.arange(n), lens)
    within = np.arange(int(lens.sum())) - np.repeat(starts - offsets[0], lens)
    out[rows, 16 - lens[rows] + within] = data[offsets[0]:offsets[-1]]
    little = np.ascontiguousarray(out[:, ::-1])
    validity = a.buffers()[0]
    if validity is not None and a.offset:
        validity = pa.array(a.is_valid().to_pylist(), pa.bool_()).buffers()[1]
    wide = pa.Array.from_buffers(pa.decimal128(38, t.scale), n, [validity, pa.py_buffer(little.tobytes())])
    try:
        return wide.cast(t)
    except pa.ArrowInvalid:
        big = next(v for v in wide.to_pylist() if v is not None and len(v.as_tuple().digits) > t.precision)
        raise SourceError(f"column {column!r}: {big} has more digits than its type {t} holds") from None


def loads_collections(text: str | None) -> dict[str, int]:
    """An END's ``data_collections`` (JSON text) -> table -> events of it."""
    if text is None:
        return {}
    value = orjson.loads(text)
    return {str(d.get("data_collection")): int(d.get("event_count", 0))
            for d in value or [] if isinstance(d, dict)}


def as_number(text: str | None):
    """A JSON scalar kept as text by :func:`projection` -> an int when it is one, else the
    text (snapshot attempt fields compare as the connector's numbers)."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return text
