"""Kuhn poker exploitability, the information-state mapping to OpenSpiel, and policy read-out.

A *strategy* (as ``games.kuhn_poker.equilibrium_strategy`` returns) maps each of the 12 information
sets ``"<card>:<history>"`` (``"Q:check bet"``) of both seats to P(bet or call); check or fold takes
the rest. OpenSpiel's ``kuhn_poker`` names that set ``"1pb"``: cards J, Q, K are 0, 1, 2, check/fold
is "p" (action 0, Pass), bet/call is "b" (action 1, Bet). ``exploitability`` (mean over seats of a
best response's gain, 0 at a Nash equilibrium) uses OpenSpiel when installed (extra ``eval``), else
the same number from the exact best response here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from autocurricula.eval.meta import nash_mixture, row_mixture, zero_sum_nash
from autocurricula.eval.played import check_weights, reach_weights, read_sets, resolve_backend
from autocurricula.eval.players import main_agent
from autocurricula.games._common import DEFAULT_INVALID_PENALTY
from autocurricula.games.kuhn_poker import (CARDS, exact_value, first_action, is_terminal, legal_actions, payoff,
                                            render_prompt)
from autocurricula.records import is_scripted

__all__ = ["INFOSETS", "META_GAMES", "LeagueStrategies", "best_response_value", "chip_payoffs", "exploitability",
           "exploitability_callback", "least_exploitable_mixture", "meta_mixture", "mixture_strategy", "openspiel_key",
           "openspiel_policy", "played_exploitability", "played_mixture", "prompt_of", "read_played", "read_strategy",
           "uniform_strategy"]

HISTORIES = ((), ("check",), ("bet",), ("check", "bet"))
INFOSETS = tuple(f"{c}:{' '.join(h)}" for h in HISTORIES for c in CARDS)
_LETTER = {"check": "p", "fold": "p", "bet": "b", "call": "b"}
_AGGRESSIVE = ("bet", "call")


def _split(infoset: str) -> tuple[str, tuple[str, ...]]:
    card, _, hist = infoset.partition(":")
    return card, tuple(hist.split())


def prompt_of(infoset: str) -> str:
    """The game's prompt for an information set, e.g. ``"Q:check bet"`` -> player 1's prompt."""
    card, history = _split(infoset)
    return render_prompt(card, history, len(history) % 2)


def openspiel_key(infoset: str, card_order: str = CARDS) -> str:
    """OpenSpiel's information-state string of ours: ``"Q:check bet"`` -> ``"1pb"``. ``card_order``
    lists our cards in OpenSpiel's card order (0, 1, 2); the default J, Q, K is the right one."""
    card, history = _split(infoset)
    return f"{card_order.index(card)}{''.join(_LETTER[a] for a in history)}"


def uniform_strategy() -> dict[str, float]:
    return dict.fromkeys(INFOSETS, 0.5)


def _check(strategy: Mapping[str, float]) -> Mapping[str, float]:
    missing = [k for k in INFOSETS if k not in strategy]
    if missing:
        raise ValueError(f"the strategy lacks information sets {missing}; give P(bet or call) for all 12 of "
                         f"autocurricula.eval.kuhn.INFOSETS")
    bad = {k: strategy[k] for k in INFOSETS if not 0.0 <= float(strategy[k]) <= 1.0}
    if bad:
        raise ValueError(f"probabilities must be in [0, 1], got {bad}")
    return strategy


def openspiel_policy(strategy: Mapping[str, float], game=None, card_order: str = CARDS):
    """An OpenSpiel ``TabularPolicy`` for ``kuhn_poker`` holding ``strategy``."""
    import pyspiel  # open_spiel: optional (extra eval)
    from open_spiel.python import policy as os_policy

    _check(strategy)
    game = game or pyspiel.load_game("kuhn_poker")
    tab = os_policy.TabularPolicy(game)
    for infoset in INFOSETS:
        p = float(strategy[infoset])
        tab.policy_for_key(openspiel_key(infoset, card_order))[:] = [1.0 - p, p]
    return tab


def _p_action(strategy: Mapping[str, float], card: str, history: tuple[str, ...], action: str) -> float:
    p = float(strategy[f"{card}:{' '.join(history)}"])
    return p if action in _AGGRESSIVE else 1.0 - p


def best_response_value(strategy: Mapping[str, float], seat: int) -> float:
    """Expected chips per hand of an exact best response in ``seat`` (0 = player 1) to ``strategy``."""
    _check(strategy)
    return _played_best_response({k: (float(p), 0.0) for k, p in strategy.items()}, seat, (0.0, 0.0))


def exploitability(strategy: Mapping[str, float], *, backend: str = "auto", card_order: str = CARDS) -> float:
    """``(BR_1 + BR_2) / 2`` chips per hand (the game value cancels). ``backend``: "openspiel",
    "python" or "auto"; ``card_order`` checks the mapping (OpenSpiel only)."""
    backend = resolve_backend(backend)
    if backend == "python":
        if card_order != CARDS:
            raise ValueError("card_order applies to the OpenSpiel mapping; use backend='openspiel'")
        return (best_response_value(strategy, 0) + best_response_value(strategy, 1)) / 2
    try:  # open_spiel: optional (extra eval)
        import pyspiel
        from open_spiel.python.algorithms import exploitability as os_exploitability
    except ImportError as e:
        raise ImportError("backend='openspiel' needs OpenSpiel: pip install 'autocurricula[eval]'") from e
    game = pyspiel.load_game("kuhn_poker")
    return float(os_exploitability.exploitability(game, openspiel_policy(strategy, game, card_order)))


def _own_reach(strategy: Mapping[str, float], infoset: str) -> float:
    card, history = _split(infoset)
    seat, reach = len(history) % 2, 1.0
    for i in range(seat, len(history), 2):  # the player's own earlier actions
        reach *= _p_action(strategy, card, history[:i], history[i])
    return reach


def mixture_strategy(strategies: Sequence[Mapping[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """One behaviour strategy equivalent to sampling a player per hand by ``weights``: each set averages
    the players weighted by weight x own reach (Kuhn's theorem); an unreached set, by weight."""
    w = check_weights(len(strategies), weights)
    for s in strategies:
        _check(s)
    out = {}
    for infoset in INFOSETS:
        r = reach_weights(w, [_own_reach(s, infoset) for s in strategies])
        p = sum(rk * float(s[infoset]) for rk, s in zip(r, strategies))
        if not -1e-9 <= p <= 1 + 1e-9:
            raise AssertionError(f"mixture probability {p} at {infoset}: the reach weights do not sum to 1")
        out[infoset] = min(1.0, max(0.0, p))  # a weighted mean, kept in [0, 1] against rounding (1.0000000000000002)
    return out


def read_strategy(engine, player: str | None, *, completion: Callable[[str], str] = str,
                  eos: bool = False) -> dict[str, float]:
    """A model player's strategy (``None``: the base model): at each set's prompt, P(bet or call) of the
    legal actions' completions (``completion(action)``, plus EOS with ``eos``), normalised over the two."""
    tok = engine.tokenizer
    out = {}
    for infoset in INFOSETS:
        prompt_ids = engine.encode(prompt_of(infoset))
        logp = {}
        for action in legal_actions(_split(infoset)[1]):
            comp = list(tok.encode(completion(action), add_special_tokens=False)) + ([tok.eos_token_id] if eos else [])
            if not comp:
                raise ValueError(f"completion({action!r}) is empty; it must produce at least one token")
            logits = np.asarray(engine.logits(prompt_ids + comp, player), dtype=np.float64)
            rows = logits[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(comp)]
            top = rows.max(axis=1, keepdims=True)
            lse = (top[:, 0] + np.log(np.exp(rows - top).sum(axis=1)))
            logp[action] = float(sum(rows[i, t] - lse[i] for i, t in enumerate(comp)))
        agg = next(a for a in logp if a in _AGGRESSIVE)
        pas = next(a for a in logp if a not in _AGGRESSIVE)
        out[infoset] = float(1.0 / (1.0 + math.exp(logp[pas] - logp[agg])))
    return out


def chip_payoffs(strategies: Sequence[Mapping[str, float]]):
    """The exact meta-game (PSRO's restricted game without sampling noise): ``M[i][j]`` = chips per
    hand ``i`` wins from ``j``, averaged over seats; antisymmetric."""
    for s in strategies:
        _check(s)
    n = len(strategies)
    m = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            m[i, j] = (exact_value(strategies[i], strategies[j]) - exact_value(strategies[j], strategies[i])) / 2
            m[j, i] = -m[i, j]
    return m


def least_exploitable_mixture(strategies: Sequence[Mapping[str, float]]):
    """``(weights, exploitability)`` of the mixture of ``strategies`` (as :func:`mixture_strategy`) that
    a best response exploits least (by LP over the responder's pure strategies): no meta-solver does better."""
    for s in strategies:
        _check(s)
    seats = [[k for k in INFOSETS if len(_split(k)[1]) % 2 == seat] for seat in (0, 1)]
    pure = [[dict(zip(sets, bits)) for bits in itertools.product((0.0, 1.0), repeat=len(sets))] for sets in seats]
    first = np.array([[exact_value({**s, **b}, s) for s in strategies] for b in pure[0]])  # responder as player 1
    second = np.array([[-exact_value(s, {**s, **b}) for s in strategies] for b in pure[1]])  # ... as player 2
    gains = (first[:, None, :] + second[None, :, :]).reshape(-1, len(strategies)) / 2  # (pure pair, member)
    weights, _, value = zero_sum_nash(-gains.T)  # the members minimise the responder's best pair's gain
    return weights, float(-value)


META_GAMES = ("league", "chips")


def meta_mixture(strategies: Sequence[Mapping[str, float]], win_rates=None, *, meta: str = "chips"):
    """Nash weights over players, from :func:`chip_payoffs` (``meta="chips"``) or the league's
    ``win_rates`` (``meta="league"``, e.g. ``trainer.payoff.matrix(ids)``, blind to chip margins)."""
    if meta not in META_GAMES:
        raise ValueError(f"meta must be one of {META_GAMES}, got {meta!r}")
    if meta == "league":
        if win_rates is None:
            raise ValueError("meta='league' needs the league's win-rate matrix: win_rates=trainer.payoff.matrix(ids)")
        return np.asarray(nash_mixture(win_rates), dtype=np.float64)
    game = chip_payoffs(strategies)
    if not np.any(np.abs(game) > 1e-12):  # every pair even: uniform, as nash_mixture does
        return np.full(len(strategies), 1.0 / len(strategies))
    return row_mixture(game)


class LeagueStrategies:
    """Model players' strategies (frozen ones read once; scripted ones left out). ``figures(trainer)``:
    ``exploitability_latest`` (the top-Elo trainable main agent), ``exploitability_mixture`` (the
    ``meta`` game's Nash mixture), ``exploitability_mixture_league`` / ``_chips``, ``mixture``."""

    def __init__(self, *, meta: str = "chips", completion: Callable[[str], str] = str, eos: bool = False,
                 backend: str = "auto"):
        if meta not in META_GAMES:
            raise ValueError(f"meta must be one of {META_GAMES}, got {meta!r}")
        self.meta, self.completion, self.eos, self.backend = meta, completion, eos, backend
        self._frozen: dict[str, dict[str, float]] = {}

    def strategies(self, trainer, *, frozen_only: bool = False) -> dict[str, dict[str, float]]:
        """``{player id: strategy}`` of the model players (only the frozen ones with ``frozen_only``)."""
        out = {}
        for p in trainer.players:
            if is_scripted(p) or (frozen_only and not p.frozen):
                continue
            pid = p.id
            if pid in self._frozen:
                out[pid] = self._frozen[pid]
                continue
            out[pid] = read_strategy(trainer.engine, pid, completion=self.completion, eos=self.eos)
            if p.frozen:
                self._frozen[pid] = out[pid]
        return out

    def figures(self, trainer) -> dict:
        strategies = self.strategies(trainer)
        ids = list(strategies)
        latest = main_agent(trainer)
        out = {"exploitability_latest": exploitability(strategies[latest], backend=self.backend)}
        weights = {}
        for meta in META_GAMES:
            if meta == "league":  # the leaderboard's meta-strategy: relative payoffs at their lower bounds
                league = trainer.standings.meta_strategy(ids)
                w = [league[i] for i in ids]
            else:
                w = meta_mixture([strategies[i] for i in ids], meta=meta)
            weights[meta] = w
            mix = mixture_strategy([strategies[i] for i in ids], w)
            out[f"exploitability_mixture_{meta}"] = exploitability(mix, backend=self.backend)
        out["exploitability_mixture"] = out[f"exploitability_mixture_{self.meta}"]
        out["mixture"] = {pid: round(float(x), 4) for pid, x in zip(ids, weights[self.meta]) if x > 0}
        out["latest"] = latest
        return out


def exploitability_callback(*, prefix: str = "eval/", completion: Callable[[str], str] = str, eos: bool = False,
                            backend: str = "auto", meta: str = "league") -> Callable:
    """A ``train(..., callbacks=[...])`` callback returning :class:`LeagueStrategies`' exploitability
    figures under ``prefix`` after every epoch."""
    league = LeagueStrategies(meta=meta, completion=completion, eos=eos, backend=backend)

    def callback(trainer) -> dict:
        figures = league.figures(trainer)
        return {f"{prefix}{k}": v for k, v in figures.items() if k.startswith("exploitability")}

    return callback


# -- as played: invalid replies included ------------------------------------------------------------
# A *played* strategy maps each information set to ``(P(bet or call), P(invalid))``; the passive
# action takes the rest. An invalid reply ends the hand with the game's ``invalid_penalty``.

def read_played(engine, player: str | None, *, temperature: float = 1.0, max_tokens: int = 3,
                threshold: float = 1e-4) -> tuple[dict[str, tuple[float, float]], float]:
    """``(played strategy, largest unresolved mass)`` of a model player, its replies parsed as the game
    does (:func:`autocurricula.eval.played.read_sets`); mass below ``threshold`` counts as invalid."""
    sets = {k: (prompt_of(k), legal_actions(_split(k)[1])) for k in INFOSETS}
    read, unresolved = read_sets(engine, player, sets, first_action, temperature=temperature, max_tokens=max_tokens,
                                 threshold=threshold)
    played = {k: (sum(p for a, p in words.items() if a in _AGGRESSIVE), bad) for k, (words, bad) in read.items()}
    return played, unresolved


def _played_action(played: Mapping[str, tuple[float, float]], card: str, history: tuple[str, ...],
                   action: str) -> float:
    agg, bad = played[f"{card}:{' '.join(history)}"]
    return agg if action in _AGGRESSIVE else max(0.0, 1.0 - agg - bad)


def _played_best_response(played: Mapping[str, tuple[float, float]], seat: int, penalty) -> float:
    """Chips per hand of an exact (legal) best response in ``seat`` against ``played``."""
    def value(history: tuple[str, ...], weights: dict[str, float], mine: str) -> float:
        if is_terminal(history):
            return sum(w * payoff((mine + o) if seat == 0 else (o + mine), history)[seat] for o, w in weights.items())
        actions = legal_actions(history)
        if len(history) % 2 == seat:
            return max(value(history + (a,), weights, mine) for a in actions)
        forfeits = sum(w * played[f"{o}:{' '.join(history)}"][1] for o, w in weights.items()) * penalty[1]
        return forfeits + sum(value(history + (a,), {o: w * _played_action(played, o, history, a)
                                                     for o, w in weights.items()}, mine) for a in actions)

    return sum(value((), {o: 0.5 for o in CARDS if o != c}, c) for c in CARDS) / len(CARDS)


def played_exploitability(played: Mapping[str, tuple[float, float]],
                          invalid_penalty=DEFAULT_INVALID_PENALTY) -> float:
    """:func:`exploitability` of a played strategy, each invalid reply paying ``invalid_penalty[1]``."""
    missing = [k for k in INFOSETS if k not in played]
    if missing:
        raise ValueError(f"the played strategy lacks information sets {missing}")
    return (_played_best_response(played, 0, invalid_penalty) + _played_best_response(played, 1, invalid_penalty)) / 2


def played_mixture(strategies: Sequence[Mapping[str, tuple[float, float]]],
                   weights: Sequence[float]) -> dict[str, tuple[float, float]]:
    """:func:`mixture_strategy` of played strategies (an invalid reply ends the hand: it reaches nothing)."""
    w = check_weights(len(strategies), weights)

    def reach(s, infoset):
        card, history = _split(infoset)
        r = 1.0
        for i in range(len(history) % 2, len(history), 2):
            r *= _played_action(s, card, history[:i], history[i])
        return r

    out = {}
    for infoset in INFOSETS:
        r = reach_weights(w, [reach(s, infoset) for s in strategies])
        out[infoset] = (sum(rk * s[infoset][0] for rk, s in zip(r, strategies)),
                        sum(rk * s[infoset][1] for rk, s in zip(r, strategies)))
    return out
