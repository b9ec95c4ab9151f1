"""pgbench TPC-B (4 clients) on a real PostgreSQL 15 while capture and a continuous
consistent_stream model run: every committed version keeps the model's invariant and equals
batch evaluation at its recorded cut; per-table cuts on the same data (the foil) break the
invariant. Short runs; ``benchmarks/pgbench_consistency.py`` runs >= 50 versions."""
from __future__ import annotations

import pgbench_scenario


def test_pgbench_tpcb_views_are_consistent_at_every_version_and_per_table_cuts_are_not(spark, tmp_path):
    o = pgbench_scenario.run(spark, tmp_path, seconds=45, clients=4, rate=100)
    print(o)
    assert o.transactions > 2000, o
    assert o.versions >= 10, o
    assert o.invariant_violations == 0, o
    assert o.oracle_mismatches == 0 and o.spark_checked >= 2, o
    assert o.final_matches_database, o
    assert o.cut_positions == sorted(o.cut_positions) and len(set(o.cut_positions)) == o.versions, o
    # the foil: the same check with per-table cuts finds violations; with zero skew, none
    assert o.foil_violations > 0, o
    assert o.control_violations == 0, o


def test_branch_balances_with_a_left_join_and_scalar_subqueries_stay_consistent_at_spark_defaults(spark, tmp_path):
    """Issue 8's model (a LEFT JOIN of branches with their history's sums, three uncorrelated
    scalar subqueries) in the test session, which sets no driver memory: its first batch reads
    100,000 accounts; every version keeps bbalance = the history's sum per branch and
    sum(abalance) = sum(tbalance) = sum(bbalance)."""
    o = pgbench_scenario.run(spark, tmp_path, seconds=30, clients=4, rate=100, model="branch_balances")
    print(o)
    assert o.versions >= 5, o
    assert o.invariant_violations == 0, o
    assert o.oracle_mismatches == 0 and o.spark_checked >= 2, o
    assert o.final_matches_database, o
    assert o.foil_violations > 0 and o.control_violations == 0, o
