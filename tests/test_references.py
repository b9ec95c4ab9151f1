"""The model config is defined once (``consistent_stream.model_config``) and read by the
engine's validation (``JobSpec.from_dbt``), the adapter's config class, the materialization
and the docs' generated reference: these tests fail when a key is in one of them and not in
the others. The CLI and module map references are checked against the parser and
``python/modules.toml``. No Spark session, no dbt run: fast."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import tomllib

import pytest

from helpers import REPO

from consistent_stream.errors import ConfigError
from consistent_stream.model_config import CONFIG, CONTRACT, KEYS, KINDS, MODEL_CONFIG, PERSIST_DOCS, config_keys
from consistent_stream.spec import JobSpec

MACRO = REPO / "macros" / "materializations" / "consistent_stream" / "consistent_stream.sql"
SPEC = REPO / "python" / "consistent_stream" / "spec.py"
REFERENCE = REPO / "docs" / "gen" / "reference.py"

SOURCE = {"source_name": "shop", "name": "orders", "relation": "shop_raw.orders",
          "meta": {"format": "delta", "location": "data/orders", "primary_key": ["order_id"]}}
NEEDS = {"autoscale": {"trigger": "processing_time:10"}}
"""What a key's example needs beside it to be valid."""
NOT_FROM_CONFIG = {"model", "schema", "identifier", "sql", "sources", "target_path"}
"""JobSpec's fields that are not model config keys."""


def reference():
    spec = importlib.util.spec_from_file_location("docs_gen_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_spec(tmp_path, config: dict) -> JobSpec:
    return JobSpec.from_dbt(project_root=str(tmp_path), schema="s", identifier="m", model_name="m", sql="select 1",
                            sources=[SOURCE], config=config, warehouse_dir=str(tmp_path / "warehouse"))


def test_every_key_is_defined_once_with_its_type_default_accepted_values_and_description():
    assert len(KEYS) == len(MODEL_CONFIG) >= 21
    for key in MODEL_CONFIG:
        assert re.fullmatch(r"[a-z_]+", key.name), key
        assert key.kind in KINDS and key.origin in (CONFIG, CONTRACT, PERSIST_DOCS), key
        assert key.type and key.accepted and len(key.description) > 60, key
        assert key.example is not None and key.example != key.default, key
        if key.kind in ("number", "integer"):
            assert key.minimum is not None and key.default >= key.minimum, key
        if key.kind == "choice":
            assert key.default == key.choices[0], key
            assert all(f"`{c}`" in key.accepted for c in key.choices), key
    assert {k.name for k in MODEL_CONFIG if not k.from_config} == {"contract", "constraints", "docs"}


def test_defaults_kept_elsewhere_agree_with_the_definition():
    from consistent_stream.autoscale import AutoscaleConfig
    from consistent_stream.settings import STATE_FILE_ROWS
    from consistent_stream.model_config import AUTOSCALE_KEYS
    assert KEYS["state_file_rows"].default == STATE_FILE_ROWS
    assert AUTOSCALE_KEYS == tuple(f.name for f in dataclasses.fields(AutoscaleConfig))


def test_jobspec_has_a_field_for_every_key_and_reads_no_other_key():
    fields = {f.name for f in dataclasses.fields(JobSpec)} - NOT_FROM_CONFIG
    assert fields == set(KEYS) - {"location_root"}   # location_root makes target_path
    read = set(re.findall(r"""config(?:\.get\(|\[)\s*["'](\w+)["']""", SPEC.read_text()))
    read |= set(re.findall(r"""_number\(config, ["'](\w+)["']""", SPEC.read_text()))
    assert read <= set(KEYS), f"JobSpec.from_dbt reads keys the definition lacks: {sorted(read - set(KEYS))}"


def test_jobspec_defaults_every_key_as_the_definition_says(tmp_path):
    spec = job_spec(tmp_path, {})
    derived = {"location_root": spec.target_path == str(tmp_path / "warehouse" / "consistent_stream" / "s" / "m"),
               "checkpoint_location": spec.checkpoint_location == spec.target_path + "__checkpoint",
               "unique_key": spec.unique_key == []}   # inferred from the plan
    assert all(derived.values()), derived
    for key in MODEL_CONFIG:
        if key.name not in derived:
            expected = [] if key.default is None and key.kind in ("columns", "contract", "constraints") else key.default
            assert getattr(spec, key.name) == expected, key.name


@pytest.mark.parametrize("name", list(KEYS))
def test_jobspec_accepts_each_keys_example_and_reads_it(tmp_path, name):
    base = NEEDS.get(name, {})
    before = dataclasses.asdict(job_spec(tmp_path, dict(base)))
    after = dataclasses.asdict(job_spec(tmp_path, {**base, name: KEYS[name].example}))
    assert before != after, f"config {name}={KEYS[name].example!r} changed nothing in the JobSpec"


@pytest.mark.parametrize("name", [k.name for k in MODEL_CONFIG if k.kind in ("number", "integer", "choice")])
def test_jobspec_refuses_a_value_the_definition_does_not_accept(tmp_path, name):
    key = KEYS[name]
    bad = "bogus" if key.kind == "choice" else key.minimum - 1
    with pytest.raises(ConfigError, match=rf"^model m: config {name} must be "):
        job_spec(tmp_path, {name: bad})
    if key.kind == "integer":
        with pytest.raises(ConfigError, match=re.escape(f"model m: config {name} must be an integer >= "
                                                        f"{key.minimum}, got 2.5")):
            job_spec(tmp_path, {name: 2.5})


def test_the_materialization_passes_every_key_of_the_definition():
    """The macro reads each config key the adapter names (``config_keys()``) and sets the
    others, and the validated ones, itself: together, exactly the definition's keys."""
    from dbt.adapters.consistent_spark import ConsistentSparkAdapter
    assert ConsistentSparkAdapter.consistent_stream_config_keys(None) == config_keys()
    macro = MACRO.read_text()
    loop = re.search(r"\{%-? for (\w+) in adapter\.consistent_stream_config_keys\(\) -?%\}\s*"
                     r"\{%-? do stream_config\.update\(\{\1: config\.get\(\1, none\)\}\) -?%\}", macro)
    assert loop, "the materialization no longer builds stream_config from adapter.consistent_stream_config_keys()"
    block = macro[loop.end():].split("{%- do stream_config.update({", 1)[1].split("}) -%}", 1)[0]
    explicit = set(re.findall(r"^\s*'(\w+)':", block, re.M))
    assert explicit <= set(KEYS), f"the macro passes keys the definition lacks: {sorted(explicit - set(KEYS))}"
    assert {k.name for k in MODEL_CONFIG if not k.from_config} <= explicit
    assert set(config_keys()) | explicit == set(KEYS)


def test_the_adapter_config_class_has_a_field_for_every_config_key():
    from dbt.adapters.consistent_spark.impl import ConsistentSparkAdapter, ConsistentSparkConfig
    from dbt.adapters.spark.impl import SparkConfig
    assert ConsistentSparkAdapter.AdapterSpecificConfigs is ConsistentSparkConfig
    assert issubclass(ConsistentSparkConfig, SparkConfig)
    fields = {f.name for f in dataclasses.fields(ConsistentSparkConfig)}
    own = fields - {f.name for f in dataclasses.fields(SparkConfig)}
    assert set(config_keys()) <= fields, sorted(set(config_keys()) - fields)
    assert own == set(config_keys()) - {f.name for f in dataclasses.fields(SparkConfig)}
    config = ConsistentSparkConfig.from_dict({"max_batch_rows": 5, "autoscale": {"min_parallelism": 2}})
    assert (config.max_batch_rows, config.autoscale, config.trigger) == (5, {"min_parallelism": 2}, None)


def test_the_model_config_reference_documents_every_key():
    module = reference()
    page = module.model_config_page()
    for key in MODEL_CONFIG:
        assert f"\n## `{key.name}`\n" in page, key.name
        row = (f"| [`{key.name}`](#{key.name}) | {module._md(key.type)} | {module._md(key.default_as_text())} "
               f"| {module._md(key.accepted)} |")
        assert f"\n{row}\n" in page, key.name
        assert f"\n{module._md(key.description)}\n" in page, key.name
    assert page.count("\n## `") == len(MODEL_CONFIG)


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}".strip(), sub
                yield from _commands(sub, f"{prefix} {name}")


def test_the_cli_reference_covers_every_subcommand_and_option():
    from consistent_stream.cli import build_parser
    parser = build_parser()
    page = reference().cli_page(parser)
    commands = list(_commands(parser))
    assert len(commands) >= 6 and "verify" in dict(commands)
    for path, sub in commands:
        assert f"\n## `consistent-stream {path}`\n" in page, path
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page, (path, option)
    assert page.count("\n## `consistent-stream ") == len(commands)


def test_the_module_map_page_lists_every_module_by_layer():
    with open(REPO / "python" / "modules.toml", "rb") as f:
        entries = tomllib.load(f)["module"]
    page = reference().module_map_page()
    assert "tests/test_module_layers.py" in page
    for entry in entries:
        name = "consistent_stream" if entry["name"] == "__init__" else f"consistent_stream.{entry['name']}"
        assert f"| `{name}` |" in page, name
    assert page.count("\n## Layer ") == len({e["layer"] for e in entries})


def test_the_reference_script_writes_its_three_pages(tmp_path):
    module = reference()
    assert set(module.PAGES) == {"reference/model-config.md", "reference/cli.md", "contributing/module-map.md"}
    module.write_pages(str(tmp_path))
    for path in module.PAGES:
        assert (tmp_path / path).read_text().startswith("# ")
