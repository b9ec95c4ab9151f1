"""One cut across the DAG: which upstream versions and base source positions a batch reads.

A model's inputs are *base sources* (Delta tables, Debezium tables) and *upstream models*
(``ref()`` of consistent_stream models, :mod:`.model`). Every upstream version reflects a
base cut (base source -> position). A downstream cut is consistent when all its inputs agree
on every base *clock* they share: a Delta table is its own clock; all tables of one Debezium
landing directory share one (their positions are one transaction log's).

The rule (:func:`aligned_cut`), for the newest consistent cut:

1. start from each upstream's newest version;
2. bound each clock by the smallest position any chosen upstream version has for it;
3. move every upstream whose chosen version exceeds a bound back to its newest version
   within all bounds; repeat 2-3 until nothing moves (versions only go down, so it ends);
4. base sources read directly take the agreed position of their clock when an upstream
   shares it, else their newest position.

Because an upstream's base positions never decrease from one version to the next, the result
is the greatest consistent choice: it is at or after any consistent cut already consumed, so
a downstream never moves backwards. When some upstream has no version within the bounds (say
``a`` has versions at source ``s`` 5 and 7 and ``b`` only at 6) there is no consistent cut;
the first batch fails naming the models and their cuts, and a later run stays at the cut it
has (nothing to do) until the upstreams are run to an agreeing cut (``dbt run`` of the
upstreams from the same source versions, or of their common ancestors first).
"""
from __future__ import annotations

from ..errors import SourceError
from ..threads import at_once
from .formats import Source, open_source
from .model import ModelSource
from .spec import INITIAL


def latest_cut(sources: list[Source]) -> dict[str, int]:
    """The newest consistent cut of ``sources``: each clock's newest position, read once per
    clock so that all its sources share it (Delta's latest version; for Debezium sources the
    last complete transaction of their landing directory); with upstream models, the newest
    cut on which they and the base sources agree (:func:`aligned_cut`). The clocks are read
    at once (on an object store each is a LIST and a GET or more: one round trip for all).
    Raises SourceError when a clock has no position yet (a Debezium source before its
    connector's snapshot is read), saying what it waits for (:meth:`Source.waiting_for`)."""
    first = {}
    for s in sources:
        first.setdefault(s.clock, s)
    clocks = dict(zip(first, at_once(lambda s: s.latest_position(), list(first.values()), "latest-cut", limit=8)))
    for c, s in first.items():
        if clocks[c] == INITIAL:
            raise SourceError(f"source('{s.spec.source_name}', '{s.spec.name}') has nothing to read yet: "
                              f"{s.waiting_for()}")
    return aligned_cut(sources, {s.spec.key: clocks[s.clock] for s in sources})


def aligned_cut(sources: list, newest: dict[str, int]) -> dict[str, int]:
    """The newest consistent cut of ``sources`` (Source objects; model sources are
    :class:`~.model.ModelSource`) given each one's ``newest`` position (source key ->
    position). Returns source key -> position. Raises SourceError when no consistent cut
    exists, naming the upstream models and the base cuts of their newest versions."""
    models = [s for s in sources if isinstance(s, ModelSource)]
    if not models:
        return dict(newest)
    clocks: dict[str, str] = {}                      # base source key -> clock
    for m in models:
        clocks.update({k: open_source(s).clock for k, s in m.base_sources().items()})
    for s in sources:
        if not isinstance(s, ModelSource):
            clocks[s.spec.key] = s.clock

    def positions(m, version: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, p in m.base_positions(version).items():
            c = clocks.get(k, f"source:{k}")
            out[c] = min(out.get(c, p), p)
        return out

    chosen = {m.spec.key: newest[m.spec.key] for m in models}
    while True:
        bound: dict[str, int] = {}
        for m in models:
            for c, p in positions(m, chosen[m.spec.key]).items():
                bound[c] = min(bound.get(c, p), p)
        moved = False
        for m in models:
            v = chosen[m.spec.key]
            if all(p <= bound.get(c, p) for c, p in positions(m, v).items()):
                continue
            within = next((w for w in m.versions_newest_first(v - 1)
                           if all(p <= bound.get(c, p) for c, p in positions(m, w).items())), None)
            if within is None:
                raise SourceError(_disagree(models, newest, clocks))
            chosen[m.spec.key], moved = within, True
        if not moved:
            break
    cut = dict(chosen)
    for s in sources:
        if not isinstance(s, ModelSource):
            c = clocks[s.spec.key]
            cut[s.spec.key] = bound.get(c, newest[s.spec.key])
    return cut


def base_cut(sources: list, cut: dict[str, int]) -> dict[str, int]:
    """The base cut ``cut`` reflects: base source key -> position, through the upstreams'
    recorded base cuts (every source's :meth:`base_positions`)."""
    out: dict[str, int] = {}
    for s in sources:
        for k, p in s.base_positions(cut[s.spec.key]).items():
            if out.setdefault(k, p) != p:
                raise SourceError(f"cut {cut} is not consistent: base source {k} is at {out[k]} through one input "
                                  f"and at {p} through {s.spec.key}; nothing was written. This is a bug")
    return out


def _disagree(models, newest, clocks) -> str:
    lines = [f"ref('{m.spec.name}') version {newest[m.spec.key]} reflects {m.base_positions(newest[m.spec.key])}"
             for m in models]
    return ("the upstream models of this model never reflected the same base source versions, so no batch "
            "can read them at one consistent cut: " + "; ".join(lines) + ". Run the upstream models again "
            "from the same source versions (dbt run -s +<this model> runs them in order), then this model")
