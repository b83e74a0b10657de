"""Meta-strategy of a league: the Nash mixture over a payoff matrix of its players.

A league's players form a normal-form *meta-game*: ``M[i][j]`` is what player i gets against j.
The mixture to deploy is a Nash equilibrium of that game (PSRO, Lanctot et al. 2017; AlphaStar's
Nash-averaged league, Vinyals et al. 2019). Everything here is pure numpy:

* ``zero_sum_nash(A)``: exact equilibrium of a two-player zero-sum matrix game by linear
  programming (a small dense simplex with Bland's rule, so no SciPy is needed).
* ``nash_mixture(win_rates)``: the symmetric equilibrium of a league's win-rate matrix, as
  ``trainer.payoff.matrix(ids)`` gives it (``P[i][j]`` = i's score against j, draws half).
* ``replicator_dynamics(A, B)``: discrete-time replicator dynamics for a general (not necessarily
  zero-sum) two-player game; an approximation whose time average is returned.
* ``regret_matching(A)``: the average strategies of regret matching+ in a zero-sum game, which
  converge to an equilibrium (an anytime solver: a few iterations give a rough mixture).
* ``robust_mixture(mean, stderr)``: the row mixture that maximises its *guaranteed* payoff when
  each entry is only known to within a confidence interval: the maximin of the lower bounds.
* ``exploitability(A, x, y)``: what best responses gain against ``(x, y)``, half the NashConv.

α-Rank (Omidshafiei et al. 2019) is ``autocurricula.rating.alpha_rank`` (needs OpenSpiel).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["exploitability", "nash_mixture", "regret_matching", "replicator_dynamics", "robust_mixture",
           "simplex_max", "zero_sum_nash"]

_EPS = 1e-12


def _matrix(a, name: str = "payoff matrix") -> np.ndarray:
    m = np.asarray(a, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"the {name} must be a non-empty 2-D array (rows x columns), got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"the {name} has NaN or infinite entries; fill unplayed pairs (e.g. 0.5 for a win rate)")
    return m


def simplex_max(a: np.ndarray, max_iter: int = 10_000) -> tuple[np.ndarray, np.ndarray, float]:
    """Solve ``max 1.y s.t. a y <= 1, y >= 0`` for a matrix ``a`` with positive entries.

    Returns ``(y, u, objective)``: the primal optimum ``y``, the dual optimum ``u`` (which solves
    ``min 1.u s.t. a^T u >= 1, u >= 0``) and the common objective. The origin is feasible because
    the right-hand side is positive, so no phase 1 is needed; Bland's rule rules out cycling.
    """
    a = _matrix(a)
    if np.any(a <= 0):
        raise ValueError("simplex_max needs a matrix with positive entries (shift the payoffs first)")
    m, n = a.shape
    t = np.zeros((m + 1, n + m + 1))
    t[:m, :n], t[:m, n:n + m], t[:m, -1] = a, np.eye(m), 1.0
    t[m, :n] = -1.0
    basis = list(range(n, n + m))
    for _ in range(max_iter):
        entering = next((j for j in range(n + m) if t[m, j] < -1e-10), None)
        if entering is None:
            break
        col = t[:m, entering]
        rows = [i for i in range(m) if col[i] > 1e-10]
        if not rows:  # cannot happen with positive a: y is bounded by 1 / min(a)
            raise RuntimeError("the linear program is unbounded")
        ratio = min(t[i, -1] / col[i] for i in rows)
        leaving = min((i for i in rows if t[i, -1] / col[i] <= ratio + 1e-12), key=lambda i: basis[i])
        t[leaving] /= t[leaving, entering]
        for i in range(m + 1):
            if i != leaving and t[i, entering] != 0.0:
                t[i] -= t[i, entering] * t[leaving]
        basis[leaving] = entering
    else:
        raise RuntimeError(f"the simplex did not converge in {max_iter} pivots")
    y = np.zeros(n)
    for i, j in enumerate(basis):
        if j < n:
            y[j] = t[i, -1]
    return y, t[m, n:n + m].copy(), float(t[m, -1])


def _normalise(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 0.0, None)
    p[p < 1e-12] = 0.0
    return p / p.sum()


def zero_sum_nash(payoff) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact Nash equilibrium of the zero-sum game where the row player gets ``payoff[i][j]`` and
    the column player gets its negative. Returns ``(row mixture, column mixture, value to rows)``."""
    a = _matrix(payoff)
    shift = 1.0 - a.min()  # the LP needs positive payoffs; a shift changes no equilibrium
    y, u, total = simplex_max(a + shift)
    return _normalise(u), _normalise(y), float(1.0 / total - shift)


def nash_mixture(win_rates, players: Sequence[str] | None = None):
    """The league's meta-strategy: a symmetric Nash mixture over its players.

    ``win_rates[i][j]`` is player i's score against j in [0, 1] (``trainer.payoff.matrix(ids)``).
    The matrix is made antisymmetric, ``(P - P^T) / 2``, so that the game is symmetric and
    zero-sum; its row mixture is then an equilibrium for both seats. When every pair is even (e.g.
    no games yet) the mixture is uniform; otherwise the LP returns one equilibrium (a vertex).
    Returns an array of weights, or ``{player: weight}`` when ``players`` is given.
    """
    p = _matrix(win_rates, "win-rate matrix")
    if p.shape[0] != p.shape[1]:
        raise ValueError(f"the win-rate matrix must be square (players x players), got shape {p.shape}")
    if players is not None and len(players) != p.shape[0]:
        raise ValueError(f"{len(players)} player names for a {p.shape[0]}x{p.shape[0]} matrix; give one per row")
    game = (p - p.T) / 2
    x = np.full(len(p), 1.0 / len(p)) if not np.any(np.abs(game) > 1e-12) else zero_sum_nash(game)[0]
    return dict(zip(players, x.tolist())) if players is not None else x


def replicator_dynamics(a, b=None, *, steps: int = 20_000, step_size: float = 0.05,
                        x0=None, y0=None) -> tuple[np.ndarray, np.ndarray]:
    """Time-averaged discrete replicator dynamics of a two-player game (an approximation).

    ``a[i][j]``: the row player's payoff, ``b[i][j]``: the column player's (default ``-a``, zero-sum).
    Each step multiplies a strategy's weight by ``exp(step_size * (its payoff - the mean))``
    (multiplicative weights); the averages over all steps are returned, which converge to a Nash
    equilibrium in zero-sum games. Starts from uniform unless ``x0``/``y0`` are given.
    """
    a = _matrix(a)
    b = -a if b is None else _matrix(b, "column player's payoff matrix")
    if b.shape != a.shape:
        raise ValueError(f"the two payoff matrices must have one shape, got {a.shape} and {b.shape}")
    if steps < 1 or not step_size > 0:
        raise ValueError("steps must be >= 1 and step_size > 0")
    m, n = a.shape
    x = np.full(m, 1.0 / m) if x0 is None else _normalise(np.asarray(x0, dtype=np.float64))
    y = np.full(n, 1.0 / n) if y0 is None else _normalise(np.asarray(y0, dtype=np.float64))
    scale = max(np.abs(a).max(), np.abs(b).max(), _EPS)
    xs, ys = np.zeros(m), np.zeros(n)
    for _ in range(steps):
        xs += x
        ys += y
        fx, fy = a @ y / scale, x @ b / scale
        x = x * np.exp(step_size * (fx - x @ fx))
        y = y * np.exp(step_size * (fy - fy @ y))
        x, y = x / x.sum(), y / y.sum()
    return xs / steps, ys / steps


def exploitability(payoff, row, col) -> float:
    """Half the NashConv of ``(row, col)`` in the zero-sum game where rows get ``payoff[i][j]``:
    the mean over the two seats of what a best response gains over the game's value (0 exactly at
    an equilibrium). Divide by the payoff range for a share."""
    a = _matrix(payoff)
    x, y = np.asarray(row, dtype=np.float64), np.asarray(col, dtype=np.float64)
    if x.shape != (a.shape[0],) or y.shape != (a.shape[1],):
        raise ValueError(f"mixtures of length {a.shape[0]} (rows) and {a.shape[1]} (columns) are needed, got "
                         f"{x.shape} and {y.shape}")
    return float(((a @ y).max() - (x @ a).min()) / 2)


def regret_matching(payoff, iterations: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Regret matching+ with alternating updates and linearly weighted averages (as in CFR+) on the
    zero-sum game ``payoff``; returns the average row and column mixtures. Their exploitability
    falls as ``O(1/sqrt(iterations))`` at worst, in practice much faster."""
    a = _matrix(payoff)
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    m, n = a.shape
    rx, ry = np.zeros(m), np.zeros(n)
    sx, sy = np.zeros(m), np.zeros(n)

    def current(r):
        pos = np.clip(r, 0.0, None)
        return pos / pos.sum() if pos.sum() > 0 else np.full(len(r), 1.0 / len(r))

    for t in range(1, iterations + 1):
        x = current(rx)
        u = a @ current(ry)
        rx = np.clip(rx + u - x @ u, 0.0, None)
        x = current(rx)
        v = -(x @ a)
        y = current(ry)
        ry = np.clip(ry + v - y @ v, 0.0, None)
        sx += t * x
        sy += t * current(ry)
    return sx / sx.sum(), sy / sy.sum()


def robust_mixture(mean, stderr=None, *, z: float = 1.0, floor: float | None = None) -> np.ndarray:
    """The row mixture of a zero-sum meta-game known only by estimates: ``mean[i][j]`` (NaN where
    no game was played) with standard errors ``stderr[i][j]``. It maximises the payoff the mixture
    is sure of against any opponent when each entry is taken at its lower bound ``mean - z*stderr``
    (an unplayed entry at ``floor``, by default the lowest bound seen), so a player that has
    barely played gets weight only when that is safe. With ``z=0`` and every entry known it is the
    LP Nash mixture of ``mean``."""
    mu = np.asarray(mean, dtype=np.float64)
    if mu.ndim != 2 or mu.shape[0] == 0 or mu.shape[1] == 0:
        raise ValueError(f"the mean payoff matrix must be non-empty and 2-D, got shape {mu.shape}")
    se = np.zeros_like(mu) if stderr is None else np.asarray(stderr, dtype=np.float64)
    if se.shape != mu.shape:
        raise ValueError(f"stderr must have the mean's shape {mu.shape}, got {se.shape}")
    if not z >= 0:
        raise ValueError(f"z must be >= 0, got {z}")
    low = mu - z * np.nan_to_num(se, nan=0.0)
    known = np.isfinite(low)
    if not known.any() and floor is None:
        return np.full(mu.shape[0], 1.0 / mu.shape[0])
    low = np.where(known, low, low[known].min() if floor is None else floor)
    if floor is not None:
        low = np.maximum(low, floor)
    if np.ptp(low) < _EPS:
        return np.full(mu.shape[0], 1.0 / mu.shape[0])
    return zero_sum_nash(low)[0]
