"""The error of a model the engine refuses, in a module of its own so that the family tables and
the config reader both raise it without importing each other."""

from __future__ import annotations

__all__ = ["UnsupportedModelError"]


class UnsupportedModelError(ValueError):
    """A model family the engine cannot serve; the message names the family and the reason."""
