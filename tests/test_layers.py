"""The package's layers: every import, at module level or inside a function, goes downward or
stays in its layer, and no group of modules imports itself in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"autocurricula": ROOT / "autocurricula", "autocurricula.games": ROOT / "games",
            "autocurricula.leagues": ROOT / "leagues"}

# bottom to top; a module's layer is that of the longest prefix listed (docs/architecture.md)
LAYERS = [
    ("records", ["autocurricula", "autocurricula._blas", "autocurricula._deprecation", "autocurricula.records"]),
    ("engine", ["autocurricula.engine", "autocurricula.client", "autocurricula.tiny"]),
    ("training", ["autocurricula.training", "autocurricula.export", "autocurricula.warmup"]),
    ("arena", ["autocurricula.arena", "autocurricula.seed_compat", "autocurricula.replay", "autocurricula.games", "autocurricula.game", "autocurricula.artifacts",
               "autocurricula.placement", "autocurricula.fleet", "autocurricula.remote", "autocurricula.cluster"]),
    ("credit", ["autocurricula.credit", "autocurricula.branch"]),
    ("loop", ["autocurricula.trainer", "autocurricula.loop", "autocurricula.config", "autocurricula.pool",
              "autocurricula.checkpoint", "autocurricula.rating", "autocurricula.callbacks",
              "autocurricula.standings", "autocurricula.rounds", "autocurricula.startup", "autocurricula.signals",
              "autocurricula.state",
              "autocurricula.tracking", "autocurricula.plots", "autocurricula.transcripts", "autocurricula.hub",
              "autocurricula.eval"]),
    ("leagues", ["autocurricula.leagues"]),
    ("top", ["autocurricula.cli", "autocurricula.check_model", "autocurricula.dashboard", "autocurricula.dashboard_page",
             "autocurricula.server", "autocurricula.http_limits", "autocurricula.bench"]),
]


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            if pkg == "autocurricula" and parts and parts[0] in ("games", "leagues"):
                continue
            out[name] = f
    return out


def layer(name: str) -> int:
    best, where = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or (name.startswith(p + ".") and p != "autocurricula")) and len(p) > best:
                best, where = len(p), i
    assert where is not None, f"{name} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return where


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every autocurricula module ``name`` imports, wherever the import statement stands."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_no_import_goes_up_a_layer():
    g = graph()
    upward = []
    for src, targets in g.items():
        for dst in targets:
            # importing a.b.c runs a.b's __init__ too (unless src is inside a.b)
            chain = [dst] + [p for p in _parents(dst) if p in g and not src.startswith(p + ".") and p != src]
            for t in chain:
                if layer(t) > layer(src):
                    upward.append(f"{src} ({LAYERS[layer(src)][0]}) -> {t} ({LAYERS[layer(t)][0]})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(set(upward)))


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def test_no_import_cycle():
    g = graph()
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
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
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_every_module_has_a_layer():
    for name in modules():
        layer(name)


def _engine_like(node: ast.AST) -> bool:
    """``engine`` or ``x.engine`` (any name ending in ``engine``, e.g. ``self.engine``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("engine")


def test_nothing_outside_the_engine_touches_its_internals():
    found = []
    for pkg, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            if pkg == "autocurricula" and path.relative_to(root).parts[0] == "engine":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and _engine_like(node.value) and (
                        node.attr == "model" or (node.attr.startswith("_") and not node.attr.startswith("__"))):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not found, "engine internals used outside autocurricula/engine/:\n" + "\n".join(found)
