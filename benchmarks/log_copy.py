"""Benchmark: a model's commit and open as the table's tombstones and files grow (the replayed
Delta log and this machine's copy of it, ``consistent_stream.delta.log``).

    .venv/bin/python benchmarks/log_copy.py [--tombstones 1000 10000 86400] [--files 100] [--commits 50]
                                            [--checkpoint-interval 100]

For each ``--tombstones`` count: a Delta log on local disk (log only: the data files it names are
never read) whose first commits hold ``--files`` live files and that many removes younger than
the table's ``delta.deletedFileRetentionDuration`` (Delta's default, one week): what a
continuous model's target holds after a day at one batch a second, with deletion vectors (a file
or two removed per batch). Then ``--commits`` commits of one add and one remove each, as a
batch's target commit is, each timed with the wait for what it left on the writer's thread (the
version checksum, the local copy of the replay, and every ``--checkpoint-interval`` commits the
table's checkpoint: 100 is the run's default on local disk, 4 on an object store), which the next
commit makes; then the table opened by a new process's replay (from the local copy) and from its
checkpoint.

Prints one JSON line per count (times in ms: commit median, 90th percentile and mean, open from
the copy, open from the checkpoint; the copy's bytes on disk) and appends it to
``benchmarks/results/log_copy.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


def _schema() -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": "k", "type": "long", "nullable": True, "metadata": {}}]})


def _add(i: int) -> dict:
    return {"path": f"part-{i:08d}.parquet", "partitionValues": {}, "size": 1000 + i, "modificationTime": i,
            "dataChange": True, "stats": json.dumps({"numRecords": 10, "minValues": {"k": i}, "maxValues": {"k": i},
                                                      "nullCount": {"k": 0}})}


def measure(root: str, tombstones: int, files: int, commits: int, interval: int) -> dict:
    from consistent_stream.delta.log import OwnedLog, settle
    from consistent_stream import local_cache
    now = int(time.time() * 1000)
    os.makedirs(os.path.join(root, "_delta_log"))
    log = OwnedLog(root, checksums=True)
    log.load()
    meta = {"id": "bench", "format": {"provider": "parquet", "options": {}}, "schemaString": _schema(),
            "partitionColumns": [], "configuration": {"delta.checkpointInterval": str(interval)}, "createdTime": now}
    log.commit([_add(i) for i in range(files)], [], txn=None, info={"operation": "CREATE TABLE"},
               table=[{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, {"metaData": meta}])
    gone = [{"path": f"gone-{i:08d}.parquet", "dataChange": True, "deletionTimestamp": now - i,
             "size": 1000, "partitionValues": {}} for i in range(tombstones)]
    for start in range(0, tombstones, 20_000):   # (commits of at most 20k removes, as a backfill would make)
        log.commit([], gone[start:start + 20_000], txn=None, info={"operation": "DELETE"})
    log.flush()
    seconds = []
    for n in range(commits):
        old = next(iter(log.files))
        t0 = time.perf_counter()
        log.commit([_add(files + tombstones + n)],
                   [{"path": old, "dataChange": True, "deletionTimestamp": int(time.time() * 1000),
                     "size": 1000, "partitionValues": {}}], txn=("bench", n), info={"operation": "WRITE"})
        log.flush()
        seconds.append(time.perf_counter() - t0)
    settle()
    kept = local_cache.Kept("delta-logs", log.path).file
    copy_bytes = sum(p.stat().st_size for p in kept.parent.glob(kept.stem + "*"))
    t0 = time.perf_counter()
    again = OwnedLog(root)
    again.load()
    open_copy = time.perf_counter() - t0
    assert again.from_copy and again.version == log.version and again.files == log.files
    assert set(again.tombstones) == set(log.tombstones)
    t0 = time.perf_counter()
    plain = OwnedLog(root, copy=False)
    plain.load()
    open_checkpoint = time.perf_counter() - t0
    assert plain.version == log.version and set(plain.files) == set(log.files)
    seconds.sort()
    return {"tombstones": tombstones, "files": files, "commits": commits, "checkpoint_interval": interval,
            "commit_median_ms": round(1000 * statistics.median(seconds), 2),
            "commit_p90_ms": round(1000 * seconds[int(0.9 * (len(seconds) - 1))], 2),
            "commit_mean_ms": round(1000 * statistics.mean(seconds), 2),
            "open_from_copy_ms": round(1000 * open_copy, 1),
            "open_from_checkpoint_ms": round(1000 * open_checkpoint, 1),
            "copy_bytes": copy_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tombstones", type=int, nargs="+", default=[1000, 10_000, 86_400])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--commits", type=int, default=50)
    ap.add_argument("--checkpoint-interval", type=int, default=100)
    ap.add_argument("--no-record", action="store_true", help="print only, append nothing to benchmarks/results")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    command = " ".join(["benchmarks/log_copy.py", *sys.argv[1:]])
    for n in args.tombstones:
        with tempfile.TemporaryDirectory(prefix="cs-log-copy-") as tmp:
            os.environ["CONSISTENT_STREAM_CACHE_DIR"] = os.path.join(tmp, "cache")
            row = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "command": command,
                   **measure(os.path.join(tmp, "target"), n, args.files, args.commits, args.checkpoint_interval)}
        print(json.dumps(row), flush=True)
        if not args.no_record:
            with open(REPO / "benchmarks" / "results" / "log_copy.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
