"""Credentials and connection manager: dbt-spark's, under the type ``consistent_spark``, plus
``method: connect``.

Every dbt-spark profile field works unchanged; with ``method: session`` the SparkSession is
built in this process by ``SparkSession.builder.enableHiveSupport()`` with the profile's
``server_side_parameters`` as builder configs. :meth:`ConsistentSparkConnectionManager.open`
builds it that way when the connection opens, adding delta-spark's jars, SQL extension and
catalog (``consistent_stream.session.delta_confs``) where the profile does not set them.

With ``method: connect`` the session is a Spark Connect client of the server at ``host``
(``sc://<host>:<port>``, Spark Connect's connection string; ``SPARK_REMOTE`` when ``host`` is
not set; the profile's ``token`` and ``use_ssl`` are added to it as the string's ``token`` and
``use_ssl`` parameters). One session per process, shared by dbt's threads as the classic one
is; dbt's own statements and the consistent_stream models run over it, and this process starts
no JVM. ``server_side_parameters`` are set on it when they are runtime confs; a static one
(the server's own: jars, catalog, master) is an error that names it.
"""

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from dbt.adapters.contracts.connection import Connection
from dbt.adapters.spark.connections import (
    SparkConnectionManager,
    SparkConnectionMethod,
    SparkCredentials,
)
from dbt_common.dataclass_schema import StrEnum
from dbt_common.exceptions import DbtRuntimeError


class ConsistentSparkConnectionMethod(StrEnum):
    """dbt-spark's connection methods and ``connect`` (Spark Connect)."""
    THRIFT = "thrift"
    HTTP = "http"
    ODBC = "odbc"
    SESSION = "session"
    CONNECT = "connect"


@dataclass
class ConsistentSparkCredentials(SparkCredentials):
    method: ConsistentSparkConnectionMethod = None  # type: ignore
    connect_parameters: Optional[str] = None
    """``method: connect``: the connection string's parameters other than ``token`` and
    ``use_ssl`` (``user_id=..;session_id=..``), taken out of ``host`` so that ``host`` (which
    ``dbt debug`` prints) never holds a token."""
    warm_session: bool = False
    """``method: session``: keep the session in a local Spark Connect server that later runs
    from the same directory reuse (:mod:`consistent_stream.warm_session`) instead of building
    it in this process; this process is then its Connect client."""
    warm_session_idle_minutes: float = 30.0
    """``warm_session``: how long the server stays up with no run using it."""

    @classmethod
    def __pre_deserialize__(cls, data: Any) -> Any:
        data = super().__pre_deserialize__(data)
        if data.get("method") == ConsistentSparkConnectionMethod.CONNECT and not data.get("host"):
            data["host"] = os.environ.get("SPARK_REMOTE")
        return data

    def __post_init__(self) -> None:
        if self.method == ConsistentSparkConnectionMethod.CONNECT:
            if not self.host:
                raise DbtRuntimeError("method: connect needs `host: sc://<host>:<port>` in the profile "
                                      "(or SPARK_REMOTE in the environment)")
            if not str(self.host).startswith("sc://"):
                raise DbtRuntimeError(f"method: connect: host {without_parameters(str(self.host))!r} is not a "
                                      f"Spark Connect address; write it as sc://<host>:<port> (e.g. "
                                      f"sc://127.0.0.1:15002)")
            url = str(self.host)
            params = [p for p in (url.split("/;", 1)[1].split(";") if "/;" in url else []) if p]
            rest = []
            for p in params:
                key, _, value = p.partition("=")
                if key == "token":
                    self.token = self.token or value
                elif key == "use_ssl":
                    self.use_ssl = self.use_ssl or value.lower() == "true"
                else:
                    rest.append(p)
            self.host = without_parameters(url).rstrip("/")
            self.connect_parameters = ";".join(filter(None, [self.connect_parameters or "", *rest])) or None
        super().__post_init__()

    @property
    def type(self) -> str:
        return "consistent_spark"

    @property
    def over_connect(self) -> bool:
        """Whether dbt's statements and the models run as a Spark Connect client: ``method:
        connect``, or ``method: session`` with ``warm_session``."""
        return self.method == ConsistentSparkConnectionMethod.CONNECT or (
            self.method == SparkConnectionMethod.SESSION and bool(self.warm_session))

    @property
    def unique_field(self) -> str:
        return without_parameters(str(self.host))

    def _connection_keys(self) -> Tuple[str, ...]:
        return ("method", *super()._connection_keys())

    def connect_url(self) -> str:
        """The Spark Connect connection string: ``host`` with ``connect_parameters``, the
        profile's ``token`` and ``use_ssl`` as its parameters."""
        params = [p for p in (self.connect_parameters or "").split(";") if p]
        if self.token:
            params.append(f"token={self.token}")
        if self.use_ssl:
            params.append("use_ssl=true")
        return str(self.host) + ("/;" + ";".join(params) if params else "")


def without_parameters(url: str) -> str:
    """A connection string without its ``;key=value`` parameters (a token among them)."""
    return url.split("/;", 1)[0]


class ConsistentSparkConnectionManager(SparkConnectionManager):
    TYPE = "consistent_spark"

    @classmethod
    def open(cls, connection: Connection) -> Connection:
        if connection.credentials.method == ConsistentSparkConnectionMethod.CONNECT:
            from dbt.adapters.consistent_spark.connect import open_connect

            return open_connect(connection)
        if connection.credentials.over_connect:   # method: session with warm_session
            from dbt.adapters.consistent_spark.connect import open_warm

            return open_warm(connection)
        if connection.credentials.method == SparkConnectionMethod.SESSION:
            # Spark's Python workers (the engine's data sources, UDFs) unpickle consistent_stream
            # code: they must run this interpreter, where it is installed. pyspark's default is
            # whatever "python3" is on PATH, read once, when the SparkContext starts.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            _start_session(connection.credentials.server_side_parameters)
        return super().open(connection)


PRELOADED = ("numpy", "pandas", "pyarrow.dataset", "pyarrow.parquet", "duckdb", "deltalake", "sqlglot",
             "sqlglot.dialects.duckdb", "sqlglot.dialects.spark")
"""What :func:`_preload` imports while the JVM starts: pandas and numpy (pyspark's converters
import them at the session's first statements), and what a consistent_stream model's first
batch imports (DuckDB, sqlglot's dialects, delta-rs, pyarrow). None of them imports pyspark, so
the thread never holds an import lock the session's own start waits on in turn."""


def _preload() -> None:
    """Import :data:`PRELOADED` on a daemon thread, then open the first batch's DuckDB database
    and warm Arrow's paths (:func:`consistent_stream.duck.prewarm`): for the two seconds
    ``launch_gateway`` waits for the JVM, this process has nothing else to do. An import that
    fails here fails again, with its error, where the module is used."""
    import importlib
    import threading

    def load() -> None:
        for name in PRELOADED:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 (raised again where it is used)
                pass
        try:   # then the first batch's DuckDB database and Arrow paths, as a run's own prewarm does
            from consistent_stream.duck import prewarm
            prewarm()
        except Exception:  # noqa: BLE001 (the run opens them itself)
            pass
    threading.Thread(target=load, name="consistent-stream-preload", daemon=True).start()


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
    _preload()
    from consistent_stream import warm_session
    from consistent_stream.session import with_delta

    try:
        warm_session.release()   # this directory's Derby metastore: one JVM boots it
    except warm_session.WarmSessionError as e:
        raise DbtRuntimeError(str(e)) from None
    builder = SparkSession.builder.enableHiveSupport()
    for parameter, value in session_confs(parameters).items():
        builder = builder.config(parameter, value)
    # last: delta-spark's confs are the profile's values with Delta's added (its extensions,
    # class path and Java options appended to the profile's own)
    with_delta(builder, parameters).getOrCreate()


def session_confs(parameters: dict) -> dict:
    """The session's confs for the profile's ``server_side_parameters``: those, after the
    object store's S3A settings when the warehouse is on one (the catalog reaches the
    warehouse when the session starts, before any model runs: the profile's own ``fs.s3a``
    keys, else the AWS chain; the profile's parameters still win)."""
    from consistent_stream import location

    out = {}
    if location.is_remote(str(parameters.get("spark.sql.warehouse.dir") or "")):
        location.configure(parameters)
        out.update({f"spark.hadoop.{k}": v for k, v in location.spark_hadoop_confs().items()})
    out.update(parameters)
    return out
