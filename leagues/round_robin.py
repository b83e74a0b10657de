"""Round robin (head-to-head, as in an Elo arena): a fixed population of players, every pair
meets in both seat orders every round, and the Elo / Bradley-Terry leaderboard ranks them.
For two-player zero-sum games; players are learners (``roles``) plus any fixed ``opponents``.
There is no opponent choice to override: :meth:`RoundRobinTrainer.match` is every ordered pair."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

from autocurricula.loop.config import AutocurriculumConfig
from autocurricula.leagues.promote import league_config
from autocurricula.loop.trainer import AutocurriculumTrainer
from autocurricula.training.config import help_field


@dataclass
class RoundRobinRules:
    """The round robin's own settings: its learners and where they start."""

    roles: list[str] = help_field("one learner per entry, all from the base model at epoch 0 (the same role twice "
                                  "gives two players of that role)", default_factory=lambda: ["player", "player"])
    init: str = help_field("'base' (every learner starts from the base model) or 'inherit' (a learner of an "
                           "existing role copies it)", "base")

    def __post_init__(self):
        me = type(self).__name__
        if not isinstance(self.roles, (list, tuple)) or not self.roles \
                or not all(isinstance(r, str) and r for r in self.roles):
            raise ValueError(f"{me}.roles must be a non-empty list of role names, got {self.roles!r}")
        if self.init not in ("base", "inherit"):
            raise ValueError(f"{me}.init must be 'base' or 'inherit', got {self.init!r}")


@dataclass
class RoundRobinConfig(AutocurriculumConfig):
    """The loop's settings plus the round robin's own, in ``rules``."""

    rules_class: ClassVar[type] = RoundRobinRules
    rules: RoundRobinRules = help_field("the round robin's own settings: a RoundRobinRules (the config's rules_class) "
                                        "or a dict of its fields; None = the defaults", None)


class RoundRobinTrainer(AutocurriculumTrainer):
    """Every pair of players plays ``config.matches`` games per seat order every round; nobody is
    added after epoch 0, so the leaderboard compares the same population throughout."""

    config_class = RoundRobinConfig

    def __init__(self, ac_config: RoundRobinConfig | None = None, opponents: list[dict] | None = None, **overrides):
        super().__init__(league_config(ac_config, self.config_class, type(self).__name__), opponents, **overrides)

    def entry(self) -> list[dict]:
        if self.current_epoch > 0:
            return []
        init = {"init": "base"} if self.config.rules.init == "base" else {}
        return [{"role": role, **init} for role in self.config.rules.roles] + [dict(o) for o in self.opponents]

    def match(self) -> list[tuple]:
        """Every ordered pair of players: each pair in both seat orders."""
        return [pair for a, b in itertools.combinations(self.players, 2) for pair in ((a, b), (b, a))]
