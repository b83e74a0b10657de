"""Branch credit (VinePPO-style, Kazemnejad et al., arXiv 2410.01679): per-move credit with no lookup table.

For a turn t of a learner, the state before it, s_t, is the recorded game up to that call. K branch
games replay the game to s_t (earlier answers forced, :mod:`autocurricula.replay`), sample the move
at s_t and everything after it with seeds of their own, and play out; ``V(s_t)`` is the mean return
of the turn's seat over the K branches. The turn's advantage is

- ``advantage="return"`` (default): ``A_t = G - V(s_t)``, the game's return minus the branch value;
- ``advantage="td"`` (VinePPO proper, rewards only at the end): ``A_t = V(s_{t+1}) - V(s_t)``, where
  s_{t+1} is the state right after the move (branches that force the move too; after the game's
  last call, ``V = G``). It judges the move by where it led, not by the later luck of the game.

Nothing is keyed by prompt text, so it works for free-text games whose states never repeat. Cost:
``branch_samples`` x the branched turns of a round extra games per round (x2 for "td" when moves
alternate between learners and others), all batched in one ``Arena.run``. Turns not branched
(``branch_turns_per_game``, turns of sub-games, branches that all failed) get the RAE advantage.
The maths are the pure functions below; :class:`BranchCredit` runs the branches.
"""

from __future__ import annotations

import math
import time

import numpy as np

from autocurricula.arena import GameRecord, derive_seed
from autocurricula.credit import RAE, Credit, Turn
from autocurricula.replay import ReplayDiverged, Replayer, turn_positions

ADVANTAGES = ("return", "td")


def branch_value(returns: list[float]) -> float | None:
    """V(s): the mean of the branches' returns for one seat (None when no branch finished)."""
    vals = [float(r) for r in returns if r is not None and math.isfinite(r)]
    return sum(vals) / len(vals) if vals else None


def branch_advantage(ret: float, value: float, next_value: float | None = None) -> float:
    """``ret - value`` (``advantage="return"``), or ``next_value - value`` when ``next_value`` is
    given (``advantage="td"``: the value of the state the move led to)."""
    return (ret if next_value is None else next_value) - value


def pick_positions(positions: list[int], budget: int, seed: int) -> list[int]:
    """``budget`` of ``positions`` (all when ``budget`` is 0 or not smaller), drawn without
    replacement from ``seed``, in game order."""
    if budget <= 0 or budget >= len(positions):
        return sorted(positions)
    rng = np.random.default_rng(seed)
    return sorted(int(p) for p in rng.choice(sorted(positions), size=budget, replace=False))


class BranchCredit(Credit):
    """``credit="branch"``. The trainer logs every call of a round's games (``replays = True``) and
    calls :meth:`see_round` with the round's records and a :class:`~autocurricula.replay.Replayer`
    before :meth:`assign`. Checkpointed as ``"rae"`` (the fallback's baselines)."""

    name = "branch"
    replays = True

    def __init__(self, samples: int = 4, turns_per_game: int = 0, advantage: str = "return", seed: int = 0,
                 fallback: RAE | None = None):
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"branch_samples must be an integer >= 1, got {samples!r}")
        if not isinstance(turns_per_game, int) or turns_per_game < 0:
            raise ValueError(f"branch_turns_per_game must be an integer >= 0 (0 = all), got {turns_per_game!r}")
        if advantage not in ADVANTAGES:
            raise ValueError(f"branch_advantage must be one of {ADVANTAGES}, got {advantage!r}")
        self.samples, self.turns_per_game, self.advantage, self.seed = samples, turns_per_game, advantage, seed
        self.fallback = fallback or RAE()
        self._adv: dict[int, float] = {}  # id(turn) -> branch advantage, for this round's turns
        self._metrics: dict = {}
        self._checked = False

    def see_round(self, records: list[GameRecord], replayer: Replayer) -> None:
        """Run the round's branches and compute the branched turns' advantages."""
        t0 = time.perf_counter()
        self._adv = {}
        records = [r for r in records if r.error is None and r.calls is not None]
        if records and not self._checked:  # once: a game that is not replayable fails loudly, not silently
            replayer.check(records[0])
            self._checked = True
        chosen, points = [], {}  # (turn, record, position); (game id, position) -> index in requests
        requests = []
        for rec in records:
            pos = turn_positions(rec)
            cands = {pos[id(t)]: t for t in rec.turns
                     if id(t) in pos and t.level == 0 and t.reward is not None and 0 <= t.seat < len(rec.rewards)}
            for p in pick_positions(list(cands), self.turns_per_game, derive_seed(self.seed, rec.game_id, "branch")):
                chosen.append((cands[p], rec, p))
                wanted = [p] + ([p + 1] if self.advantage == "td" and p + 1 < len(rec.calls) else [])
                for q in wanted:
                    if (rec.game_id, q) not in points:
                        points[(rec.game_id, q)] = len(requests)
                        requests.append((rec, q))
        branches = replayer.branch(requests, self.samples)
        diverged = [b for bs in branches for b in bs if b.error and b.error.startswith("ReplayDiverged")]
        if diverged:
            raise ReplayDiverged(f"branch credit: {len(diverged)} branch games diverged from their recorded game, "
                                 f"first: {diverged[0].error}")
        values = {key: [g.rewards for g in branches[i] if g.error is None] for key, i in points.items()}

        def value(rec, position, seat):
            return branch_value([rows[seat] for rows in values.get((rec.game_id, position), [])])

        for turn, rec, p in chosen:
            v = value(rec, p, turn.seat)
            if v is None:
                continue
            nxt = None
            if self.advantage == "td":
                nxt = rec.rewards[turn.seat] if p + 1 >= len(rec.calls) else value(rec, p + 1, turn.seat)
                if nxt is None:
                    continue
            self._adv[id(turn)] = branch_advantage(float(turn.reward), v, nxt)
        n_games = sum(len(b) for b in branches)
        self._metrics = {"credit/branch_games": n_games, "credit/branched_turns": len(self._adv),
                         "credit/branch_errors": sum(b.error is not None for bs in branches for b in bs),
                         "credit/branch_s": time.perf_counter() - t0}

    def advantages(self, turns: list[Turn]) -> list[float]:
        fallback = self.fallback.advantages(turns)  # keeps the role baselines learning every round
        adv, self._adv = self._adv, {}  # keyed by id(): never reused for another round's turns
        return [adv.get(id(t), a) for t, a in zip(turns, fallback)]

    def metrics(self) -> dict:
        return dict(self._metrics)

    def state_dict(self) -> dict:
        return {"rae": self.fallback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rae"):
            self.fallback.load_state_dict(state["rae"])


def make_branch_credit(config, grpo_config) -> BranchCredit:
    """``credit="branch"`` from the trainer's config (see :class:`BranchCredit`)."""
    return BranchCredit(config.branch_samples, config.branch_turns_per_game, config.branch_advantage, config.seed,
                        RAE(config.rae_alpha, config.rae_per_player))
