"""Which meta-solver a PSRO league should use, measured: simulated PSRO on random zero-sum matrix
games with an exact best-response oracle and *sampled* payoff entries.

    python research/meta_solvers.py              # 30 games, 2-5 actions, 12 iterations
    python research/meta_solvers.py --games 60 --noise 0.2

Each population member is one policy for both seats (a row and a column mixture), as a model
player is. The oracle returns the exact best responses to the current meta-strategy's seat
marginals, softened by ``--noise`` (a learner never reaches a pure best response). The restricted
game's entries are estimated from ``--games-per-entry`` sampled games each, as a league measures
them. For every solver the script prints the deployed mixture's exploitability in the full game
(share of the payoff range) after the last iteration, and how often and by how much it rose from
one iteration to the next (a solver whose figure grows as players join is a poor anytime choice).
"""

from __future__ import annotations

import argparse

import numpy as np

from autocurricula.eval.meta import exploitability, regret_matching, robust_mixture, zero_sum_nash


def random_game(rng, m: int, n: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=(m, n))


def relative_samples(rng, a, xi, yi, xj, yj, games: int) -> np.ndarray:
    """Sampled relative rewards of member i against j: a random seat, actions drawn, d = i's reward."""
    m, n = a.shape
    out = np.empty(games)
    for g in range(games):
        if rng.random() < 0.5:  # i is the row player
            out[g] = a[rng.choice(m, p=xi), rng.choice(n, p=yj)]
        else:
            out[g] = -a[rng.choice(m, p=xj), rng.choice(n, p=yi)]
    return out


def solve(name: str, mean: np.ndarray, se: np.ndarray, state: dict) -> np.ndarray:
    if name == "nash":
        return zero_sum_nash(mean)[0]
    if name.startswith("lcb"):
        return robust_mixture(mean, se, z=float(name[3:]))
    if name == "regret":
        return regret_matching(mean, 1000)[0]
    raise ValueError(name)


def run(a, solver: str, rng, iterations: int, games_per_entry: int, noise: float):
    m, n = a.shape
    soft = lambda k, size: (1 - noise) * np.eye(size)[k] + noise / size  # noqa: E731
    members = [(np.full(m, 1 / m), np.full(n, 1 / n))]  # the base policy: uniform
    samples: dict = {}
    curve = []
    for _ in range(iterations):
        k = len(members)
        mean, se = np.zeros((k, k)), np.zeros((k, k))
        for i in range(k):
            for j in range(i + 1, k):
                if (i, j) not in samples:
                    samples[i, j] = relative_samples(rng, a, *members[i], *members[j], games_per_entry)
                s = samples[i, j]
                mean[i, j], mean[j, i] = s.mean(), -s.mean()
                se[i, j] = se[j, i] = s.std(ddof=1) / np.sqrt(len(s))
        sigma = solve(solver, mean, se, {})
        x = sum(w * mx for w, (mx, _) in zip(sigma, members))
        y = sum(w * my for w, (_, my) in zip(sigma, members))
        curve.append(exploitability(a, x, y) / np.ptp(a))
        members.append((soft(int(np.argmax(a @ y)), m), soft(int(np.argmin(x @ a)), n)))
    return np.array(curve)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", type=int, default=30)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--games-per-entry", type=int, default=64)
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--solvers", default="nash,regret,lcb1,lcb2")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    solvers = args.solvers.split(",")
    print(f"{'solver':8} {'median final':>12} {'worst final':>11} {'rises/game':>10} {'mean rise':>9}")
    for solver in solvers:
        rng = np.random.default_rng(args.seed)
        finals, rises, sizes = [], [], []
        for g in range(args.games):
            a = random_game(np.random.default_rng(1000 + g), 2 + g % 4, 2 + (g // 4) % 4)
            curve = run(a, solver, rng, args.iterations, args.games_per_entry, args.noise)
            finals.append(curve[-1])
            up = np.diff(curve)[np.diff(curve) > 1e-9]
            rises.append(len(up))
            sizes.extend(up.tolist())
        print(f"{solver:8} {np.median(finals):12.4f} {np.max(finals):11.4f} {np.mean(rises):10.2f} "
              f"{(np.mean(sizes) if sizes else 0):9.4f}")


if __name__ == "__main__":
    main()
