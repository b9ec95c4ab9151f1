#!/usr/bin/env bash
# Installs PostgreSQL 15 and the wal2json output plugin from Debian's packages when they are
# missing (the CDC tests run their own server from them). Needs root (or sudo) and apt.
set -euo pipefail
bin=/usr/lib/postgresql/15/bin
if [ -x "$bin/initdb" ] && [ -x "$bin/pgbench" ] && [ -e /usr/lib/postgresql/15/lib/wal2json.so ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y postgresql-15 postgresql-15-wal2json
