"""Scale-free credit: every credit method sees rewards in the game's own range, not its units.

A game's payoffs may come in any units (chips, points, a matrix multiplied by 100 and shifted by
7). Left as they are, the units set how hard each credit method pushes: a per-move target
``softmax(Q / tau)`` is sharp for payoffs in [-13, 13] and flat for payoffs in [-0.1, 0.1], a role
baseline that starts at 0 is far from payoffs around 700. So before any credit method runs, the
trainer maps every reward of the round to

    r -> (r - mid) / half,   mid and half: the centre and half-width of the seat's range,

which puts each seat's range on [-1, 1] (its rewards as a share of the range; a forfeit outside the
declared range lands outside [-1, 1]), rounded to 10 decimals so that float rounding of the units
cannot tell the copies apart. The range is the game's declared one
(:class:`~autocurricula.records.GameFacts`: ``seat_ranges`` or ``payoff_range``), else a running
estimate: the lowest and highest reward seen so far for that (game, level, seat), widened before
each round's credit and saved in every checkpoint. An affine change of the payoffs, ``r -> a * r +
b`` with ``a > 0``, moves the range the same way (declared ranges move with the game's facts, the
running estimate with the rewards it sees), so the normalised rewards, and every advantage
computed from them, are the same up to float rounding: training is invariant to the units.

The records' rewards and the turns' rewards are swapped for their normalised values only while the
credit method runs (:meth:`RewardScale.normalised`), and the branch games that a method replays are
normalised by the same map (:meth:`RewardScale.record_rewards`, which the trainer hands to its
``Replayer``). Ratings, match history, metrics and callbacks keep the game's own units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from autocurricula.records import GameFacts, GameRecord, Turn

__all__ = ["DIGITS", "RewardScale"]

DIGITS = 10  # decimals kept of a normalised reward (the seat's range is [-1, 1])


class RewardScale:
    """Maps rewards of one game to their seat's range (module docstring). ``facts``: the game's
    declared facts (ranges used for its top-level seats); ``game``: its name, as turns carry it."""

    def __init__(self, facts: GameFacts | None = None, game: str = "game"):
        self.facts = facts if facts is not None else GameFacts(num_players=None)
        self.game = game
        self.seen: dict[str, list[float]] = {}  # key -> [lowest, highest] reward seen (undeclared ranges only)

    @staticmethod
    def key(game: str, level: int, seat: int) -> str:
        return f"{game}|{level}|{seat}"

    def declared(self, game: str, level: int, seat: int) -> tuple[float, float] | None:
        """The declared range of a top-level seat of this game, else None."""
        if level != 0 or game != self.game:
            return None
        return self.facts.seat_range(seat)

    def range_of(self, game: str, level: int, seat: int) -> tuple[float, float] | None:
        """The range rewards of that seat are measured against: declared, else as seen so far."""
        declared = self.declared(game, level, seat)
        if declared is not None:
            return declared
        seen = self.seen.get(self.key(game, level, seat))
        return None if seen is None else (seen[0], seen[1])

    def _widen(self, game: str, level: int, seat: int, value) -> None:
        if value is None or not math.isfinite(value) or self.declared(game, level, seat) is not None:
            return
        span = self.seen.setdefault(self.key(game, level, seat), [float(value), float(value)])
        span[0], span[1] = min(span[0], float(value)), max(span[1], float(value))

    def see(self, turns: Iterable[Turn], records: Iterable[GameRecord] = ()) -> None:
        """Widen the running estimates with a round's rewards (turns and the records' seats)."""
        for t in turns:
            self._widen(t.game, t.level, t.seat, t.reward)
        for r in records:
            if r.error is None:
                for seat, value in enumerate(r.rewards):
                    self._widen(self.game, 0, seat, value)

    def normalise(self, value: float, game: str, level: int = 0, seat: int = 0) -> float:
        """``value`` of that seat as ``(value - mid) / half`` of its range. A range of one point (one
        reward seen so far) gives the sign of ``value - mid``, 0 for the point itself; no range at
        all leaves ``value`` as it is (nothing was declared or seen)."""
        span = self.range_of(game, level, seat)
        value = float(value)
        if span is None:
            return value
        lo, hi = span
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        if half <= 0:
            return float((value > mid) - (value < mid))
        # rounded far below float32's resolution (the update's), so that copies of a game in other
        # units give bit-identical rewards, not ones an ulp apart that could break a tie another way
        return round((value - mid) / half, DIGITS) + 0.0

    def record_rewards(self, rewards: list[float]) -> list[float]:
        """A top-level game's rewards, one per seat, normalised (a new list)."""
        return [self.normalise(r, self.game, 0, seat) for seat, r in enumerate(rewards)]

    @contextmanager
    def normalised(self, turns: list[Turn], records: list[GameRecord] = ()) -> Iterator[None]:
        """While the block runs, each turn's ``reward`` and each finished record's ``rewards`` hold
        their normalised values (new objects: lists the standings kept are not touched); the game's
        own values come back after it, also when it raises."""
        turn_raw = [t.reward for t in turns]
        record_raw = [r.rewards for r in records]
        try:
            for t in turns:
                if t.reward is not None:
                    t.reward = self.normalise(t.reward, t.game, t.level, t.seat)
            for r in records:
                if r.error is None and r.rewards:
                    r.rewards = self.record_rewards(r.rewards)
            yield
        finally:
            for t, raw in zip(turns, turn_raw):
                t.reward = raw
            for r, raw in zip(records, record_raw):
                r.rewards = raw

    def state_dict(self) -> dict:
        return {"seen": {k: list(v) for k, v in self.seen.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.seen = {str(k): [float(v[0]), float(v[1])] for k, v in (state or {}).get("seen", {}).items()}

    def describe(self) -> str:
        """How rewards are normalised, in one phrase."""
        if self.facts.seat_ranges is not None:
            spans = ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in self.facts.seat_ranges)
            return f"rewards scaled by each seat's declared range ({spans})"
        if self.facts.payoff_range is not None:
            lo, hi = self.facts.payoff_range
            return f"rewards scaled by the declared payoff range [{lo:g}, {hi:g}]"
        return "rewards scaled by the range seen so far (no payoff range declared)"
