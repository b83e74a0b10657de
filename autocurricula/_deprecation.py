"""Names that moved: a module's ``__getattr__`` that still answers them, with a warning that
names the new place. The target is imported by name when first asked for, so an old name never
makes its old module depend on the new one."""

from __future__ import annotations

import importlib
import warnings


def moved(module: str, names: dict[str, str]):
    """A ``__getattr__`` for ``module``: ``names`` maps each old name to ``"new.module:NewName"``."""

    def __getattr__(name: str):
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = target.partition(":")
        warnings.warn(f"{module}.{name} has moved: use {where}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(where), new)

    return __getattr__
