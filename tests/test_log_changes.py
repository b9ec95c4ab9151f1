"""The changelog derived from a Delta table's log (``consistent_stream.delta.log_changes``)
against the Change Data Feed and against the difference of the table's versions.

Two tables take the same random commits, one with the Change Data Feed on and one without:
INSERT, UPDATE, DELETE and MERGE by delta-spark (merge-on-read with deletion vectors, or
copy-on-write without), OPTIMIZE, an overwrite, and (without deletion vectors, which delta-rs
does not write) delta-rs' append, delete and update. After every commit, and over random ranges
of commits at the end, the change derived from the log of each table (its ``cdc`` files
ignored) equals version b less version a as multisets; on the table with the feed, so do the
feed as delta-spark reads it and the log's change with the feed's files read where a commit has
them (as a run reads it). (delta-rs 1.6.6's ``load_cdf`` fails this on a whole-file remove of a
file with a deletion vector: it reports the vector's rows as deleted again and misses others;
a run reads such a range from the log.)
"""
from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from consistent_stream.delta import DeltaTableRef
from consistent_stream.delta.files import ParquetRows
from consistent_stream.delta.log_changes import WEIGHT, _same_chunks, changelog

SEEDS = [int(s) for s in os.environ.get("CS_PROPERTY_SEED", "7").split(",")]
STEPS = 9


def _rows(t: pa.Table) -> Counter:
    return Counter(zip(*[t.column(c).to_pylist() for c in ("k", "g", "v")]))


def _weighted(t: pa.Table) -> Counter:
    out: Counter = Counter()
    for k, g, v, w in zip(*[t.column(c).to_pylist() for c in ("k", "g", "v", WEIGHT)]):
        out[(k, g, v)] += w
    return Counter({r: w for r, w in out.items() if w})


def _difference(a: Counter, b: Counter) -> Counter:
    out = Counter(b)
    out.subtract(a)
    return Counter({r: w for r, w in out.items() if w})


def _derived(ref: DeltaTableRef, start: int, end: int, *, use_cdc: bool = False) -> Counter:
    """The log's change of ``(start, end]``: each commit's ``cdc`` files ignored (derived from
    its added and removed files), or read where it has them (``use_cdc``, as a run reads)."""
    commits = ref.log_commits(start, end)
    found = changelog(ref.reader.path, commits, start, end, ref.plain_arrow_schema(), [],
                      deletion_vectors=ref.reader.deletion_vectors, use_cdc=use_cdc)
    return _weighted(found.data)


def _feed(spark, path: str, start: int, end: int) -> Counter:
    """The Change Data Feed of ``(start, end]`` as delta-spark, the writer, reads it."""
    rows = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start + 1)
            .option("endingVersion", end).load(path).select("k", "g", "v", "_change_type").collect())
    out: Counter = Counter()
    for k, g, v, kind in rows:
        out[(k, g, v)] += 1 if kind in ("insert", "update_postimage") else -1
    return Counter({r: w for r, w in out.items() if w})


class Pair:
    """The two tables (``feed``: the Change Data Feed on; ``plain``: off) and their commits."""

    def __init__(self, spark, root, deletion_vectors: bool):
        self.spark, self.dv = spark, deletion_vectors
        self.paths = {name: str(root / name) for name in ("feed", "plain")}
        for name, path in self.paths.items():
            props = [f"'delta.enableDeletionVectors' = '{str(deletion_vectors).lower()}'"]
            if name == "feed":
                props.append("'delta.enableChangeDataFeed' = 'true'")
            spark.sql(f"CREATE TABLE delta.`{path}` (k BIGINT, g STRING, v BIGINT) USING delta "
                      f"TBLPROPERTIES ({', '.join(props)})")
            spark.sql(f"INSERT INTO delta.`{path}` SELECT id, concat('g', id % 3), id FROM range(0, 30)")

    def sql(self, statement: str) -> None:
        for path in self.paths.values():
            self.spark.sql(statement.replace("{t}", f"delta.`{path}`"))

    def step(self, rng: random.Random) -> str:
        """One random commit on both tables; returns what it was."""
        choices = ["insert", "update", "delete", "merge", "optimize", "overwrite_some"]
        if not self.dv:
            choices += ["rs_append", "rs_delete", "rs_update"]
        op = rng.choice(choices)
        a, b = sorted(rng.sample(range(0, 60), 2))
        if op == "insert":
            n = rng.randint(1, 5)
            self.sql(f"INSERT INTO {{t}} SELECT id, concat('g', id % 4), id * 2 FROM range({a}, {a + n})")
        elif op == "update":
            self.sql(f"UPDATE {{t}} SET v = v + 1, g = concat(g, 'u') WHERE k BETWEEN {a} AND {b} AND k % 2 = 0")
        elif op == "delete":
            self.sql(f"DELETE FROM {{t}} WHERE k BETWEEN {a} AND {min(b, a + 4)}")
        elif op == "merge":
            self.sql(f"MERGE INTO {{t}} AS t USING (SELECT id AS k, id + 100 AS v FROM range({a}, {a + 6})) AS s "
                     f"ON t.k = s.k WHEN MATCHED AND t.k % 3 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET v = s.v "
                     f"WHEN NOT MATCHED THEN INSERT (k, g, v) VALUES (s.k, 'new', s.v)")
        elif op == "optimize":
            self.sql("OPTIMIZE {t}")
        elif op == "overwrite_some":
            self.sql(f"INSERT OVERWRITE {{t}} SELECT k, g, v FROM {{t}} VERSION AS OF 1 WHERE k >= {a}")
        elif op == "rs_append":
            for path in self.paths.values():
                write_deltalake(path, pa.table({"k": pa.array([a, a], pa.int64()), "g": ["rs", "rs"],
                                                "v": pa.array([b, b], pa.int64())}), mode="append")
        elif op == "rs_delete":
            for path in self.paths.values():
                DeltaTable(path).delete(f"k >= {a} AND k < {a + 3}")
        elif op == "rs_update":
            for path in self.paths.values():
                DeltaTable(path).update(updates={"v": "v * 10"}, predicate=f"k >= {a} AND k < {b}")
        return op


@pytest.mark.parametrize("deletion_vectors", [True, False], ids=["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_change_derived_from_the_log_equals_the_feed_and_the_versions_difference(
        spark, tmp_path, deletion_vectors, seed):
    rng = random.Random(seed)
    pair = Pair(spark, tmp_path / f"s{seed}", deletion_vectors)
    refs = {name: DeltaTableRef(path) for name, path in pair.paths.items()}
    snapshots = {name: {} for name in refs}

    def snapshot(name: str, version: int) -> Counter:
        if version not in snapshots[name]:
            snapshots[name][version] = _rows(refs[name].read_snapshot_arrow(version))
        return snapshots[name][version]

    for i in range(STEPS):
        op = pair.step(rng)
        for name, ref in refs.items():
            v = ref.latest_version()
            what = f"seed {seed}, step {i} ({op}), table {name}, version {v}"
            expected = _difference(snapshot(name, v - 1), snapshot(name, v))
            assert _derived(ref, v - 1, v) == expected, what
            if name == "feed":
                assert _feed(spark, pair.paths[name], v - 1, v) == expected, what
                assert _derived(ref, v - 1, v, use_cdc=True) == expected, what
    for _ in range(4):
        for name, ref in refs.items():
            latest = ref.latest_version()
            a, b = sorted(rng.sample(range(0, latest + 1), 2))
            expected = _difference(snapshot(name, a), snapshot(name, b))
            assert _derived(ref, a, b) == expected, f"seed {seed}, table {name}, versions {a + 1}..{b}"
            if name == "feed":
                assert _derived(ref, a, b, use_cdc=True) == expected, f"seed {seed}, feed, versions {a + 1}..{b}"


def test_a_deletion_vector_change_reads_only_the_rows_it_touches(tmp_path):
    """A file whose deletion vector changed (removed with the old vector, added with the new):
    the change is the rows the vectors disagree on, read by position from a local file (DuckDB)
    and from the row groups that hold them from bytes (an object store's file, pyarrow)."""
    @dataclass(frozen=True)
    class C:
        version: int
        timestamp_ms: int
        actions: tuple

    data = pa.table({"k": pa.array(range(20), pa.int64()), "g": [f"g{i % 3}" for i in range(20)],
                     "v": pa.array(range(100, 120), pa.int64())})
    pq.write_table(data, tmp_path / "f.parquet", row_group_size=4)
    dv = {"old": {"storageType": "i", "pathOrInlineDv": "a", "offset": None},
          "new": {"storageType": "i", "pathOrInlineDv": "b", "offset": None}}
    old, new = np.ones(20, bool), np.ones(20, bool)
    old[[1, 9]] = False
    new[[1, 9, 13, 14]] = False
    commit = C(2, 0, ({"remove": {"path": "f.parquet", "dataChange": True, "deletionVector": dv["old"]}},
                      {"add": {"path": "f.parquet", "dataChange": True, "deletionVector": dv["new"]}}))
    found = changelog(str(tmp_path), [commit], 1, 2, data.schema, [],
                      deletion_vectors=lambda v: {"f.parquet": old if v == 1 else new})
    assert _weighted(found.data) == Counter({(13, "g1", 113): -1, (14, "g2", 114): -1})
    assert (found.rows_read, found.rows_decoded) == (20, 2)
    raw = (tmp_path / "f.parquet").read_bytes()
    remote = ParquetRows(pq.ParquetFile(pa.BufferReader(raw)), buffer=raw)
    at = np.array([1, 13, 14, 18])     # in row groups 0, 3 and 4 of five
    types = {"k": pa.int64(), "g": pa.string()}
    for f in (remote, ParquetRows(pq.ParquetFile(tmp_path / "f.parquet"), local=str(tmp_path / "f.parquet"))):
        assert f.take(["k", "g"], at, types).to_pydict() == {"k": [1, 13, 14, 18], "g": ["g1", "g1", "g2", "g0"]}


def test_a_rewrite_is_compared_row_by_row_and_stays_exact_when_rows_move(tmp_path):
    """A copy-on-write rewrite (a file removed, one of as many rows added by the same commit):
    the rows equal at the same position cancel, NULL against a value is a change, and rows
    written in another order give the same change (consolidated)."""
    @dataclass(frozen=True)
    class C:
        version: int
        timestamp_ms: int
        actions: tuple

    old = pa.table({"k": pa.array(range(10), pa.int64()), "g": ["a"] * 10, "v": pa.array([None] + list(range(1, 10)),
                                                                                       pa.int64())})
    new = old.set_column(2, "v", pa.array([0] + list(range(1, 10)), pa.int64()))      # row 0: NULL -> 0
    moved = new.take(pa.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0]))
    for name, data in (("old", old), ("new", new), ("moved", moved)):
        pq.write_table(data, tmp_path / f"{name}.parquet")
    for added in ("new", "moved"):
        commit = C(2, 0, ({"remove": {"path": "old.parquet", "dataChange": True}},
                          {"add": {"path": f"{added}.parquet", "dataChange": True,
                                   "stats": json.dumps({"numRecords": 10})}}))
        found = changelog(str(tmp_path), [commit], 1, 2, old.schema, [])
        assert _weighted(found.data) == Counter({(0, "a", None): -1, (0, "a", 0): 1}), added
        assert found.rows_read == 20 and found.files_read == 2
    # a rewrite that adds a column (w, NULL in the old file): the pair's files differ in columns
    widened = new.append_column("w", pa.array(range(10), pa.int64()))
    pq.write_table(widened, tmp_path / "widened.parquet")
    commit = C(2, 0, ({"remove": {"path": "old.parquet", "dataChange": True}},
                      {"add": {"path": "widened.parquet", "dataChange": True,
                               "stats": json.dumps({"numRecords": 10})}}))
    found = changelog(str(tmp_path), [commit], 1, 2, widened.schema, [])
    expected = Counter({(k, "a", v, None): -1 for k, v in zip(range(10), old.column("v").to_pylist())})
    expected.update({(k, "a", v, k): 1 for k, v in zip(range(10), new.column("v").to_pylist())})
    assert Counter({r: w for r, w in zip(zip(*[found.data.column(c).to_pylist() for c in ("k", "g", "v", "w")]),
                                         found.data.column(WEIGHT).to_pylist())}) == expected
    # k and g are stored byte for byte the same in old and new (only v is decoded to compare);
    # moved, every column differs
    opened = {name: ParquetRows(pq.ParquetFile(tmp_path / f"{name}.parquet"), local=str(tmp_path / f"{name}.parquet"))
              for name in ("old", "new", "moved")}
    assert [_same_chunks(opened["old"], opened["new"], c) for c in ("k", "g", "v")] == [True, True, False]
    assert [_same_chunks(opened["old"], opened["moved"], c) for c in ("k", "v")] == [False, False]


def test_rows_by_position_equal_pyarrows_for_every_flat_type(tmp_path):
    """``duck.rows_at`` (DuckDB's reader, by ``file_row_number``) gives the rows pyarrow reads,
    in every flat type it takes, NULLs included; a type it would not read exactly (nanosecond
    timestamps) is declined, and :meth:`ParquetRows.take` decodes with pyarrow instead."""
    from consistent_stream import duck
    n = 5000
    rng = np.random.default_rng(3)
    valid = rng.random(n) > 0.1
    ints = rng.integers(-10**12, 10**12, n)
    data = pa.table({
        "i8": pa.array(ints % 100, pa.int8(), mask=~valid), "i64": pa.array(ints, pa.int64()),
        "u32": pa.array(np.abs(ints) % 2**32, pa.uint32()), "f64": pa.array(rng.standard_normal(n)),
        "f32": pa.array(rng.standard_normal(n), pa.float32()),
        "d": pa.array([None if not v else Decimal(int(x)) / 100 for x, v in zip(ints, valid)], pa.decimal128(15, 2)),
        "d38": pa.array([Decimal(int(x)) * 10**20 / 10**6 for x in ints], pa.decimal128(38, 6)),
        "s": pa.array([f"s{x}é" for x in ints]), "b": pa.array([bytes([x % 256, 0, 255]) for x in ints]),
        "day": pa.array((ints % 30000).astype("int32"), pa.date32()),
        "ts": pa.array(ints % 10**15, pa.timestamp("us", tz="UTC")), "ntz": pa.array(ints % 10**15, pa.timestamp("us")),
        "ms": pa.array(ints % 10**12, pa.timestamp("ms")), "ok": pa.array(ints % 2 == 0),
        "ns": pa.array(ints, pa.timestamp("ns")),
    })
    path = tmp_path / "types.parquet"
    pq.write_table(data, path, row_group_size=1000, use_dictionary=["s"])
    at = np.array([0, 1, 999, 1000, 2500, 4999])
    flat = pa.schema([f for f in data.schema if f.name != "ns"])
    found = duck.rows_at(str(path), flat, at)
    assert found is not duck.UNSUPPORTED
    assert found.equals(data.select(flat.names).take(pa.array(at)))
    assert duck.rows_at(str(path), pa.schema([data.schema.field("ns")]), at) is duck.UNSUPPORTED
    f = ParquetRows(pq.ParquetFile(path), local=str(path))
    assert f.take(["ns", "s"], at, {"ns": pa.timestamp("ns"), "s": pa.string()}).equals(
        data.select(["ns", "s"]).take(pa.array(at)))
