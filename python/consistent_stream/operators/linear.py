"""Linear operators: filter, project, expand, generate, union and reweight commute with Z-set
addition, so their delta rule is the operator itself: ``d(filter(A)) = filter(dA)``,
``d(project(A)) = project(dA)``, ``d(expand(A)) = expand(dA)``, ``d(generate(A)) =
generate(dA)``, ``d(A union all B) = dA union all dB``.

Example: dA = {(k=1, x=5): +1, (k=2, x=-1): -1}; ``filter x > 0`` -> {(1, 5): +1}.

Each rule maps a changelog (a FROM item of Spark SQL with its columns, the last
``__weight``) to the SELECT of its output.
"""
from __future__ import annotations

from ..changelog import WEIGHT, cols_sql, q


def filter_sql(relation: str, predicate: str) -> str:
    """Rows of ``relation`` whose ``predicate`` (Spark SQL) is TRUE; weights unchanged."""
    return f"SELECT * FROM {relation} WHERE {predicate}"


def project_sql(relation: str, names: list[str], exprs: list[str]) -> str:
    """``names[i] = exprs[i]`` per row, plus the unchanged ``__weight``."""
    sel = ", ".join(f"{e} AS {q(n)}" for n, e in zip(names, exprs))
    return f"SELECT {sel}, {q(WEIGHT)} FROM {relation}"


def expand_sql(relation: str, names: list[str], projections: list[list[str]]) -> str:
    """Each row once per projection, ``names[i] = projection[i]``, its ``__weight`` unchanged
    (Spark's Expand, for grouping sets): a UNION ALL of one projection each."""
    return " UNION ALL ".join(project_sql(relation, names, p) for p in projections)


def generate_sql(relation: str, columns: list[str], generator: str, outer: bool, names: list[str]) -> str:
    """Each row of ``relation`` (its ``columns`` + ``__weight``) followed by each row of the
    Spark SQL ``generator`` over it as ``names``, the row's ``__weight`` unchanged (Spark's
    ``LATERAL VIEW [OUTER]``)."""
    view = f"LATERAL VIEW {'OUTER ' if outer else ''}{generator} `__gen` AS {cols_sql(names)}"
    return f"SELECT {cols_sql(columns)}, {cols_sql(names)}, {q(WEIGHT)} FROM {relation} `__gen_in` {view}"


def union_sql(left: str, right: str, columns: list[str]) -> str:
    """UNION ALL of two changelogs with the same ``columns`` (weights added by position)."""
    c = cols_sql(columns)
    return f"SELECT {c} FROM {left} UNION ALL SELECT {c} FROM {right}"


def reweight_sql(relation: str, columns: list[str], count: str) -> str:
    """Each row's weight times its ``count`` column (a non-negative integer), which is
    dropped; rows whose weight becomes 0 are dropped. In: ``columns`` incl. ``count`` +
    ``__weight``; out: the other columns + ``__weight``."""
    keep = [c for c in columns if c not in (WEIGHT, count)]
    w = f"CAST({q(WEIGHT)} * {q(count)} AS BIGINT)"
    return f"SELECT {cols_sql(keep)}, {w} AS {q(WEIGHT)} FROM {relation} WHERE {w} <> 0"
