"""Branch credit (VinePPO-style, Kazemnejad et al., arXiv 2410.01679): per-move credit with no lookup table.

For a turn t of a learner, the state before it, s_t, is the recorded game up to that call. K branch
games replay the game to s_t (earlier answers forced, :mod:`autocurricula.replay`), sample the move
at s_t and everything after it with seeds of their own, and play out; ``V(s_t)`` is the mean return
of the turn's seat over the K branches. The turn's advantage is

- ``advantage="return"`` (default): ``A_t = G - V(s_t)``, the game's return minus the branch value;
- ``advantage="td"`` (VinePPO proper, rewards only at the end): ``A_t = V(s_{t+1}) - V(s_t)``, where
  s_{t+1} is the state right after the move (branches that force the move too; after the game's
  last call, ``V = G``). It judges the move by where it led, not by the later luck of the game;
- ``advantage="moves"`` (games that list their moves: ``play.moves(prompt) -> list[str]``): every
  legal move m at s_t is forced in K branches of its own and ``Q(s_t, m)`` is their mean return.
  Each move becomes a training turn of its own whose advantage is the residual of a regression of
  the policy's centred log-probabilities onto the centred values over a temperature tau, bounded:
  ``A_m = y_m - (log pi(m) - mean log pi)`` with ``y = clip((Q - mean Q) / tau, +-c)`` centred
  (``move_advantages``; the log-probs are scored under the learner's current adapter). Its fixed
  point is ``pi ∝ exp(y)`` at every state, a smoothed best response. Unlike a sampled move's
  gradient, the push does not vanish where the policy has saturated on the wrong move, and it
  stops once a state is right (the bound c keeps a clearly better move from pulling shared
  features without end, so states that share features do not drag each other past their
  targets). Where the bound does not bind, the target is linear in the returns, so hidden
  information that the branches share (a dealt card) averages out over visits; where it binds,
  the state moves toward the mean of the clipped per-visit targets, which is biased toward the
  move that wins more often rather than by more (c = inf removes the bias and the bound). The
  sampled turn keeps an advantage only when its reply is none of the moves (``G - mean Q``, e.g.
  an invalid reply). The log-probs are scored at the sampling temperature. With
  ``move_loss="cross_entropy"`` each move's advantage is its target probability ``softmax(y)_m``
  instead (``move_distribution``): the update is then the cross-entropy toward that target, with
  the same fixed point when every move is weighted alike (a loss that divides each sequence by its
  length, as ``loss_type="grpo"`` does, shifts it toward shorter moves where moves differ in token
  count), and it also raises the listed moves' total probability, which the
  residuals (they sum to zero) leave free to drift toward replies that are none of the moves.

Two options shape the values. ``continuation_temperature`` samples the branches' own calls (the
players', not judges') at another temperature; at 0 they are greedy, so in a game without chance
one branch per move gives the exact value of greedy play after it, and the regression's fixed point
is then minimax play wherever states are visited (backward induction: once the greedy policy is
right after a state, the values at that state are the minimax values). ``replies=True`` (``moves``
only) searches one ply further: the next seated call after each move is answered with every move
the game lists for it, and the replier keeps the replies best for its own seat, so a move that
leaves the opponent a win or a fork is valued as such even while the players' own continuation
would miss it. It assumes perfect information (the replier picks knowing the whole branch).

Nothing is keyed by prompt text, so it works for free-text games whose states never repeat. Cost:
``branch_samples`` x the branched turns of a round extra games per round (x2 for "td" when moves
alternate between learners and others; about x replies with ``replies``), all batched in one
``Arena.run``; greedy calls asked again within a round are answered from the replayer's memo. Turns
not branched (``branch_turns_per_game``, turns of sub-games, branches that all failed) get the RAE
advantage.
The maths are the pure functions below; :class:`BranchCredit` runs the branches.
"""

from __future__ import annotations

import math
import time

import numpy as np

from autocurricula.arena import derive_seed
from autocurricula.credit import RAE, Credit
from autocurricula.records import GameRecord, Generation, Turn
from autocurricula.replay import ReplayDiverged, Replayer, turn_positions

ADVANTAGES = ("return", "td", "moves")
MOVE_LOSSES = ("residual", "cross_entropy")


def branch_value(returns: list[float]) -> float | None:
    """V(s): the mean of the branches' returns for one seat (None when no branch finished)."""
    vals = [float(r) for r in returns if r is not None and math.isfinite(r)]
    return sum(vals) / len(vals) if vals else None


def branch_advantage(ret: float, value: float, next_value: float | None = None) -> float:
    """``ret - value`` (``advantage="return"``), or ``next_value - value`` when ``next_value`` is
    given (``advantage="td"``: the value of the state the move led to)."""
    return (ret if next_value is None else next_value) - value


def move_advantages(values: list[float], logprobs: list[float], temperature: float,
                    max_logit: float = math.inf) -> list[float]:
    """``advantage="moves"``: ``y_m - (logp_m - mean logp)`` per move with ``y = clip((Q - mean Q) /
    temperature, +-max_logit)`` centred: the residuals of the regression whose fixed point is
    ``pi ∝ exp(y)`` (``softmax(Q / temperature)`` where nothing is clipped). They sum to zero."""
    if len(values) != len(logprobs) or not values:
        raise ValueError(f"one value and one log-probability per move, got {len(values)} and {len(logprobs)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    q, lp = sum(values) / len(values), sum(logprobs) / len(logprobs)
    y = [min(max((v - q) / temperature, -max_logit), max_logit) for v in values]
    y_mean = sum(y) / len(y)  # centred again after the bound: the residuals move probability between moves
    return [t - y_mean - (l - lp) for t, l in zip(y, logprobs)]


def listed_moves(call, moves_of, tok) -> list:
    """The moves ``play.moves`` lists at a logged call's prompt, as answers a replay can force: each
    move's tokens plus end-of-sequence, as a warm-up on (prompt, move) teaches."""
    eos = tok.eos_token_id
    out = []
    for m in moves_of(tok.decode(call.prompt_ids, skip_special_tokens=True)):
        ids = list(tok.encode(m, add_special_tokens=False)) + [eos]
        out.append(Generation(m, ids, [0.0] * len(ids), list(call.prompt_ids), "stop",
                              getattr(call.turn, "version", None), call.player))
    return out


def move_distribution(values: list[float], temperature: float, max_logit: float = math.inf) -> list[float]:
    """``softmax(y)`` with ``y = clip((Q - mean Q) / temperature, +-max_logit)``: the distribution over
    a state's moves that ``advantage="moves"`` trains toward (the fixed point of both losses)."""
    if not values:
        raise ValueError("a state needs at least one move value")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    q = sum(values) / len(values)
    y = [min(max((v - q) / temperature, -max_logit), max_logit) for v in values]
    top = max(y)
    e = [math.exp(t - top) for t in y]
    return [x / sum(e) for x in e]


def _check_replays(games: list[GameRecord]) -> None:
    """Stop training when a branch game left its recorded game: the game is not replayable."""
    diverged = [g for g in games if g.error and g.error.startswith("ReplayDiverged")]
    if diverged:
        raise ReplayDiverged(f"branch credit: {len(diverged)} branch games diverged from their recorded game, "
                             f"first: {diverged[0].error}")


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
                 fallback: RAE | None = None, temperature: float = 0.25, max_logit: float = 2.0,
                 sampling_temperature: float = 1.0, continuation_temperature: float | None = None,
                 replies: bool = False, move_loss: str = "residual"):
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"branch_samples must be an integer >= 1, got {samples!r}")
        if not isinstance(turns_per_game, int) or turns_per_game < 0:
            raise ValueError(f"branch_turns_per_game must be an integer >= 0 (0 = all), got {turns_per_game!r}")
        if advantage not in ADVANTAGES:
            raise ValueError(f"branch_advantage must be one of {ADVANTAGES}, got {advantage!r}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"branch_move_temperature must be a finite number > 0, got {temperature!r}")
        if not (isinstance(max_logit, (int, float)) and max_logit > 0):
            raise ValueError(f"branch_move_clip must be a number > 0 (math.inf: no bound), got {max_logit!r}")
        if continuation_temperature is not None and not (
                isinstance(continuation_temperature, (int, float)) and not isinstance(continuation_temperature, bool)
                and math.isfinite(continuation_temperature) and continuation_temperature >= 0):
            raise ValueError(f"branch_temperature must be None (the game's sampling) or a finite number >= 0 "
                             f"(0 = greedy continuations), got {continuation_temperature!r}")
        self.samples, self.turns_per_game, self.advantage, self.seed = samples, turns_per_game, advantage, seed
        self.continuation_temperature = continuation_temperature
        if replies and advantage != "moves":
            raise ValueError("branch_replies searches the replies to every listed move: it needs "
                             "branch_advantage='moves'")
        self.replies = bool(replies)
        if move_loss not in MOVE_LOSSES:
            raise ValueError(f"branch_move_loss must be one of {MOVE_LOSSES}, got {move_loss!r}")
        self.move_loss = move_loss
        self.temperature, self.max_logit = float(temperature), float(max_logit)
        self.sampling_temperature = float(sampling_temperature)  # moves are scored as the sampler sees them
        self.fallback = fallback or RAE()
        self._adv: dict[int, float] = {}  # id(turn) -> branch advantage, for this round's turns
        self._targets: list[Turn] = []  # advantage="moves": this round's move turns
        self._metrics: dict = {}
        self._checked = False

    def check_game(self, play) -> None:
        """At the start of training: ``advantage="moves"`` needs ``play.moves(prompt)``."""
        if self.advantage == "moves" and not callable(getattr(play, "moves", None)):
            raise ValueError(f"branch_advantage='moves' needs the game to list its legal moves: give "
                             f"{getattr(play, '__name__', 'play')} a `moves(prompt) -> list[str]` attribute "
                             f"(games.kuhn_poker.play and games.tictactoe.play have one), or use 'return'")

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
        if self.advantage == "moves":
            return self._see_moves(chosen, requests, points, replayer, t0)
        branches = replayer.branch(requests, self.samples, temperature=self.continuation_temperature)
        _check_replays([b for bs in branches for b in bs])
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

    def _see_moves(self, chosen, requests, points, replayer: Replayer, t0: float) -> None:
        """``advantage="moves"``: K branches per legal move of each chosen turn; the moves become
        target turns with their centred branch values (see the module docstring)."""
        self.check_game(replayer.play)
        moves_of = replayer.play.moves
        engine = replayer.scorer
        if self.move_loss == "residual" and not callable(getattr(engine, "completion_logprobs", None)):
            raise ValueError("branch_advantage='moves' scores each move under the learner's adapter with "
                             "Engine.completion_logprobs: give the Replayer an in-process Engine "
                             "(Replayer(..., scorer=engine); the trainers do), or use 'return'")
        tok = engine.tokenizer
        asked, answers = [], []
        for rec, p in requests:
            gens = listed_moves(rec.calls[p], moves_of, tok)
            asked.append((rec, p, gens))
            answers.append(gens)
        branches = replayer.branch_moves(asked, self.samples, temperature=self.continuation_temperature,
                                         log=self.replies) if asked else []
        _check_replays([b for per in branches for bs in per for b in bs])
        played, reply_games = sum(len(bs) for per in branches for bs in per), 0
        errors = sum(b.error is not None for per in branches for bs in per for b in bs)
        if self.replies:
            branches, reply_games, reply_errors = self._search_replies(asked, branches, replayer, tok)
            errors += reply_errors
        self._targets = []
        wanted: dict[str, tuple[list, list]] = {}  # player -> ((turn, move) keys, (prompt, move) pairs)
        for turn, rec, p in chosen if self.move_loss == "residual" else ():  # the residuals need log pi
            keys, pairs = wanted.setdefault(turn.player, ([], []))
            for j, g in enumerate(answers[points[(rec.game_id, p)]]):
                keys.append((id(turn), j))
                pairs.append((list(turn.prompt_ids), g.token_ids))
        scored = {}  # (turn, move) -> log pi(move): one batched scoring call per player
        for player, (keys, pairs) in sorted(wanted.items()):
            scored.update(zip(keys, engine.completion_logprobs(pairs, player, self.sampling_temperature)))
        for turn, rec, p in chosen:
            i = points[(rec.game_id, p)]
            q = [branch_value([g.rewards[turn.seat] for g in bs if g.error is None]) for bs in branches[i]]
            if not q or any(v is None for v in q):
                continue  # a move with no finished branch: the turn keeps its fallback advantage
            if self.move_loss == "residual":
                logps = [scored[(id(turn), j)] for j in range(len(answers[i]))]
                adv = move_advantages(q, logps, self.temperature, self.max_logit)
            else:
                adv = move_distribution(q, self.temperature, self.max_logit)
            mean = sum(q) / len(q)
            reply = tok.decode(list(turn.completion_ids), skip_special_tokens=True).strip()
            sampled = [t for t in turn.completion_ids if t != tok.eos_token_id]
            legal = any(g.text == reply or g.token_ids[:-1] == sampled for g in answers[i])
            self._adv[id(turn)] = 0.0 if legal else float(turn.reward) - mean
            for g, a in zip(answers[i], adv):
                self._targets.append(Turn(
                    player=turn.player, game_id=turn.game_id, role=turn.role, prompt_ids=list(turn.prompt_ids),
                    completion_ids=list(g.token_ids), logprobs=[0.0] * len(g.token_ids), version=turn.version,
                    game=turn.game, reward=turn.reward, level=turn.level, parent=turn.parent, seat=turn.seat,
                    advantage=a, target=True))
        self._metrics = {"credit/branch_games": played + reply_games, **({"credit/reply_games": reply_games}
                                                                          if self.replies else {}),
                         "credit/branched_turns": len(self._adv), "credit/move_targets": len(self._targets),
                         "credit/branch_errors": errors, "credit/branch_s": time.perf_counter() - t0}

    def _search_replies(self, asked, branches, replayer: Replayer, tok) -> tuple[list, int, int]:
        """``replies=True``: the next seated call after each move (at the move's level) is answered
        with every reply the game lists for it, in K branches each, from the move's first branch; the
        replier keeps the replies best for its own seat (their branches together stand in for the
        move's). Returns the new branches per move, and the number of reply games played and failed."""
        requests, where = [], []  # (branch game, reply position, replies); (request, move, replier's seat)
        for i, (rec, p, _) in enumerate(asked):
            level = rec.calls[p].key[0]
            for j, games in enumerate(branches[i]):
                first = games[0]
                if first.error is not None or first.calls is None:
                    continue
                q = next((k for k in range(p + 1, len(first.calls))
                          if first.calls[k].seat >= 0 and first.calls[k].key[0] == level), None)
                if q is None:
                    continue  # the game ended after the move: its branches stand
                replies = listed_moves(first.calls[q], replayer.play.moves, tok)
                if replies:
                    requests.append((first, q, replies))
                    where.append((i, j, first.calls[q].seat))
        out = replayer.branch_moves(requests, self.samples, tag="r", temperature=self.continuation_temperature) \
            if requests else []
        _check_replays([b for per in out for bs in per for b in bs])
        searched = [list(per) for per in branches]
        for (i, j, seat), per_reply in zip(where, out):
            scores = [branch_value([g.rewards[seat] for g in games if g.error is None]) for games in per_reply]
            if all(v is None for v in scores):
                continue
            best = max(v for v in scores if v is not None)
            searched[i][j] = [g for v, games in zip(scores, per_reply) if v == best for g in games]
        return (searched, sum(len(games) for per in out for games in per),
                sum(g.error is not None for per in out for games in per for g in games))

    def extra_turns(self, turns: list[Turn]) -> list[Turn]:
        """``advantage="moves"``: one target turn per legal move of each branched turn of ``turns``'
        players (frozen players' turns are not passed in)."""
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


def make_branch_credit(config, grpo_config) -> BranchCredit:
    """``credit="branch"`` from the trainer's config (see :class:`BranchCredit`)."""
    return BranchCredit(config.branch_samples, config.branch_turns_per_game, config.branch_advantage, config.seed,
                        RAE(config.rae_alpha, config.rae_per_player), config.branch_move_temperature,
                        config.branch_move_clip, grpo_config.temperature, config.branch_temperature,
                        config.branch_replies, config.branch_move_loss)
