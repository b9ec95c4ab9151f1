"""Benchmark: a continuous model run for a long time under steady source changes stays flat.

    .venv/bin/python benchmarks/long_run.py [--minutes 30] [--out DIR] [--interval 2]
                                            [--config KEY=VALUE ...]

Creates two Delta source tables with the Change Data Feed on under ``DIR/src`` (``customers``:
``--customers`` rows, ``orders``: 4 per customer), and a model with a join and a group by
(so it keeps state: both join inputs and the aggregate), then:

* starts the continuous run (trigger ``processing_time:<--interval>``) in a separate process
  (``consistent_stream.job.run_job(spark, job, timeout_s=minutes x 60)``, a
  ``SparkSession.builder.master("local[*]")`` (with delta-spark) with Spark's defaults), logging to
  ``DIR/run.log``;
* a change generator applies one MERGE per table every ``--change-every`` seconds: order
  amounts updated, orders deleted and as many inserted, a customer renamed (live rows stay
  constant);
* a sampler records every ``--sample`` seconds: elapsed seconds, the target's version, the
  batches' seconds since the previous sample (from the run log), the RSS of the run's process
  tree (Python driver + JVM + Python workers, from /proc) and of the driver and the JVM
  apart, the JVM's heap (used, committed, old generation used: the JDK's ``jstat -gc``),
  the state table's live rows,
  live files, files and bytes on disk and log files, the target's log files and bytes, data
  files on disk and Change Data Feed files, its live files with a deletion vector and the
  deletion vector files on disk, the checkpoint directory's files and bytes, the cut files.

With ``CONSISTENT_STREAM_DV_MIN_ROWS=1`` in the environment every target file a batch
retracts rows of may keep its rows under a deletion vector (the default, 20,000 rows, is more
than this target holds), so vectors accumulate and are purged as the run goes on.

When the run stops, the target's last version is compared with DuckDB's evaluation of the
model's SQL at the cut that version records. Prints one JSON document (``samples``, and a
``summary`` with the medians of the first and the last ``window`` minutes, 5 by default or a
third of the run, and their ratios) and writes ``DIR/long_run.json`` and ``DIR/long_run.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

SQL = """
select c.id, c.name, count(*) as orders, sum(o.amount) as total
from src.customers c join src.orders o on c.id = o.cid
group by c.id, c.name
"""

RUNNER = textwrap.dedent("""
    import logging, sys
    import consistent_stream
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    from consistent_stream.job import run_job
    from consistent_stream.spec import JobSpec
    logging.basicConfig(filename=sys.argv[2], level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = with_delta(SparkSession.builder).master("local[*]").appName("long_run").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if len(sys.argv) > 4 and float(sys.argv[4]) > 0:   # --python-memory: what the driver's Python holds
        import gc, threading, tracemalloc
        import pyarrow as pa
        tracemalloc.start(8)
        def python_memory(every=float(sys.argv[4]), mem=logging.getLogger("long_run.memory")):
            first = None
            while True:
                __import__("time").sleep(every)
                snap = tracemalloc.take_snapshot()
                first = first or snap
                top = [f"{d.size_diff / 1024:+.0f} KiB in {d.count_diff:+d} blocks at "
                       + " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(d.traceback[-4:]))
                       for d in snap.compare_to(first, "traceback")[:5]]
                mem.info("PYTHON_MEMORY %s", __import__("json").dumps({
                    "traced_bytes": tracemalloc.get_traced_memory()[0], "arrow_bytes": pa.total_allocated_bytes(),
                    "gc_objects": len(gc.get_objects()), "growth_since_first": top}))
        threading.Thread(target=python_memory, daemon=True).start()
    summary = run_job(spark, JobSpec.load(sys.argv[1]), timeout_s=float(sys.argv[3]))
    summary.pop("metrics", None); summary.pop("progress", None)
    logging.getLogger("long_run").info("SUMMARY %s", __import__("json").dumps(summary, default=str))
""")

BATCH_LINE = re.compile(r"batch (\d+) committed target version (\d+) .*?rows written, ([0-9.]+)s,")
MAINT_LINE = re.compile(r"maintenance .*? in ([0-9.]+)s")


# ---- measurements ----------------------------------------------------------------------------
def processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command name), from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                name, rest = f.read().split("(", 1)[1].rsplit(")", 1)
            out[int(d)] = (int(rest.split()[1]), name)
        except (OSError, IndexError, ValueError):
            continue
    return out


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (bytes, from /proc; None once gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def tree_rss_bytes(pid: int, procs: dict[int, tuple[int, str]]) -> int:
    """Resident set size of ``pid`` and all its descendants among ``procs`` (:func:`processes`)."""
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(p)
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        total += rss_bytes(p) or 0
    return total


def jvm_sample(pid: int, procs: dict[int, tuple[int, str]]) -> dict:
    """The Spark JVM among ``pid``'s children in ``procs`` (:func:`processes`): its RSS, and
    its heap from the JDK's ``jstat -gc`` (bytes: used and committed, and the old
    generation's used part, whose floor is what a leak would raise); None where the JVM or
    ``jstat`` is missing. Also the RSS of ``pid`` itself (the Python driver)."""
    out: dict = {"driver_rss_bytes": rss_bytes(pid), "jvm_rss_bytes": None, "jvm_heap_used_bytes": None,
                 "jvm_heap_committed_bytes": None, "jvm_old_used_bytes": None}
    java = next((p for p, (ppid, name) in procs.items() if ppid == pid and name == "java"), None)
    if java is None:
        return out
    out["jvm_rss_bytes"] = rss_bytes(java)
    jstat = shutil.which("jstat")
    if jstat is None:
        return out
    try:
        lines = subprocess.run([jstat, "-gc", str(java)], capture_output=True, text=True, timeout=10).stdout.split("\n")
        row = dict(zip(lines[0].split(), (float(x) for x in lines[1].split())))
        kib = 1024
        out["jvm_heap_used_bytes"] = int((row["S0U"] + row["S1U"] + row["EU"] + row["OU"]) * kib)
        out["jvm_heap_committed_bytes"] = int((row["S0C"] + row["S1C"] + row["EC"] + row["OC"]) * kib)
        out["jvm_old_used_bytes"] = int(row["OU"] * kib)
    except (OSError, subprocess.SubprocessError, IndexError, KeyError, ValueError):
        pass
    return out


def dir_stats(path: str, skip: tuple[str, ...] = ()) -> tuple[int, int]:
    """(files, bytes) under ``path``, not descending into top-level entries named in ``skip``."""
    files = size = 0
    for root, dirs, names in os.walk(path):
        if root == path:
            dirs[:] = [d for d in dirs if d not in skip]
        for n in names:
            try:
                size += os.stat(os.path.join(root, n)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def table_sample(path: str, prefix: str, live: bool) -> dict:
    """Disk use of the Delta table at ``path`` (and with ``live``, its live rows and files)."""
    out: dict = {}
    log_files, log_bytes = dir_stats(os.path.join(path, "_delta_log"))
    data_files, data_bytes = dir_stats(path, skip=("_delta_log", "_change_data"))
    cdc_files, cdc_bytes = dir_stats(os.path.join(path, "_change_data"))
    out.update({f"{prefix}_log_files": log_files, f"{prefix}_log_bytes": log_bytes,
                f"{prefix}_disk_files": data_files, f"{prefix}_disk_bytes": data_bytes,
                f"{prefix}_cdc_files": cdc_files, f"{prefix}_cdc_bytes": cdc_bytes})
    try:
        out[f"{prefix}_checkpoints"] = len([n for n in os.listdir(os.path.join(path, "_delta_log"))
                                           if ".checkpoint." in n])
    except OSError:
        out[f"{prefix}_checkpoints"] = 0
    out[f"{prefix}_dv_disk_files"] = sum(1 for _, _, names in os.walk(path) for n in names
                                         if n.startswith("deletion_vector_"))
    if live:
        try:
            from consistent_stream.delta.log import OwnedLog
            own = OwnedLog(path, copy=False)
            if own.load():
                out[f"{prefix}_files_with_dv"] = sum(1 for a in own.files.values() if a.get("deletionVector"))
        except Exception as e:  # noqa: BLE001 (a log file cleaned up under us: the next sample reads it)
            out[f"{prefix}_dv_error"] = str(e)[:200]
        try:
            from deltalake import DeltaTable
            dt = DeltaTable(path)
            import pyarrow as pa
            acts = pa.table(dt.get_add_actions(flatten=True))
            out[f"{prefix}_version"] = dt.version()
            out[f"{prefix}_rows"] = int(sum(v or 0 for v in acts.column("num_records").to_pylist()))
            out[f"{prefix}_files"] = acts.num_rows
        except Exception as e:  # the table does not exist yet, or a log file was cleaned up under us
            out[f"{prefix}_error"] = str(e)[:200]
    return out


class LogTail:
    """The batches (and maintenance passes) the run log reported since the last call."""

    def __init__(self, path: str):
        self.path, self.offset = path, 0

    def read(self) -> tuple[list[float], list[float]]:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except OSError:
            return [], []
        batches = [float(m.group(3)) for m in BATCH_LINE.finditer(text)]
        maint = [float(m.group(1)) for m in MAINT_LINE.finditer(text)]
        return batches, maint


# ---- sources and changes ---------------------------------------------------------------------
def make_sources(src: Path, customers: int):
    import pyarrow as pa
    from deltalake import write_deltalake
    cdf = {"delta.enableChangeDataFeed": "true"}
    ids = list(range(customers))
    write_deltalake(str(src / "customers"), pa.table({"id": ids, "name": [f"c{i}" for i in ids]}),
                    configuration=cdf)
    n = customers * 4
    write_deltalake(str(src / "orders"), pa.table({"oid": list(range(n)), "cid": [i % customers for i in range(n)],
                                                    "amount": [i % 97 for i in range(n)]}), configuration=cdf)
    return n


class ChangeGenerator(threading.Thread):
    """Every ``every`` seconds: one MERGE on orders (``updates`` amounts changed, ``churn``
    orders deleted and as many new ones inserted) and one on customers (one renamed)."""

    def __init__(self, src: Path, customers: int, orders: int, every: float, updates: int, churn: int):
        super().__init__(daemon=True, name="changes")
        self.src, self.customers, self.every, self.updates, self.churn = src, customers, every, updates, churn
        self.live = list(range(orders))      # order ids, oldest first
        self.next_oid = orders
        self.stop = threading.Event()
        self.commits = 0
        self.error: str | None = None

    def run(self) -> None:
        import random

        import pyarrow as pa
        from deltalake import DeltaTable
        rnd = random.Random(7)
        orders, customers = DeltaTable(str(self.src / "orders")), DeltaTable(str(self.src / "customers"))
        step = 0
        while not self.stop.wait(self.every):
            step += 1
            try:
                gone = self.live[:self.churn]
                self.live = self.live[self.churn:]
                new = list(range(self.next_oid, self.next_oid + self.churn))
                self.next_oid += self.churn
                self.live.extend(new)
                upd = rnd.sample(self.live[:-self.churn], self.updates)
                rows = ([(o, 0, 0, "d") for o in gone] + [(o, 0, rnd.randrange(100), "u") for o in upd]
                        + [(o, rnd.randrange(self.customers), rnd.randrange(100), "i") for o in new])
                ch = pa.table({"oid": [r[0] for r in rows], "cid": [r[1] for r in rows],
                               "amount": [r[2] for r in rows], "op": [r[3] for r in rows]})
                orders.update_incremental()
                (orders.merge(ch, "t.oid = s.oid", source_alias="s", target_alias="t")
                 .when_matched_delete(predicate="s.op = 'd'")
                 .when_matched_update({"amount": "s.amount"}, predicate="s.op = 'u'")
                 .when_not_matched_insert({"oid": "s.oid", "cid": "s.cid", "amount": "s.amount"},
                                          predicate="s.op = 'i'")
                 .execute())
                c = rnd.randrange(self.customers)
                customers.update_incremental()
                (customers.merge(pa.table({"id": [c], "name": [f"c{c}-{step}"]}), "t.id = s.id",
                                 source_alias="s", target_alias="t")
                 .when_matched_update({"name": "s.name"}).execute())
                self.commits += 2
            except Exception as e:  # noqa: BLE001 (reported in the output, the run goes on)
                self.error = f"{type(e).__name__}: {e}"[:300]


# ---- the run ---------------------------------------------------------------------------------
def parse_config(items: list[str]) -> dict:
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def summarize(samples: list[dict], window_s: float, keys: list[str]) -> dict:
    """Per key: medians over the first and the last ``window_s`` seconds, and last / first."""
    if not samples:
        return {}
    end = samples[-1]["elapsed_s"]
    first = [s for s in samples if s["elapsed_s"] <= window_s]
    last = [s for s in samples if s["elapsed_s"] >= end - window_s]
    out = {}
    for k in keys:
        a = [s[k] for s in first if s.get(k) is not None]
        b = [s[k] for s in last if s.get(k) is not None]
        if not a or not b:
            continue
        fa, fb = statistics.median(a), statistics.median(b)
        out[k] = {"first": round(fa, 3), "last": round(fb, 3), "ratio": round(fb / fa, 3) if fa else None}
    return out


def verify(job) -> dict:
    """The target's last version against DuckDB's evaluation of the SQL at its recorded cut."""
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.oracle import duckdb_result
    from consistent_stream.runtime import BatchMeta
    from consistent_stream.sources import Cut
    ref = DeltaTableRef(job.target_path)
    meta = BatchMeta.from_commit(ref.latest_commit())
    got = ref.read_snapshot_arrow(ref.version()).to_pandas()   # (deletion vectors applied)
    want = duckdb_result(job.sql, job.sources, Cut(meta.cut))
    got = got.sort_values("id").reset_index(drop=True)
    want = want.sort_values("id").reset_index(drop=True)
    same = len(got) == len(want) and all(
        [float(x) for x in got[c]] == [float(x) for x in want[c]] if c != "name" else list(got[c]) == list(want[c])
        for c in ("id", "name", "orders", "total"))
    return {"equal": bool(same), "rows": len(got), "expected_rows": len(want), "target_version": ref.version(),
            "batch_id": meta.batch_id, "cut": meta.cut}


def plot(samples: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["elapsed_s"] / 60 for s in samples]

    def series(k, scale=1.0):
        return [None if s.get(k) is None else s[k] / scale for s in samples]
    panels = [
        ("memory (MiB)", [("process tree RSS", series("rss_bytes", 2**20)),
                          ("JVM RSS", series("jvm_rss_bytes", 2**20)),
                          ("JVM heap committed", series("jvm_heap_committed_bytes", 2**20)),
                          ("JVM heap used", series("jvm_heap_used_bytes", 2**20)),
                          ("JVM old gen used", series("jvm_old_used_bytes", 2**20)),
                          ("Python driver RSS", series("driver_rss_bytes", 2**20))]),
        ("batch seconds (median per sample)", [("batch s", series("batch_s"))]),
        ("state table", [("live rows / 100", series("state_rows", 100)), ("live files", series("state_files")),
                         ("files on disk", series("state_disk_files")), ("log files", series("state_log_files"))]),
        ("bytes on disk (MiB)", [("state data", series("state_disk_bytes", 2**20)),
                                 ("target data", series("target_disk_bytes", 2**20)),
                                 ("target CDF", series("target_cdc_bytes", 2**20)),
                                 ("checkpoint dir", series("checkpoint_bytes", 2**20))]),
        ("target files", [("log files", series("target_log_files")),
                          ("data files on disk", series("target_disk_files")),
                          ("CDF files", series("target_cdc_files")), ("live files", series("target_files"))]),
        ("checkpoint dir files", [("files", series("checkpoint_files"))]),
    ]
    fig, axes = plt.subplots(3, 2, figsize=(12, 10))
    for ax, (name, lines) in zip(axes.flat, panels):
        for label, ys in lines:
            ax.plot(t, ys, label=label)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("minutes")
        ax.set_ylim(bottom=0)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--out", default="/tmp/long_run")
    ap.add_argument("--interval", type=float, default=2.0, help="trigger processing_time seconds")
    ap.add_argument("--customers", type=int, default=1000)
    ap.add_argument("--change-every", type=float, default=1.0)
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--churn", type=int, default=10)
    ap.add_argument("--sample", type=float, default=15.0)
    ap.add_argument("--config", action="append", default=[], help="model config KEY=VALUE (JSON value)")
    ap.add_argument("--python-memory", type=float, default=0.0,
                    help="every this many seconds, log what the run's Python holds (tracemalloc: traced bytes and "
                         "the allocations grown most since the first such log; Arrow's pool; gc objects) as "
                         "PYTHON_MEMORY lines of run.log; 0: off (tracemalloc slows the driver)")
    args = ap.parse_args()
    import consistent_stream  # noqa: F401
    from consistent_stream.spec import JobSpec

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    src = out / "src"
    src.mkdir(parents=True)
    n_orders = make_sources(src, args.customers)
    sources = [{"source_name": "src", "name": n, "relation": f"src.{n}",
                "meta": {"location": str(src / n), "primary_key": k}}
               for n, k in (("customers", ["id"]), ("orders", ["oid"]))]
    config = {"unique_key": "id", "location_root": str(out / "targets"),
              "trigger": f"processing_time:{args.interval}", **parse_config(args.config)}
    job = JobSpec.from_dbt(project_root=str(out), schema="bench", identifier="m", model_name="m", sql=SQL,
                           sources=sources, config=config, warehouse_dir=str(out / "wh"))
    spec = out / "job.json"
    spec.write_text(job.to_json())
    run_log = out / "run.log"
    seconds = args.minutes * 60
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(spec), str(run_log), str(seconds),
                             str(args.python_memory)],
                            cwd=str(out), stdout=open(out / "run.stdout", "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO / "python")})
    gen = ChangeGenerator(src, args.customers, n_orders, args.change_every, args.updates, args.churn)
    tail = LogTail(str(run_log))
    samples: list[dict] = []
    t0 = time.time()
    started = False
    try:
        while proc.poll() is None:
            time.sleep(min(args.sample, 1.0) if not started else args.sample)
            if not started:
                if os.path.isdir(os.path.join(job.target_path, "_delta_log")):
                    started = True
                    t0 = time.time()
                    gen.start()
                continue
            batches, maint = tail.read()
            procs = processes()
            s = {"elapsed_s": round(time.time() - t0, 1), "rss_bytes": tree_rss_bytes(proc.pid, procs),
                 "batches": len(batches), "batch_s": round(statistics.median(batches), 3) if batches else None,
                 "batch_s_max": max(batches) if batches else None,
                 "maintenance_s": round(sum(maint), 3) if maint else None, "source_commits": gen.commits}
            s.update(jvm_sample(proc.pid, procs))
            s.update(table_sample(job.target_path, "target", live=True))
            s.update(table_sample(job.state_root, "state", live=True))
            s["checkpoint_files"], s["checkpoint_bytes"] = dir_stats(job.checkpoint_location)
            samples.append(s)
            print(json.dumps(s), file=sys.stderr, flush=True)
    finally:
        gen.stop.set()
        if proc.poll() is None:
            proc.wait()
    result: dict = {"command": " ".join(sys.argv), "minutes": args.minutes, "config": config,
                    "run_exit_code": proc.returncode, "generator_error": gen.error,
                    "source_commits": gen.commits}
    batches, maint = tail.read()
    window = min(300.0, seconds / 3)
    keys = ["rss_bytes", "driver_rss_bytes", "jvm_rss_bytes", "jvm_heap_used_bytes", "jvm_heap_committed_bytes",
            "jvm_old_used_bytes", "batch_s", "state_rows", "state_files", "state_disk_files", "state_disk_bytes",
            "state_log_files", "state_log_bytes", "target_log_files", "target_log_bytes", "target_disk_files",
            "target_disk_bytes", "target_cdc_files", "target_files", "target_files_with_dv", "target_dv_disk_files",
            "checkpoint_files", "checkpoint_bytes"]
    result["summary"] = {"window_s": window, "batches": sum(s["batches"] for s in samples) + len(batches),
                         **summarize(samples, window, keys)}
    try:
        text = run_log.read_text()
        m = [float(x) for x in MAINT_LINE.findall(text)]
        b = [float(g[2]) for g in BATCH_LINE.findall(text)]
        result["summary"]["maintenance"] = {"passes": len(m), "seconds_total": round(sum(m), 3),
                                            "seconds_median": round(statistics.median(m), 3) if m else None,
                                            "seconds_per_batch": round(sum(m) / len(b), 4) if b else None}
        line = [ln for ln in text.splitlines() if " SUMMARY " in ln]
        if line:
            run = json.loads(line[-1].split(" SUMMARY ", 1)[1])
            result["run"] = {k: run.get(k) for k in ("batches", "skipped_batches", "seconds", "target_version")}
    except OSError:
        pass
    try:
        result["verify"] = verify(job)
    except Exception as e:  # noqa: BLE001
        result["verify"] = {"error": f"{type(e).__name__}: {e}"}
    result["samples"] = samples
    (out / "long_run.json").write_text(json.dumps(result, indent=1))
    if samples:
        plot(samples, str(out / "long_run.png"),
             f"benchmarks/long_run.py --minutes {args.minutes:g}: join + group by, "
             f"{args.customers} customers / {n_orders} orders, trigger {args.interval:g}s")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    return 0 if result.get("verify", {}).get("equal") else 1


if __name__ == "__main__":
    sys.exit(main())
