"""Turns and credit: from game outcomes to per-turn advantages. Pure Python, no MLX.

Assigners:
- GRPO (Shao et al., arXiv 2402.03300, as trl implements it): within a group, ``A = R - mean``,
  divided by ``std + 1e-4`` (Bessel-corrected) when ``scale_rewards`` is "group" (std of the group)
  or "batch" (std of all turns); "none" only centres. Differences from trl: a group is any set of
  turns with the same key (not ``num_generations`` consecutive rows), a group of one gets A = 0
  instead of NaN, and keys are hierarchical: a turn is only compared with turns of its own
  ``level`` and ``parent`` (nested games, as in the Legos / Self-Play Engine designs).
- RAE (SPIRAL, arXiv 2506.24119): one EMA baseline per (game, role): ``A = R - b`` with ``b`` read
  before the update ``b <- alpha * b + (1 - alpha) * R``, alpha = 0.95, b0 = 0. SPIRAL updates per
  trajectory; so do we (once per (game instance, role, player) episode, in first-seen order, all
  turns of that episode share its advantage). Option: one baseline per player as well.
- value (per-move credit): a table of state values keyed by the prompt a turn saw (the observation),
  a tabular critic learnt from game outcomes only. Each turn gets ``A_i = G_i - V(s_i)`` with the
  lambda-return ``G_i = (1 - lam) * V(s_{i+1}) + lam * G_{i+1}`` and ``G_last = R`` (rewards come at
  the end, no discount): lam = 1 is the Monte-Carlo return minus a per-state baseline, lam = 0 is
  TD(0), where a move is judged by the value of the position it led to. ``V(s)`` is the running
  mean of the returns seen from ``s`` (step ``max(1/visits, 1 - alpha)``), read before the update;
  a state never seen falls back to the RAE role baseline. Worth it when states repeat (board games);
  for free-text games every prompt is new and it reduces to RAE.
- q (per-move credit with action values): as "value", plus a table of ``Q(s, a)`` keyed by the prompt
  and the completion. ``Q`` first moves toward ``G_i`` (same step rule), then ``A_i = Q(s_i, a_i) -
  V(s_i)``: on a pair's first visit that is exactly the "value" advantage, and every revisit averages
  the noise of single outcomes away (a move's credit stops depending on the opponent's later luck).
  Option (``StateValues.greedy_targets``): each round, every position a player visited also trains
  toward its best known move: the highest ``Q`` among moves tried at least ``min_visits`` times,
  shrunk toward ``V`` as if it had one more visit at ``V``, as an extra turn with ``A = coef * (Q -
  V)`` and no sampler logprobs (``Turn.target``). Policy improvement from the critic, as in policy
  iteration: a move the sampler did not pick this round still gets pulled up once its ``Q`` is known.
- constant: ``A = R``.

The maths above are pure functions and tables; the trainer uses them through :class:`Credit` objects
(advantages, optional extra turns, metrics, state), built by name by :func:`make_credit`;
:func:`register_credit` adds a method of your own.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

from autocurricula.records import Turn


def _key(turn: Turn) -> tuple:
    # hierarchical: compare only within the same level and parent; the group key (or the role when
    # no group is given) splits further
    return (turn.level, turn.parent, turn.group if turn.group is not None else f"role:{turn.role}")


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _rewards(turns: list[Turn]) -> list[float]:
    missing = [t for t in turns if t.reward is None]
    if missing:
        raise ValueError(f"{len(missing)} turns have no reward (e.g. {missing[0].player} in game "
                         f"{missing[0].game_id}); assign rewards when the game ends")
    bad = [t for t in turns if not math.isfinite(t.reward)]
    if bad:
        raise ValueError(f"non-finite reward {bad[0].reward} for {bad[0].player} in game {bad[0].game_id}")
    return [float(t.reward) for t in turns]


def grpo_advantages(turns: list[Turn], scale_rewards: str = "group", eps: float = 1e-4) -> list[float]:
    """GRPO advantages, one per turn (see module docstring)."""
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    rewards = _rewards(turns)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(turns):
        groups.setdefault(_key(t), []).append(i)
    batch_std = _std(rewards)
    out = [0.0] * len(turns)
    for idx in groups.values():
        if len(idx) < 2:
            continue  # nothing to compare with
        vals = [rewards[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = _std(vals) if scale_rewards == "group" else batch_std
        for i in idx:
            a = rewards[i] - mean
            out[i] = a / (std + eps) if scale_rewards != "none" else a
    return out


def constant_advantages(turns: list[Turn]) -> list[float]:
    return _rewards(turns)


def _episodes(turns: list[Turn]) -> list[list[int]]:
    # one episode = one player's turns in one (sub-)game, in the order they were made
    episodes: dict[tuple, list[int]] = {}
    for i, t in enumerate(turns):
        episodes.setdefault((t.game_id, t.level, t.parent, t.role, t.player), []).append(i)
    return list(episodes.values())


@dataclass
class RAE:
    """Role-conditioned advantage estimation with EMA baselines; ``state_dict`` is JSON-able."""

    alpha: float = 0.95
    per_player: bool = False
    baselines: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if not 0 <= self.alpha < 1:
            raise ValueError(f"RAE alpha must be in [0, 1), got {self.alpha}")

    def key(self, turn: Turn) -> str:
        parts = [turn.game, turn.role] + ([turn.player] if self.per_player else [])
        return "|".join(parts)

    def advantages(self, turns: list[Turn]) -> list[float]:
        """Advantages for ``turns`` and the baseline updates they imply, episode by episode."""
        rewards = _rewards(turns)
        out = [0.0] * len(turns)
        for idx in _episodes(turns):
            first = turns[idx[0]]
            r = rewards[idx[0]]
            k = self.key(first)
            b = self.baselines.get(k, 0.0)  # read before the update
            for i in idx:
                out[i] = rewards[i] - b
            self.baselines[k] = self.alpha * b + (1 - self.alpha) * r
        return out

    def state_dict(self) -> dict:
        return {"alpha": self.alpha, "per_player": self.per_player, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict) -> None:
        self.alpha = float(state["alpha"])
        self.per_player = bool(state["per_player"])
        self.baselines = {str(k): float(v) for k, v in state["baselines"].items()}


@dataclass
class StateValues:
    """Per-move credit from a tabular critic over prompts (see module docstring); JSON-able state.

    ``max_states`` bounds the table: the least recently updated states are dropped first."""

    lam: float = 1.0
    alpha: float = 0.95
    per_player: bool = False
    max_states: int = 200_000
    actions: bool = False  # also learn Q(s, a) and use A = Q - V (credit="q")
    completions: bool = True  # with actions: keep each move's completion ids, the targets' moves
    values: OrderedDict = field(default_factory=OrderedDict)  # key -> [value, visits]
    action_values: OrderedDict = field(default_factory=OrderedDict)  # key|digest -> [Q, visits, ids, truncated]
    fallback: RAE = field(default_factory=RAE)
    _moves: dict = field(default_factory=dict, init=False, repr=False)  # state key -> {action keys}

    def __post_init__(self):
        if not 0 <= self.lam <= 1:
            raise ValueError(f"value_lambda must be in [0, 1], got {self.lam}")
        if not 0 <= self.alpha < 1:
            raise ValueError(f"value alpha must be in [0, 1), got {self.alpha}")
        if self.max_states < 1:
            raise ValueError(f"max_states must be positive, got {self.max_states}")
        self.fallback = RAE(self.alpha, self.per_player, dict(self.fallback.baselines))
        self._index_moves()

    def _index_moves(self) -> None:
        self._moves = {}
        for akey, entry in self.action_values.items():
            if len(entry) > 2 and entry[2]:
                self._moves.setdefault(akey.rsplit("|", 1)[0], set()).add(akey)

    def key(self, turn: Turn) -> str:
        digest = hashlib.blake2b(array("q", turn.prompt_ids).tobytes(), digest_size=12).hexdigest()
        return "|".join([turn.game] + ([turn.player] if self.per_player else []) + [digest])

    def action_key(self, turn: Turn) -> str:
        digest = hashlib.blake2b(array("q", turn.completion_ids).tobytes(), digest_size=8).hexdigest()
        return f"{self.key(turn)}|{digest}"

    def _move_toward(self, table: OrderedDict, key: str, target: float, start: float, *extra) -> float:
        value, visits, *_ = table.pop(key, (start, 0))  # start: the value a new entry has before its first visit
        visits += 1
        value += max(1.0 / visits, 1 - self.alpha) * (target - value)
        table[key] = [value, visits, *extra]  # re-inserted last: most recently updated
        while len(table) > self.max_states:
            dropped, _ = table.popitem(last=False)
            if table is self.action_values:
                self._forget_move(dropped)
        return value

    def _forget_move(self, action_key: str) -> None:
        state = action_key.rsplit("|", 1)[0]
        moves = self._moves.get(state)
        if moves is not None:
            moves.discard(action_key)
            if not moves:
                del self._moves[state]

    def value(self, turn: Turn) -> float:
        entry = self.values.get(self.key(turn))
        return entry[0] if entry is not None else self.fallback.baselines.get(self.fallback.key(turn), 0.0)

    def advantages(self, turns: list[Turn]) -> list[float]:
        """Advantages for ``turns``; then every visited state's value moves toward its return."""
        rewards = _rewards(turns)
        out = [0.0] * len(turns)
        for idx in _episodes(turns):
            r = rewards[idx[-1]]
            v = [self.value(turns[i]) for i in idx]  # read before the update
            g = r
            for j in range(len(idx) - 1, -1, -1):
                if j < len(idx) - 1:
                    g = (1 - self.lam) * v[j + 1] + self.lam * g
                if self.actions:  # first visit: Q = g, so A = g - V as without action values
                    turn = turns[idx[j]]
                    akey = self.action_key(turn)
                    ids = list(turn.completion_ids) if self.completions else []
                    g_avg = self._move_toward(self.action_values, akey, g, v[j], ids, bool(turn.truncated))
                    if ids:
                        self._moves.setdefault(akey.rsplit("|", 1)[0], set()).add(akey)
                    out[idx[j]] = g_avg - v[j]
                else:
                    out[idx[j]] = g - v[j]
            for i, v_i in zip(idx, v):
                self._move_toward(self.values, self.key(turns[i]), r, v_i)  # v_i: the fallback for a new state
            self.fallback.advantages([turns[idx[0]]])  # role baseline: one update per episode
        return out

    def greedy_targets(self, turns: list[Turn], coef: float, min_visits: int = 2) -> list[Turn]:
        """Call after :meth:`advantages`. For each (player, state) in ``turns``, one target turn with the
        state's best known move and ``A = coef * (Q - V) > 0`` (``Q`` shrunk toward ``V`` by one visit,
        so a lucky single outcome does not beat a move that keeps winning). Needs ``actions=True``."""
        if not (self.actions and self.completions):
            raise ValueError("greedy_targets needs the (state, move) table with its moves: "
                             "StateValues(actions=True, completions=True), credit='q'")
        if not math.isfinite(coef) or coef < 0 or min_visits < 1:
            raise ValueError(f"greedy targets need coef >= 0 and min_visits >= 1, got {coef} and {min_visits}")
        out, seen = [], set()
        for t in turns:
            state = self.key(t)
            if coef == 0 or (t.player, state) in seen:
                continue
            seen.add((t.player, state))
            v = self.value(t)
            best = None
            for akey in sorted(self._moves.get(state, ())):  # sorted: ties resolve the same way every run
                q, n, ids, truncated = self.action_values[akey]
                score = (q * n + v) / (n + 1)
                if n >= min_visits and ids and (best is None or score > best[0]):
                    best = (score, ids, truncated)
            if best is None or best[0] <= v:
                continue
            out.append(Turn(player=t.player, game_id=t.game_id, role=t.role, prompt_ids=list(t.prompt_ids),
                            completion_ids=list(best[1]), logprobs=[0.0] * len(best[1]), version=t.version,
                            game=t.game, reward=t.reward, level=t.level, parent=t.parent, seat=t.seat,
                            truncated=best[2], advantage=coef * (best[0] - v), target=True))
        return out

    def state_dict(self) -> dict:
        return {"lam": self.lam, "alpha": self.alpha, "per_player": self.per_player, "max_states": self.max_states,
                "actions": self.actions, "values": [[k, v[0], v[1]] for k, v in self.values.items()],
                "action_values": [[k, *v] for k, v in self.action_values.items()],
                "fallback": self.fallback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.lam, self.alpha = float(state["lam"]), float(state["alpha"])
        self.per_player, self.max_states = bool(state["per_player"]), int(state["max_states"])
        self.values = OrderedDict((str(k), [float(v), int(n)]) for k, v, n in state["values"])
        self.actions = bool(state.get("actions", False))  # a table without "actions" has no action values
        # [key, Q, visits, completion ids, truncated]; rows of only [key, Q, visits] keep no moves
        rows = ((k, v, n, *rest, [], False)[:5] for k, v, n, *rest in state.get("action_values", []))
        self.action_values = OrderedDict((str(k), [float(v), int(n), [int(i) for i in ids], bool(cut)])
                                         for k, v, n, ids, cut in rows)
        self._index_moves()  # `completions` stays as constructed: a setting of this run, like the targets
        self.fallback.load_state_dict(state["fallback"])


def assign_credit(turns: Iterable[Turn], method: str = "grpo", *, scale_rewards: str = "group",
                  rae: RAE | None = None, values: StateValues | None = None) -> list[Turn]:
    """Set ``turn.advantage`` for every turn; ``method`` is "grpo", "rae", "value", "q" or "constant"."""
    turns = list(turns)
    if method == "grpo":
        adv = grpo_advantages(turns, scale_rewards)
    elif method == "rae":
        if rae is None:
            raise ValueError("method='rae' needs the RAE state (rae=RAE()) so baselines persist across calls")
        adv = rae.advantages(turns)
    elif method in ("value", "q"):
        if values is None or values.actions != (method == "q"):
            table = "StateValues(actions=True)" if method == "q" else "StateValues()"
            raise ValueError(f"method={method!r} needs its value table (values={table}) so it persists across calls")
        adv = values.advantages(turns)
    elif method == "constant":
        adv = constant_advantages(turns)
    else:
        raise ValueError(f"unknown credit method {method!r}; use 'grpo', 'rae', 'value', 'q' or 'constant'")
    for t, a in zip(turns, adv):
        t.advantage = float(a)
    return turns


# ---------------------------------------------------------------------- credit methods as objects
class Credit:
    """A credit method as the trainer uses it, once per round:

    1. :meth:`assign` sets ``turn.advantage`` on the round's turns (all with rewards), from
       :meth:`advantages`, which may learn from them (baselines, value tables);
    2. :meth:`extra_turns` may add turns to train on (e.g. a critic's picks), from the learners' turns;
    3. :meth:`metrics` reports on it (``credit/...`` names).

    ``state_dict`` / ``load_state_dict`` carry what it learnt through checkpoints: its keys sit next to
    the trainer's own in ``state.json``, so a method names its sections (``"rae"``, ``"values"``).
    Register a new method with :func:`register_credit` and select it by name (``credit="mine"``)."""

    name = "credit"
    replays = False  # the method replays games: every call of a game is logged for it

    def check_game(self, play) -> None:
        """Refuse a game this method cannot use, before the model loads."""

    def see_round(self, records, replayer) -> None:
        """With ``replays``: the round's games and a replayer of them, before :meth:`assign`."""

    def advantages(self, turns: list[Turn]) -> list[float]:
        raise NotImplementedError

    def assign(self, turns: Iterable[Turn]) -> list[Turn]:
        turns = list(turns)
        for t, a in zip(turns, self.advantages(turns)):
            t.advantage = float(a)
        return turns

    def extra_turns(self, turns: list[Turn]) -> list[Turn]:
        return []

    def metrics(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GRPOCredit(Credit):
    """Group-normalised rewards (:func:`grpo_advantages`); no state."""

    name = "grpo"

    def __init__(self, scale_rewards: str = "group"):
        self.scale_rewards = scale_rewards

    def advantages(self, turns: list[Turn]) -> list[float]:
        return grpo_advantages(turns, self.scale_rewards)


class ConstantCredit(Credit):
    """``A = R`` (:func:`constant_advantages`); no state."""

    name = "constant"

    def advantages(self, turns: list[Turn]) -> list[float]:
        return constant_advantages(turns)


class RAECredit(Credit):
    """SPIRAL's role baselines (:class:`RAE`); checkpointed as ``"rae"``."""

    name = "rae"

    def __init__(self, rae: RAE):
        self.rae = rae

    def advantages(self, turns: list[Turn]) -> list[float]:
        return self.rae.advantages(turns)

    def state_dict(self) -> dict:
        return {"rae": self.rae.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rae"):
            self.rae.load_state_dict(state["rae"])


class ValueCredit(Credit):
    """Per-move credit from the tabular critic (:class:`StateValues`): "value", or "q" with action
    values and, when ``target_coef`` > 0, the critic's best known moves as extra turns
    (:meth:`StateValues.greedy_targets`); checkpointed as ``"values"``."""

    def __init__(self, values: StateValues, target_coef: float = 0.0, target_min_visits: int = 2):
        self.values, self.target_coef, self.target_min_visits = values, target_coef, target_min_visits
        self.name = "q" if values.actions else "value"
        self._targets = 0

    def advantages(self, turns: list[Turn]) -> list[float]:
        return self.values.advantages(turns)

    def extra_turns(self, turns: list[Turn]) -> list[Turn]:
        if not self.target_coef:
            return []
        targets = self.values.greedy_targets(turns, self.target_coef, self.target_min_visits)
        self._targets = len(targets)
        return targets

    def metrics(self) -> dict:
        out = {"credit/states": len(self.values.values)}
        if self.values.actions:
            out["credit/state_moves"] = len(self.values.action_values)
        if self.target_coef:
            out["credit/targets"] = self._targets
        return out

    def state_dict(self) -> dict:
        return {"values": self.values.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("values"):
            self.values.load_state_dict(state["values"])


def _value_credit(config, grpo_config) -> ValueCredit:
    values = StateValues(config.value_lambda, config.rae_alpha, config.rae_per_player, config.value_max_states,
                         actions=config.credit == "q", completions=config.q_target_coef > 0)
    return ValueCredit(values, config.q_target_coef, config.q_target_min_visits)


def _branch_credit(config, grpo_config):
    from autocurricula.branch import make_branch_credit  # it replays games (arena), this module stays pure

    return make_branch_credit(config, grpo_config)


CREDIT_METHODS = {
    "rae": lambda config, grpo_config: RAECredit(RAE(config.rae_alpha, config.rae_per_player)),
    "value": _value_credit,
    "q": _value_credit,
    "grpo": lambda config, grpo_config: GRPOCredit(grpo_config.scale_rewards),
    "constant": lambda config, grpo_config: ConstantCredit(),
    "branch": _branch_credit,
}


# INTERIM (replaced by the credit objects' own configs): the flat fields' defaults
_FIELD_DEFAULTS = {"rae_alpha": 0.95, "rae_per_player": False, "value_lambda": 1.0, "value_max_states": 200_000,
                   "q_target_coef": 0.0, "q_target_min_visits": 2, "branch_samples": 4, "branch_turns_per_game": 0,
                   "branch_advantage": "return", "branch_move_temperature": 0.25, "branch_move_clip": 2.0,
                   "branch_temperature": None, "branch_move_loss": "residual", "branch_replies": False}
LEGACY_CREDIT_FIELDS = tuple(_FIELD_DEFAULTS)


class _FieldCredit(Credit):
    def __init__(self, name, fields):
        self.name, self.fields = name, dict(fields)

    def build(self, grpo_config, seed):
        from types import SimpleNamespace

        ns = SimpleNamespace(**{**_FIELD_DEFAULTS, **self.fields, "credit": self.name, "seed": seed})
        return CREDIT_METHODS[self.name](ns, grpo_config)


def credit_from_fields(name, fields):
    return _FieldCredit(name, fields)


def register_credit(name: str, factory) -> None:
    """Make ``credit=name`` build ``factory(config, grpo_config) -> Credit`` (register before
    creating the config, which checks the name)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a credit method needs a non-empty string name, got {name!r}")
    if not callable(factory):
        raise TypeError(f"register_credit({name!r}, factory): factory(config, grpo_config) must be callable")
    CREDIT_METHODS[name] = factory


def make_credit(spec, grpo_config, seed: int = 0, *, config=None) -> Credit:
    """The credit method ``spec`` names (or the object it is), ready for a run."""
    import copy

    if isinstance(spec, _FieldCredit):
        return spec.build(grpo_config, seed)
    if isinstance(spec, Credit):
        return copy.deepcopy(spec)
    if spec not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {spec!r}; use one of {sorted(CREDIT_METHODS)} "
                         f"(or register_credit(name, factory) first)")
    return _FieldCredit(spec, {}).build(grpo_config, seed)
