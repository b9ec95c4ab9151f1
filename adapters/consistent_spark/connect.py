"""Spark Connect for dbt (``method: connect``, :mod:`dbt.adapters.consistent_spark.connections`):
this process's one Connect session, and dbt-spark's session cursor over it. Imported only when
a profile uses ``method: connect``: nothing here starts a JVM."""

import socket
import threading
from typing import Any, Dict, Optional
from urllib.parse import urlparse

from dbt.adapters.contracts.connection import Connection, ConnectionState
from dbt.adapters.exceptions.connection import FailedToConnectError
from dbt.adapters.spark.session import Cursor, SessionConnectionWrapper
from dbt_common.exceptions import DbtRuntimeError
from pyspark.sql.utils import AnalysisException

from dbt.adapters.consistent_spark.connections import ConsistentSparkCredentials

_lock = threading.Lock()

DEFAULT_PORT = 15002
"""Spark Connect's port when the connection string names none."""
REACH_TIMEOUT_S = 10.0
"""How long opening a connection waits for the server's address to accept a TCP connection."""


def reach(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Check that the server of connection string ``address`` (``sc://host[:port]``, without its
    parameters) accepts a TCP connection within ``timeout_s`` seconds; raises
    FailedToConnectError naming it. (Connect's client would retry an unreachable address with
    backoff for minutes before it fails.)"""
    u = urlparse(address.replace("sc://", "http://", 1))
    host, port = u.hostname or "", u.port or DEFAULT_PORT
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise FailedToConnectError(
            f"failed to connect to Spark Connect at {address}: nothing accepted a connection at {host}:{port} within "
            f"{timeout_s:.0f} s ({e.strerror or e}). Is the server running (consistent-stream cluster start "
            f"--connect-port {port}), and is the profile's host (or SPARK_REMOTE) its address?") from None


def connect_session(credentials: ConsistentSparkCredentials) -> Any:
    """This process's Spark Connect session to ``credentials.connect_url()`` (made at the first
    call, shared by every thread after it), with the profile's runtime ``server_side_parameters``
    set. Raises DbtRuntimeError naming a static parameter whose value the server does not have."""
    from pyspark.sql import SparkSession

    with _lock:
        spark = SparkSession.builder.remote(credentials.connect_url()).getOrCreate()
        for key, value in credentials.server_side_parameters.items():
            if spark.conf.get(key, None) == value:
                continue
            if not spark.conf.isModifiable(key):
                raise DbtRuntimeError(
                    f"profile server_side_parameters: {key} is a static conf of the Spark Connect server "
                    f"({credentials.unique_field}), which a client cannot set; set it where the server starts "
                    f"(consistent-stream cluster start --connect-conf {key}=...) and remove it from the profile")
            spark.conf.set(key, value)
        return spark


class ConnectCursor(Cursor):
    """dbt-spark's session cursor over a Spark Connect session instead of the classic one
    its ``execute`` builds."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session

    def execute(self, sql: str, *parameters: Any) -> None:
        if len(parameters) > 0:
            sql = sql % parameters
        try:
            self._df = self.session.sql(sql)
        except AnalysisException as exc:
            raise DbtRuntimeError(str(exc)) from exc


class ConnectHandle:
    """What dbt-spark's ``SessionConnectionWrapper`` wraps: cursors over one Connect session."""

    def __init__(self, session: Any, server_side_parameters: Optional[Dict[str, str]] = None) -> None:
        self.session = session
        self.server_side_parameters = server_side_parameters or {}

    def cursor(self) -> ConnectCursor:
        return ConnectCursor(self.session)


def open_connect(connection: Connection) -> Connection:
    """Open ``connection`` (``method: connect``) on this process's Connect session; raises
    FailedToConnectError naming the address (without its token) when the server does not answer."""
    if connection.state == ConnectionState.OPEN:
        return connection
    creds = connection.credentials
    reach(creds.unique_field)
    try:
        session = connect_session(creds)
        session.sql("SELECT 1").collect()   # reach the server now: a wrong address fails here, named
    except DbtRuntimeError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FailedToConnectError(f"failed to connect to Spark Connect at {creds.unique_field}: "
                                   f"{type(e).__name__}: {first}") from e
    connection.handle = SessionConnectionWrapper(ConnectHandle(session, creds.server_side_parameters))
    connection.state = ConnectionState.OPEN  # type: ignore
    return connection
