#!/usr/bin/env bash
# The example dbt project (models/example) end to end on TPC-H SF 0.1: generate the sources
# as Delta tables (orders without the Change Data Feed; dbt's on-run-start registers them in
# the catalog, where sources.yml names them), build the models with `dbt build` (tests between the levels of the ref()
# chain stg_lineitem (view) -> order_revenue -> nation_revenue), then three refresh rounds
# (TPC-H RF1 inserts and RF2 deletes) each followed by `dbt run`. After every run each
# consistent_stream model is verified against batch evaluation of its SQL (for a chain, of
# the whole chain) over the base source snapshots its version records. Ends with `dbt build`.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# CS_BIN: the virtualenv whose dbt, consistent-stream and consistent-stream-testing run
# (demo_connect.sh's pyspark-client one)
bin=${CS_BIN:-$repo/.venv/bin}
models=(q3_revenue_per_order q1_pricing_summary customer_order_totals order_revenue nation_revenue)
rounds=3

# CS_PROJECT_DIR: a copy of the example project to run instead (demo_cluster_s3.sh's); TPCH_DIR:
# where the sources go (a local directory or an s3:// URI; default data/tpch in the project)
cd "${CS_PROJECT_DIR:-$repo/models/example}"
# Paths below (TPCH_DIR, and the warehouse and metastore in profiles.yml) are relative to
# the example project; DBT_PROJECT_DIR and DBT_PROFILES_DIR are dbt's own variables.
export DBT_PROJECT_DIR=$PWD DBT_PROFILES_DIR=$PWD TPCH_DIR=${TPCH_DIR:-data/tpch}
export DBT_SEND_ANONYMOUS_USAGE_STATS=false

. "$repo/scripts/demo_lib.sh"

step "clean: sources, catalog and dbt artifacts of a previous demo"
rm -rf data spark-warehouse metastore_db derby.log target logs

step "generate TPC-H SF 0.1 into $TPCH_DIR (orders without the Change Data Feed)"
"$bin/consistent-stream-testing" tpch-generate --sf 0.1 --dir "$TPCH_DIR" --without-cdf orders

step "dbt build --full-refresh (initial build; tests run after each level of the chain)"
"$bin/dbt" build --full-refresh
verify_all "initial build"

for round in $(seq 1 "$rounds"); do
    step "refresh round $round of $rounds (TPC-H RF1 + RF2)"
    "$bin/consistent-stream-testing" tpch-refresh --dir "$TPCH_DIR" --round "$round"
    step "dbt run (after refresh round $round)"
    "$bin/dbt" run
    verify_all "after refresh round $round"
done

step "dbt build (every model up to date; every test)"
"$bin/dbt" build

step "demo passed"
