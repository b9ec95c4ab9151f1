#!/usr/bin/env bash
# make demo-connect: the demo of scripts/demo.sh (TPC-H SF 0.1, `dbt build`, three refresh
# rounds each followed by `dbt run` and `consistent-stream verify` of every model, then
# `dbt build`) with dbt as a Spark Connect client (the profile's `connect` target,
# `method: connect`) of a cluster whose nodes share nothing but an S3 object store.
#
# * The client: dbt and verify run here (10.231.0.1, beside the S3 server) from .venv-connect,
#   a virtualenv with `pip install -e '.[connect]'`: pyspark-client, no jars, no py4j, so no JVM
#   can start; every process the demo starts here is watched, and a Java one fails the demo.
# * The cluster: the master and the Spark Connect server (the cluster's driver: the project's
#   jars, Delta's catalog, the Hive metastore) in network namespace cs-master (10.231.0.2), two
#   workers in cs-worker-1/2 (scripts/netns_cluster.sh), each with a /tmp of its own, as the
#   unprivileged account cs-worker, which cannot read the client's directory. The server reaches
#   the S3 server with the S3A settings of `--connect-conf`.
# * Data: the TPC-H sources in s3://cs-demo/tpch, the warehouse (every model's target and
#   checkpoint) in s3://cs-demo/warehouse: the client commits there with delta-rs, the server's
#   executors read and write there with S3A. The initial build runs on the executors
#   (driver_rebuild_rows 0 in the project's copy), the refresh rounds' batches in the client.
#
# Ends with the tasks each executor ran (both workers must have run some) and checks that no
# table data was written to a local disk. Everything is stopped and removed on exit; logs stay
# in $CONSISTENT_STREAM_DEMO_CONNECT_DIR (default /var/tmp/consistent-stream-demo-connect).
# Root only.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/.venv/bin
client=$repo/.venv-connect/bin
netns=$repo/scripts/netns_cluster.sh
base=${CONSISTENT_STREAM_DEMO_CONNECT_DIR:-/var/tmp/consistent-stream-demo-connect}
user=cs-worker
bucket=cs-demo
port=15002

. "$repo/scripts/demo_lib.sh"
fail() { printf '\ndemo-connect: FAILED: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (network namespaces, a second account)"
case "$repo/" in /tmp/*) fail "the repository is under /tmp ($repo), which no node sees: each node has a /tmp of its own (scripts/netns_cluster.sh); clone it elsewhere" ;; esac

cleanup() (  # a subshell: its `set +e` must not leave the rest of the script without errexit
    set +e
    [ -f "$base/watch.stop" ] || touch "$base/watch.stop" 2>/dev/null
    [ -d "$base/cluster" ] && "$bin/consistent-stream-testing" cluster stop --dir "$base/cluster" >/dev/null
    [ -d "$base/s3" ] && "$bin/python" -m consistent_stream_testing.s3server stop --dir "$base/s3"
    "$netns" down
)

step "clean: what an interrupted run left (daemons, namespaces, $base)"
cleanup
trap cleanup EXIT
rm -rf "$base"
mkdir -p "$base"
chmod 0755 "$base"
mkdir -m 0700 "$base/client" "$base/s3"
touch "$base/started"

step "the client's virtualenv: pyspark-client only (no JVM to start)"
"$client/python" - <<'EOF' || fail "the client's virtualenv is not pyspark-client only"
import importlib.util, os, pyspark
from pyspark.util import is_remote_only
jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
assert is_remote_only() and importlib.util.find_spec("pyspark.core") is None and not os.path.exists(jars)
assert importlib.util.find_spec("py4j") is None
print(f"pyspark {pyspark.__version__} at {os.path.dirname(pyspark.__file__)}: Spark Connect only (no pyspark.core, no jars, no py4j)")
EOF

step "network: a bridge at 10.231.0.1 (client, S3 server), a namespace per node"
"$netns" up 2
client_ip=$("$netns" addr driver)
master_ip=$("$netns" addr master)
worker_ips=$("$netns" addr worker-1),$("$netns" addr worker-2)

step "S3 server (s3proxy) at $client_ip, bucket $bucket, its files in $base/s3 (mode 0700)"
eval "$("$bin/python" -m consistent_stream_testing.s3server start --dir "$base/s3" --host "$client_ip" --bucket "$bucket")"
echo "AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL"

if ! id "$user" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
fi
# the interpreter the venvs were made from, at its path on every node (read-only; under /root here)
CS_NODE_EXPOSE=$("$bin/python" -c 'import sys; print(sys.base_prefix)')
export CS_NODE_EXPOSE

step "start the cluster and its Spark Connect server (cs-master, port $port), as $user"
# the server's own settings: the warehouse on S3, and S3A's endpoint and credentials
mapfile -t server_confs < <("$bin/python" - "$bucket" <<'EOF'
import sys
from consistent_stream import location
print(f"--connect-conf=spark.sql.warehouse.dir=s3://{sys.argv[1]}/warehouse")
for k, v in location.spark_hadoop_confs().items():
    print(f"--connect-conf=spark.hadoop.{k}={v}")
EOF
)
"$bin/consistent-stream-testing" cluster start --dir "$base/cluster" --workers 2 --cores-per-worker 1 \
    --memory-per-worker 1500m --host "$master_ip" --worker-hosts "$worker_ips" \
    --launcher "$netns exec cs-{daemon} --" --user "$user" --connect-port "$port" "${server_confs[@]}"
"$bin/consistent-stream-testing" cluster status --dir "$base/cluster"

step "watch: no Java process may start on the client's side"
"$bin/python" - "$$" "$base/watch.stop" "$base/java_seen" <<'EOF' &
import os, sys, time
root, stop, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seen, scans = set(), 0
while not os.path.exists(stop):
    scans += 1
    tree = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            s = open(f"/proc/{e}/stat").read()
        except (OSError, ValueError):
            continue
        tree[int(e)] = (int(s[s.rindex(")") + 2:].split()[1]), s[s.index("(") + 1:s.rindex(")")])
    for pid, (ppid, comm) in tree.items():
        p = ppid
        while p > 1 and p != root:
            p = tree.get(p, (0, ""))[0]
        if p == root and comm == "java":
            try:
                seen.add(f"{pid} {open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' ')[:200]}")
            except OSError:
                seen.add(f"{pid} (gone)")
    time.sleep(0.1)
open(out, "w").write("\n".join([f"scans {scans}", *sorted(seen)]))
EOF
watcher=$!

# The client: a copy of the example project in its own directory (dbt's artifacts and the
# models' index stay there); every rebuild on the executors (driver_rebuild_rows 0).
project=$base/client/project
example_copy "$project" "$client/python"
export TPCH_DIR=s3://$bucket/tpch DBT_TARGET=connect SPARK_REMOTE=sc://$master_ip:$port
CS_BIN=$client CS_PROJECT_DIR=$project "$repo/scripts/demo.sh"

touch "$base/watch.stop"
wait "$watcher"
scans=$(head -1 "$base/java_seen" | awk '$1 == "scans" {print $2}')
[ "${scans:-0}" -gt 0 ] || fail "the watch of the client's processes did not run"
[ "$(wc -l < "$base/java_seen")" = 0 ] || fail "Java processes started on the client's side:"$'\n'"$(tail -n +2 "$base/java_seen")"
echo "no Java process started on the client's side ($scans looks at every process, one each 0.1 s)"

step "tasks run by the workers' executors"
"$bin/consistent-stream-testing" cluster tasks --dir "$base/cluster" --require-workers 2

step "no table data on a local disk"
local_data() { find "$@" \( -name '*.parquet' -o -name _delta_log -o -name '*__checkpoint' \) -print || true; }
found=$(local_data "$base/cluster/work" "$base/client")
[ -z "$found" ] || fail "table data on a local disk:"$'\n'"$found"
"$bin/python" - "$bucket" <<'EOF'
import sys
from consistent_stream import storage
bucket = sys.argv[1]
for prefix in ("tpch", "warehouse/consistent_stream/tpch_example"):
    print(f"s3://{bucket}/{prefix}: {sorted(storage.list_dir(f's3://{bucket}/{prefix}'))}")
EOF

rm -rf "$base/s3/data"
step "demo-connect passed"
