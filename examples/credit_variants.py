"""Variants of branch and mirror credit that the examples' flags offer on top of the core methods,
each a subclass through the core's public hooks; research/results_history.md has their measured figures.

- :class:`TDBranchCredit` (``--branch-advantage td``): :class:`~autocurricula.credit.BranchCredit`
  whose branched turn gets ``A_t = V(s_{t+1}) - V(s_t)`` (VinePPO proper, rewards only at the end),
  where s_{t+1} is the state right after the move (branches that force the move too; after the
  game's last call, ``V = G``). It judges the move by where it led, not by the later luck of the
  game. Cost: up to twice the branch games of ``advantage="return"``.
- :class:`MirrorVariantCredit` (``--catch-up``, ``--mirror-iterate table``):
  :class:`~autocurricula.credit.MirrorCredit` with two changes to its steps.

  ``catch_up=True``: a state met again after k of its player's rounds (rounds in which the player
  had move targets), or first met in the player's k-th round, takes k steps at once, this round's
  and the k - 1 it missed (:func:`catch_up_step`): on a board game whose positions are most of
  them met only every few rounds, a position's targets then follow the rounds played rather than
  its visits. Where prompts rarely repeat, every late first visit takes nearly the whole way to
  ``softmax(Q / tau)``, the jump that can cycle.

  ``iterate="table"``: the mirror iterate lives in a table, not in the model: each state keeps its
  moves' values, averaged over the rounds it is met with weight ``max(1 / n, step)`` at its n-th
  round (:func:`table_average`), and its target is ``softmax(Q_table / move_temperature)``, so the
  moves are not scored. When the model fits every target exactly and nothing is bounded
  (``move_clip=math.inf``), this is the same iteration (``log pi = Q / tau`` up to a constant, so
  a mirror step of size w from pi is the table's average with weight w), after a first phase that
  averages the rounds met so far as smooth fictitious play does. When the model realises only part
  of each step, the policy form forgets the rest; the table keeps it.

Both keep per-state history, checkpointed as ``"mirror"`` for at most ``max_states`` states.
"""

from __future__ import annotations

import hashlib
import math
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from autocurricula.arena.arena import derive_seed
from autocurricula.arena.replay import turn_positions
from autocurricula.credit import (BranchCredit, MirrorCredit, branch_value, check_replays, mirror_distribution,
                                  move_distribution, pick_positions)


def _check_temperature(t) -> None:
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0):
        raise ValueError(f"continuation_temperature must be None (the game's sampling) or a finite number >= 0 "
                         f"(0 = greedy continuations), got {t!r}")


@dataclass
class TDBranchCredit(BranchCredit):
    """:class:`~autocurricula.credit.BranchCredit` with ``A_t = V(s_{t+1}) - V(s_t)`` (the module
    docstring); ``continuation_temperature`` samples the branches' calls (None = as the game asks)."""

    advantage: str = field(default="return", init=False)  # the branch values of the sampled move's states
    continuation_temperature: float | None = None
    name = "branch_td"

    def __post_init__(self):
        super().__post_init__()
        _check_temperature(self.continuation_temperature)
        self._td: dict[int, float] = {}  # id(turn) -> V(s_{t+1}) - V(s_t), for this round's turns
        self._td_metrics: dict = {}
        self._td_checked = False

    def branch_temperature(self) -> float | None:
        return self.continuation_temperature

    def see_round(self, records, replayer) -> None:
        t0 = time.perf_counter()
        self._td = {}
        records = [r for r in records if r.error is None and r.calls is not None]
        if records and not self._td_checked:  # once: a game that is not replayable fails loudly
            replayer.check(records[0])
            self._td_checked = True
        chosen, points, requests = [], {}, []  # (turn, record, position); (game id, position) -> request
        for rec in records:
            pos = turn_positions(rec)
            cands = {pos[id(t)]: t for t in rec.turns
                     if id(t) in pos and t.level == 0 and t.reward is not None and 0 <= t.seat < len(rec.rewards)}
            for p in pick_positions(list(cands), self.turns_per_game, derive_seed(self.seed, rec.game_id, "branch")):
                chosen.append((cands[p], rec, p))
                for q in (p, p + 1) if p + 1 < len(rec.calls) else (p,):
                    if (rec.game_id, q) not in points:
                        points[(rec.game_id, q)] = len(requests)
                        requests.append((rec, q))
        branches = replayer.branch(requests, self.samples, temperature=self.branch_temperature())
        check_replays([b for bs in branches for b in bs])

        def value(rec, position, seat):
            return branch_value([g.rewards[seat] for g in branches[points[(rec.game_id, position)]] if g.error is None])

        for turn, rec, p in chosen:
            v = value(rec, p, turn.seat)
            nxt = rec.rewards[turn.seat] if p + 1 >= len(rec.calls) else value(rec, p + 1, turn.seat)
            if v is not None and nxt is not None:
                self._td[id(turn)] = nxt - v
        self._td_metrics = {"credit/branch_games": sum(len(b) for b in branches),
                            "credit/branched_turns": len(self._td),
                            "credit/branch_errors": sum(b.error is not None for bs in branches for b in bs),
                            "credit/branch_s": time.perf_counter() - t0}

    def advantages(self, turns):
        fallback = self.fallback.advantages(turns)  # the RAE advantage of turns not branched
        td, self._td = self._td, {}  # keyed by id(): never reused for another round's turns
        return [td.get(id(t), a) for t, a in zip(turns, fallback)]

    def metrics(self) -> dict:
        return dict(self._td_metrics)


def catch_up_step(step: float, missed: int) -> float:
    """The one mirror step equal to ``missed`` steps of size ``step`` toward the same target:
    ``pi^((1 - step)^k) * target^(1 - (1 - step)^k)`` with k = ``missed``."""
    if isinstance(missed, bool) or not isinstance(missed, int) or missed < 1:
        raise ValueError(f"missed counts rounds, an integer >= 1, got {missed!r}")
    return step if missed == 1 else 1 - (1 - step) ** missed  # exactly step when nothing was missed


def table_average(kept: list[float] | None, values: list[float], met: int, step: float) -> list[float]:
    """A state's move values in ``iterate="table"`` after its round number ``met`` (1 = first): this
    round's ``values`` averaged into ``kept`` with weight ``max(1 / met, step)``, the running mean of
    the rounds met while ``1 / met > step``, then an exponential average."""
    if isinstance(met, bool) or not isinstance(met, int) or met < 1:
        raise ValueError(f"met counts a state's rounds, an integer >= 1, got {met!r}")
    if met == 1 or kept is None:
        return list(values)
    if len(kept) != len(values):
        raise ValueError(f"one kept value per move: {len(kept)} kept, {len(values)} given")
    w = max(1 / met, step)
    return [k + w * (v - k) for k, v in zip(kept, values)]


def _digest(state: tuple) -> tuple[str, str, str]:
    """A state ``(player, game, prompt ids)`` as kept in the checkpoint: the prompt as a short digest."""
    player, game, prompt = state
    return player, game, hashlib.blake2b(array("q", prompt).tobytes(), digest_size=12).hexdigest()


@dataclass
class MirrorVariantCredit(MirrorCredit):
    """:class:`~autocurricula.credit.MirrorCredit` with ``catch_up`` (a state met again after k of its
    player's rounds takes ``catch_up_step(step, k)``) and ``iterate`` ("policy": each step from the
    model's policy, as MirrorCredit; "table": from a table of each state's averaged move values,
    needs ``pool_states``). The last round of each of at most ``max_states`` states (a state dropped
    counts as last met in the latest round dropped) and the table are checkpointed as ``"mirror"``."""

    catch_up: bool = False
    iterate: str = "policy"
    max_states: int = 200_000
    name = "mirror_variant"

    def __post_init__(self):
        if not isinstance(self.catch_up, bool):
            raise ValueError(f"catch_up must be True or False, got {self.catch_up!r}")
        if self.iterate not in ("policy", "table"):
            raise ValueError(f"iterate must be 'policy' (steps from the model's policy) or 'table' (from a table of "
                             f"averaged move values), got {self.iterate!r}")
        if self.iterate == "table" and self.pool_states is not True:
            raise ValueError("iterate='table' keeps one value vector per state and round: it needs pool_states=True")
        if isinstance(self.max_states, bool) or not isinstance(self.max_states, int) or self.max_states < 1:
            raise ValueError(f"max_states must be an integer >= 1, got {self.max_states!r}")
        super().__post_init__()
        self._rounds: dict[str, int] = {}  # player -> rounds in which it had targets
        self._last: OrderedDict[tuple, int] = OrderedDict()  # (player, game, digest) -> its player's last round
        self._floor: dict[str, int] = {}  # player -> latest round of a state dropped from _last
        self._table: OrderedDict[tuple, tuple[int, list[float]]] = OrderedDict()  # iterate="table": key -> (n, Q)
        self.start_round()

    def start_round(self) -> None:
        """Forget this round's states: the next :meth:`rounds_missed` of a player counts a new round."""
        self._counted: set[str] = set()  # players whose round is counted
        self._missed: dict[tuple, int] = {}  # state -> rounds missed, this round
        self._stepped: dict[tuple, list[float]] = {}  # state -> its table values after this round's step
        self._caught = {"credit/caught_up_states": 0, "credit/met_states": 0} if self.catch_up else {}

    def see_round(self, records, replayer) -> None:
        self.start_round()
        super().see_round(records, replayer)

    def rounds_missed(self, state: tuple) -> int:
        """The rounds since ``state`` last had targets, counted in its player's rounds (1: the
        previous one; first met: the player's rounds so far, this one included). 1 without catch-up."""
        if not self.catch_up:
            return 1
        if state not in self._missed:
            player = state[0]
            if player not in self._counted:
                self._counted.add(player)
                self._rounds[player] = self._rounds.get(player, 0) + 1
            key, now = _digest(state), self._rounds[player]
            self._missed[state] = now - self._last.pop(key, self._floor.get(player, 0))
            self._last[key] = now  # re-inserted last: the least recently met states are dropped first
            while len(self._last) > self.max_states:
                (dropped, _, _), last = self._last.popitem(last=False)
                self._floor[dropped] = max(self._floor.get(dropped, 0), last)
            self._caught["credit/met_states"] += 1
            self._caught["credit/caught_up_states"] += self._missed[state] > 1
        return self._missed[state]

    def table_values(self, state: tuple, values: list[float]) -> list[float]:
        """``iterate="table"``: ``state``'s move values after this round's ``values`` are averaged in
        (once per round: a state's pooled visits share them)."""
        if state not in self._stepped:
            key = _digest(state)
            n, kept = self._table.pop(key, (0, None))
            if kept is not None and len(kept) != len(values):  # listing other moves now: a new state
                n, kept = 0, None
            kept = table_average(kept, values, n + 1, catch_up_step(self.step, self.rounds_missed(state)))
            self._table[key] = (n + 1, kept)  # re-inserted last: the least recently met states are dropped first
            while len(self._table) > self.max_states:
                self._table.popitem(last=False)
            self._stepped[state] = kept
        return self._stepped[state]

    def scores_moves(self) -> bool:
        return self.iterate == "policy"  # the table's targets do not depend on the model's log-probabilities

    def move_targets(self, values, logprobs, state=None):
        if state is None:
            raise ValueError("MirrorVariantCredit's targets depend on the state's history: pass its state_key")
        if self.iterate == "table":
            return move_distribution(self.table_values(state, values), self.move_temperature, self.move_clip)
        step = catch_up_step(self.step, self.rounds_missed(state))
        return mirror_distribution(values, logprobs, self.move_temperature, self.move_clip, step)

    def metrics(self) -> dict:
        return {**super().metrics(), **self._caught,
                **({"credit/table_states": len(self._table)} if self.iterate == "table" else {})}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "mirror": {"rounds": dict(self._rounds), "floor": dict(self._floor),
                                                   "last": [[*key, r] for key, r in self._last.items()],
                                                   "table": [[*key, n, q] for key, (n, q) in self._table.items()]}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if state.get("mirror"):
            saved = state["mirror"]
            self._rounds = {str(k): int(v) for k, v in saved["rounds"].items()}
            self._floor = {str(k): int(v) for k, v in saved["floor"].items()}
            self._last = OrderedDict(((str(p), str(g), str(d)), int(r)) for p, g, d, r in saved["last"])
            self._table = OrderedDict(((str(p), str(g), str(d)), (int(n), [float(v) for v in q]))
                                      for p, g, d, n, q in saved.get("table", []))
