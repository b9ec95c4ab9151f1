"""The package's import order, as the module map (``python/modules.toml``) states it.

Every import of ``consistent_stream`` code, at module level or inside a function, is read from
the source (``ast``; nothing is imported), so a lazy import that would hide a back arrow
counts like any other."""
from __future__ import annotations

import ast
import os
import tomllib
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "python", "consistent_stream")
MODULE_MAP = os.path.join(ROOT, "python", "modules.toml")
ENGINES = ("pyspark", "duckdb", "deltalake", "pyarrow", "py4j")


def _modules() -> dict[str, str]:
    """Dotted module name (relative to the package; '' for its ``__init__``) -> file."""
    out = {}
    for d, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), PACKAGE)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(d, f)
    return out


def _imports(name: str, path: str) -> list[tuple[str, int, str]]:
    """(imported module or name, line, top-level module name of an external import) of one
    file: package-relative dotted targets for our code, '' target and the external name."""
    parts = name.split(".") if name else []
    pkg = parts if path.endswith("__init__.py") else parts[:-1]
    out = []
    with open(path) as f:
        tree = ast.parse(f.read())
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg[:len(pkg) - (n.level - 1)]
                if n.module:   # each name may be a submodule: a name of a module is trimmed later
                    out += [(".".join(base + n.module.split(".") + [a.name]), n.lineno, "") for a in n.names]
                else:
                    out += [(".".join(base + [a.name]), n.lineno, "") for a in n.names]
            elif n.module and n.module.split(".")[0] == "consistent_stream":
                module = n.module.partition(".")[2]
                out += [(f"{module}.{a.name}" if module else a.name, n.lineno, "") for a in n.names]
            elif n.module:
                out.append(("", n.lineno, n.module.split(".")[0]))
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == "consistent_stream":
                    out.append((a.name.partition(".")[2], n.lineno, ""))
                else:
                    out.append(("", n.lineno, a.name.split(".")[0]))
    return out


def _unit(module: str) -> str:
    return module.split(".")[0] if module else "__init__"


def _module_map() -> dict[str, tuple[int, set[str]]]:
    """Unit -> (layer, the units it may import), from :data:`MODULE_MAP`."""
    with open(MODULE_MAP, "rb") as f:
        entries = tomllib.load(f)["module"]
    rows = {}
    for e in entries:
        assert e["name"] not in rows, f"python/modules.toml: {e['name']} has two entries"
        assert e.get("owns"), f"python/modules.toml: {e['name']} says nothing about what it owns"
        rows[e["name"]] = (int(e["layer"]), set(e.get("may_import", [])))
    return rows


def test_every_import_follows_the_module_map():
    modules = _modules()
    rows = _module_map()
    units = {_unit(m) for m in modules}
    assert units - set(rows) == set(), f"modules missing from python/modules.toml: {sorted(units - set(rows))}"
    assert set(rows) - units == set(), f"python/modules.toml entries with no module: {sorted(set(rows) - units)}"
    bad = []
    for unit, (layer, may) in rows.items():
        for target in may:
            assert target in rows, f"python/modules.toml: {unit} may import {target}, which has no entry"
            if rows[target][0] >= layer:
                bad.append(f"python/modules.toml: {unit} (layer {layer}) may import {target} "
                           f"(layer {rows[target][0]}), which is not below it")
    for name, path in sorted(modules.items()):
        unit = _unit(name)
        for target, line, external in _imports(name, path):
            t_unit = _unit(target)
            if external or t_unit == unit:
                continue
            if t_unit not in rows[unit][1]:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {target or 'consistent_stream'} "
                           f"({t_unit}), which the module map does not let {unit} import")
    assert not bad, "\n".join(bad)


def test_no_import_circles_between_modules():
    modules = _modules()
    edges = defaultdict(set)
    for name, path in modules.items():
        for target, _, external in _imports(name, path):
            if external:
                continue
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]   # a name imported from a module
            if target in modules and target != name:
                edges[name].add(target)
    # Tarjan's strongly connected components
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    assert not circles, f"import circles between modules: {circles}"


def test_the_compiler_imports_no_engine_and_no_io():
    """``plan/`` is pure: it reads no data and starts no engine, so it is testable alone."""
    bad = []
    for name, path in _modules().items():
        if _unit(name) != "plan":
            continue
        for target, line, external in _imports(name, path):
            if external in ENGINES:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {external}")
            if target and _unit(target) not in ("plan", "errors", "sources"):
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {target}")
            if target and _unit(target) == "sources" and target.split(".")[1:2] not in (["spec"], ["SourceSpec"]):
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {target} (only sources.spec's SourceSpec)")
    assert not bad, "\n".join(bad)


# the extras a user installs only for the feature that needs them (setup.py's extras_require)
OPTIONAL = {"confluent_kafka": "kafka", "matplotlib": "plot"}


def test_the_engine_needs_no_test_tooling_and_imports_its_extras_only_where_used():
    """The engine never imports the test tooling (``consistent_stream_testing``, outside the
    wheel), and imports an optional extra's package only inside the function that needs it, so
    ``import consistent_stream`` and every feature but that one work without the extra."""
    bad = []
    for path in sorted(_modules().values()):
        with open(path) as f:
            tree = ast.parse(f.read())
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                tops = [a.name.split(".")[0] for a in n.names]
            elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
                tops = [n.module.split(".")[0]]
            else:
                continue
            where = f"{os.path.relpath(path, ROOT)}:{n.lineno}"
            if "consistent_stream_testing" in tops:
                bad.append(f"{where} imports the test tooling (consistent_stream_testing)")
            module_level = n in tree.body or any(n in getattr(s, "body", ()) for s in tree.body
                                                 if isinstance(s, (ast.If, ast.Try)))
            for top in tops:
                if top in OPTIONAL and module_level:
                    bad.append(f"{where} imports {top} at module level (the [{OPTIONAL[top]}] extra)")
    assert not bad, "\n".join(bad)
