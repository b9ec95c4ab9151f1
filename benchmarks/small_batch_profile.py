"""Profile: where a small incremental run's time goes, end to end (``run_job`` from open to
report, as ``benchmarks/refresh_vs_full.py`` times it), beside DuckDB's full recompute of the
same SQL over the same Parquet (the physical anchor).

    .venv/bin/python benchmarks/small_batch_profile.py [--sf 1] [--batches 5] [--models ...] [--top 30]
                                                       [--keep-data] [--no-profile] [--pstats DIR]

TPC-H at ``--sf`` is generated once (kept under ``benchmarks/.data/profile`` with
``--keep-data``, the files only older versions need deleted at each start), every example
model over sources is built, then ``--batches`` small refresh rounds (140 orders each: at
most 2,000 changed source rows per model) each followed by an incremental run of every model
under cProfile, in one untuned session. Prints per model one
JSON line: the median run seconds, the median of the batch's own seconds and of its phases,
the Spark jobs per batch, DuckDB's recompute of the model's SQL over the sources' snapshots
at the same cut (median of ``--batches``, read from the Delta tables' Parquet files), and the
functions with the most cumulative time over all runs (``--top``), as ``[function,
cumulative s per run, calls per run]``.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
DATA = REPO / "benchmarks" / ".data" / "profile"
SMALL_ROUND_ORDERS = 140


def _duckdb_recompute_s(job, cut: dict) -> float:
    """DuckDB's recompute of the model's SQL over the sources at ``cut`` (their Parquet
    files, read by DuckDB's own reader through delta-rs' file list)."""
    import duckdb
    from deltalake import DeltaTable
    from consistent_stream.oracle import rewrite_relations
    t0 = time.time()
    con = duckdb.connect()
    mapping = {}
    for s in job.sources:
        dt = DeltaTable(s.location, version=cut[s.key])
        files = dt.file_uris()
        name = f"src_{s.name}"
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({files!r})")
        mapping[s.relation_parts] = name
    con.sql(rewrite_relations(job.sql, mapping, dialect="duckdb")).to_arrow_table()
    con.close()
    return time.time() - t0


def _vacuum(data: Path) -> None:
    """Delete the files of kept TPC-H tables that only versions before the latest need (each
    run's refresh rounds rewrite files of orders, lineitem and customer, and kept data would
    grow by about a scale factor's size a run); every model is built again from the latest
    versions, so none reads an older one."""
    from deltalake import DeltaTable
    for table in sorted(p for p in data.iterdir() if (p / "_delta_log").is_dir()):
        DeltaTable(str(table)).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
        shutil.rmtree(table / "_change_data", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--keep-data", action="store_true")
    ap.add_argument("--pstats", type=Path, default=None,
                    help="also write each model's profile here (<model>.pstats, for pstats' callers/callees)")
    ap.add_argument("--no-profile", action="store_true",
                    help="time the runs without cProfile (which adds to every call): the run as users meet it")
    args = ap.parse_args()
    from refresh_vs_full import _session, _settle
    from consistent_stream.job import run_job
    from consistent_stream.runtime import BatchMeta
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream_testing.tpch.generate import generate
    from consistent_stream_testing.tpch.refresh import refresh_round
    from consistent_stream_testing.apart import in_child
    from helpers import EXAMPLE_MODELS, job_for, render_model, tpch_sources

    root = DATA / f"sf{args.sf:g}"
    if not args.keep_data or not (root / "data").exists():
        shutil.rmtree(root, ignore_errors=True)
        in_child(generate, args.sf, root / "data")
    else:
        _vacuum(root / "data")
    spark = _session(None, root / "warehouse")
    models = args.models or sorted(p.stem for p in EXAMPLE_MODELS.glob("*.sql")
                                   if not render_model(p)[3] and render_model(p)[1].get("materialized") != "view")
    jobs = []
    for name in models:
        sql, config, used, _ = render_model(EXAMPLE_MODELS / f"{name}.sql")
        job = job_for(name, sql, tpch_sources(str(root / "data"), used), config["unique_key"], root, schema="bench")
        run_job(spark, job, full_refresh=True)
        jobs.append(job)
    stats = {job.model: [] for job in jobs}
    profiles = {job.model: cProfile.Profile() for job in jobs}
    duck = {job.model: [] for job in jobs}
    for i in range(args.batches):
        in_child(refresh_round, root / "data", 200 + i, size=SMALL_ROUND_ORDERS)
        for job in jobs:
            _settle()
            p = profiles[job.model]
            t0 = time.perf_counter()
            if not args.no_profile:
                p.enable()
            s = run_job(spark, job)
            if not args.no_profile:
                p.disable()
            stats[job.model].append((time.perf_counter() - t0, s))
            meta = BatchMeta.from_commit(DeltaTableRef(job.target_path).latest_commit())
            duck[job.model].append(_duckdb_recompute_s(job, meta.cut))
    for job in jobs:
        runs = stats[job.model]
        batch = [r[1]["metrics"][0] for r in runs if r[1]["metrics"]]
        phases = {}
        for b in batch:
            for k, v in (b.get("phases") or {}).items():
                phases.setdefault(k, []).append(v)
        top = [] if args.no_profile else \
            sorted(pstats.Stats(profiles[job.model]).stats.items(), key=lambda kv: -kv[1][3])[:args.top]
        n = len(runs)
        if args.pstats and not args.no_profile:
            args.pstats.mkdir(parents=True, exist_ok=True)
            profiles[job.model].dump_stats(str(args.pstats / f"{job.model}.pstats"))
        print(json.dumps({
            "sf": args.sf, "model": job.model, "runs": n, "profiled": not args.no_profile,
            "run_s_median": round(statistics.median(r[0] for r in runs), 3),
            "batch_s_median": round(statistics.median(b["seconds"] for b in batch), 3) if batch else None,
            "phases_median": {k: round(statistics.median(v), 3) for k, v in phases.items()},
            "spark_jobs_per_batch": [b.get("spark_jobs") for b in batch],
            "changes_read": [r[1]["changes_read"] for r in runs],
            "duckdb_recompute_s_median": round(statistics.median(duck[job.model]), 3),
            "top": [[f"{Path(f).name}:{line}({fn})", round(v[3] / n, 4), round(v[1] / n, 1)]
                    for (f, line, fn), v in top],
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
