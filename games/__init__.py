"""Games for autocurricula: one module per game, each exports ``play(players, model, tokenizer)``.

``AffineGame`` (a game with its payoffs in other units, ``r -> scale * r + offset``) is a name of the
package itself; ``autocurricula.games.openspiel.load(name)`` turns an OpenSpiel game into a game."""

import importlib

_LAZY = {"AffineGame": "autocurricula.games._affine"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    # lazy: `import autocurricula.games` stays as light as it was
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
