"""Per-move credit from a tabular critic keyed by the prompt a turn saw: ``ValueCredit`` ("value"),
``QCredit`` ("q"). Worth it where states repeat (board games); with free text it reduces to RAE.

- value: ``A_i = G_i - V(s_i)``, lambda-return ``G_i = (1 - lam) * V(s_{i+1}) + lam * G_{i+1}``,
  ``G_last = R`` (lam = 1: Monte Carlo minus a state baseline; lam = 0: TD(0)). ``V(s)`` is the
  running mean of returns from ``s`` (step ``max(1/visits, 1 - alpha)``), read before the update;
  an unseen state falls back to the RAE role baseline.
- q: also ``Q(s, a)`` by prompt and completion, moved toward ``G_i``, then ``A_i = Q - V``, so revisits
  average away the opponent's later luck. ``target_coef > 0`` (:meth:`StateValues.greedy_targets`):
  policy improvement, each visited position also trains toward its best known move.
- q with ``backup="minimax"`` (deterministic perfect-information games whose prompt is the position):
  ``Q(s, a)`` is the worst result seen right after the move and ``V(s)`` the best tried ``Q``, so a
  move that loses to one forcing line keeps no credit for beating sloppy play. Completions leading
  to the same next position are one move ("9", "9."), which fails where moves transpose (Nim). With
  chance or hidden information it is pessimistic.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from autocurricula.credit.base import Credit, episodes, rewards
from autocurricula.credit.rae import RAE
from autocurricula.records import Turn


@dataclass
class StateValues:
    """The tabular critic (module docstring), JSON-able; ``max_states`` evicts least recently updated."""

    lam: float = 1.0
    alpha: float = 0.95
    per_player: bool = False
    max_states: int = 200_000
    actions: bool = False  # also learn Q(s, a) and use A = Q - V (credit="q")
    completions: bool = True  # with actions: keep each move's completion ids, the targets' moves
    backup: str = "mean"  # "mean": running means of the returns; "minimax": worst known outcome (docstring)
    min_visits: int = 1  # minimax: a move tried fewer times does not set its position's value
    values: OrderedDict = field(default_factory=OrderedDict)  # key -> [value, visits]
    action_values: OrderedDict = field(default_factory=OrderedDict)  # key|digest -> [Q, visits, ids, truncated]
    fallback: RAE = field(default_factory=RAE)
    _moves: dict = field(default_factory=dict, init=False, repr=False)  # state key -> {action keys}
    # minimax: action key -> [lowest end result seen right after it (inf: none), {next own positions}]
    children: dict = field(default_factory=dict)
    _same: dict = field(default_factory=dict, init=False, repr=False)  # action key -> its move's set of keys
    _via: dict = field(default_factory=dict, init=False, repr=False)  # (state, next position) -> action key
    _parents: dict = field(default_factory=dict, init=False, repr=False)  # next position -> {states before it}

    def __post_init__(self):
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam (the lambda of the lambda-return) must be in [0, 1], got {self.lam}")
        if not 0 <= self.alpha < 1:
            raise ValueError(f"value alpha must be in [0, 1), got {self.alpha}")
        if self.max_states < 1:
            raise ValueError(f"max_states must be positive, got {self.max_states}")
        if isinstance(self.min_visits, bool) or not isinstance(self.min_visits, int) or self.min_visits < 1:
            raise ValueError(f"min_visits must be an integer >= 1, got {self.min_visits!r}")
        if self.backup not in ("mean", "minimax"):
            raise ValueError(f"backup must be 'mean' or 'minimax', got {self.backup!r}")
        if self.backup == "minimax" and self.lam != 1:
            raise ValueError(f"lam (the lambda of the lambda-return) has no meaning with backup='minimax', got "
                             f"{self.lam}: leave it at 1")
        if self.backup == "minimax" and not (self.actions and self.completions):
            raise ValueError("backup='minimax' needs the (state, move) table with its moves: "
                             "StateValues(actions=True, completions=True), or QCredit(backup='minimax')")
        self.fallback = RAE(self.alpha, self.per_player, dict(self.fallback.baselines))
        self._index_moves()

    def _index_moves(self) -> None:
        self._moves, self._same, self._via, self._parents = {}, {}, {}, {}
        for akey, entry in self.action_values.items():
            if len(entry) > 2 and (entry[2] or self.backup == "minimax"):
                self._moves.setdefault(akey.rsplit("|", 1)[0], set()).add(akey)
        for akey, (_, nxt) in self.children.items():
            for child in nxt:
                self._link(akey, child)

    def _link(self, action_key: str, child: str) -> None:
        """Minimax: ``action_key`` led on to position ``child``; completions of one position that led
        to the same ``child`` are one move ("9" and "9.") and are backed up as one."""
        group = self._same.setdefault(action_key, {action_key})
        self._parents.setdefault(child, set()).add(action_key.rsplit("|", 1)[0])
        other = self._via.setdefault((action_key.rsplit("|", 1)[0], child), action_key)
        if other == action_key or other not in self.action_values:
            self._via[(action_key.rsplit("|", 1)[0], child)] = action_key
            return
        merged = self._same.setdefault(other, {other})
        if merged is group:
            return
        if len(merged) < len(group):
            merged, group = group, merged
        merged |= group
        for a in group:
            self._same[a] = merged

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
        _, nxt = self.children.pop(action_key, (None, ()))
        group = self._same.pop(action_key, {action_key})
        group.discard(action_key)
        self._regroup(group)
        for child in nxt:  # the graph's indexes shrink with the table
            still = [a for a in sorted(group) if child in self.children.get(a, (None, ()))[1]]
            if self._via.get((state, child)) == action_key:
                if still:
                    self._via[(state, child)] = still[0]
                else:
                    del self._via[(state, child)]
            if not still and child in self._parents:
                self._parents[child].discard(state)
                if not self._parents[child]:
                    del self._parents[child]
        moves = self._moves.get(state)
        if moves is not None:
            moves.discard(action_key)
            if not moves:
                del self._moves[state]

    def _regroup(self, members: set) -> None:
        """After an eviction: what is left of a move's completions stays one move only where they are
        still linked by shared next positions, as a fresh index of the table (a resume) finds them."""
        root = {a: a for a in members}

        def find(a: str) -> str:
            while root[a] != a:
                root[a] = root[root[a]]
                a = root[a]
            return a

        first: dict = {}
        for a in sorted(members):
            for child in self.children.get(a, (None, ()))[1]:
                root[find(a)] = find(first.setdefault(child, a))
        parts: dict = {}
        for a in members:
            parts.setdefault(find(a), set()).add(a)
        for part in parts.values():
            for a in part:
                self._same[a] = part

    def value(self, turn: Turn) -> float:
        entry = self.values.get(self.key(turn))
        return entry[0] if entry is not None else self.fallback.baselines.get(self.fallback.key(turn), 0.0)

    def advantages(self, turns: list[Turn]) -> list[float]:
        """Advantages for ``turns``; then every visited state's value moves toward its return (with
        ``backup="minimax"``: the played graph gains the turns' moves and is backed up along them)."""
        if self.backup == "minimax":
            return self._minimax_advantages(turns)
        r_all = rewards(turns)
        out = [0.0] * len(turns)
        for idx in episodes(turns):
            r = r_all[idx[-1]]
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

    MAX_PASSES = 64  # minimax: backups of one position in one round (bounds a graph with cycles)

    def _put(self, table: OrderedDict, key: str, entry: list) -> None:
        table.pop(key, None)
        table[key] = entry  # last: most recently updated
        while len(table) > self.max_states:
            dropped, _ = table.popitem(last=False)
            if table is self.action_values:
                self._forget_move(dropped)

    def _minimax_q(self, action_key: str) -> float | None:
        known = []
        for a in self._same.get(action_key, (action_key,)):  # every completion of the same move
            end, nxt = self.children.get(a, (math.inf, ()))
            known += [self.values[k][0] for k in nxt if k in self.values] + ([end] if end < math.inf else [])
        return min(known) if known else None

    def _minimax_moves(self, state: str) -> list[list[str]]:
        """The moves tried at ``state``, each as its completions' action keys (sorted)."""
        moves, seen = [], set()
        for a in sorted(self._moves.get(state, ())):
            if a not in seen:
                group = sorted(x for x in self._same.get(a, {a}) if x in self.action_values)
                seen.update(group)
                moves.append(group)
        return moves

    def _minimax_state(self, state: str) -> tuple[float, float] | None:
        """(V, baseline) of a position: the best Q among moves tried ``min_visits`` times (else the
        baseline), and the visit-weighted mean Q, so a rarely played bad move does not lift the others."""
        rows = [(self.action_values[g[0]][0], sum(self.action_values[a][1] for a in g))
                for g in self._minimax_moves(state)]
        if not rows:
            return None
        mean = sum(q * n for q, n in rows) / sum(n for _, n in rows)
        return max((q for q, n in rows if n >= self.min_visits), default=mean), mean

    def _minimax_advantages(self, turns: list[Turn]) -> list[float]:
        r_all = rewards(turns)
        played = [(idx, [self.key(turns[i]) for i in idx], [self.action_key(turns[i]) for i in idx])
                  for idx in episodes(turns)]
        for idx, keys, akeys in played:  # first every edge of the round, so that each backup sees them all
            for j, i in enumerate(idx):
                edge = self.children.setdefault(akeys[j], [math.inf, set()])
                q, visits, *_ = self.action_values.get(akeys[j], (0.0, 0))  # q: backed up below
                self._put(self.action_values, akeys[j], [q, visits + 1, list(turns[i].completion_ids),
                                                         bool(turns[i].truncated)])
                self._moves.setdefault(keys[j], set()).add(akeys[j])
                if j + 1 < len(idx):
                    edge[1].add(keys[j + 1])
                    self._link(akeys[j], keys[j + 1])
                else:
                    edge[0] = min(edge[0], r_all[i])
        # back up from the games' ends (the latest turns first), and on through every position before
        # one whose value moved; each position waits in the queue once at a time
        order = sorted({(len(idx) - j, k) for idx, keys, _ in played for j, k in enumerate(keys)})
        work = deque(dict.fromkeys(k for _, k in order))
        queued, passes, fresh = set(work), {}, {k for _, keys, _ in played for k in keys}
        while work:
            state = work.popleft()
            queued.discard(state)
            passes[state] = passes.get(state, 0) + 1
            if passes[state] > self.MAX_PASSES:  # only a graph with cycles comes back this often
                continue
            for a in self._moves.get(state, ()):
                q = self._minimax_q(a)
                if q is not None:
                    self.action_values[a][0] = q
            backed = self._minimax_state(state)
            if backed is None:  # only when a full table dropped every move of it
                continue
            before = self.values.get(state)
            visits = (before[1] if before else 0) + (state in fresh)
            fresh.discard(state)
            self._put(self.values, state, [backed[0], visits])
            if before is None or before[0] != backed[0]:
                for parent in sorted(self._parents.get(state, ())):
                    if parent in self._moves and parent not in queued:
                        work.append(parent)
                        queued.add(parent)
        out = [0.0] * len(turns)
        for idx, keys, akeys in played:
            for j, i in enumerate(idx):
                move, state = self.action_values.get(akeys[j]), self._minimax_state(keys[j])
                out[i] = move[0] - state[1] if move is not None and state is not None else 0.0
        return out

    def greedy_targets(self, turns: list[Turn], coef: float, min_visits: int = 2) -> list[Turn]:
        """After :meth:`advantages`: per (player, state) in ``turns``, a target turn with its best known
        move and ``A = coef * (Q - V) > 0``, ``Q`` shrunk toward ``V`` by one visit so one lucky outcome
        does not win. ``ValueError`` without ``actions=True`` and ``completions=True``."""
        if not (self.actions and self.completions):
            raise ValueError("greedy_targets needs the (state, move) table with its moves: "
                             "StateValues(actions=True, completions=True), QCredit(target_coef > 0)")
        if not math.isfinite(coef) or coef < 0 or min_visits < 1:
            raise ValueError(f"greedy targets need coef >= 0 and min_visits >= 1, got {coef} and {min_visits}")
        out, seen = [], set()
        for t in turns:
            state = self.key(t)
            if coef == 0 or (t.player, state) in seen:
                continue
            seen.add((t.player, state))
            minimax = self.backup == "minimax"
            if minimax and self._minimax_state(state) is None:
                continue  # a full table dropped every move of it
            v = self._minimax_state(state)[1] if minimax else self.value(t)  # minimax: vs the tried moves' mean
            best = None
            # sorted: ties resolve the same way every run; minimax: a move's completions count as one,
            # with its most played completion as the target
            moves = self._minimax_moves(state) if minimax else [[a] for a in sorted(self._moves.get(state, ()))]
            for group in moves:
                rows = [self.action_values[a] for a in group]
                q, _, ids, truncated = max(rows, key=lambda r: r[1])
                n = sum(r[1] for r in rows)
                score = q if minimax else (q * n + v) / (n + 1)  # a backed-up Q is no running mean
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
                "actions": self.actions, "backup": self.backup,
                "children": [[k, None if end == math.inf else end, sorted(nxt)]
                             for k, (end, nxt) in self.children.items()],
                "values": [[k, v[0], v[1]] for k, v in self.values.items()],
                "action_values": [[k, *v] for k, v in self.action_values.items()],
                "fallback": self.fallback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.lam, self.alpha = float(state["lam"]), float(state["alpha"])
        self.per_player, self.max_states = bool(state["per_player"]), int(state["max_states"])
        self.values = OrderedDict((str(k), [float(v), int(n)]) for k, v, n in state["values"])
        self.actions = bool(state.get("actions", False))  # a table without "actions" has no action values
        if state.get("backup", "mean") != self.backup:
            raise ValueError(f"the checkpoint's table was backed up by {state.get('backup', 'mean')!r}, this run "
                             f"asks for {self.backup!r}: resume with the same QCredit(backup=...)")
        self.children = {str(k): [math.inf if end is None else float(end), set(map(str, nxt))]
                         for k, end, nxt in state.get("children", [])}
        # [key, Q, visits, completion ids, truncated]; rows of only [key, Q, visits] keep no moves
        rows = ((k, v, n, *rest, [], False)[:5] for k, v, n, *rest in state.get("action_values", []))
        self.action_values = OrderedDict((str(k), [float(v), int(n), [int(i) for i in ids], bool(cut)])
                                         for k, v, n, ids, cut in rows)
        self._index_moves()  # `completions` stays as constructed: a setting of this run, like the targets
        self.fallback.load_state_dict(state["fallback"])


@dataclass
class ValueCredit(Credit):
    """``credit="value"``: the critic (:class:`StateValues`, ``self.values``, checkpointed as ``"values"``);
    ``lam`` of the lambda-return, ``alpha`` the mean's step floor and the fallback's EMA factor."""

    lam: float = 1.0
    alpha: float = 0.95
    per_player: bool = False
    max_states: int = 200_000
    name = "value"

    def __post_init__(self):
        self.values = self._table()

    def _table(self) -> StateValues:
        return StateValues(self.lam, self.alpha, self.per_player, self.max_states, completions=False)

    def advantages(self, turns: list[Turn]) -> list[float]:
        return self.values.advantages(turns)

    def metrics(self) -> dict:
        return {"credit/states": len(self.values.values)}

    def state_dict(self) -> dict:
        return {"values": self.values.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("values"):
            self.values.load_state_dict(state["values"])


@dataclass
class QCredit(ValueCredit):
    """``credit="q"``: :class:`ValueCredit` with ``A = Q(s, a) - V(s)``; ``target_coef`` > 0 adds target
    turns toward moves tried ``target_min_visits`` times; ``backup="minimax"`` (module docstring)."""

    target_coef: float = 0.0
    target_min_visits: int = 2
    backup: str = "mean"
    name = "q"

    def __post_init__(self):
        if isinstance(self.target_coef, bool) or not isinstance(self.target_coef, (int, float)) or \
                not math.isfinite(self.target_coef) or self.target_coef < 0:
            raise ValueError(f"target_coef must be a finite number >= 0 (0 = off), got {self.target_coef!r}")
        if not isinstance(self.target_min_visits, int) or isinstance(self.target_min_visits, bool) or \
                self.target_min_visits < 1:
            raise ValueError(f"target_min_visits must be an integer >= 1, got {self.target_min_visits!r}")
        super().__post_init__()
        self._targets = 0

    def _table(self) -> StateValues:
        # the moves' completion ids are kept only when the targets or the minimax backup need them
        return StateValues(self.lam, self.alpha, self.per_player, self.max_states, actions=True,
                           completions=self.target_coef > 0 or self.backup == "minimax", backup=self.backup,
                           min_visits=self.target_min_visits)

    def extra_turns(self, turns: list[Turn]) -> list[Turn]:
        if not self.target_coef:
            return []
        targets = self.values.greedy_targets(turns, self.target_coef, self.target_min_visits)
        self._targets = len(targets)
        return targets

    def metrics(self) -> dict:
        out = {**super().metrics(), "credit/state_moves": len(self.values.action_values)}
        if self.target_coef:
            out["credit/targets"] = self._targets
        return out
