"""A table's changes between two positions, and the table as of a position, computed by Spark
from the Kafka topics, or from a reader's chunk files: what a :class:`~.reader.KafkaReader` no
longer holds on the driver.

A reader keeps the changes it assembled (Arrow on the driver) up to a budget of bytes
(:attr:`~.reader.KafkaReader.image_budget`) and drops the oldest past it, keeping per
transaction only its net row count; a first build, a rebuild on the executors and ``verify``
need the table as of a position, i.e. every change since the connector's snapshot. Where
Spark's executors share the driver's disk (a local session), the reader copied what it
dropped there as Parquet (:mod:`.chunk_files`) and Spark reads those copies
(:func:`chunk_frame`); elsewhere (a cluster) they are
read again here, where Spark runs, from the records the reader already read and checked
(so no record here can be malformed), with the reader's bookkeeping as the only input from the
driver (:class:`TopicCut`): which snapshot attempt was published, and which transactions
are in the range.

**Which transactions.** The reader publishes transactions in the order of their first record
on the transaction topic (one partition: its order is the commit order, :mod:`.assembly`), each
once (a copy sent again is a duplicate), and positions grow in that order. So the
transactions with ``after < position <= upto`` are those whose first transaction-topic offset
``f`` is above ``f`` of the last transaction at or before ``after`` and at most ``f`` of the
last one at or before ``upto``: two transaction keys from the driver, the rest computed over
the transaction topic. A range from the start to the newest published position (a first
build) needs no transaction topic: every change event read belongs to a published
transaction or to one still incomplete, whose keys the driver gives. This holds for a reader
of the topics' start (no resume point, which drops transactions by their commit LSN) in
transaction consistency.

**Which events.** The table's topic, every partition, up to where the reader read: the
snapshot reads (``op: r`` without a transaction) of the published attempt
(:data:`..debezium.events.ATTEMPT_FIELDS` equal to its key) when the range holds the snapshot
(position 0), and the change events of the range's transactions, each distinct event
(transaction, ``total_order``) once: one scan of the topic, each record parsed once
(:func:`..debezium.columns.projection`). Each becomes weighted rows as the reader makes them
(``c``/``r`` +after, ``d`` -before, ``u`` -before +after), the images typed by the same
function the reader uses (:func:`..debezium.columns.images`, run on the executors through
``mapInArrow``). The table as of a position is those rows over ``(INITIAL, position]``
consolidated (summed weights per distinct row), each row repeated by its weight, materialized
once (``localCheckpoint`` on the executors' disks) so that the queries reading it do not read
the topics (or the files) again (:func:`table_of`).

Errors: SourceError when a row's consolidated weight is negative (the snapshot and the
change events disagree), naming the table and position.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...changelog import q
from ...errors import SourceError
from ..debezium.columns import images, projection
from ..debezium.events import POS, WEIGHT, chunk_schema
from .log import KafkaLog
from .snapshot import ATTEMPT_FIELDS
from ..landing import TableSchema


@dataclass(frozen=True)
class TopicCut:
    """What a reader's bookkeeping says about one table's changes in ``(after, upto]``:
    ``log`` (its brokers and consumer group), the ``table`` and its ``topic`` and ``schema``,
    the ``tx_topic``, ``ranges`` ((topic, partition) -> [start, end) offsets the reader read
    of the table's topic and the transaction topic), ``snapshot`` (the range holds the
    connector's snapshot), ``attempt`` (the published snapshot attempt's key; None: every
    snapshot read), ``after_tx`` and ``upto_tx`` (the keys of the last transactions at or
    before ``after`` and ``upto``; None: none, only the snapshot or nothing); ``incomplete``:
    for a range from the start (no transaction at or before ``after``) to the newest
    published position, the keys of the transactions read in part (then the transaction
    topic is not read, nor in ``ranges``), else None; ``envelopes``: (topic, envelope text)
    pairs of :attr:`.reader.KafkaReader.envelopes`."""
    log: KafkaLog
    table: str
    topic: str
    schema: TableSchema
    tx_topic: str
    ranges: dict
    snapshot: bool
    attempt: tuple | None
    after_tx: str | None
    upto_tx: str | None
    incomplete: tuple | None = None
    envelopes: tuple = ()


def tx_key(column):
    """:func:`.assembly.transaction_keys` as a Spark column expression over a ``transaction.id``
    column: the xid of a PostgreSQL id ``"<xid>:<LSN>"``, else the id."""
    from pyspark.sql import functions as F
    return F.when(column.rlike(r"^[0-9]+:[0-9]+$"), F.regexp_extract(column, r"^([0-9]+):", 1)).otherwise(column)


def _weigh(schema: TableSchema):
    """The ``mapInArrow`` function turning batches of (``op``, ``b0_<j>``, ``a0_<j>``) into
    the table's typed columns + ``__weight`` (module docstring)."""
    out_schema = pa.schema(list(schema.arrow_schema()) + [pa.field(WEIGHT, pa.int64())])

    def weigh(batches):
        for batch in batches:
            t = pa.Table.from_batches([batch])
            op = t.column("op")
            for prefix, mask, w in (("b", pc.is_in(op, pa.array(["u", "d"])), -1),
                                    ("a", pc.not_equal(op, "d"), 1)):
                rows = t.filter(mask)
                if rows.num_rows:
                    typed = images(rows, 0, schema, prefix)
                    typed = typed.append_column(WEIGHT, pa.array(np.full(rows.num_rows, w, dtype=np.int64)))
                    yield from typed.cast(out_schema).to_batches()
    return weigh


def changes_frame(cut: TopicCut, columns: list[str] | None = None):
    """The weighted rows of ``cut`` (module docstring) as a lazy Spark DataFrame: ``columns``
    (default all) of the table, typed as its schema says, + ``__weight`` bigint; not
    consolidated, in no particular order."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    project = projection([(cut.topic, cut.table, cut.schema)], cut.tx_topic, dict(cut.envelopes))

    def where(topic: str, condition):
        """The records of ``topic`` in ``cut.ranges``, parsed, where ``condition`` holds; None
        when it has none. Each topic is scanned once and each record parsed once: the filter
        reads the partition id, a nondeterministic column, so Spark's optimizer does not push
        it into the parse (it would inline from_json into the predicate: every record parsed
        twice)."""
        ranges = {tp: r for tp, r in cut.ranges.items() if tp[0] == topic and r[1] > r[0]}
        if not ranges:
            return None
        records = project(cut.log.frame(ranges)).withColumn("__part", F.spark_partition_id())
        return records.filter(condition & (F.col("__part") >= 0))

    event = (F.col("topic") == F.lit(cut.topic)) & (F.col("kind") == F.lit("event")) & F.col("op").isNotNull()
    image_cols = [f"{p}0_{j}" for p in ("b", "a") for j in range(len(cut.schema.columns))]
    snap = F.lit(False)
    if cut.snapshot:
        snap = F.col("tx_id").isNull() & (F.col("op") == F.lit("r"))
        key = dict(cut.attempt or ())
        if cut.attempt is not None:
            for f in ATTEMPT_FIELDS:
                snap = snap & (F.col(f"s_{f}") == F.lit(str(key[f])) if f in key else F.col(f"s_{f}").isNull())
    change = F.lit(False)
    if cut.upto_tx is not None:
        change = F.col("tx_id").isNotNull()
        if cut.incomplete:
            change = change & ~tx_key(F.col("tx_id")).isin(*cut.incomplete)
    cols = list(columns) if columns is not None else cut.schema.column_names
    out = from_arrow_schema(pa.schema(list(cut.schema.arrow_schema()) + [pa.field(WEIGHT, pa.int64())]))
    rows = where(cut.topic, event & (snap | change)) if cut.snapshot or cut.upto_tx is not None else None
    if rows is None:
        return cut.log.session().createDataFrame([], out).select(*[F.col(q(c)) for c in cols], WEIGHT)
    # a change event once per (transaction, total_order); a snapshot row is its own key
    rows = rows.withColumn("k", F.when(F.col("tx_id").isNotNull(), tx_key(F.col("tx_id"))).otherwise(
        F.format_string("%s/%d/%d", F.col("topic"), F.col("partition"), F.col("offset"))))
    if cut.upto_tx is not None and cut.incomplete is None:
        # the range's transactions, from the transaction topic (none read: no change is in it)
        txs = where(cut.tx_topic, F.col("t_status").isNotNull())
        inside = F.lit(False)
        if txs is not None:
            txs = txs.select(tx_key(F.col("t_id")).alias("k"), "offset").groupBy("k").agg(F.min("offset").alias("f"))
            lo = F.max(F.when(F.col("k") == F.lit(cut.after_tx), F.col("f"))) if cut.after_tx is not None \
                else F.lit(-1).cast("bigint")
            bounds = txs.agg(lo.alias("lo"), F.max(F.when(F.col("k") == F.lit(cut.upto_tx), F.col("f"))).alias("hi"))
            ks = txs.crossJoin(bounds).filter((F.col("f") > F.col("lo")) & (F.col("f") <= F.col("hi"))).select("k")
            rows = rows.join(ks.withColumn("__in", F.lit(True)), "k", "left")
            inside = F.col("__in").isNotNull()
        rows = rows.filter(F.col("tx_id").isNull() | inside)
    df = rows.dropDuplicates(["k", "total_order"]).select("op", *image_cols).mapInArrow(_weigh(cut.schema), out)
    return df.select(*[F.col(q(c)) for c in cols], WEIGHT)


def chunk_frame(spark, paths: list[str], schema: TableSchema, position: int, columns: list[str] | None = None):
    """The weighted rows at positions ``<= position`` of a reader's chunk files
    (:mod:`.chunk_files`: Parquet of the table's columns + ``__pos`` + ``__weight``) as a lazy
    Spark DataFrame: ``columns`` (default all) + ``__weight`` bigint, not consolidated. The
    files must be where Spark's executors read them (a local session)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    cols = list(columns) if columns is not None else schema.column_names
    full = from_arrow_schema(chunk_schema(schema))
    df = spark.read.schema(full).parquet(*paths) if paths else spark.createDataFrame([], full)
    return df.filter(F.col(POS) <= F.lit(position)).select(*[F.col(q(c)) for c in cols], WEIGHT)


def table_frame(cut: TopicCut, position: int, columns: list[str] | None = None, *, materialize: bool = True):
    """The table as of ``position`` (``cut`` from the topics' start through ``position``)
    computed from the topics (:func:`changes_frame`, :func:`table_of`). Raises SourceError
    when a row's weight is negative (materialized: at once; lazy: when run)."""
    what = f"Kafka topic {cut.topic}: table {cut.table} at position {position}"
    return table_of(changes_frame(cut, columns), what, materialize)


def table_of(z, what: str, materialize: bool = True):
    """A Spark DataFrame of weighted rows (columns + ``__weight``, not consolidated) -> the
    relation they sum to: the columns, each row repeated by its consolidated weight, no
    weight column; materialized on the executors' disks (``localCheckpoint``), or
    (``materialize`` false: what is analyzed, or read once) lazy, the Spark query that
    computes it. Raises SourceError naming ``what`` when a row's weight is negative (the
    snapshot and the change events disagree; materialized: at once; lazy: when run)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    cols = [c for c in z.columns if c != WEIGHT]
    g = z.groupBy(*[F.col(q(c)) for c in cols]).agg(F.sum(WEIGHT).alias(WEIGHT)).filter(F.col(WEIGHT) != 0)
    what = f"{what}: a row is retracted more often than it was inserted"
    disagree = "the snapshot and the change events disagree"
    if not materialize:
        g = g.withColumn(WEIGHT, F.when(F.col(WEIGHT) > 0, F.col(WEIGHT)).otherwise(
            F.raise_error(F.lit(f"{what}; {disagree}"))))
    else:
        g = g.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
        bad = g.filter(F.col(WEIGHT) < 0).limit(1).collect()
        if bad:
            raise SourceError(f"{what} (weight {bad[0][WEIGHT]}): {bad[0].asDict()}; {disagree}")
    repeat = F.explode(F.array_repeat(F.lit(True), F.col(WEIGHT).cast("int"))).alias("__copy")
    return g.select(*[F.col(q(c)) for c in cols], repeat).drop("__copy")
