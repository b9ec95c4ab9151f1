"""Credentials and connection manager: dbt-spark's, under the type ``consistent_spark``.

Every dbt-spark profile field works unchanged; with ``method: session`` the SparkSession is
built in this process by ``SparkSession.builder.enableHiveSupport()`` with the profile's
``server_side_parameters`` as builder configs (on the first statement dbt runs), to which
:meth:`ConsistentSparkConnectionManager.open` adds delta-spark's jars, SQL extension and
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
            from consistent_stream.session import delta_confs
            parameters = connection.credentials.server_side_parameters
            parameters.update(delta_confs(parameters))
        return super().open(connection)
