#!/usr/bin/env bash
# Debezium on Kafka end to end (models/kafka): PostgreSQL 15 running pgbench TPC-B, Debezium's
# PostgreSQL connector on a Kafka Connect worker, a KRaft Kafka broker (all started by
# `python -m consistent_stream_testing.kafka_stack` on loopback, from the jars `make .venv` resolved),
# and two consistent_stream models over the topics, cut at whole upstream transactions.
#
#   1. pgbench -i, REPLICA IDENTITY FULL, the connector registered: its snapshot is the bootstrap
#   2. dbt build --full-refresh (models + tests), verify
#   3. pgbench TPC-B (4 clients) for 40 s; meanwhile `dbt run` three times, each verified, and
#      the Kafka Connect worker SIGKILLed and started again (its connector re-sends events)
#   4. dbt run until each model equals PostgreSQL's own answer to its SQL (the connector
#      catches up), then dbt build and verify
# The stack is stopped at the end (and on failure).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/.venv/bin
py=$bin/python
models=(branch_balances history_by_branch)
cd "$repo/models/kafka"
export DBT_PROJECT_DIR=$PWD DBT_PROFILES_DIR=$PWD DBT_SEND_ANONYMOUS_USAGE_STATS=false
stackdir=${KAFKA_STACK_DIR:-/tmp/consistent-stream-demo-kafka}

. "$repo/scripts/demo_lib.sh"

step "clean: the catalog and dbt artifacts of a previous demo; PostgreSQL 15"
rm -rf spark-warehouse metastore_db derby.log target logs
"$repo/scripts/ensure_postgres.sh"
"$py" -m consistent_stream_testing.kafka_stack stop --dir "$stackdir" >/dev/null 2>&1 || true

step "start PostgreSQL, Kafka (KRaft) and Kafka Connect with Debezium on loopback (data topics: 3 partitions)"
state=$("$py" -m consistent_stream_testing.kafka_stack start --dir "$stackdir" --postgres --partitions 3)
trap '"$py" -m consistent_stream_testing.kafka_stack stop --dir "$stackdir"' EXIT
echo "$state"
export KAFKA_BOOTSTRAP=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["bootstrap"])' "$state")
export KAFKA_TOPIC_PREFIX=pgb
pgport=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["postgres"]["port"])' "$state")
pgbench=(/usr/lib/postgresql/15/bin/pgbench -h 127.0.0.1 -p "$pgport" -U postgres postgres)
psql=(/usr/lib/postgresql/15/bin/psql -h 127.0.0.1 -p "$pgport" -U postgres -d postgres -qAt)

step "pgbench -i (scale 1), REPLICA IDENTITY FULL, Debezium connector 'pgb'"
"${pgbench[@]}" -i -s 1 -q
for t in accounts tellers branches history; do "${psql[@]}" -c "ALTER TABLE pgbench_$t REPLICA IDENTITY FULL"; done
"$py" -m consistent_stream_testing.kafka_stack register --dir "$stackdir" --name pgb --prefix pgb \
    --tables public.pgbench_accounts,public.pgbench_tellers,public.pgbench_branches,public.pgbench_history

step "wait for Debezium's snapshot on Kafka"
"$py" - <<'PY'
import os, time
from confluent_kafka import Consumer, TopicPartition
c = Consumer({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP"], "group.id": "demo-wait"})
deadline = time.time() + 180
while True:
    md = c.list_topics(timeout=10).topics
    t = "pgb.public.pgbench_accounts"
    if t in md and sum(c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
                       for p in md[t].partitions) >= 100000:
        break
    assert time.time() < deadline, "Debezium's snapshot did not reach Kafka in 180 s (see the stack's connect.log)"
    time.sleep(2)
c.close()
PY

step "dbt build --full-refresh (from the connector's snapshot)"
"$bin/dbt" build --full-refresh
verify_all "initial build"

step "pgbench TPC-B, 4 clients, 40 s, 100 tx/s; dbt run x3 meanwhile; Kafka Connect SIGKILLed at 12 s"
"${pgbench[@]}" -c 4 -j 2 -T 40 -R 100 -n > pgbench.log 2>&1 &
bench=$!
( sleep 12; "$py" - "$stackdir" <<'PY'
import sys, time
from consistent_stream_testing import kafka_stack
s = kafka_stack.load(sys.argv[1])
s.kill_connect(); print("Kafka Connect worker SIGKILLed", flush=True)
time.sleep(2)
s.start_connect(); s.wait_running("pgb"); print("Kafka Connect worker restarted, connector RUNNING", flush=True)
PY
) &
bouncer=$!
for i in 1 2 3; do
    sleep 5
    step "dbt run $i of 3 (while pgbench runs)"
    "$bin/dbt" run
    verify_all "run $i"
done
wait "$bench"; wait "$bouncer"
grep -E "^(number of transactions actually processed|tps)" pgbench.log || true

step "catch up: dbt run until each model equals PostgreSQL's own answer (Kafka Connect flushes every 10 s)"
dsn="host=127.0.0.1 port=$pgport user=postgres dbname=postgres"
for attempt in $(seq 1 24); do
    "$bin/dbt" run
    ok=1
    for model in "${models[@]}"; do
        "$py" "$repo/scripts/compare_with_postgres.py" --project-dir "$PWD" --model "$model" --dsn "$dsn" || ok=0
    done
    [ "$ok" = 1 ] && break
    [ "$attempt" = 24 ] && { echo "the models did not reach PostgreSQL's answer" >&2; exit 1; }
    sleep 5
done

step "dbt build (every test) and verify"
"$bin/dbt" build
verify_all "final"

step "demo passed"
