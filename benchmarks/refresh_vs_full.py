"""Benchmark: what an incremental run costs against the alternatives, per TPC-H scale factor
and example model, at Spark's defaults.

    .venv/bin/python benchmarks/refresh_vs_full.py --sf 0.1 1 10 [--models q1_pricing_summary] [--rounds N]
                                                   [--rebuild-pairs N] [--small-batches N] [--fresh]

Each scale factor runs in its own process (so driver memory and peak RSS are per scale
factor), with a SparkSession that sets no tuning: no shuffle partitions, default memory,
except ``--driver-memory`` for scale factors >= ``--memory-from-sf`` (10), the same for every
variant. Per scale factor: TPC-H is generated as Delta tables (on the fly, under
``benchmarks/.data``), every example model is built, then one TPC-H refresh round
(RF1 + RF2 + updates, 0.1 % of the orders) is applied and each model is run

* incrementally (``run_job``: a `dbt run`'s engine call): seconds, Spark jobs, delta
  queries run by the local engine and by Spark, state rows read, target rows rewritten,
  source rows changed, strategy; then verified against batch evaluation at its recorded cut
  (``consistent-stream verify``);
* as a dbt ``table`` would be: CREATE TABLE .. USING parquet AS <the SQL> over the sources'
  snapshots;
* as a dbt-spark ``incremental`` model with ``file_format='delta'`` and
  ``incremental_strategy='merge'`` would be (every model with a unique_key): the SQL over the
  snapshots MERGEd into a Delta table by the key (:func:`_merge_model_seconds`), with the rows
  in which its result differs from the target (``merge_rows_wrong``: the merge deletes
  nothing);
* with ``--full-refresh`` (a rebuild from snapshots; ``ratio_full_refresh_to_table``: its
  seconds over the dbt ``table``'s); with ``--rebuild-pairs N``, N - 1 more (``table``,
  ``--full-refresh``) pairs back to back, the first variant alternating, and the median of the
  N pairs' ratios (``ratio_full_refresh_to_table_median``; the pairs' seconds in
  ``rebuild_pairs_s``);

then, with ``--rounds N``, N - 1 more refresh rounds, each followed by an incremental run of
every model: the mean seconds over the N rounds, which counts the state compactions a single
round may miss (an arrangement is re-based once its deltas reach half its base, every eighth
round or so at SF 10: ``state.arrangement.CompactionPolicy``);
and then ``--small-batches`` (5) small rounds of at most 2,000 changed source rows per model
(``size`` 140 orders), each followed by an incremental run: the median batch seconds inside
the warm session. Before each timed variant the refresh generator's writes are flushed and
Python's garbage collected (:func:`_settle`). Peak RSS of the driver's Python process and of
the Spark JVM is reset before and read after each variant (``/proc/<pid>/clear_refs``,
``VmHWM``), beside the RSS each variant began with.

``--fresh``: each incremental run starts from what a new process holds, as a ``dbt run`` does
(a new process each time): the data files and target key columns earlier runs of this process
read or wrote are forgotten first, so the run reads the copies this machine keeps on disk
(``local_cache``) or the files themselves. Without it, the runs share the process's memory, as
a continuous model's batches do.

Prints one JSON line per (scale factor, model) and a final summary line, on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
DATA = REPO / "benchmarks" / ".data"
SMALL_ROUND_ORDERS = 140
"""Orders per small round: about 14 changed source rows per order (RF1 + RF2 order and
lineitem rows, two updates), so every model reads at most 2,000."""


def _session(driver_memory: str | None, warehouse: Path):
    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON before the session)
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    b = (with_delta(SparkSession.builder).master("local[*]").appName("consistent-stream-bench")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.warehouse.dir", str(warehouse)))
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


class PeakRSS:
    """Peak resident memory (MB) of this process and of the Spark JVM during a block
    (``peak``), and their resident memory when it began (``start``): the high-water mark is
    reset to the current RSS on entry, so ``peak - start`` is what the block added, while
    ``peak`` also counts what earlier work left (Arrow's allocator keeps freed memory).
    ``workers``: also ``peak["workers"]``, the peak of the summed RSS of the JVM's child
    processes (pyspark's Python workers), sampled every 0.25 s, and ``workers_cpu_s``, the CPU
    seconds they spent in the block (each process's last sample less its first: up to a quarter
    second of a worker's CPU after it starts and before it exits is not counted)."""

    def __init__(self, spark, workers: bool = False):
        self.pids = {"python": os.getpid(),
                     "jvm": int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())}
        self.peak = {}
        self.start = {}
        self._workers = workers
        self._stop = None
        self._workers_peak = 0.0
        self._workers_cpu: dict[int, list[float]] = {}   # pid -> [first, last] CPU seconds sampled
        self.workers_cpu_s = 0.0

    @staticmethod
    def _descendants(root: int) -> list[int]:
        """The processes below ``root`` (``/proc``): pyspark's Python daemon and workers."""
        parent = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    pass
        out, frontier = [], [root]
        while frontier:
            kids = [p for p, pp in parent.items() if pp in frontier]
            out += kids
            frontier = kids
        return out

    def _sample_workers(self) -> None:
        import threading
        from flink_sql import cpu_seconds
        self._stop = threading.Event()

        def sample():
            total = 0.0
            for pid in self._descendants(self.pids["jvm"]):
                try:
                    total += self._status(pid, "VmRSS")
                except OSError:
                    continue
                cpu = cpu_seconds(pid)
                if cpu is not None:
                    self._workers_cpu.setdefault(pid, [cpu, cpu])[1] = cpu
            self._workers_peak = max(self._workers_peak, total)

        def run():
            sample()
            while not self._stop.wait(0.25):
                sample()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    @staticmethod
    def _status(pid: int, field: str) -> float:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def __enter__(self):
        for k, pid in self.pids.items():
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
            self.start[k] = round(self._status(pid, "VmRSS"), 1)
        if self._workers:
            self._sample_workers()
        return self

    def __exit__(self, *exc):
        self.peak = {k: round(self._status(pid, "VmHWM"), 1) for k, pid in self.pids.items()}
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            self.peak["workers"] = round(self._workers_peak, 1)
            self.workers_cpu_s = round(float(sum(last - first for first, last in self._workers_cpu.values())), 2)
        return False


def _table_model_seconds(spark, job) -> float:
    """What dbt's `table` materialization does: CREATE TABLE .. USING parquet AS <the SQL>,
    over each source's current snapshot (read like the engine reads it)."""
    from consistent_stream.oracle import rewrite_relations
    t0 = time.time()
    mapping = _source_views(spark, job)
    spark.sql("CREATE SCHEMA IF NOT EXISTS bench")
    spark.sql(f"DROP TABLE IF EXISTS bench.{job.identifier}_table")
    spark.sql(f"CREATE TABLE bench.{job.identifier}_table USING parquet AS {rewrite_relations(job.sql, mapping)}")
    secs = time.time() - t0
    for name in mapping.values():
        spark.catalog.dropTempView(name)
    return secs


def _source_views(spark, job) -> dict:
    """Each source's current snapshot as a temporary view (read like the engine reads it):
    relation parts -> view name."""
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.oracle import view_name
    mapping = {}
    for s in job.sources:
        t = DeltaTableRef(s.location)
        v = t.latest_version()
        name = view_name(s, v)
        t.read_snapshot(spark, v).createOrReplaceTempView(name)
        mapping[s.relation_parts] = name
    return mapping


def _merge_model_seconds(spark, job, *, create: bool) -> float:
    """What dbt-spark's ``incremental`` materialization with ``file_format='delta'`` and
    ``incremental_strategy='merge'`` runs: on the first run (``create``) CREATE TABLE .. USING
    delta AS <the SQL>; on a later run a temporary view of the SQL, then ``MERGE INTO`` the
    Delta table ``ON`` the model's unique_key, ``WHEN MATCHED THEN UPDATE SET * WHEN NOT
    MATCHED THEN INSERT *`` (dbt-spark's statement). The SQL has no ``is_incremental()``
    filter: the TPC-H sources have no column that says which rows changed since the last run
    (no updated_at), so the SQL is evaluated over the whole snapshots, as a user of these
    models would have to. dbt-spark's merge deletes nothing: a group or order that vanished
    stays in the table (``merge_rows_wrong`` counts them)."""
    from consistent_stream.oracle import rewrite_relations
    t0 = time.time()
    mapping = _source_views(spark, job)
    sql = rewrite_relations(job.sql, mapping)
    name = f"bench.{job.identifier}_merge"
    spark.sql("CREATE SCHEMA IF NOT EXISTS bench")
    if create:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.sql(f"CREATE TABLE {name} USING delta AS {sql}")
    else:
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {job.identifier}__dbt_tmp AS {sql}")
        on = " AND ".join(f"DBT_INTERNAL_SOURCE.`{k}` <=> DBT_INTERNAL_DEST.`{k}`" for k in job.unique_key)
        spark.sql(f"MERGE INTO {name} AS DBT_INTERNAL_DEST USING {job.identifier}__dbt_tmp AS DBT_INTERNAL_SOURCE "
                  f"ON {on} WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    secs = time.time() - t0
    for view in mapping.values():
        spark.catalog.dropTempView(view)
    return secs


def _rows_differing(spark, job, table: str) -> int:
    """Rows of ``table`` and of the model's target (newest version) in one but not the other
    (as multisets; floating-point columns rounded to 9 significant digits would matter only
    for the aggregates, which both compute from the same rows)."""
    target = spark.read.format("delta").load(job.target_path)
    other = spark.table(table).select(*target.columns)
    return other.exceptAll(target).count() + target.exceptAll(other).count()


def _settle() -> None:
    """Before each timed variant: flush the writes of the refresh generator (a few GB at SF 10,
    whose writeback otherwise competes with the run for the disk) and collect the Python
    garbage it and the previous variant left (the generator runs in this process; a
    source's writer runs in another one when a user runs dbt). Applied to every variant."""
    import gc
    os.sync()
    gc.collect()


FRESH_ENV = "CS_BENCH_FRESH"


def _run(spark, job, **kw) -> dict:
    """``run_job``; with ``--fresh`` an incremental run first forgets the data files and key
    columns the process holds in memory (``delta.files.HELD``, ``HELD_KEYS``), as a ``dbt
    run``, a new process each time, starts: it reads what this machine keeps on disk instead
    (``local_cache``), or the files."""
    from consistent_stream.job import run_job
    if os.environ.get(FRESH_ENV) and not kw.get("full_refresh"):
        from consistent_stream.delta.files import HELD, HELD_KEYS
        HELD.clear()
        HELD_KEYS.clear()
    return run_job(spark, job, **kw)


def _rebuild_pairs(spark, job, n: int) -> list[tuple[float, float]]:
    """``n`` more (dbt ``table`` seconds, ``--full-refresh`` seconds) pairs of ``job`` over the
    same snapshots, each pair measured back to back, the first variant alternating (the
    full refresh first in the first of them, as the table went first in the pair before). On
    a shared machine one variant's seconds move between runs of the same SQL by more than the
    changes being measured; a pair's ratio moves less, and the median of several pairs less
    again (the docs' benchmark page gives the spread)."""
    out = []
    for i in range(n):
        secs = {}
        for variant in (("full", "table") if i % 2 == 0 else ("table", "full")):
            _settle()
            secs[variant] = (_run(spark, job, full_refresh=True)["seconds"] if variant == "full"
                             else _table_model_seconds(spark, job))
        out.append((secs["table"], secs["full"]))
    return out


def one_scale_factor(sf: float, models: list[str], small_batches: int, driver_memory: str | None,
                     extra_rounds: int = 0, rebuild_pairs: int = 1) -> list[dict]:
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream_testing.tpch.generate import generate
    from consistent_stream_testing.tpch.refresh import refresh_round
    from consistent_stream_testing.apart import in_child
    from consistent_stream.verify import verify_target
    from helpers import EXAMPLE_MODELS, job_for, render_model, tpch_sources

    root = DATA / f"sf{sf:g}"
    shutil.rmtree(root, ignore_errors=True)
    spark = _session(driver_memory, root / "warehouse")
    t0 = time.time()
    in_child(generate, sf, root / "data")
    gen_s = time.time() - t0
    jobs = []
    for name in models:
        sql, config, used, _ = render_model(EXAMPLE_MODELS / f"{name}.sql")
        jobs.append(job_for(name, sql, tpch_sources(str(root / "data"), used), config["unique_key"], root,
                            schema="bench"))
    initial = {}
    for job in jobs:
        with PeakRSS(spark) as rss:
            initial[job.model] = (_run(spark, job, full_refresh=True), rss)
        if job.unique_key:
            _merge_model_seconds(spark, job, create=True)   # the merge model's first run
    t0 = time.time()
    in_child(refresh_round, root / "data", 1)
    rf_s = time.time() - t0
    out = []
    for job in jobs:
        _settle()
        with PeakRSS(spark) as rss_inc:
            inc = _run(spark, job)
        ver = verify_target(spark, job.target_path)
        _settle()
        with PeakRSS(spark) as rss_table:
            table_s = _table_model_seconds(spark, job)
        merge_s = merge_wrong = None
        if job.unique_key:
            _settle()
            merge_s = _merge_model_seconds(spark, job, create=False)
            merge_wrong = _rows_differing(spark, job, f"bench.{job.identifier}_merge")
        _settle()
        with PeakRSS(spark) as rss_full:
            full = _run(spark, job, full_refresh=True)
        pairs = [(table_s, full["seconds"])] + _rebuild_pairs(spark, job, rebuild_pairs - 1)
        m = inc["metrics"][0] if inc["metrics"] else {}
        target = DeltaTableRef(job.target_path)
        out.append({
            "sf": sf, "model": job.model, "driver_memory": driver_memory or "default",
            "fresh": bool(os.environ.get(FRESH_ENV)),
            "incremental_s": inc["seconds"], "table_model_s": round(table_s, 3), "full_refresh_s": full["seconds"],
            "ratio_table_to_incremental": round(table_s / inc["seconds"], 2),
            "merge_model_s": round(merge_s, 3) if merge_s is not None else None,
            "ratio_merge_to_incremental": round(merge_s / inc["seconds"], 2) if merge_s is not None else None,
            "merge_rows_wrong": merge_wrong,
            "ratio_full_refresh_to_incremental": round(full["seconds"] / inc["seconds"], 2),
            "ratio_full_refresh_to_table": round(full["seconds"] / table_s, 2),
            "rebuild_pairs_s": [[round(t, 3), round(f, 3)] for t, f in pairs],
            "ratio_full_refresh_to_table_median": round(statistics.median(f / t for t, f in pairs), 2),
            "incremental_batch_s": m.get("seconds"), "strategy": m.get("strategy"),
            "spark_jobs_per_batch": m.get("spark_jobs"),
            "delta_queries": {"local": m.get("local_queries"), "spark": m.get("spark_queries")},
            "state_rows_read": m.get("state_rows_read"),
            "state_files_read": m.get("state_files_read"), "target_rows_rewritten": m.get("target_rows_rewritten"),
            "source_rows_changed": inc["changes_read"], "target_rows_written": inc["rows_written"],
            "target_rows": target.num_records(target.latest_version()), "phases": m.get("phases"),
            "verified": ver.ok,
            "initial_build_s": initial[job.model][0]["seconds"],
            "peak_rss_mb": {"initial_build": initial[job.model][1].peak, "incremental": rss_inc.peak,
                            "table": rss_table.peak, "full_refresh": rss_full.peak},
            "start_rss_mb": {"initial_build": initial[job.model][1].start, "incremental": rss_inc.start,
                             "table": rss_table.start, "full_refresh": rss_full.start},
            "generate_s": round(gen_s, 1), "refresh_round_s": round(rf_s, 1),
        })
    # further refresh rounds: what a run costs on average once state compactions (every few
    # rounds, table-sized) are counted in
    by_model = {job.model: job for job in jobs}
    rounds: dict[str, list] = {job.model: [] for job in jobs}
    for i in range(1, extra_rounds + 1):
        in_child(refresh_round, root / "data", 1 + i)
        for job in jobs:
            _settle()
            s = _run(spark, job)
            m = s["metrics"][0] if s["metrics"] else {}
            rounds[job.model].append((s["seconds"], m.get("state_rows_compacted") or 0))
    for rec in out:
        r = rounds[rec["model"]]
        if r:
            secs = [rec["incremental_s"]] + [x[0] for x in r]
            rec["rounds_incremental_s"] = secs
            rec["rounds_mean_s"] = round(statistics.mean(secs), 3)
            rec["rounds_state_rows_compacted"] = [x[1] for x in r]
            rec["rounds_ratio_table_to_mean"] = round(rec["table_model_s"] / rec["rounds_mean_s"], 2)
            rec["rounds_verified"] = verify_target(spark, by_model[rec["model"]].target_path).ok
    # small batches: at most 2,000 changed source rows each, in the warm session
    batches: dict[str, list] = {job.model: [] for job in jobs}
    for i in range(small_batches):
        in_child(refresh_round, root / "data", 100 + i, size=SMALL_ROUND_ORDERS)
        for job in jobs:
            _settle()
            s = _run(spark, job)
            assert s["batches"] == 1, s
            batches[job.model].append((s["metrics"][0]["seconds"], s["changes_read"], s["seconds"]))
    for rec in out:
        b = batches[rec["model"]]
        if b:
            rec["small_batch_s_median"] = round(statistics.median(x[0] for x in b), 3)
            rec["small_batch_run_s_median"] = round(statistics.median(x[2] for x in b), 3)
            rec["small_batch_changed_rows_max"] = max(x[1] for x in b)
        rec["small_batches_verified"] = verify_target(spark, by_model[rec["model"]].target_path).ok
        print(json.dumps(rec), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--small-batches", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="refresh rounds of 0.1%% each; past the first, each model's incremental runs are "
                         "averaged with it, state compactions included")
    ap.add_argument("--rebuild-pairs", type=int, default=1,
                    help="(table, --full-refresh) pairs per model, back to back, the order alternating; "
                         "ratio_full_refresh_to_table_median is their median ratio")
    ap.add_argument("--driver-memory", default="8g", help="spark.driver.memory from --memory-from-sf on")
    ap.add_argument("--memory-from-sf", type=float, default=10.0)
    ap.add_argument("--fresh", action="store_true",
                    help="each incremental run starts from what a new process holds, as a dbt run")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fresh:
        os.environ[FRESH_ENV] = "1"   # (the scale factors' processes inherit it)
    from helpers import EXAMPLE_MODELS, render_model
    # by default the example models over sources only (the ref() chain's levels need their
    # upstreams, and a view is not maintained)
    models = args.models or sorted(p.stem for p in EXAMPLE_MODELS.glob("*.sql")
                                   if not render_model(p)[3] and render_model(p)[1].get("materialized") != "view")
    if args.one:
        mem = args.driver_memory if args.sf[0] >= args.memory_from_sf else None
        one_scale_factor(args.sf[0], models, args.small_batches, mem, args.rounds - 1, args.rebuild_pairs)
        return 0
    summary = []
    for sf in args.sf:  # one process per scale factor
        cmd = [sys.executable, __file__, "--one", "--sf", str(sf), "--small-batches", str(args.small_batches),
               "--rounds", str(args.rounds), "--rebuild-pairs", str(args.rebuild_pairs),
               "--driver-memory", args.driver_memory, "--memory-from-sf", str(args.memory_from_sf),
               "--models", *models]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
                summary.append(json.loads(line))
        if proc.returncode != 0:
            print(json.dumps({"sf": sf, "error": f"exit code {proc.returncode}"}), flush=True)
    print(json.dumps({"summary": [{k: r.get(k) for k in (
        "sf", "model", "incremental_s", "table_model_s", "full_refresh_s", "ratio_table_to_incremental",
        "ratio_full_refresh_to_table", "ratio_full_refresh_to_table_median", "merge_model_s",
        "ratio_merge_to_incremental", "merge_rows_wrong",
        "spark_jobs_per_batch", "delta_queries", "state_rows_read", "target_rows_rewritten", "small_batch_s_median",
        "peak_rss_mb", "verified", "rounds_mean_s", "rounds_ratio_table_to_mean")} for r in summary]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
