"""Benchmark: how far a SUM over doubles maintained under retractions drifts from the exact sum.

    .venv/bin/python benchmarks/float_drift.py [--keys 10000] [--groups 10] [--batches 200]
                                               [--updates 10000] [--every 20]

A source of ``--keys`` rows in ``--groups`` groups holds large values (-1e13 .. 1e13, with
fractions) and, per group, five small ones (0 .. 1); every batch replaces ``--updates`` of
the large values by others (an update: a retraction and an insert), so the groups' sums move
while most of what was ever added is retracted again; a last batch deletes every large
value, leaving the small ones, whose sum is all that history must not disturb. The model
``select g, sum(x), avg(x), count(*) from src.t group by g`` runs once per batch
(``run_job``, Spark's defaults, no tuning). Every ``--every`` batches the benchmark compares
the target with the exact sums (``math.fsum`` over the source's current values, kept beside)
and with Spark's batch SUM, and prints a JSON line:

* ``engine_max_rel``: the largest relative difference of the target's sums from the exact
  ones (the compensated accumulators, consistent_stream.fsum);
* ``plain_max_rel``: the same for plain float64 accumulation of the same per-batch changes
  in the same order (the accumulator before compensation), computed beside as the foil;
* ``batch_max_rel``: Spark's own batch SUM over the source against the exact sums (the
  error any batch engine has: the scale a comparison must tolerate);
* ``verify_ok``: the target equals batch evaluation by the project's comparison rule.

The last line is a summary. Defaults: 2,000,000 updates.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
DATA = REPO / "benchmarks" / ".data" / "float_drift"
SQL = "select g, sum(x) as s, avg(x) as a, count(*) as n from src.t group by g"


def _rel(got: float, exact: float) -> float:
    return abs(got - exact) / max(abs(exact), 1e-300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    from deltalake import DeltaTable, write_deltalake
    from refresh_vs_full import _session
    from consistent_stream.job import run_job
    from consistent_stream.verify import verify_target
    from helpers import delta_pandas, job_for

    shutil.rmtree(DATA, ignore_errors=True)
    spark = _session(None, DATA / "warehouse")
    rnd = random.Random(args.seed)
    values = {k: rnd.uniform(-1e13, 1e13) for k in range(args.keys)}
    values.update({args.keys + i: rnd.uniform(0, 1) for i in range(5 * args.groups)})   # the small ones

    def group(k: int) -> str:
        return f"g{k % args.groups}"

    def table(keys) -> pa.Table:
        keys = list(keys)
        return pa.table({"k": pa.array(keys, pa.int64()), "g": [group(k) for k in keys],
                         "x": pa.array([values[k] for k in keys], pa.float64())})

    src = str(DATA / "src" / "t")
    write_deltalake(src, table(values), configuration={"delta.enableChangeDataFeed": "true"})
    job = job_for("drift", SQL, [{"source_name": "src", "name": "t", "relation": "src.t",
                                  "meta": {"location": src, "primary_key": ["k"]}}], ["g"], DATA)
    run_job(spark, job)
    plain = {}
    for k, v in values.items():   # the rebuild's sums, then plain accumulation of each batch's change
        plain[group(k)] = plain.get(group(k), 0.0) + v
    worst = {"engine_max_rel": 0.0, "plain_max_rel": 0.0, "batch_max_rel": 0.0}
    updates, t0 = 0, time.time()
    big = list(range(args.keys))
    for b in range(1, args.batches + 2):
        dt = DeltaTable(src)
        delta: dict[str, float] = {}
        if b > args.batches:   # the last batch: every large value deleted
            for k in big:
                delta[group(k)] = delta.get(group(k), 0.0) - values.pop(k)
            dt.delete(f"k < {args.keys}")
        else:
            changed = rnd.sample(big, args.updates)
            for k in changed:
                new = rnd.uniform(-1e13, 1e13)
                delta[group(k)] = delta.get(group(k), 0.0) + (new - values[k])
                values[k] = new
            (dt.merge(table(changed), "t.k = s.k", source_alias="s", target_alias="t")
             .when_matched_update_all().execute())
            updates += len(changed)
        for g, d in delta.items():
            plain[g] += d
        run_job(spark, job)
        if b % args.every and b <= args.batches:
            continue
        exact: dict[str, list] = {}
        for k, v in values.items():
            exact.setdefault(group(k), []).append(v)
        exact_sum = {g: math.fsum(v) for g, v in exact.items()}
        target = {r["g"]: r["s"] for r in delta_pandas(job.target_path).to_dict("records")}
        batch = {r["g"]: r["s"] for r in spark.read.format("delta").load(src).groupBy("g")
                 .agg({"x": "sum"}).withColumnRenamed("sum(x)", "s").collect()}
        rec = {"batch": b, "updates": updates, "large_values_deleted": b > args.batches,
               "seconds": round(time.time() - t0, 1),
               "engine_max_rel": max(_rel(target[g], e) for g, e in exact_sum.items()),
               "plain_max_rel": max(_rel(plain[g], e) for g, e in exact_sum.items()),
               "batch_max_rel": max(_rel(batch[g], e) for g, e in exact_sum.items()),
               "verify_ok": verify_target(spark, job.target_path).ok}
        for key in worst:
            worst[key] = max(worst[key], rec[key])
        print(json.dumps(rec), flush=True)
    print(json.dumps({"summary": True, "keys": args.keys, "groups": args.groups, "batches": args.batches,
                      "updates": updates, **worst}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
