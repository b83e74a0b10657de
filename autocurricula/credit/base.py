"""The credit protocol :class:`Credit` (every hook has a default) and helpers every method shares."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

from autocurricula.arena.game import game_moves
from autocurricula.records import Turn

if TYPE_CHECKING:
    from autocurricula.records import GameRecord
    from autocurricula.arena.replay import Replayer


class Credit:
    """A credit method as the trainer uses it. Before training: :meth:`bind`, then :meth:`check_game`.
    Each round: :meth:`see_round` (``replays = True`` only), :meth:`assign` (from :meth:`advantages`,
    which may learn), :meth:`extra_turns`, :meth:`metrics`. ``state_dict`` keys sit next to the
    trainer's own in ``state.json``, so a method names its sections (``"rae"``, ``"values"``)."""

    name: str = "credit"
    replays: bool = False  # the method replays games: the trainer logs every call and calls see_round

    def bind(self, grpo_config, seed: int) -> None:
        """Receive the trainer's GRPO settings (``scale_rewards``, ``temperature``) and the run's seed."""

    def check_game(self, play) -> None:
        """Raise ``ValueError`` for a game this method cannot use (called before the model loads)."""

    def see_round(self, records: list[GameRecord], replayer: Replayer) -> None:
        """See the round's games before :meth:`assign` (called only when ``replays`` is True)."""

    def advantages(self, turns: list[Turn]) -> list[float]:
        """One advantage per turn; may learn from the turns."""
        raise NotImplementedError(f"{type(self).__name__} must define advantages(turns) -> list[float]")

    def assign(self, turns: Iterable[Turn]) -> list[Turn]:
        """Set ``turn.advantage`` on every turn from :meth:`advantages`."""
        turns = list(turns)
        for t, a in zip(turns, self.advantages(turns)):
            t.advantage = float(a)
        return turns

    def extra_turns(self, turns: list[Turn]) -> list[Turn]:
        """Turns to train on besides the sampled ones, from the learners' ``turns`` of this round."""
        return []

    def metrics(self) -> dict:
        """This round's figures, named ``credit/...``."""
        return {}

    def state_dict(self) -> dict:
        """What the method learnt, JSON-able, under keys of its own."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved (``state`` also holds the trainer's keys)."""


def rewards(turns: list[Turn]) -> list[float]:
    """Every turn's reward as a float; a missing or non-finite reward is an error."""
    missing = [t for t in turns if t.reward is None]
    if missing:
        raise ValueError(f"{len(missing)} turns have no reward (e.g. {missing[0].player} in game "
                         f"{missing[0].game_id}); assign rewards when the game ends")
    bad = [t for t in turns if not math.isfinite(t.reward)]
    if bad:
        raise ValueError(f"non-finite reward {bad[0].reward} for {bad[0].player} in game {bad[0].game_id}")
    return [float(t.reward) for t in turns]


def episodes(turns: list[Turn]) -> list[list[int]]:
    """The turns' indices grouped into episodes: one player's turns in one (sub-)game, in the order made."""
    out: dict[tuple, list[int]] = {}
    for i, t in enumerate(turns):
        out.setdefault((t.game_id, t.level, t.parent, t.role, t.player), []).append(i)
    return list(out.values())
