"""PSRO (Lanctot et al. 2017): a population whose mixture approaches an equilibrium.

The *restricted game* is the meta-game among the population: frozen players (the initial policy,
then every accepted best response) plus any fixed ``opponents`` given as anchors. Its entries are
the standings' mean relative rewards, each with a count and a standard error; the meta-strategy
is the mixture that holds its own best when every entry is taken at its lower confidence bound
(``RatingConfig.meta_z``; measured against plain LP Nash and regret matching by
``research/meta_solvers.py``).

Each round:

* every *responder* (a learner) plays ``games_per_round`` games against opponents drawn from the
  meta-strategy, so it trains as a best response to the mixture;
* ``eval_games`` games between population members go to the entries whose uncertainty weighs
  most on the mixture (new members first), so the restricted game is measured where it matters;
* a responder whose mean relative reward against the population, over its games of the last
  ``join_window`` rounds since it last joined (one sample per game, or per deal when its games
  are duplicate pairs: ``responder_pairs`` or a ``match`` of your own), is above 0 by ``join_z``
  standard errors joins the population as a frozen copy. The window pools enough games for a sharp test and forgets those
  of a version too old to speak for the current one. Otherwise nothing joins: the mixture is not
  beaten. The responder's games of that last round are the new member's first entries
  (:meth:`PSROTrainer.first_estimates`), so a member that joins in the final round still counts.

A responder that joins starts again from the base model (``reset_on_join``: one that went on from
its own near-pure policy could no longer find a move it had stopped playing), and so does one
that has not joined for ``restart_rounds`` rounds (a policy gradient can settle on a pure reply
that is no best response; a fresh start is another draw).

The deployed policy is the meta-strategy over the population's adapters
(``trainer.deployable_mixture()``, ``trainer.export_mixture(folder)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from autocurricula.loop.config import AutocurriculumConfig
from autocurricula.leagues.promote import league_config
from autocurricula.loop.pool import snapshot_spec
from autocurricula.records import GameRecord, Player
from autocurricula.loop.trainer import AutocurriculumTrainer
from autocurricula.training.config import help_field


@dataclass
class PSRORules:
    """PSRO's budgets and its joining rule (the defaults need no change per game)."""

    responders: int = help_field("learners trained as best responses to the meta-strategy", 1)
    games_per_round: int = help_field("each responder's games per round, against opponents drawn from the "
                                      "meta-strategy", 64)
    eval_games: int = help_field("games per round between population members, on the restricted game's most "
                                 "uncertain entries", 64)
    join_z: float = help_field("a responder joins when its mean relative reward against the mixture exceeds 0 by "
                               "join_z standard errors", 2.0)
    join_window: int = help_field("rounds of a responder's games (since it last joined) that the joining test pools", 4)
    restart_rounds: int = help_field("a responder that has not joined for this many rounds starts again from the base "
                                     "model (0 = never)", 12)
    reset_on_join: bool = help_field("a responder that joins starts again from the base model (False: it goes on "
                                     "from its own weights)", True)
    responder_pairs: bool = help_field("play each responder's games as duplicate pairs (both seat orders on one deal "
                                       "against one drawn opponent), so that the joining test sees its gain without "
                                       "the deal's luck: for games of chance", False)

    def __post_init__(self):
        me = type(self).__name__
        if self.responders < 1:
            raise ValueError(f"PSRO needs at least one responder: set {me}.responders >= 1, got {self.responders}")
        if self.games_per_round < 2 or self.eval_games < 0:
            raise ValueError(f"{me}.games_per_round must be >= 2 (a standard error needs two games) and eval_games "
                             f">= 0, got {self.games_per_round} and {self.eval_games}")
        if self.restart_rounds < 0:
            raise ValueError(f"{me}.restart_rounds must be >= 0 (0 = never), got {self.restart_rounds}")
        if not isinstance(self.responder_pairs, bool):
            raise ValueError(f"{me}.responder_pairs must be True or False, got {self.responder_pairs!r}")
        if self.responder_pairs and (self.games_per_round % 2 or self.games_per_round < 4):
            raise ValueError(f"{me}.responder_pairs plays games_per_round in pairs, and a standard error needs two: "
                             f"make games_per_round even and >= 4, got {self.games_per_round}")
        if self.join_window < 1:
            raise ValueError(f"{me}.join_window must be >= 1 round, got {self.join_window}")
        if not self.join_z >= 0:
            raise ValueError(f"{me}.join_z must be >= 0, got {self.join_z}")


@dataclass
class PSROConfig(AutocurriculumConfig):
    """The loop's settings plus PSRO's own, in ``rules``."""

    rules_class: ClassVar[type] = PSRORules
    rules: PSRORules = help_field("PSRO's own settings: a PSRORules (the config's rules_class) or a dict of its "
                                  "fields; None = the defaults", None)


def _games(records: list[GameRecord], player: str, opponents: set[str]):
    for r in records:
        ids = [p["id"] for p in r.players]
        if r.error or len(ids) != 2 or player not in ids:
            continue
        me = ids.index(player)
        if ids[1 - me] in opponents:
            yield r, ids[1 - me], (float(r.rewards[me]) - float(r.rewards[1 - me])) / 2


def games_against(records: list[GameRecord], player: str, opponents: set[str]) -> list[tuple[str, float]]:
    """``(opponent, relative reward (r_me - r_other) / 2)`` of ``player`` in each finished two-player
    game of ``records`` against one of ``opponents``."""
    return [(opponent, d) for _, opponent, d in _games(records, player, opponents)]


def deal_samples(records: list[GameRecord], player: str, opponents: set[str]) -> list[tuple[str, float]]:
    """:func:`games_against` with one sample per deal: ``(opponent, mean relative reward of the
    deal's games)``, in which a duplicate pair's luck cancels (a game with no deal is a sample of
    its own)."""
    deals: dict[tuple, list[float]] = {}
    for r, opponent, d in _games(records, player, opponents):
        deals.setdefault((r.game_id if r.deal is None else r.deal, opponent), []).append(d)
    return [(opponent, sum(v) / len(v)) for (_, opponent), v in deals.items()]


def relative_rewards(records: list[GameRecord], player: str, opponents: set[str]) -> np.ndarray:
    """``player``'s relative rewards against ``opponents``, one sample per deal (:func:`deal_samples`)."""
    return np.asarray([d for _, d in deal_samples(records, player, opponents)], dtype=np.float64)


def beats_mixture(rewards: np.ndarray, z: float) -> bool:
    """Whether a mean relative reward is above 0 by ``z`` standard errors (at least two games)."""
    if len(rewards) < 2:
        return False
    se = rewards.std(ddof=1) / np.sqrt(len(rewards))
    return bool(rewards.mean() - z * se > 0)


def eval_priorities(weights: np.ndarray, stderr: np.ndarray, games: np.ndarray) -> np.ndarray:
    """Sampling probabilities over the population's unordered pairs (row-major upper triangle): a
    pair's standard error times how much the meta-strategy weighs its two players, with every pair
    kept possible; an unplayed pair counts as the largest error."""
    k = len(weights)
    iu = np.triu_indices(k, 1)
    se = np.where(games[iu] > 0, np.nan_to_num(stderr[iu], nan=0.0), np.nan)
    se = np.where(np.isnan(se), np.nanmax(se, initial=1.0), se)
    p = se * (weights[iu[0]] + weights[iu[1]] + 1.0 / k)
    return p / p.sum() if p.sum() > 0 else np.full(len(p), 1.0 / len(p))


class PSROTrainer(AutocurriculumTrainer):
    """PSRO over one game; ``opponents`` adds fixed (e.g. scripted) anchors to the restricted game.

    :meth:`responder_opponent` is a responder's opponent rule and :meth:`eval_pairs` the
    population's measurement; override either in a subclass."""

    config_class = PSROConfig

    def __init__(self, ac_config: PSROConfig | None = None, opponents: list[dict] | None = None, **overrides):
        super().__init__(league_config(ac_config, self.config_class, type(self).__name__), opponents, **overrides)
        self._since_join: dict[str, list[list[float]]] = {}  # responder -> per round, relative rewards since it joined
        self._tried: dict[str, int] = {}  # responder -> rounds since it last joined or started again

    def population(self) -> list[Player]:
        """The restricted game's players: every frozen player (snapshots and anchors)."""
        return [p for p in self.players if p.frozen]

    def meta_population(self) -> list[Player]:
        return self.population()

    def responders(self) -> list[Player]:
        return [p for p in self.players if not p.frozen]

    def entry(self) -> list[dict]:
        if self.current_epoch != 0:
            return []
        specs = []
        for _ in range(self.config.rules.responders):
            me = {"role": "responder"}
            specs += [me, snapshot_spec(me, role="population")]  # the population starts with the initial policy
        return specs + [dict(o) for o in self.opponents]

    def match(self) -> list[tuple]:
        games, rules = [], self.config.rules
        for me in self.responders():
            if rules.responder_pairs:
                for i in range(rules.games_per_round // 2):
                    games += self.mirrored(me, self.responder_opponent(me), f"{me.id}/{i}")
                continue
            games += [self.random_seats(me, self.responder_opponent(me)) for _ in range(rules.games_per_round)]
        return games + self.eval_pairs(rules.eval_games)

    def responder_opponent(self, player: Player) -> Player:
        """A responder's opponent: a population member drawn by the meta-strategy."""
        return self.meta_opponent(self.population())

    def eval_pairs(self, n: int) -> list[tuple]:
        """``n`` games between population members, pairs drawn by :func:`eval_priorities`."""
        pop = self.population()
        if n == 0 or len(pop) < 2:
            return []
        ids = [p.id for p in pop]
        weights = self.standings.meta_strategy(ids)
        _, se, games = self.standings.relative.matrices(ids)
        probs = eval_priorities(np.array([weights[i] for i in ids]), se, games)
        iu = np.triu_indices(len(pop), 1)
        picks = self.rng.choice(len(probs), size=n, p=probs)
        return [self.random_seats(pop[iu[0][k]], pop[iu[1][k]]) for k in picks]

    def on_round_end(self, records):
        """Each responder that has beaten the mixture over its last ``join_window`` rounds joins
        the population (a frozen copy)."""
        members, rules = {p.id for p in self.population()}, self.config.rules
        for me in self.responders():
            rounds = self._since_join.setdefault(me.id, [])
            rounds.append(relative_rewards(records, me.id, members).tolist())
            del rounds[:-rules.join_window]
            self._tried[me.id] = self._tried.get(me.id, 0) + 1
            if beats_mixture(np.asarray([r for rnd in rounds for r in rnd]), rules.join_z):
                rounds.clear()
                self._tried[me.id] = 0
                member = yield snapshot_spec(me, role="population")  # the pool sends the new player back
                self.first_estimates(member, deal_samples(records, me.id, members))
                if rules.reset_on_join:
                    self.reset_player(me)
            elif rules.restart_rounds and self._tried[me.id] >= rules.restart_rounds:
                rounds.clear()
                self._tried[me.id] = 0
                self.reset_player(me)

    def first_estimates(self, member: Player, games: list[tuple[str, float]]) -> None:
        """A new member's first entries in the restricted game: the games its responder played in the
        round it joined, one sample per deal, against the members the mixture drew (one update older
        than the snapshot).
        Without them a member that joins late has no estimate, and the mixture cannot weigh the best
        response that beats it."""
        for opponent, d in games:
            self.standings.relative.update(member.id, opponent, d, decay=False)

    def extra_state(self) -> dict:
        return {"since_join": {k: [list(r) for r in v] for k, v in self._since_join.items()}, "tried": dict(self._tried)}

    def load_extra_state(self, state: dict) -> None:
        self._since_join = {k: [[float(x) for x in r] for r in v] for k, v in state.get("since_join", {}).items()}
        self._tried = {k: int(v) for k, v in state.get("tried", {}).items()}
