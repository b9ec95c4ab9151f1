"""Compile a model's SQL (Spark dialect) into a logical plan of incremental operators.

Supported: SELECT with any deterministic Spark scalar expression, WHERE, CTEs and derived
tables; INNER, LEFT, RIGHT and FULL OUTER joins on equalities plus any residual predicate
(comma joins with the equality in WHERE too, in any FROM order), cross and theta joins;
semi and anti joins from ``[NOT] EXISTS``, ``IN``, ``NOT IN`` (with its NULL rules) and
``LEFT SEMI/ANTI JOIN``; scalar subqueries (uncorrelated, or correlated by equalities:
decorrelated to a join with the subquery grouped by its correlated columns), also in an
aggregating query's SELECT list and HAVING; GROUP BY with SUM, COUNT, COUNT(*), AVG, MIN,
MAX, their DISTINCT forms and FILTER clauses, HAVING; SELECT DISTINCT; UNION [ALL],
INTERSECT [ALL], EXCEPT [ALL]; window functions (:mod:`.windows`), QUALIFY, ORDER BY ..
LIMIT (:mod:`.topn`); the clock (:mod:`.clock`). A query block with a construct that has no
delta rule is recomputed (:mod:`.recompute`). What has no meaning at a cut (rand(), LIMIT
without ORDER BY) raises CompileError naming the construct and its line before anything is
written.

The passes, in order (each module's docstring has an example):

1. :mod:`.parse`: parse the SQL, reject unsupported constructs (``parse``), check the
   relations and qualify the columns (``resolve``);
2. :mod:`.lower`: lower the query to the logical plan (:mod:`.logical`), applying the rules
   :mod:`.joins` (joins and predicate pushdown), :mod:`.subqueries` (decorrelation of
   EXISTS, IN and scalar subqueries into joins), :mod:`.dedup` (ROW_NUMBER() = 1) and
   :mod:`.setops` (UNION, INTERSECT, EXCEPT, DISTINCT), :mod:`.windows` (window functions),
   :mod:`.topn` (ORDER BY .. LIMIT) and :mod:`.recompute` (the floor), over the shared
   context of :mod:`.scope` and the expression helpers of :mod:`.expressions`; then the
   rank filters become top-Ns (:func:`.windows.keep_ranks`) and the operators that read the
   clock temporal ones (:func:`.clock.temporal_operators`);
3. :func:`.keys.output_unique_key`: infer the output's unique key;
4. :func:`.prune.prune_columns`: drop the columns nothing above reads;
5. :func:`.logical.assign_ids`: number the operators (state tables are named by them).

>>> # compile_model("select o_custkey, count(*) n from tpch.orders group by o_custkey", ...)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..sources import SourceSpec
from .keys import output_unique_key
from .logical import Node, assign_ids
from .lower import lower
from .parse import parse, resolve
from .prune import prune_columns


@dataclass
class CompiledModel:
    """A model compiled to a plan. ``output_columns``: the target's column names in order;
    ``fingerprint``: changes whenever the SQL or the sources change (a new plan needs a
    full refresh); ``unique_key``: the smallest unique key inferred through the plan (output
    column names), None when the view is a bag (see :mod:`.keys`)."""
    sql: str
    root: Node
    output_columns: list[str]
    sources: list[SourceSpec]
    fingerprint: str
    unique_key: list[str] | None = None
    schema_key: str = ""
    """The sources' schemas the plan was typed for (set by ``job.compile_job``)."""
    plan_changes: list = field(default_factory=list)
    """How the checkpoint's saved plan has other operators (set by ``job.compile_job``,
    ``config_change.plan_changes``): empty when it has the same, or none."""


def compile_model(sql: str, sources: list[SourceSpec], schemas: dict[str, list[str]],
                  incremental_only: bool = False) -> CompiledModel:
    """Compile ``sql`` over ``sources`` (whose columns are ``schemas[source.key]``). A query
    block without a delta rule is maintained by recomputing it, unless ``incremental_only``.

    Raises CompileError (construct + line) for anything outside the supported SQL, and
    NoDeltaRule (a CompileError) for a block without a delta rule with ``incremental_only``.
    """
    by_relation = {s.relation_parts: s for s in sources}
    ast = resolve(parse(sql), by_relation, schemas, sql)
    root, outputs = lower(ast, by_relation, schemas, sql, incremental_only)
    unique_key = output_unique_key(root)
    prune_columns(root)
    assign_ids(root)
    return CompiledModel(sql=sql, root=root, output_columns=[internal for _, internal in outputs],
                         sources=sources, fingerprint=fingerprint(sql, sources), unique_key=unique_key)


STATE_FORMAT = 2
"""Version of the checkpoint's layout (plan, state); part of the fingerprint, so a checkpoint
of another layout asks for a full refresh instead of being misread. (The compensated
accumulators of SUM and AVG over floating point changed only those models' state: a
checkpoint with plain ones is found from its plan, :mod:`consistent_stream.config_change`.)"""


def fingerprint(sql: str, sources: list[SourceSpec]) -> str:
    """What a checkpoint was made for: the model SQL and its sources (key and location). A
    change of either needs a full refresh; computed without compiling."""
    h = hashlib.sha256()
    h.update(f"state format {STATE_FORMAT}|".encode())
    h.update(sql.strip().encode())
    for s in sorted(sources, key=lambda s: s.key):
        h.update(f"|{s.key}|{s.location}".encode())
    return h.hexdigest()[:16]
