#!/usr/bin/env bash
# Separate hosts inside one machine, for `make demo-cluster-s3` (root only):
#
#   scripts/netns_cluster.sh up [WORKERS]     a bridge cs-br0 at 10.231.0.1/24 (this namespace: the
#                                             driver and the S3 server) and one network namespace per
#                                             node, each with its own veth on the bridge and lo up:
#                                             cs-master 10.231.0.2, cs-worker-1 10.231.0.3, ...
#   scripts/netns_cluster.sh down             removes the namespaces (ending the processes still in
#                                             them) and the bridge; also what an interrupted run left
#   scripts/netns_cluster.sh exec NS -- CMD   runs CMD in namespace NS with a /tmp of its own (a tmpfs
#                                             in the namespace's mount namespace): a node sees none of
#                                             the driver's temporary files. CS_NODE_EXPOSE (paths,
#                                             ':'-separated) are reachable there read-only although a
#                                             directory above them is closed to others: the closed
#                                             directory is, for the node, an empty tmpfs holding them
#   scripts/netns_cluster.sh addr NODE        the address of NODE (driver: the bridge's, master,
#                                             worker-1, ...)
#
# CS_NETNS_SUBNET (default 10.231.0) picks another /24 when that one is taken on this machine.
set -euo pipefail

subnet=${CS_NETNS_SUBNET:-10.231.0}
bridge=cs-br0

die() { echo "netns_cluster.sh: error: $*" >&2; exit 2; }

addr() {  # driver (this namespace, on the bridge) -> .1, master -> .2, worker-N -> .(N+2)
    case "$1" in
        driver) echo "$subnet.1" ;;
        master) echo "$subnet.2" ;;
        worker-[0-9]*) echo "$subnet.$(( ${1#worker-} + 2 ))" ;;
        *) die "unknown node $1 (driver, master, worker-1, worker-2, ...)" ;;
    esac
}

down() {
    local ns pid
    for ns in $(ip netns list | awk '$1 ~ /^cs-(master|worker-[0-9]+)$/ {print $1}'); do
        for pid in $(ip netns pids "$ns"); do  # processes still in a node: a daemon an interrupted run left
            kill -TERM "$pid" 2>/dev/null || true
        done
        for _ in $(seq 50); do [ -z "$(ip netns pids "$ns")" ] && break; sleep 0.2; done
        for pid in $(ip netns pids "$ns"); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns delete "$ns"
    done
    if ip link show "$bridge" >/dev/null 2>&1; then ip link delete "$bridge"; fi
}

up() {
    local workers=${1:-2} i node ns veth
    [ "$(id -u)" = 0 ] || die "network namespaces need root"
    down
    ip link add "$bridge" type bridge
    ip addr add "$(addr driver)/24" dev "$bridge"
    ip link set "$bridge" up
    i=0
    for node in master $(seq -f 'worker-%g' 1 "$workers"); do
        ns=cs-$node veth=cs-veth$i
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$bridge" up
        ip -n "$ns" addr add "$(addr "$node")/24" dev eth0
        ip -n "$ns" link set eth0 up
        i=$((i + 1))
    done
}

node_exec() {
    local ns=$1
    shift
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "exec $ns: no command"
    ip netns list | awk '{print $1}' | grep -qx "$ns" || die "no network namespace $ns (run: $0 up)"
    # ip netns exec gives the command a mount namespace of its own (a slave of this one): what
    # in_node mounts there is the node's alone, and goes away with its last process
    exec ip netns exec "$ns" "$0" in-node -- "$@"
}

searchable_by_others() { [ "$(stat -L -c %A "$1" | cut -c10)" = x ]; }

in_node() {  # in the node's mount namespace, as root: its own /tmp, the exposed paths; then CMD
    [ "${1:-}" = -- ] && shift
    mount -t tmpfs -o mode=1777,size=2g cs-node-tmp /tmp
    # CS_NODE_EXPOSE: paths (':'-separated) the node must reach at the same path although a
    # directory above them is closed to others (e.g. a Python installed under /root): that
    # directory becomes, for the node only, an empty tmpfs holding just those paths, read-only
    local p a closed n=0 staged=() closed_dirs=()
    IFS=: read -ra wanted <<< "${CS_NODE_EXPOSE:-}"
    for p in "${wanted[@]}"; do
        [ -n "$p" ] || continue
        [ -e "$p" ] || die "CS_NODE_EXPOSE: $p does not exist"
        closed=
        a=
        IFS=/ read -ra parts <<< "${p#/}"
        for part in "${parts[@]}"; do
            a=$a/$part
            if ! searchable_by_others "$a"; then closed=$a; break; fi
        done
        [ -n "$closed" ] || continue
        n=$((n + 1))
        mkdir -p "/tmp/.cs-expose/$n"
        mount --bind "$p" "/tmp/.cs-expose/$n"
        staged+=("$p")
        closed_dirs+=("$closed")
    done
    local i done_dirs=" "
    for i in "${!staged[@]}"; do
        closed=${closed_dirs[$i]}
        if [[ $done_dirs != *" $closed "* ]]; then
            mount -t tmpfs -o mode=0755,size=1m cs-node-closed "$closed"
            done_dirs+="$closed "
        fi
        mkdir -p "${staged[$i]}"
        mount --move "/tmp/.cs-expose/$((i + 1))" "${staged[$i]}"
        mount -o remount,bind,ro "${staged[$i]}"
    done
    [ -d /tmp/.cs-expose ] && rm -rf /tmp/.cs-expose
    exec "$@"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    exec) shift; [ $# -ge 1 ] || die "usage: $0 exec NS -- CMD..."; node_exec "$@" ;;
    in-node) shift; in_node "$@" ;;
    addr) [ $# -eq 2 ] || die "usage: $0 addr NODE"; addr "$2" ;;
    *) die "usage: $0 up [WORKERS] | down | exec NS -- CMD... | addr NODE" ;;
esac
