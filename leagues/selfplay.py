"""Self-play: one main player against itself and its frozen past snapshots (fictitious self-play
when ``past_share`` > 0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autocurricula.loop.config import AutocurriculumConfig
from autocurricula.leagues.promote import league_config
from autocurricula.loop.pool import snapshot_spec
from autocurricula.loop.trainer import AutocurriculumTrainer
from autocurricula.records import Player
from autocurricula.training.config import help_field


@dataclass
class SelfPlayRules:
    """Self-play's own settings: the main player's games, its past opponents and its snapshots."""

    games_per_round: int = help_field("games the main player plays per round", 32)
    past_share: float = help_field("share of games against frozen past snapshots (and scripted opponents); the rest "
                                   "is mirror self-play", 0.2)
    snapshot_every: int = help_field("epochs between frozen snapshots of the main player", 1)
    average_last: int = help_field("with past_share 0: deploy the uniform mixture of the main player's last N "
                                   "iterates (it and its N - 1 latest snapshots, taken every snapshot_every "
                                   "epochs); 1: the last iterate alone", 1)

    def __post_init__(self):
        me = type(self).__name__
        if not 0 <= self.past_share <= 1:
            raise ValueError(f"{me}.past_share must be in [0, 1] (the share of games against the past), "
                             f"got {self.past_share!r}")
        if self.games_per_round <= 0 or self.snapshot_every <= 0:
            raise ValueError(f"{me}.games_per_round and snapshot_every must be positive, got {self.games_per_round!r} "
                             f"and {self.snapshot_every!r}")
        if self.average_last < 1:
            raise ValueError(f"{me}.average_last must be >= 1 (iterates to deploy), got {self.average_last}")
        if self.average_last > 1 and self.past_share > 0:
            raise ValueError(f"{me}.average_last > 1 averages the iterates of self-play with past_share=0; with "
                             "past_share > 0 the deployed mixture is the meta-strategy: set past_share=0 or "
                             "average_last=1")


@dataclass
class SelfPlayConfig(AutocurriculumConfig):
    """The loop's settings plus self-play's own, in ``rules``."""

    rules_class: ClassVar[type] = SelfPlayRules
    rules: SelfPlayRules = help_field("self-play's own settings: a SelfPlayRules (the config's rules_class) or a dict "
                                      "of its fields; None = the defaults", None)


class SelfPlayTrainer(AutocurriculumTrainer):
    """One learner (``role="main"``) versus itself and its past; ``opponents`` adds fixed players
    (e.g. scripted ``{"role": "minimax", "policy": fn}``) to the pool of past opponents."""

    config_class = SelfPlayConfig

    def __init__(self, ac_config: SelfPlayConfig | None = None, opponents: list[dict] | None = None, **overrides):
        super().__init__(league_config(ac_config, self.config_class, type(self).__name__), opponents, **overrides)

    def main_player(self) -> Player:
        """The learner (``role="main"``, not frozen)."""
        return next(p for p in self.players if p.role == "main" and not p.frozen)

    def meta_population(self) -> list[Player]:
        """With ``past_share`` 0 no game is played against the past, so there is no meta-game to solve:
        the players to deploy are the main player's last ``average_last`` iterates, newest first."""
        if self.config.rules.past_share > 0:
            return self.players
        main = next((p for p in self.players if p.role == "main" and not p.frozen), None)
        if main is None:
            return []
        past = [p for p in self.players if p.frozen and p.snapshot_of == main.id]
        return [main, *past[::-1][:self.config.rules.average_last - 1]]

    def deployable_mixture(self) -> dict[str, float]:
        """With ``past_share`` 0: the uniform mixture of :meth:`meta_population`, the average of the main
        player's last iterates, which damps the swings of the last one; otherwise the meta-strategy."""
        if self.config.rules.past_share > 0:
            return super().deployable_mixture()
        ids = [p.id for p in self.meta_population()]
        return {pid: 1 / len(ids) for pid in ids}

    def entry(self) -> list[dict]:
        if self.current_epoch == 0:
            return [{"role": "main"}] + [dict(o) for o in self.opponents]
        if self.current_epoch % self.config.rules.snapshot_every == 0:
            return [snapshot_spec(self.main_player())]
        return []

    def match(self) -> list[tuple]:
        main = self.main_player()
        return [self.random_seats(main, self.opponent_for(main)) for _ in range(self.config.rules.games_per_round)]

    def opponent_for(self, player: Player) -> Player:
        """``past_share`` of the games a frozen player (a past snapshot or a fixed opponent) drawn
        uniformly, the rest ``player`` itself (mirror self-play)."""
        past = [p for p in self.players if p.frozen]
        if past and self.rng.random() < self.config.rules.past_share:
            return past[int(self.rng.integers(len(past)))]
        return player
