#!/usr/bin/env bash
# make demo-cluster: the demo of scripts/demo.sh (TPC-H SF 0.1, `dbt build`, three refresh
# rounds each followed by `dbt run` and `consistent-stream verify`, then `dbt build`) with
# dbt's Spark session on a standalone cluster: one master and two workers started from
# pyspark's own distribution on 127.0.0.1 (`consistent-stream-testing cluster start`), the profile's
# `cluster` target. Verification runs in a local Spark session of its own, independent of
# the cluster. Ends with the tasks each executor ran (executor ids are never `driver`: the
# workers ran them) and stops the cluster, also when a step fails.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/.venv/bin
export CONSISTENT_STREAM_CLUSTER_DIR=${CONSISTENT_STREAM_CLUSTER_DIR:-$repo/models/example/cluster}
# every Spark process of the demo (dbt's driver, verify's local session) on the loopback address
export SPARK_LOCAL_IP=127.0.0.1

printf '\n==== %s ====\n' "start a standalone cluster: 1 master, 2 workers (logs in $CONSISTENT_STREAM_CLUSTER_DIR)"
"$bin/consistent-stream-testing" cluster stop >/dev/null  # one left by an interrupted demo
rm -rf "$CONSISTENT_STREAM_CLUSTER_DIR"
"$bin/consistent-stream-testing" cluster start --workers 2 --cores-per-worker 1 --memory-per-worker 2g
trap '"$bin/consistent-stream-testing" cluster stop' EXIT
"$bin/consistent-stream-testing" cluster status

DBT_TARGET=cluster "$repo/scripts/demo.sh"

printf '\n==== %s ====\n' "tasks run by the workers' executors"
"$bin/consistent-stream-testing" cluster tasks --require-workers 2
printf '\n==== %s ====\n' "demo-cluster passed"
