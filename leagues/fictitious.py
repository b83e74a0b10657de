"""Fictitious play with PFSP: one learner plays frozen snapshots of its past, chosen by
prioritised fictitious self-play (``weighting="uniform"`` is classic fictitious self-play,
Heinrich et al. 2015); a snapshot is taken every epoch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autocurricula.loop.config import AutocurriculumConfig
from autocurricula.leagues.promote import league_config
from autocurricula.leagues.league import WEIGHTINGS, pfsp
from autocurricula.loop.pool import snapshot_spec
from autocurricula.loop.trainer import AutocurriculumTrainer
from autocurricula.records import Player
from autocurricula.training.config import help_field


@dataclass
class FictitiousRules:
    """Fictitious play's own settings: the learner's games and how it picks past opponents."""

    games_per_round: int = help_field("games the learner plays per round", 32)
    weighting: str = help_field(f"PFSP weighting: one of {sorted(WEIGHTINGS)}", "squared")

    def __post_init__(self):
        me = type(self).__name__
        if not isinstance(self.games_per_round, int) or self.games_per_round < 1:
            raise ValueError(f"{me}.games_per_round must be a positive integer, got {self.games_per_round!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"{me}.weighting {self.weighting!r} is unknown; set one of {sorted(WEIGHTINGS)}")


@dataclass
class FictitiousConfig(AutocurriculumConfig):
    """The loop's settings plus fictitious play's own, in ``rules``."""

    rules_class: ClassVar[type] = FictitiousRules
    rules: FictitiousRules = help_field("fictitious play's own settings: a FictitiousRules (the config's rules_class) "
                                        "or a dict of its fields; None = the defaults", None)


class FictitiousPlayTrainer(AutocurriculumTrainer):
    """PFSP-only schedule; ``opponents`` adds fixed (e.g. scripted) players to the past pool."""

    config_class = FictitiousConfig

    def __init__(self, ac_config: FictitiousConfig | None = None, opponents: list[dict] | None = None, **overrides):
        super().__init__(league_config(ac_config, self.config_class, type(self).__name__), opponents, **overrides)

    def learner(self) -> Player:
        """The one player that trains."""
        return next(p for p in self.players if not p.frozen)

    def entry(self) -> list[dict]:
        if self.current_epoch == 0:
            me = {"role": "learner"}
            return [me, snapshot_spec(me)] + [dict(o) for o in self.opponents]  # the past starts with itself
        return [snapshot_spec(self.learner())]

    def match(self) -> list[tuple]:
        me = self.learner()
        return [self.random_seats(me, self.opponent_for(me)) for _ in range(self.config.rules.games_per_round)]

    def opponent_for(self, player: Player) -> Player:
        """A frozen player (a past snapshot or a fixed opponent), drawn by PFSP with ``weighting``
        on ``player``'s win rates against them."""
        past = [p for p in self.players if p.frozen]
        probs = pfsp(self.payoff.win_rates(player.id, [p.id for p in past]), self.config.rules.weighting)
        return past[int(self.rng.choice(len(past), p=probs))]
