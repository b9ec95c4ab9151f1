"""pgbench TPC-B (4 clients) on a real PostgreSQL 15 while capture and a continuous
consistent_stream model run: every committed version keeps sum(abalance) = sum(tbalance) =
sum(bbalance) and equals batch evaluation at its recorded cut; per-table cuts on the same data
(the foil) break the invariant. A short run; ``benchmarks/pgbench_consistency.py`` runs >= 50
versions."""
from __future__ import annotations

import pgbench_scenario


def test_pgbench_tpcb_views_are_consistent_at_every_version_and_per_table_cuts_are_not(spark, tmp_path):
    o = pgbench_scenario.run(spark, tmp_path, seconds=55, clients=4, rate=100)
    print(o)
    assert o.transactions > 2000, o
    # each micro-batch takes several seconds of Spark on 2 cores: a short run has few versions
    assert o.versions >= 3, o
    assert o.invariant_violations == 0, o
    assert o.oracle_mismatches == 0 and o.spark_checked >= 2, o
    assert o.final_matches_database, o
    assert o.cut_positions == sorted(o.cut_positions) and len(set(o.cut_positions)) == o.versions, o
    # the foil: the same check with per-table cuts finds violations
    assert o.foil_violations > 0, o
