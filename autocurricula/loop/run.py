"""One training run's parts, typed: what ``train`` builds before the first round and what the loop,
checkpoints, export and the Hub read. Helpers take a :class:`Run` (or the parts they need), never
the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from autocurricula.arena.arena import Arena
    from autocurricula.credit import Credit
    from autocurricula.credit.scale import RewardScale
    from autocurricula.engine import RolloutEngine, TrainableEngine
    from autocurricula.loop.config import AutocurriculumConfig
    from autocurricula.loop.pool import Pool
    from autocurricula.loop.standings import Standings
    from autocurricula.training.config import GRPOConfig, LoraSpec
    from autocurricula.training.update import Updater


@dataclass
class Run:
    """The parts of one run. ``engine`` holds every adapter and runs the updates; ``rollout`` plays
    the games: the engine itself, or servers / actors (then ``plays_elsewhere``), which receive each
    changed adapter before a round (:meth:`sync_rollout`)."""

    config: AutocurriculumConfig
    grpo: GRPOConfig
    lora: LoraSpec
    model_name: str
    engine: TrainableEngine
    rollout: RolloutEngine
    plays_elsewhere: bool
    game: Callable  # the play callable; checkpointed when it is Stateful (e.g. an artifact store)
    game_name: str
    pool: Pool
    updater: Updater
    standings: Standings
    credit: Credit
    rng: np.random.Generator
    arena: Arena
    callbacks: list
    scale: RewardScale | None = None  # the rewards' map to their seat's range, before credit (credit/scale.py)

    def frozen_ids(self) -> set[str]:
        return {p.id for p in self.pool.players if p.frozen}

    def overlaps(self) -> bool:
        """Whether the next round's games can play while this round updates: only when they run
        elsewhere (the engine's thread runs the update), and not while credit replays games through
        the same arena."""
        return self.plays_elsewhere and not self.credit.replays

    def sync_rollout(self) -> int | None:
        """With servers: push every adapter changed since the last round and drop removed players;
        the servers' retry count so far (None when games play on the engine)."""
        if not self.plays_elsewhere:
            return None
        self.rollout.sync_from(self.engine)
        return self.rollout.stats["retried"]
