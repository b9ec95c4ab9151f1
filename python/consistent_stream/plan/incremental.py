"""Evaluate a logical plan incrementally for one micro-batch: bottom-up, each operator maps
its inputs' changelogs to its output changelog (see ``consistent_stream.operators``)."""
from __future__ import annotations

from pyspark.sql import DataFrame

from ..changelog import consolidate
from ..operators.aggregate import aggregate_delta
from ..operators.dedup import dedup_delta
from ..operators.join import join_delta
from ..operators.linear import filter_delta, project_delta, reweight_delta
from ..state import StateStore
from .logical import Aggregate, Dedup, Filter, Join, Node, Project, Reweight, Scan, Union


class IncrementalEvaluator:
    """Holds one batch's source changelogs and state; ``delta(node)`` is memoized per node.

    ``source_deltas``: source key -> changelog DataFrame (source columns + ``__weight``).
    """

    def __init__(self, state: StateStore, source_deltas: dict[str, DataFrame], first_batch: bool):
        self.state, self.sources, self.first_batch = state, source_deltas, first_batch
        self.memo: dict[str, DataFrame] = {}
        self._persisted: list[DataFrame] = []

    def _keep(self, df: DataFrame) -> DataFrame:
        """Persist a changelog that is read more than once (by its consumer and by the
        arrangement commit); released by :meth:`release` after the batch commits."""
        df = df.persist()
        df.count()  # materialize now: later plans then see its real (small) size and broadcast it
        self._persisted.append(df)
        return df

    def release(self) -> None:
        for df in self._persisted:
            df.unpersist()
        self._persisted.clear()

    @staticmethod
    def consolidated(node: Node) -> bool:
        """Whether ``node``'s changelog is consolidated by construction: joins and aggregates
        consolidate their output, a filter keeps a subset; projections may merge rows."""
        if isinstance(node, (Join, Aggregate, Dedup)):
            return True
        if isinstance(node, Filter):
            return IncrementalEvaluator.consolidated(node.child)
        return False

    def _input(self, node: Node) -> DataFrame:
        """A stateful operator's input changelog, consolidated and materialized once."""
        d = self.delta(node)
        if isinstance(node, (Join, Aggregate, Dedup)):
            return d  # consolidated and materialized already
        return self._keep(d if self.consolidated(node) else consolidate(d))

    def delta(self, node: Node) -> DataFrame:
        if node.id not in self.memo:
            self.memo[node.id] = self._delta(node)
        return self.memo[node.id]

    def _delta(self, node: Node) -> DataFrame:
        if isinstance(node, Scan):
            d = self.sources[node.source.key]
            return d.select(*[d[f"`{s}`"].alias(c) for s, c in zip(node.source_columns, node.columns)], "__weight")
        if isinstance(node, Filter):
            return filter_delta(self.delta(node.child), node.predicate)
        if isinstance(node, Project):
            return project_delta(self.delta(node.child), node.columns, node.exprs)
        if isinstance(node, Union):
            # linear: d(A union all B) = dA union all dB
            return self.delta(node.left).unionByName(self.delta(node.right))
        if isinstance(node, Join):
            dl, dr = self._input(node.left), self._input(node.right)
            out = join_delta(self.state, node.id, node.kind, dl, dr,
                             node.left_keys, node.right_keys, node.residual,
                             node.left.columns, node.right.columns, node.null_safe)
            return self._keep(consolidate(out))
        if isinstance(node, Dedup):
            return self._keep(dedup_delta(self.state, node.id, self._input(node.child),
                                          node.partition, node.order))
        if isinstance(node, Reweight):
            return reweight_delta(self.delta(node.child), node.count)
        if isinstance(node, Aggregate):
            return self._keep(aggregate_delta(self.state, node.id, self._input(node.child),
                                              node.group_names, node.group_exprs, node.aggs, self.first_batch))
        raise TypeError(f"no delta rule for {type(node).__name__}")
