"""The league's standings: Elo, the win-rate and relative-payoff matrices, the Bradley-Terry records
and the match history, kept together because every game updates all four at once and a checkpoint saves them together."""

from __future__ import annotations

import json
from pathlib import Path

from autocurricula.loop.rating import (Elo, Payoff, RelativePayoff, bradley_terry_bootstrap, format_leaderboard,
                                  leaderboard_rows, meta_weights)
from autocurricula.files import open_append
from autocurricula.records import GameRecord, Player, is_scripted

HISTORY = "match_history.jsonl"


class Leaderboard:
    """Printable Elo table, rated players best first, then the unrated ones (no games yet);
    ``rows`` / ``to_dicts()`` for programs. A league's rows carry two mixtures: ``deploy`` (Nash
    over the players with an adapter: what to deploy) and ``nash`` (over every player, scripted
    ones included: the league's meta-strategy)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def to_dicts(self) -> list[dict]:
        return [dict(r) for r in self.rows]

    def __str__(self) -> str:
        return format_leaderboard(self.rows)

    __repr__ = __str__

    def __getitem__(self, i):
        return self.rows[i]

    def __len__(self):
        return len(self.rows)


class Standings:
    """What the games said so far. ``ratings`` is a :class:`~autocurricula.loop.config.RatingConfig`;
    the match history is appended to ``output_dir/match_history.jsonl``."""

    def __init__(self, ratings, output_dir: str | Path, seed: int):
        self.settings, self.seed = ratings, seed
        self.elo = Elo(k=ratings.elo_k, scale=ratings.elo_scale, initial=ratings.elo_initial)
        self.payoff = Payoff(ratings.payoff_decay)
        self.relative = RelativePayoff(ratings.payoff_decay)
        self.bt_records: list[tuple] = []
        self.history_path = Path(output_dir) / HISTORY

    def record(self, records: list[GameRecord], *, epoch: int, round_: int, step: int,
               frozen: set[str] | frozenset = frozenset()) -> None:
        """Every finished game of a round: ratings between distinct players, and one history line.
        Pairs of two ``frozen`` players keep every game in the relative payoffs (no decay)."""
        games = []
        with open_append(self.history_path) as fh:
            for r in records:
                if r.error:
                    continue
                ids = [p["id"] for p in r.players]
                if len(set(ids)) > 1:
                    self.elo.update(ids, r.rewards, step=step)
                    self.payoff.update_match(ids, r.rewards)
                    games.append((ids, r.rewards, r.deal))
                    if len(ids) == 2:
                        a, b = r.rewards
                        self.bt_records.append((ids[0], ids[1], 1.0 if a > b else 0.0 if a < b else 0.5))
                row = {"game_id": r.game_id, "epoch": epoch, "round": round_, "players": ids,
                       "roles": [p.get("role") for p in r.players], "rewards": r.rewards,
                       "versions": [p.get("version") for p in r.players]}
                fh.write(json.dumps(row if r.deal is None else {**row, "deal": r.deal}) + "\n")
        self.relative.update_games(games, frozen)  # a duplicate pair is one sample

    def leaderboard(self, players: list[Player], meta: list[Player] | None = None,
                    deploy: dict[str, float] | None = None) -> Leaderboard:
        """Elo with Bradley-Terry intervals and each player's weight in two meta-strategies of the
        relative payoffs (:meth:`meta_strategy`): over the players with an adapter (``deploy``) and
        over every player (``nash``); ``meta`` narrows both to the players of the meta-game, and a
        given ``deploy`` (the trainer's ``deployable_mixture()``) replaces the first."""
        bt = None
        if self.bt_records and self.settings.bt_bootstrap:
            bt = bradley_terry_bootstrap(self.bt_records, rounds=self.settings.bt_bootstrap, seed=self.seed)
        meta = players if meta is None else meta
        nash = self.meta_strategy([p.id for p in meta])  # the league's meta-strategy
        if deploy is None:
            deploy = self.meta_strategy([p.id for p in meta if not is_scripted(p)])
        return Leaderboard(leaderboard_rows(players, self.elo, bt, nash=nash, deploy=deploy))

    def meta_strategy(self, ids: list[str]) -> dict[str, float]:
        """``{player: weight}``: the mixture over ``ids`` that holds its own best in the meta-game of
        relative payoffs, each entry at its lower confidence bound (``RatingConfig.meta_z``)."""
        return meta_weights(self.relative, ids, self.settings.meta_z)

    def match_history(self):
        """Every game played: a ``datasets.Dataset`` (a list of dicts without ``datasets``)."""
        rows = [json.loads(line) for line in self.history_path.read_text().splitlines()] \
            if self.history_path.exists() else []
        if any("deal" in r for r in rows):  # a Dataset takes its columns from the first row
            rows = [{**r, "deal": r.get("deal")} for r in rows]
        try:
            from datasets import Dataset
        except ImportError:
            return rows
        return Dataset.from_list(rows)

    def state_dict(self) -> dict:
        return {"elo": self.elo.state_dict(), "payoff": self.payoff.state_dict(),
                "bt_records": [list(r) for r in self.bt_records], "relative": self.relative.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.elo.load_state_dict(state["elo"])
        self.payoff.load_state_dict(state["payoff"])
        self.bt_records = [tuple(r) for r in state["bt_records"]]
        self.relative.load_state_dict(state.get("relative", {}))
