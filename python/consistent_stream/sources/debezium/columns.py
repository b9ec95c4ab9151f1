"""Debezium change events on Kafka parsed into columns, where Spark runs or on the driver.

:class:`~..kafka.reader.KafkaReader` reads Kafka records through a Spark query (:mod:`..kafka.log`);
:func:`projection` is the part of that query that parses each value, on the executors, into
the columns the reader's bookkeeping needs and each data topic's row images into typed
columns of its table. A small read is fetched by the driver's Kafka client instead and
:func:`local_projection` makes the same columns of it with DuckDB. The reader receives Arrow
and never parses JSON per event in Python: it walks scalar columns (op, table, transaction id,
...) to assemble transactions and takes the rows' images by index (:func:`images`), converting
Kafka Connect's encodings vectorized.

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
                       attempt's fields (:data:`.events.ATTEMPT_FIELDS`), as JSON text
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

Each value is parsed once, each image as a map of its columns' JSON text, cast to the column
types. The envelope's ``schema`` is most of a value's bytes and the same in every value of a
topic until the table's schema changes: where a value starts with the exact envelope text
learnt from the topic's first event (:func:`envelope_prefix`) followed by a payload object,
and ends with the envelope's ``}``, only the payload is parsed (``from_json`` of the event's
fields over a byte substring); any other value (another envelope, none, a null payload) is
parsed whole (``from_json`` of a struct that holds both the envelope and the bare event's
fields, the schema's subtree skipped by the parser). Both give the same columns: the prefix
is a complete JSON object, so what follows it is the top-level payload.

Strictness: malformed JSON fails the read (``FAILFAST``: Spark's
``MALFORMED_RECORD_IN_PARSING``); a value that does not fit its column's type (``try_cast``
gives null where the text was not) or an image with other columns clears ``images_ok``,
whatever ``spark.sql.ansi.enabled`` is. The reader then reads the range again as raw values
and names the first bad record with the driver's parser
(:meth:`~..kafka.reader.KafkaReader.diagnose`): topic, partition, offset and what is wrong, as before
any of this ran on executors.
"""
from __future__ import annotations

import re

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SourceError
from .events import _convert_column
from .schema import _TIME_SCALE, DECIMAL, VARIABLE_DECIMAL, _variable_decimal
from .events import ATTEMPT_FIELDS
from ..landing import TableSchema, arrow_type

SOURCE_FIELDS = ("schema", "table", "snapshot", "ts_ms") + ATTEMPT_FIELDS
_SOURCE_DDL = "struct<" + ", ".join(f"`{f}`: string" for f in SOURCE_FIELDS) + ">"
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


_EVENT_FIELDS = (("op", "string"), ("before", "map<string, string>"), ("after", "map<string, string>"),
                 ("source", _SOURCE_DDL), ("transaction", "struct<id: string, total_order: string>"))
_TX_FIELDS = (("status", "string"), ("id", "string"), ("ts_ms", "string"), ("data_collections", "string"))


def _ddl(fields: tuple) -> str:
    return ", ".join(f"{name} {type_}" for name, type_ in fields)


def _value_ddl(fields: tuple) -> str:
    """A value with or without Kafka Connect's envelope, in one parse: the envelope's
    ``schema`` (only whether it is there: its subtree is skipped) and ``payload``, and the
    same fields at the top level."""
    return f"schema struct<type: string>, payload struct<{_ddl(fields)}>, {_ddl(fields)}"


_HEAD = re.compile(rb'\{\s*"schema"\s*:')
_PAYLOAD = re.compile(rb',\s*"payload"\s*:\s*')


def envelope_prefix(value: bytes, obj) -> str | None:
    """The text a Kafka Connect ``JsonConverter`` value starts with up to its payload,
    ``{"schema":<schema>,"payload":``, exactly as ``value`` (the raw bytes) has it, spacing
    included up to the payload's first character, or None when ``value`` has no envelope or
    another key first. ``obj``: ``value`` parsed. The prefix ends where the bytes after
    ``"schema":`` parse to exactly the envelope's schema, so it is a complete JSON object
    whatever the schema holds (a ``"payload":`` inside it is not taken for the payload's key)."""
    if not (type(obj) is dict and isinstance(obj.get("schema"), dict) and "payload" in obj):
        return None
    head = _HEAD.match(value)
    if head is None:
        return None
    for m in _PAYLOAD.finditer(value, head.end()):
        try:
            if orjson.loads(value[head.end():m.start()]) == obj["schema"]:
                return value[:m.end()].decode("utf-8")
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            continue
    return None


def projection(data: list[tuple[str, str, TableSchema | None]], tx_topic: str | None,
               envelopes: dict[str, str] | None = None):
    """The function that turns Spark's Kafka source DataFrame (``topic``, ``partition``,
    ``offset``, ``value`` binary, ``timestamp``, ...) into the columns of the module
    docstring. ``data``: the data topics in order (``i`` of ``b<i>_<j>``), each with its
    table (``<schema>.<table>``) and schema (None while unknown: no image columns);
    ``tx_topic``: the transaction topic, or None (per-topic positions: every event's ``source``
    fields are kept); ``envelopes``: topic -> :func:`envelope_prefix` of its values, whose
    payload alone is parsed where a value has it. Each value is parsed once; an image is a
    map of its columns' JSON text, so its keys are checked against the table's and each column
    is cast to its type."""
    from pyspark.sql import functions as F

    def project(df):
        text = F.col("value").cast("string")
        # the 1-based byte offset of the payload, where the value has its topic's envelope and
        # the payload is an object (a null one is a tombstone: the whole value is parsed)
        at = F.lit(None).cast("int")
        for topic, prefix in sorted((envelopes or {}).items()):
            at = F.when((F.col("topic") == F.lit(topic)) & text.startswith(prefix + "{") & text.endswith("}"),
                        F.lit(len(prefix.encode("utf-8")) + 1)).otherwise(at)
        df = df.select("topic", "partition", "offset", "timestamp", "value", text.alias("text"), at.alias("at"))
        payload = F.expr("cast(substring(value, at, octet_length(value) - at) as string)")
        is_tx = (F.col("topic") == F.lit(tx_topic)) if tx_topic else F.lit(False)
        fast = F.col("at").isNotNull()

        def parsed(fields: tuple, mine):
            """The payload alone where the envelope is known, else the whole value."""
            return (F.when(mine & fast, F.from_json(payload, _ddl(fields), _FAILFAST)),
                    F.when(mine & ~fast, F.from_json("text", _value_ddl(fields), _FAILFAST)))

        def event(fields: tuple, alone: str, whole: str):
            """The event's ``fields`` as one struct: the payload parsed alone, else the
            envelope's payload, else the value's top level."""
            bare = F.struct(*[F.col(f"{whole}.{name}").alias(name) for name, _ in fields])
            return (F.when(fast, F.col(alone)).when(F.col(f"{whole}.schema").isNotNull(), F.col(f"{whole}.payload"))
                    .otherwise(bare))
        v_alone, v_whole = parsed(_EVENT_FIELDS, ~is_tx)
        t_alone, t_whole = (parsed(_TX_FIELDS, is_tx) if tx_topic else
                            (F.lit(None).cast(f"struct<{_ddl(_TX_FIELDS)}>"),
                             F.lit(None).cast(f"struct<{_value_ddl(_TX_FIELDS)}>")))
        df = df.select("topic", "partition", "offset", "timestamp", "text", "at", v_alone.alias("v_alone"),
                       v_whole.alias("v_whole"), t_alone.alias("t_alone"), t_whole.alias("t_whole"))
        enveloped = fast | F.when(is_tx, F.col("t_whole.schema").isNotNull()).otherwise(
            F.col("v_whole.schema").isNotNull())
        # e: the change event's fields, t: the transaction record's (null structs or fields elsewhere)
        df = df.select("topic", "partition", "offset", "timestamp", "text", enveloped.alias("enveloped"),
                       event(_EVENT_FIELDS, "v_alone", "v_whole").alias("e"),
                       event(_TX_FIELDS, "t_alone", "t_whole").alias("t"))

        # an envelope whose payload is null
        payload_null = F.col("enveloped") & F.when(is_tx, F.col("t").isNull()).otherwise(F.col("e").isNull())
        kind = (F.when(F.col("text").isNull() | payload_null, F.lit("tombstone"))
                .when(~F.ltrim(F.col("text")).startswith("{"), F.lit("other")).otherwise(F.lit("event")))
        cols = [F.col(c) for c in ("topic", "partition", "offset", "timestamp")]
        source, txb = F.col("e.source"), F.col("e.transaction")
        cols += [kind.alias("kind"), F.col("e.op").alias("op")]
        # the event's table, only where it is not its topic's
        table = F.when(source.getField("schema").isNotNull() & (source.getField("schema") != F.lit("")),
                       F.concat_ws(".", source.getField("schema"), source.getField("table"))).otherwise(
            source.getField("table"))
        expected = F.lit(None).cast("string")
        for topic, name, _ in data:
            expected = F.when(F.col("topic") == F.lit(topic), F.lit(name)).otherwise(expected)
        cols.append(F.when(~table.eqNullSafe(expected), F.coalesce(table, F.lit(""))).alias("other_table"))
        # the snapshot's fields, only on snapshot reads (every event's without transaction metadata)
        snapshot_read = (F.col("e.op") == F.lit("r")) & txb.isNull() if tx_topic else F.lit(True)
        cols += [F.when(snapshot_read, source.getField(f)).alias(f"s_{f}") for f in SOURCE_FIELDS[2:]]
        cols += [txb.getField("id").alias("tx_id"), txb.getField("total_order").alias("total_order")]
        cols += [F.coalesce(F.col(f"e.{side}").isNotNull(), F.lit(False)).alias(f"has_{side}")
                 for side in ("before", "after")]
        cols += [F.col(f"t.{f}").alias(name) for f, name in (("status", "t_status"), ("id", "t_id"),
                                                              ("ts_ms", "t_ts_ms"),
                                                              ("data_collections", "t_collections"))]
        images_ok = F.lit(True)
        for i, (topic, _, ts) in enumerate(data):
            if ts is None:
                continue
            mine = F.col("topic") == F.lit(topic)
            names = F.array(*[F.lit(n) for n in sorted(ts.column_names)])
            for side, prefix in (("before", "b"), ("after", "a")):
                image = F.when(mine, F.col(f"e.{side}"))
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


_DUCK = {"int16": "SMALLINT", "int32": "INTEGER", "int64": "BIGINT", "float32": "FLOAT", "float64": "DOUBLE",
         "bool": "BOOLEAN", "string": "VARCHAR"}
_INTEGER = frozenset({"SMALLINT", "INTEGER", "BIGINT"})


def _duck_struct(fields: tuple) -> str:
    """``fields`` ((name, Spark type)) as the structure DuckDB's ``from_json`` takes (JSON
    text): strings as VARCHAR (any JSON value as its text), images as MAP(VARCHAR, VARCHAR)."""
    def one(type_: str):
        if type_.startswith("struct<"):
            inner = re.findall(r"`?(\w+)`?: string", type_)
            return {name: "VARCHAR" for name in inner}
        return {"string": "VARCHAR", "map<string, string>": "MAP(VARCHAR, VARCHAR)"}[type_]
    return orjson.dumps({name: one(type_) for name, type_ in fields}).decode()


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def local_projection(data: list[tuple[str, str, TableSchema | None]], tx_topic: str | None):
    """:func:`projection` on the driver: the function that turns what
    :meth:`..kafka.log.KafkaLog.fetch` read (``topic``, ``partition``, ``offset``, ``value``
    binary, ``timestamp``, ``cut``: the value is its payload alone) into the same columns, with
    DuckDB's JSON reader (vectorized, on the driver's cores) in place of Spark's ``from_json``.
    ``data`` and ``tx_topic`` as for :func:`projection`. The same strictness: malformed JSON
    fails the parse (DuckDB's ``Malformed JSON``), a value that does not fit its column (an
    integer column's text must be an integer: DuckDB's cast would round ``1.5``) or an image
    with other columns clears ``images_ok``, a base64 decimal that is not base64 too. Raises
    ``pyarrow.ArrowInvalid`` for a value that is not UTF-8; the reader then names the record
    (:meth:`~..kafka.reader.KafkaReader.diagnose`)."""
    import duckdb

    event, tx = _duck_struct(_EVENT_FIELDS), _duck_struct(_TX_FIELDS)
    whole_event = _duck_struct((("schema", "struct<type: string>"), ("payload", "string")) + _EVENT_FIELDS)
    whole_tx = _duck_struct((("schema", "struct<type: string>"), ("payload", "string")) + _TX_FIELDS)
    is_tx = f"(topic = {_sql_text(tx_topic)})" if tx_topic else "FALSE"

    def payload(whole: str, fields: str) -> str:
        # the envelope's payload: parsed again alone (an envelope the fetch did not cut)
        return f"from_json({whole}.payload, {_sql_text(fields)})"

    parse = f"""
        SELECT __i, topic, text, cut,
          CASE WHEN NOT {is_tx} AND cut THEN from_json(text, {_sql_text(event)}) END AS v_alone,
          CASE WHEN NOT {is_tx} AND NOT cut AND ltrim(text) LIKE '{{%'
               THEN from_json(text, {_sql_text(whole_event)}) END AS v_whole,
          CASE WHEN {is_tx} AND cut THEN from_json(text, {_sql_text(tx)}) END AS t_alone,
          CASE WHEN {is_tx} AND NOT cut AND ltrim(text) LIKE '{{%'
               THEN from_json(text, {_sql_text(whole_tx)}) END AS t_whole
        FROM records"""
    bare_e = "struct_pack(" + ", ".join(f"{n} := v_whole.{n}" for n, _ in _EVENT_FIELDS) + ")"
    bare_t = "struct_pack(" + ", ".join(f"{n} := t_whole.{n}" for n, _ in _TX_FIELDS) + ")"
    structs = f"""
        SELECT __i, topic, text,
          cut OR CASE WHEN {is_tx} THEN t_whole.schema IS NOT NULL ELSE v_whole.schema IS NOT NULL END AS enveloped,
          CASE WHEN cut THEN v_alone WHEN v_whole.schema IS NOT NULL THEN {payload("v_whole", event)}
               ELSE {bare_e} END AS e,
          CASE WHEN cut THEN t_alone WHEN t_whole.schema IS NOT NULL THEN {payload("t_whole", tx)}
               ELSE {bare_t} END AS t
        FROM parsed"""
    expected = "CAST(NULL AS VARCHAR)"
    for topic, name, _ in data:
        expected = f"CASE WHEN topic = {_sql_text(topic)} THEN {_sql_text(name)} ELSE {expected} END"
    table = ("CASE WHEN e.source.schema IS NOT NULL AND e.source.schema <> '' "
             "THEN concat_ws('.', e.source.schema, e.source.table) ELSE e.source.table END")
    snapshot_read = "(e.op = 'r' AND e.transaction IS NULL)" if tx_topic else "TRUE"
    payload_null = f"(enveloped AND CASE WHEN {is_tx} THEN t IS NULL ELSE e IS NULL END)"
    cols = [f"CASE WHEN text IS NULL OR {payload_null} THEN 'tombstone' WHEN NOT ltrim(text) LIKE '{{%' "
            f"THEN 'other' ELSE 'event' END AS kind", "e.op AS op",
            f"CASE WHEN NOT (({table}) IS NOT DISTINCT FROM ({expected})) THEN coalesce({table}, '') END "
            f"AS other_table"]
    cols += [f"CASE WHEN {snapshot_read} THEN e.source.{f} END AS s_{f}" for f in SOURCE_FIELDS[2:]]
    cols += ["e.transaction.id AS tx_id", "e.transaction.total_order AS total_order",
             "coalesce(e.before IS NOT NULL, FALSE) AS has_before", "coalesce(e.after IS NOT NULL, FALSE) AS has_after",
             "t.status AS t_status", "t.id AS t_id", "t.ts_ms AS t_ts_ms", "t.data_collections AS t_collections"]
    checks = []
    for i, (topic, _, ts) in enumerate(data):
        if ts is None:
            continue
        names = "[" + ", ".join(_sql_text(n) for n in sorted(ts.column_names)) + "]"
        for side, prefix in (("before", "b"), ("after", "a")):
            image = f"(CASE WHEN topic = {_sql_text(topic)} THEN e.{side} END)"
            checks.append(f"coalesce(list_sort(map_keys({image})) = {names}, TRUE)")
            for j, c in enumerate(ts.columns):
                text = f"{image}[{_sql_text(c.name)}]"
                cast = _cast(c)
                if cast is not None:
                    duck = cast.upper() if cast.startswith("decimal(") else _DUCK[c.type]
                    x = f"TRY_CAST({text} AS {duck})"
                    if duck in _INTEGER:
                        x = f"CASE WHEN regexp_full_match({text}, '\\s*[+-]?[0-9]+\\s*') THEN {x} END"
                elif c.source_type == DECIMAL:
                    x = f"TRY(from_base64({text}))"
                else:
                    x = text
                if x != text:
                    checks.append(f"({text} IS NULL OR {x} IS NOT NULL)")
                cols.append(f"{x} AS {prefix}{i}_{j}")
    cols.append(("(" + " AND ".join(checks) + ")" if checks else "TRUE") + " AS images_ok")
    query = (f"WITH parsed AS ({parse}), structs AS ({structs}) "
             f"SELECT {', '.join(cols)} FROM structs ORDER BY __i")

    def project(records: pa.Table) -> pa.Table:
        text = pc.cast(records.column("value"), pa.string())   # ArrowInvalid: not UTF-8
        frame = pa.table({"__i": pa.array(np.arange(records.num_rows, dtype=np.int64)),
                          "topic": records.column("topic"), "text": text, "cut": records.column("cut")})
        con = duckdb.connect()
        try:
            con.register("records", frame)
            out = con.sql(query).to_arrow_table()
        finally:
            con.close()
        head = records.select(["topic", "partition", "offset", "timestamp"])
        for name in out.column_names:
            head = head.append_column(name, out.column(name))
        return head
    return project


def images(records: pa.Table, i: int, ts: TableSchema, prefix: str) -> pa.Table:
    """Data topic ``i``'s ``prefix`` (``b`` before, ``a`` after) images in ``records``
    (:func:`projection`'s output), one row per record (null for other records), as a table
    of ``ts``'s columns and Arrow types (:mod:`.landing`). Raises SourceError (naming the
    column and the first value) for a value its type cannot hold; the reader then names the
    record (:meth:`~..kafka.reader.KafkaReader.diagnose`)."""
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
