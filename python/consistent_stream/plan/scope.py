"""What the lowering passes share while they plan one model: the context (:class:`Lowering`:
the SQL, its sources, the internal column names handed out so far and the ROW_NUMBER()
columns), the relations of a FROM clause (:class:`Rel`), the CTEs in scope and the names of
a query's outputs.

A *scope* (the ``scope`` parameter of the passes) maps ``(relation alias, column name)``,
lower case, to the internal column holding it in the plan built so far.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from ..sources import SourceSpec
from .logical import Node
from .parse import err


class Names:
    """Generator of plan-unique internal column names."""

    def __init__(self):
        self.used: set[str] = set()

    def new(self, base: str) -> str:
        """``base`` (made an identifier), with a suffix ``_2``, ``_3``, .. if already used."""
        base = re.sub(r"[^0-9a-zA-Z_]", "_", base)[:60] or "c"
        name, i = base, 1
        while name.lower() in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name.lower())
        return name


def quote(name: str) -> str:
    """The plan expression reading column ``name`` (backticked)."""
    return "`" + name.replace("`", "``") + "`"


@dataclass
class Lowering:
    """The context of lowering one model (every field is read and written only by the
    passes that document it).

    ``sql``: the model text (for error positions); ``sources``: the sources by their
    lower-case name parts; ``schemas[source.key]``: their columns; ``names``: the internal
    column names handed out so far. ``rank_columns`` and ``rank_filtered`` are the registry
    of ROW_NUMBER() columns (:mod:`.dedup`): every ROW_NUMBER() output planned as a dedup
    (internal name -> its :class:`~.dedup.Ranked`) and those a query read through its FROM
    clause. ``incremental_only``: a query without a delta rule is an error, not recomputed.
    """
    sql: str
    sources: dict[tuple[str, ...], SourceSpec]
    schemas: dict[str, list[str]]
    names: Names = field(default_factory=Names)
    rank_columns: dict[str, object] = field(default_factory=dict)
    rank_filtered: set[str] = field(default_factory=set)
    incremental_only: bool = False


PlanQuery = Callable[[Lowering, exp.Expression, dict], tuple[Node, list[tuple[str, str]]]]
"""How a pass lowers a nested query: ``(lw, query, ctes) -> (node, [(output name, internal
column)])`` (:func:`.lower.plan_query`, passed in by lowering so the rule modules do not
import it)."""


@dataclass
class Rel:
    """A planned relation in FROM: its node and its columns by (alias, column name)."""
    node: Node
    alias: str
    cols: dict[str, str] = field(default_factory=dict)  # column name -> internal


def with_ctes(q: exp.Expression, outer_ctes: dict[str, exp.Expression]) -> dict[str, exp.Expression]:
    """The CTEs visible in ``q``: ``outer_ctes`` plus those of its own WITH (by lower-case
    name; an inner one hides an outer one of the same name)."""
    ctes = dict(outer_ctes)
    with_ = q.args.get("with") or q.args.get("with_")
    if with_:
        for cte in with_.expressions:
            ctes[cte.alias_or_name.lower()] = cte.this
    return ctes


def output_names(lw: Lowering, sel: exp.Expression, select_exprs: list[exp.Expression],
                 top: bool) -> tuple[list[str], list[str]]:
    """The output names of a query's ``select_exprs`` (lower case) and their internal
    columns: new names from ``lw.names``, except for the model's own outputs (``top``),
    which keep their names as written (and reserve them).

    Raises CompileError when two outputs have the same name.
    """
    out_names = [e.alias_or_name for e in select_exprs]
    lowered = [n.lower() for n in out_names]
    dup = [n for n in lowered if lowered.count(n) > 1]
    if dup:
        both = " and ".join(e.unalias().sql(dialect="spark") for e, n in zip(select_exprs, lowered) if n == dup[0])
        raise err(f"duplicate output column {dup[0]} ({both})", "Spark cannot create a table with two "
                  "columns of one name: give each its own alias", sel, lw.sql)
    if top:
        lw.names.used.update(lowered)
        return lowered, out_names
    return lowered, [lw.names.new(n) for n in out_names]
