"""Exact exploitability of a policy as played, for any small OpenSpiel game
(:mod:`autocurricula.games.openspiel`).

A *policy* maps each information set ``(player, information-state string)`` of
:meth:`~autocurricula.games.openspiel.OpenSpielGame.information_sets` to ``(probabilities of its
legal actions, forfeit)``: the forfeit is the mass of every reply that is no legal move, which in
play ends the game with the forfeit payoffs. Nothing is renormalised away: the policy is scored on
the game *extended by a forfeit move* at every decision (:class:`ForfeitGame`, a state wrapper that
OpenSpiel's algorithms walk as they walk the game), by OpenSpiel's own ``nash_conv`` and
``BestResponsePolicy``. The best responder may forfeit too, but never gains by it (a forfeit pays
the game's lowest payoff), so it is the best legal response. Exploitability is NashConv / 2, 0 at
an equilibrium, in the game's units (``share`` of the payoff range in :func:`figures`).

:func:`read_policy` reads a model player's policy off the engine: each legal move's probability is
that of its canonical spelling (the move's tokens after the prompt, as the warm-up teaches it, then
the end token), batched (``Engine.completion_logprobs``); every other reply, including a legal move
spelt another way, counts as a forfeit, so the figure is exact for a model that spells its moves
canonically and an upper bound otherwise. :func:`mixture` is the behaviour policy equal to drawing
one player per game by weight (each set's probabilities weighted by weight x own reach, Kuhn's
theorem, as :func:`autocurricula.eval.kuhn.mixture_strategy`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from autocurricula.eval.played import check_weights, reach_weights

__all__ = ["ForfeitGame", "ForfeitPolicy", "exploitability", "figures", "forfeit_rate", "mixture", "policy_values",
           "read_policy", "sampled_policy", "uniform_policy"]

Policy = dict  # (player, key) -> (np.ndarray of action probabilities, forfeit mass)


def uniform_policy(game) -> Policy:
    """Every legal move equally likely, no forfeit."""
    return {k: (np.full(len(s.actions), 1.0 / len(s.actions)), 0.0) for k, s in game.information_sets().items()}


def read_policy(engine, player: str | None, game, *, temperature: float = 1.0) -> Policy:
    """``player``'s policy (None: the base model) at every information set of ``game``, at
    ``temperature`` (module docstring: canonical spellings, the rest forfeits)."""
    tok = engine.tokenizer
    sets = list(game.information_sets().items())
    pairs, index = [], []
    for key, s in sets:
        prompt = engine.encode(s.prompt)
        for j, move in enumerate(s.moves):
            pairs.append((prompt, list(tok.encode(move, add_special_tokens=False)) + [tok.eos_token_id]))
            index.append((key, j))
    logps = engine.completion_logprobs(pairs, player, temperature) if pairs else []
    probs = {key: np.zeros(len(s.actions)) for key, s in sets}
    for (key, j), lp in zip(index, logps):
        probs[key][j] = float(np.exp(lp))
    return {key: (p, max(0.0, 1.0 - float(p.sum()))) for key, p in probs.items()}


def _own_reach(game, policy: Policy, key) -> float:
    """The product of the player's own probabilities of the actions that lead to set ``key``."""
    sets, reach = game.information_sets(), 1.0
    parent = sets[key].parent
    while parent is not None:
        pkey, action = parent
        s = sets[pkey]
        reach *= float(policy[pkey][0][s.actions.index(action)])
        parent = s.parent
    return reach


def mixture(game, policies: Sequence[Policy], weights: Sequence[float]) -> Policy:
    """One behaviour policy equal to drawing one of ``policies`` per game by ``weights`` (module
    docstring); forfeits are mixed like moves (a forfeit ends the game: it reaches nothing)."""
    w = check_weights(len(policies), weights)
    if len(policies) == 1:
        return dict(policies[0])
    out = {}
    for key in game.information_sets():
        r = reach_weights(w, [_own_reach(game, pol, key) for pol in policies])
        probs = sum(rk * pol[key][0] for rk, pol in zip(r, policies))
        out[key] = (probs, float(sum(rk * pol[key][1] for rk, pol in zip(r, policies))))
    return out


# ------------------------------------------------------------------ the game extended by a forfeit move

class ForfeitState:
    """A pyspiel state with one more action at every decision: ``forfeit`` (id ``num_distinct_actions``),
    which ends the game with the adapter's forfeit payoffs. Quacks as the states OpenSpiel's Python
    algorithms walk (``nash_conv``, ``BestResponsePolicy``)."""

    def __init__(self, game: "ForfeitGame", inner, ended: tuple | None = None):
        self._game, self.inner, self.ended = game, inner, ended  # ended: (offenders, returns)

    def get_game(self):
        return self._game

    def is_terminal(self) -> bool:
        return self.ended is not None or self.inner.is_terminal()

    def returns(self) -> list[float]:
        return list(self.ended[1]) if self.ended is not None else list(self.inner.returns())

    def player_return(self, player: int) -> float:
        return self.returns()[player]

    def current_player(self) -> int:
        return -4 if self.ended is not None else self.inner.current_player()  # pyspiel's kTerminalPlayerId

    def is_chance_node(self) -> bool:
        return self.ended is None and self.inner.is_chance_node()

    def is_simultaneous_node(self) -> bool:
        return self.ended is None and self.inner.is_simultaneous_node()

    def chance_outcomes(self):
        return self.inner.chance_outcomes()

    def legal_actions(self, player: int | None = None) -> list[int]:
        if self.is_terminal():
            return []
        if self.inner.is_chance_node():
            return list(self.inner.legal_actions())
        if player is None:
            player = self.inner.current_player()
        inner = list(self.inner.legal_actions(player))
        return inner + [self._game.forfeit_action] if inner else inner

    def information_state_string(self, player: int) -> str:
        return self._game.os.info_string(self.inner, player)

    def history_str(self) -> str:
        return self.inner.history_str() + (f" forfeit{self.ended[0]}" if self.ended is not None else "")

    def clone(self) -> "ForfeitState":
        return ForfeitState(self._game, self.inner.clone(), self.ended)

    def apply_action(self, action: int) -> None:
        if action == self._game.forfeit_action and not self.inner.is_chance_node():  # chance ids may collide
            offender = self.inner.current_player()
            self.ended = ((offender,), tuple(self._game.os.forfeit_rewards([offender])))
        else:
            self.inner.apply_action(action)

    def apply_actions(self, actions) -> None:
        offenders = [p for p, a in enumerate(actions) if a == self._game.forfeit_action]
        if offenders:
            self.ended = (tuple(offenders), tuple(self._game.os.forfeit_rewards(offenders)))
        else:
            self.inner.apply_actions(list(actions))

    def child(self, action: int) -> "ForfeitState":
        out = self.clone()
        out.apply_action(action)
        return out


class ForfeitGame:
    """An :class:`~autocurricula.games.openspiel.OpenSpielGame`'s pyspiel game extended by a forfeit
    move (:class:`ForfeitState`)."""

    def __init__(self, game):
        self.os = game
        self.forfeit_action = game.game.num_distinct_actions()

    def new_initial_state(self) -> ForfeitState:
        return ForfeitState(self, self.os.game.new_initial_state())

    def num_players(self) -> int:
        return 2

    def utility_sum(self) -> float:
        return self.os.utility_sum


class ForfeitPolicy:
    """A :data:`Policy` as OpenSpiel's ``policy.Policy`` interface reads it, forfeit included."""

    def __init__(self, game: ForfeitGame, policy: Policy):
        self.game, self.policy = game, policy
        self.sets = game.os.information_sets()
        self.player_ids = [0, 1]

    def action_probabilities(self, state: ForfeitState, player_id: int | None = None) -> dict[int, float]:
        player = state.current_player() if player_id is None else player_id
        key = (player, state.information_state_string(player))
        probs, forfeit = self.policy[key]
        out = {a: float(p) for a, p in zip(self.sets[key].actions, probs)}
        out[self.game.forfeit_action] = float(forfeit)
        return out


def exploitability(game, policy: Policy) -> float:
    """Half the NashConv of ``policy`` (both seats) on the game extended by the forfeit move, by
    OpenSpiel's ``nash_conv`` (its Python best response): what an exact best response gains, in the
    game's units, averaged over the seats. 0 at an equilibrium."""
    from open_spiel.python.algorithms.exploitability import nash_conv  # open_spiel: optional (extra openspiel)

    extended = ForfeitGame(game)
    return float(nash_conv(extended, ForfeitPolicy(extended, policy), use_cpp_br=False)) / 2


def policy_values(game, policies: Sequence[Policy]) -> np.ndarray:
    """Each player's expected return when player ``i`` plays ``policies[i]`` (forfeits included)."""
    extended = ForfeitGame(game)
    both = [ForfeitPolicy(extended, p) for p in policies]

    def value(state) -> np.ndarray:
        if state.is_terminal():
            return np.asarray(state.returns(), dtype=np.float64)
        if state.is_chance_node():
            return sum(p * value(state.child(a)) for a, p in state.chance_outcomes())
        if state.is_simultaneous_node():
            per = [both[p].action_probabilities(state, p) for p in range(2)]
            total = np.zeros(2)
            for (a0, p0), (a1, p1) in itertools.product(per[0].items(), per[1].items()):
                if p0 * p1 > 0:
                    child = state.clone()
                    child.apply_actions([a0, a1])
                    total += p0 * p1 * value(child)
            return total
        probs = both[state.current_player()].action_probabilities(state)
        return sum(p * value(state.child(a)) for a, p in probs.items() if p > 0)

    return value(extended.new_initial_state())


def forfeit_rate(game, policy: Policy) -> float:
    """The probability that a game of ``policy`` against itself ends on a forfeit."""
    extended = ForfeitGame(game)
    pol = ForfeitPolicy(extended, policy)

    def walk(state, reach: float) -> float:
        if reach <= 0 or state.is_terminal():
            return reach if state.ended is not None else 0.0
        if state.is_chance_node():
            return sum(walk(state.child(a), reach * p) for a, p in state.chance_outcomes())
        if state.is_simultaneous_node():
            per = [pol.action_probabilities(state, p) for p in range(2)]
            out = 0.0
            for (a0, p0), (a1, p1) in itertools.product(per[0].items(), per[1].items()):
                if p0 * p1 > 0:
                    child = state.clone()
                    child.apply_actions([a0, a1])
                    out += walk(child, reach * p0 * p1)
            return out
        return sum(walk(state.child(a), reach * p) for a, p in pol.action_probabilities(state).items() if p > 0)

    return float(walk(extended.new_initial_state(), 1.0))


def sampled_policy(game, policy: Policy, invalid: str = "??"):
    """A scripted ``fn(prompt, rng)`` replying as ``policy`` does: a legal move by its probability, or
    ``invalid`` (no legal move) with the forfeit mass; for checking the scoring against sampled play."""
    by_prompt = {s.prompt: (s, *policy[key]) for key, s in game.information_sets().items()}

    def reply(prompt: str, rng) -> str:
        s, probs, forfeit = by_prompt[prompt]
        x, acc = rng.random(), 0.0
        for move, p in zip(s.moves, probs):
            acc += p
            if x < acc:
                return move
        return invalid if forfeit > 0 else s.moves[-1]

    return reply


def figures(game, policies: Mapping[str, Policy], weights: Mapping[str, float]) -> dict:
    """The deployed mixture's ``exploitability`` (game units), ``exploitability_share`` (of the payoff
    range), ``invalid_rate`` (the forfeit mass, mean over information sets) and ``forfeit_rate`` (the
    share of self-play games that end on a forfeit)."""
    ids = [pid for pid, w in weights.items() if w > 0]
    mix = mixture(game, [policies[pid] for pid in ids], [weights[pid] for pid in ids])
    lo, hi = game.facts.payoff_range
    expl = exploitability(game, mix)
    return {"exploitability": expl, "exploitability_share": expl / (hi - lo),
            "invalid_rate": float(np.mean([f for _, f in mix.values()])), "forfeit_rate": forfeit_rate(game, mix)}
