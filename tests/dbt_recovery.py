"""The last resorts through dbt itself (``test_dbt_plugin.py`` on local disk,
``test_object_store.py`` on the S3 server): a model's target deleted while Spark's catalog
keeps its entry, then ``dbt run`` (a clear error), ``verify`` and ``status`` (the same), ``dbt
docs generate`` (works), ``dbt run --full-refresh`` (rebuilt, verified); then the target and
its checkpoint both deleted."""
from __future__ import annotations

import json

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from consistent_stream import storage
from consistent_stream.cli import main
from consistent_stream.sink.catalog import catalog_entry
from test_dbt_end_to_end import SOURCES
from test_dbt_plugin import PROJECT, dbt, messages, profile, write

TOTALS = """
{{{{ config(materialized='consistent_stream', unique_key='cid', location_root='{root}') }}}}
select cid, count(*) as n, sum(amount) as total from {{{{ source('shop', 'orders') }}}} group by cid
"""
BIG = """
{{{{ config(materialized='consistent_stream', unique_key='cid', location_root='{root}') }}}}
select cid, total from {{{{ ref('totals') }}}} where total >= 10
"""


def _verify(capsys, project, model: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", model, "--project-dir", str(project)])
    out = capsys.readouterr()
    return code, out.out + out.err


def deleted_target_is_named_and_rebuilt(spark, capsys, project, schema: str, data_root: str) -> None:
    """The scenario of the module docstring; ``data_root``: a local directory or an ``s3://``
    prefix holding the source and the targets."""
    src, targets = f"{data_root}/src/orders", f"{data_root}/targets"
    write_deltalake(src, pa.table({"oid": [1, 2, 3], "cid": [1, 1, 2], "amount": [5, 6, 7]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write(project, {"dbt_project.yml": PROJECT, "profiles.yml": profile(schema, project / "spark", "recovery"),
                    "models/sources.yml": SOURCES.format(loc=src), "models/totals.sql": TOTALS.format(root=targets),
                    "models/big.sql": BIG.format(root=targets)})
    res = dbt(project, "run")
    assert res.success, messages(res)
    target = f"{targets}/totals"

    storage.remove_tree(target)          # the target is gone; the catalog keeps its entry
    entry = catalog_entry(spark, schema, "totals")
    assert entry is not None and not entry.location_exists()
    res = dbt(project, "run")
    msg = messages(res)
    assert not res.success and "DELTA_PATH_DOES_NOT_EXIST" not in msg
    assert "model totals" in msg and target in msg and "dbt run --full-refresh -s totals" in msg, msg
    code, out = _verify(capsys, project, "totals")
    assert code == 2 and target in out and "dbt run --full-refresh -s totals" in out, out
    capsys.readouterr()
    assert main(["status", "totals", "--project-dir", str(project), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert target in status["error"] and "dbt run --full-refresh -s totals" in status["error"], status
    res = dbt(project, "docs", "generate")
    assert res.success, messages(res)

    write_deltalake(src, pa.table({"oid": [4], "cid": [2], "amount": [8]}), mode="append")
    res = dbt(project, "run", "--full-refresh")
    assert res.success, messages(res)
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.totals").collect()} == {1: 11, 2: 15}
    for model in ("totals", "big"):
        code, out = _verify(capsys, project, model)
        assert code == 0, out

    for command in (["run"], ["run", "--full-refresh"]):   # the checkpoint gone too: nothing to lose
        storage.remove_tree(target)
        storage.remove_tree(f"{target}__checkpoint")
        DeltaTable(src).delete("oid = 1")
        res = dbt(project, *command)
        assert res.success, messages(res)
        for model in ("totals", "big"):
            code, out = _verify(capsys, project, model)
            assert code == 0, out
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.big").collect()} == {2: 15}
