"""A real Kafka + Kafka Connect + Debezium PostgreSQL stack on loopback, for the tests, the
benchmarks and the demos of the Debezium source: Apache Kafka 4.1.1 (one KRaft node, broker
and controller in one JVM), one Kafka Connect 4.1.1 distributed worker (a second JVM) and
Debezium's PostgreSQL connector 3.6.1.Final as a Connect plugin, all from Maven Central.

    python -m consistent_stream_testing.kafka_stack install               # make .venv runs it: the jars, once
    python -m consistent_stream_testing.kafka_stack start --dir D [--postgres] [--partitions N]
                  [--broker-port P] [--controller-port P] [--connect-port P]   # prints the state as JSON
    python -m consistent_stream_testing.kafka_stack register --dir D --name N --tables a,b --prefix P [--dsn DSN]
                  [--decimal-handling precise|string|double] [--partitions N] [--set KEY=VALUE ...]
    python -m consistent_stream_testing.kafka_stack stop --dir D

The jars are resolved once, at install, with Spark's Ivy (:func:`consistent_stream.session.resolve`)
into three caches under :func:`consistent_stream.session.jars_root`, each named after its main
coordinate:

* ``org.apache.kafka_kafka_2.13_4.1.1``: the broker (``kafka.Kafka``; storage formatted with
  ``kafka.tools.StorageTool format -t <cluster id>`` for a static one-voter quorum), with
  log4j2's binding for slf4j 1.7 (``log4j-slf4j-impl``; Kafka 4.1 still calls slf4j-api
  1.7.36) and ``scala-library``, which Spark's resolver always leaves out (Spark ships its own)
  and :func:`install` therefore fetches from Maven Central itself, checked against its SHA-1;
* ``org.apache.kafka_connect-runtime_4.1.1``: the worker (``ConnectDistributed``) with
  ``connect-json`` (JsonConverter), ``connect-transforms``, log4j-core and the same binding;
* ``io.debezium_debezium-connector-postgres_3.6.1.Final``: the worker's ``plugin.path``; the
  connector's jars are in its subdirectory ``debezium-connector-postgres/`` (one plugin, one
  isolated class loader). Plugin isolation is used, not the worker's classpath: Debezium 3.6
  depends on Jackson 2.21 while Connect 4.1 runs on Jackson 2.19, and the plugin's class loader
  lets each keep its own. The Kafka APIs Connect provides to plugins (``connect-api``,
  ``kafka-clients``) and ``slf4j-api`` are excluded from it (Debezium's POM names 4.3.0's).
  The price: at each worker start, Connect logs one ERROR "Failed to discover Converter ...
  CloudEventsConverter" (that converter reflects on JsonConverter with its own Jackson's
  ``JsonNode``); it is not used here, and the connector loads (``plugin.discovery=service_load``).

After install nothing needs the network. :func:`start` runs both JVMs as separate processes
(own process groups, logs ``broker.log`` and ``connect.log`` in the directory, data in
``kafka-logs/``), on free loopback ports, and writes ``kafka_stack.json`` (pids, ports,
bootstrap servers, Connect's URL) so :func:`load` and ``stop`` work from another process.

PostgreSQL must let Debezium decode with ``pgoutput``: a build that limits decoding to the
plugins in ``output_plugin_libraries`` (this project's Debian build,
:mod:`consistent_stream_testing.localpg` sets it to ``wal2json``) gets ``pgoutput`` added by
:func:`allow_pgoutput`, which :meth:`KafkaStack.register_postgres` calls.

Errors: :class:`KafkaStackError` (a ``RuntimeError``) when the jars are missing (with the
command that installs them), cannot be fetched, a JVM does not come up (naming its log file,
with its tail), or a connector fails (with its trace).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from consistent_stream import session
from consistent_stream.daemons import free_port, process_alive
from consistent_stream.errors import ConsistentStreamError

from . import jvm
from .jvm import MAVEN

KAFKA_VERSION = "4.1.1"
DEBEZIUM_VERSION = "3.6.1.Final"
LOG4J_VERSION = "2.24.3"
BROKER_COORDINATES = (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
                      f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}")
CONNECT_COORDINATES = (f"org.apache.kafka:connect-runtime:{KAFKA_VERSION}",
                       f"org.apache.kafka:connect-json:{KAFKA_VERSION}",
                       f"org.apache.kafka:connect-transforms:{KAFKA_VERSION}",
                       f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
                       f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}")
DEBEZIUM_COORDINATES = (f"io.debezium:debezium-connector-postgres:{DEBEZIUM_VERSION}",)
# provided by the worker to every plugin (parent-first), or not needed by it
DEBEZIUM_EXCLUDES = ("org.apache.kafka:connect-api", "org.apache.kafka:kafka-clients", "org.slf4j:slf4j-api",
                     "jakarta.ws.rs:jakarta.ws.rs-api", "com.github.luben:zstd-jni", "at.yawk.lz4:lz4-java",
                     "org.lz4:lz4-java", "org.xerial.snappy:snappy-java")
PLUGIN_DIR = "debezium-connector-postgres"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
STATUS_TOPIC = "connect-status"
HOST = "127.0.0.1"
STATE_FILE = "kafka_stack.json"
BROKER_HEAP = "-Xmx512m"
CONNECT_HEAP = "-Xmx768m"
JVM_FLAGS = ("-XX:+UseSerialGC", "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError")


class KafkaStackError(ConsistentStreamError, RuntimeError):
    """The stack's jars are missing, a JVM did not start, or a connector failed."""


# ---------------------------------------------------------------------------------------------- install

def _cache(coordinate: str) -> Path:
    return session.jars_root() / coordinate.replace(":", "_")


def broker_dir() -> Path:
    """The broker's jar cache (with its manifest ``jars.txt``)."""
    return _cache(BROKER_COORDINATES[0])


def connect_dir() -> Path:
    """The Connect worker's jar cache."""
    return _cache(CONNECT_COORDINATES[0])


def plugin_path() -> Path:
    """The worker's ``plugin.path``: a directory holding the Debezium plugin's directory."""
    return _cache(DEBEZIUM_COORDINATES[0])


def install() -> dict[str, list[str]]:
    """Resolve the broker's, the worker's and the Debezium plugin's jars from Maven Central
    into their caches (nothing for a cache already complete), and fetch ``scala-library`` for
    the broker (the version its ``scala-reflect`` has, checked against Maven Central's SHA-1).
    Returns ``{"broker" | "connect" | "debezium": [jar paths]}``. Raises KafkaStackError."""
    try:
        broker = session.resolve(broker_dir(), list(BROKER_COORDINATES))
        connect = session.resolve(connect_dir(), list(CONNECT_COORDINATES))
        debezium = session.resolve(plugin_path() / PLUGIN_DIR, list(DEBEZIUM_COORDINATES), DEBEZIUM_EXCLUDES)
    except session.SessionError as e:
        raise KafkaStackError(str(e)) from e
    if not any(os.path.basename(j).startswith("org.scala-lang_scala-library-") for j in broker):
        broker.append(str(_fetch_scala_library(broker)))
    return {"broker": broker, "connect": connect, "debezium": debezium}


def _fetch_scala_library(broker: list[str]) -> Path:
    reflect = [os.path.basename(j) for j in broker if "scala-reflect-" in os.path.basename(j)]
    if not reflect:
        raise KafkaStackError(f"the broker's jars in {broker_dir()} hold no scala-reflect jar")
    v = reflect[0].rsplit("-", 1)[1].removesuffix(".jar")
    name = f"org.scala-lang_scala-library-{v}.jar"
    d = broker_dir()
    jvm.fetch_maven_jar(f"{MAVEN}/org/scala-lang/scala-library/{v}/scala-library-{v}.jar", d / name, KafkaStackError)
    with open(d / session.MANIFEST, "a") as f:
        f.write(name + "\n")
    return d / name


def _jars(d: Path, what: str) -> list[str]:
    manifest = d / session.MANIFEST
    names = manifest.read_text().split() if manifest.is_file() else []
    if not names or not all((d / n).is_file() for n in names) or (
            d == broker_dir() and not any(n.startswith("org.scala-lang_scala-library-") for n in names)):
        raise KafkaStackError(f"{what} are not installed in {d}: run `{sys.executable} -m "
                              f"consistent_stream_testing.kafka_stack install` once with Maven Central reachable "
                              f"(make .venv does)")
    return [str(d / n) for n in names]


# ---------------------------------------------------------------------------------------------- processes

def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


_LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
logger.reflections.name = org.reflections
logger.reflections.level = error
logger.dbzmetrics.name = io.debezium.metrics.stats.MeasurementCollector
logger.dbzmetrics.level = error
"""


def _java(jars: list[str], heap: str, main: str, args: list[str], log4j: Path, log: Path) -> int:
    return jvm.spawn(["java", heap, *JVM_FLAGS, f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", ":".join(jars),
                      main, *args], log).pid


def _props(path: Path, props: dict[str, object]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


# ---------------------------------------------------------------------------------------------- the stack

@dataclass
class KafkaStack:
    """One running stack: a KRaft broker (``bootstrap``: ``"127.0.0.1:<port>"``) and a Connect
    worker (``connect_url``: ``"http://127.0.0.1:<port>"``), their pids and ports, and the
    directory holding their configs, logs (``broker.log``, ``connect.log``) and data. With
    ``postgres`` (``{"dsn", "root", "port"}``), a :class:`~consistent_stream_testing.localpg.
    LocalPostgres` started with it (CLI ``start --postgres``), stopped with it."""
    directory: str
    host: str
    broker_port: int
    controller_port: int
    connect_port: int
    broker_pid: int = 0
    connect_pid: int = 0
    cluster_id: str = ""
    num_partitions: int = 1
    schemas_enable: bool = True
    offset_flush_interval_ms: int = 10000
    postgres: dict | None = None
    timings: dict = field(default_factory=dict)
    status_mark: int | None = None
    """The end offset of Connect's status topic when the worker was last started again: a
    task counts as RUNNING (:meth:`wait_running`) only once a worker wrote so after it."""

    # -- addresses, files

    @property
    def bootstrap(self) -> str:
        """The broker's bootstrap servers, ``"127.0.0.1:<port>"``."""
        return f"{self.host}:{self.broker_port}"

    @property
    def connect_url(self) -> str:
        """Connect's REST API, ``"http://127.0.0.1:<port>"``."""
        return f"http://{self.host}:{self.connect_port}"

    @property
    def broker_log(self) -> Path:
        return Path(self.directory) / "broker.log"

    @property
    def connect_log(self) -> Path:
        return Path(self.directory) / "connect.log"

    def _save(self) -> None:
        jvm.write_state(Path(self.directory) / STATE_FILE,
                        {**asdict(self), "bootstrap": self.bootstrap, "connect_url": self.connect_url}, indent=1)

    def rss_mb(self) -> dict[str, float | None]:
        """Resident memory of each JVM in MiB (``{"broker": ..., "connect": ...}``; None when down)."""
        return {"broker": _rss_mb(self.broker_pid), "connect": _rss_mb(self.connect_pid)}

    def alive(self) -> dict[str, bool]:
        return {"broker": process_alive(self.broker_pid, reap=True),
                "connect": process_alive(self.connect_pid, reap=True)}

    # -- processes

    def _start_broker(self, timeout_s: float) -> None:
        d = Path(self.directory)
        t0 = time.time()
        jars = _jars(broker_dir(), "the Kafka broker's jars")
        self.broker_pid = _java(jars, BROKER_HEAP, "kafka.Kafka", [str(d / "server.properties")],
                                d / "log4j2.properties", self.broker_log)
        self._save()
        from confluent_kafka.admin import AdminClient
        deadline = time.time() + timeout_s
        while True:
            if not process_alive(self.broker_pid, reap=True):
                raise KafkaStackError(f"the Kafka broker exited; its log {self.broker_log}:\n"
                                      f"{jvm.tail(self.broker_log)}")
            try:
                if (jvm.port_open(self.host, self.broker_port)
                        and AdminClient(self._client_conf()).list_topics(timeout=5).brokers):
                    break
            except Exception:
                pass
            if time.time() > deadline:
                jvm.kill(self.broker_pid)
                raise KafkaStackError(f"the Kafka broker did not answer on {self.bootstrap} within {timeout_s:.0f} s; "
                                      f"its log {self.broker_log}:\n{jvm.tail(self.broker_log)}")
            time.sleep(0.3)
        self.timings["broker_s"] = round(time.time() - t0, 2)

    def start_connect(self, timeout_s: float = 180.0) -> None:
        """Start the Connect worker (again, after :meth:`stop_connect` / :meth:`kill_connect`):
        same REST port, group and storage topics, so the connectors registered before resume
        from their stored offsets. Returns when ``GET /connector-plugins`` lists Debezium's
        PostgreSQL connector. Raises KafkaStackError (naming ``connect.log``, with its tail)."""
        if process_alive(self.connect_pid, reap=True):
            raise KafkaStackError(f"the Connect worker (pid {self.connect_pid}) is running")
        d = Path(self.directory)
        t0 = time.time()
        jars = _jars(connect_dir(), "Kafka Connect's jars")
        _jars(plugin_path() / PLUGIN_DIR, "Debezium's PostgreSQL connector jars")
        # the status topic still says RUNNING for the tasks of a worker that was killed
        self.status_mark = sum(h for _, h in self.watermarks(STATUS_TOPIC).values()) if self.connect_pid else None
        self.connect_pid = _java(jars, CONNECT_HEAP, "org.apache.kafka.connect.cli.ConnectDistributed",
                                 [str(d / "connect.properties")], d / "log4j2.properties", self.connect_log)
        self._save()
        deadline = time.time() + timeout_s
        while True:
            if not process_alive(self.connect_pid, reap=True):
                raise KafkaStackError(f"the Connect worker exited; its log {self.connect_log}:\n"
                                      f"{jvm.tail(self.connect_log)}")
            try:
                plugins = self._rest("GET", "/connector-plugins", timeout=2)
                if any(p.get("class") == POSTGRES_CONNECTOR for p in plugins):
                    break
            except (OSError, ValueError):
                pass
            if time.time() > deadline:
                jvm.kill(self.connect_pid)
                raise KafkaStackError(f"Kafka Connect did not list {POSTGRES_CONNECTOR} at {self.connect_url}"
                                      f"/connector-plugins within {timeout_s:.0f} s; its log {self.connect_log}:\n"
                                      f"{jvm.tail(self.connect_log)}")
            time.sleep(0.5)
        self.timings["connect_s"] = round(time.time() - t0, 2)
        self._save()

    def stop_connect(self, timeout_s: float = 30.0) -> None:
        """Stop the worker gracefully (SIGTERM: it commits its offsets), SIGKILL after ``timeout_s``."""
        jvm.terminate(self.connect_pid, timeout_s)

    def kill_connect(self) -> None:
        """SIGKILL the worker (no offset commit, no leaving the group); returns when it is gone."""
        jvm.kill(self.connect_pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the worker, then the broker (SIGTERM, SIGKILL after ``timeout_s`` each), then the
        PostgreSQL server started with the stack (if any); removes the state file. The data
        (``kafka-logs/``) and the logs stay in the directory."""
        self.stop_connect(timeout_s)
        jvm.terminate(self.broker_pid, timeout_s)
        if self.postgres and self.postgres.get("root"):
            from .localpg import LocalPostgres
            LocalPostgres(self.postgres["root"], self.postgres["port"]).stop()
        Path(self.directory, STATE_FILE).unlink(missing_ok=True)

    # -- Connect's REST API

    def _rest(self, method: str, path: str, body: dict | None = None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.connect_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text.strip() else None

    def connector_status(self, name: str) -> dict | None:
        """Connect's ``GET /connectors/<name>/status``: ``{"name", "connector": {"state",
        "worker_id", ["trace"]}, "tasks": [{"id", "state", "worker_id", ["trace"]}], "type"}``
        (states UNASSIGNED, RUNNING, PAUSED, FAILED, RESTARTING, STOPPED); None when unknown."""
        try:
            return self._rest("GET", f"/connectors/{name}/status")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def connectors(self) -> list[str]:
        """Names of the registered connectors."""
        return self._rest("GET", "/connectors")

    def delete_connector(self, name: str) -> None:
        """Remove connector ``name`` (its replication slot and publication stay in PostgreSQL)."""
        try:
            self._rest("DELETE", f"/connectors/{name}")
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise

    def connector_offsets(self, name: str) -> list[dict]:
        """The source offsets connector ``name`` committed (Connect's ``GET /connectors/<name>/
        offsets``): ``[{"partition": {"server": <topic prefix>}, "offset": {"lsn", "txId",
        "lsn_commit", "lsn_proc", ...}}]``; empty before the first commit (every
        ``offset_flush_interval_ms``)."""
        return self._rest("GET", f"/connectors/{name}/offsets").get("offsets", [])

    def _restarted(self, name: str, tasks: list[int]) -> bool:
        """Whether the worker started after :attr:`status_mark` wrote RUNNING for each task."""
        if self.status_mark is None:
            return True
        running = set()
        for m in self.consume(STATUS_TOPIC, timeout_s=10):
            if m["value"] is None or m["offset"] < self.status_mark:
                continue
            key = (m["key"] or b"").decode()
            if key.startswith(f"status-task-{name}-") and json.loads(m["value"]).get("state") == "RUNNING":
                running.add(int(key.rsplit("-", 1)[1]))
        return running >= set(tasks)

    def wait_running(self, name: str, timeout_s: float = 120.0) -> dict:
        """Wait until connector ``name`` and all its tasks (at least one) are RUNNING (after
        :meth:`start_connect` started the worker again: RUNNING as the new worker reports it,
        not as the status topic still holds it from the old one); returns its status. Raises
        KafkaStackError with the trace when one is FAILED, or on timeout."""
        deadline = time.time() + timeout_s
        status = None
        while time.time() < deadline:
            try:
                status = self.connector_status(name)
            except (OSError, ValueError):
                status = None
            if status:
                states = [status["connector"]] + status.get("tasks", [])
                failed = [s for s in states if s.get("state") == "FAILED"]
                if failed:
                    raise KafkaStackError(f"connector {name} FAILED (see {self.connect_log}):\n"
                                          f"{failed[0].get('trace', '')[:4000]}")
                if (status.get("tasks") and all(s.get("state") == "RUNNING" for s in states)
                        and self._restarted(name, [t["id"] for t in status["tasks"]])):
                    return status
            time.sleep(0.3)
        raise KafkaStackError(f"connector {name} not RUNNING within {timeout_s:.0f} s: {status}; "
                              f"log {self.connect_log}:\n{jvm.tail(self.connect_log)}")

    def register_postgres(self, name: str, dsn: str, tables: list[str] | str, topic_prefix: str, *,
                          transaction_metadata: bool = True, snapshot_mode: str = "initial", slot: str | None = None,
                          decimal_handling: str = "precise", partitions: int | None = None,
                          extra: dict | None = None, timeout_s: float = 120.0) -> dict:
        """Register Debezium's PostgreSQL connector ``name`` (one task) capturing ``tables``
        (``"schema.table"`` names, or bare names in ``public``; a list or comma-separated) of the
        database ``dsn`` (a libpq key/value string or URI; trust or password auth) into topics
        ``<topic_prefix>.<schema>.<table>`` (and ``<topic_prefix>.transaction`` with
        ``transaction_metadata``): ``plugin.name=pgoutput``, replication slot ``slot`` (default
        ``dbz_<name>``, lower-cased, other characters as ``_``), publication ``<slot>_pub``
        (``publication.autocreate.mode=filtered``), ``decimal.handling.mode=decimal_handling``
        (``precise``: Connect's ``Decimal``; ``string`` and ``double`` also propagate each
        column's source type, ``column.propagate.source.type=.*``, from which a ``numeric(p,s)``
        column is read as ``decimal(p,s)``), ``snapshot.mode=snapshot_mode``. The data topics
        Connect creates get ``partitions`` partitions (default: the stack's
        ``num_partitions``; ``topic.creation.default.partitions``), the transaction topic
        always one (a ``topic.creation`` group of its own: its order is the commit order).
        ``extra`` (connector config keys -> values) last. Lets the server decode with pgoutput
        first (:func:`allow_pgoutput`). Returns the connector's status once it and its task are
        RUNNING. Raises KafkaStackError (with the trace when FAILED; Connect's answer when it
        refuses the config) or ValueError for an unknown ``decimal_handling``."""
        if decimal_handling not in ("precise", "string", "double"):
            raise ValueError(f"decimal_handling {decimal_handling!r}: use precise, string or double")
        from psycopg2.extensions import parse_dsn
        allow_pgoutput(dsn)
        p = parse_dsn(dsn)
        if isinstance(tables, str):
            tables = [t.strip() for t in tables.split(",") if t.strip()]
        tables = [t if "." in t else f"public.{t}" for t in tables]
        slot = slot or re.sub(r"[^a-z0-9_]", "_", f"dbz_{name}".lower())
        config = {
            "connector.class": POSTGRES_CONNECTOR, "tasks.max": "1",
            "database.hostname": p.get("host", HOST), "database.port": p.get("port", "5432"),
            "database.user": p.get("user", "postgres"), "database.password": p.get("password", ""),
            "database.dbname": p.get("dbname", p.get("user", "postgres")),
            "topic.prefix": topic_prefix, "table.include.list": ",".join(re.escape(t) for t in tables),
            "plugin.name": "pgoutput", "slot.name": slot, "publication.name": f"{slot}_pub",
            "publication.autocreate.mode": "filtered", "decimal.handling.mode": decimal_handling,
            **({"column.propagate.source.type": ".*"} if decimal_handling != "precise" else {}),
            "provide.transaction.metadata": str(bool(transaction_metadata)).lower(), "snapshot.mode": snapshot_mode,
            "topic.creation.default.partitions": str(partitions or self.num_partitions),
            "topic.creation.default.replication.factor": "1",
            "topic.creation.groups": "transaction",
            "topic.creation.transaction.include": re.escape(f"{topic_prefix}.transaction"),
            "topic.creation.transaction.partitions": "1", "topic.creation.transaction.replication.factor": "1",
            **{k: str(v) for k, v in (extra or {}).items()},
        }
        try:
            self._rest("PUT", f"/connectors/{name}/config", config)
        except urllib.error.HTTPError as e:
            raise KafkaStackError(f"Kafka Connect refused connector {name}: {e.code} "
                                  f"{e.read().decode(errors='replace')[:4000]}") from e
        return self.wait_running(name, timeout_s)

    # -- Kafka clients (confluent-kafka)

    def _client_conf(self, **kw) -> dict:
        return {"bootstrap.servers": self.bootstrap, "broker.address.family": "v4", **kw}

    def admin(self):
        """A confluent-kafka ``AdminClient`` on the broker."""
        from confluent_kafka.admin import AdminClient
        return AdminClient(self._client_conf())

    def topics(self, internal: bool = False) -> list[str]:
        """The topics' names, sorted (without ``__consumer_offsets`` and other ``__`` topics
        unless ``internal``)."""
        names = self.admin().list_topics(timeout=10).topics
        return sorted(n for n in names if internal or not n.startswith("__"))

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (0 when it does not exist)."""
        t = self.admin().list_topics(topic, timeout=10).topics.get(topic)
        return 0 if t is None or t.error is not None else len(t.partitions)

    def create_topic(self, name: str, partitions: int = 1, config: dict | None = None) -> None:
        """Create topic ``name`` (replication factor 1; ``config``: topic configs such as
        ``{"retention.ms": "1000"}``). Raises KafkaStackError when it exists or is refused."""
        from confluent_kafka.admin import NewTopic
        admin = self.admin()   # kept alive until the answer came: a destroyed client abandons its requests
        fut = admin.create_topics([NewTopic(name, partitions, 1, config={k: str(v) for k, v in
                                                                         (config or {}).items()})])
        try:
            fut[name].result(30)
        except Exception as e:
            raise KafkaStackError(f"cannot create topic {name}: {e}") from e

    def produce(self, topic: str, values: list[bytes | None], key: bytes | str | None = None,
                partition: int | None = None) -> list[tuple[int, int]]:
        """Produce ``values`` in order (None: a tombstone) with ``key`` each (acks=all,
        idempotent), to ``partition`` or the partitioner's choice; returns ``(partition,
        offset)`` of each. Raises KafkaStackError when one is not acknowledged."""
        from confluent_kafka import Producer
        pr = Producer(self._client_conf(**{"acks": "all", "enable.idempotence": True}))
        out: list = [None] * len(values)
        errors: list = []

        def done(i):
            def cb(err, msg):
                if err is not None:
                    errors.append(err)
                else:
                    out[i] = (msg.partition(), msg.offset())
            return cb
        for i, v in enumerate(values):
            kw = {} if partition is None else {"partition": partition}
            pr.produce(topic, value=v, key=key, on_delivery=done(i), **kw)
        left = pr.flush(60)
        if errors or left:
            raise KafkaStackError(f"produce to {topic}: {errors or f'{left} messages not delivered'}")
        return out

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: offsets below ``before_offset`` of ``topic``/``partition``
        become unreadable (the log start offset moves there), as retention would do. Returns the
        new low watermark."""
        from confluent_kafka import TopicPartition
        admin = self.admin()   # kept alive until the answer came: a destroyed client abandons its requests
        fut = admin.delete_records([TopicPartition(topic, partition, before_offset)])
        res = list(fut.values())[0].result(30)
        return res.low_watermark

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` offsets of ``topic`` (empty when it does not exist)."""
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer(self._client_conf(**{"group.id": "cs-watermarks", "enable.auto.commit": False}))
        try:
            md = c.list_topics(topic, timeout=10).topics.get(topic)
            if md is None or md.error is not None:
                return {}
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in md.partitions}
        finally:
            c.close()

    def consume(self, topic: str, *, min_count: int = 0, timeout_s: float = 30.0) -> list[dict]:
        """Every message of ``topic`` from its low watermark to its end, all partitions (no
        consumer group; nothing committed), waiting up to ``timeout_s`` for at least
        ``min_count``: ``[{"partition", "offset", "key", "value" (bytes or None),
        "timestamp" (ms)}]`` in partition then offset order. Fewer when the time runs out."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        deadline = time.time() + timeout_s
        c = Consumer(self._client_conf(**{"group.id": "cs-reader", "enable.auto.commit": False,
                                          "enable.partition.eof": True, "auto.offset.reset": "earliest"}))
        got: dict[tuple[int, int], dict] = {}
        try:
            while True:
                t = c.list_topics(topic, timeout=10).topics.get(topic)
                parts = sorted(t.partitions) if t is not None and t.error is None else []
                if parts:
                    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
                    pos = {p: max([o + 1 for (q, o) in got if q == p], default=OFFSET_BEGINNING) for p in parts}
                    todo = {p for p in parts if (pos[p] if pos[p] >= 0 else 0) < ends[p]}
                    if todo:
                        c.assign([TopicPartition(topic, p, pos[p]) for p in sorted(todo)])
                        while todo and time.time() < deadline:
                            m = c.poll(1.0)
                            if m is None:
                                continue
                            if m.error():
                                if m.error().code() == -191:  # _PARTITION_EOF
                                    todo.discard(m.partition())
                                continue
                            got[(m.partition(), m.offset())] = {
                                "partition": m.partition(), "offset": m.offset(), "key": m.key(),
                                "value": m.value(), "timestamp": m.timestamp()[1]}
                            if m.offset() + 1 >= ends[m.partition()]:
                                todo.discard(m.partition())
                        c.unassign()
                if len(got) >= min_count or time.time() >= deadline:
                    break
                time.sleep(0.3)
        finally:
            c.close()
        return [got[k] for k in sorted(got)]


def allow_pgoutput(dsn: str) -> bool:
    """Let the server of ``dsn`` decode with ``pgoutput``: when it has the
    ``output_plugin_libraries`` setting (this project's Debian build; :mod:`~consistent_stream_testing.
    localpg` sets it to ``wal2json``) and it does not list pgoutput, add it (``ALTER
    SYSTEM``, needs a superuser) and reload. Returns whether it changed anything. Raises
    KafkaStackError when the change is refused."""
    from . import localpg
    row = localpg.execute(dsn, "SELECT setting FROM pg_settings WHERE name = 'output_plugin_libraries'")
    if not row:
        return False
    libs = _plugin_list(row[0][0])
    if "pgoutput" in libs:
        return False
    # a list setting: one literal per library ('a, b' as one literal would be one name)
    value = ", ".join("'" + lib.replace("'", "''") + "'" for lib in libs + ["pgoutput"])
    try:
        localpg.execute(dsn, f"ALTER SYSTEM SET output_plugin_libraries = {value}")
        localpg.execute(dsn, "SELECT pg_reload_conf()")
    except Exception as e:
        raise KafkaStackError(f"PostgreSQL ({dsn}) does not let Debezium decode with pgoutput and refused to allow it "
                              f"({e}): run ALTER SYSTEM SET output_plugin_libraries = {value} as a superuser, then "
                              f"SELECT pg_reload_conf()") from e
    deadline = time.time() + 10
    while time.time() < deadline:
        row = localpg.execute(dsn, "SELECT setting FROM pg_settings WHERE name = 'output_plugin_libraries'")
        if "pgoutput" in _plugin_list(row[0][0]):
            break
        time.sleep(0.1)
    return True


def _plugin_list(setting: str) -> list[str]:
    return [x.strip().strip('"') for x in setting.split(",") if x.strip().strip('"')]


def _cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def start(directory: str | Path, *, pg_dsn: str | None = None, host: str = HOST, num_partitions: int = 1,
          schemas_enable: bool = True, offset_flush_interval_ms: int = 10000, worker_config: dict | None = None,
          broker_config: dict | None = None, broker_port: int | None = None, controller_port: int | None = None,
          connect_port: int | None = None, timeout_s: float = 180.0) -> KafkaStack:
    """Start a single-node KRaft broker (broker and controller in one JVM, ``-Xmx512m``) and a
    Connect distributed worker (``-Xmx768m``) on ``host``, at ``broker_port``,
    ``controller_port`` and ``connect_port`` (Connect's REST API; each a free port when not
    given), with their files in ``directory`` (created; an earlier stack's data there is
    wiped): the data topics of connectors registered with :meth:`KafkaStack.register_postgres`
    get ``num_partitions`` partitions by default, every other topic the broker creates one,
    every replication factor 1, the worker's converters
    JsonConverter with ``schemas.enable`` = ``schemas_enable`` for keys and values, its offsets
    flushed every ``offset_flush_interval_ms`` ms, ``worker_config`` / ``broker_config`` (keys
    -> values) added last. Returns when the broker answers and the worker lists Debezium's
    PostgreSQL connector; ``timeout_s`` each. ``pg_dsn`` is only recorded (``postgres.dsn`` in
    the state file) for the CLI's ``register``. Raises KafkaStackError (jars missing; a JVM
    exited or stayed silent, naming its log and with its tail)."""
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    old = load(d)
    if old and (process_alive(old.broker_pid, reap=True) or process_alive(old.connect_pid, reap=True)):
        raise KafkaStackError(f"a stack is already running in {d} (pids {old.broker_pid}, {old.connect_pid})")
    for name in ("kafka-logs", "broker.log", "connect.log"):
        p = d / name
        if p.is_dir():
            import shutil
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    broker_jars = _jars(broker_dir(), "the Kafka broker's jars")
    given = [p for p in (broker_port, controller_port, connect_port) if p]
    if len(set(given)) != len(given):
        raise KafkaStackError(f"the broker, controller and Connect ports must differ: {given}")
    free = set()
    while len(free) < 3 - len(given):
        p = free_port(host)
        if p not in given:
            free.add(p)
    free = sorted(free)
    bport, cport, rport = (p or free.pop(0) for p in (broker_port, controller_port, connect_port))
    stack = KafkaStack(directory=str(d), host=host, broker_port=bport, controller_port=cport, connect_port=rport,
                       cluster_id=_cluster_id(), num_partitions=num_partitions, schemas_enable=schemas_enable,
                       offset_flush_interval_ms=offset_flush_interval_ms,
                       postgres={"dsn": pg_dsn} if pg_dsn else None)
    (d / "log4j2.properties").write_text(_LOG4J2)
    _props(d / "server.properties", {
        "process.roles": "broker,controller", "node.id": 1,
        "controller.quorum.voters": f"1@{host}:{cport}",
        "listeners": f"PLAINTEXT://{host}:{bport},CONTROLLER://{host}:{cport}",
        "advertised.listeners": f"PLAINTEXT://{host}:{bport}",
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": d / "kafka-logs", "num.partitions": 1, "auto.create.topics.enable": "true",
        "default.replication.factor": 1, "min.insync.replicas": 1,
        "offsets.topic.replication.factor": 1, "offsets.topic.num.partitions": 1,
        "transaction.state.log.replication.factor": 1, "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.replication.factor": 1, "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0, "num.network.threads": 2, "num.io.threads": 2,
        "background.threads": 2, "log.retention.check.interval.ms": 10000,
        **(broker_config or {})})
    schemas = str(bool(schemas_enable)).lower()
    _props(d / "connect.properties", {
        "bootstrap.servers": stack.bootstrap, "group.id": "consistent-stream-connect",
        "key.converter": JSON_CONVERTER, "value.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": schemas, "value.converter.schemas.enable": schemas,
        "config.storage.topic": "connect-configs", "offset.storage.topic": "connect-offsets",
        "status.storage.topic": STATUS_TOPIC, "config.storage.replication.factor": 1,
        "offset.storage.replication.factor": 1, "status.storage.replication.factor": 1,
        "offset.storage.partitions": 1, "status.storage.partitions": 1,
        "offset.flush.interval.ms": offset_flush_interval_ms,
        "listeners": f"http://{host}:{rport}", "rest.advertised.host.name": host, "rest.advertised.port": rport,
        "plugin.path": plugin_path(), "plugin.discovery": "service_load",
        # a worker killed and started again rejoins as a new member: no waiting for the old one
        "scheduled.rebalance.max.delay.ms": 0, "session.timeout.ms": 6000, "heartbeat.interval.ms": 2000,
        **(worker_config or {})})
    t0 = time.time()
    fmt = subprocess.run(["java", "-Xmx256m", *JVM_FLAGS, f"-Dlog4j2.configurationFile=file:{d / 'log4j2.properties'}",
                          "-cp", ":".join(broker_jars), "kafka.tools.StorageTool", "format", "-t", stack.cluster_id,
                          "-c", str(d / "server.properties")], capture_output=True, text=True)
    if fmt.returncode != 0:
        raise KafkaStackError(f"kafka.tools.StorageTool format failed ({fmt.returncode}):\n"
                              f"{(fmt.stdout + fmt.stderr)[-3000:]}")
    stack.timings["format_s"] = round(time.time() - t0, 2)
    try:
        stack._start_broker(timeout_s)
        stack.start_connect(timeout_s)
    except BaseException:
        stack.stop(5)
        raise
    stack._save()
    return stack


def load(directory: str | Path) -> KafkaStack | None:
    """The stack started in ``directory`` (None when there is none)."""
    state = jvm.read_state(Path(directory, STATE_FILE))
    if not isinstance(state, dict):
        return None
    state.pop("bootstrap", None)
    state.pop("connect_url", None)
    try:
        return KafkaStack(**state)
    except TypeError:
        return None


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m consistent_stream_testing.kafka_stack")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    st = sub.add_parser("start")
    st.add_argument("--dir", required=True)
    st.add_argument("--host", default=HOST)
    st.add_argument("--postgres", action="store_true", help="also start a throwaway PostgreSQL 15 (localpg)")
    st.add_argument("--partitions", type=int, default=1,
                    help="partitions of the data topics of the connectors registered (the transaction topic: one)")
    for port in ("broker", "controller", "connect"):
        st.add_argument(f"--{port}-port", type=int, help="default: a free port")
    st.add_argument("--no-schemas", action="store_true", help="JsonConverter schemas.enable=false")
    st.add_argument("--offset-flush-ms", type=int, default=10000)
    rg = sub.add_parser("register")
    rg.add_argument("--dir", required=True)
    rg.add_argument("--name", required=True)
    rg.add_argument("--tables", required=True, help="comma-separated, schema.table or table (public)")
    rg.add_argument("--prefix", required=True, help="topic.prefix")
    rg.add_argument("--dsn", help="default: the PostgreSQL started with --postgres")
    rg.add_argument("--slot")
    rg.add_argument("--snapshot-mode", default="initial")
    rg.add_argument("--no-transaction-metadata", action="store_true")
    rg.add_argument("--decimal-handling", choices=("precise", "string", "double"), default="precise")
    rg.add_argument("--partitions", type=int, help="partitions of its data topics (default: the stack's)")
    rg.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a connector setting, added last (repeatable)")
    sp = sub.add_parser("stop")
    sp.add_argument("--dir", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "install":
            for what, jars in install().items():
                print(f"{what}: {len(jars)} jars in {os.path.dirname(jars[0])}")
        elif args.cmd == "start":
            pg = None
            if args.postgres:
                from .localpg import LocalPostgres
                pg = LocalPostgres.start()
                allow_pgoutput(pg.dsn)
            try:
                s = start(args.dir, pg_dsn=pg.dsn if pg else None, host=args.host, num_partitions=args.partitions,
                          schemas_enable=not args.no_schemas, offset_flush_interval_ms=args.offset_flush_ms,
                          broker_port=args.broker_port, controller_port=args.controller_port,
                          connect_port=args.connect_port)
            except BaseException:
                if pg:
                    pg.stop()
                raise
            if pg:
                s.postgres = {"dsn": pg.dsn, "root": pg.root, "port": pg.port, "datadir": pg.datadir}
                s._save()
            print(json.dumps({"bootstrap": s.bootstrap, "connect_url": s.connect_url, "postgres": s.postgres,
                              "pids": {"broker": s.broker_pid, "connect": s.connect_pid}, "timings": s.timings}))
        elif args.cmd == "register":
            s = load(args.dir)
            if s is None:
                raise KafkaStackError(f"no stack in {args.dir}")
            dsn = args.dsn or (s.postgres or {}).get("dsn")
            if not dsn:
                raise KafkaStackError("--dsn is needed (the stack was not started with --postgres)")
            extra = {}
            for kv in args.set:
                key, eq, value = kv.partition("=")
                if not eq or not key.strip():
                    raise KafkaStackError(f"--set {kv!r}: expected KEY=VALUE (a connector setting)")
                extra[key.strip()] = value
            status = s.register_postgres(args.name, dsn, args.tables, args.prefix, slot=args.slot,
                                         snapshot_mode=args.snapshot_mode,
                                         transaction_metadata=not args.no_transaction_metadata,
                                         decimal_handling=args.decimal_handling, partitions=args.partitions,
                                         extra=extra)
            print(json.dumps(status))
        else:
            s = load(args.dir)
            if s:
                s.stop()
    except KafkaStackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
