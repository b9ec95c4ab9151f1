"""Flink SQL half of the Kafka/Debezium catch-up benchmark: the same join + aggregate over the same topics.

    bash benchmarks/flink_setup.sh        # once: .venv-flink (PyPI apache-flink) + the Kafka connector jar
    .venv-flink/bin/python benchmarks/flink_sql.py --bootstrap HOST:PORT --topic-prefix PREFIX \\
        [--schemas-enabled | --no-schemas] [--parallelism N] [--client jvm|pyflink]

Flink's Kafka connector reads the Debezium topics ``<prefix>.public.pgbench_accounts`` and
``<prefix>.public.pgbench_history`` (Kafka Connect's JSON converter; ``--schemas-enabled`` when it
wrote the ``{"schema", "payload"}`` envelope, schemas.enable=true) with the ``debezium-json`` format:
snapshot events (``op: r``) read as inserts, updates as -U/+U (they need the ``before`` image:
REPLICA IDENTITY FULL), tombstones (null values) skipped by the format. Each topic is read on its
own, from the earliest offset to the end offsets it had when the job started
(``scan.bounded.mode = latest-offset``), so the streaming job ends once it has caught up; the
transaction metadata topic is not read (Flink has no transaction-consistent cut across topics).
The query runs in streaming mode (the default), as Flink users run CDC, with no tuning beyond
parallelism (default: what PyFlink's local environment gives, one per core):

    SELECT a.bid, COUNT(*) AS n, SUM(h.delta) AS delta_sum
    FROM pgbench_history h JOIN pgbench_accounts a ON h.aid = a.aid GROUP BY a.bid

Its changelog (one -U/+U pair per input change that reaches the aggregate) is collected with
``TableResult.collect()`` and folded (+I/+U set, -U/-D remove) into the final rows. The collect sink
only runs as fast as its client reads, so ``--client`` says who reads: ``jvm`` (default) drains
the Java iterator of ``collect()`` inside the JVM, 100,000 rows per Py4J call, and folds their text
here; ``pyflink`` iterates PyFlink's ``TableResult.collect()`` row by row, three Py4J round trips
and a pickle per row, about 1 ms a row: it measures PyFlink's client, not Flink (500,000 changelog
rows: 520 s against 18 s). ``seconds`` runs from job submission (``execute_sql``, which plans the
query and starts the local MiniCluster) to the job's end; ``events`` is the number of messages in
both topics (end minus beginning offsets, counted with confluent-kafka just before the job). Prints
one JSON line:

    {"engine": "flink", "flink_version", "seconds", "events", "events_per_s", "rows": [[bid, n, delta_sum]],
     "parallelism", "client", "changelog_rows", "submit_seconds", "drained_seconds",
     "jvm_peak_rss_mib", "jvm_cpu_seconds", ...}

``jvm_peak_rss_mib`` is the peak resident memory (VmHWM) of PyFlink's gateway JVM, which runs the
MiniCluster (default heap: a quarter of the machine's memory); ``jvm_cpu_seconds`` its CPU time
during the job.

``--selftest`` (run with .venv's python, not .venv-flink's) proves it end to end: a local
PostgreSQL 15 (consistent_stream_testing.localpg), Kafka + Kafka Connect + Debezium
(consistent_stream_testing.kafka_stack),
``pgbench -i -s 1`` with REPLICA IDENTITY FULL on the pgbench tables, Debezium registered with topic
prefix ``pgb``, ``pgbench -c 4 -T 30``, a wait until Connect has written every change, then this
script under .venv-flink's python as a subprocess; its rows are compared with PostgreSQL's answer:

    .venv/bin/python benchmarks/flink_sql.py --selftest [--seconds 30] [--clients 4] [--parallelism N] [--runs N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLINK_VENV = REPO / ".venv-flink"
FLINK_JARS = FLINK_VENV / "share" / "flink-jars"

QUERY = ("SELECT a.bid, COUNT(*) AS n, SUM(h.delta) AS delta_sum "
         "FROM pgbench_history h JOIN pgbench_accounts a ON h.aid = a.aid GROUP BY a.bid")

# Flink column lists: mtime is Debezium's MicroTimestamp (microseconds since the epoch as a number),
# which Flink's JSON format does not read as a TIMESTAMP: declared BIGINT (the query does not use it).
TABLES = {
    "pgbench_accounts": "aid INT, bid INT, abalance INT, filler STRING, PRIMARY KEY (aid) NOT ENFORCED",
    "pgbench_history": "tid INT, bid INT, aid INT, delta INT, mtime BIGINT, filler STRING",
}


def topic_name(prefix: str, table: str) -> str:
    return f"{prefix}.public.{table}"


def table_ddl(table: str, topic: str, bootstrap: str, group_id: str, schemas_enabled: bool) -> str:
    options = {
        "connector": "kafka",
        "topic": topic,
        "properties.bootstrap.servers": bootstrap,
        "properties.group.id": group_id,
        "scan.startup.mode": "earliest-offset",
        "scan.bounded.mode": "latest-offset",
        "format": "debezium-json",
        "debezium-json.schema-include": "true" if schemas_enabled else "false",
    }
    with_ = ",\n  ".join(f"'{k}' = '{v}'" for k, v in options.items())
    return f"CREATE TABLE {table} (\n  {TABLES[table]}\n) WITH (\n  {with_}\n)"


def topic_messages(bootstrap: str, topics: list[str], timeout: float = 30.0) -> dict[str, int]:
    """Messages held by each topic now (per partition: high watermark minus low watermark)."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(timeout=timeout)
        counts = {}
        for topic in topics:
            if topic not in meta.topics or meta.topics[topic].error is not None:
                raise RuntimeError(f"topic {topic} not found on {bootstrap}")
            total = 0
            for p in meta.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                total += high - low
            counts[topic] = total
        return counts
    finally:
        consumer.close()


def _child_jvms() -> list[int]:
    """Pids of java processes whose parent is this process (PyFlink's gateway JVM, which runs the MiniCluster)."""
    me, pids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == me and comm == "java":
            pids.append(int(entry))
    return pids


def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


_CHANGE = re.compile(r"([+-][IUD])\[([^\]]*)\]")


def _fold(state: dict, kind: str, fields: tuple) -> None:
    """One changelog row into the final state per bid: +I/+U set it, -U/-D remove it."""
    if kind in ("+I", "+U"):
        state[fields[0]] = tuple(fields[1:])
    else:
        state.pop(fields[0], None)


def _fold_in_jvm(result, chunk: int = 100_000):
    """Drains TableResult.collect()'s Java iterator inside the JVM, ``chunk`` rows per Py4J call (one
    call per chunk returns the rows' text, ``+I[1, 2, 3]``), and folds them here: the same collect sink
    and job as PyFlink's row iterator without its three Py4J round trips and a pickle per row."""
    from pyflink.java_gateway import get_gateway
    jvm = get_gateway().jvm
    iterator = result._j_table_result.collect()
    spliterator = jvm.java.util.Spliterators.spliteratorUnknownSize(iterator, 0)
    state: dict = {}
    rows = 0
    try:
        while True:
            batch = jvm.java.util.stream.StreamSupport.stream(spliterator, False).limit(chunk) \
                .collect(jvm.java.util.stream.Collectors.toList())
            text = batch.toString()
            n = 0
            for m in _CHANGE.finditer(text):
                n += 1
                fields = tuple(None if f == "null" else int(f) for f in m.group(2).split(", "))
                _fold(state, m.group(1), fields)
            rows += n
            if n < chunk:
                return state, rows
    finally:
        iterator.close()


def _fold_pyflink(result):
    """PyFlink's own row iterator (TableResult.collect() in Python): a few Py4J round trips per row."""
    from pyflink.common.types import RowKind
    kinds = {RowKind.INSERT: "+I", RowKind.UPDATE_BEFORE: "-U", RowKind.UPDATE_AFTER: "+U", RowKind.DELETE: "-D"}
    state: dict = {}
    rows = 0
    with result.collect() as changes:
        for row in changes:
            rows += 1
            _fold(state, kinds[row.get_row_kind()], tuple(row))
    return state, rows


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``); None when
    it cannot be read (the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run_flink(bootstrap: str, prefix: str, schemas_enabled: bool, parallelism: int | None,
              client: str = "jvm") -> dict:
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.table import EnvironmentSettings, StreamTableEnvironment
    import pyflink.version

    jars = sorted(FLINK_JARS.glob("*.jar"))
    if not any(j.name.startswith("flink-sql-connector-kafka-") for j in jars):
        raise SystemExit(f"no Kafka connector jar in {FLINK_JARS}: run bash benchmarks/flink_setup.sh")
    config = Configuration()
    config.set_string("pipeline.jars", ";".join(j.as_uri() for j in jars))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    if parallelism:
        env.set_parallelism(parallelism)
    used_parallelism = env.get_parallelism()
    t_env = StreamTableEnvironment.create(env, EnvironmentSettings.in_streaming_mode())
    t_env.get_config().set("pipeline.name", "flink_sql pgbench catch-up")

    group_id = f"flink-bench-{uuid.uuid4().hex}"
    topics = {t: topic_name(prefix, t) for t in TABLES}
    for table, topic in topics.items():
        t_env.execute_sql(table_ddl(table, topic, bootstrap, group_id, schemas_enabled))
    counts = topic_messages(bootstrap, list(topics.values()))
    events = sum(counts.values())

    jvms = _child_jvms()
    cpu0 = sum(cpu_seconds(p) or 0 for p in jvms)
    t0 = time.monotonic()
    result = t_env.execute_sql(QUERY)
    t_submitted = time.monotonic()
    if client == "jvm":
        state, changelog_rows = _fold_in_jvm(result)
    else:
        state, changelog_rows = _fold_pyflink(result)
    t_drained = time.monotonic()
    result.wait()
    seconds = time.monotonic() - t0
    cpu = sum(cpu_seconds(p) or 0 for p in jvms) - cpu0
    peak = max((_status_kib(p, "VmHWM") or 0 for p in jvms), default=0)
    return {
        "engine": "flink",
        "flink_version": pyflink.version.__version__,
        "seconds": round(seconds, 3),
        "events": events,
        "events_per_s": round(events / seconds, 1) if seconds > 0 else None,
        "rows": [[bid, n, s] for bid, (n, s) in sorted(state.items())],
        "parallelism": used_parallelism,
        "topics": counts,
        "client": client,
        "changelog_rows": changelog_rows,
        "submit_seconds": round(t_submitted - t0, 3),
        "drained_seconds": round(t_drained - t0, 3),
        "jvm_peak_rss_mib": round(peak / 1024, 1) if peak else None,
        "jvm_cpu_seconds": round(cpu, 1) if jvms else None,
        "jars": [j.name for j in jars],
        "java": os.environ.get("JAVA_HOME") or "java on PATH",
    }


# ---------------------------------------------------------------------------------------------------
# --selftest: PostgreSQL + Kafka + Connect + Debezium, pgbench, then the Flink run above as a subprocess.

def _pg_query_rows(pg) -> list[list[int]]:
    return [[int(b), int(n), int(s)] for b, n, s in pg.execute(QUERY + " ORDER BY a.bid")]


def _pgbench(pg, *args: str) -> str:
    cmd = [pg.bin("pgbench"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", *args, "postgres"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def _wait_for(what: str, check, timeout: float, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def pgbench_topics(scale: int, seconds: int, clients: int, timeout: float, log=sys.stderr, partitions: int = 1):
    """PostgreSQL 15 (consistent_stream_testing.localpg), Kafka + Kafka Connect + Debezium
    (consistent_stream_testing.kafka_stack), ``pgbench -i -s scale`` with REPLICA IDENTITY FULL,
    Debezium registered (topic prefix ``pgb``, transaction metadata), ``pgbench -c clients -T
    seconds``, and a wait until Connect has written every change; the data topics have
    ``partitions`` partitions (the transaction topic one). Yields a dict: ``pg``,
    ``stack``, ``prefix``, ``pgbench_transactions``, ``pgbench_tps``, ``expect`` (topic ->
    messages), ``topic_messages``, ``connect_catch_up_wait_s``, ``postgres_rows`` (the query's
    answer). Stops everything on exit. Run with .venv's python (the benchmarks that compare
    with Flink use it)."""
    sys.path.insert(0, str(REPO / "python"))
    from consistent_stream_testing import kafka_stack
    from consistent_stream_testing.localpg import LocalPostgres

    python = FLINK_VENV / "bin" / "python"
    if not python.exists() or not any(FLINK_JARS.glob("flink-sql-connector-kafka-*.jar")):
        subprocess.run(["bash", str(REPO / "benchmarks" / "flink_setup.sh")], check=True)
    kafka_stack.install()
    work = tempfile.mkdtemp(prefix="cs-pgbench-topics-")
    pg = stack = None
    try:
        pg = LocalPostgres.start()
        print(f"PostgreSQL on port {pg.port}", file=log)
        _pgbench(pg, "-i", "-s", str(scale), "-q")
        for t in TABLES:
            pg.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        stack = kafka_stack.start(os.path.join(work, "kafka"))
        print(f"Kafka on {stack.bootstrap}", file=log)
        prefix = "pgb"
        stack.register_postgres("pgb", pg.dsn, [f"public.{t}" for t in TABLES], prefix,
                                transaction_metadata=True, partitions=partitions)
        topics = [topic_name(prefix, t) for t in TABLES]
        accounts = scale * 100_000

        def counts(names=topics):
            try:
                return topic_messages(stack.bootstrap, names, timeout=10)
            except Exception:  # not created yet (Debezium creates a table's topic with its first event)
                return None

        _wait_for("the Debezium snapshot", lambda: (c := counts(topics[:1])) and c[topics[0]] >= accounts, timeout)
        print("snapshot in Kafka; pgbench running", file=log)
        out = _pgbench(pg, "-n", "-c", str(clients), "-j", str(clients), "-T", str(seconds))
        tps = next((line for line in out.splitlines() if line.startswith("tps")), "")
        txns = pg.execute("SELECT count(*) FROM pgbench_history")[0][0]
        expect = {topics[0]: accounts + txns, topics[1]: txns}
        print(f"pgbench {txns} transactions ({tps.strip()}); waiting for Connect", file=log)
        t_wait = time.monotonic()
        final = _wait_for("Connect to write every change",
                          lambda: (c := counts()) and all(c[t] >= expect[t] for t in topics) and c, timeout)
        yield {"pg": pg, "stack": stack, "prefix": prefix, "pgbench_transactions": txns, "pgbench_tps": tps.strip(),
               "expect": expect, "topic_messages": final,
               "connect_catch_up_wait_s": round(time.monotonic() - t_wait, 1), "postgres_rows": _pg_query_rows(pg)}
    finally:
        try:
            if stack is not None:
                stack.stop()
        finally:
            if pg is not None:
                pg.stop()
            shutil.rmtree(work, ignore_errors=True)


def run_flink_script(bootstrap: str, prefix: str, client: str = "jvm", parallelism: int | None = None) -> dict:
    """This script under .venv-flink's python as a subprocess: its JSON line, with
    ``loadavg_before``. RuntimeError (with its stderr) when it fails."""
    cmd = [str(FLINK_VENV / "bin" / "python"), str(Path(__file__).resolve()), "--bootstrap", bootstrap,
           "--topic-prefix", prefix, "--schemas-enabled", "--client", client]
    cmd += ["--parallelism", str(parallelism)] if parallelism else []
    load = [round(x, 2) for x in os.getloadavg()]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-20000:])
        raise RuntimeError(f"flink_sql.py failed ({p.returncode})")
    flink = json.loads(p.stdout.strip().splitlines()[-1])
    flink["loadavg_before"] = load
    return flink


def selftest(a) -> int:
    with pgbench_topics(a.scale, a.seconds, a.clients, a.timeout) as env:
        expected_rows = env["postgres_rows"]
        runs = []
        for _ in range(a.runs):
            flink = run_flink_script(env["stack"].bootstrap, env["prefix"], a.client, a.parallelism)
            flink["rows_match"] = flink["rows"] == expected_rows
            print(f"selftest: flink run: {flink['seconds']} s, rows match: {flink['rows_match']}", file=sys.stderr)
            runs.append(flink)
        report = {"selftest": True, "pgbench_transactions": env["pgbench_transactions"],
                  "pgbench_tps": env["pgbench_tps"], "connect_catch_up_wait_s": env["connect_catch_up_wait_s"],
                  "topic_messages": env["topic_messages"], "topic_messages_expected": env["expect"],
                  "postgres_rows": expected_rows, "rows_match": all(r["rows_match"] for r in runs),
                  "flink": runs[0] if len(runs) == 1 else runs}
        print(json.dumps(report))
        ok = report["rows_match"] and all(r["events"] == sum(env["expect"].values()) for r in runs)
        return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers, HOST:PORT")
    ap.add_argument("--topic-prefix", help="Debezium topic prefix (topics <prefix>.public.<table>)")
    ap.add_argument("--schemas-enabled", dest="schemas_enabled", action="store_true", default=True,
                    help="the JSON converter wrote schemas (schemas.enable=true; the default)")
    ap.add_argument("--no-schemas", dest="schemas_enabled", action="store_false",
                    help="the JSON converter wrote bare payloads (schemas.enable=false)")
    ap.add_argument("--parallelism", type=int, default=None,
                    help="job parallelism (default: PyFlink's local default, one per core)")
    ap.add_argument("--client", choices=("jvm", "pyflink"), default="jvm",
                    help="how the changelog is read: drained in the JVM in chunks (default) or PyFlink's row "
                         "iterator (about 1 ms a row through Py4J)")
    ap.add_argument("--selftest", action="store_true",
                    help="with .venv's python: PostgreSQL + Kafka + Debezium + pgbench, then this run, checked")
    ap.add_argument("--scale", type=int, default=1, help="--selftest: pgbench scale")
    ap.add_argument("--clients", type=int, default=4, help="--selftest: pgbench clients")
    ap.add_argument("--seconds", type=int, default=30, help="--selftest: pgbench duration")
    ap.add_argument("--timeout", type=float, default=600, help="--selftest: wait limit for Debezium")
    ap.add_argument("--runs", type=int, default=1, help="--selftest: Flink runs over the same topics")
    a = ap.parse_args()
    if a.selftest:
        return selftest(a)
    if not a.bootstrap or not a.topic_prefix:
        ap.error("--bootstrap and --topic-prefix are required (or --selftest)")
    print(json.dumps(run_flink(a.bootstrap, a.topic_prefix, a.schemas_enabled, a.parallelism, a.client)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
