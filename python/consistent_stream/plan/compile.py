"""Compile a model's SQL (Spark dialect) into a logical plan of incremental operators.

Supported: SELECT with any deterministic Spark scalar expression, WHERE, CTEs and derived
tables in FROM, INNER JOIN (equi, multi-way, also comma joins with the equality in WHERE),
LEFT and RIGHT JOIN (equi; ON predicates on the null-supplying side only), GROUP BY with
SUM, COUNT, COUNT(*), AVG, MIN, MAX, and HAVING. Everything else raises CompileError naming
the construct and its line before anything is written.

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
from .logical import Aggregate, AggCall, Filter, Join, Node, Project, Scan, Union, assign_ids

_AGGS = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Count: "count"}

# constructs with their readable names; any of these anywhere in the query is rejected
_UNSUPPORTED: list[tuple[type, str, str]] = [
    (exp.Window, "window function", "use GROUP BY aggregates, or dedup_before_join for ROW_NUMBER() = 1 (planned)"),
    (exp.Order, "ORDER BY", "a materialized view has no row order; sort when you read it"),
    (exp.Limit, "LIMIT", "a top-N view is not maintained incrementally yet"),
    (exp.Offset, "OFFSET", "not maintained incrementally"),
    (exp.Intersect, "INTERSECT", "set operations are not supported yet"),
    (exp.Except, "EXCEPT", "set operations are not supported yet"),
    (exp.Exists, "EXISTS subquery", "rewrite as a join"),
    (exp.Lateral, "LATERAL VIEW", "not supported"),
    (exp.Pivot, "PIVOT", "not supported"),
    (exp.Qualify, "QUALIFY", "not supported"),
    (exp.Cube, "CUBE", "not supported"),
    (exp.Rollup, "ROLLUP", "not supported"),
    (exp.GroupingSets, "GROUPING SETS", "not supported"),
    (exp.TableSample, "TABLESAMPLE", "a sample has no incremental meaning"),
    (exp.Filter, "aggregate FILTER clause", "not supported yet; use SUM(CASE WHEN ..)"),
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
    full refresh)."""
    sql: str
    root: Node
    output_columns: list[str]
    sources: list[SourceSpec]
    fingerprint: str


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
        if not isinstance(ast, (exp.Select, exp.Union)):
            raise _err(type(ast).__name__.upper(), "a model is one query (SELECT, UNION [ALL])", ast, self.sql)
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
        return rel_node, outputs

    def _reject_unsupported(self, ast: exp.Expression) -> None:
        for node in ast.walk():
            if isinstance(node, exp.Distinct) and isinstance(node.parent, exp.AggFunc):
                raise _err(f"{type(node.parent).__name__.upper()}(DISTINCT ..)", "not supported yet",
                           node.parent, self.sql)
            if isinstance(node, exp.Distinct) and node.args.get("on"):
                raise _err("DISTINCT ON", "not supported", node, self.sql)
            for typ, name, hint in _UNSUPPORTED:
                if isinstance(node, typ):
                    raise _err(name, hint, node, self.sql)
            if isinstance(node, exp.Anonymous) and node.name.lower() in _NONDETERMINISTIC_NAMES:
                raise _err(f"{node.name}()", "non-deterministic functions have no meaning at a cut", node, self.sql)
            if isinstance(node, exp.Subquery) and not isinstance(node.parent, (exp.From, exp.Join)):
                raise _err("subquery in an expression", "scalar and IN subqueries are not supported yet; "
                           "rewrite as a join with a derived table", node, self.sql)
            if isinstance(node, exp.In) and node.args.get("query") is not None:
                raise _err("IN (subquery)", "not supported yet; rewrite as a join", node, self.sql)
            if isinstance(node, exp.AggFunc) and type(node) not in _AGGS:
                raise _err(f"aggregate {node.sql_name() if hasattr(node, 'sql_name') else type(node).__name__}",
                           "supported aggregates: SUM, COUNT, COUNT(*), AVG, MIN, MAX", node, self.sql)

    def _check_relations(self, ast: exp.Expression) -> None:
        ctes = {c.alias_or_name.lower() for c in ast.find_all(exp.CTE)}
        for t in ast.find_all(exp.Table):
            parts = tuple(p.name.lower() for p in t.parts)
            if len(parts) == 1 and parts[0] in ctes:
                continue
            if parts not in self.sources:
                raise _err(f"relation {t.sql(dialect='spark')}",
                           "it is not a source with meta.consistent_stream (declare it as a dbt source "
                           "with meta.consistent_stream; ref() of other models is not supported yet)", t, self.sql)

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
        def fn(n):
            if isinstance(n, exp.Column):
                key = (n.table.lower(), n.name.lower())
                if key not in scope:
                    raise _err(f"column {n.sql(dialect='spark')}", "not visible here (correlated references are "
                               "not supported)", n, self.sql)
                return exp.column(scope[key], quoted=True)
            return n
        return e.copy().transform(fn).sql(dialect="spark")

    @staticmethod
    def _aliases(e: exp.Expression) -> set[str]:
        return {c.table.lower() for c in e.find_all(exp.Column)}

    # ---- SELECT ------------------------------------------------------------------------------
    def _plan_query(self, q: exp.Expression, outer_ctes: dict, top: bool = False) -> tuple[Node, list]:
        """A SELECT, or a UNION [ALL] of queries (columns by position, names from the left).
        UNION (distinct) is UNION ALL followed by DISTINCT."""
        if not isinstance(q, exp.Union):
            return self._plan_select(q, outer_ctes, top)
        ctes = dict(outer_ctes)
        with_ = q.args.get("with") or q.args.get("with_")
        if with_:
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = cte.this
        left, louts = self._plan_query(q.this, ctes)
        right, routs = self._plan_query(q.expression, ctes)
        if len(louts) != len(routs):
            raise _err("UNION of queries with different numbers of columns",
                       f"{len(louts)} columns on the left, {len(routs)} on the right", q, self.sql)
        names = [n for n, _ in louts] if top else [self.names.new(n) for n, _ in louts]
        # both sides projected to the same column names, the right side by position
        l_ = Project(columns=names, child=left, exprs=[_q(i) for _, i in louts])
        r = Project(columns=names, child=right, exprs=[_q(i) for _, i in routs])
        node: Node = Union(columns=names, left=l_, right=r)
        if q.args.get("distinct"):
            node = self._distinct(node)
        return node, list(zip([n.lower() for n, _ in louts], names))

    @staticmethod
    def _distinct(node: Node) -> Node:
        """SELECT DISTINCT: a GROUP BY of every column without aggregates (a row is in the
        output while its count is above zero)."""
        return Aggregate(columns=list(node.columns), child=node, group_names=list(node.columns),
                         group_exprs=[_q(c) for c in node.columns], aggs=[])

    def _plan_select(self, sel: exp.Expression, outer_ctes: dict, top: bool = False) -> tuple[Node, list]:
        if not isinstance(sel, exp.Select):
            raise _err(type(sel).__name__.upper(), "only SELECT is supported here", sel, self.sql)
        ctes = dict(outer_ctes)
        with_ = sel.args.get("with") or sel.args.get("with_")
        if with_:
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = cte.this
        from_ = sel.args.get("from") or sel.args.get("from_")
        if from_ is None:
            raise _err("SELECT without FROM", "a model reads at least one source", sel, self.sql)
        joins = sel.args.get("joins") or []
        used: dict[str, set[str]] = {}
        for c in sel.find_all(exp.Column):
            if c.find_ancestor(exp.Select) is sel:
                used.setdefault(c.table.lower(), set()).add(c.name.lower())
        rels = [self._plan_relation(r, ctes, used) for r in [from_.this] + [j.this for j in joins]]
        by_alias = {r.alias.lower(): r for r in rels}
        if len(by_alias) != len(rels):
            raise _err("duplicate table alias", "give every relation in FROM its own alias", sel, self.sql)

        where = sel.args.get("where")
        where_conj = list(_conjuncts(where.this)) if where else []
        null_supplied: set[str] = set()
        for i, j in enumerate(joins):
            side = (j.side or "").upper()
            if side == "LEFT":
                null_supplied.add(rels[i + 1].alias.lower())
            elif side == "RIGHT":
                null_supplied.update(r.alias.lower() for r in rels[: i + 1])
            elif side == "FULL":
                raise _err("FULL OUTER JOIN", "not supported yet", j, self.sql)
            if (j.kind or "").upper() in ("SEMI", "ANTI") or j.args.get("using"):
                raise _err(f"{(j.kind or 'USING').upper()} JOIN", "not supported yet", j, self.sql)

        # push single-relation WHERE predicates into their relation (not below outer joins)
        remaining = []
        for c in where_conj:
            al = self._aliases(c)
            if len(al) == 1 and next(iter(al)) not in null_supplied and not c.find(exp.AggFunc):
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
            ra = r.alias.lower()
            rscope = {(ra, k): v for k, v in r.cols.items()}
            side = (j.side or "").upper()
            on = list(_conjuncts(j.args["on"])) if j.args.get("on") else []
            lkeys, rkeys, residual = [], [], []
            candidates = on + (where_conj if side == "" else [])
            for c in candidates:
                pair = self._equi(c, left_aliases, ra)
                if pair is not None:
                    lk, rk = pair
                    lkeys.append(self._translate(lk, scope))
                    rkeys.append(self._translate(rk, rscope))
                    if c in where_conj and side == "":
                        where_conj = [w for w in where_conj if w is not c]
                elif c in on:
                    residual.append(c)
            if not lkeys:
                raise _err("join without an equality condition", "every join needs at least one "
                           "`left_column = right_column` condition (cross joins are not maintained)", j, self.sql)
            res_sql = None
            right_node = r.node
            left_node = current
            if side in ("LEFT", "RIGHT"):
                outer_alias = {ra} if side == "LEFT" else left_aliases
                for c in residual:
                    if not self._aliases(c) <= outer_alias:
                        raise _err(f"{side} JOIN condition {c.sql(dialect='spark')}",
                                   "only equalities and predicates on the null-supplying side are "
                                   "supported in an outer join's ON", c, self.sql)
                if side == "LEFT" and residual:
                    right_node = Filter(columns=right_node.columns, child=right_node,
                                        predicate=" AND ".join(self._translate(c, rscope) for c in residual))
                elif side == "RIGHT" and residual:
                    left_node = Filter(columns=left_node.columns, child=left_node,
                                       predicate=" AND ".join(self._translate(c, scope) for c in residual))
            elif residual:
                full = {**scope, **rscope}
                res_sql = " AND ".join(self._translate(c, full) for c in residual)
            if side == "RIGHT":
                current = Join(columns=right_node.columns + left_node.columns, left=right_node, right=left_node,
                               kind="left", left_keys=rkeys, right_keys=lkeys)
            else:
                current = Join(columns=left_node.columns + right_node.columns, left=left_node, right=right_node,
                               kind="left" if side == "LEFT" else "inner", left_keys=lkeys, right_keys=rkeys,
                               residual=res_sql)
            scope.update(rscope)
            left_aliases.add(ra)

        if where_conj:
            current = Filter(columns=current.columns, child=current,
                             predicate=" AND ".join(self._translate(c, scope) for c in where_conj))

        select_exprs = sel.expressions
        group = sel.args.get("group")
        having = sel.args.get("having")
        has_agg = any(e.find(exp.AggFunc) for e in select_exprs) or having is not None
        if group is not None or has_agg:
            current, post_scope = self._plan_aggregate(current, scope, group, select_exprs, having)
            if having is not None:
                current = Filter(columns=current.columns, child=current,
                                 predicate=self._translate_post(having.this, post_scope))
            exprs = [self._translate_post(e.unalias() if isinstance(e, exp.Alias) else e, post_scope)
                     for e in select_exprs]
        else:
            exprs = [self._translate(e.unalias() if isinstance(e, exp.Alias) else e, scope) for e in select_exprs]

        out_names = [e.alias_or_name for e in select_exprs]
        lowered = [n.lower() for n in out_names]
        dup = {n for n in lowered if lowered.count(n) > 1}
        if dup:
            raise _err(f"duplicate output column {sorted(dup)[0]}", "give every output column its own name",
                       sel, self.sql)
        internal = out_names if top else [self.names.new(n) for n in out_names]
        node = Project(columns=internal, child=current, exprs=exprs)
        if sel.args.get("distinct"):
            node = self._distinct(node)
        return node, list(zip(lowered, internal))

    def _equi(self, c: exp.Expression, left_aliases: set[str], right_alias: str):
        if not isinstance(c, exp.EQ):
            return None
        a, b = c.this, c.expression
        aa, ba = self._aliases(a), self._aliases(b)
        if aa and aa <= left_aliases and ba == {right_alias}:
            return a, b
        if ba and ba <= left_aliases and aa == {right_alias}:
            return b, a
        return None

    # ---- aggregation -------------------------------------------------------------------------
    def _plan_aggregate(self, child: Node, scope, group, select_exprs, having):
        group_exprs = list(group.expressions) if group is not None else []
        gnames = [self.names.new(f"__g_{g.alias_or_name or 'expr'}") for g in group_exprs]
        aggs: list[AggCall] = []
        agg_map: dict[exp.Expression, str] = {}
        exprs_to_scan = list(select_exprs) + ([having.this] if having is not None else [])
        for e in exprs_to_scan:
            for a in e.find_all(exp.AggFunc):
                if a in agg_map:
                    continue
                if a.find_ancestor(exp.AggFunc) is not None:
                    raise _err("nested aggregate", "aggregates cannot contain aggregates", a, self.sql)
                func = _AGGS[type(a)]
                arg = a.this
                if func == "count" and (arg is None or isinstance(arg, exp.Star)):
                    func, arg_sql = "count_star", None
                else:
                    if a.expressions:
                        raise _err(f"{func.upper()} with several arguments", "not supported", a, self.sql)
                    arg_sql = self._translate(arg, scope)
                name = self.names.new(f"__a_{func}")
                agg_map[a] = name
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
            if isinstance(n, exp.AggFunc):
                return exp.column(post["aggs"][n], quoted=True)
            if isinstance(n, exp.Column):
                raise _err(f"column {n.sql(dialect='spark')}", "must appear in GROUP BY or inside an aggregate",
                           n, self.sql)
            return n
        return e.copy().transform(fn).sql(dialect="spark")


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
    assign_ids(root)
    h = hashlib.sha256()
    h.update(sql.strip().encode())
    for s in sorted(sources, key=lambda s: s.key):
        h.update(f"|{s.key}|{s.location}".encode())
    return CompiledModel(sql=sql, root=root, output_columns=[internal for _, internal in outputs],
                         sources=sources, fingerprint=h.hexdigest()[:16])
