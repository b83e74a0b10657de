"""What the tic-tac-toe league's random anchor does where the equilibrium is mixed: best-response
dynamics with exact values and no model, on Kuhn poker and the random matrix games.

    python research/anchor_bias_ideal.py                       # anchor shares 0 and 0.5, steps 0.05 - 0.2
    python research/anchor_bias_ideal.py --anchor 0 0.1 0.25 0.5 --step 0.1 --rounds 400

Each round the learner, one policy in both seats, moves a share ``step`` of the way to its
target: ``softmax(Q / tau)`` (``--targets soft``) or the best known move (``hard``, what
``QCredit(target_coef>0)`` trains toward), with ``Q`` the exact values of its moves against the
opponents of that round: the game's uniform random player in a share ``anchor`` of the games (the
example's ``anchor_share``, 0.5) and the learner itself in the rest, drawn per game (Kuhn: one
behaviour strategy by Kuhn's theorem, ``mixture_strategy``). ``step`` stands for the share of
the way a trained round moves the policy. With ``anchor`` 0 these are the smoothed (soft) or
plain (hard) best-response dynamics of self-play, which settle (soft) or swing (hard) near an
equilibrium for small steps in two-player zero-sum games; with ``anchor`` > 0 they end near a best
response to the mixture of random play and the learner instead. Kuhn starts from the warm base's played strategy (seed 0), the matrix
games from uniform play. One JSON line per setting: Kuhn's exploitability (chips per hand) after
rounds 24, 48, 96 and the last, and its range over the last quarter; the matrix games' median and
worst exploitability (share of the payoff range) after the last round.
"""

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from autocurricula.eval.kuhn import INFOSETS, exploitability, mixture_strategy  # noqa: E402
from autocurricula.games.matrix import random_game  # noqa: E402
from kuhn_moves_fixed_point import move_values  # noqa: E402
from kuhn_psro_ideal import FIRST_SEAT, WARM_BASE  # noqa: E402

SHOWN = (24, 48, 96)


def target(q_agg: float, q_pas: float, tau: float, soft: bool) -> float:
    """P(the aggressive move) of the round's target: logistic in ``(Q_agg - Q_pas) / tau``, or the
    better move (ties passive)."""
    if not soft:
        return float(q_agg > q_pas)
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, (q_agg - q_pas) / tau))))


def kuhn_values(x: dict[str, float], y: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Each set's (aggressive, passive) move values for ``x`` in the seat it belongs to, ``y`` in the other."""
    first = move_values({k: x[k] if k in FIRST_SEAT else y[k] for k in INFOSETS})
    second = move_values({k: y[k] if k in FIRST_SEAT else x[k] for k in INFOSETS})
    return {k: (first if k in FIRST_SEAT else second)[k] for k in INFOSETS}


def kuhn_curve(anchor: float, tau: float, step: float, rounds: int, soft: bool = True, noise: float = 0.0,
               seed: int = 0) -> list[float]:
    """Kuhn's exploitability after each round (P(bet or call) per information set); ``noise``: the
    standard deviation of independent Gaussian errors added to each move's value every round."""
    uniform, x, out = dict.fromkeys(INFOSETS, 0.5), dict(WARM_BASE), []
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        y = mixture_strategy([uniform, x], [anchor, 1 - anchor]) if anchor else x
        q = {k: tuple(v + noise * rng.standard_normal(2)) if noise else v for k, v in kuhn_values(x, y).items()}
        x = {k: min(1 - 1e-9, max(1e-9, (1 - step) * x[k] + step * target(*q[k], tau, soft))) for k in INFOSETS}
        out.append(exploitability(x, backend="python"))
    return out


def matrix_share(payoff: np.ndarray, anchor: float, tau: float, step: float, rounds: int, soft: bool = True,
                 noise: float = 0.0, seed: int = 0) -> float:
    """A matrix game's exploitability as a share of its payoff range after ``rounds`` from uniform play
    (``noise``: as ``kuhn_curve``'s, in units of the payoff range)."""
    m, n = payoff.shape
    x, y = np.full(m, 1 / m), np.full(n, 1 / n)
    rng, scale = np.random.default_rng(seed), noise * np.ptp(payoff)

    def aim(q):
        if soft:
            e = np.exp((q - q.max()) / tau)
            return e / e.sum()
        return np.eye(len(q))[int(np.argmax(q))]

    for _ in range(rounds):
        ya, xa = anchor / n + (1 - anchor) * y, anchor / m + (1 - anchor) * x
        qx, qy = payoff @ ya + scale * rng.standard_normal(m), -(xa @ payoff) + scale * rng.standard_normal(n)
        x, y = (1 - step) * x + step * aim(qx), (1 - step) * y + step * aim(qy)
    return float(((payoff @ y).max() - (x @ payoff).min()) / 2 / np.ptp(payoff))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anchor", type=float, nargs="+", default=[0.0, 0.5], help="shares of games against uniform random")
    p.add_argument("--step", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    p.add_argument("--tau", type=float, default=0.15, help="the targets' temperature (the mirror configuration's)")
    p.add_argument("--targets", choices=["soft", "hard", "both"], default="both")
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--games", type=int, default=20, help="random matrix games 0 .. N-1")
    p.add_argument("--q-noise", type=float, default=0.0, help="Gaussian errors on every move value each round, as "
                   "a value table of sampled returns has them (Kuhn: chips; matrix games: share of the payoff range)")
    p.add_argument("--noise-seeds", type=int, default=1, help="with --q-noise: runs with noise seeds 0 .. N-1")
    args = p.parse_args(argv)
    if any(not 0 <= v <= 1 for v in args.anchor):
        p.error("--anchor takes shares of games in [0, 1]")
    if any(not 0 < v <= 1 for v in args.step):
        p.error("--step takes shares of the way in (0, 1]")
    if args.q_noise < 0 or args.noise_seeds < 1:
        p.error("--q-noise takes a standard deviation >= 0 and --noise-seeds a count >= 1")
    if args.noise_seeds > 1 and not args.q_noise:
        p.error("--noise-seeds repeats runs with value noise: add --q-noise SIGMA")
    kinds = {"soft": [True], "hard": [False], "both": [True, False]}[args.targets]
    games = [random_game(g) for g in range(args.games)]
    for anchor in args.anchor:
        for step in args.step:
            for soft in kinds:
                seeds = range(args.noise_seeds if args.q_noise else 1)
                curves = [kuhn_curve(anchor, args.tau, step, args.rounds, soft, args.q_noise, sd) for sd in seeds]
                tails = [c[-max(1, args.rounds // 4):] for c in curves]
                shares = [statistics.mean(matrix_share(np.asarray(g.payoff, dtype=float), anchor, args.tau, step,
                                                       args.rounds, soft, args.q_noise, sd) for sd in seeds)
                          for g in games]
                # with noise: each figure is the mean over the seeds, each range the widest
                print(json.dumps({"anchor": anchor, "step": step, "targets": "soft" if soft else "hard",
                                  "tau": args.tau, "rounds": args.rounds, "q_noise": args.q_noise,
                                  "kuhn": {**{f"after_{r}": round(statistics.mean(c[r - 1] for c in curves), 4)
                                              for r in SHOWN if r <= args.rounds},
                                           "last": round(statistics.mean(c[-1] for c in curves), 4),
                                           "last_quarter": [round(min(map(min, tails)), 4),
                                                            round(max(map(max, tails)), 4)]},
                                  "matrix": {"median": round(statistics.median(shares), 4),
                                             "worst": round(max(shares), 4)}}), flush=True)


if __name__ == "__main__":
    main()
