"""Where branch credit's "moves" regression leads in Kuhn poker self-play, with exact values.

    python research/kuhn_moves_fixed_point.py [--tau 0.25] [--clip 2] [--iterations 20000]

``BranchCredit(advantage="moves")`` regresses each state's policy toward ``pi ∝ exp(y)`` with
``y = clip((Q - mean Q) / tau, ±clip)``, centred, where ``Q(s, m)`` is the mean return of the
branches that play m at s. In expectation over visits, Q is the on-policy value of the move at
the information set (the opponent's card weighted by how often it reaches the set). This script
iterates that map with exact Q values and a small step, with no model and no sampling noise: its
fixed point (a logit quantal-response equilibrium of the bounded map) is the best a self-play
learner with these settings can reach, and its exploitability is the floor of that learner.
Prints one JSON line per setting.
"""

import argparse
import json
import math

from autocurricula.eval.kuhn import INFOSETS, exploitability
from autocurricula.games.kuhn_poker import CARDS, infoset, is_terminal, legal_actions, payoff


def _moves(history):
    legal = legal_actions(history)
    return ("bet" if "bet" in legal else "call"), ("check" if "check" in legal else "fold")


def visits(strategy: dict[str, float], reach_strategy: dict[str, float] | None = None
           ) -> list[tuple[str, float, float, float]]:
    """Every decision of every deal under ``strategy`` for both seats: ``(information set, weight,
    value of the aggressive move, value of the passive move)``, the values the acting player's given
    both cards, the weight the other seat's and chance's reach of the node (the other seat playing
    ``reach_strategy``, default ``strategy``: games played otherwise than the values assume)."""
    reach_strategy = strategy if reach_strategy is None else reach_strategy
    out = []

    def value(cards, history):  # player 1's expected chips from here
        if is_terminal(history):
            return payoff(cards, history)[0]
        p = strategy[infoset(cards[len(history) % 2], history)]
        agg, pas = _moves(history)
        return p * value(cards, history + (agg,)) + (1 - p) * value(cards, history + (pas,))

    def walk(cards, history, reach):  # reach[seat]: the other seat's and chance's weight on this node
        if is_terminal(history):
            return
        seat = len(history) % 2
        key = infoset(cards[seat], history)
        sign = 1.0 if seat == 0 else -1.0
        agg, pas = _moves(history)
        out.append((key, reach[seat], sign * value(cards, history + (agg,)), sign * value(cards, history + (pas,))))
        for move, prob in ((agg, reach_strategy[key]), (pas, 1 - reach_strategy[key])):
            nxt = list(reach)
            nxt[1 - seat] *= prob
            walk(cards, history + (move,), nxt)

    for a in CARDS:
        for b in CARDS:
            if a != b:
                walk(a + b, (), [1.0, 1.0])
    return out


def move_values(strategy: dict[str, float], reach_strategy: dict[str, float] | None = None
                ) -> dict[str, tuple[float, float]]:
    """Per information set, the acting player's value of (aggressive, passive) moves under
    ``strategy`` for both seats, averaged over deals weighted by the other card's reach (under
    ``reach_strategy``, default ``strategy``)."""
    num = {k: [0.0, 0.0] for k in INFOSETS}
    den = dict.fromkeys(INFOSETS, 0.0)
    for key, weight, agg, pas in visits(strategy, reach_strategy):
        num[key][0] += weight * agg
        num[key][1] += weight * pas
        den[key] += weight
    return {k: (num[k][0] / den[k], num[k][1] / den[k]) if den[k] else (0.0, 0.0) for k in INFOSETS}


def target(values: tuple[float, float], tau: float, clip: float) -> float:
    """P(aggressive) at the map's target for one set (two moves: the centred bound is symmetric)."""
    half = (values[0] - values[1]) / 2
    y = max(-clip, min(clip, half / tau))
    return 1.0 / (1.0 + math.exp(-2 * y))


def fixed_point(tau: float, clip: float, iterations: int = 20000, step: float = 0.05) -> dict[str, float]:
    strategy = dict.fromkeys(INFOSETS, 0.5)
    for _ in range(iterations):
        q = move_values(strategy)
        strategy = {k: (1 - step) * strategy[k] + step * target(q[k], tau, clip) for k in INFOSETS}
    return strategy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tau", type=float, nargs="+", default=[0.5, 0.25, 0.1])
    parser.add_argument("--clip", type=float, default=2.0)
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args(argv)
    for tau in args.tau:
        s = fixed_point(tau, args.clip, args.iterations)
        figure = round(exploitability(s, backend="python"), 4)
        print(json.dumps({"tau": tau, "clip": args.clip, "exploitability": figure,
                          "strategy": {k: round(v, 3) for k, v in s.items()}}), flush=True)


if __name__ == "__main__":
    main()
