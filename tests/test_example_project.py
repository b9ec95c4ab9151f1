"""The example project (models/example) through dbt, as `make demo` runs it but on TPC-H SF
0.01: `dbt build --full-refresh`, then `dbt docs generate`, whose `target/catalog.json` must
list every consistent_stream model as relation type `consistent_stream` with its statistics
from the Delta log, and the view as a view. dbt in this process, on the test process's
SparkSession (its warehouse), with a schema of its own."""
from __future__ import annotations

import json

from consistent_stream.delta import DeltaTableRef
from consistent_stream.verify import index_path
from helpers import example_copy
from test_dbt_plugin import dbt, messages

CONSISTENT_STREAM_MODELS = {"q3_revenue_per_order", "q1_pricing_summary", "customer_order_totals", "order_revenue",
                            "nation_revenue"}


def test_dbt_docs_generate_on_the_example_project_lists_its_relations_with_their_type_and_stats(
        spark, tmp_path, monkeypatch):
    project, schema, _ = example_copy(tmp_path, "example")
    monkeypatch.setenv("DBT_PROJECT_DIR", str(project))
    monkeypatch.setenv("TPCH_DIR", str(project / "data" / "tpch"))
    try:
        r = dbt(project, "build", "--full-refresh")
        assert r.success, messages(r)
        r = dbt(project, "docs", "generate")
        assert r.success, messages(r)
        catalog = json.loads((project / "target" / "catalog.json").read_text())
        nodes = {key.split(".")[-1]: node for key, node in catalog["nodes"].items()}
        assert set(nodes) == CONSISTENT_STREAM_MODELS | {"stg_lineitem"}
        assert nodes["stg_lineitem"]["metadata"]["type"] == "view"
        for name in CONSISTENT_STREAM_MODELS:
            node = nodes[name]
            assert node["metadata"]["type"] == "consistent_stream", (name, node["metadata"])
            assert node["metadata"]["schema"] == schema and node["columns"], name
            stats = {k: v["value"] for k, v in node["stats"].items()}
            with open(index_path(str(project), name)) as f:
                target = DeltaTableRef(json.load(f)["target_path"])
            assert stats["consistent_stream_version"] == target.latest_version(), name
            assert stats["num_rows"] == spark.table(f"{schema}.{name}").count() > 0, name
            cut = json.loads(stats["consistent_stream_cut"])
            # the source versions it reflects (an upstream model's as model.<name>)
            assert cut and all(key.split(".")[0] in ("tpch", "model") for key in cut), (name, cut)
            assert stats["consistent_stream_freshness"] >= 0, name
    finally:
        spark.sql(f"drop schema if exists {schema} cascade")
