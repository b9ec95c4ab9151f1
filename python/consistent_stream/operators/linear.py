"""Linear operators: filter and project commute with Z-set addition, so their delta rule is
the operator itself: ``d(filter(A)) = filter(dA)``, ``d(project(A)) = project(dA)``.

Example: dA = {(k=1, x=5): +1, (k=2, x=-1): -1}; ``filter x > 0`` -> {(1, 5): +1}.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..changelog import WEIGHT


def filter_delta(delta: DataFrame, predicate: str) -> DataFrame:
    """Rows of ``delta`` whose ``predicate`` (Spark SQL) is TRUE; weights unchanged."""
    return delta.where(F.expr(predicate))


def project_delta(delta: DataFrame, names: list[str], exprs: list[str]) -> DataFrame:
    """``names[i] = exprs[i]`` per row, plus the unchanged ``__weight``."""
    return delta.select(*[F.expr(e).alias(n) for n, e in zip(names, exprs)], F.col(WEIGHT))


def reweight_delta(delta: DataFrame, count: str) -> DataFrame:
    """Each row's weight times its ``count`` column (a non-negative integer), which is
    dropped; rows whose weight becomes 0 are dropped. Linear: ``d(reweight(A)) =
    reweight(dA)``. In: columns incl. ``count`` + ``__weight``; out: the other columns +
    ``__weight``."""
    w = (F.col(WEIGHT) * F.col(f"`{count}`")).cast("bigint")
    return delta.select(*[F.col(f"`{c}`") for c in delta.columns if c not in (WEIGHT, count)],
                        w.alias(WEIGHT)).where(F.col(WEIGHT) != 0)
