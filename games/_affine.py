"""A game with its payoffs in other units: every reward ``r`` becomes ``scale * r + offset``.

``AffineGame(kuhn_poker, 100, 7)`` plays Kuhn poker hand for hand as the module does and pays
``100 * chips + 7``; its facts (:class:`~autocurricula.records.GameFacts`) move with it (the payoff
ranges scale and shift; a zero-sum game with an offset becomes constant-sum). Its moves, random
player and warm-up examples are the game's. Strategically it is the same game, so a trainer must
learn it the same way: the credit methods normalise rewards by their seat's range
(:mod:`autocurricula.credit.scale`), and ``tests/test_scale_free.py`` checks that a game and its
copies in other units give the same advantages and the same training run.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from autocurricula.arena.arena import GameResult
from autocurricula.arena.game import as_play, game_facts, game_moves
from autocurricula.records import GameFacts

__all__ = ["AffineGame"]


class AffineGame:
    """``game`` (a Game module or object) with every reward mapped ``r -> scale * r + offset``
    (``scale`` > 0); pass it to ``trainer.train`` as the game itself."""

    def __init__(self, game, scale: float, offset: float = 0.0, *, name: str | None = None):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0 (an affine change keeps the order of outcomes), "
                             f"got {scale!r}")
        if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
            raise ValueError(f"offset must be a finite number, got {offset!r}")
        self.game, self.scale, self.offset = game, float(scale), float(offset)
        self._play = as_play(game)
        self._moves = game_moves(game)
        base = getattr(game, "name", None) or getattr(game, "__name__", type(game).__name__).rsplit(".", 1)[-1]
        self.name = name or f"{base}x{scale:g}{offset:+g}"
        self.NUM_PLAYERS = getattr(game, "NUM_PLAYERS", game_facts(game).num_players)
        self.ZERO_SUM = bool(getattr(game, "ZERO_SUM", game_facts(game).zero_sum))

    @property
    def facts(self) -> GameFacts:
        return game_facts(self.game).affine(self.scale, self.offset)

    FACTS = facts  # not the wrapped game's (attributes it lacks are the wrapped game's)

    def map(self, reward: float) -> float:
        return self.scale * float(reward) + self.offset

    async def play(self, players: list, model, tokenizer=None, **options):
        out = self._play(players, model, tokenizer, **options)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, GameResult):
            return GameResult([self.map(r) for r in out.rewards], out.extras, out.turns)
        return [self.map(r) for r in out]

    def moves(self, prompt: str) -> list[str]:
        if self._moves is None:
            raise AttributeError(f"{self.game!r} lists no moves")
        return self._moves(prompt)

    def random_policy(self, prompt: str, rng: Any = None) -> str:
        return self.game.random_policy(prompt, rng)

    def check_tokenizer(self, tokenizer) -> None:
        check = getattr(self.game, "check_tokenizer", None)
        if callable(check):
            check(tokenizer)

    def __getattr__(self, name):  # the wrapped game's own helpers (warmup_examples, prompt, words...)
        if name.startswith("__") or name in ("game", "_play", "_moves"):
            raise AttributeError(name)
        return getattr(self.game, name)

    def __repr__(self) -> str:
        return f"AffineGame({self.game!r}, scale={self.scale:g}, offset={self.offset:g})"
