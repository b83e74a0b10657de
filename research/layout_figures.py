"""The package's shape in figures, read from the source with ``ast`` (nothing is imported):
flat modules at the package root, the trainer's methods (class plus its in-package bases),
top-level fields of each config class (inherited included), deprecation sites, in-function
imports of light modules, and the share of docstring lines.

    python research/layout_figures.py [ROOT]      # ROOT: a checkout (default: this one)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# deferring one of these inside a function is what in-function imports are for
HEAVY = {"mlx", "mlx_lm", "torch", "ray", "huggingface_hub", "open_spiel", "pyspiel", "transformers", "peft", "trl",
         "wandb", "trackio", "textarena", "datasets", "matplotlib", "tokenizers", "openai", "accelerate", "uvicorn",
         "fastapi", "safetensors", "scipy"}


def sources(root: Path) -> dict[Path, ast.Module]:
    folders = [root / "autocurricula", root / "leagues", root / "games"]
    return {f: ast.parse(f.read_text()) for d in folders if d.is_dir() for f in sorted(d.rglob("*.py"))}


def classes(trees: dict[Path, ast.Module]) -> dict[str, ast.ClassDef]:
    return {n.name: n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}


def lineage(name: str, by_name: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    out, todo = [], [name]
    while todo:
        cls = by_name.get(todo.pop(0))
        if cls is not None and cls not in out:
            out.append(cls)
            todo += [b.id for b in cls.bases if isinstance(b, ast.Name)]
    return out


def methods(name: str, by_name: dict[str, ast.ClassDef]) -> int:
    return len({n.name for c in lineage(name, by_name) for n in c.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})


def fields(name: str, by_name: dict[str, ast.ClassDef]) -> int:
    return len({n.target.id for c in lineage(name, by_name) for n in c.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                and not (isinstance(n.annotation, ast.Name) and n.annotation.id == "ClassVar")
                and "ClassVar" not in ast.unparse(n.annotation)})


def main(root: Path) -> None:
    trees = sources(root)
    pkg = root / "autocurricula"
    by_name = classes(trees)
    flat = sorted(f.name for f in pkg.glob("*.py") if f.name != "__init__.py")
    print(f"flat modules at the package root (besides __init__): {len(flat)} {flat}")
    print(f"AutocurriculumTrainer methods (class plus in-package bases): {methods('AutocurriculumTrainer', by_name)}")
    configs = sorted(n for n in by_name if n.endswith("Config") and any(
        isinstance(d, ast.Name) and d.id == "dataclass" or isinstance(d, ast.Call) and ast.unparse(d.func) == "dataclass"
        for d in by_name[n].decorator_list))
    print("top-level fields per config class:", {n: fields(n, by_name) for n in configs})
    dep = inline = 0
    doc = lines = 0
    for path, tree in trees.items():
        if pkg not in path.parents:
            continue
        text = path.read_text()
        lines += len(text.splitlines())
        dep += len(re.findall(r"moved\(|DeprecationWarning", text))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc += len((ast.get_docstring(node, clean=False) or "").splitlines())
        if "bench" in path.relative_to(pkg).parts:
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        mod = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name) or ""
                        inline += mod.split(".")[0] not in HEAVY
    print(f"moved()/DeprecationWarning sites in autocurricula/: {dep}")
    print(f"in-function imports of modules outside {sorted(HEAVY)[:4]}... (autocurricula/ but bench/): {inline}")
    print(f"docstring lines in autocurricula/: {doc} of {lines} ({100 * doc / lines:.0f}%)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
