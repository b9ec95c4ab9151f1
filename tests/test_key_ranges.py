"""A rebuild's key ranges from the sources' Delta statistics (:mod:`consistent_stream.ranges`):
the bounds estimated from per-file min, max and row counts; the partitioning by them (each range
in its own partition, ascending, NULLs first, no sampling job and no second exchange for the
consolidation); a rebuild whose state and target files are cut at those bounds, then
maintained equal to batch evaluation; and a join side whose source holds its key clustered,
written as its scan reads it (no exchange), each file sorted, or written again in ranges when
the files its tasks wrote overlap after all."""
from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, LongType, StringType

from consistent_stream.connect import default_parallelism
from consistent_stream import ranges
from consistent_stream.ranges import (RANGE, estimated_bounds, files_per_key, hash_slots, range_partitioned,
                                      typed_bounds)
from scenario import Scenario


def test_bounds_are_the_quantiles_of_each_files_rows_spread_over_its_range():
    # three files in key order: the quarters fall at 100, 200 and half-way through the third
    got = estimated_bounds([(1, 100, 100), (101, 200, 100), (201, 401, 200)], 4)
    assert [round(x, 3) for x in got] == [100.0, 200.0, 301.0]
    # one file: an even split of its range; a file of one value is a point
    assert [round(x, 3) for x in estimated_bounds([(0, 1000, 10)], 4)] == [250.0, 500.0, 750.0]
    assert [round(x, 3) for x in estimated_bounds([(5, 5, 90), (6, 16, 10)], 2)] == [5.0]
    assert estimated_bounds([(0, 10, 5)], 1) == [] and estimated_bounds([], 4) == []

    assert typed_bounds([(1, 100, 100), (101, 200, 100), (201, 401, 200)], LongType(), 4) == [100, 200, 301]
    days = typed_bounds([(datetime.date(2024, 1, 1), datetime.date(2024, 1, 31), 30)], DateType(), 2)
    assert days == [datetime.date(2024, 1, 16)]
    money = typed_bounds([(decimal.Decimal("0.00"), decimal.Decimal("10.00"), 4)], DecimalType(12, 2), 4)
    assert money == [decimal.Decimal("2.50"), decimal.Decimal("5.00"), decimal.Decimal("7.50")]
    # equal bounds collapse (fewer, still ascending); nothing to cut: None
    assert typed_bounds([(7, 7, 100), (8, 9, 1)], LongType(), 4) == [7]
    # no statistics, a file without them, a type the estimate does not handle: Spark samples
    assert typed_bounds(None, LongType(), 4) is None
    assert typed_bounds([(1, 9, 5), (None, None, 5)], LongType(), 4) is None
    assert typed_bounds([("a", "z", 5)], StringType(), 4) is None
    assert typed_bounds([(1, 9, 5)], LongType(), 1) is None


def test_each_range_lands_in_its_own_partition_in_order_with_one_exchange(spark):
    """The range column sends each range to a partition of its own, ascending with the
    partitions, NULL keys to the first; a consolidation grouped by it too and the sort
    within partitions add no exchange, and no job samples the rows."""
    from consistent_stream.changelog import consolidate
    rows = spark.range(0, 1000).selectExpr("CASE WHEN id % 100 = 0 THEN NULL ELSE id END AS k", "id % 3 AS v",
                                           "1L AS __weight")
    out, also = range_partitioned(rows, ["k"], 4, [250, 500, 750])
    assert also == [RANGE]
    out = consolidate(out).sortWithinPartitions("k").drop(*also)
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange") == 1, plan
    got = out.withColumn("p", F.spark_partition_id()).collect()
    assert sum(r["__weight"] for r in got) == 1000   # (the ten NULL keys' rows consolidated to three)
    by_part: dict[int, list] = {}
    for r in got:
        by_part.setdefault(r["p"], []).append(r["k"])
    assert sorted(by_part) == [0, 1, 2, 3]
    assert sum(k is None for k in by_part[0]) == 3 and all(None not in by_part[p] for p in (1, 2, 3))
    ranges = [(None, 250), (250, 500), (500, 750), (750, None)]
    for p, (lo, hi) in enumerate(ranges):
        keys = [k for k in by_part[p] if k is not None]
        assert keys == sorted(keys) and all((lo is None or k >= lo) and (hi is None or k < hi) for k in keys)
    slots = hash_slots(spark, 4)
    assert sorted(r["p"] for r in spark.createDataFrame([(s,) for s in slots], "s bigint")
                  .repartition(4, "s").withColumn("p", F.spark_partition_id()).collect()) == [0, 1, 2, 3]
    # without bounds: Spark's sampled range partitioning, nothing more to group by
    assert range_partitioned(rows, ["k"], 4, None)[1] == []


def test_files_per_key_counts_the_files_a_value_falls_in():
    """1 for disjoint ranges, the number of files when each spans the whole range, and
    between for files that overlap their neighbours (a source written in key order in
    parallel, TPC-H's line items by order)."""
    assert files_per_key([(1, 100, 100), (101, 200, 100), (201, 400, 200)]) == 1.0
    assert round(files_per_key([(0, 1000, 10), (0, 1000, 30), (0, 1000, 5)]), 6) == 3.0
    overlapping = [(i * 100, i * 100 + 199, 100) for i in range(10)]   # each half over the next
    assert 1.5 < files_per_key(overlapping) < 2.0
    assert files_per_key([(5, 5, 90), (6, 16, 10)]) == 1.0
    assert files_per_key([]) is None and files_per_key([(1, 2, 0)]) is None


def test_a_join_side_whose_source_is_clustered_by_its_key_is_written_as_its_scan_reads_it(spark, tmp_path):
    """Lines in three source files of disjoint order ranges (one value in 1.0 file) and
    orders in four files that each span every order (4.0 files, past
    ``CLUSTERED_FILES_PER_KEY``): the rebuild on the executors writes the lines' side of the
    join file by file as the scan reads them, no exchange (its files' ranges are the source
    files'), each file sorted by the key, and the orders' side in disjoint ranges; the
    batches after stay equal to batch evaluation."""
    from consistent_stream.settings import spark_confs

    def lines(oks):
        return pa.table({"lid": pa.array([k * 10 + j for k in oks for j in (0, 1)], pa.int64()),
                         "ok": pa.array([k for k in oks for _ in (0, 1)], pa.int64()),
                         "price": pa.array([(k + j) % 11 for k in oks for j in (0, 1)], pa.int64())})

    def orders(oks):
        return pa.table({"ok": pa.array(oks, pa.int64()), "cust": [f"c{k % 7}" for k in oks]})
    # (each file its keys in reverse: the side's files are sorted by the write, not by the source)
    sc = Scenario(spark, tmp_path, {"o": orders(list(range(1, 1201, 4))), "l": lines(range(400, 0, -1))},
                  {"o": ["ok"], "l": ["lid"]})
    for r in range(2, 5):
        sc.insert("o", orders(list(range(r, 1201, 4))))
    sc.insert("l", lines(range(800, 400, -1)))
    sc.insert("l", lines(range(1200, 800, -1)))
    job = sc.job("select o.ok, o.cust, sum(l.price) as total from src.o o join src.l l on o.ok = l.ok "
                 "group by o.ok, o.cust", ["ok"])
    job.driver_rebuild_rows = 0
    with spark_confs(spark, {"spark.sql.files.maxPartitionBytes": "1k"}):   # a task per source file
        sc.run(job, full_refresh=True)

    def key_ranges(side: str, column: str) -> list[tuple[int, int]]:
        folder, = Path(job.state_root).glob(f"__arrangement=*_join_{side}")
        out = []
        for f in folder.rglob("*.parquet"):
            ks = pq.read_table(f, columns=[column]).column(column).to_pylist()
            assert ks == sorted(ks), f
            out.append((min(ks), max(ks)))
        return sorted(out)
    assert key_ranges("right", "l__ok") == [(1, 400), (401, 800), (801, 1200)]
    orders_side = key_ranges("left", "o__ok")
    assert len(orders_side) > 1 and all(a[1] < b[0] for a, b in zip(orders_side, orders_side[1:])), orders_side
    sc.update("o", {"cust": "'z'"}, "ok % 100 = 1")
    sc.delete("l", "lid % 250 = 0")
    sc.insert("l", lines([1201, 5]))
    sc.run(job)
    assert {r["cust"] for r in spark.read.format("delta").load(job.target_path).where("ok = 101").collect()} == {"z"}


def test_a_side_whose_tasks_read_distant_files_is_written_again_in_ranges(spark, tmp_path, monkeypatch, caplog):
    """Lines in four source files of disjoint order ranges (a value in 1.0 file), which two
    tasks read two distant files each (Spark packs a scan's files into splits of at most
    ``maxPartitionBytes``, largest file first): the files the tasks write hold a key in about
    1.3 files, past a bound of 1.2, so the side is written again in disjoint ranges from those
    files, which are removed; the batches after equal batch evaluation."""
    from consistent_stream.settings import spark_confs
    monkeypatch.setattr(ranges, "CLUSTERED_FILES_PER_KEY", 1.2)
    caplog.set_level("INFO", logger="consistent_stream")

    def lines(oks, n):
        return pa.table({"lid": pa.array([k * 10 + j for k in oks for j in range(n)], pa.int64()),
                         "ok": pa.array([k for k in oks for _ in range(n)], pa.int64()),
                         "price": pa.array([(k * 7 + j) % 13 for k in oks for j in range(n)], pa.int64())})
    # (the files by size, largest first: 1..100, 201..300, 101..200, 301..400)
    sc = Scenario(spark, tmp_path, {"o": pa.table({"ok": pa.array(range(1, 401), pa.int64())}),
                                    "l": lines(range(1, 101), 8)}, {"o": ["ok"], "l": ["lid"]})
    for oks, n in ((range(101, 201), 2), (range(201, 301), 4), (range(301, 401), 1)):
        sc.insert("l", lines(oks, n))
    actions = pa.table(DeltaTable(sc.path("l")).get_add_actions(flatten=True)).to_pylist()
    size = {a["min.ok"]: a["size_bytes"] for a in actions}
    assert size[1] > size[201] > size[101] > size[301], size
    job = sc.job("select o.ok, sum(l.price) as total from src.o o join src.l l on o.ok = l.ok group by o.ok", ["ok"])
    job.driver_rebuild_rows = 0
    # two splits: {1..100, 201..300} and {101..200, 301..400}
    with spark_confs(spark, {"spark.sql.files.maxPartitionBytes": str(size[1] + size[201]),
                             "spark.sql.files.openCostInBytes": "0", "spark.sql.files.minPartitionNum": "1"}):
        sc.run(job, full_refresh=True)
    assert "written again in ranges" in caplog.text

    folder, = Path(job.state_root).glob("__arrangement=*_join_right")
    on_disk = sorted(folder.rglob("*.parquet"))
    spans = []
    for f in on_disk:
        ks = pq.read_table(f, columns=["l__ok"]).column("l__ok").to_pylist()
        assert ks == sorted(ks), f
        spans.append((min(ks), max(ks)))
    spans.sort()
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), spans
    state = set(pa.table(DeltaTable(job.state_root).get_add_actions()).column("path").to_pylist())
    assert {str(f.relative_to(job.state_root)) for f in on_disk} <= state, "a first write's file was left"
    sc.delete("l", "ok % 50 = 0")
    sc.insert("l", lines([5, 401], 1))
    sc.run(job)


def test_a_rebuild_cuts_its_state_and_target_at_the_sources_statistics(spark, tmp_path, monkeypatch):
    """Orders in two source files, the first 1..599 and 5000 (its statistics say [1, 5000]),
    the second 601..1200, and two lines of each order of 1..1200: the rebuild on the
    executors writes the orders' side of the join and the target in ranges of the order key
    cut where the statistics put the quantiles (about 1075 for two ranges, where a sample of
    the rows would cut near 600), each file a range of its own, ascending; the batches after
    it stay equal to batch evaluation. (The orders' files hold a key in 1.56 of them on
    average: a side is ranged past 1.0 here, where a rebuild would write it as its scan reads
    it by default.)"""
    monkeypatch.setattr(ranges, "CLUSTERED_FILES_PER_KEY", 1.0)
    def orders(keys):
        return pa.table({"ok": pa.array(keys, pa.int64()), "cust": [f"c{k % 7}" for k in keys]})
    lines = pa.table({"lid": pa.array(range(1, 2401), pa.int64()),
                      "ok": pa.array([1 + i // 2 for i in range(2400)], pa.int64()),
                      "price": pa.array([i % 11 for i in range(2400)], pa.int64())})
    sc = Scenario(spark, tmp_path, {"o": orders([*range(1, 600), 5000]), "l": lines}, {"o": ["ok"], "l": ["lid"]})
    sc.insert("o", orders(list(range(601, 1201))))
    job = sc.job("select o.ok, o.cust, sum(l.price) as total from src.o o join src.l l on o.ok = l.ok "
                 "group by o.ok, o.cust", ["ok"])
    job.driver_rebuild_rows = 0
    sc.run(job, full_refresh=True)
    want = typed_bounds([(1, 5000, 600), (601, 1200, 600)], LongType(), default_parallelism(spark))
    assert want and all(b > 1000 for b in want[:1])

    def starts(files: list[Path], column: str) -> list[int]:
        ranges = sorted((pq.read_table(f, columns=[column]).column(column).to_pylist() for f in files),
                        key=lambda ks: min(ks))
        for a, b in zip(ranges, ranges[1:]):
            assert max(a) < min(b), (column, a[-3:], b[:3])
        return [min(ks) for ks in ranges][1:]

    orders_side, = Path(job.state_root).glob("__arrangement=*_join_left")
    target = sorted(f for f in Path(job.target_path).glob("**/*.parquet") if "_change_data" not in str(f))
    for files, column in ((sorted(orders_side.rglob("*.parquet")), "o__ok"), (target, "ok")):
        cut = starts(files, column)
        assert cut and set(cut) <= set(want) and cut[0] == want[0], (column, cut, want)
    sc.update("o", {"cust": "'z'"}, "ok % 100 = 1")
    sc.delete("l", "lid % 250 = 0")
    sc.run(job)
    assert {r["cust"] for r in spark.read.format("delta").load(job.target_path).where("ok = 101").collect()} == {"z"}


def test_columns_keep_their_source_through_projections_and_groups():
    """A plan column names the source column it holds as it is: a scan's, renamed by a
    projection or a GROUP BY; an aggregate's result names none."""
    from consistent_stream.plan import compile_model
    from consistent_stream.plan.logical import column_origins
    from consistent_stream.sources import SourceSpec
    src = SourceSpec(name="t", relation="s.t", location="/nonexistent/t", source_name="s", primary_key=("k",))
    m = compile_model("select x.key, x.n from (select k as key, count(*) as n from s.t group by k) x",
                      [src], {src.key: ["k", "v"]})
    origins = column_origins(m.root)
    key, n = m.output_columns
    assert origins[key] == (src.key, "k") and n not in origins


def test_a_column_mapped_source_gives_its_statistics_under_the_columns_name(spark, tmp_path):
    """A source delta-spark wrote with column mapping (``name`` mode: its files and its
    statistics name each column by a physical name of its own), its key renamed after: the
    statistics of the key are found under the column's name in the table's schema, so a
    rebuild's bounds come from them as for any other source."""
    from consistent_stream.sources import SourceSpec
    from consistent_stream.sources.formats import open_source
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (k BIGINT, v STRING) USING delta "
              "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')")
    for lo, hi in ((0, 100), (100, 300)):
        spark.range(lo, hi, 1, 1).selectExpr("id AS k", "'x' AS v").write.format("delta").mode("append").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` RENAME COLUMN k TO order_key")
    source = open_source(SourceSpec(name="t", relation="s.t", location=path, source_name="s"))
    version = source.table.latest_version()
    assert sorted(source.column_stats(version, "order_key")) == [(0, 99, 100), (100, 299, 200)]
    assert source.column_stats(version, "k") is None   # the old name names nothing
