#!/usr/bin/env bash
# Sets up the Flink SQL half of the Kafka/Debezium catch-up benchmark (benchmarks/flink_sql.py):
#   .venv-flink/                      PyPI apache-flink (PyFlink, with its own pandas/pyarrow/apache-beam pins,
#                                     kept out of .venv) and confluent-kafka (topic offsets for the event count)
#   .venv-flink/share/flink-jars/     the Flink SQL Kafka connector jar matching that Flink version (Maven
#                                     Central, SHA-1 checked); flink-json (the debezium-json format) too when
#                                     PyFlink's bundled lib lacks it
# Idempotent: when everything is in place it does nothing (no network). After it, nothing needs the network.
# Usage: bash benchmarks/flink_setup.sh     (PYTHON=/path/to/python3.11 to choose the interpreter)
set -euo pipefail

FLINK_VERSION=2.2.1
KAFKA_CONNECTOR_VERSION=5.0.0-2.2          # org.apache.flink:flink-sql-connector-kafka for Flink 2.2
CONFLUENT_KAFKA_VERSION=2.16.1
MAVEN=https://repo1.maven.org/maven2

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-flink"
JARS="$VENV/share/flink-jars"
STAMP="$VENV/.flink-setup-$FLINK_VERSION-$KAFKA_CONNECTOR_VERSION"

if [[ -f "$STAMP" ]]; then
    exit 0
fi

pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    # The interpreter .venv was made from, when it is a 3.9..3.12 (PyFlink 2.2 ships wheels for those).
    local base=""
    if [[ -f "$ROOT/.venv/pyvenv.cfg" ]]; then
        base="$(sed -n 's/^executable = //p' "$ROOT/.venv/pyvenv.cfg")"
    fi
    for cand in "$base" python3.11 python3.12 python3.10 python3; do
        [[ -n "$cand" ]] || continue
        if command -v "$cand" >/dev/null 2>&1 &&
           "$cand" -c 'import sys; sys.exit(not ((3, 9) <= sys.version_info[:2] <= (3, 12)))' 2>/dev/null; then
            echo "$cand"; return
        fi
    done
    echo "flink_setup.sh: no Python 3.9..3.12 found (set PYTHON)" >&2
    exit 1
}

if [[ ! -x "$VENV/bin/python" ]]; then
    "$(pick_python)" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "apache-flink==$FLINK_VERSION" "confluent-kafka==$CONFLUENT_KAFKA_VERSION"

# fetch GROUP_PATH ARTIFACT VERSION: downloads the jar into $JARS unless there, checking Maven Central's SHA-1
fetch_jar() {
    local group_path="$1" artifact="$2" version="$3"
    local name="$artifact-$version.jar"
    local url="$MAVEN/$group_path/$artifact/$version/$name"
    if [[ -f "$JARS/$name" ]]; then return; fi
    mkdir -p "$JARS"
    local tmp="$JARS/.$name.part"
    curl -fsSL --retry 3 -o "$tmp" "$url"
    local want got
    want="$(curl -fsSL --retry 3 "$url.sha1" | awk '{print $1}')"
    got="$(sha1sum "$tmp" | awk '{print $1}')"
    if [[ "$want" != "$got" ]]; then
        rm -f "$tmp"
        echo "flink_setup.sh: SHA-1 mismatch for $url (want $want, got $got)" >&2
        exit 1
    fi
    mv "$tmp" "$JARS/$name"
    echo "flink_setup.sh: $name (sha1 $got)"
}

fetch_jar org/apache/flink flink-sql-connector-kafka "$KAFKA_CONNECTOR_VERSION"

# The debezium-json format lives in flink-json; PyFlink's lib bundles it in some releases, not in others.
PYFLINK_LIB="$("$VENV/bin/python" -c 'import os, pyflink; print(os.path.dirname(pyflink.__file__))')/lib"
if ! compgen -G "$PYFLINK_LIB/flink-json-*.jar" >/dev/null &&
   ! unzip -l "$PYFLINK_LIB"/flink-dist*.jar 2>/dev/null | grep -q 'org/apache/flink/formats/json/debezium/'; then
    fetch_jar org/apache/flink flink-json "$FLINK_VERSION"
fi

"$VENV/bin/python" -c 'import pyflink, confluent_kafka'
touch "$STAMP"
echo "flink_setup.sh: ready: $VENV (apache-flink $FLINK_VERSION), jars in $JARS"
