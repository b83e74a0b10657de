"""The package's layers are its folders: every import, at module level or inside a function, goes downward or
stays in its layer, and no group of modules imports itself in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"autocurricula": ROOT / "autocurricula", "autocurricula.games": ROOT / "games",
            "autocurricula.leagues": ROOT / "leagues"}

# bottom to top. A module's layer is its folder: `autocurricula/<folder>/...`, or `games/` and
# `leagues/` (installed as autocurricula.games and autocurricula.leagues). At the package root,
# `records` is the bottom layer and everything else (the public `__init__`, the CLI) the top.
LAYERS = ["records", "files", "engine", "training", "arena", "games", "fleet", "credit", "eval", "publish", "views",
          "loop", "leagues", "serve", "bench", "top"]
ROOT_MODULES = {"autocurricula": "top", "autocurricula.records": "records",
                "autocurricula.cli": "top"}


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
    if name in ROOT_MODULES:
        return LAYERS.index(ROOT_MODULES[name])
    folder = name.split(".")[1]
    assert folder in LAYERS and name.count(".") >= 1, (
        f"{name} sits in no layer folder: move it into one of {LAYERS[1:-1]} (docs/architecture.md)")
    return LAYERS.index(folder)


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every autocurricula module ``name`` imports, wherever the import statement stands."""
    is_pkg = path.name == "__init__.py"
    out = set()
    tree = ast.parse(path.read_text())
    skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for n in ast.walk(tree):  # ["python", "-m", "autocurricula.cli", ...] starts a process: not an import
        if isinstance(n, (ast.List, ast.Tuple)):
            skip |= {id(b) for a, b in zip(n.elts, n.elts[1:]) if isinstance(a, ast.Constant) and a.value == "-m"}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # string imports: importlib targets, lazy-name maps, "module:attr" entry points
            target = node.value.partition(":")[0]
            if target in known:
                targets = [target]
        elif isinstance(node, ast.Import):
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
            if t and t != name and t != "autocurricula":  # the root package runs first on any import anyway
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
                    upward.append(f"{src} ({LAYERS[layer(src)]}) -> {t} ({LAYERS[layer(t)]})")
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
