"""Benchmark: the 99 TPC-DS queries as written (``models/tpcds/queries``: 103 files, the four
templates with two statements in both), each a consistent_stream
model over TPC-DS data generated here, maintained through refresh rounds and compared with batch
evaluation in Spark and in DuckDB at every version.

    .venv/bin/python benchmarks/tpcds_coverage.py [--sf 0.01] [--rounds 3] [--queries q01,q05] [--sample 20]

TPC-DS is generated with ``tpcgen-cli`` as Delta tables (Change Data Feed on) under
``benchmarks/.data`` (:mod:`consistent_stream_testing.tpcds.generate`; ``--sample N`` keeps one in N of
the fact rows, as the tests do). Each query is compiled (``compile_model``; its plan's operators
counted by how each is maintained, ``incremental`` or ``recompute``) and built (its first run);
then ``--rounds`` refresh rounds (:mod:`consistent_stream_testing.tpcds.refresh`: about 1 % of every
fact table inserted, updated and deleted, ten rows of each dimension the queries read updated)
are applied and every model runs after each. After the build and after every round, the
target's new version is compared with the query's SQL evaluated in batch at the version's
recorded cut by Spark and by DuckDB, by the rule of ``consistent_stream.compare`` (the tests'
rule: floating-point columns within a tolerance, rows tied at a LIMIT's boundary compared by
their ORDER BY values, DuckDB's names of unaliased expressions taken by position).

Prints one JSON line per query as soon as its result is final (its first failure, or its last
round): ``query``, ``compiled``, ``error`` (the
compile error, or the first build, run or comparison failure), ``incremental_ops``,
``recompute_ops``, ``rounds`` (rounds after which the version was still exact), ``exact`` (every
version equal in both engines), ``seconds`` (compile, build, runs and checks), ``rows`` (the last
version's), ``strategies`` (each round's batch strategy); then a summary line. (At SF 0.01 the
103 queries take about an hour on two cores; ``--queries`` runs a part.)
"""
from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import time
from pathlib import Path

import sqlglot
from sqlglot import exp

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
QUERIES = REPO / "models" / "tpcds" / "queries"


def tables_used(sql: str) -> list[str]:
    """The TPC-DS tables ``sql`` reads (table references that are not its CTEs)."""
    ast = sqlglot.parse_one(sql, read="spark")
    ctes = {c.alias_or_name.lower() for c in ast.find_all(exp.CTE)}
    return sorted({t.name.lower() for t in ast.find_all(exp.Table)} - ctes)


def source_dicts(data: Path, sql: str) -> list[dict]:
    """One dbt source ``tpcds.<table>`` per table ``sql`` reads, its relation the bare name."""
    from consistent_stream_testing.tpcds.generate import PRIMARY_KEYS
    return [{"source_name": "tpcds", "name": t, "relation": t,
             "meta": {"format": "delta", "location": str(data / t), "primary_key": list(PRIMARY_KEYS[t])}}
            for t in tables_used(sql)]


def make_job(name: str, sql: str, data: Path, root: Path):
    from consistent_stream.spec import JobSpec
    return JobSpec.from_dbt(project_root=str(root), schema="bench", identifier=name, model_name=name, sql=sql,
                            sources=source_dicts(data, sql),
                            config={"unique_key": None, "location_root": str(root / "targets")},
                            warehouse_dir=str(root / "wh"))


def operators(sql: str, data: Path) -> dict[str, int]:
    """How many of the compiled plan's operators are maintained each way. Raises the compile error."""
    from consistent_stream.plan import compile_model
    from consistent_stream.plan.logical import maintenance, walk
    from consistent_stream.sources import SourceSpec
    from consistent_stream_testing.tpcds.generate import SCHEMAS
    sources = [SourceSpec.from_dbt(d, str(data)) for d in source_dicts(data, sql)]
    compiled = compile_model(sql, sources, {s.key: list(SCHEMAS[s.name].names) for s in sources})
    return dict(collections.Counter(maintenance(n)[0] for n in walk(compiled.root)))


def _types(target, spark_schema, duck_schema) -> str | None:
    """The target's column types are Spark's exactly and DuckDB's in family (numbers, strings,
    dates, timestamps), as the tests require; else what differs."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema
    from consistent_stream.delta.deltars import plain_arrow

    def family(t):
        if pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_floating(t):
            return "number"
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return "string"
        return "timestamp" if pa.types.is_timestamp(t) else "date" if pa.types.is_date(t) else str(t)
    plain = plain_arrow(target.empty_table()).schema
    got = [(f.name, f.dataType) for f in from_arrow_schema(plain).fields]
    want = [(f.name, f.dataType) for f in spark_schema.fields]
    if got != want:
        return f"target types {got} != Spark's {want}"
    if [family(f.type) for f in plain] != [family(f.type) for f in duck_schema]:
        return f"target type families != DuckDB's: {[(f.name, str(f.type)) for f in duck_schema]}"
    return None


def check_latest(spark, job) -> tuple[str | None, int]:
    """The target's latest version against the model's SQL in batch at its recorded cut, in
    Spark and in DuckDB: (None, rows) when equal in both, else (what differs, rows)."""
    from deltalake import DeltaTable
    from consistent_stream.compare import FloatTolerance, TopN, compare_tables, compare_top_n
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.oracle import batch_evaluation, duckdb_result
    from consistent_stream.plan.topn import model_top_n
    from consistent_stream.runtime import BatchMeta
    from consistent_stream.sources import Cut
    from consistent_stream.verify import inexact_comparison
    target = DeltaTableRef(job.target_path)
    commit = target.commit_at(target.latest_version())
    meta = BatchMeta.from_commit(commit)
    if meta is None:
        return f"version {commit.version} was not written by consistent_stream", 0
    cut = Cut(meta.base_cut)
    got = DeltaTable(job.target_path, version=commit.version).to_pyarrow_table()
    evaluated = batch_evaluation(spark, job.sql, job.sources, cut, chain=True, instant=meta.clock,
                                 upstream_instants=meta.upstream_clocks)
    inexact, unit, _ = inexact_comparison(evaluated.frame.schema, evaluated.inexact)
    duck = duckdb_result(job.sql, job.sources, cut, chain=True, arrow=True, instant=meta.clock,
                         upstream_instants=meta.upstream_clocks)
    spark_cols = evaluated.frame.columns
    if duck.column_names != spark_cols and len(duck.column_names) == len(spark_cols):
        duck = duck.rename_columns(spark_cols)   # DuckDB's own names of unaliased expressions
    if got.column_names != spark_cols:
        return f"columns {got.column_names} != Spark's {spark_cols}", got.num_rows
    bad = _types(got.schema, evaluated.frame.schema, duck.schema)
    if bad:
        return bad, got.num_rows
    top = model_top_n(job.sql)
    top = TopN(*top) if top is not None else None
    for engine, expected, tol in (("Spark", evaluated.frame.toArrow(), FloatTolerance(1e-9, 1e-12)),
                                  ("DuckDB", duck, FloatTolerance(1e-9, 1e-6))):
        kw = dict(tolerance=tol, inexact=tuple(inexact), unit=unit)
        result = compare_top_n(got, expected, top, **kw) if top is not None else compare_tables(got, expected, **kw)
        if not result.ok:
            return f"vs {engine}: {result.describe()}", got.num_rows
    return None, got.num_rows


def _session(driver_memory: str, warehouse: Path):
    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON before the session)
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    s = (with_delta(SparkSession.builder, master="local[2]").appName("consistent-stream-tpcds")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.memory", driver_memory)
         .config("spark.sql.warehouse.dir", str(warehouse)).getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def _first_line(e: BaseException, limit: int = 2000) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[:limit] + " ..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=0.01, help="TPC-DS scale factor (default 0.01)")
    ap.add_argument("--sample", type=int, default=None,
                    help="keep one in N of the fact rows (consistent_stream_testing.tpcds.generate's sample)")
    ap.add_argument("--rounds", type=int, default=3, help="refresh rounds after the build (default 3)")
    ap.add_argument("--queries", default=None, help="comma-separated query names, e.g. q01,q05 (default all 103)")
    ap.add_argument("--driver-memory", default="4g",
                    help="spark.driver.memory (Spark broadcasts customer_demographics' 1.9 M rows)")
    ap.add_argument("--seed", type=int, default=0, help="refresh stream seed")
    args = ap.parse_args()

    from consistent_stream.job import run_job
    from consistent_stream_testing.tpcds.generate import generate
    from consistent_stream_testing.tpcds.refresh import refresh_round

    names = args.queries.split(",") if args.queries else sorted(p.stem for p in QUERIES.glob("q*.sql"))
    root = DATA / (f"tpcds_coverage_sf{args.sf:g}" + (f"_sample{args.sample}" if args.sample else ""))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    data = root / "data"
    t0 = time.time()
    counts = generate(args.sf, data, sample=args.sample)
    print(json.dumps({"generated": counts, "seconds": round(time.time() - t0, 1)}), file=sys.stderr, flush=True)
    spark = _session(args.driver_memory, root / "wh")

    recs, jobs, printed = {}, {}, set()

    def report(name: str) -> None:
        """Print the query's line once its result is final (a failure, or the last round)."""
        rec = recs[name]
        rec["exact"] = rec["compiled"] and rec["error"] is None and rec["rounds"] == args.rounds
        rec["seconds"] = round(rec["seconds"], 1)
        print(json.dumps(rec, default=str), flush=True)
        printed.add(name)

    for name in names:
        sql = (QUERIES / f"{name}.sql").read_text()
        rec = recs[name] = {"query": name, "compiled": False, "error": None, "incremental_ops": 0,
                            "recompute_ops": 0, "rounds": 0, "exact": False, "seconds": 0.0, "rows": None,
                            "strategies": []}
        t = time.time()
        try:
            ops = operators(sql, data)
            rec.update(compiled=True, incremental_ops=ops.get("incremental", 0), recompute_ops=ops.get("recompute", 0))
        except Exception as e:  # noqa: BLE001 (a compile error is the query's result)
            rec["error"] = f"compile: {_first_line(e)}"
        if rec["compiled"]:
            try:
                job = make_job(name, sql, data, root)
                run_job(spark, job, full_refresh=True)
                bad, rec["rows"] = check_latest(spark, job)
                if bad:
                    rec["error"] = f"build: {bad}"
                else:
                    jobs[name] = job
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"build: {_first_line(e)}"
        rec["seconds"] += time.time() - t
        print(json.dumps({"built": name, "ok": name in jobs, "seconds": round(rec["seconds"], 1)}),
              file=sys.stderr, flush=True)
        if name not in jobs:
            report(name)
    for r in range(1, args.rounds + 1):
        t = time.time()
        refresh_round(data, r, seed=args.seed)
        print(json.dumps({"round": r, "seconds": round(time.time() - t, 1)}), file=sys.stderr, flush=True)
        for name, job in list(jobs.items()):
            rec, t = recs[name], time.time()
            try:
                summary = run_job(spark, job)
                rec["strategies"].append(summary.get("strategies"))
                bad, rec["rows"] = check_latest(spark, job)
                if bad:
                    rec["error"] = f"round {r}: {bad}"
                    del jobs[name]
                else:
                    rec["rounds"] = r
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"round {r}: {_first_line(e)}"
                del jobs[name]
            rec["seconds"] += time.time() - t
            if name not in jobs or r == args.rounds:
                report(name)
        spark.catalog.clearCache()
    for name in names:
        if name not in printed:   # --rounds 0
            report(name)
    out = list(recs.values())
    print(json.dumps({"summary": {
        "sf": args.sf, "sample": args.sample, "rounds": args.rounds, "queries": len(out),
        "compiled": sum(r["compiled"] for r in out), "exact": sum(r["exact"] for r in out),
        "with_recompute": [r["query"] for r in out if r["recompute_ops"]],
        "not_exact": {r["query"]: (r["error"] or "")[:300] for r in out if not r["exact"]},
        "not_incremental": [r["query"] for r in out if any(s != ["incremental"] for s in r["strategies"])],
        "seconds": round(sum(r["seconds"] for r in out), 1)}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
