"""Generators: ``LATERAL VIEW [OUTER] explode / posexplode / inline / stack / json_tuple ..``
and ``explode(..)`` / ``posexplode(..)`` (and their ``_outer`` forms) in a SELECT list.

Each is a :class:`~.logical.Generate` over the FROM clause's joined rows, before WHERE (as
Spark applies a LATERAL VIEW), so WHERE, GROUP BY and the select list may read its columns.
A generator maps one input row to its output rows, each with the input row's weight: it is
linear, its delta rule is itself, and a batch costs its change only. A generator in the
select list is the LATERAL VIEW it stands for, its columns named as Spark names them (an
alias, else ``col``, and ``pos`` for posexplode).

Example: ``select o.id, t.tag from src.o o lateral view outer explode(split(o.tags, ',')) t
as tag`` plans to::

    Project `o__id` AS id, `t__tag` AS tag
      Generate outer EXPLODE(SPLIT(`o__tags`, ',')) AS t__tag
        Scan src.o ['id', 'tags']
"""
from __future__ import annotations

from sqlglot import exp

from .expressions import translate
from .logical import Generate, Node
from .parse import err, no_rule
from .scope import Lowering

SELECT_ALIAS = "__select_gen"
"""The alias of the LATERAL VIEW a select-list generator becomes."""


def select_list_generators(sel: exp.Select, sql: str) -> exp.Select:
    """``sel`` with each ``explode(..)`` / ``posexplode(..)`` (or ``_outer``) item of its select
    list moved into a LATERAL VIEW of its own (the item becomes a reference to its columns);
    ``sel`` itself when it has none.

    Raises NoDeltaRule for a generator inside another expression or in an aggregating query
    (Spark's own rules for where a generator may stand are kept by refusing the rest)."""
    gens = [(i, e) for i, e in enumerate(sel.expressions) if isinstance(_item(e), exp.Explode)]
    for e in sel.expressions:
        for g in e.find_all(exp.Explode):
            if g is not _item(e):
                raise no_rule("a generator inside an expression", "give the generator its own select item or a "
                              "LATERAL VIEW", g, sql)
    if not gens:
        return sel
    if sel.args.get("group") or any(e.find(exp.AggFunc) for e in sel.expressions):
        raise no_rule("a generator in an aggregating query's select list", "move it into a LATERAL VIEW",
                      gens[0][1], sql)
    sel = sel.copy()
    items = list(sel.expressions)
    for n, (i, e) in enumerate(gens):
        g = _item(e)
        pos = isinstance(g, exp.Posexplode)
        if isinstance(e, exp.Aliases):
            names = [a.name for a in e.expressions]
        elif isinstance(e, exp.Alias) and not e.alias.startswith("_col_"):   # (qualify names bare items _col_i)
            names = (["pos"] if pos else []) + [e.alias]
        else:
            names = ["pos", "col"] if pos else ["col"]
        alias = f"{SELECT_ALIAS}{n}"
        outer = type(g).__name__.endswith("Outer")   # explode_outer, posexplode_outer
        plain = (exp.Posexplode if pos else exp.Explode)(this=g.this.copy())
        sel.append("laterals", exp.Lateral(this=plain, view=True, outer=outer, alias=exp.TableAlias(
            this=exp.to_identifier(alias), columns=[exp.to_identifier(c) for c in names])))
        items[i] = [exp.alias_(exp.column(c, table=alias), c) for c in names]
    sel.set("expressions", [x for item in items for x in (item if isinstance(item, list) else [item])])
    return sel


def _item(e: exp.Expression) -> exp.Expression:
    """A select item without its alias (``AS c``) or aliases (``AS (p, c)``)."""
    return e.this if isinstance(e, (exp.Alias, exp.Aliases)) else e


def plan_generate(lw: Lowering, lateral: exp.Lateral, current: Node,
                  scope: dict[tuple[str, str], str]) -> tuple[Node, dict[tuple[str, str], str]]:
    """The LATERAL VIEW ``lateral`` over ``current`` (whose columns are ``scope``): the
    Generate node and the scope with its columns added (by the view's alias).

    Raises CompileError for a LATERAL VIEW without column names; NoDeltaRule for a LATERAL
    subquery (not a generator)."""
    if not lateral.args.get("view"):
        raise no_rule("LATERAL subquery", "LATERAL VIEW of a generator is supported", lateral, lw.sql)
    alias = lateral.args.get("alias")
    names = [c.name for c in alias.columns] if alias is not None else []
    if not names:
        raise err("LATERAL VIEW without column names", "name its columns: LATERAL VIEW explode(x) t AS c",
                  lateral, lw.sql)
    view = alias.name or "__lateral"
    internal = [lw.names.new(f"{view}__{c}") for c in names]
    node = Generate(columns=list(current.columns) + internal, child=current,
                    generator=translate(lateral.this, scope, lw.sql), outer=bool(lateral.args.get("outer")),
                    names=internal)
    return node, {**scope, **{(view.lower(), c.lower()): i for c, i in zip(names, internal)}}
