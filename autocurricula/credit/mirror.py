"""Mirror credit: per-move targets one step of magnetic mirror descent from the current policy.

``MirrorCredit`` is :class:`~autocurricula.credit.BranchCredit` with ``advantage="moves"``: every
listed move of a learner's turn is valued by branch games, the values of one prompt's visits in a
round are pooled, and each move turn's advantage is its probability under the target
``pi_new ∝ pi^(1 - step) * softmax(Q / move_temperature)^step`` (:func:`mirror_distribution`), so
the update is the cross-entropy toward it. With self-play against the current policy only
(``SelfPlayConfig(past_share=0)``), small steps converge toward ``softmax(Q / tau)`` play in
two-player zero-sum games, where jumping to that target every round can cycle. Its defaults are
those of the mirror self-play figures in docs/results.md ("Mirror-descent self-play").

A state met every round (Kuhn poker's twelve information sets, a matrix game's prompt per seat)
takes one step a round. With ``catch_up=True``, a state met again after k of its player's rounds
(rounds in which the player had move targets), or first met in the player's k-th round, takes k
steps at once, this round's and the k - 1 it missed (:func:`catch_up_step`): on a board game whose
positions are most of them met only every few rounds, a position's targets then follow the rounds
played rather than its visits. Off by default: where prompts rarely repeat, every late first visit
would take nearly the whole way to ``softmax(Q / tau)``, the jump that can cycle.

With ``iterate="table"`` the mirror iterate lives in a table, not in the model: each state keeps
its moves' values, averaged over the rounds it is met with weight ``max(1 / n, step)`` at its n-th
round, and its target is ``softmax(Q_table / move_temperature)``. When the model fits every target
exactly and nothing is bounded (``move_clip=math.inf``), this is the same iteration (``log pi = Q / tau`` up to a constant, so a mirror step of size
w from pi is the table's average with weight w), after a first phase that averages the rounds met so
far as smooth fictitious play does. When the model realises only part of each step, the policy
form forgets the rest: the next target is taken from where the model got to; the table form keeps
it, so the same target is trained toward again until the values move.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from autocurricula.credit.branch import BranchCredit, mirror_distribution, move_distribution


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


def _state_key(state: tuple) -> tuple[str, str, str]:
    """A state ``(player, game, prompt ids)`` as kept in the checkpoint: the prompt as a short digest."""
    player, game, prompt = state
    return player, game, hashlib.blake2b(array("q", prompt).tobytes(), digest_size=12).hexdigest()


@dataclass
class MirrorCredit(BranchCredit):
    """``credit="mirror"``: :class:`BranchCredit` per-move values (``samples`` branch games per move,
    ``pool_states``) turned into cross-entropy targets one mirror-descent ``step`` from the policy
    toward ``softmax(Q / move_temperature)`` (``move_clip`` bounds the centred logits; math.inf: no
    bound). Needs a game that lists its moves (``play.moves``); ``advantage`` is always "moves".
    ``catch_up``: a state met again after k of its player's rounds takes ``catch_up_step(step, k)``
    (the module docstring); the last round of each of at most ``max_states`` states is checkpointed
    as ``"mirror"`` (a state dropped from it counts as last met in the latest round dropped).
    ``iterate``: "policy" takes each step from the model's current policy (its moves' scored
    log-probabilities); "table" from a table of each state's averaged move values (the module
    docstring), kept for at most ``max_states`` states and checkpointed with them."""

    advantage: str = field(default="moves", init=False)  # the listed moves' targets: nothing else
    samples: int = 2
    move_temperature: float = 0.15
    move_clip: float = math.inf
    pool_states: bool = True
    step: float = 0.045
    catch_up: bool = False
    iterate: str = "policy"
    max_states: int = 200_000
    name = "mirror"

    def __post_init__(self):
        step = self.step
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= 1:
            raise ValueError(f"step must be a number in (0, 1] (1 = the target itself, no mirror step), got {step!r}")
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
        self.step = float(step)
        self._rounds: dict[str, int] = {}  # player -> rounds in which it had targets
        self._last: OrderedDict[tuple, int] = OrderedDict()  # (player, game, digest) -> its player's last round
        self._floor: dict[str, int] = {}  # player -> latest round of a state dropped from _last
        self._caught: dict = {}  # this round's metrics
        self._table: OrderedDict[tuple, tuple[int, list[float]]] = OrderedDict()  # iterate="table": key -> (n, Q)

    def rounds_missed(self, states: list[tuple]) -> dict:
        if not self.catch_up:
            return {}
        for player in dict.fromkeys(player for player, _, _ in states):
            self._rounds[player] = self._rounds.get(player, 0) + 1
        out = {}
        for state in states:
            key, player = _state_key(state), state[0]
            now = self._rounds[player]
            out[state] = now - self._last.pop(key, self._floor.get(player, 0))
            self._last[key] = now  # re-inserted last: the least recently met states are dropped first
            while len(self._last) > self.max_states:
                (dropped, _, _), last = self._last.popitem(last=False)
                self._floor[dropped] = max(self._floor.get(dropped, 0), last)
        caught = sum(k > 1 for k in out.values())
        self._caught = {"credit/caught_up_states": caught, "credit/met_states": len(out)}
        return out

    def scores_moves(self) -> bool:
        return self.iterate == "policy"  # the table's targets do not depend on the model's log-probabilities

    def state_values(self, values: dict, missed: dict) -> dict:
        if self.iterate == "policy":
            return values
        out = {}
        for state, q in values.items():
            key = _state_key(state)
            n, kept = self._table.pop(key, (0, None))
            if kept is not None and len(kept) != len(q):  # listing other moves now: a new state
                n, kept = 0, None
            step = catch_up_step(self.step, missed.get(state, 1)) if self.catch_up else self.step
            kept = table_average(kept, q, n + 1, step)
            self._table[key] = (n + 1, kept)  # re-inserted last: the least recently met states are dropped first
            while len(self._table) > self.max_states:
                self._table.popitem(last=False)
            out[state] = kept
        return out

    def move_targets(self, values: list[float], logprobs: list[float] | None, missed: int = 1) -> list[float]:
        if self.iterate == "table":  # the step was taken in the table (state_values)
            return move_distribution(values, self.move_temperature, self.move_clip)
        step = catch_up_step(self.step, missed) if self.catch_up else self.step
        return mirror_distribution(values, logprobs, self.move_temperature, self.move_clip, step)

    def metrics(self) -> dict:
        return {**super().metrics(), **self._caught, **({"credit/table_states": len(self._table)}
                                                         if self.iterate == "table" else {})}

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
