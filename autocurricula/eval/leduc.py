"""Leduc poker exploitability, exact and as played, the mapping to OpenSpiel, and policy read-out.

A *strategy* maps each of both seats' 288 information sets (``INFOSETS``: ``"QK:bet call|check"``)
to ``{legal word: probability}``; in a *played* strategy, what the words leave of 1 is an invalid
reply, which ends the hand with ``leduc_poker.INVALID_PENALTY`` (nothing is renormalised). Suits
never decide a hand, so a strategy over ranks is one over OpenSpiel's 936 information states
(:func:`openspiel_policy`, actions by ``OPENSPIEL_ACTION``). ``exploitability`` (NashConv / 2) uses
OpenSpiel when installed, else the same number from the exact best response here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autocurricula.eval.played import check_weights, reach_weights, read_sets, resolve_backend
from autocurricula.games.leduc_poker import (DECK, INVALID_PENALTY, RANKS, board_odds, deal_odds, first_action,
                                             information_sets, infoset, is_terminal, legal_actions, parse_infoset,
                                             payoff, render_prompt, round_over, to_move)

__all__ = ["INFOSETS", "OPENSPIEL_ACTION", "best_response_value", "exact_value", "exploitability", "invalid_per_hand",
           "invalid_rate", "openspiel_policy", "played_exploitability", "played_mixture", "prompt_of", "read_played",
           "uniform_strategy"]

INFOSETS = tuple(infoset(*k) for k in information_sets())
OPENSPIEL_ACTION = {"fold": 0, "check": 1, "call": 1, "bet": 2, "raise": 2}
_TOL = 1e-9

Strategy = Mapping[str, Mapping[str, float]]


def prompt_of(key: str) -> str:
    """The game's prompt at an information set, e.g. ``"QK:bet call|check"`` -> player 2's prompt."""
    card, board, rounds = parse_infoset(key)
    return render_prompt(card, board, rounds, to_move(rounds))


def uniform_strategy() -> dict[str, dict[str, float]]:
    out = {}
    for key in INFOSETS:
        legal = legal_actions(parse_infoset(key)[2])
        out[key] = dict.fromkeys(legal, 1.0 / len(legal))
    return out


def _check(strategy: Strategy, *, played: bool) -> Strategy:
    missing = [k for k in INFOSETS if k not in strategy]
    if missing:
        raise ValueError(f"the strategy lacks {len(missing)} information sets, e.g. {missing[:3]}; give "
                         f"{{word: probability}} for all {len(INFOSETS)} of autocurricula.eval.leduc.INFOSETS")
    for key in INFOSETS:
        probs, legal = strategy[key], legal_actions(parse_infoset(key)[2])
        extra = set(probs) - set(legal)
        total = sum(float(p) for p in probs.values())
        if extra or any(not 0.0 <= float(p) <= 1.0 + _TOL for p in probs.values()) or total > 1.0 + _TOL:
            raise ValueError(f"at {key!r} give probabilities in [0, 1] of the legal words {legal}, summing to at "
                             f"most 1, got {dict(probs)}")
        if not played and total < 1.0 - 1e-6:
            raise ValueError(f"at {key!r} the probabilities sum to {total}, not 1; a strategy with invalid replies "
                             f"is scored by played_exploitability")
    return strategy


def _invalid(probs: Mapping[str, float]) -> float:
    return max(0.0, 1.0 - sum(float(p) for p in probs.values()))


def _after(rounds: tuple, action: str) -> tuple:
    return rounds[:-1] + (rounds[-1] + (action,),)


def _walk(seat_value, strategy: Strategy, responder: int | None, penalty) -> float:
    """Chips per hand of seat ``seat_value``: an exact legal best response against ``strategy`` in
    the other seat when ``responder`` is that seat, or ``strategy`` in both seats when it is None."""
    def cards(mine: str, other: str, board: str) -> str:
        return mine + other + board if seat_value == 0 else other + mine + board

    def value(rounds: tuple, board: str | None, weights: dict[str, float], mine: str) -> float:
        if is_terminal(rounds):
            return sum(w * payoff(cards(mine, o, board or "?"), rounds)[seat_value] for o, w in weights.items())
        if round_over(rounds[-1]):  # chance deals the board
            return sum(value(rounds + ((),), b, {o: w * board_odds(mine + o).get(b, 0.0) for o, w in weights.items()},
                             mine) for b in RANKS)
        actor = to_move(rounds)
        legal = legal_actions(rounds)
        if actor == responder:
            return max(value(_after(rounds, a), board, weights, mine) for a in legal)
        if responder is None and actor == seat_value:  # both seats played: own card, own probabilities
            probs = strategy[infoset(mine, board, rounds)]
            forfeit = _invalid(probs) * sum(weights.values()) * penalty[0]
            return forfeit + sum(float(probs.get(a, 0.0)) * value(_after(rounds, a), board, weights, mine)
                                 for a in legal)
        probs = {o: strategy[infoset(o, board, rounds)] for o in weights}
        forfeit = sum(w * _invalid(probs[o]) for o, w in weights.items()) * penalty[1]
        return forfeit + sum(value(_after(rounds, a), board, {o: w * float(probs[o].get(a, 0.0))
                                                              for o, w in weights.items()}, mine) for a in legal)

    return sum(DECK.count(c) / len(DECK) * value(((),), None, deal_odds(c), c) for c in RANKS)


def best_response_value(strategy: Strategy, seat: int, invalid_penalty=INVALID_PENALTY) -> float:
    """Expected chips per hand of an exact (legal) best response in ``seat`` (0 = player 1) against
    ``strategy`` in the other seat, whose invalid replies pay the responder ``invalid_penalty[1]``."""
    _check(strategy, played=True)
    return _walk(seat, strategy, seat, invalid_penalty)


def exact_value(strategy: Strategy, invalid_penalty=INVALID_PENALTY) -> tuple[float, float]:
    """Each seat's expected chips per hand when ``strategy`` plays both seats (to pit two, give each
    seat's sets from its own), invalid replies scored by ``invalid_penalty``."""
    _check(strategy, played=True)
    return _walk(0, strategy, None, invalid_penalty), _walk(1, strategy, None, invalid_penalty)


def exploitability(strategy: Strategy, *, backend: str = "auto") -> float:
    """``(BR_1 + BR_2) / 2`` chips per hand; ``backend``: "openspiel", "python" or "auto"."""
    _check(strategy, played=False)
    if resolve_backend(backend) == "python":
        return (_walk(0, strategy, 0, (0.0, 0.0)) + _walk(1, strategy, 1, (0.0, 0.0))) / 2
    try:  # open_spiel: optional (extra eval)
        import pyspiel
        from open_spiel.python.algorithms import exploitability as os_exploitability
    except ImportError as e:
        raise ImportError("backend='openspiel' needs OpenSpiel: pip install 'autocurricula[eval]'") from e
    game = pyspiel.load_game("leduc_poker")
    return float(os_exploitability.exploitability(game, openspiel_policy(strategy, game)))


def openspiel_policy(strategy: Strategy, game=None):
    """An OpenSpiel ``TabularPolicy`` for ``leduc_poker`` holding ``strategy`` at every suited
    information state of each of its sets."""
    import pyspiel  # open_spiel: optional (extra eval)
    from open_spiel.python import policy as os_policy

    _check(strategy, played=False)
    game = game or pyspiel.load_game("leduc_poker")
    tab = os_policy.TabularPolicy(game)
    rank = {c: RANKS[c // 2] for c in range(len(DECK))}

    def visit(state, private: list[str], board: str | None, rounds: tuple) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for outcome, _ in state.chance_outcomes():
                child = state.child(outcome)
                if len(private) < 2:
                    visit(child, private + [rank[outcome]], board, rounds)
                else:
                    visit(child, private, rank[outcome], rounds + ((),))
            return
        seat = state.current_player()
        probs = strategy[infoset(private[seat], board, rounds)]
        row = tab.policy_for_key(state.information_state_string())
        row[:] = 0.0
        for word in legal_actions(rounds):
            row[OPENSPIEL_ACTION[word]] = float(probs.get(word, 0.0))
        for word in legal_actions(rounds):
            visit(state.child(OPENSPIEL_ACTION[word]), private, board, _after(rounds, word))

    visit(game.new_initial_state(), [], None, ((),))
    return tab


# -- as played: invalid replies included ------------------------------------------------------------

def read_played(engine, player: str | None, *, temperature: float = 1.0, max_tokens: int = 3,
                threshold: float = 1e-4) -> tuple[dict[str, dict[str, float]], float]:
    """``(played strategy, largest unread mass)`` of a model player, its replies parsed as the game does
    (:func:`autocurricula.eval.played.read_sets`); mass below ``threshold`` counts as invalid."""
    sets = {k: (prompt_of(k), legal_actions(parse_infoset(k)[2])) for k in INFOSETS}
    read, unresolved = read_sets(engine, player, sets, first_action, temperature=temperature, max_tokens=max_tokens,
                                 threshold=threshold)
    return {k: words for k, (words, _) in read.items()}, unresolved


def played_exploitability(played: Strategy, invalid_penalty=INVALID_PENALTY) -> float:
    """:func:`exploitability` of a played strategy, each invalid reply paying ``invalid_penalty[1]``."""
    _check(played, played=True)
    return (_walk(0, played, 0, invalid_penalty) + _walk(1, played, 1, invalid_penalty)) / 2


def invalid_rate(played: Strategy) -> float:
    """The probability of an invalid reply, averaged over the information sets."""
    _check(played, played=True)
    return sum(_invalid(played[k]) for k in INFOSETS) / len(INFOSETS)


def invalid_per_hand(played: Strategy) -> float:
    """The probability that a hand of ``played`` against itself ends on an invalid reply."""
    _check(played, played=True)

    def value(rounds: tuple, board: str | None, cards: str) -> float:
        if is_terminal(rounds):
            return 0.0
        if round_over(rounds[-1]):
            return value(rounds + ((),), cards[2], cards)
        probs = played[infoset(cards[to_move(rounds)], board, rounds)]
        return _invalid(probs) + sum(float(p) * value(_after(rounds, a), board, cards) for a, p in probs.items())

    total = 0.0
    for a in RANKS:
        for b, pb in deal_odds(a).items():
            for c, pc in board_odds(a + b).items():
                total += DECK.count(a) / len(DECK) * pb * pc * value(((),), None, a + b + c)
    return total


def played_mixture(strategies: Sequence[Strategy], weights: Sequence[float]) -> dict[str, dict[str, float]]:
    """One played strategy equivalent to drawing a player per hand by ``weights``: each set averages
    the players weighted by weight x own reach (Kuhn's theorem; an invalid reply reaches nothing)."""
    w = check_weights(len(strategies), weights)
    for s in strategies:
        _check(s, played=True)

    def reach(s: Strategy, key: str) -> float:
        card, board, rounds = parse_infoset(key)
        seat, r = to_move(rounds), 1.0
        for k, words in enumerate(rounds):
            shown = board if k == 1 else None
            for i in range(seat, len(words), 2):  # the player's own earlier actions
                r *= float(s[infoset(card, shown, rounds[:k] + (words[:i],))].get(words[i], 0.0))
        return r

    out = {}
    for key in INFOSETS:
        r = reach_weights(w, [reach(s, key) for s in strategies])
        out[key] = {a: sum(rk * float(s[key].get(a, 0.0)) for rk, s in zip(r, strategies))
                    for a in legal_actions(parse_infoset(key)[2])}
    return out
