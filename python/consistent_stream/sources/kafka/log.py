"""Kafka topics as the driver reads them: partitions and their offsets, and records in an
offset range, through Spark's Kafka source or a Kafka client on the driver.

Offsets are Kafka's: per topic-partition, the first readable offset (``low``; what retention
or DeleteRecords left) and the offset the next record will get (``high``, exclusive). A range
``{(topic, partition): (start, end)}`` is read either as one Spark batch query over Spark's
Kafka source (``spark-sql-kafka-0-10``; ``assign`` + ``startingOffsets``/``endingOffsets``,
resolved at install by :mod:`consistent_stream.session`; :meth:`KafkaLog.read`), its values
parsed where Spark runs and the result returned to the driver as Arrow, or by the driver's own
Kafka client (``confluent-kafka``, librdkafka; :meth:`KafkaLog.fetch`), a small read's
cheaper way: no Spark job, no warm-up of Spark's Kafka source. Either way the change a batch
reads, never a whole topic twice. Partition metadata and watermarks come from the driver's
client too (Spark's Kafka source does not expose them).

Errors (:class:`SourceError`): a topic that does not exist (naming it and the servers), a
broker that does not answer, a range whose start retention has already deleted (naming the
partition, the offset, the first offset still there, and what to do).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SourceError

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
MAX_RECORDS = 100_000
"""Records one read brings to the driver at most (a backlog is read in several)."""


def confluent_kafka():
    """The ``confluent_kafka`` module (librdkafka's Python client, the package's ``kafka``
    extra), imported when a Kafka source first needs it: ``import consistent_stream.sources``
    does not. A ModuleNotFoundError saying what to install when it is missing."""
    try:
        import confluent_kafka as module
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"format: kafka needs the confluent-kafka client ({e}): "
                                  f"pip install 'dbt-consistent-stream[kafka]'", name="confluent_kafka") from None
    return module


def split_ranges(ranges: dict, limit: int) -> list[dict]:
    """``ranges`` ((topic, partition) -> [start, end)) as successive reads of at most about
    ``limit`` records each: every partition advances in each read, in proportion to its
    backlog, so the transaction topic and the data topics move together."""
    total = sum(end - start for start, end in ranges.values())
    if total <= limit:
        return [ranges]
    steps = -(-total // limit)
    out = []
    for i in range(steps):
        part = {}
        for tp, (start, end) in ranges.items():
            n = end - start
            lo, hi = start + n * i // steps, start + n * (i + 1) // steps
            if hi > lo:
                part[tp] = (lo, hi)
        out.append(part)
    return out


_QUIET_JVMS: set[int] = set()


def _quiet_group_id_warning(spark) -> None:
    """Spark's Kafka source logs a warning of seven lines at every query that sets
    ``kafka.group.id`` (queries that share a consumer group interfere): here the id only keys
    its consumer cache (:class:`KafkaLog`: the partitions are assigned, no offset is
    committed), and a catch-up makes dozens of reads, so that logger is set to ERROR, once per
    JVM. A session with no JVM beside Python (Spark Connect) is left as it is."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or id(jvm) in _QUIET_JVMS:
        return
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel("org.apache.spark.sql.kafka010.KafkaSourceProvider", log4j.Level.ERROR)
    _QUIET_JVMS.add(id(jvm))


class Partition(NamedTuple):
    """One topic-partition and its watermarks: ``low`` the first readable offset, ``high`` the
    next offset to be written."""
    topic: str
    partition: int
    low: int
    high: int


class KafkaLog:
    """The topics on the brokers ``bootstrap`` (``host:port[,host:port...]``), read on the
    driver; ``timeout_s`` bounds each metadata call."""

    def __init__(self, bootstrap: str, timeout_s: float = TIMEOUT_S):
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._consumer = None
        # Spark's Kafka source caches its consumers and the records they fetched ahead by
        # group id and partition (and next offset); by default each read is a query with a
        # group id of its own, so nothing is ever reused and a backlog's reads pile both up
        # in the driver's JVM heap until an idle timeout. One group id per log: each read
        # goes on with the consumer and the fetched records the read before it left. It is
        # only a cache key here: the partitions are assigned and no offset is committed.
        self.group_id = f"consistent-stream-{uuid.uuid4().hex}"
        self._fetcher = None
        # the fetch consumer's assignment: partition -> offset the next fetch continues at,
        # the records fetched past the last fetch's ends, the prefixes they were cut with
        self._stream: dict | None = None
        self._carry: dict[tuple[str, int], deque] = {}
        self._stream_prefixes: dict = {}
        self._fetching = threading.Lock()   # a read ahead and a diagnosis may fetch from two threads

    def _client(self):
        if self._consumer is None:
            confluent_kafka()
            from confluent_kafka import Consumer
            # no group: this client only asks for metadata and watermarks, and commits nothing
            # (a model's offsets live in its target's commits); librdkafka's log goes to ours
            self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "consistent-stream-metadata",
                                       "enable.auto.commit": False, "allow.auto.create.topics": False,
                                       "logger": logging.getLogger(__name__ + ".librdkafka")})
        return self._consumer

    def close(self) -> None:
        self._stream, self._carry = None, {}
        for name in ("_consumer", "_fetcher"):
            client = getattr(self, name)
            if client is not None:
                client.close()
                setattr(self, name, None)

    def topics(self) -> set[str]:
        """The names of the topics the brokers have. SourceError when they do not answer."""
        confluent_kafka()
        from confluent_kafka import KafkaException
        try:
            md = self._client().list_topics(timeout=self.timeout_s)
        except KafkaException as e:
            raise SourceError(f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:.0f} s ({e}); "
                              f"check meta.consistent_stream.bootstrap_servers and that the brokers run") from None
        return set(md.topics)

    def partitions(self, topic: str, key: str = "meta.consistent_stream.topic") -> list[Partition]:
        """The partitions of ``topic`` with their watermarks, by partition number. SourceError
        naming the topic and ``key`` (the config key that named it) when it does not exist."""
        confluent_kafka()
        from confluent_kafka import KafkaException, TopicPartition
        try:
            md = self._client().list_topics(topic, timeout=self.timeout_s)
        except KafkaException as e:
            raise SourceError(f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:.0f} s ({e}); "
                              f"check meta.consistent_stream.bootstrap_servers and that the brokers run") from None
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            have = sorted(n for n in self.topics() if not n.startswith("_"))
            raise SourceError(f"Kafka topic {topic!r} ({key}) does not exist at {self.bootstrap}; topics there: "
                              f"{have[:20] or 'none'}. Check the topic name (Debezium names a table's topic "
                              f"<topic.prefix>.<schema>.<table>) and that the connector runs")
        out = []
        for p in sorted(t.partitions):
            low, high = self._client().get_watermark_offsets(TopicPartition(topic, p), timeout=self.timeout_s)
            out.append(Partition(topic, p, int(low), int(high)))
        return out

    def read(self, ranges: dict[tuple[str, int], tuple[int, int]], project) -> pa.Table:
        """The records of ``ranges`` ((topic, partition) -> [start, end) offsets, at least one
        not empty; empty ones are not read) through Spark's Kafka source, as what ``project``
        (a function of Spark's Kafka source DataFrame, run on the executors:
        :func:`..debezium.columns.projection`) makes of them, which must keep ``topic``,
        ``partition`` and ``offset``; on the driver, ordered by topic, partition and offset.
        Raw records are :meth:`fetch`'s.

        Raises SourceError when a start offset is no longer in Kafka (retention); what
        ``project`` raises on the executors (a malformed value) passes through."""
        ranges = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
        df = project(self.frame(ranges))
        try:
            t = df.toArrow()
        except Exception as e:   # Py4J / Spark errors: a lost offset is the one users can act on
            text = str(e)
            if "OFFSET_OUT_OF_RANGE" in text or "data may have been lost" in text.lower() or "out of range" in text:
                lost = self.check_retained(ranges)
                if lost:
                    raise lost from None
            raise
        order = pc.sort_indices(t, [("topic", "ascending"), ("partition", "ascending"),
                                            ("offset", "ascending")])
        return t.take(order)

    def fetch(self, ranges: dict[tuple[str, int], tuple[int, int]],
              prefixes: dict[str, bytes] | None = None) -> pa.Table:
        """The records of ``ranges`` ((topic, partition) -> [start, end) offsets) read by the
        driver's Kafka client (librdkafka: one consumer per log, partitions assigned, nothing
        committed), ordered by topic, partition and offset. Out: ``topic`` string,
        ``partition`` int32, ``offset`` int64, ``value`` binary (null: a tombstone),
        ``timestamp`` timestamp[us, UTC] (null where the record has none), ``cut`` bool.
        ``prefixes``: topic -> bytes that most of its values start with (Kafka Connect's schema
        envelope, :func:`..debezium.columns.envelope_prefix`): a value that starts with its
        topic's prefix followed by ``{`` and ends with ``}`` is kept as the bytes between them
        (``cut`` true), so the driver holds payloads, not the same schema text in every
        record. Records at or past a range's end (fetched ahead) are kept for the next fetch:
        successive fetches of a backlog (each range starting where the last ended, the same
        ``prefixes``) go on with the consumer's assignment and what it fetched ahead, where a
        new assignment would fetch from the broker again.

        Raises SourceError when a start offset is no longer in Kafka (retention), when the
        brokers do not answer for ``timeout_s``, or on a partition's error."""
        ranges = {tp: (int(a), int(b)) for tp, (a, b) in ranges.items() if b > a}
        got: dict[tuple[str, int], tuple[list, list, list, list]] = {tp: ([], [], [], []) for tp in ranges}
        if ranges:
            with self._fetching:
                self._fetch(ranges, got, prefixes or {})
        topics, parts, offsets, values, stamps, cuts = [], [], [], [], [], []
        for (t, p), (o, v, ts, cut) in sorted(got.items()):
            topics.append(pa.array([t] * len(o), pa.string()))
            parts.append(pa.array(np.full(len(o), p, np.int32)))
            offsets.append(pa.array(o, pa.int64()))
            values.extend(_binary(v))
            stamps.append(pa.array([None if x < 0 else x * 1000 for x in ts], pa.timestamp("us", tz="UTC")))
            cuts.append(pa.array(cut, pa.bool_()))
        names = ("topic", "partition", "offset", "value", "timestamp", "cut")
        types = (pa.string(), pa.int32(), pa.int64(), pa.binary(), pa.timestamp("us", tz="UTC"), pa.bool_())
        return pa.table({n: pa.chunked_array(c, t) for n, c, t in zip(names, (topics, parts, offsets, values,
                                                                              stamps, cuts), types)})

    def _fetch(self, ranges: dict, got: dict, prefixes: dict) -> None:
        """:meth:`fetch`'s reading into ``got``, on the fetch consumer's assignment."""
        confluent_kafka()
        from confluent_kafka import Consumer, TopicPartition
        if self._fetcher is None:
            # read_uncommitted, as Spark's Kafka source reads; no offset reset: a start
            # that retention removed is an error, never a silent jump. A full local queue
            # (64 MB of fetched records, librdkafka's default) postpones the next fetch by
            # fetch.queue.backoff.ms, by default 1 s
            self._fetcher = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group_id,
                                      "enable.auto.commit": False, "enable.auto.offset.store": False,
                                      "auto.offset.reset": "error", "isolation.level": "read_uncommitted",
                                      "enable.partition.eof": True, "fetch.queue.backoff.ms": 10,
                                      "logger": logging.getLogger(__name__ + ".librdkafka")})
        consumer = self._fetcher
        stream = self._stream
        if stream is None or prefixes != self._stream_prefixes or any(stream.get(tp) != a for tp, (a, _)
                                                                       in ranges.items()):
            if stream is not None:
                consumer.unassign()
            consumer.assign([TopicPartition(t, p, a) for (t, p), (a, _) in sorted(ranges.items())])
            stream = self._stream = {tp: a for tp, (a, _) in ranges.items()}
            self._carry, self._stream_prefixes = {}, prefixes
        ends = {}
        for tp, (_, b) in ranges.items():
            carried = self._carry.get(tp)
            while carried and carried[0][0] < b:
                for column, x in zip(got[tp], carried.popleft()):
                    column.append(x)
            if not carried:   # no record at or past the end yet
                ends[tp] = b
        try:
            self._consume(consumer, ranges, ends, got, prefixes)
        except BaseException:
            consumer.unassign()
            self._stream = None
            raise
        for tp, (_, b) in ranges.items():
            stream[tp] = b

    def _consume(self, consumer, ranges: dict, ends: dict, got: dict, prefixes: dict) -> None:
        """Consume the assigned partitions into ``got`` (per partition of ``ranges``: offsets,
        values, timestamps in ms, cut flags) until every partition of ``ends`` passed its end;
        records past a range's end, or of an assigned partition not in ``ranges``, go to the
        carry (:meth:`fetch`)."""
        confluent_kafka()
        from confluent_kafka import KafkaError, TopicPartition
        heads = {t: (pre + b"{", len(pre)) for t, pre in prefixes.items()}
        carry = self._carry
        done = ends.pop
        quiet_since = time.monotonic()
        while ends:
            msgs = consumer.consume(num_messages=20_000, timeout=0.5)
            if msgs:
                quiet_since = time.monotonic()
            for m in msgs:
                err = m.error()
                topic, p, o = m.topic(), m.partition(), m.offset()
                tp = (topic, p)
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if tp in ends and o is not None and o >= ends[tp]:
                            done(tp)     # what is left were control records (transactions' markers)
                        continue
                    if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                        lost = self.check_retained(ranges)
                        if lost:
                            raise lost from None
                    raise SourceError(f"Kafka at {self.bootstrap}: reading topic {topic} partition {p} failed: "
                                      f"{err.str()}")
                v = m.value()
                cut = False
                head = heads.get(topic)
                if head is not None and v is not None and v.startswith(head[0]) and v.endswith(b"}"):
                    v, cut = v[head[1]:-1], True
                end = ranges.get(tp, (0, -1))[1]
                if o >= end:   # fetched ahead: the next fetch's
                    carry.setdefault(tp, deque()).append((o, v, m.timestamp()[1], cut))
                    if tp in ends:
                        done(tp)   # (offsets a compacted topic no longer has)
                    continue
                os_, vs, ts, cs = got[tp]
                os_.append(o)
                vs.append(v)
                ts.append(m.timestamp()[1])
                cs.append(cut)
                if o >= end - 1 and tp in ends:
                    done(tp)
            if not msgs and ends:
                # the last records of a partition may be control records (no message): its position says
                for part in consumer.position([TopicPartition(t, p) for t, p in ends]):
                    if part.offset >= 0 and part.offset >= ends[(part.topic, part.partition)]:
                        done((part.topic, part.partition))
                if ends and time.monotonic() - quiet_since > self.timeout_s:
                    lost = self.check_retained(ranges)
                    if lost:
                        raise lost
                    raise SourceError(f"Kafka at {self.bootstrap} sent no record for {self.timeout_s:.0f} s while "
                                      f"{len(ends)} partitions had records to read (e.g. {sorted(ends)[0]}, up to "
                                      f"offset {ends[sorted(ends)[0]] - 1}); check that the brokers run")

    @staticmethod
    def session(create: bool = True):
        """The Spark session the reads run in: the thread's active one, else the process's
        (``SparkSession.active()``: dbt runs models in threads of its own, where no session is
        active; over Spark Connect, the client's default session), else a local one (a command
        of its own: ``consistent-stream status``), or None (``create`` false)."""
        from pyspark.errors import PySparkRuntimeError
        from pyspark.sql import SparkSession
        try:
            spark = SparkSession.active()
        except PySparkRuntimeError:   # NO_ACTIVE_OR_DEFAULT_SESSION
            spark = None
        if spark is None and not create:
            return None
        if spark is None:
            from ...session import with_delta
            builder = (with_delta(SparkSession.builder, master="local[1]")
                       .config("spark.ui.enabled", "false"))
            spark = builder.getOrCreate()
        _quiet_group_id_warning(spark)
        return spark

    def frame(self, ranges: dict[tuple[str, int], tuple[int, int]]):
        """The records of ``ranges`` ((topic, partition) -> [start, end) offsets, at least one
        not empty) as a lazy Spark DataFrame of Spark's Kafka source (``topic``,
        ``partition``, ``offset``, ``value``, ``timestamp``, ...), read where Spark runs when
        a query uses it: what :meth:`read` brings to the driver, and what a computation over
        a whole topic (:mod:`.table`) reads on the executors, in :meth:`session`."""
        spark = self.session()
        assign: dict[str, list[int]] = {}
        starts: dict[str, dict[str, int]] = {}
        ends: dict[str, dict[str, int]] = {}
        for (topic, p), (start, end) in sorted(ranges.items()):
            if end <= start:
                continue
            assign.setdefault(topic, []).append(p)
            starts.setdefault(topic, {})[str(p)] = int(start)
            ends.setdefault(topic, {})[str(p)] = int(end)
        return (spark.read.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
                .option("kafka.group.id", self.group_id)
                .option("assign", json.dumps(assign)).option("startingOffsets", json.dumps(starts))
                .option("endingOffsets", json.dumps(ends)).option("failOnDataLoss", "true").load())

    def check_retained(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> SourceError | None:
        """The SourceError for the first range whose start offset retention (or DeleteRecords)
        has removed, or None when every start is still readable."""
        for (topic, p), (start, _end) in sorted(ranges.items()):
            for part in self.partitions(topic):
                if part.partition == p and part.low > start:
                    return lost_offset(topic, p, start, part.low)
        return None


def _binary(values: list) -> list[pa.Array]:
    """``values`` (bytes or None) as Arrow binary arrays (one, or several where the bytes pass
    the 2 GiB a binary array's offsets hold), the bytes joined once: a quarter of
    ``pa.array``'s time on a list of Kafka values of a few KB (its builder grows its buffer
    value by value)."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), bool, n)
    present = values if valid.all() else [v if v is not None else b"" for v in values]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, present), np.int64, n), out=offsets[1:])
    if offsets[-1] >= 2 ** 31 - 1 and n > 1:
        return _binary(values[:n // 2]) + _binary(values[n // 2:])
    mask = None if valid.all() else pa.array(valid).buffers()[1]
    return [pa.Array.from_buffers(pa.binary(), n, [mask, pa.py_buffer(offsets.astype(np.int32)),
                                                   pa.py_buffer(b"".join(present))])]


def lost_offset(topic: str, partition: int, offset: int, low: int) -> SourceError:
    """The error for offset ``offset`` of ``topic`` partition ``partition``, deleted by
    retention (``low`` is the first offset still there)."""
    return SourceError(
        f"Kafka topic {topic} partition {partition}: offset {offset}, where this model's next read starts, is no "
        f"longer in Kafka (the first offset still there is {low}: retention or DeleteRecords removed "
        f"{low - offset} records that were never read). Nothing was committed. Run `dbt run --full-refresh` "
        f"for this model to rebuild it from what the topics hold; if the topics no longer start at the "
        f"connector's snapshot either, make the connector take a new snapshot first (a new topic.prefix, or "
        f"an incremental snapshot signal)")
