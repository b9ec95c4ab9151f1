"""Benchmark: the bytes a Kafka reader keeps per published transaction for as long as it runs.

    .venv/bin/python benchmarks/kafka_bookkeeping.py [--transactions 300000]

A catch-up over Debezium topics publishes every transaction of the topics' history before its
first cut is asked for, and keeps for each, until then, what the resume point and the cut
planning need: its id in the published set (a record sent again is recognized by it), its
entry in the transaction log (:class:`consistent_stream.sources.landing_index.TxLog`) and its
resume extents (the first and last offsets of its records per partition,
``kafka.extents.Extents``). This puts ``--transactions`` pgbench-like transactions
(PostgreSQL xids, records in the transaction topic and one partition of each of two 3-partition
data topics) through the reader's own structures, as ``TransactionAssembler.publish`` and
``KafkaReader._record`` do, and prints one JSON line: the live bytes per transaction
(``tracemalloc`` after a collection), the bytes per transaction its sealed blocks took in the spill
file (:mod:`consistent_stream.sources.packed`: on local disk, not in memory) and the seconds the
appends took under tracing. No Spark, no Kafka: what it measures is the driver's Python objects
alone, which is what grows with the history in ``kafka_catch_up.py``'s driver peak.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transactions", type=int, default=300_000)
    n = ap.parse_args(argv).transactions
    from consistent_stream.sources.kafka.extents import Extents
    from consistent_stream.sources.kafka.reader import KafkaReader
    from consistent_stream.sources.landing_index import TxInfo, TxLog
    from consistent_stream.sources.packed import SPILL

    parts = [("pgb.transaction", 0)] + [(f"pgb.public.pgbench_{t}", p) for t in ("accounts", "history")
                                        for p in range(3)]
    rnd = random.Random(1)
    offsets = dict.fromkeys(parts, 0)
    counts = {"public.pgbench_accounts": 1, "public.pgbench_history": 1}
    gc.collect()
    tracemalloc.start()
    reader = KafkaReader("127.0.0.1:9092", "pgb.transaction", "transaction")   # connects to nothing
    base, spilled = tracemalloc.get_traced_memory()[0], SPILL.size
    published, txs, extents = reader.clock.assembler.published, TxLog(), Extents()
    t0 = time.perf_counter()
    for i in range(n):
        # xids in start order, published in commit order: a little out of order
        xid = str(1000 + i + rnd.randint(0, 3))
        mine = [parts[0], parts[1 + rnd.randint(0, 2)], parts[4 + rnd.randint(0, 2)]]
        first = {tp: offsets[tp] for tp in mine}
        for tp in mine:
            offsets[tp] += 2 if tp == parts[0] else 1
        last = {tp: offsets[tp] - 1 for tp in mine}
        if xid not in published:
            published.add(xid)
        txs.append(TxInfo(i + 1, xid, 1_700_000_000_000 + i, counts, parts[0][0], 2 * i + 1))
        extents.append(i + 1, xid, 10_000_000 + 100 * i, first, last)
    seconds = time.perf_counter() - t0
    gc.collect()
    extents.settle()
    live = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    spilled = SPILL.size - spilled
    print(json.dumps({"benchmark": "kafka_bookkeeping", "transactions": n, "bytes_per_transaction": round(live / n, 1),
                      "live_mib": round(live / 2 ** 20, 1),
                      "spill_file_bytes_per_transaction": round(spilled / n, 1), "seconds_traced": round(seconds, 2),
                      "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
