"""Meta-strategy of a league: a Nash equilibrium of the meta-game ``M[i][j]`` (what player i gets
against j), as in PSRO (Lanctot et al. 2017) and AlphaStar's Nash-averaged league (Vinyals et al.
2019). Pure numpy: the LP is a small dense simplex, so no SciPy is needed. α-Rank (Omidshafiei et
al. 2019) is ``autocurricula.loop.rating.alpha_rank``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

__all__ = ["exploitability", "nash_mixture", "regret_matching", "replicator_dynamics", "robust_mixture",
           "row_mixture", "simplex_max", "zero_sum_nash"]

_EPS = 1e-12
_PIVOT_TOL = 1e-9  # a pivot smaller than this, relative to its column's largest entry, counts as zero
_OPT_TOL = 1e-12  # a reduced cost below -_OPT_TOL still improves the objective
_HARRIS = 1e-11  # how far the ratio test may let a basic variable go below zero to get a larger pivot
_PROGRESS = 1e-12  # a pivot must raise the objective by this share to count as progress
_BLAND_AFTER = 2  # Bland's rule after this many times (rows + columns) pivots without progress
_REINVERT = 50  # pivots between recomputing the tableau from the matrix
_FALLBACK_ITERATIONS = 20_000  # regret matching's, where the LP fails on a league's meta-game
_GAP_TOL = 1e-7  # the largest exploitability, as a share of the payoff range, zero_sum_nash returns


def _matrix(a, name: str = "payoff matrix") -> np.ndarray:
    m = np.asarray(a, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"the {name} must be a non-empty 2-D array (rows x columns), got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"the {name} has NaN or infinite entries; fill unplayed pairs (e.g. 0.5 for a win rate)")
    return m


def _tableau(cons: np.ndarray, cost: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The simplex tableau of ``max cost.z s.t. cons z = 1, z >= 0`` at ``basis``, computed afresh from the
    original data (re-inversion: it discards the rounding that pivots accumulate)."""
    m = cons.shape[0]
    try:
        body = np.linalg.solve(cons[:, basis], np.hstack([cons, np.ones((m, 1))]))
    except np.linalg.LinAlgError as err:
        raise RuntimeError("the simplex reached a singular basis: the payoff matrix is numerically degenerate "
                           "(merge players whose rows are identical, or use regret_matching)") from err
    t = np.empty((m + 1, cons.shape[1] + 1))
    t[:m] = body
    t[m] = cost[basis] @ body - np.append(cost, 0.0)
    return t


def simplex_max(a: np.ndarray, max_iter: int | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Solve ``max 1.y s.t. a y <= 1, y >= 0`` (``a`` positive). Returns ``(y, u, objective)``, ``u``
    the dual optimum (``min 1.u s.t. a^T u >= 1, u >= 0``). Meta-games are degenerate (a settled
    player's snapshots repeat rows), so pivots are chosen for stability: Harris's ratio test,
    re-inversion every ``_REINVERT`` pivots, Bland's rule after a run without progress."""
    a = _matrix(a)
    if np.any(a <= 0):
        raise ValueError("simplex_max needs a matrix with positive entries (shift the payoffs first)")
    m, n = a.shape
    scale = a.max()
    cons = np.hstack([a / scale, np.eye(m)])  # entries at most 1, so the tolerances are relative
    cost = np.append(np.ones(n), np.zeros(m))
    basis = np.arange(n, n + m)
    max_iter = 50 * (m + n) if max_iter is None else max_iter
    t, since, stalled, best = _tableau(cons, cost, basis), 0, 0, 0.0
    for _ in range(max_iter):
        reduced = t[m, :-1]
        improving = np.flatnonzero(reduced < -_OPT_TOL)
        if improving.size == 0 and since == 0:
            break
        if improving.size == 0 or since >= _REINVERT:
            t, since = _tableau(cons, cost, basis), 0
            continue
        bland = stalled >= _BLAND_AFTER * (m + n)
        entering = improving[0] if bland else improving[np.argmin(reduced[improving])]
        t[:m, -1] = np.maximum(t[:m, -1], 0.0)  # what Harris' tolerance let dip below zero
        col, rhs = t[:m, entering], t[:m, -1]
        rows = np.flatnonzero(col > _PIVOT_TOL * max(1.0, col.max()))
        if rows.size == 0:  # y is bounded by 1 / min(a), so only rounding can leave no pivot
            raise RuntimeError("the simplex found no pivot: the payoff matrix is numerically degenerate "
                               "(merge players whose rows are identical, or use regret_matching)")
        ratios = rhs[rows] / col[rows]
        if bland:
            ties = rows[ratios <= ratios.min() * (1 + _PROGRESS)]
            leaving = ties[np.argmin(basis[ties])]
        else:
            ties = rows[ratios <= ((rhs[rows] + _HARRIS) / col[rows]).min()]
            leaving = ties[np.argmax(col[ties])]
        t[leaving] /= t[leaving, entering]
        factors = t[:, entering].copy()
        factors[leaving] = 0.0
        t -= np.outer(factors, t[leaving])
        basis[leaving] = entering
        since += 1
        stalled = 0 if t[m, -1] > best * (1 + _PROGRESS) else stalled + 1
        best = max(best, t[m, -1])
    else:
        raise RuntimeError(f"the simplex did not converge in {max_iter} iterations")
    y = np.zeros(n)
    primal = basis < n
    y[basis[primal]] = np.maximum(t[:m, -1][primal], 0.0)
    # undo the scaling: cons = a / scale, so y, u and the objective of a are those of cons over scale
    return y / scale, np.maximum(t[m, n:n + m], 0.0) / scale, float(t[m, -1] / scale)


def _normalise(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 0.0, None)
    p[p < 1e-12] = 0.0
    return p / p.sum()


def zero_sum_nash(payoff) -> tuple[np.ndarray, np.ndarray, float]:
    """``(row mixture, column mixture, value to rows)`` of the zero-sum game ``payoff`` by LP; raises
    ``RuntimeError`` unless a best response gains at most ``_GAP_TOL`` of the payoff range."""
    a = _matrix(payoff)
    low, spread = a.min(), np.ptp(a)
    if spread == 0:  # every outcome alike: every pair is an equilibrium
        return np.full(a.shape[0], 1 / a.shape[0]), np.full(a.shape[1], 1 / a.shape[1]), float(low)
    # payoffs mapped onto [1, 2]: positive, as the LP needs, and at one scale whatever the game's units
    y, u, _ = simplex_max((a - low) / spread + 1.0)
    x, y = _normalise(u), _normalise(y)
    floor, ceiling = float((x @ a).min()), float((a @ y).max())
    if not (ceiling - floor) / 2 <= _GAP_TOL * spread:  # NaN fails too
        raise RuntimeError(f"the linear program returned a pair {(ceiling - floor) / 2:.3g} from an equilibrium: "
                           "the payoff matrix is numerically degenerate (merge players whose rows are identical, "
                           "or use regret_matching)")
    return x, y, (floor + ceiling) / 2


def row_mixture(game) -> np.ndarray:
    """The row mixture of :func:`zero_sum_nash`; should the LP fail, regret matching's with a
    ``RuntimeWarning``, so that a league keeps training rather than stopping mid-run."""
    game = _matrix(game)
    try:
        return zero_sum_nash(game)[0]
    except RuntimeError as err:
        x, y = regret_matching(game, _FALLBACK_ITERATIONS)
        warnings.warn(f"{err}; the meta-strategy is regret matching's average instead, "
                      f"{exploitability(game, x, y):.3g} from an equilibrium", RuntimeWarning, stacklevel=3)
        return x


def nash_mixture(win_rates, players: Sequence[str] | None = None):
    """A symmetric Nash mixture of ``win_rates`` (i's score against j in [0, 1], as
    ``trainer.payoff.matrix(ids)``), made zero-sum as ``(P - P^T) / 2``; uniform when every pair is
    even. Returns an array of weights, or ``{player: weight}`` when ``players`` is given."""
    p = _matrix(win_rates, "win-rate matrix")
    if p.shape[0] != p.shape[1]:
        raise ValueError(f"the win-rate matrix must be square (players x players), got shape {p.shape}")
    if players is not None and len(players) != p.shape[0]:
        raise ValueError(f"{len(players)} player names for a {p.shape[0]}x{p.shape[0]} matrix; give one per row")
    game = (p - p.T) / 2
    x = np.full(len(p), 1.0 / len(p)) if not np.any(np.abs(game) > 1e-12) else row_mixture(game)
    return dict(zip(players, x.tolist())) if players is not None else x


def replicator_dynamics(a, b=None, *, steps: int = 20_000, step_size: float = 0.05,
                        x0=None, y0=None) -> tuple[np.ndarray, np.ndarray]:
    """Time-averaged discrete replicator dynamics (multiplicative weights) of a general two-player game:
    ``a`` the rows' payoffs, ``b`` the columns' (default ``-a``). Converges to Nash if zero-sum."""
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
    """Half the NashConv of ``(row, col)`` in the zero-sum game ``payoff`` (0 exactly at an equilibrium)."""
    a = _matrix(payoff)
    x, y = np.asarray(row, dtype=np.float64), np.asarray(col, dtype=np.float64)
    if x.shape != (a.shape[0],) or y.shape != (a.shape[1],):
        raise ValueError(f"mixtures of length {a.shape[0]} (rows) and {a.shape[1]} (columns) are needed, got "
                         f"{x.shape} and {y.shape}")
    return float(((a @ y).max() - (x @ a).min()) / 2)


def regret_matching(payoff, iterations: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Average row and column mixtures of regret matching+ (alternating updates, linear averaging, as in
    CFR+) on the zero-sum game ``payoff``; exploitability ``O(1/sqrt(iterations))`` at worst."""
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
    """The maximin row mixture of the lower bounds ``mean - z*stderr`` (NaN, unplayed: ``floor``, default
    the lowest bound), so a player that has barely played gets weight only when that is safe."""
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
    return row_mixture(low)
