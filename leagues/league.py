"""AlphaStar-style league (Vinyals et al., Nature 2019, and its published pseudocode).

Roles: main agents (35% self-play, 50% PFSP over all past players, 15% against exploiters they
fail to beat or past selves they forget, falling back to self-play), main exploiters (play the
current main agents; reset to the base adapter at each snapshot) and league exploiters (PFSP
over everyone with ``linear_capped`` weighting; reset with probability 0.25). A frozen snapshot
joins when a learner's win rate against its opponents exceeds 0.7, or after a step budget.
Differences from AlphaStar: budgets are counted in rounds (one update each), not agent steps;
new players inherit their parent's adapter instead of the supervised initial weights, except
where the rules reset; fixed ``opponents`` (e.g. a minimax bot) count as historical opponents (a
pure league passes none).

Each role's opponent choice is a public method (:meth:`LeagueTrainer.main_agent_opponent`,
:meth:`~LeagueTrainer.main_exploiter_opponent`, :meth:`~LeagueTrainer.league_exploiter_opponent`),
so a subclass changes one role's rule by overriding one method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from autocurricula.loop.config import AutocurriculumConfig
from autocurricula.leagues.promote import league_config
from autocurricula.loop.pool import snapshot_spec
from autocurricula.loop.trainer import AutocurriculumTrainer
from autocurricula.records import Player
from autocurricula.training.config import help_field

EXPLOITER_ROLES = ("main_exploiter", "league_exploiter")  # the roles exploiter_games sets

WEIGHTINGS = {
    "squared": lambda x: (1 - x) ** 2,
    "variance": lambda x: x * (1 - x),
    "linear": lambda x: 1 - x,
    "linear_capped": lambda x: np.minimum(0.5, 1 - x),
    "uniform": lambda x: np.ones_like(x),
}


def pfsp(win_rates, weighting: str = "squared") -> np.ndarray:
    """Prioritised fictitious self-play probabilities from win rates against each candidate,
    normalised after weighting; uniform when every weight is 0 (DI-engine returns NaN there)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown PFSP weighting {weighting!r}; use one of {sorted(WEIGHTINGS)}")
    x = np.asarray(win_rates, dtype=np.float64)
    if x.size == 0:
        raise ValueError("pfsp needs at least one candidate")
    w = WEIGHTINGS[weighting](x)
    total = w.sum()
    return np.full(x.size, 1.0 / x.size) if total < 1e-10 else w / total


@dataclass
class LeagueRules:
    """The league's roles, budgets and AlphaStar's constants (the defaults)."""

    main_agents: int = help_field("main agents (AlphaStar: 1 per race)", 1)
    main_exploiters: int = help_field("main exploiters", 1)
    league_exploiters: int = help_field("league exploiters", 2)
    games_per_learner: int = help_field("games each learner plays per round", 16)
    exploiter_games: int | None = help_field("games each exploiter plays per round (None = games_per_learner); fewer "
                                             "leaves the main agents more of the compute on a small budget", None)
    selfplay_share: float = help_field("main agents: share of self-play", 0.35)
    pfsp_share: float = help_field("main agents: share of PFSP over past players", 0.5)
    main_pfsp_weighting: str = help_field("main agents' PFSP weighting", "squared")
    exploiter_weighting: str = help_field("main exploiters vs past main agents", "variance")
    league_exploiter_weighting: str = help_field("league exploiters' PFSP", "linear_capped")
    selfplay_min_win_rate: float = help_field("below this vs a main agent, play its past instead", 0.3)
    exploiter_min_win_rate: float = help_field("main exploiter: below this vs the main agent, play its past", 0.1)
    verification_win_rate: float = help_field("main agents play exploiters they beat less than this", 0.3)
    forgetting_win_rate: float = help_field("main agents replay past selves they beat less than this", 0.7)
    snapshot_win_rate: float = help_field("snapshot when the min win rate vs opponents exceeds this", 0.7)
    snapshot_min_rounds: int = help_field("rounds between snapshots at least (AlphaStar: 2e9 steps)", 2)
    snapshot_max_rounds: int = help_field("snapshot anyway after this many rounds (AlphaStar: 4e9)", 4)
    league_exploiter_reset_prob: float = help_field("league exploiters reset to base at a snapshot with this "
                                                    "probability (AlphaStar: 0.25)", 0.25)
    anchor_share: float = help_field("main agents: share of games against the fixed `opponents` (e.g. scripted "
                                     "baselines), drawn uniformly; the league rules pick the rest. Not in AlphaStar "
                                     "(0): there they only join PFSP, where a growing pool of snapshots dilutes "
                                     "them", 0.0)

    def __post_init__(self):
        me = type(self).__name__
        if self.main_agents < 1:
            raise ValueError(f"a league needs at least one main agent: set {me}.main_agents >= 1, "
                             f"got {self.main_agents}")
        if self.games_per_learner < 1 or (self.exploiter_games is not None and self.exploiter_games < 1):
            raise ValueError(f"{me}.games_per_learner and exploiter_games must be >= 1 (exploiter_games None = "
                             "games_per_learner; for no exploiters set main_exploiters=0 and league_exploiters=0)")
        if not 0 <= self.anchor_share <= 1:
            raise ValueError(f"{me}.anchor_share must be in [0, 1], got {self.anchor_share}")
        if self.selfplay_share + self.pfsp_share > 1:
            raise ValueError(f"{me}.selfplay_share + pfsp_share must be <= 1 (the rest is verification), got "
                             f"{self.selfplay_share} + {self.pfsp_share}")
        for name, w in (("main_pfsp_weighting", self.main_pfsp_weighting),
                        ("exploiter_weighting", self.exploiter_weighting),
                        ("league_exploiter_weighting", self.league_exploiter_weighting)):
            if w not in WEIGHTINGS:
                raise ValueError(f"{me}.{name} {w!r} is unknown; set one of {sorted(WEIGHTINGS)}")


@dataclass
class LeagueConfig(AutocurriculumConfig):
    """The loop's settings plus the league's own, in ``rules``."""

    rules_class: ClassVar[type] = LeagueRules
    rules: LeagueRules = help_field("the league's roles, budgets and constants: a LeagueRules (the config's "
                                    "rules_class) or a dict of its fields; None = AlphaStar's defaults", None)


class LeagueTrainer(AutocurriculumTrainer):
    """AlphaStar league over one game; ``opponents`` adds fixed (e.g. scripted) historical players.

    ``match()`` gives every learner its round's games; each game's opponent comes from
    :meth:`opponent_for`, which asks the learner's role: :meth:`main_agent_opponent`,
    :meth:`main_exploiter_opponent` or :meth:`league_exploiter_opponent`. Override one of them to
    change that role's rule; :meth:`pfsp_opponent` is PFSP over any list of candidates."""

    config_class = LeagueConfig

    def __init__(self, ac_config: LeagueConfig | None = None, opponents: list[dict] | None = None, **overrides):
        super().__init__(league_config(ac_config, self.config_class, type(self).__name__), opponents, **overrides)
        if self.config.rules.anchor_share > 0 and not self.opponents:
            raise ValueError(f"rules.anchor_share={self.config.rules.anchor_share} sends games to the fixed "
                             f"opponents, but this league has none: pass opponents=[...] or set rules.anchor_share=0 "
                             f"for a pure league")
        self._last_snapshot: dict[str, int] = {}

    # who is who ----------------------------------------------------------
    def learners(self, role: str | None = None) -> list[Player]:
        """The players that train (not frozen), of ``role`` if given."""
        return [p for p in self.players if not p.frozen and (role is None or p.role == role)]

    def historical(self) -> list[Player]:
        """The frozen players: snapshots and the fixed ``opponents``."""
        return [p for p in self.players if p.frozen]

    def win_rates(self, player: Player, others: list[Player]) -> np.ndarray:
        """``player``'s win rate against each of ``others``, from the payoff matrix (0.5 before any game)."""
        return np.array(self.payoff.win_rates(player.id, [o.id for o in others]), dtype=np.float64)

    def pfsp_opponent(self, player: Player, candidates: list[Player], weighting: str) -> Player:
        """One of ``candidates``, drawn by prioritised fictitious self-play (:func:`pfsp`) on
        ``player``'s win rates against them."""
        probs = pfsp(self.win_rates(player, candidates), weighting)
        return candidates[int(self.rng.choice(len(candidates), p=probs))]

    # entry ----------------------------------------------------------------
    def entry(self) -> list[dict]:
        if self.current_epoch != 0:
            return []
        rules = self.config.rules
        specs = []
        for _ in range(rules.main_agents):
            main = {"role": "main_agent"}
            specs += [main, snapshot_spec(main)]  # AlphaStar seeds the league with the initial agent
        for role, n in (("main_exploiter", rules.main_exploiters), ("league_exploiter", rules.league_exploiters)):
            specs += [{"role": role, "init": "base"} for _ in range(n)]
        return specs + [dict(o) for o in self.opponents]

    # match -----------------------------------------------------------------
    def match(self) -> list[tuple]:
        games = []
        rules = self.config.rules
        for learner in self.learners():
            n = rules.games_per_learner
            if learner.role in EXPLOITER_ROLES and rules.exploiter_games is not None:
                n = rules.exploiter_games
            for _ in range(n):
                games.append(self.random_seats(learner, self.opponent_for(learner)))
        return games

    def opponent_for(self, player: Player) -> Player:
        """The opponent of one of ``player``'s games, by its role's rule."""
        role = player.role
        if role == "main_exploiter":
            return self.main_exploiter_opponent(player)
        if role == "league_exploiter":
            return self.league_exploiter_opponent(player)
        return self.main_agent_opponent(player)

    def anchors(self) -> list[Player]:
        """The fixed ``opponents`` in the pool (scripted baselines), found by their ids."""
        if any("id" not in o for o in self.opponents):
            raise ValueError("anchor_share finds the fixed opponents by id: give every entry of `opponents` an "
                             "'id' (e.g. {'id': 'random', 'role': 'random', 'policy': fn})")
        ids = {o["id"] for o in self.opponents}
        return [p for p in self.players if p.id in ids]

    def main_agent_opponent(self, player: Player) -> Player:
        """A main agent's opponent: ``anchor_share`` of the games against the fixed ``opponents``;
        of the rest, ``pfsp_share`` PFSP over the historical players, ``selfplay_share`` self-play
        (:meth:`selfplay_opponent`) and the remainder :meth:`verification_opponent`, falling back to
        self-play."""
        rules = self.config.rules
        if rules.anchor_share > 0:  # no draw at 0: the AlphaStar schedule keeps its random stream
            anchors = self.anchors()
            if anchors and self.rng.random() < rules.anchor_share:
                return anchors[int(self.rng.integers(len(anchors)))]
        coin = self.rng.random()
        historical = self.historical()
        if coin < rules.pfsp_share and historical:
            return self.pfsp_opponent(player, historical, rules.main_pfsp_weighting)
        mains = self.learners("main_agent")
        opponent = mains[int(self.rng.integers(len(mains)))]
        if coin < 1 - rules.selfplay_share:
            found = self.verification_opponent(player, opponent)
            if found is not None:
                return found
        return self.selfplay_opponent(player, opponent)

    def selfplay_opponent(self, player: Player, opponent: Player) -> Player:
        """Self-play against the main agent ``opponent``, or, when ``player`` wins less than
        ``selfplay_min_win_rate`` against it, one of its past snapshots (PFSP, ``variance``)."""
        floor = self.config.rules.selfplay_min_win_rate
        if opponent is player or self.payoff.win_rate(player.id, opponent.id) > floor:
            return opponent
        past = [p for p in self.historical() if p.snapshot_of == opponent.id]
        return self.pfsp_opponent(player, past, "variance") if past else opponent

    def verification_opponent(self, player: Player, opponent: Player) -> Player | None:
        """A past main exploiter that ``player`` beats less than ``verification_win_rate``, else a
        past snapshot of the main agent ``opponent`` it beats less than ``forgetting_win_rate``
        (PFSP, ``squared``); None when there is neither."""
        rules = self.config.rules
        exploiters = {p.id for p in self.players if p.role == "main_exploiter"}
        exp_past = [p for p in self.historical() if p.snapshot_of in exploiters]
        if exp_past and self.win_rates(player, exp_past).min() < rules.verification_win_rate:
            return self.pfsp_opponent(player, exp_past, "squared")
        past = [p for p in self.historical() if p.snapshot_of == opponent.id]
        if past and self.win_rates(player, past).min() < rules.forgetting_win_rate:
            return self.pfsp_opponent(player, past, "squared")
        return None

    def main_exploiter_opponent(self, player: Player) -> Player:
        """A main exploiter's opponent: a current main agent, or, when ``player`` wins less than
        ``exploiter_min_win_rate`` against it, its past snapshots (PFSP, ``exploiter_weighting``)."""
        mains = self.learners("main_agent")
        opponent = mains[int(self.rng.integers(len(mains)))]
        if self.payoff.win_rate(player.id, opponent.id) > self.config.rules.exploiter_min_win_rate:
            return opponent
        past = [p for p in self.historical() if p.snapshot_of == opponent.id]
        return self.pfsp_opponent(player, past, self.config.rules.exploiter_weighting) if past else opponent

    def league_exploiter_opponent(self, player: Player) -> Player:
        """A league exploiter's opponent: PFSP over every historical player
        (``league_exploiter_weighting``); the first main agent while there is none."""
        historical = self.historical()
        if not historical:
            return self.learners("main_agent")[0]
        return self.pfsp_opponent(player, historical, self.config.rules.league_exploiter_weighting)

    # snapshots ---------------------------------------------------------------
    def on_round_end(self, records):
        """Snapshot every learner that is ready, one at a time: each snapshot joins the pool (the
        trainer adds the yielded spec) before the next learner's win rates are read; then the
        exploiters' reset rules apply."""
        for player in self.learners():
            if self.ready_to_snapshot(player):
                yield snapshot_spec(player)
                self._last_snapshot[player.id] = self.step + 1
                if self.resets_after_snapshot(player):
                    self.reset_player(player)

    def ready_to_snapshot(self, player: Player) -> bool:
        rules = self.config.rules
        passed = self.step + 1 - self._last_snapshot.get(player.id, 0)
        if passed < rules.snapshot_min_rounds:
            return False
        if player.role == "main_exploiter":
            opponents = self.learners("main_agent")
        else:
            opponents = self.historical()
        rates = self.win_rates(player, opponents) if opponents else np.array([0.0])
        return bool(rates.min() > rules.snapshot_win_rate or passed >= rules.snapshot_max_rounds)

    def resets_after_snapshot(self, player: Player) -> bool:
        """Main exploiters always restart from the base; league exploiters with a probability."""
        role = player.role
        return role == "main_exploiter" or (role == "league_exploiter"
                                            and self.rng.random() < self.config.rules.league_exploiter_reset_prob)

    def extra_state(self) -> dict:
        return {"last_snapshot": dict(self._last_snapshot)}

    def load_extra_state(self, state: dict) -> None:
        self._last_snapshot = {k: int(v) for k, v in state.get("last_snapshot", {}).items()}
