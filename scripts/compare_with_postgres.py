"""Compare a consistent_stream model's newest target version with PostgreSQL's own answer to
the model's SQL (``make demo-kafka``'s last check). The model's SQL file is rendered for
PostgreSQL: ``{{ config(..) }}`` dropped, ``{{ source('<name>', '<table>') }}`` -> ``public.<table>``.

    python scripts/compare_with_postgres.py --project-dir DIR --model M --dsn DSN

Exits 0 and prints OK when the rows are equal (as sorted tuples), 1 with both row sets
otherwise."""
from __future__ import annotations

import argparse
import os
import re
import sys

import psycopg2
from deltalake import DeltaTable

from consistent_stream.observe import load_model


def _rows(rows) -> list:
    return sorted(tuple(None if v is None else (v if isinstance(v, str) else int(v)) for v in r) for r in rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dsn", required=True)
    args = ap.parse_args(argv)
    with open(os.path.join(args.project_dir, "models", f"{args.model}.sql")) as f:
        sql = f.read()
    sql = re.sub(r"\{\{\s*config\(.*?\)\s*\}\}", "", sql, flags=re.S)
    sql = re.sub(r"\{\{\s*source\('\w+',\s*'(\w+)'\)\s*\}\}", r"public.\1", sql)
    sql = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    with psycopg2.connect(args.dsn) as conn, conn.cursor() as cur:
        cur.execute(sql)
        expected = _rows(cur.fetchall())
    job = load_model(args.project_dir, args.model)
    table = DeltaTable(job.target_path)
    got = _rows(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist())
    if got == expected:
        print(f"{args.model}: version {table.version()} equals PostgreSQL's answer ({len(got)} rows): OK")
        return 0
    print(f"{args.model}: version {table.version()} differs from PostgreSQL's answer:\n  target:     {got}\n"
          f"  PostgreSQL: {expected}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
