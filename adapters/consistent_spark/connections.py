"""Credentials and connection manager: dbt-spark's, under the type ``consistent_spark``.

Every dbt-spark profile field works unchanged; with ``method: session`` the SparkSession is
built in this process by ``SparkSession.builder.enableHiveSupport()`` with the profile's
``server_side_parameters`` as builder configs. :meth:`ConsistentSparkConnectionManager.open`
builds it that way when the connection opens, adding delta-spark's jars, SQL extension and
catalog (``consistent_stream.session.delta_confs``) where the profile does not set them.
"""

import os
import sys
from dataclasses import dataclass

from dbt.adapters.contracts.connection import Connection
from dbt.adapters.spark.connections import (
    SparkConnectionManager,
    SparkConnectionMethod,
    SparkCredentials,
)


@dataclass
class ConsistentSparkCredentials(SparkCredentials):
    @property
    def type(self) -> str:
        return "consistent_spark"


class ConsistentSparkConnectionManager(SparkConnectionManager):
    TYPE = "consistent_spark"

    @classmethod
    def open(cls, connection: Connection) -> Connection:
        if connection.credentials.method == SparkConnectionMethod.SESSION:
            # Spark's Python workers (the engine's data sources, UDFs) unpickle consistent_stream
            # code: they must run this interpreter, where it is installed. pyspark's default is
            # whatever "python3" is on PATH, read once, when the SparkContext starts.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            _start_session(connection.credentials.server_side_parameters)
        return super().open(connection)


def _start_session(parameters: dict) -> None:
    """Build the process's SparkSession as dbt-spark's session cursor would
    (``SparkSession.builder.enableHiveSupport()`` with the profile's ``parameters``), plus
    delta-spark's confs where the profile does not set them, unless a session is already
    active. dbt-spark's cursor then finds it and applies only the profile's (runtime) confs:
    delta-spark's static confs in ``server_side_parameters`` would make every statement warn
    "Using an existing Spark session; only runtime SQL configurations will take effect"."""
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        return
    from consistent_stream import location
    from consistent_stream.session import with_delta

    builder = SparkSession.builder.enableHiveSupport()
    if location.is_remote(str(parameters.get("spark.sql.warehouse.dir") or "")):
        # the catalog reaches the warehouse when the session starts, before any model runs:
        # the store's S3A settings (the profile's own fs.s3a keys, else the AWS chain) go in
        # first, and the profile's parameters below still win
        location.configure(parameters)
        for k, v in location.spark_hadoop_confs().items():
            builder = builder.config(f"spark.hadoop.{k}", v)
    for parameter, value in parameters.items():
        builder = builder.config(parameter, value)
    # last: delta-spark's confs are the profile's values with Delta's added (its extensions,
    # class path and Java options appended to the profile's own)
    with_delta(builder, parameters).getOrCreate()
