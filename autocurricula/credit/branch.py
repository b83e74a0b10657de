"""Branch credit (VinePPO, Kazemnejad et al., arXiv 2410.01679): per-move credit with no lookup table.

For a learner's turn t, K branch games replay the recorded game to the state before it, s_t (earlier
answers forced, :mod:`autocurricula.arena.replay`), and play on with seeds of their own; ``V(s_t)`` is
the mean return of the turn's seat over them. The turn's advantage is

- ``advantage="return"`` (default): ``A_t = G - V(s_t)``;
- ``advantage="moves"`` (games with ``play.moves(prompt) -> list[str]``): each legal move m is forced
  in K branches of its own, ``Q(s_t, m)`` is their mean return, and each move becomes a training turn
  with ``A_m = y_m - (log pi(m) - mean log pi)``, ``y = clip((Q - mean Q) / tau, +-c)`` centred
  (:func:`move_advantages`). Its fixed point is ``pi ∝ exp(y)``, a smoothed best response; unlike a
  sampled move's gradient, the push does not vanish where the policy has saturated on a wrong move.
  The bound c stops a clearly better move pulling shared features without end, but favours the move
  that wins more often over the one that wins more (``pool_states=True`` removes that bias). The
  sampled turn keeps ``G - mean Q`` only when its reply is none of the moves.

Nothing is kept by prompt across rounds, so free-text games work; turns not branched get the RAE
advantage. Subclasses (:class:`~autocurricula.credit.MirrorCredit`, ``examples/credit_variants.py``)
override :meth:`~BranchCredit.branch_temperature`, :meth:`~BranchCredit.branch_moves`,
:meth:`~BranchCredit.scores_moves` and :meth:`~BranchCredit.move_targets`.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from autocurricula.arena.arena import derive_seed
from autocurricula.credit.base import Credit, game_moves
from autocurricula.credit.rae import RAE
from autocurricula.records import GameRecord, Generation, Turn
from autocurricula.arena.replay import ReplayDiverged, Replayer, turn_positions

ADVANTAGES = ("return", "moves")


@runtime_checkable
class MoveScorer(Protocol):
    """What ``advantage="moves"`` needs of the replayer's scorer: log pi(move) under a player's adapter."""

    def completion_logprobs(self, pairs: list, player: str | None = None, temperature: float = 1.0) -> list[float]:
        ...


def branch_value(returns: list[float]) -> float | None:
    """V(s): the mean of the branches' returns for one seat (None when no branch finished)."""
    vals = [float(r) for r in returns if r is not None and math.isfinite(r)]
    return sum(vals) / len(vals) if vals else None


def branch_advantage(ret: float, value: float) -> float:
    """``ret - value`` (``advantage="return"``): the game's return minus the branch value."""
    return ret - value


def _centred_logits(values: list[float], temperature: float, max_logit: float) -> list[float]:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    q = sum(values) / len(values)
    return [min(max((v - q) / temperature, -max_logit), max_logit) for v in values]


def move_advantages(values: list[float], logprobs: list[float], temperature: float,
                    max_logit: float = math.inf) -> list[float]:
    """``y_m - (logp_m - mean logp)`` per move, ``y = clip((Q - mean Q) / temperature, +-max_logit)``
    centred: regression residuals with fixed point ``pi ∝ exp(y)``. They sum to zero."""
    if len(values) != len(logprobs) or not values:
        raise ValueError(f"one value and one log-probability per move, got {len(values)} and {len(logprobs)}")
    y = _centred_logits(values, temperature, max_logit)
    lp = sum(logprobs) / len(logprobs)
    y_mean = sum(y) / len(y)  # centred again after the bound: the residuals move probability between moves
    return [t - y_mean - (l - lp) for t, l in zip(y, logprobs)]


def move_distribution(values: list[float], temperature: float, max_logit: float = math.inf) -> list[float]:
    """``softmax(y)``, ``y`` as in :func:`move_advantages`: the target over a state's moves."""
    if not values:
        raise ValueError("a state needs at least one move value")
    y = _centred_logits(values, temperature, max_logit)
    top = max(y)
    e = [math.exp(t - top) for t in y]
    return [x / sum(e) for x in e]


def mirror_distribution(values: list[float], logprobs: list[float], temperature: float,
                        max_logit: float = math.inf, step: float = 1.0) -> list[float]:
    """One step of magnetic mirror descent with a uniform magnet (Sokota et al., arXiv 2206.05825):
    ``pi_new ∝ pi^(1 - step) * softmax(y)^step``, ``y`` as in :func:`move_distribution`, ``pi`` from
    ``logprobs``. Jumping to ``softmax(y)`` every round can cycle in self-play; a small step converges
    in two-player zero-sum games (the paper needs ``step / (1 - step) <= (temperature / L)^2``)."""
    if len(values) != len(logprobs) or not values:
        raise ValueError(f"one value and one log-probability per move, got {len(values)} and {len(logprobs)}")
    if not 0 < step <= 1:
        raise ValueError(f"step must be in (0, 1], got {step}")
    if not all(math.isfinite(lp) for lp in logprobs):
        raise ValueError(f"every move needs a finite log-probability under the policy, got {logprobs}: score the "
                         "moves at a temperature > 0")
    y = _centred_logits(values, temperature, max_logit)
    z = [(1 - step) * lp + step * t for lp, t in zip(logprobs, y)]
    top = max(z)
    e = [math.exp(t - top) for t in z]
    return [x / sum(e) for x in e]


def listed_moves(call, moves_of, tok) -> list[Generation]:
    """The moves ``moves_of`` lists at a logged call's prompt, as forceable answers (tokens + EOS)."""
    eos = tok.eos_token_id
    version = call.turn.version if call.turn is not None else None
    out = []
    for m in moves_of(tok.decode(call.prompt_ids, skip_special_tokens=True)):
        ids = list(tok.encode(m, add_special_tokens=False)) + [eos]
        out.append(Generation(m, ids, [0.0] * len(ids), list(call.prompt_ids), "stop", version, call.player))
    return out


def state_key(turn: Turn) -> tuple:
    """A turn's state as branch credit keys it: ``(player, game, prompt ids)``, all the player knows."""
    return turn.player, turn.game, tuple(turn.prompt_ids)


def pool_values(returns: dict, keys: dict) -> dict:
    """``pool_states``: each turn's per-move returns pooled with every turn of the same key and move count,
    averaging over what the player does not see (a dealt card) before the bound is taken."""
    pooled: dict = {}
    for t, per_move in returns.items():
        acc = pooled.setdefault((keys[t], len(per_move)), [[] for _ in per_move])
        for a, r in zip(acc, per_move):
            a.extend(r)
    return {t: pooled[(keys[t], len(per_move))] for t, per_move in returns.items()}


def check_replays(games: list[GameRecord]) -> None:
    """Stop training when a branch game left its recorded game: the game is not replayable."""
    diverged = [g for g in games if g.error and g.error.startswith("ReplayDiverged")]
    if diverged:
        raise ReplayDiverged(f"branch credit: {len(diverged)} branch games diverged from their recorded game, "
                             f"first: {diverged[0].error}")


def pick_positions(positions: list[int], budget: int, seed: int) -> list[int]:
    """``budget`` of ``positions`` (0: all) drawn without replacement from ``seed``, in game order."""
    if budget <= 0 or budget >= len(positions):
        return sorted(positions)
    rng = np.random.default_rng(seed)
    return sorted(int(p) for p in rng.choice(sorted(positions), size=budget, replace=False))


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass
class BranchCredit(Credit):
    """``credit="branch"`` (module docstring): ``samples`` games per state, ``turns_per_game`` (0: all
    top-level turns), ``advantage``; with "moves", ``move_temperature`` (tau), ``move_clip`` (c; math.inf:
    no bound), ``pool_states``. ``alpha``, ``per_player``: the RAE fallback, checkpointed as ``"rae"``.
    Moves are scored at the GRPO sampling temperature given to :meth:`bind`."""

    samples: int = 4
    turns_per_game: int = 0
    advantage: str = "return"
    move_temperature: float = 0.25
    move_clip: float = 2.0
    pool_states: bool = False
    alpha: float = 0.95
    per_player: bool = False
    name = "branch"
    replays = True

    def __post_init__(self):
        if not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 1:
            raise ValueError(f"samples must be an integer >= 1, got {self.samples!r}")
        if not isinstance(self.turns_per_game, int) or isinstance(self.turns_per_game, bool) or self.turns_per_game < 0:
            raise ValueError(f"turns_per_game must be an integer >= 0 (0 = all), got {self.turns_per_game!r}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be 'return' (A = G - V) or 'moves' (every legal move branched), "
                             f"got {self.advantage!r}")
        if not (_is_number(self.move_temperature) and math.isfinite(self.move_temperature)
                and self.move_temperature > 0):
            raise ValueError(f"move_temperature must be a finite number > 0, got {self.move_temperature!r}")
        if not isinstance(self.pool_states, bool):
            raise ValueError(f"pool_states must be True or False, got {self.pool_states!r}")
        if self.pool_states and self.advantage != "moves":
            raise ValueError("pool_states pools the listed moves' values: it needs advantage='moves' (or leave "
                             "pool_states=False)")
        if not (_is_number(self.move_clip) and self.move_clip > 0):
            raise ValueError(f"move_clip must be a number > 0 (math.inf: no bound), got {self.move_clip!r}")
        self.move_temperature, self.move_clip = float(self.move_temperature), float(self.move_clip)
        self.fallback = RAE(self.alpha, self.per_player)
        self.seed, self.sampling_temperature = 0, 1.0  # until bind
        self._adv: dict[int, float] = {}  # id(turn) -> branch advantage, for this round's turns
        self._targets: list[Turn] = []  # advantage="moves": this round's move turns
        self._metrics: dict = {}
        self._checked = False
        self._warned = False  # the respelled-moves warning, once

    def bind(self, grpo_config, seed: int) -> None:
        self.seed, self.sampling_temperature = seed, float(grpo_config.temperature)

    # ------------------------------------------------------------------ hooks for subclasses
    def branch_temperature(self) -> float | None:
        """Sampling temperature in the branches after the branched move; None: as the game asks."""
        return None

    def branch_moves(self, asked: list, replayer: Replayer, tok) -> tuple[list, dict, int]:
        """``samples`` branch games per move of each ``(record, position, moves)`` in ``asked``. Returns
        the branches per move, count metrics (``credit/branch_games`` first) and the failed-game count."""
        branches = replayer.branch_moves(asked, self.samples, temperature=self.branch_temperature()) if asked else []
        games = [b for per in branches for bs in per for b in bs]
        check_replays(games)
        return branches, {"credit/branch_games": len(games)}, sum(b.error is not None for b in games)

    def scores_moves(self) -> bool:
        """Whether :meth:`move_targets` needs the moves' log-probabilities under the learner's adapter."""
        return True

    def move_targets(self, values: list[float], logprobs: list[float] | None,
                     state: tuple | None = None) -> list[float]:
        """A state's move-turn advantages from the moves' values (and log-probs, when :meth:`scores_moves`);
        ``state`` is the turn's :func:`state_key`. Called once per branched turn, in game order."""
        return move_advantages(values, logprobs, self.move_temperature, self.move_clip)

    # ------------------------------------------------------------------ the protocol
    def check_game(self, play) -> None:
        """At the start of training: ``advantage="moves"`` needs the game to list its moves."""
        if self.advantage == "moves" and game_moves(play) is None:
            raise ValueError("branch advantage='moves' needs the game to list its legal moves: give its play "
                             "function a `moves(prompt) -> list[str]` attribute (games.kuhn_poker.play and "
                             "games.tictactoe.play have one), or use advantage='return'")

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
                if (rec.game_id, p) not in points:
                    points[(rec.game_id, p)] = len(requests)
                    requests.append((rec, p))
        if self.advantage == "moves":
            return self._see_moves(chosen, requests, points, replayer, t0)
        branches = replayer.branch(requests, self.samples, temperature=self.branch_temperature())
        check_replays([b for bs in branches for b in bs])
        values = {key: [g.rewards for g in branches[i] if g.error is None] for key, i in points.items()}

        def value(rec, position, seat):
            return branch_value([rows[seat] for rows in values.get((rec.game_id, position), [])])

        for turn, rec, p in chosen:
            v = value(rec, p, turn.seat)
            if v is not None:
                self._adv[id(turn)] = branch_advantage(float(turn.reward), v)
        n_games = sum(len(b) for b in branches)
        self._metrics = {"credit/branch_games": n_games, "credit/branched_turns": len(self._adv),
                         "credit/branch_errors": sum(b.error is not None for bs in branches for b in bs),
                         "credit/branch_s": time.perf_counter() - t0}

    def _see_moves(self, chosen, requests, points, replayer: Replayer, t0: float) -> None:
        """``advantage="moves"``: K branches per legal move of each chosen turn, moves become target turns."""
        self.check_game(replayer.play)
        moves_of = game_moves(replayer.play)
        engine = replayer.scorer
        scores = self.scores_moves()
        if scores and not isinstance(engine, MoveScorer):
            raise ValueError("branch advantage='moves' scores each move under the learner's adapter with "
                             "Engine.completion_logprobs: give the Replayer an in-process Engine "
                             "(Replayer(..., scorer=engine); the trainers do), or use advantage='return'")
        tok = engine.tokenizer
        asked, answers = [], []
        for rec, p in requests:
            gens = listed_moves(rec.calls[p], moves_of, tok)
            asked.append((rec, p, gens))
            answers.append(gens)
        branches, counts, errors = self.branch_moves(asked, replayer, tok)
        self._targets = []
        wanted: dict[str, tuple[list, list]] = {}  # player -> ((turn, move) keys, (prompt, move) pairs)
        for turn, rec, p in chosen if scores else ():
            keys, pairs = wanted.setdefault(turn.player, ([], []))
            for j, g in enumerate(answers[points[(rec.game_id, p)]]):
                keys.append((id(turn), j))
                pairs.append((list(turn.prompt_ids), g.token_ids))
        scored = {}  # (turn, move) -> log pi(move): one batched scoring call per player
        for player, (keys, pairs) in sorted(wanted.items()):
            scored.update(zip(keys, engine.completion_logprobs(pairs, player, self.sampling_temperature)))
        returns = {id(turn): [[g.rewards[turn.seat] for g in bs if g.error is None]
                              for bs in branches[points[(rec.game_id, p)]]] for turn, rec, p in chosen}
        if self.pool_states:
            returns = pool_values(returns, {id(t): state_key(t) for t, _, _ in chosen})
        respelled = 0  # legal replies the model wrote with other tokens than the listed move's
        values = {id(t): [branch_value(r) for r in returns[id(t)]] for t, _, _ in chosen}
        # a turn with a move with no finished branch keeps its fallback advantage
        valued = [c for c in chosen if values[id(c[0])] and all(v is not None for v in values[id(c[0])])]
        for turn, rec, p in valued:
            i, q = points[(rec.game_id, p)], values[id(turn)]
            logps = [scored[(id(turn), j)] for j in range(len(answers[i]))] if scores else None
            adv = self.move_targets(q, logps, state_key(turn))
            mean = sum(q) / len(q)
            reply = tok.decode(list(turn.completion_ids), skip_special_tokens=True).strip()
            sampled = [t for t in turn.completion_ids if t != tok.eos_token_id]
            same_tokens = any(g.token_ids[:-1] == sampled for g in answers[i])
            legal = same_tokens or any(g.text.strip() == reply for g in answers[i])
            respelled += legal and not same_tokens
            self._adv[id(turn)] = 0.0 if legal else float(turn.reward) - mean
            for g, a in zip(answers[i], adv):
                self._targets.append(Turn(
                    player=turn.player, game_id=turn.game_id, role=turn.role, prompt_ids=list(turn.prompt_ids),
                    completion_ids=list(g.token_ids), logprobs=[0.0] * len(g.token_ids), version=turn.version,
                    game=turn.game, reward=turn.reward, level=turn.level, parent=turn.parent, seat=turn.seat,
                    advantage=a, target=True))
        if respelled > len(self._adv) / 2 and not self._warned:
            self._warned = True
            warnings.warn(f"branch advantage='moves': {respelled} of {len(self._adv)} sampled replies are legal moves "
                          "written with other tokens than the game's moves(prompt) lists (e.g. ' red' against 'red'), "
                          "so the move targets train replies the model does not write: list the moves as the model "
                          "writes them (as the game's warm-up teaches them)", stacklevel=2)
        self._metrics = {**counts, "credit/branched_turns": len(self._adv), "credit/move_targets": len(self._targets),
                         "credit/respelled_moves": respelled,
                         "credit/branch_errors": errors, "credit/branch_s": time.perf_counter() - t0}

    def extra_turns(self, turns: list[Turn]) -> list[Turn]:
        """``advantage="moves"``: the move target turns of ``turns``' players (frozen ones are not passed)."""
        players = {t.player for t in turns}
        out, self._targets = [t for t in self._targets if t.player in players], []
        return out

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
