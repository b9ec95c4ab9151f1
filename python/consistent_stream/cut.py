"""Several models read at one cut: ``consistent-stream cut`` and the ``consistent_stream_cut``
macro.

Each model's newest version is consistent with its own sources, but two models run at
different times reflect different source versions: a dashboard that queries both marts
could show an order in one and not in the other. :func:`models_at_one_cut` picks, for the
given models, the newest target versions that agree on every base source they share, by
the DAG cut rule a downstream model uses for its upstreams
(:func:`consistent_stream.sources.dag.aligned_cut`); :func:`register_cut_views` makes those
versions readable in a SparkSession as temporary views (Delta time travel: the version's
own Parquet files, ``VERSION AS OF``-style), which is what the macro gives a dbt test or
analysis.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from . import storage
from .errors import ConsistentStreamError


@dataclass(frozen=True)
class ModelAtCut:
    """One model at the shared cut: its target version, where the target is, and the base
    cut that version reflects (base source key -> position)."""
    model: str
    version: int
    target_path: str
    base_cut: dict


def _target_path(project_root: str, model: str) -> str:
    from .verify import index_path
    idx = index_path(project_root, model)
    text = storage.read_text(idx)
    if text is None:
        raise ConsistentStreamError(f"model {model} has not been run by consistent_stream in project {project_root} "
                                    f"({idx} not found): run dbt run -s {model}")
    return json.loads(text)["target_path"]


def models_at_one_cut(project_root: str, models: list[str]) -> list[ModelAtCut]:
    """The newest versions of ``models`` (consistent_stream models of the dbt project at
    ``project_root``) that share one base cut. Raises ConsistentStreamError naming a model
    that never ran, SourceError when the models never reflected the same source versions."""
    from .sources.dag import aligned_cut
    from .sources.model import ModelSource, model_spec
    if not models:
        raise ConsistentStreamError("name at least one model")
    sources = [ModelSource(model_spec(m, m, _target_path(project_root, m))) for m in dict.fromkeys(models)]
    cut = aligned_cut(sources, {s.spec.key: s.latest_position() for s in sources})
    return [ModelAtCut(s.spec.name, cut[s.spec.key], s.spec.location, s.base_positions(cut[s.spec.key]))
            for s in sources]


def register_cut_views(spark, project_root: str, models: list[str]) -> dict[str, str]:
    """Temporary views, in ``spark``, of ``models`` at their shared cut
    (:func:`models_at_one_cut`): model -> view name ``<model>__v<version>``, the target's
    rows at that version."""
    from .delta import DeltaTableRef
    out = {}
    for m in models_at_one_cut(project_root, models):
        name = f"{m.model}__v{m.version}"
        DeltaTableRef(m.target_path).read_snapshot(spark, m.version).createOrReplaceTempView(name)
        out[m.model] = name
    return out


def cut_json(models: list[ModelAtCut]) -> str:
    """The ``consistent-stream cut`` output: ``{"models": [...], "base_cut": {...}}``."""
    base: dict = {}
    for m in models:
        base.update(m.base_cut)
    return json.dumps({"models": [asdict(m) for m in models], "base_cut": base}, sort_keys=True)
