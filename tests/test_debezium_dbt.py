"""``snapshot_then_cdc`` in a real dbt project: a consistent_stream model over a Debezium
landing directory, run by dbt, equals batch evaluation at its cut; new transactions arrive and
the next ``dbt run`` applies them whole; ``--full-refresh`` rebuilds the same result; a source
that is not a captured table fails at compile time naming the meta key."""
from __future__ import annotations

import json
import os

from consistent_stream.delta import DeltaTableRef
from consistent_stream.verify import index_path, verify_target
from helpers import delta_pandas
from test_debezium_reader import SNAPSHOT, TX1, TX2, landing
from test_dbt_plugin import dbt, messages, project_fixture, spark_session, write  # noqa: F401  (the project fixture)
from consistent_stream.sources.landing import event_file_name

SOURCES = """
    version: 2
    sources:
      - name: pg
        tables:
          - name: accounts
            meta:
              consistent_stream: {format: debezium, location: landing, table: public.accounts, primary_key: [id]}
          - name: tellers
            meta:
              consistent_stream: {format: debezium, location: landing, table: public.tellers}
          - name: plain
            meta:
              consistent_stream: {format: delta, location: data/plain}
    """

MODEL = """
    {{ config(materialized='consistent_stream', unique_key='which') }}
    select 'accounts' as which, count(*) as n, sum(balance) as total from {{ snapshot_then_cdc('pg', 'accounts') }}
    union all
    select 'tellers' as which, count(*) as n, sum(total) as total from {{ snapshot_then_cdc('pg', 'tellers') }}
    """


def _totals(path: str) -> dict:
    df = delta_pandas(path)
    return {r.which: (int(r.n), float(r.total)) for r in df.itertuples()}


def test_snapshot_then_cdc_model_runs_in_dbt_and_equals_batch_evaluation(project, tmp_path):
    root, schema, _ = project
    d = landing(root, [SNAPSHOT, TX1])  # root/landing
    write(root, {"models/sources.yml": SOURCES, "models/totals.sql": MODEL})

    result = dbt(root, "run")
    assert result.success, messages(result)
    with open(index_path(str(root), "totals")) as f:
        target_path = json.load(f)["target_path"]
    assert _totals(target_path) == {"accounts": (2, 12.5), "tellers": (1, 12.0)}
    res = verify_target(spark_session(), target_path)
    assert res.ok and res.cut == {"pg.accounts": 120, "pg.tellers": 120}, res.to_json()

    with open(os.path.join(d, event_file_name(3)), "w") as f:  # a new transaction lands
        for e in TX2:
            f.write(json.dumps(e) + "\n")
    assert dbt(root, "run").success
    assert _totals(target_path) == {"accounts": (2, 8.25), "tellers": (1, 12.0)}
    meta = DeltaTableRef(target_path).commit_at(DeltaTableRef(target_path).latest_version()).metadata
    assert int(meta["source_commit_ms"]) == 3000 and "cut_lsn" in meta
    assert verify_target(spark_session(), target_path).ok

    assert dbt(root, "run", "--full-refresh").success
    assert _totals(target_path) == {"accounts": (2, 8.25), "tellers": (1, 12.0)}
    assert verify_target(spark_session(), target_path).ok


def test_snapshot_then_cdc_of_a_source_that_is_not_captured_fails_at_compile_time(project):
    root, _, _ = project
    write(root, {"models/sources.yml": SOURCES, "models/bad.sql": """
        {{ config(materialized='consistent_stream', unique_key='x') }}
        select x from {{ snapshot_then_cdc('pg', 'plain') }}
        """})
    result = dbt(root, "run")
    assert not result.success
    msg = messages(result)
    assert "snapshot_then_cdc('pg', 'plain')" in msg and "meta.consistent_stream.format must be debezium" in msg
