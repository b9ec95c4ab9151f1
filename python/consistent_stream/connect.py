"""What differs when the session is a Spark Connect client (``sc://``, pyspark's
``pyspark.sql.connect`` classes) rather than a classic one with a JVM beside Python.

The engine itself runs in the client's process either way (the batch loop, cut planning,
the local engine, delta-rs commits: :mod:`consistent_stream.query`); only Spark's share of a
batch goes to the server, as DataFrames. Three things a classic session offers do not exist
over Connect, and each has its one answer here:

* **Temporary views bound late.** A classic session analyzes ``spark.sql(text)`` at once, so
  a view the text reads may be dropped as soon as the call returns. Connect sends the text
  and analyzes it on the server at every action, after such a view is gone
  (``TABLE_OR_VIEW_NOT_FOUND``). :func:`sql_over` gives the query its DataFrames inside the
  plan instead (``spark.sql(text, **frames)``: Connect's ``SQL`` relation with the frames as
  ``WithRelations`` references), so nothing named lives in the server's session.
* **No SparkContext.** The default parallelism is asked of the server once per session
  (:func:`default_parallelism`); Spark jobs are not countable from the client (metrics say
  None, :mod:`consistent_stream.metrics`), progress comes from Connect's progress handler.
* **No JVM in this process.** Nothing here starts one: with ``pyspark-client`` alone
  (``pip install 'dbt-consistent-stream[connect]'``) there is none to start.
"""
from __future__ import annotations

import re
import threading
import weakref

CONNECT_PREFIX = "sc://"


def is_connect(spark) -> bool:
    """True when ``spark`` is a Spark Connect session (``pyspark.sql.connect``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def sql_over(spark, text: str, frames: dict):
    """``spark.sql(text)`` where ``text`` reads each name of ``frames`` (name -> DataFrame)
    as a relation. Classic: the frames are temporary views while Spark analyzes the query
    (at once) and dropped before this returns. Connect: ``spark.sql`` with the frames as
    keyword arguments, which puts their plans inside the query's, so the DataFrame returned
    can be analyzed again at any later action. Names are matched as whole words (``__cs3_1``
    never matches inside ``__cs3_12``); braces in ``text`` are kept as they are.

    Returns the DataFrame of the query (lazy on Connect)."""
    if not frames:
        return spark.sql(text)
    if is_connect(spark):
        names = sorted(frames, key=len, reverse=True)
        escaped = text.replace("{", "{{").replace("}", "}}")
        escaped = re.sub(r"(?<![\w$])(" + "|".join(map(re.escape, names)) + r")(?![\w$])", r"{\1}", escaped)
        return spark.sql(escaped, **frames)
    created = []
    try:
        for name, df in frames.items():
            df.createOrReplaceTempView(name)
            created.append(name)
        return spark.sql(text)
    finally:
        for name in created:
            spark.catalog.dropTempView(name)


_parallelism: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def default_parallelism(spark) -> int:
    """The parallelism ``spark`` offers (at least 1): the SparkContext's default parallelism
    (the cores of ``local[n]``, the executors' cores on a cluster). Over Connect, where there
    is no SparkContext, the partitions Spark gives a ``range`` with no partition count (what
    it sizes from the same default), asked once per session."""
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    with _lock:
        got = _parallelism.get(spark)
    if got is None:
        conf = spark.conf.get("spark.default.parallelism", None)
        if conf:
            got = int(conf)
        else:
            got = int(spark.sql("SELECT count(DISTINCT p) AS n FROM (SELECT spark_partition_id() AS p "
                                "FROM range(0, 100000))").collect()[0]["n"])
        with _lock:
            _parallelism[spark] = got
    return max(1, got)
