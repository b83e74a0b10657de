"""The errors an engine raises, in a module of their own so that the engine and its scheduler
both import them without importing each other."""

from __future__ import annotations

__all__ = ["EngineDeadError", "UnknownPlayerError"]


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; create a new engine."""


class UnknownPlayerError(KeyError):
    """No adapter is loaded under this name."""

    def __str__(self):
        return str(self.args[0]) if self.args else "unknown player"
