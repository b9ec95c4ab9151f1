#!/usr/bin/env bash
# make demo-cluster-s3: the demo of scripts/demo.sh (TPC-H SF 0.1, `dbt build`, three refresh
# rounds each followed by `dbt run` and `consistent-stream verify` of every model, then
# `dbt build`) on a Spark standalone cluster whose nodes share nothing but an S3 object store.
#
# * Hosts: the master and each worker run in a network namespace of their own
#   (scripts/netns_cluster.sh: cs-master 10.231.0.2, cs-worker-1 .3, cs-worker-2 .4, on a bridge
#   whose address 10.231.0.1 is this namespace's), each with a /tmp of its own. The driver
#   (dbt's process, and verify's local Spark session) and the S3 server (s3proxy) run here, at
#   10.231.0.1.
# * Disks: the daemons run as the unprivileged account cs-worker (created when missing), which
#   cannot read the driver's directory (its project copy, metastore, dbt artifacts; mode 0700)
#   nor the S3 server's files. What the nodes share with the driver is the package, read-only at
#   the same path on every node, as a cluster's nodes would have it installed: this repository's
#   .venv and python/, and the Python the venv was made from (when it lies under a directory
#   closed to others, such as /root, a node sees that directory holding only it: CS_NODE_EXPOSE).
# * Data: the TPC-H sources are generated straight into s3://cs-demo/tpch, the warehouse (and
#   with it every model's target and checkpoint) is s3://cs-demo/warehouse (the profile's
#   `cluster_s3` target).
#
# Ends with the tasks each executor ran (both workers must have run some), and checks that no
# table data was written to a local disk: not in the workers' work directories, not in the
# driver's directory, not in models/example. Everything is stopped and removed on exit, also
# when a step fails; a run interrupted before that is cleaned up by the next one. The logs stay
# in $CONSISTENT_STREAM_DEMO_S3_DIR (default /var/tmp/consistent-stream-demo-s3; the objects are
# removed after a run that passed). Root only.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/.venv/bin
netns=$repo/scripts/netns_cluster.sh
base=${CONSISTENT_STREAM_DEMO_S3_DIR:-/var/tmp/consistent-stream-demo-s3}
user=cs-worker
bucket=cs-demo

. "$repo/scripts/demo_lib.sh"
fail() { printf '\ndemo-cluster-s3: FAILED: %s\n' "$*" >&2; exit 1; }
as_node() {  # as_node NODE CMD...: CMD on node NODE (its namespace, its /tmp), as the daemons' account
    local node=$1
    shift
    "$netns" exec "cs-$node" -- setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"
}

[ "$(id -u)" = 0 ] || fail "needs root (network namespaces, a second account)"
case "$repo/" in /tmp/*) fail "the repository is under /tmp ($repo), which no node sees: each node has a /tmp of its own (scripts/netns_cluster.sh); clone it elsewhere" ;; esac

cleanup() (  # a subshell: its `set +e` must not leave the rest of the script without errexit
    set +e
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
mkdir -m 0700 "$base/driver" "$base/s3"
touch "$base/started"

step "network: a bridge at 10.231.0.1 (driver, S3 server), a namespace per node"
"$netns" up 2
driver_ip=$("$netns" addr driver)
master_ip=$("$netns" addr master)
worker_ips=$("$netns" addr worker-1),$("$netns" addr worker-2)
ip -br addr show cs-br0
for ns in $(ip netns list | awk '{print $1}' | grep '^cs-'); do
    echo "$ns: $(ip -n "$ns" -br -4 addr show eth0 | awk '{print $3}')"
done

step "S3 server (s3proxy) at $driver_ip, bucket $bucket, its files in $base/s3 (mode 0700)"
eval "$("$bin/python" -m consistent_stream_testing.s3server start --dir "$base/s3" --host "$driver_ip" --bucket "$bucket")"
echo "AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL"

step "the nodes, as $user: the package at the same path, read-only; the S3 server; none of the driver's files"
if ! id "$user" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
fi
# the interpreter the venv was made from, at its path on every node (read-only; under /root here)
CS_NODE_EXPOSE=$("$bin/python" -c 'import sys; print(sys.base_prefix)')
export CS_NODE_EXPOSE
for node in master worker-1 worker-2; do
    as_node "$node" "$bin/python" - "$node" "$repo" "$base/driver" "$base/s3" <<'EOF' \
        || fail "node $node: see above"
import os, socket, sys, urllib.parse
import consistent_stream, deltalake, pyspark  # noqa: F401  (the package and its engines)
node, repo, closed = sys.argv[1], sys.argv[2], sys.argv[3:]
for d in closed:
    try:
        os.listdir(d)
    except PermissionError:
        continue
    sys.exit(f"{node} can read {d}")
if os.access(repo, os.W_OK) or os.access(os.path.dirname(consistent_stream.__file__), os.W_OK):
    sys.exit(f"{node} can write {repo}")
u = urllib.parse.urlparse(os.environ["AWS_ENDPOINT_URL"])
socket.create_connection((u.hostname, u.port), timeout=5).close()
print(f"{node}: uid {os.getuid()} imports consistent_stream from {os.path.dirname(consistent_stream.__file__)} "
      f"(read-only), reaches the S3 server at {u.netloc}, cannot read {', '.join(closed)}; /tmp of its own "
      f"({len(os.listdir('/tmp'))} entries)")
EOF
done

step "start the cluster: master in cs-master, 2 workers in cs-worker-1/2, as $user"
"$bin/consistent-stream-testing" cluster start --dir "$base/cluster" --workers 2 --cores-per-worker 1 \
    --memory-per-worker 1500m --host "$master_ip" --worker-hosts "$worker_ips" \
    --launcher "$netns exec cs-{daemon} --" --user "$user"
"$bin/consistent-stream-testing" cluster status --dir "$base/cluster"

# The driver: a copy of the example project in its own directory (its metastore, dbt's
# artifacts and the models' index stay there), dbt and verify's Spark at the bridge's address.
# One change to the copy: driver_rebuild_rows 0, so that every rebuild (the initial build) runs
# on the executors, which then write the targets' and the state's files to S3 themselves (at SF
# 0.1 the default keeps rebuilds on the driver); incremental batches stay change-sized.
project=$base/driver/project
example_copy "$project" "$bin/python"
export TPCH_DIR=s3://$bucket/tpch CONSISTENT_STREAM_WAREHOUSE=s3://$bucket/warehouse DBT_TARGET=cluster_s3
export SPARK_LOCAL_IP=$driver_ip CONSISTENT_STREAM_DRIVER_HOST=$driver_ip CONSISTENT_STREAM_MASTER=spark://$master_ip:7077
CS_PROJECT_DIR=$project "$repo/scripts/demo.sh"

step "tasks run by the workers' executors"
"$bin/consistent-stream-testing" cluster tasks --dir "$base/cluster" --require-workers 2

step "no table data on a local disk"
"$bin/python" - "$bucket" <<'EOF'
import sys
from consistent_stream import storage
bucket = sys.argv[1]
for prefix in ("tpch", "warehouse/consistent_stream/tpch_example"):
    print(f"s3://{bucket}/{prefix}: {sorted(storage.list_dir(f's3://{bucket}/{prefix}'))}")
EOF
local_data() { find "$@" \( -name '*.parquet' -o -name _delta_log -o -name '*__checkpoint' \) -print || true; }
found=$(local_data "$base/cluster/work" "$base/driver")
[ -z "$found" ] || fail "table data on a local disk (a path the nodes would have to share):"$'\n'"$found"
echo "workers' work directories hold: $(find "$base/cluster/work" -type f -printf '%f\n' \
    | sed 's/.*\.jar$/jars (spark.jars, fetched from the driver)/' | sort | uniq -c | xargs)"
echo "driver's directory holds: $(ls -A "$project" | xargs)"
new=$(find "$repo/models/example" -newer "$base/started" -print)
[ -z "$new" ] || fail "written under models/example by this run:"$'\n'"$new"
echo "models/example: nothing written by this run"

rm -rf "$base/s3/data"
step "demo-cluster-s3 passed"
