"""Compile a model's SQL (Spark dialect) into a logical plan of incremental operators.

Supported: SELECT with any deterministic Spark scalar expression, WHERE, CTEs and derived
tables; INNER, LEFT, RIGHT and FULL OUTER joins on at least one equality plus any residual
predicate (comma joins with the equality in WHERE too); semi and anti joins from
``[NOT] EXISTS``, ``IN``, ``NOT IN`` (with its NULL rules) and ``LEFT SEMI/ANTI JOIN``;
scalar subqueries (uncorrelated, or correlated by equalities: decorrelated to a join with
the subquery grouped by its correlated columns); GROUP BY with SUM, COUNT, COUNT(*), AVG,
MIN, MAX, their DISTINCT forms and FILTER clauses, HAVING; SELECT DISTINCT; UNION [ALL],
INTERSECT [ALL], EXCEPT [ALL]; ``ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..)`` filtered
to 1 by the enclosing query (dedup). Everything else raises CompileError naming the
construct and its line before anything is written.

>>> # compile_model("select o_custkey, count(*) n from tpch.orders group by o_custkey", ...)
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.qualify import qualify

from ..errors import CompileError
from ..sources import SourceSpec
from .keys import output_unique_key
from .prune import prune_columns
from .logical import (Aggregate, AggCall, Dedup, Filter, Join, Node, Project, Reweight, Scan, SortKey, Union,
                      assign_ids)

_AGGS = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Count: "count"}

# constructs with their readable names; any of these anywhere in the query is rejected
_UNSUPPORTED: list[tuple[type, str, str]] = [
    (exp.Order, "ORDER BY", "a materialized view has no row order; sort when you read it"),
    (exp.Limit, "LIMIT", "a top-N view is not maintained incrementally yet"),
    (exp.Offset, "OFFSET", "not maintained incrementally"),
    (exp.Lateral, "LATERAL VIEW", "not supported"),
    (exp.Pivot, "PIVOT", "not supported"),
    (exp.Qualify, "QUALIFY", "filter ROW_NUMBER() = 1 in an enclosing query instead"),
    (exp.Cube, "CUBE", "not supported"),
    (exp.Rollup, "ROLLUP", "not supported"),
    (exp.GroupingSets, "GROUPING SETS", "not supported"),
    (exp.TableSample, "TABLESAMPLE", "a sample has no incremental meaning"),
    (exp.Rand, "rand()", "non-deterministic functions have no meaning at a cut"),
    (exp.CurrentTimestamp, "current_timestamp()", "non-deterministic functions have no meaning at a cut"),
    (exp.CurrentDate, "current_date()", "non-deterministic functions have no meaning at a cut"),
    (exp.Uuid, "uuid()", "non-deterministic functions have no meaning at a cut"),
]
_NONDETERMINISTIC_NAMES = {"rand", "random", "randn", "uuid", "now", "current_timestamp", "current_date",
                           "monotonically_increasing_id", "spark_partition_id", "shuffle", "input_file_name"}


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


def _position(node: exp.Expression, sql: str) -> tuple[int | None, int | None]:
    if isinstance(node, exp.SetOperation):  # the keyword stands before its right-hand query
        node = node.expression
    for n in [node, *node.walk()]:
        m = getattr(n, "meta", None) or {}
        if "line" in m:
            return m["line"], m.get("col")
        if isinstance(n, exp.Identifier) and n.meta.get("line"):
            return n.meta["line"], n.meta.get("col")
    # fall back to the first keyword of the construct in the text
    word = re.escape(node.sql(dialect="spark").split("(")[0].split()[0]) if node.sql() else None
    if word:
        m = re.search(word, sql, re.IGNORECASE)
        if m:
            line = sql.count("\n", 0, m.start()) + 1
            return line, m.start() - (sql.rfind("\n", 0, m.start()) + 1) + 1
    return None, None


def _err(construct: str, detail: str, node: exp.Expression | None, sql: str) -> CompileError:
    line, col = _position(node, sql) if node is not None else (None, None)
    return CompileError(construct, detail, line, col)


class _Names:
    """Generator of plan-unique internal column names."""

    def __init__(self):
        self.used: set[str] = set()

    def new(self, base: str) -> str:
        base = re.sub(r"[^0-9a-zA-Z_]", "_", base)[:60] or "c"
        name, i = base, 1
        while name.lower() in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name.lower())
        return name


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass
class _Rel:
    """A planned relation in FROM: its node and its columns by (alias, column name)."""
    node: Node
    alias: str
    cols: dict[str, str] = field(default_factory=dict)  # column name -> internal


class _Compiler:
    def __init__(self, sql: str, sources: list[SourceSpec], schemas: dict[str, list[str]]):
        self.sql = sql
        self.sources = {s.relation_parts: s for s in sources}
        self.schemas = schemas
        self.names = _Names()
        self.rank_columns: dict[str, exp.Expression] = {}  # ROW_NUMBER() column (internal) -> its window
        self.rank_filtered: set[str] = set()  # those an enclosing query filters to 1

    # ---- entry -------------------------------------------------------------------------------
    def compile(self) -> tuple[Node, list[str]]:
        try:
            statements = [s for s in sqlglot.parse(self.sql, read="spark") if s is not None]
        except ParseError as e:
            err = e.errors[0] if e.errors else {}
            raise CompileError("SQL syntax", err.get("description", str(e)), err.get("line"), err.get("col")) from e
        if len(statements) != 1:
            raise CompileError("multiple statements", "a model is exactly one SELECT")
        ast = statements[0]
        self._reject_unsupported(ast)
        if not isinstance(ast, (exp.Select, exp.SetOperation)):
            raise _err(type(ast).__name__.upper(), "a model is one query (SELECT, or a UNION, INTERSECT "
                       "or EXCEPT of queries)", ast, self.sql)
        schema: dict = {}
        for parts, src in self.sources.items():
            d = schema
            for p in parts[:-1]:
                d = d.setdefault(p, {})
            d[parts[-1]] = {c: "string" for c in self.schemas[src.key]}
        self._check_relations(ast)
        try:
            ast = qualify(ast, schema=schema, dialect="spark", quote_identifiers=False,
                          validate_qualify_columns=True, identify=False)
        except OptimizeError as e:
            raise CompileError("column reference", f"{e} (check the column names against the sources)") from e
        rel_node, outputs = self._plan_query(ast, {}, top=True)
        for rn, window in self.rank_columns.items():
            if rn not in self.rank_filtered:
                raise _err("window function ROW_NUMBER()", "filter it to 1 in the query that reads it "
                           "(FROM (..) d WHERE d.rn = 1): only the first row per partition is maintained",
                           window, self.sql)
        return rel_node, outputs

    def _reject_unsupported(self, ast: exp.Expression) -> None:
        for node in ast.walk():
            if isinstance(node, exp.Distinct) and isinstance(node.parent, exp.AggFunc):
                if type(node.parent) not in _AGGS or len(node.expressions) != 1:
                    raise _err(f"{type(node.parent).__name__.upper()}(DISTINCT ..)",
                               "DISTINCT is supported in COUNT, SUM, AVG, MIN and MAX of one argument",
                               node.parent, self.sql)
            if isinstance(node, exp.Distinct) and node.args.get("on"):
                raise _err("DISTINCT ON", "not supported; use ROW_NUMBER() .. = 1 (dedup_before_join)", node, self.sql)
            for typ, name, hint in _UNSUPPORTED:
                if isinstance(node, typ) and not (isinstance(node, exp.Order) and isinstance(node.parent, exp.Window)):
                    raise _err(name, hint, node, self.sql)
            if isinstance(node, exp.Window) and not isinstance(node.this, exp.RowNumber):
                fname = node.this.sql_name() if isinstance(node.this, exp.Func) else type(node.this).__name__
                raise _err(f"window function {fname.upper()}()", "only ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..) "
                           "filtered to = 1 by an enclosing query is maintained (dedup); use GROUP BY "
                           "aggregates for the rest", node, self.sql)
            if isinstance(node, exp.Anonymous) and node.name.lower() in _NONDETERMINISTIC_NAMES:
                raise _err(f"{node.name}()", "non-deterministic functions have no meaning at a cut", node, self.sql)
            if isinstance(node, exp.AggFunc) and type(node) not in _AGGS:
                raise _err(f"aggregate {node.sql_name() if hasattr(node, 'sql_name') else type(node).__name__}",
                           "supported aggregates: SUM, COUNT, COUNT(*), AVG, MIN, MAX (also with DISTINCT "
                           "and FILTER)", node, self.sql)

    def _check_relations(self, ast: exp.Expression) -> None:
        ctes = {c.alias_or_name.lower() for c in ast.find_all(exp.CTE)}
        for t in ast.find_all(exp.Table):
            parts = tuple(p.name.lower() for p in t.parts)
            if len(parts) == 1 and parts[0] in ctes:
                continue
            if parts not in self.sources:
                raise _err(f"relation {t.sql(dialect='spark')}",
                           "it is neither a source with meta.consistent_stream nor ref() of a "
                           "consistent_stream, view or ephemeral model (declare it as a dbt source with "
                           "meta.consistent_stream, or read it through ref())", t, self.sql)

    # ---- relations ---------------------------------------------------------------------------
    def _plan_relation(self, rel: exp.Expression, ctes: dict[str, exp.Expression],
                       used: dict[str, set[str]]) -> _Rel:
        alias = rel.alias_or_name
        if isinstance(rel, exp.Table):
            parts = tuple(p.name.lower() for p in rel.parts)
            if len(parts) == 1 and parts[0] in ctes:
                node, outs = self._plan_query(ctes[parts[0]], ctes)
                return _Rel(node, alias, dict(outs))
            src = self.sources[parts]
            # projection pruning: read only the columns this scope references
            want = used.get(alias.lower(), set())
            cols = [c for c in self.schemas[src.key] if c.lower() in want] or \
                [next((c for c in self.schemas[src.key] if c.lower() in src.primary_key), self.schemas[src.key][0])]
            internal = [self.names.new(f"{alias}__{c}") for c in cols]
            node = Scan(columns=internal, source=src, source_columns=cols)
            return _Rel(node, alias, dict(zip([c.lower() for c in cols], internal)))
        if isinstance(rel, exp.Subquery):
            node, outs = self._plan_query(rel.this, ctes)
            return _Rel(node, alias, dict(outs))
        raise _err(type(rel).__name__, "unsupported relation in FROM", rel, self.sql)

    # ---- expressions -------------------------------------------------------------------------
    def _translate(self, e: exp.Expression, scope: dict[tuple[str, str], str]) -> str:
        """Spark SQL text of ``e`` with column references replaced by internal names
        (scalar subqueries already planned are read from their value column)."""
        def fn(n):
            if isinstance(n, exp.Subquery) and "cs_column" in n.meta:
                return exp.column(n.meta["cs_column"], quoted=True)
            if isinstance(n, exp.Column):
                key = (n.table.lower(), n.name.lower())
                if key not in scope:
                    raise _err(f"column {n.sql(dialect='spark')}", "not visible here (correlated references are "
                               "supported in WHERE conditions of EXISTS, IN and scalar subqueries)", n, self.sql)
                return exp.column(scope[key], quoted=True)
            if isinstance(n, (exp.Subquery, exp.Exists)) or (isinstance(n, exp.In) and n.args.get("query")):
                raise _err("subquery here", "subqueries are supported as WHERE conditions ([NOT] EXISTS, "
                           "[NOT] IN) and as scalar values in WHERE and in the SELECT list of a query "
                           "without GROUP BY", n, self.sql)
            return n
        return e.copy().transform(fn).sql(dialect="spark")

    @staticmethod
    def _aliases(e: exp.Expression) -> set[str]:
        return {c.table.lower() for c in _own_columns(e)}

    # ---- queries -----------------------------------------------------------------------------
    def _plan_query(self, q: exp.Expression, outer_ctes: dict, top: bool = False) -> tuple[Node, list]:
        """A SELECT, or a set operation of queries (columns by position, names from the left):
        UNION ALL is linear; UNION is UNION ALL then DISTINCT; INTERSECT and EXCEPT are a
        semi and an anti join of DISTINCT(left) with the right on all columns (NULLs equal);
        INTERSECT ALL / EXCEPT ALL join the rows' counts and repeat each row min(m, n) /
        max(m - n, 0) times."""
        if isinstance(q, exp.Subquery):
            q = q.this
        if not isinstance(q, exp.SetOperation):
            return self._plan_select(q, outer_ctes, top)
        ctes = self._with_ctes(q, outer_ctes)
        left, louts = self._plan_query(q.this, ctes)
        right, routs = self._plan_query(q.expression, ctes)
        op = type(q).__name__.upper()
        if len(louts) != len(routs):
            raise _err(f"{op} of queries with different numbers of columns",
                       f"{len(louts)} columns on the left, {len(routs)} on the right", q, self.sql)
        if top:
            names = [n for n, _ in louts]
            self.names.used.update(n.lower() for n in names)
        else:
            names = [self.names.new(n) for n, _ in louts]
        l_ = Project(columns=names, child=left, exprs=[_q(i) for _, i in louts])
        distinct = q.args.get("distinct") is not False
        if isinstance(q, exp.Union):
            r = Project(columns=names, child=right, exprs=[_q(i) for _, i in routs])
            node: Node = Union(columns=names, left=l_, right=r)
            if distinct:
                node = self._distinct(node)
            return node, list(zip([n.lower() for n, _ in louts], names))
        rnames = [self.names.new(f"{n}_r") for n in names]
        r = Project(columns=rnames, child=right, exprs=[_q(i) for _, i in routs])
        lk, rk = [_q(n) for n in names], [_q(n) for n in rnames]
        if distinct:
            node = Join(columns=list(names), left=self._distinct(l_), right=r,
                        kind="semi" if isinstance(q, exp.Intersect) else "anti",
                        left_keys=lk, right_keys=rk, null_safe=True)
        else:
            ca, cb, n = self.names.new("__count_l"), self.names.new("__count_r"), self.names.new("__times")
            la = Aggregate(columns=names + [ca], child=l_, group_names=list(names), group_exprs=lk,
                           aggs=[AggCall(ca, "count_star", None)])
            rb = Aggregate(columns=rnames + [cb], child=r, group_names=list(rnames), group_exprs=rk,
                           aggs=[AggCall(cb, "count_star", None)])
            if isinstance(q, exp.Intersect):
                j = Join(columns=la.columns + rb.columns, left=la, right=rb, kind="inner",
                         left_keys=lk, right_keys=rk, null_safe=True)
                times = f"least({_q(ca)}, {_q(cb)})"
            else:
                j = Join(columns=la.columns + rb.columns, left=la, right=rb, kind="left",
                         left_keys=lk, right_keys=rk, null_safe=True)
                times = f"greatest({_q(ca)} - coalesce({_q(cb)}, 0), 0)"
            p = Project(columns=names + [n], child=j, exprs=lk + [times])
            node = Reweight(columns=list(names), child=p, count=n)
        return node, list(zip([n.lower() for n, _ in louts], names))

    @staticmethod
    def _with_ctes(q: exp.Expression, outer_ctes: dict) -> dict:
        ctes = dict(outer_ctes)
        with_ = q.args.get("with") or q.args.get("with_")
        if with_:
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = cte.this
        return ctes

    @staticmethod
    def _distinct(node: Node) -> Node:
        """SELECT DISTINCT: a GROUP BY of every column without aggregates (a row is in the
        output while its count is above zero)."""
        return Aggregate(columns=list(node.columns), child=node, group_names=list(node.columns),
                         group_exprs=[_q(c) for c in node.columns], aggs=[])

    def _plan_select(self, sel: exp.Expression, outer_ctes: dict, top: bool = False) -> tuple[Node, list]:
        if not isinstance(sel, exp.Select):
            raise _err(type(sel).__name__.upper(), "only SELECT is supported here", sel, self.sql)
        ctes = self._with_ctes(sel, outer_ctes)
        from_ = sel.args.get("from") or sel.args.get("from_")
        if from_ is None:
            raise _err("SELECT without FROM", "a model reads at least one source", sel, self.sql)
        joins = sel.args.get("joins") or []
        used: dict[str, set[str]] = {}
        for c in sel.find_all(exp.Column):  # nested subqueries too: their correlated references
            used.setdefault(c.table.lower(), set()).add(c.name.lower())
        rels = [self._plan_relation(r, ctes, used) for r in [from_.this] + [j.this for j in joins]]
        by_alias = {r.alias.lower(): r for r in rels}
        if len(by_alias) != len(rels):
            raise _err("duplicate table alias", "give every relation in FROM its own alias", sel, self.sql)

        where = sel.args.get("where")
        where_conj = list(_conjuncts(where.this)) if where else []
        where_conj = self._take_rank_filters(where_conj, rels, sel)
        sub_conj = [c for c in where_conj if _subquery_predicate(c) is not None]
        where_conj = [c for c in where_conj if _subquery_predicate(c) is None]

        null_supplied: set[str] = set()
        hidden: set[str] = set()  # right sides of semi/anti joins: not visible after the join
        for i, j in enumerate(joins):
            side, kind = (j.side or "").upper(), (j.kind or "").upper()
            if j.args.get("using"):
                raise _err("JOIN .. USING", "not supported yet; write the equality in ON", j, self.sql)
            if kind in ("SEMI", "ANTI"):
                hidden.add(rels[i + 1].alias.lower())
            elif side == "LEFT":
                null_supplied.add(rels[i + 1].alias.lower())
            elif side == "RIGHT":
                null_supplied.update(r.alias.lower() for r in rels[: i + 1])
            elif side == "FULL":
                null_supplied.update(r.alias.lower() for r in rels[: i + 2])

        # push single-relation WHERE predicates into their relation (not below outer joins)
        remaining = []
        for c in where_conj:
            al = self._aliases(c)
            if (len(al) == 1 and next(iter(al)) in by_alias and next(iter(al)) not in null_supplied
                    and not c.find(exp.AggFunc, exp.Subquery)):
                r = by_alias[next(iter(al))]
                r.node = Filter(columns=r.node.columns, child=r.node,
                                predicate=self._translate(c, {(r.alias.lower(), k): v for k, v in r.cols.items()}))
            else:
                remaining.append(c)
        where_conj = remaining

        scope: dict[tuple[str, str], str] = {}
        for k, v in rels[0].cols.items():
            scope[(rels[0].alias.lower(), k)] = v
        current = rels[0].node
        left_aliases = {rels[0].alias.lower()}
        for j, r in zip(joins, rels[1:]):
            current, where_conj = self._plan_join(j, r, current, scope, left_aliases, where_conj)
            if r.alias.lower() not in hidden:
                scope.update({(r.alias.lower(), k): v for k, v in r.cols.items()})
                left_aliases.add(r.alias.lower())

        for c in sub_conj:
            current = self._plan_subquery_predicate(c, current, scope, ctes)

        select_exprs = sel.expressions
        group = sel.args.get("group")
        having = sel.args.get("having")
        has_agg = any(_has_aggregate(e) for e in select_exprs) or having is not None or group is not None
        current, scope = self._plan_scalar_subqueries(where_conj + ([] if has_agg else list(select_exprs)),
                                                      current, scope, ctes)
        if where_conj:
            current = Filter(columns=current.columns, child=current,
                             predicate=" AND ".join(self._translate(c, scope) for c in where_conj))

        windows = [e for e in select_exprs if e.find(exp.Window)]
        if windows:
            return self._plan_dedup(sel, current, scope, windows, top)
        if has_agg:
            current, post_scope = self._plan_aggregate(current, scope, group, select_exprs, having)
            if having is not None:
                current = Filter(columns=current.columns, child=current,
                                 predicate=self._translate_post(having.this, post_scope))
            exprs = [self._translate_post(e.unalias() if isinstance(e, exp.Alias) else e, post_scope)
                     for e in select_exprs]
        else:
            exprs = [self._translate(e.unalias() if isinstance(e, exp.Alias) else e, scope) for e in select_exprs]

        lowered, internal = self._output_names(sel, select_exprs, top)
        node = Project(columns=internal, child=current, exprs=exprs)
        if sel.args.get("distinct"):
            node = self._distinct(node)
        return node, list(zip(lowered, internal))

    def _output_names(self, sel, select_exprs, top: bool) -> tuple[list[str], list[str]]:
        out_names = [e.alias_or_name for e in select_exprs]
        lowered = [n.lower() for n in out_names]
        dup = {n for n in lowered if lowered.count(n) > 1}
        if dup:
            raise _err(f"duplicate output column {sorted(dup)[0]}", "give every output column its own name",
                       sel, self.sql)
        if top:
            self.names.used.update(lowered)
            return lowered, out_names
        return lowered, [self.names.new(n) for n in out_names]

    # ---- joins -------------------------------------------------------------------------------
    def _plan_join(self, j: exp.Join, r: _Rel, current: Node, scope: dict, left_aliases: set[str],
                   where_conj: list) -> tuple[Node, list]:
        """One JOIN of the FROM clause onto the plan so far. Equalities between the two sides
        become the join keys (for an inner join also those written in WHERE); every other ON
        condition is the residual, except that a condition on the null-supplying side alone
        is pushed into that side."""
        ra = r.alias.lower()
        rscope = {(ra, k): v for k, v in r.cols.items()}
        side, kind = (j.side or "").upper(), (j.kind or "").upper()
        on = list(_conjuncts(j.args["on"])) if j.args.get("on") else []
        inner = side == "" and kind not in ("SEMI", "ANTI")
        lkeys, rkeys, residual = [], [], []
        for c in on + (where_conj if inner else []):
            pair = self._equi(c, left_aliases, ra)
            if pair is not None:
                lkeys.append(self._translate(pair[0], scope))
                rkeys.append(self._translate(pair[1], rscope))
                if inner:
                    where_conj = [w for w in where_conj if w is not c]
            elif any(c is o for o in on):
                if c.find(exp.Subquery, exp.Exists):
                    raise _err("subquery in a join condition", "move it to WHERE", c, self.sql)
                residual.append(c)
        if not lkeys:
            raise _err("join without an equality condition", "every join needs at least one "
                       "`left_column = right_column` condition (cross and theta joins are not maintained)",
                       j, self.sql)
        left_node, right_node = current, r.node
        if side == "LEFT" and kind not in ("SEMI", "ANTI"):
            pushed = [c for c in residual if self._aliases(c) <= {ra}]
            if pushed:
                right_node = Filter(columns=right_node.columns, child=right_node,
                                    predicate=" AND ".join(self._translate(c, rscope) for c in pushed))
            residual = [c for c in residual if all(c is not p for p in pushed)]
        elif side == "RIGHT":
            pushed = [c for c in residual if self._aliases(c) <= left_aliases]
            if pushed:
                left_node = Filter(columns=left_node.columns, child=left_node,
                                   predicate=" AND ".join(self._translate(c, scope) for c in pushed))
            residual = [c for c in residual if all(c is not p for p in pushed)]
        res_sql = " AND ".join(self._translate(c, {**scope, **rscope}) for c in residual) or None
        if side == "RIGHT":
            return Join(columns=right_node.columns + left_node.columns, left=right_node, right=left_node,
                        kind="left", left_keys=rkeys, right_keys=lkeys, residual=res_sql), where_conj
        if kind in ("SEMI", "ANTI"):
            return Join(columns=list(left_node.columns), left=left_node, right=right_node, kind=kind.lower(),
                        left_keys=lkeys, right_keys=rkeys, residual=res_sql), where_conj
        return Join(columns=left_node.columns + right_node.columns, left=left_node, right=right_node,
                    kind={"LEFT": "left", "FULL": "full"}.get(side, "inner"),
                    left_keys=lkeys, right_keys=rkeys, residual=res_sql), where_conj

    def _equi(self, c: exp.Expression, left_aliases: set[str], right_aliases: str | set[str]):
        """``(left expr, right expr)`` when ``c`` is an equality between the two sides."""
        right_aliases = {right_aliases} if isinstance(right_aliases, str) else right_aliases
        if not isinstance(c, exp.EQ):
            return None
        a, b = c.this, c.expression
        aa, ba = self._aliases(a), self._aliases(b)
        if aa and aa <= left_aliases and ba and ba <= right_aliases:
            return a, b
        if ba and ba <= left_aliases and aa and aa <= right_aliases:
            return b, a
        return None

    # ---- subqueries --------------------------------------------------------------------------
    def _decorrelate(self, sub: exp.Select, outer_scope: dict) -> tuple[exp.Select, list, list]:
        """Split a subquery's WHERE into its own conditions and the correlated ones (those
        naming a relation of the enclosing query). Returns the subquery without the correlated
        conditions, the correlated equalities ``(inner expr, outer expr)`` and the other
        correlated conditions."""
        if not isinstance(sub, exp.Select):
            return sub, [], []
        inner = {r.alias_or_name.lower() for r in _from_relations(sub)}
        outer = {a for a, _ in outer_scope}
        where = sub.args.get("where")
        own, eqs, other = [], [], []
        for c in (_conjuncts(where.this) if where else []):
            al = self._aliases(c)
            if al <= inner:
                own.append(c)
                continue
            if not (al - inner) <= outer:
                raise _err(f"column reference in {c.sql(dialect='spark')}", "not visible here", c, self.sql)
            pair = self._equi(c, inner, outer)
            if pair is not None:
                eqs.append(pair)
            else:
                other.append(c)
        new = sub.copy()
        new.set("where", exp.Where(this=exp.and_(*[o.copy() for o in own])) if own else None)
        return new, eqs, other

    def _plan_subquery_predicate(self, c: exp.Expression, current: Node, scope: dict, ctes: dict) -> Node:
        """``[NOT] EXISTS (q)`` and ``x [NOT] IN (q)`` as WHERE conjuncts: a semi or anti join
        with the decorrelated subquery, on its correlated equalities (and ``x = q's column``),
        the other correlated conditions as the residual. ``NOT IN`` keeps SQL's NULL rules:
        ``x NOT IN q`` is TRUE iff q is empty, or x is not NULL, matches nothing and q holds no
        NULL; q's row and NULL counts come from a global aggregate joined to every row."""
        negated, pred = _subquery_predicate(c)
        if isinstance(pred, exp.Exists):
            sub, in_expr = pred.this, None
        else:
            sub, in_expr = pred.args["query"].this, pred.this
            if isinstance(in_expr, exp.Tuple):
                raise _err("IN with several columns", "compare one column, or use EXISTS", pred, self.sql)
        sub_ctes = self._with_ctes(sub, ctes)
        new, eqs, other = self._decorrelate(sub, scope)
        correlated = bool(eqs or other)
        if correlated and (new.args.get("group") or any(e.find(exp.AggFunc) for e in new.expressions)):
            raise _err("correlated subquery with aggregates", "only scalar subqueries may aggregate; "
                       "rewrite as a join with a derived table", pred, self.sql)
        if negated and in_expr is not None and correlated:
            raise _err("correlated NOT IN", "use NOT EXISTS (NOT IN's NULL rules make it a different "
                       "query)", pred, self.sql)
        # the subquery's columns the conditions need, as outputs __c0, __c1, ..
        inner_aliases = {r.alias_or_name.lower() for r in _from_relations(sub)} if isinstance(sub, exp.Select) else set()
        inner_cols: list[exp.Column] = []
        for cond in [i for i, _ in eqs] + other:
            for col in _own_columns(cond):
                if col.table.lower() in inner_aliases and all(col != x for x in inner_cols):
                    inner_cols.append(col)
        outs = [exp.alias_(x.copy(), f"__c{i}") for i, x in enumerate(inner_cols)]
        if in_expr is not None:
            if not isinstance(new, exp.Select):  # a set operation: one column by position
                node, souts = self._plan_query(new, sub_ctes)
                if len(souts) != 1:
                    raise _err("IN subquery with several columns", "select exactly one column", pred, self.sql)
                inner_map, in_col = {}, souts[0][1]
            else:
                if len(new.expressions) != 1:
                    raise _err("IN subquery with several columns", "select exactly one column", pred, self.sql)
                new.set("expressions", [exp.alias_(new.expressions[0].unalias().copy(), "__in")] + outs)
                node, souts = self._plan_select(new, sub_ctes)
                inner_map, in_col = dict(souts), dict(souts)["__in"]
        else:
            new.set("expressions", outs or [exp.alias_(exp.Literal.number(1), "__one")])
            node, souts = self._plan_select(new, sub_ctes)
            inner_map, in_col = dict(souts), None
        inner_scope = {(x.table.lower(), x.name.lower()): inner_map[f"__c{i}"] for i, x in enumerate(inner_cols)}
        lkeys = [self._translate(o, scope) for _, o in eqs]
        rkeys = [self._translate(i, inner_scope) for i, _ in eqs]
        if in_col is not None:
            lkeys.append(self._translate(in_expr, scope))
            rkeys.append(_q(in_col))
        if not lkeys:  # uncorrelated EXISTS, or only non-equality correlation
            lkeys, rkeys = ["1"], ["1"]
        residual = " AND ".join(self._translate(o, {**scope, **inner_scope}) for o in other) or None
        if negated and in_col is not None:
            counted, couts = self._plan_query(sub.copy(), sub_ctes)
            n, nn = self.names.new("__in_rows"), self.names.new("__in_nonnull")
            agg = Aggregate(columns=[n, nn], child=counted, aggs=[AggCall(n, "count_star", None),
                                                                  AggCall(nn, "count", _q(couts[0][1]))])
            current = Join(columns=current.columns + agg.columns, left=current, right=agg, kind="inner",
                           left_keys=["1"], right_keys=["1"])
            current = Join(columns=list(current.columns), left=current, right=node, kind="anti",
                           left_keys=lkeys, right_keys=rkeys)
            return Filter(columns=list(current.columns), child=current,
                          predicate=f"{_q(n)} = 0 OR ({lkeys[-1]} IS NOT NULL AND {_q(n)} = {_q(nn)})")
        return Join(columns=list(current.columns), left=current, right=node, kind="anti" if negated else "semi",
                    left_keys=lkeys, right_keys=rkeys, residual=residual)

    def _plan_scalar_subqueries(self, exprs: list, current: Node, scope: dict, ctes: dict) -> tuple[Node, dict]:
        """Plan each scalar subquery in ``exprs`` as a join and mark it with the column that
        holds its value (read by :meth:`_translate`).

        Uncorrelated: a global aggregate (exactly one row) joined to every row. Correlated by
        equalities: the subquery grouped by its correlated columns, LEFT joined on them; a row
        without a group gets the aggregate's value over no rows (COUNT 0, others NULL), which
        avoids the classic COUNT bug of this decorrelation."""
        scope = dict(scope)
        for e in exprs:
            for sq in list(e.walk(prune=lambda n: isinstance(n, exp.Subquery))):
                if not isinstance(sq, exp.Subquery) or isinstance(sq.parent, exp.In):
                    continue
                current, col = self._scalar_subquery(sq, current, scope, ctes)
                sq.meta["cs_column"] = col
        return current, scope

    def _scalar_subquery(self, sq: exp.Subquery, current: Node, scope: dict, ctes: dict) -> tuple[Node, str]:
        sub = sq.this
        if not isinstance(sub, exp.Select) or len(sub.expressions) != 1:
            raise _err("scalar subquery", "a scalar subquery selects exactly one value", sq, self.sql)
        if sub.args.get("group") or not sub.expressions[0].find(exp.AggFunc):
            raise _err("scalar subquery without an aggregate", "it must return one row: select an "
                       "aggregate without GROUP BY (or rewrite as a join)", sq, self.sql)
        sub_ctes = self._with_ctes(sub, ctes)
        value = sub.expressions[0].unalias()
        new, eqs, other = self._decorrelate(sub, scope)
        if other:
            raise _err("correlated scalar subquery condition", "only equalities with the outer query "
                       f"are supported, not {other[0].sql(dialect='spark')}", other[0], self.sql)
        keys = [exp.alias_(i.copy(), f"__k{n}") for n, (i, _) in enumerate(eqs)]
        new.set("expressions", keys + [exp.alias_(value.copy(), "__v"), exp.alias_(exp.true(), "__present")])
        if eqs:
            new.set("group", exp.Group(expressions=[i.copy() for i, _ in eqs]))
        node, outs = self._plan_select(new, sub_ctes)
        od = dict(outs)
        col = self.names.new("__scalar")
        if eqs:
            current = Join(columns=current.columns + node.columns, left=current, right=node, kind="left",
                           left_keys=[self._translate(o, scope) for _, o in eqs],
                           right_keys=[_q(od[f"__k{n}"]) for n in range(len(eqs))])

            def empty(n):
                if isinstance(n, exp.Count):
                    return exp.Literal.number(0)
                if isinstance(n, exp.AggFunc):
                    return exp.null()
                return n
            empty_sql = value.copy().transform(empty).sql(dialect="spark")
            expr = f"CASE WHEN {_q(od['__present'])} IS NULL THEN {empty_sql} ELSE {_q(od['__v'])} END"
        else:
            current = Join(columns=current.columns + node.columns, left=current, right=node, kind="inner",
                           left_keys=["1"], right_keys=["1"])
            expr = _q(od["__v"])
        return Project(columns=current.columns + [col], child=current,
                       exprs=[_q(c) for c in current.columns] + [expr]), col

    # ---- dedup (ROW_NUMBER() = 1) ---------------------------------------------------------------
    def _take_rank_filters(self, where_conj: list, rels: list[_Rel], sel) -> list:
        """Remove ``alias.rn = 1`` conditions on relations whose ``rn`` is a ROW_NUMBER()
        (planned as a dedup, so the condition always holds); a ranked relation without one is
        an error (other row numbers are not maintained)."""
        for r in rels:
            ranked = [k for k, v in r.cols.items() if v in self.rank_columns]
            if not ranked:
                continue
            hits = [c for c in where_conj if _is_eq_one(c, r.alias.lower(), ranked)]
            if not hits:
                raise _err(f"window function ROW_NUMBER() in {r.alias}",
                           f"filter it to 1 in the query that reads it (WHERE {r.alias}.{ranked[0]} = 1): "
                           "only the first row per partition is maintained (dedup)",
                           self.rank_columns[r.cols[ranked[0]]], self.sql)
            where_conj = [c for c in where_conj if all(c is not h for h in hits)]
            self.rank_filtered.update(r.cols[k] for k in ranked)
        return where_conj

    def _plan_dedup(self, sel: exp.Select, current: Node, scope: dict, windows: list, top: bool):
        """``SELECT .., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn FROM ..``: a Dedup
        of the other columns (plus p and o as hidden columns); ``rn`` is the constant 1,
        valid because the enclosing query must keep only ``rn = 1``."""
        w = windows[0]
        if (len(windows) > 1 or not isinstance(w, exp.Alias) or not isinstance(w.this, exp.Window)
                or sel.args.get("group") or sel.args.get("having") or sel.args.get("distinct")
                or any(_has_aggregate(e) for e in sel.expressions)):
            raise _err("window function ROW_NUMBER()", "write it as one select-list item "
                       "`ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..) AS rn` of a query without "
                       "aggregates or DISTINCT", w, self.sql)
        if top:
            raise _err("window function ROW_NUMBER()", "filter it to 1 in an enclosing query: only "
                       "the first row per partition is maintained (see the dedup_before_join macro)", w, self.sql)
        win = w.this
        order = win.args.get("order")
        if order is None or not order.expressions:
            raise _err("ROW_NUMBER() without ORDER BY", "say which row of a partition is kept", w, self.sql)
        lowered, internal = self._output_names(sel, sel.expressions, top)
        visible = [(n, e) for n, e in zip(internal, sel.expressions) if e is not w]
        pcols = [self.names.new("__part") for _ in win.args.get("partition_by") or []]
        ocols = [self.names.new("__order") for _ in order.expressions]
        exprs = ([self._translate(e.unalias() if isinstance(e, exp.Alias) else e, scope) for _, e in visible]
                 + [self._translate(p, scope) for p in win.args.get("partition_by") or []]
                 + [self._translate(o.this, scope) for o in order.expressions])
        pre = Project(columns=[n for n, _ in visible] + pcols + ocols, child=current, exprs=exprs)
        keys = [SortKey(c, bool(o.args.get("desc")), o.args.get("nulls_first"))
                for c, o in zip(ocols, order.expressions)]
        dedup = Dedup(columns=list(pre.columns), child=pre, partition=pcols, order=keys)
        rn = internal[sel.expressions.index(w)]
        self.rank_columns[rn] = w
        node = Project(columns=internal, child=dedup,
                       exprs=["CAST(1 AS INT)" if n == rn else _q(n) for n in internal])
        return node, list(zip(lowered, internal))

    # ---- aggregation -------------------------------------------------------------------------
    def _plan_aggregate(self, child: Node, scope, group, select_exprs, having):
        """GROUP BY: one AggCall per distinct aggregate of the select list and HAVING. A
        FILTER (WHERE c) clause becomes the argument ``CASE WHEN c THEN x END`` (COUNT(*)
        counts ``CASE WHEN c THEN 1 END``); DISTINCT picks the value-multiset form."""
        group_exprs = list(group.expressions) if group is not None else []
        gnames = [self.names.new(f"__g_{g.alias_or_name or 'expr'}") for g in group_exprs]
        aggs: list[AggCall] = []
        agg_map: dict[exp.Expression, str] = {}
        exprs_to_scan = list(select_exprs) + ([having.this] if having is not None else [])
        for e in exprs_to_scan:
            if e.find(exp.Subquery, exp.Exists):
                raise _err("subquery in an aggregating query's SELECT or HAVING", "compute it in a CTE "
                           "and join it", e.find(exp.Subquery, exp.Exists), self.sql)
            for a in _own(e, exp.AggFunc):
                holder = a.parent if isinstance(a.parent, exp.Filter) else a
                if holder in agg_map:
                    continue
                if a.find_ancestor(exp.AggFunc) is not None:
                    raise _err("nested aggregate", "aggregates cannot contain aggregates", a, self.sql)
                func = _AGGS[type(a)]
                arg = a.this
                distinct = isinstance(arg, exp.Distinct)
                if distinct:
                    arg = arg.expressions[0]
                if a.expressions:
                    raise _err(f"{func.upper()} with several arguments", "not supported", a, self.sql)
                cond = self._translate(holder.expression.this, scope) if holder is not a else None
                if func == "count" and (arg is None or isinstance(arg, exp.Star)):
                    func, arg_sql = ("count", f"CASE WHEN {cond} THEN 1 END") if cond else ("count_star", None)
                else:
                    arg_sql = self._translate(arg, scope)
                    if cond:
                        arg_sql = f"CASE WHEN {cond} THEN {arg_sql} END"
                    if distinct and func in ("count", "sum", "avg"):
                        func = f"{func}_distinct"
                name = self.names.new(f"__a_{func}")
                agg_map[holder] = name
                aggs.append(AggCall(name, func, arg_sql))
        node = Aggregate(columns=gnames + [a.name for a in aggs], child=child, group_names=gnames,
                         group_exprs=[self._translate(g, scope) for g in group_exprs], aggs=aggs)
        post = {"groups": list(zip(group_exprs, gnames)), "aggs": agg_map}
        return node, post

    def _translate_post(self, e: exp.Expression, post) -> str:
        def fn(n):
            for g, name in post["groups"]:
                if n == g:
                    return exp.column(name, quoted=True)
            if isinstance(n, (exp.AggFunc, exp.Filter)) and n in post["aggs"]:
                return exp.column(post["aggs"][n], quoted=True)
            if isinstance(n, exp.Column):
                raise _err(f"column {n.sql(dialect='spark')}", "must appear in GROUP BY or inside an aggregate",
                           n, self.sql)
            return n
        return e.copy().transform(fn).sql(dialect="spark")


def _own(e: exp.Expression, typ):
    """The nodes of type ``typ`` in ``e`` outside nested subqueries (those belong to the
    subquery's scope, except its correlated references, which its planning resolves)."""
    for n in e.walk(prune=lambda n: n is not e and isinstance(n, (exp.Subquery, exp.Exists, exp.Select))):
        if isinstance(n, typ):
            yield n


def _own_columns(e: exp.Expression):
    return _own(e, exp.Column)


def _has_aggregate(e: exp.Expression) -> bool:
    return next(_own(e, exp.AggFunc), None) is not None


def _from_relations(sel: exp.Select) -> list[exp.Expression]:
    from_ = sel.args.get("from") or sel.args.get("from_")
    return ([from_.this] if from_ else []) + [j.this for j in sel.args.get("joins") or []]


def _subquery_predicate(c: exp.Expression):
    """``(negated, EXISTS or IN node)`` when ``c`` is ``[NOT] EXISTS (q)`` or ``x [NOT] IN (q)``."""
    negated = isinstance(c, exp.Not)
    inner = c.this if negated else c
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Exists) or (isinstance(inner, exp.In) and inner.args.get("query") is not None):
        return negated, inner
    return None


def _is_eq_one(c: exp.Expression, alias: str, cols: list[str]) -> bool:
    """``alias.col = 1`` (either order) for one of ``cols``."""
    if not isinstance(c, exp.EQ):
        return False
    for a, b in ((c.this, c.expression), (c.expression, c.this)):
        if (isinstance(a, exp.Column) and a.table.lower() == alias and a.name.lower() in cols
                and isinstance(b, exp.Literal) and not b.is_string and b.this == "1"):
            return True
    return False


def _conjuncts(e: exp.Expression):
    if isinstance(e, exp.And):
        yield from _conjuncts(e.this)
        yield from _conjuncts(e.expression)
    elif isinstance(e, exp.Paren):
        yield from _conjuncts(e.this)
    else:
        yield e


def compile_model(sql: str, sources: list[SourceSpec], schemas: dict[str, list[str]]) -> CompiledModel:
    """Compile ``sql`` over ``sources`` (whose columns are ``schemas[source.key]``).

    Raises CompileError (construct + line) for anything outside the supported SQL.
    """
    root, outputs = _Compiler(sql, sources, schemas).compile()
    unique_key = output_unique_key(root)
    prune_columns(root)
    assign_ids(root)
    return CompiledModel(sql=sql, root=root, output_columns=[internal for _, internal in outputs],
                         sources=sources, fingerprint=fingerprint(sql, sources), unique_key=unique_key)


STATE_FORMAT = 2
"""Version of the checkpoint's layout (plan, state, cut log); part of the fingerprint, so a
checkpoint of another layout asks for a full refresh instead of being misread."""


def fingerprint(sql: str, sources: list[SourceSpec]) -> str:
    """What a checkpoint was made for: the model SQL and its sources (key and location). A
    change of either needs a full refresh; computed without compiling."""
    h = hashlib.sha256()
    h.update(f"state format {STATE_FORMAT}|".encode())
    h.update(sql.strip().encode())
    for s in sorted(sources, key=lambda s: s.key):
        h.update(f"|{s.key}|{s.location}".encode())
    return h.hexdigest()[:16]
