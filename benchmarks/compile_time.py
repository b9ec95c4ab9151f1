"""Benchmark: what a model's first compile costs, against Spark's own analysis of the same SQL.

    .venv/bin/python benchmarks/compile_time.py [--queries q01,q77] [--repeat 1]

A model's first ``dbt run`` (and every run after its SQL or its sources' columns change)
compiles it before any batch: ``compile_model`` (the SQL parsed by sqlglot, lowered to the
logical plan, its delta rules chosen) and ``type_plan`` (the plan's dry run through Spark's
analyzer: every node's change and every arrangement typed, no job run). The alternative a
dbt ``table`` pays is Spark's analysis of the model's SQL alone. This benchmark times the
three for the 99 TPC-DS queries as written (``models/tpcds/queries``, 103 files) over empty
views of the TPC-DS schemas (no data is generated: neither step reads rows), in one warm local
session (a first query warms the JVM and is not reported).

Prints one JSON line per query: ``query``, ``nodes`` (the plan's operators), ``compile_s``
(``compile_model``), ``typing_s`` (``type_plan``), ``analysis_s`` (``spark.sql(text).schema``),
``ratio`` ((compile + typing) / analysis), or ``error``; then a summary line with the totals,
the median ratio and the slowest five queries by compile + typing. Each time is the least of
``--repeat`` runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from tpcds_coverage import QUERIES, source_dicts, tables_used


def _session():
    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON before the session)
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    s = (with_delta(SparkSession.builder, master="local[2]").appName("consistent-stream-compile-time")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def _least(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(spark, name: str, repeat: int) -> dict:
    """One query's compile, typing and Spark analysis times (seconds)."""
    from pathlib import Path
    from pyspark.sql.pandas.types import from_arrow_schema
    from consistent_stream.exec.evaluator import type_plan
    from consistent_stream.plan import compile_model
    from consistent_stream.plan.logical import walk
    from consistent_stream.sources import SourceSpec
    from consistent_stream_testing.tpcds.generate import SCHEMAS
    sql = (QUERIES / f"{name}.sql").read_text()
    sources = [SourceSpec.from_dbt(d, "/nonexistent") for d in source_dicts(Path("/nonexistent"), sql)]
    schemas = {s.key: from_arrow_schema(SCHEMAS[s.name]) for s in sources}
    for t in tables_used(sql):
        spark.createDataFrame([], from_arrow_schema(SCHEMAS[t])).createOrReplaceTempView(t)
    rec: dict = {"query": name}
    try:
        rec["analysis_s"], _ = _least(lambda: spark.sql(sql).schema, repeat)
        rec["compile_s"], compiled = _least(
            lambda: compile_model(sql, sources, {k: v.fieldNames() for k, v in schemas.items()}), repeat)
        rec["typing_s"], _ = _least(lambda: type_plan(spark, compiled.root, schemas), repeat)
        rec["nodes"] = sum(1 for _ in walk(compiled.root))
    except Exception as e:  # noqa: BLE001 (reported per query)
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:500]}"
        return rec
    for k in ("analysis_s", "compile_s", "typing_s"):
        rec[k] = round(rec[k], 3)
    rec["ratio"] = round((rec["compile_s"] + rec["typing_s"]) / max(rec["analysis_s"], 1e-6), 1)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", default=None, help="comma-separated query names, e.g. q01,q77 (default all 103)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per step; the least is reported (default 1)")
    args = ap.parse_args()
    names = args.queries.split(",") if args.queries else sorted(p.stem for p in QUERIES.glob("q*.sql"))
    spark = _session()
    measure(spark, "q03", 1)   # the JVM's warm-up
    recs = []
    for name in names:
        rec = measure(spark, name, args.repeat)
        print(json.dumps(rec), flush=True)
        recs.append(rec)
    ok = [r for r in recs if "error" not in r]
    total = {k: round(sum(r[k] for r in ok), 1) for k in ("compile_s", "typing_s", "analysis_s")}
    slowest = sorted(ok, key=lambda r: r["compile_s"] + r["typing_s"], reverse=True)[:5]
    print(json.dumps({"summary": True, "queries": len(recs), "errors": len(recs) - len(ok), **total,
                      "median_ratio": statistics.median(r["ratio"] for r in ok) if ok else None,
                      "slowest": {r["query"]: round(r["compile_s"] + r["typing_s"], 2) for r in slowest}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
