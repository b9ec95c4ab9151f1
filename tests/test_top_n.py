"""A top-N over a whole input reads only a prefix of its state: the rows before a bound past
which enough live rows lie (``operators.window.TopPrefix``), found from the state files' key
ranges. Checked on an input many state files long, with retractions inside the top (the next
row is pulled in), changes below the boundary (nothing to read but the prefix), ties at the
boundary, NULLs and a decimal sort key (whose Delta statistics delta-rs writes as doubles)."""
from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa
import pytest

from scenario import Scenario

ROWS = 400
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("amt", pa.decimal128(15, 2)), ("g", pa.string())])


def _rows(ids, rnd: random.Random) -> pa.Table:
    v = [None if rnd.random() < 0.05 else rnd.randint(0, 200) for _ in ids]   # ties: 400 rows, 201 values
    amt = [Decimal(rnd.randint(-50000, 99999999)).scaleb(-2) for _ in ids]
    return pa.table({"id": list(ids), "v": v, "amt": amt, "g": [rnd.choice("pq") for _ in ids]}, schema=SCHEMA)


@pytest.mark.parametrize("name, sql", [
    ("row_number_desc", "select id, v from src.t order by v desc, id limit 5"),
    ("rank_with_ties", "select id, v, r from (select id, v, rank() over (order by v) as r from src.t) x where r <= 4"),
    ("decimal_key_offset", "select id, amt from src.t order by amt desc, id limit 3 offset 2"),
])
def test_a_top_n_reads_a_prefix_of_its_state_and_stays_exact(spark, tmp_path, name, sql):
    rnd = random.Random(name)
    sc = Scenario(spark, tmp_path / "data", {"t": _rows(range(ROWS), rnd)}, {"t": ["id"]})
    job = sc.job(sql, None, name=name)
    job.state_file_rows = 25          # 16 base files, each a disjoint range of the sort key
    job.driver_rebuild_rows = 0       # the state's base files written by the executors, range-partitioned
    sc.run(job, full_refresh=True)
    next_id = ROWS
    reads = []
    for step in range(5):
        if step % 2 == 0:   # retract rows inside the top: the next rows come in
            sc.delete("t", "v >= 190 OR amt >= 900000")
            sc.update("t", {"v": "v - 150"}, "v BETWEEN 180 AND 189")
        sc.insert("t", _rows(range(next_id, next_id + 3), rnd))   # mostly below the boundary
        next_id += 3
        sc.update("t", {"v": "NULL"}, f"id = {rnd.randrange(next_id)}")
        summary = sc.run(job)
        reads.append(summary["metrics"][0]["state_rows_read"])
    assert min(reads) < ROWS // 2, reads   # a prefix, not the whole input
