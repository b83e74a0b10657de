"""PSRO on Kuhn poker with exact best responses and no model: how many joins it needs.

    python research/kuhn_psro_ideal.py                       # exact, tau 0.25 / clip 2, tau 0.1 / clip 3
    python research/kuhn_psro_ideal.py --tau 0.15 --clip 3 --joins 40

Each iteration solves the restricted game among the population exactly (the chip payoffs between
members, both seats, by LP), and adds the best response to its Nash mixture. ``--tau 0`` adds the
exact pure best response; ``tau > 0`` adds the bounded softmax response that
``BranchCredit(advantage="moves")`` regresses a responder toward, ``P ∝ exp(clip((Q - mean Q) / tau,
±clip))`` at each information set, valued by backward induction against the mixture. The figures
are what PSRO reaches when every responder learns its target exactly: the number of joins a
training run must afford, and the floor that a target's smoothing leaves. The population starts
from the uniform policy (``--start warm`` starts from the Kuhn warm base's played strategy on seed
0, read off the engine). Prints one JSON line per setting: the mixture's exploitability after each
join.

``--per-visit`` bounds each visit's values instead (the opponent's card known, as branches that
replay the recorded deal see it) and takes the reach-weighted mean of the bounded logits, the fixed
point of the residual regression when each turn is valued alone (``pool_states=False``); the
default values the information set first, as ``pool_states=True`` does within a round.
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from autocurricula.eval.kuhn import INFOSETS, exploitability, mixture_strategy  # noqa: E402
from autocurricula.eval.meta import zero_sum_nash  # noqa: E402
from autocurricula.games.kuhn_poker import exact_value  # noqa: E402
from kuhn_moves_fixed_point import move_values, target, visits  # noqa: E402

FIRST_SEAT = tuple(k for k in INFOSETS if len(k.partition(":")[2].split()) % 2 == 0)  # player 1 acts
# the Kuhn warm base (examples/kuhn_league.py, seed 0): P(bet or call) per set, read as played off the
# engine (autocurricula.eval.kuhn.read_played on the base) and rounded to 2 decimals
WARM_BASE = {"J:": 0.63, "Q:": 0.56, "K:": 0.35, "J:check": 0.22, "Q:check": 0.37, "K:check": 0.28,
             "J:bet": 0.73, "Q:bet": 0.35, "K:bet": 0.61, "J:check bet": 0.58, "Q:check bet": 0.86,
             "K:check bet": 0.61}


def visit_logits(strategy: dict[str, float], tau: float, clip: float) -> dict[str, float]:
    """Per information set, the reach-weighted mean over deals of each visit's bounded half-logit
    ``clip((Q_agg - Q_pas) / 2 / tau, ±clip)``, with Q known given both cards."""
    num, den = dict.fromkeys(INFOSETS, 0.0), dict.fromkeys(INFOSETS, 0.0)
    for key, weight, agg, pas in visits(strategy):
        num[key] += weight * max(-clip, min(clip, (agg - pas) / 2 / tau))
        den[key] += weight
    return {k: num[k] / den[k] if den[k] else 0.0 for k in INFOSETS}


def response(mixture: dict[str, float], tau: float, clip: float, per_visit: bool = False) -> dict[str, float]:
    """The best response to ``mixture`` in both seats: exact and pure for ``tau == 0`` (ties go
    to the passive move), else the bounded softmax target at every information set (of each
    visit's bounded values with ``per_visit``)."""
    def pick(values):
        return float(values[0] > values[1]) if tau == 0 else target(values, tau, clip)

    mine = dict(mixture)
    for _ in range(2):  # player 1's later decision is valued first, then its opening uses it
        first = {k: mine[k] if k in FIRST_SEAT else mixture[k] for k in INFOSETS}
        second = {k: mixture[k] if k in FIRST_SEAT else mine[k] for k in INFOSETS}
        if per_visit and tau > 0:
            as_first, as_second = visit_logits(first, tau, clip), visit_logits(second, tau, clip)
            mine = {k: 1.0 / (1.0 + math.exp(-2 * (as_first if k in FIRST_SEAT else as_second)[k]))
                    for k in INFOSETS}
            continue
        as_first, as_second = move_values(first), move_values(second)
        mine = {k: pick((as_first if k in FIRST_SEAT else as_second)[k]) for k in INFOSETS}
    return mine


def restricted_game(population: list[dict[str, float]]) -> np.ndarray:
    """Chips per hand of row against column, the mean over both seats (antisymmetric)."""
    return np.array([[0.5 * (exact_value(a, b) - exact_value(b, a)) for b in population] for a in population])


def curve(start: dict[str, float], tau: float, clip: float, joins: int, per_visit: bool = False) -> list[float]:
    """The Nash mixture's exploitability before each join (``joins + 1`` figures)."""
    population, out = [start], []
    for _ in range(joins + 1):
        weights = zero_sum_nash(restricted_game(population))[0]
        mixture = mixture_strategy(population, list(weights))
        out.append(exploitability(mixture, backend="python"))
        population.append(response(mixture, tau, clip, per_visit))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tau", type=float, nargs="+", default=[0.0, 0.25, 0.1])
    parser.add_argument("--clip", type=float, nargs="+", default=[0.0, 2.0, 3.0],
                        help="one per --tau (ignored where tau is 0)")
    parser.add_argument("--joins", type=int, default=20)
    parser.add_argument("--start", choices=["uniform", "warm"], default="uniform")
    parser.add_argument("--per-visit", action="store_true", help="bound each visit's values (the opponent's "
                        "card known), then average: the target of turns valued alone")
    args = parser.parse_args(argv)
    if len(args.clip) != len(args.tau):
        parser.error("give one --clip per --tau")
    start = dict.fromkeys(INFOSETS, 0.5) if args.start == "uniform" else WARM_BASE
    for tau, clip in zip(args.tau, args.clip):
        figures = curve(start, tau, clip, args.joins, args.per_visit)
        reached = next((i for i, e in enumerate(figures) if e <= 0.05), None)
        print(json.dumps({"tau": tau, "clip": clip, "start": args.start, "per_visit": args.per_visit and tau > 0, "joins_to_0.05": reached,
                          "final": round(figures[-1], 4), "curve": [round(e, 4) for e in figures]}), flush=True)


if __name__ == "__main__":
    main()
