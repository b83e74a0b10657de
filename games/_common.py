"""Plumbing shared by the game modules: seeded randomness, invalid-move rewards, turn drivers.

Not a game (the leading underscore keeps it out of game discovery).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

from autocurricula._deprecation import moved
from autocurricula.records import call_scripted

__getattr__ = moved(__name__, {"call_policy": "autocurricula.records:call_scripted"})

DEFAULT_INVALID_PENALTY = (-1.5, 0.5)  # (offender, every other player), as in SPIRAL


def make_rng(seed: int | None = None, rng: Any = None) -> random.Random:
    """The game's own ``random.Random``: from ``rng`` (``random.Random`` is used as is, a NumPy
    Generator seeds a fresh one), else from ``seed``, else from ``os.urandom``."""
    if rng is not None:
        if isinstance(rng, random.Random):
            return rng
        if hasattr(rng, "integers"):  # numpy.random.Generator
            return random.Random(int(rng.integers(0, 2**63 - 1)))
        raise TypeError(f"rng must be a random.Random or a numpy Generator, got {type(rng).__name__}")
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return random.Random(seed)


def choice(rng: Any, seq: Sequence):
    """Uniform pick with a ``random.Random``, a NumPy Generator or None (module ``random``)."""
    seq = list(seq)
    if not seq:
        raise ValueError("choice from an empty sequence")
    if rng is None:
        rng = random
    if hasattr(rng, "integers"):
        return seq[int(rng.integers(len(seq)))]
    return seq[rng.randrange(len(seq))]


def uniform(rng: Any) -> float:
    """A float in [0, 1) from any of the generators ``choice`` accepts."""
    return (rng if rng is not None else random).random()


def check_penalty(invalid_penalty) -> tuple[float, float]:
    try:
        off, other = (float(x) for x in invalid_penalty)
    except (TypeError, ValueError):
        raise ValueError(f"invalid_penalty must be a pair (offender, others) of numbers, got {invalid_penalty!r}") \
            from None
    if not (math.isfinite(off) and math.isfinite(other)):
        raise ValueError(f"invalid_penalty must be finite, got {invalid_penalty!r}")
    return off, other


def invalid_rewards(n: int, offenders, penalty) -> list[float]:
    off, other = check_penalty(penalty)
    offenders = set(offenders)
    return [off if i in offenders else other for i in range(n)]


def check_players(players, n: int | None = 2, game: str = "this game") -> None:
    if n is not None and len(players) != n:
        raise ValueError(f"{game} takes {n} players, got {len(players)}")
    if n is None and len(players) < 2:
        raise ValueError(f"{game} takes at least 2 players, got {len(players)}")


async def ask(model, player: dict, prompt, *, max_tokens: int, temperature: float | None = None,
              stop: Sequence[str] | None = None) -> str:
    """One reply of ``player`` through the game's ``model`` handle (LLM or scripted alike)."""
    kwargs: dict[str, Any] = {"max_tokens": int(max_tokens)}
    if temperature is not None:  # None: the arena's default temperature
        kwargs["temperature"] = float(temperature)
    if stop:
        kwargs["stop"] = list(stop)
    gen = await model.generate(player, prompt, **kwargs)
    text = getattr(gen, "text", gen)
    return text if isinstance(text, str) else str(text)


class TurnGame:
    """A turn-based game state driven by replies: ``to_move`` (seat), ``prompt()`` for that seat,
    ``step(reply)`` (parses; an unparseable or illegal reply sets ``invalid_by`` and ends the game),
    ``outcome()`` (rewards of a game that ended normally)."""

    n_players = 2

    def __init__(self) -> None:
        self.done = False
        self.invalid_by: int | None = None
        self.to_move = 0

    def prompt(self) -> str:
        raise NotImplementedError

    def step(self, reply: str) -> None:
        raise NotImplementedError

    def outcome(self) -> list[float]:
        raise NotImplementedError

    def mark_invalid(self) -> None:
        self.invalid_by = self.to_move
        self.done = True

    def rewards(self, invalid_penalty=DEFAULT_INVALID_PENALTY) -> list[float]:
        if not self.done:
            raise RuntimeError("the game is not over")
        if self.invalid_by is not None:
            return invalid_rewards(self.n_players, [self.invalid_by], invalid_penalty)
        return [float(r) for r in self.outcome()]


async def drive(game: TurnGame, players, model, *, max_tokens: int, temperature: float | None = None,
                stop: Sequence[str] | None = None) -> TurnGame:
    while not game.done:
        reply = await ask(model, players[game.to_move], game.prompt(), max_tokens=max_tokens,
                          temperature=temperature, stop=stop)
        game.step(reply)
    return game


def drive_sync(game: TurnGame, policies: Sequence[Callable], rng: Any = None) -> TurnGame:
    """Play ``game`` out with scripted policies, without any model (fast evaluation and tests)."""
    while not game.done:
        game.step(call_scripted(policies[game.to_move], game.prompt(), rng))
    return game
