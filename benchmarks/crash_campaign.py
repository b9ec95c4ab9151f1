"""Crash campaign: kill -9 a run anywhere, restart, and check that nothing was lost and
nothing applied twice.

    .venv/bin/python benchmarks/crash_campaign.py --trials 300 [--seed 1] [--runner engine|dbt]
        [--restart here|child] [--keep DIR] [--store local|s3]

Three models over two Delta sources (``orders`` keyed by ``oid``, ``customers`` keyed by
``cid``, the Change Data Feed on):

* ``totals``: a join and a GROUP BY (join and aggregate state), ``unique_key`` ``cid``;
* ``big``: a filter without a key (a bag, merged by multiplicities);
* ``regions``: a GROUP BY over ``ref('totals')`` joined with ``customers`` (a ``ref()``
  chain, read as the upstream's Change Data Feed, aligned to one base cut).

``max_batch_rows`` is small, so a run's backlog is split into several micro-batches and the
state compacts every few batches. The killed runs mark retracted target rows in deletion
vectors (``CONSISTENT_STREAM_DV_MIN_ROWS=1``: every file qualifies), so the kills land between
a vector's write and its commit too; the restarts in this process rewrite files (the
default 20,000 rows), so both kinds of commit follow each other. Each trial:

1. applies random source changes (inserts, updates, deletes; one Delta commit each, some of
   several rows);
2. starts a run as a separate process in its own session (``start_new_session``): the three
   models in order (``--runner engine``: ``run_job`` in a Python process; ``--runner dbt``:
   ``dbt run`` of a generated dbt project), or,
   in every fourth trial, ``totals`` as a continuous query (processing-time trigger) while
   more changes land;
3. kills its whole process group with SIGKILL (Python, Spark's JVM, its Python workers):
   either at a named step of the protocol, through the fault-injection point
   ``CONSISTENT_STREAM_FAULT`` (:mod:`consistent_stream.faults`; the points are taken in
   turn, at a random hit), or after a random delay;
4. restarts: a run of every model without a fault, which must succeed (``--restart here``:
   ``run_job`` in this process's own Spark session, which only reads what is on disk;
   ``child``: a new child process like the killed run);
5. checks every model: each target version committed since the last check equals the
   model's SQL evaluated in batch by DuckDB (upstreams recomputed from their SQL) at the
   base cut it records; the latest version's base cut is the sources' latest versions; and
   in the target's and the state table's Delta logs every transaction (app id, batch) appears
   once, in increasing order (no batch applied twice, none skipped).

With ``--store s3`` the targets and their checkpoints (state, the query's record, the writer
lock) live on an S3 API server on loopback (s3proxy); the sources stay on local disk, and the
restart after a kill first waits out the killed run's lease on the writer lock (4 s here).

Prints one JSON object: trials, kills (by fault point and by random delay), fault points not
reached, failures (with the trial, the kill and what differed), seconds. Exit status 1 when
any trial failed. Every random choice comes from ``--seed``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

MODELS = {
    "totals": ("select o.cid, c.region, count(*) as n, sum(o.amount) as total "
               "from {orders} o join {customers} c on o.cid = c.cid group by o.cid, c.region", "cid"),
    "big": ("select cid, amount from {orders} where amount >= 70", None),
    "regions": ("select c.region, sum(t.total) as total, count(*) as customers "
                "from {totals} t join {customers} c on c.cid = t.cid group by c.region", "region"),
}
ORDER = ["totals", "big", "regions"]
REGIONS = ["north", "south", "east", "west"]
MAX_BATCH_ROWS = 12
SCHEMA = "crash"
BATCH_END_POINTS = ("publishing",)
"""Fault points a continuous query reaches only when it stops (not chosen in its trials)."""

ENGINE_RUNNER = textwrap.dedent("""
    import logging
    import os
    import sys
    import consistent_stream
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("consistent_stream").setLevel(logging.INFO)
    from consistent_stream.job import run_job
    from consistent_stream.spec import JobSpec
    spark = (with_delta(SparkSession.builder, master="local[2]")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    if os.environ.get("CRASH_CAMPAIGN_WAIT") and sys.stdin.readline().strip() != "go":
        sys.exit(0)   # started ahead of its trial (JVM up, nothing read); the campaign ended instead
    timeout = float(sys.argv[1]) or None
    for path in sys.argv[2:]:
        run_job(spark, JobSpec.load(path), timeout_s=timeout)
""")

PROFILE = """
crash:
  target: local
  outputs:
    local:
      type: consistent_spark
      method: session
      host: NA
      schema: {schema}
      threads: 1
      server_side_parameters:
        spark.master: "local[2]"
        spark.ui.enabled: "false"
        spark.sql.warehouse.dir: "{root}/spark/warehouse"
        spark.hadoop.javax.jdo.option.ConnectionURL: "jdbc:derby:;databaseName={root}/spark/metastore_db;create=true"
        spark.driver.extraJavaOptions: "-Dderby.stream.error.file={root}/spark/derby.log"
"""
PROJECT = """
name: crash
version: "1.0"
config-version: 2
profile: crash
flags:
  send_anonymous_usage_stats: false
"""
SOURCES = """
version: 2
sources:
  - name: shop
    schema: shop
    tables:
      - name: orders
        meta:
          consistent_stream: {{format: delta, location: "{root}/data/orders", primary_key: [oid]}}
      - name: customers
        meta:
          consistent_stream: {{format: delta, location: "{root}/data/customers", primary_key: [cid]}}
"""


class Shop:
    """The two source tables and a Python copy of their rows (to pick rows to change)."""

    def __init__(self, root: Path, rnd: random.Random):
        import pyarrow as pa
        from deltalake import write_deltalake
        self.root, self.rnd, self.pa = root, rnd, pa
        self.customers = {cid: rnd.choice(REGIONS) for cid in range(1, 13)}
        self.orders = {oid: (rnd.randint(1, 12), rnd.randint(1, 100)) for oid in range(1, 61)}
        self.next_oid = 61
        cdf = {"delta.enableChangeDataFeed": "true"}
        write_deltalake(self.path("customers"), self._customers(self.customers), configuration=cdf)
        write_deltalake(self.path("orders"), self._orders(self.orders), configuration=cdf)

    def path(self, name: str) -> str:
        return str(self.root / "data" / name)

    def _orders(self, rows: dict):
        pa = self.pa
        return pa.table({"oid": pa.array(list(rows), pa.int64()),
                         "cid": pa.array([c for c, _ in rows.values()], pa.int64()),
                         "amount": pa.array([a for _, a in rows.values()], pa.int64())})

    def _customers(self, rows: dict):
        pa = self.pa
        return pa.table({"cid": pa.array(list(rows), pa.int64()), "region": pa.array(list(rows.values()))})

    def change(self, n: int) -> None:
        """``n`` random operations, each its own Delta commit."""
        from deltalake import DeltaTable, write_deltalake
        rnd = self.rnd
        for _ in range(n):
            kind = rnd.choices(["insert", "update", "delete", "region", "customer"], [4, 4, 2, 1, 1])[0]
            if kind == "insert" or not self.orders:
                rows = {}
                for _ in range(rnd.randint(1, 6)):
                    rows[self.next_oid] = (rnd.randint(1, len(self.customers)), rnd.randint(1, 100))
                    self.next_oid += 1
                self.orders.update(rows)
                write_deltalake(self.path("orders"), self._orders(rows), mode="append")
            elif kind == "update":
                oid = rnd.choice(sorted(self.orders))
                cid, amount = rnd.randint(1, len(self.customers)), rnd.randint(1, 100)
                self.orders[oid] = (cid, amount)
                DeltaTable(self.path("orders")).update(updates={"cid": str(cid), "amount": str(amount)},
                                                       predicate=f"oid = {oid}")
            elif kind == "delete":
                lo = rnd.choice(sorted(self.orders))
                gone = [o for o in self.orders if lo <= o < lo + rnd.randint(1, 3)]
                for o in gone:
                    del self.orders[o]
                DeltaTable(self.path("orders")).delete(f"oid >= {lo} AND oid < {max(gone) + 1}")
            elif kind == "region":
                cid = rnd.choice(sorted(self.customers))
                self.customers[cid] = rnd.choice(REGIONS)
                DeltaTable(self.path("customers")).update(updates={"region": f"'{self.customers[cid]}'"},
                                                          predicate=f"cid = {cid}")
            else:
                cid = len(self.customers) + 1
                self.customers[cid] = rnd.choice(REGIONS)
                write_deltalake(self.path("customers"), self._customers({cid: self.customers[cid]}), mode="append")


# ---- runners ---------------------------------------------------------------------------------
class EngineRunner:
    """Runs the models with ``run_job`` in a child Python process (one JobSpec file each)."""

    name = "engine"

    def __init__(self, root: Path, targets: str | None = None):
        self.root, self.jobs, self.spec_files = root, {}, {}
        self.targets = targets or str(root / "targets")   # location_root: a directory or an s3:// prefix
        self.sources = [{"source_name": "shop", "name": t, "relation": f"shop.{t}",
                         "meta": {"format": "delta", "location": str(root / "data" / t), "primary_key": [k]}}
                        for t, k in (("orders", "oid"), ("customers", "cid"))]
        for name in ORDER:
            if "{totals}" not in MODELS[name][0]:
                self._spec(name)

    def _spec(self, name: str) -> None:
        """The JobSpec of model ``name`` (a model over ``totals`` once that has a target)."""
        from consistent_stream.spec import JobSpec
        root = self.root
        rels = {"orders": "shop.orders", "customers": "shop.customers", "totals": f"{SCHEMA}.totals"}
        totals_ref = {"kind": "model", "name": "totals", "relation": f"{SCHEMA}.totals", "schema": SCHEMA,
                      "identifier": "totals", "config": {"location_root": self.targets}}
        sql, key = MODELS[name]
        used = [s for s in self.sources if "{" + s["name"] + "}" in sql] + ([totals_ref] if "{totals}" in sql else [])
        job = JobSpec.from_dbt(project_root=str(root), schema=SCHEMA, identifier=name, model_name=name,
                               sql=sql.format(**rels), sources=used,
                               config={"unique_key": key, "location_root": self.targets,
                                       "max_batch_rows": MAX_BATCH_ROWS},
                               warehouse_dir=str(root / "spark" / "warehouse"))
        self.jobs[name] = job
        self.spec_files[name] = self._save(job, name)
        cont = JobSpec(**{**job.__dict__, "trigger": "processing_time:1"})
        self.spec_files[name + "@continuous"] = self._save(cont, name + "_continuous")

    def built(self) -> bool:
        """After a first build: True when every model has its spec (else build again)."""
        missing = [m for m in ORDER if m not in self.jobs]
        for name in missing:
            self._spec(name)
        return not missing

    def _save(self, job, name: str) -> str:
        path = self.root / "specs" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(job.to_json())
        return str(path)

    def command(self, continuous: bool) -> list[str]:
        if continuous:
            return [PYTHON, "-c", ENGINE_RUNNER, "120", self.spec_files["totals@continuous"]]
        return [PYTHON, "-c", ENGINE_RUNNER, "0", *[self.spec_files[m] for m in ORDER if m in self.spec_files]]

    def job(self, name: str):
        return self.jobs[name]


class DbtRunner(EngineRunner):
    """Runs ``dbt run`` of a generated dbt project (the same models, as Jinja). The models'
    JobSpecs are the ones dbt's materialization saved beside their checkpoints (read once
    the first build made them); a continuous trial runs that spec with a processing-time
    trigger in the engine's child process, as a model with ``trigger`` config does."""

    name = "dbt"

    def __init__(self, root: Path, targets: str | None = None):
        self.root, self.jobs, self.spec_files = root, {}, {}
        self.targets = targets or str(root / "targets")
        files = {"dbt_project.yml": PROJECT, "profiles.yml": PROFILE.format(schema=SCHEMA, root=root),
                 "models/sources.yml": SOURCES.format(root=root)}
        rels = {"orders": "{{ source('shop', 'orders') }}", "customers": "{{ source('shop', 'customers') }}",
                "totals": "{{ ref('totals') }}"}
        for name, (sql, key) in MODELS.items():
            cfg = f"materialized='consistent_stream', max_batch_rows={MAX_BATCH_ROWS}, " \
                  f"location_root='{self.targets}'" + (f", unique_key='{key}'" if key else "")
            files[f"models/{name}.sql"] = "{{ config(" + cfg + ") }}\n" + sql.format(**rels) + "\n"
        for rel, text in files.items():
            p = root / "project" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)

    def built(self) -> bool:
        from consistent_stream.spec import JobSpec
        from consistent_stream.verify import index_path
        for name in ORDER:
            with open(index_path(str(self.root / "project"), name)) as f:
                ckpt = json.load(f)["checkpoint_location"]
            job = JobSpec.load(os.path.join(ckpt, "_consistent_stream", "job.json"))
            self.jobs[name] = job
            cont = JobSpec(**{**job.__dict__, "trigger": "processing_time:1"})
            self.spec_files["totals@continuous"] = self._save(cont, "totals_continuous")
        return True

    def command(self, continuous: bool) -> list[str]:
        if continuous:
            return super().command(True)
        project = str(self.root / "project")
        return [str(Path(PYTHON).parent / "dbt"), "run", "--project-dir", project, "--profiles-dir", project]


# ---- checks ----------------------------------------------------------------------------------
def txn_log(table: str) -> list[tuple[int, str, int]]:
    """Every ``txn`` action in a Delta table's JSON log: (commit version, app id, version),
    in commit order (log files a checkpoint already covers may have been cleaned up)."""
    from consistent_stream import storage
    out = []
    log_dir = f"{table.rstrip('/')}/_delta_log"
    names = sorted(n for n in storage.list_dir(log_dir) if n.endswith(".json") and n[:20].isdigit())
    for name in names:
        version = int(name[:20])
        for line in storage.read_bytes(f"{log_dir}/{name}").decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "txn" in action:
                out.append((version, action["txn"]["appId"], int(action["txn"]["version"])))
    return out


def check_txns(table: str) -> list[str]:
    """Problems in ``table``'s transactions: a (app id, batch) committed twice, or a batch of
    an app id after a later one."""
    problems, last = [], {}
    for version, app, batch in txn_log(table):
        if app in last and batch <= last[app]:
            problems.append(f"{table}: version {version} commits batch {batch} of {app} after batch {last[app]}")
        last[app] = batch
    return problems


class Checker:
    """The checks of step 5, remembering which target versions were already checked."""

    def __init__(self, runner, shop: Shop):
        self.runner, self.shop, self.checked = runner, shop, {}

    def __call__(self) -> list[str]:
        from deltalake import DeltaTable
        from consistent_stream.compare import compare_tables
        from consistent_stream.delta import DeltaTableRef
        from consistent_stream.oracle import duckdb_result
        from consistent_stream.runtime import BatchMeta
        from consistent_stream.sources import Cut
        problems = []
        latest = {f"shop.{t}": DeltaTable(self.shop.path(t)).version() for t in ("orders", "customers")}
        for name in ORDER:
            job = self.runner.job(name)
            target = DeltaTableRef(job.target_path)
            if not target.exists():
                problems.append(f"{name}: no target at {job.target_path}")
                continue
            newest = target.latest_version()
            for v in range(self.checked.get(name, -1) + 1, newest + 1):
                meta = BatchMeta.from_commit(target.commit_at(v))
                if meta is None:
                    continue
                got = target.read_snapshot_arrow(v)   # delta-rs' scan: the targets have deletion vectors
                want = duckdb_result(job.sql, job.sources, Cut(meta.base_cut), chain=True, arrow=True)
                if got.column_names != want.column_names:
                    problems.append(f"{name}@{v}: columns {got.column_names} != {want.column_names}")
                    continue
                result = compare_tables(got, want, examples=3)
                if not result.ok:
                    problems.append(f"{name}@{v} (batch {meta.batch_id}, base cut {meta.base_cut}): "
                                    f"{result.describe()}")
            self.checked[name] = newest
            meta = BatchMeta.from_commit(target.commit_at(newest))
            want_cut = {k: v for k, v in latest.items() if k in meta.base_cut}
            if meta.base_cut != want_cut:
                problems.append(f"{name}: latest version {newest} is at base cut {meta.base_cut}, the sources are at "
                                f"{want_cut}: changes were lost or the run stopped early")
            problems += check_txns(job.target_path)
            problems += check_txns(os.path.join(job.checkpoint_location, "state"))
        return problems


# ---- trials ----------------------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for _ in range(100):   # the JVM and Python workers of the group are gone too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def _run(cmd: list[str], env: dict, log_path: Path, wait_for_go: bool = False) -> subprocess.Popen:
    """``cmd`` started in a session of its own (its process group is what a kill kills),
    output appended to ``log_path``. With ``wait_for_go`` (the engine runner only), it starts
    its Spark session and then waits for the line ``go`` on its stdin before it reads anything."""
    if wait_for_go:
        env = {**env, "CRASH_CAMPAIGN_WAIT": "1"}
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(log_path.parent), stdin=subprocess.PIPE if wait_for_go else None)


class Campaign:
    """A campaign's working directory, sources, runner, checker and tallies."""

    def __init__(self, root: Path, seed: int, runner: str = "engine", *, spark=None, random_kills: float = 0.25,
                 targets: str | None = None, lease_s: float = 0.0):
        from consistent_stream.faults import POINTS
        self.root, self.rnd, self.points = root, random.Random(seed), list(POINTS)
        self.shop = Shop(root, self.rnd)
        self.runner = DbtRunner(root, targets) if runner == "dbt" else EngineRunner(root, targets)
        self.lease_s = lease_s   # an object store's writer lock: a killed run's lease to wait out
        self.check = Checker(self.runner, self.shop)
        self.kills = collections.Counter()
        self.not_reached = collections.Counter()
        self.failures: list[dict] = []
        self.trials = 0
        self._next_point = 0
        self.log = root / "runs.log"
        env = {k: v for k, v in os.environ.items() if k != "CONSISTENT_STREAM_FAULT"}
        env["PYSPARK_PYTHON"] = PYTHON
        env["CONSISTENT_STREAM_DV_MIN_ROWS"] = "1"   # the killed runs' batches mark rows in deletion vectors
        self.env = env
        self.spark = spark                # restarts in this process's session when given
        self.random_kills = random_kills  # the share of kills after a random delay
        self.run_seconds = 15.0           # the last unkilled run's length: the random delay's range
        self._next: dict | None = None    # the next trial's plan, its process started ahead

    def _recover(self, runner) -> str | None:
        """The restart (no fault): a child process like the killed run, or, with a session
        of this process (``spark``, engine runner only), ``run_job`` of every model here."""
        if self.spark is not None and isinstance(runner, EngineRunner) and not isinstance(runner, DbtRunner):
            from consistent_stream.job import run_job
            from consistent_stream.spec import JobSpec
            from consistent_stream.errors import ConcurrentWriterError
            try:
                for name in ORDER:
                    if name in runner.spec_files:
                        for attempt in range(4):
                            try:
                                run_job(self.spark, JobSpec.load(runner.spec_files[name]))
                                break
                            except ConcurrentWriterError:
                                # the killed run's lease on an object store's lock (its renewal
                                # may have come just before the kill): the refusal is right;
                                # wait it out and try again
                                if not self.lease_s or attempt == 3:
                                    raise
                                time.sleep(self.lease_s)
            except Exception as e:   # noqa: BLE001 - a failed restart is the campaign's finding
                return f"the restart failed: {type(e).__name__}: {e}"
            return None
        proc = _run(runner.command(False), self.env, self.log)
        try:
            rc = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return "the restart did not finish in 600 s"
        return None if rc == 0 else f"the restart failed with exit status {rc} (see {self.log})"

    def setup(self) -> None:
        """The first build of every model (no fault), checked."""
        err = self._recover(self.runner)
        if err is None and not self.runner.built():
            err = self._recover(self.runner)
        problems = [err] if err else self.check()
        if problems:
            raise SystemExit(f"the first build failed: {problems}")

    def _plan(self) -> dict:
        """The next trial's run and kill (every random choice but the source changes), and
        its process started ahead (its Spark session up, waiting to be told to go) when it
        is the engine's runner: the JVM starts while this process restarts and checks the
        trial before, and the kill happens after the go like any other."""
        rnd, n = self.rnd, self.trials + 1
        continuous = n % 4 == 0
        env = dict(self.env)
        plan = {"continuous": continuous, "by_point": rnd.random() >= self.random_kills, "delay": None}
        if plan["by_point"]:
            point = self.points[self._next_point % len(self.points)]
            if continuous and point in BATCH_END_POINTS:   # a continuous query publishes when it stops
                point = rnd.choice([p for p in self.points if p not in BATCH_END_POINTS])
            # a continuous query reaches each point once per batch; a run's later batches too
            hit = rnd.randint(1, 3)
            env["CONSISTENT_STREAM_FAULT"] = f"{point}@{hit}"
            plan["kill"] = f"{point}@{hit}"
        else:
            plan["delay"] = rnd.uniform(1.0, max(self.run_seconds, 2.0))
            plan["kill"] = f"after {plan['delay']:.1f}s"
        cmd = self.runner.command(continuous)
        plan["cmd"], plan["env"] = cmd, env
        plan["proc"] = _run(cmd, env, self.log, wait_for_go=True) if ENGINE_RUNNER in cmd else None
        return plan

    def close(self) -> None:
        """Stop a process started ahead for a trial that will not run."""
        plan, self._next = self._next, None
        if plan and plan["proc"] is not None:
            _kill_group(plan["proc"])

    def trial(self) -> dict:
        rnd = self.rnd
        plan, self._next = self._next or self._plan(), None
        self.trials += 1
        n = self.trials
        runner = self.runner
        continuous, by_point, delay, kill = plan["continuous"], plan["by_point"], plan["delay"], plan["kill"]
        self.shop.change(rnd.randint(1, 12))
        with open(self.log, "a") as f:
            f.write(f"\n=== trial {n}: {runner.name}{' continuous' if continuous else ''}, kill {kill}\n")
        proc = plan["proc"]
        if proc is None:
            proc = _run(plan["cmd"], plan["env"], self.log)
        else:
            try:
                proc.stdin.write(b"go\n")
                proc.stdin.close()
            except BrokenPipeError:   # it died while waiting: its exit status tells
                pass
        t0 = time.time()
        killed, outcome = False, "finished"
        while True:
            if continuous and time.time() - t0 > 3 and rnd.random() < 0.3:
                self.shop.change(rnd.randint(1, 3))   # changes landing while the query runs
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            limit = delay if not by_point else (40.0 if continuous else 300.0)
            if time.time() - t0 > limit:
                _kill_group(proc)
                killed, rc = True, -9
                break
        if rc == 0 and not continuous:
            self.run_seconds = time.time() - t0
        if rc == -signal.SIGKILL and not killed:   # the fault point killed it
            outcome = "killed at " + kill
            self.kills[kill.split("@")[0]] += 1
            if kill.startswith(self.points[self._next_point % len(self.points)]):
                self._next_point += 1
        elif killed:
            outcome = "killed " + (kill if not by_point else f"(point {kill} not reached in time)")
            self.kills["random" if not by_point else kill.split("@")[0] + " (timeout)"] += 1
            if by_point:
                self.not_reached[kill.split("@")[0]] += 1
        elif by_point:
            self.not_reached[kill.split("@")[0]] += 1
            outcome = f"finished before {kill} (exit {rc})"
        if rc not in (0, -signal.SIGKILL) and not killed:
            outcome += f" with exit status {rc}"
        run_end = time.time()
        self._next = self._plan()   # its JVM starts during the restart and the check
        if rc != 0 and self.lease_s:
            time.sleep(self.lease_s + 2.5)   # the killed run's lease on the writer lock ends (+ the stamp's 1 s)
        err = self._recover(runner)
        problems = [err] if err else self.check()
        result = {"trial": n, "runner": runner.name, "continuous": continuous, "kill": kill, "outcome": outcome,
                  "ok": not problems, "seconds": round(time.time() - t0, 1),
                  "run_seconds": round(run_end - t0, 1)}
        if problems:
            result["problems"] = problems[:5]
            self.failures.append(result)
        with open(self.log, "a") as f:
            f.write(json.dumps(result) + "\n")
        return result

    def summary(self, seconds: float) -> dict:
        return {"trials": self.trials, "runner": self.runner.name, "kills": dict(sorted(self.kills.items())),
                "points_not_reached": dict(sorted(self.not_reached.items())),
                "points_never_killed": [p for p in self.points if not self.kills.get(p)],
                "failures": len(self.failures), "failed_trials": self.failures[:10],
                "seconds": round(seconds, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runner", choices=["engine", "dbt"], default="engine")
    ap.add_argument("--restart", choices=["here", "child"], default="here",
                    help="restart in this process's Spark session (engine runner; faster) or in a child process "
                         "like the killed run (always so for the dbt runner)")
    ap.add_argument("--keep", help="keep the working directory here instead of a temporary one")
    ap.add_argument("--store", choices=["local", "s3"], default="local",
                    help="where the targets and checkpoints live: local disk, or an S3 API server on loopback "
                         "(s3proxy, consistent_stream_testing.s3server; the writer lock's lease then 4 s)")
    args = ap.parse_args(argv)
    server, targets, lease_s = None, None, 0.0
    if args.store == "s3":
        from consistent_stream import location
        from consistent_stream.sink.lock import LEASE_ENV
        from consistent_stream_testing import s3server
        server = s3server.start(Path(tempfile.mkdtemp(prefix="cs-crash-s3-")), buckets=("cs-crash",))
        lease_s = 4.0
        os.environ.update({**server.env(), LEASE_ENV: str(lease_s)})
        location.reset()
        targets = "s3://cs-crash/targets"
    spark = None
    if args.restart == "here" and args.runner == "engine":
        import consistent_stream  # noqa: F401  (PYSPARK_PYTHON for the workers)
        from pyspark.sql import SparkSession
        from consistent_stream.session import with_delta
        spark = (with_delta(SparkSession.builder, master="local[2]")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    root = Path(args.keep or tempfile.mkdtemp(prefix="cs-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    campaign = Campaign(root, args.seed, args.runner, spark=spark, targets=targets, lease_s=lease_s)
    campaign.setup()
    for _ in range(args.trials):
        r = campaign.trial()
        print(json.dumps(r), file=sys.stderr, flush=True)
    campaign.close()
    print(json.dumps(campaign.summary(time.time() - t0)))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    if server is not None:
        server.stop()
    return 1 if campaign.failures else 0


if __name__ == "__main__":
    sys.exit(main())
