"""Spark Connect for dbt (``method: connect``, and ``method: session`` with ``warm_session``:
:mod:`dbt.adapters.consistent_spark.connections`): this process's one Connect session, and
dbt-spark's session cursor over it. Imported only for those profiles: nothing here starts a JVM
in this process (a warm session's server is a process of its own:
:mod:`consistent_stream.warm_session`)."""

import socket
import threading
from typing import Any, Dict, Optional
from urllib.parse import urlparse

from dbt.adapters.contracts.connection import Connection, ConnectionState
from dbt.adapters.exceptions.connection import FailedToConnectError
from dbt.adapters.spark.session import Cursor, SessionConnectionWrapper
from dbt_common.exceptions import DbtRuntimeError
from pyspark.sql.utils import AnalysisException

from dbt.adapters.consistent_spark.connections import ConsistentSparkCredentials, without_parameters

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
            f"{timeout_s:.0f} s ({e.strerror or e}). Is the server running (Spark's sbin/start-connect-server.sh, "
            f"or a cluster's Connect endpoint, listening on port {port}), and is the profile's host (or SPARK_REMOTE) "
            "its address?") from None


def connect_session(credentials: ConsistentSparkCredentials, url: Optional[str] = None) -> Any:
    """This process's Spark Connect session to ``url`` (default ``credentials.connect_url()``;
    made at the first call, shared by every thread after it), with the profile's runtime
    ``server_side_parameters`` set (none for a warm session's server, which started with all of
    them). Raises DbtRuntimeError naming a static parameter whose value the server does not
    have."""
    from pyspark.sql import SparkSession

    with _lock:
        spark = SparkSession.builder.remote(url or credentials.connect_url()).getOrCreate()
        if credentials.warm_session:
            return spark
        for key, value in credentials.server_side_parameters.items():
            if spark.conf.get(key, None) == value:
                continue
            if not spark.conf.isModifiable(key):
                raise DbtRuntimeError(
                    f"profile server_side_parameters: {key} is a static conf of the Spark Connect server "
                    f"({credentials.unique_field}), which a client cannot set; set it where the server starts "
                    f"(start-connect-server.sh --conf {key}=...) and remove it from the profile")
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


def open_connect(connection: Connection, url: Optional[str] = None) -> Connection:
    """Open ``connection`` (``method: connect``; a warm session's server at ``url``) on this
    process's Connect session; raises FailedToConnectError naming the address (without its
    token) when the server does not answer."""
    if connection.state == ConnectionState.OPEN:
        return connection
    creds = connection.credentials
    address = without_parameters(url) if url else creds.unique_field
    reach(address)
    try:
        session = connect_session(creds, url)
        session.sql("SELECT 1").collect()   # reach the server now: a wrong address fails here, named
    except DbtRuntimeError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FailedToConnectError(f"failed to connect to Spark Connect at {address}: "
                                   f"{type(e).__name__}: {first}") from e
    connection.handle = SessionConnectionWrapper(ConnectHandle(session, creds.server_side_parameters))
    connection.state = ConnectionState.OPEN  # type: ignore
    return connection


_kept_alive: Dict[str, Any] = {}


def open_warm(connection: Connection) -> Connection:
    """Open ``connection`` (``method: session`` with ``warm_session``) as a Connect client of the
    local server that keeps the session between runs (:func:`consistent_stream.warm_session.
    ensure`: started with the profile's ``server_side_parameters`` in this directory unless it
    runs with them), and keep that server up while this process runs. Raises
    FailedToConnectError when it cannot be started, or another one is in use here."""
    if connection.state == ConnectionState.OPEN:
        return connection
    from consistent_stream import warm_session

    from dbt.adapters.consistent_spark.connections import session_confs

    creds = connection.credentials
    with _lock:
        try:
            server = warm_session.ensure(session_confs(creds.server_side_parameters),
                                         idle_s=float(creds.warm_session_idle_minutes) * 60)
        except warm_session.WarmSessionError as e:
            raise FailedToConnectError(f"warm_session: {e}") from None
        if server.dir not in _kept_alive:
            _kept_alive[server.dir] = warm_session.keep_alive(server)
    return open_connect(connection, server.url)
