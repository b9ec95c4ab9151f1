"""Benchmark: the driver's keyed read of an arrangement, DuckDB's scan against Arrow's and against
files read whole and filtered in memory.

    .venv/bin/python benchmarks/keyed_read.py [--rows 34000000] [--keys 15000] [--file-rows 1000000]

An arrangement shaped like q3's lineitem arrangement at TPC-H SF 10 (``--rows`` rows of an
int64 key with about two rows per key value, two int64 payload columns and ``__weight``;
sorted by key in files of 1,000,000 rows, as a rebuild writes them) is read at ``--keys``
random key values (every file and row group holds some: the case no min/max statistics can
prune), at one key, and at a contiguous key range of the same size, by

* ``arrow``: the state store's ``arrow_scan``, Arrow's dataset scanner with an ``is_in``
  filter (the keyed read before DuckDB's, and its fallback; it decodes every column of every
  row group, then filters);
* ``duckdb``: ``duck.KeyedScan`` (the key filter evaluated first, the payload
  decoded where rows match);
* ``whole``: the state store's ``fetched_scan`` with nothing held: the files read whole with
  pyarrow, held, and filtered in memory (a keyed read on local disk of at most
  ``WHOLE_READ_ROWS`` rows not held yet);
* ``held``: the same once the files are held (the next batch's read of them).

At a small arrangement's size (``--rows 150000 --file-rows 150000 --keys 300``: customer_order_totals'
customers at SF 1) the statement's own cost decides; at the default size the decoding does.

Prints one JSON line: the best of 3 seconds and the rows returned, per reader and key set.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from consistent_stream.delta.files import HELD
    from consistent_stream.duck import KeyedScan
    from consistent_stream.state.arrangement import arrow_scan, fetched_scan

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=34_000_000)
    ap.add_argument("--keys", type=int, default=15_000)
    ap.add_argument("--file-rows", type=int, default=1_000_000)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    n = args.rows
    values = np.sort(rng.choice(np.arange(1, 2 * n, dtype=np.int64), n // 2 + 1, replace=False))
    key = np.sort(np.concatenate([values, values]))[:n]
    table = pa.table({"l_orderkey": key, "l_extendedprice": rng.integers(1, 10 ** 7, n),
                      "l_discount": rng.integers(0, 10, n), "__weight": np.ones(n, np.int64)})
    d = tempfile.mkdtemp(prefix="keyed_read_")
    try:
        paths = []
        for i in range(0, n, args.file_rows):
            p = os.path.join(d, f"part-{i // args.file_rows:05d}.parquet")
            pq.write_table(table.slice(i, args.file_rows), p)
            paths.append(p)
        schema = table.schema
        start = int(rng.integers(0, len(values) - args.keys))
        key_sets = {
            "random": pa.array(np.sort(rng.choice(values, args.keys, replace=False))),
            "one": pa.array(values[len(values) // 2: len(values) // 2 + 1]),
            "range": pa.array(values[start:start + args.keys]),
        }
        scan = KeyedScan()
        sizes = [os.path.getsize(p) for p in paths]

        def whole(ks, keep: bool) -> int:
            if not keep:
                HELD.drop(paths)
            return fetched_scan(paths, sizes, schema, {"l_orderkey": ks}).num_rows
        readers = {
            "arrow": lambda ks: arrow_scan(paths, schema, {"l_orderkey": ks}).num_rows,
            "duckdb": lambda ks: scan.scan(paths, schema, {"l_orderkey": ks}, None).num_rows,
            "whole": lambda ks: whole(ks, keep=False),
            "held": lambda ks: whole(ks, keep=True),
        }
        out = {"rows": n, "files": len(paths), "keys": args.keys}
        for kname, ks in key_sets.items():
            for rname, read in readers.items():
                times, got = [], None
                for _ in range(3):
                    t0 = time.perf_counter()
                    got = read(ks)
                    times.append(time.perf_counter() - t0)
                out[f"{kname}_{rname}"] = {"s": round(min(times), 3), "rows": got}
            out[f"{kname}_ratio_arrow_to_duckdb"] = round(out[f"{kname}_arrow"]["s"] /
                                                          max(out[f"{kname}_duckdb"]["s"], 1e-6), 1)
        print(json.dumps(out), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
