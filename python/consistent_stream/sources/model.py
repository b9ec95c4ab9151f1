"""An upstream consistent_stream model as a source (``ref('model')``, ``format: model``).

The upstream's target is a Delta table with the Change Data Feed on, so a downstream reads it
like any Delta source: positions are the target's versions, ``(start, end]`` is its Change
Data Feed (an incremental upstream batch is a MERGE; a rebuilt one removes every file and
adds the new ones, which the feed reports as deletes and inserts that consolidate to the
rows that changed), and the first batch reads the version's snapshot.

What differs is *which* versions there are and what they mean. Every target version is one
committed upstream batch and records, in its commit metadata, the **base cut** it reflects:
for each base source (a Delta table or a Debezium table, never a model) the position the
upstream's SQL saw, through however many models lie in between. A downstream batch reads an
upstream only at such versions, and :mod:`consistent_stream.sources.dag` chooses them so
that every input agrees on every base source it shares (one cut across the DAG).

A version exists only once its commit is in the log: a downstream never sees an upstream
batch that is not committed. The commit times a downstream reports as freshness are the
upstream's *base* commit times (``source_commit_ms`` of the version), not when the upstream
committed, so a chain's freshness is measured from the base sources.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import SourceError
from ..storage import read_json
from .delta_cdf import DeltaSource, SourceChanges
from .spec import SourceSpec

MODEL_FORMAT = "model"
MODEL_SOURCE_NAME = "model"
"""Model sources are keyed ``model.<name>`` in cuts and state."""


def model_spec(name: str, relation: str, target_path: str) -> SourceSpec:
    """The :class:`SourceSpec` of upstream model ``name`` whose target is at ``target_path``;
    its primary key is the upstream's target key, as its newest commit records it.

    Raises SourceError when the upstream has no committed target yet (run it first)."""
    from ..delta import DeltaTableRef
    target = DeltaTableRef(target_path)
    if not target.exists():
        raise SourceError(f"ref('{name}'): the consistent_stream model {name} has no target at {target_path}: "
                          f"run it first (dbt run -s +<this model> runs it before this one); if its target was "
                          f"deleted after it was built, dbt run --full-refresh -s {name} rebuilds it")
    meta = target.latest_commit().metadata
    key = meta.get("unique_key")
    key = json.loads(key) if isinstance(key, str) else key
    return SourceSpec(name=name, relation=relation, location=target_path, format=MODEL_FORMAT,
                      primary_key=tuple(c.lower() for c in (key or ())), source_name=MODEL_SOURCE_NAME)


class ModelSource(DeltaSource):
    """An upstream model's target read as a changelog (see the module docstring). Its clock
    is its own versions; a backlog is not split (an intermediate cut would have to agree
    with the upstream version's base cut).

    Beyond :class:`~consistent_stream.sources.formats.Source`: :meth:`versions_newest_first`,
    :meth:`base_sources` (every base source under the upstream, by key) and :meth:`definition`
    (its SQL and sources), which the DAG cut rule and the oracle use."""
    splits_backlog = False

    def __init__(self, spec: SourceSpec):
        super().__init__(spec)
        self._meta: dict[int, dict] = {}   # version -> decoded commit metadata

    def resume(self, cut_offsets: dict, position: int) -> bool:
        """An upstream model is read through its own handle (its versions carry the base cuts
        the DAG cut rule needs), never from the log's tail."""
        return False

    def cut_metadata(self, position: int) -> dict[str, dict]:
        """Nothing beyond the cut's version: the upstream's own commit records its base cut."""
        return {}

    def _commits_unless_fed(self, table, start: int, end: int) -> list | None:
        """None: an upstream's target always has its Change Data Feed on and no deletion
        vectors (the sink writes neither otherwise), so the feed reads it; its commit files are
        not read to check."""
        return None

    def _require(self):
        if not self.table.exists():
            raise SourceError(f"ref('{self.spec.name}'): the consistent_stream model {self.spec.name} has no target "
                              f"at {self.spec.location}; run it first (dbt run -s +<this model>)")
        return self.table

    # ---- versions and their base cuts -------------------------------------------------------
    def metadata(self, version: int) -> dict:
        """The consistent_stream commit metadata of ``version`` (cached; versions are immutable)."""
        if version not in self._meta:
            latest = self._require().latest_version()
            for c in self.table.history(max(1, latest - version + 1)):
                if c.version not in self._meta and c.version >= version:
                    self._meta[c.version] = _decoded(c.metadata)
            if version not in self._meta:
                raise SourceError(f"ref('{self.spec.name}'): version {version} of {self.spec.location} is not in "
                                  f"its log (cleaned up?); run this model with --full-refresh")
        return self._meta[version]

    def latest_position(self) -> int:
        """The newest committed batch of the upstream (every target version is one)."""
        return self._require().latest_version()

    def base_positions(self, position: int) -> dict[str, int]:
        """The base cut version ``position`` reflects: base source key -> position.
        Raises SourceError when the version was not written by consistent_stream."""
        m = self.metadata(position)
        cut = m.get("base_cut") or m.get("cut")
        if not cut:
            raise SourceError(f"ref('{self.spec.name}'): version {position} of {self.spec.location} was not "
                              f"written by consistent_stream (no cut in its commit metadata); the target was "
                              f"changed by another writer. Run dbt run --full-refresh -s {self.spec.name}+")
        return {k: int(v) for k, v in cut.items()}

    def instants(self, position: int) -> dict[str, dict]:
        """The instants (:class:`~consistent_stream.plan.clock.Instant` as JSON) version
        ``position`` was computed at: its own, by the upstream's name, and those it recorded
        for its own upstream models (empty for versions of releases that recorded none)."""
        m = self.metadata(position)
        out = dict(m.get("upstream_instants") or {})
        if m.get("instant"):
            out[self.spec.name] = m["instant"]
        return out

    def versions_newest_first(self, below: int):
        """Versions ``below``, ``below - 1``, ... 0 of the upstream, lazily."""
        return range(below, -1, -1)

    def commit_ms(self, position: int) -> int:
        """When the newest base source commit the version reflects happened (ms since epoch)."""
        return int(self.metadata(position).get("source_commit_ms") or 0)

    def changes(self, views, start: int, end: int, columns: list[str] | None) -> SourceChanges:
        ch = super().changes(views, start, end, columns)
        return SourceChanges(ch.changelog, ch.rows, self.commit_ms(end) if start != end else None)

    def base_sources(self) -> dict[str, SourceSpec]:
        """Every base source under the upstream, by key (through its own upstream models),
        from the job specs beside the upstreams' checkpoints."""
        out: dict[str, SourceSpec] = {}
        for s in self.definition().sources:
            if s.format == MODEL_FORMAT:
                out.update(ModelSource(s).base_sources())
            else:
                out[s.key] = s
        return out

    def definition(self) -> "UpstreamDefinition":
        """The upstream's SQL and sources, from the job spec (``_consistent_stream/job.json``,
        written by :meth:`consistent_stream.spec.JobSpec.save`) in the checkpoint its newest
        commit names. Raises SourceError when that file is missing or unreadable."""
        ckpt = self.metadata(self.latest_position()).get("checkpoint_location")
        path = os.path.join(ckpt or "", "_consistent_stream", "job.json")
        d = read_json(path) if ckpt else None
        if not isinstance(d, dict) or "sql" not in d or "sources" not in d:
            raise SourceError(f"ref('{self.spec.name}'): the job spec of model {self.spec.name} is not at {path}; "
                              f"run dbt run -s {self.spec.name}")
        return UpstreamDefinition(d["sql"], [SourceSpec.from_json(s) for s in d["sources"]])


@dataclass(frozen=True)
class UpstreamDefinition:
    """What an upstream model computes: its SQL (Spark dialect, sources as relations) and its
    sources (:class:`SourceSpec`), as its job spec records them."""
    sql: str
    sources: list[SourceSpec]


def _decoded(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        if isinstance(v, str) and v[:1] in "{[":
            try:
                v = json.loads(v)
            except ValueError:
                pass
        out[k] = v
    return out
