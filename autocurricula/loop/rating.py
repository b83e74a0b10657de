"""Ratings for league players: online Elo, a decayed payoff matrix, batch Bradley–Terry.

Pure Python + numpy; nothing here imports MLX.

* ``Elo`` — online Elo (Elo 1978, *The Rating of Chessplayers*). Two players: the score is 1 for
  the higher reward, 0 for the lower and 0.5 for a tie. **N players**: every ordered pair (i, j)
  is a virtual two-player game scored from their rewards, and

      delta_i = K / (N - 1) * sum_{j != i} (S_ij - E_ij),   E_ij = 1 / (1 + 10 ** ((r_j - r_i) / scale))

  with all E_ij from the pre-match ratings. As S_ij + S_ji = E_ij + E_ji = 1 the total rating is
  conserved, and for N = 2 this is exactly standard Elo. (This is the pairwise "multiplayer Elo"
  decomposition; unlike TrueSkill (Herbrich et al. 2006) it keeps no uncertainty.)
* ``Payoff`` — the decayed payoff matrix of AlphaStar (Vinyals et al. 2019, *Grandmaster level in
  StarCraft II*, pseudocode ``Payoff``): on each result of the pair (a, b) its counts are multiplied
  by ``decay`` and then incremented, and likewise for (b, a); win rate = (wins + draws / 2) / games,
  0.5 when there are no games. It is what prioritized fictitious self-play samples from.
* ``RelativePayoff`` — the meta-game's entries: each pair's mean *relative* reward per game,
  ``(r_a - r_b) / 2`` (a's reward in a zero-sum game), with the count and spread that give its
  standard error. It sees payoff sizes, which win rates cannot; ``meta_weights`` solves it for the
  league's mixture, taking each entry at its lower confidence bound.
* ``bradley_terry`` — batch maximum likelihood for the Bradley–Terry model (Bradley & Terry 1952;
  Hunter 2004, *MM algorithms for generalized Bradley–Terry models*), as the LMSYS Chatbot Arena
  leaderboard does (Chiang et al. 2024), by Newton's method, with fractional scores (a draw is half
  a win and half a loss) and a tiny ridge (Gaussian prior on log-strengths) that keeps undefeated
  players finite and centres every connected component of the comparison graph. Ratings are on
  the Elo scale, ``initial + scale * log_base(strength)``, with their **mean** at ``initial``.
  ``bradley_terry_bootstrap`` gives percentile intervals from resampling the records.
* ``alpha_rank`` — α-Rank (Omidshafiei et al. 2019) through OpenSpiel, only when it is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from autocurricula.eval.meta import nash_mixture, robust_mixture

__all__ = [
    "Elo",
    "Payoff",
    "RelativePayoff",
    "alpha_rank",
    "bradley_terry",
    "bradley_terry_bootstrap",
    "format_leaderboard",
    "leaderboard_rows",
    "meta_weights",
    "nash_weights",
    "outcome",
]


def outcome(reward_a: float, reward_b: float) -> float:
    """Score of a against b from their rewards: 1 higher, 0 lower, 0.5 tie."""
    return 1.0 if reward_a > reward_b else 0.0 if reward_a < reward_b else 0.5


@dataclass
class Elo:
    """Online Elo for matches of any number of players (see the module docstring for the rule).

    ``history[player]`` is a compact list of ``(step, rating)`` points, appended only when the
    player's rating changes (or it is first seen) and thinned to at most ``max_history`` points.
    """
    k: float = 20.0
    scale: float = 400.0
    initial: float = 1000.0
    ratings: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    games: dict[str, int] = field(default_factory=dict)
    updates: int = 0
    max_history: int = 4096

    def rating(self, player_id: str) -> float:
        return self.ratings.get(player_id, self.initial)

    def expected(self, a: str, b: str) -> float:
        """Expected score of a against b."""
        return 1.0 / (1.0 + 10.0 ** ((self.rating(b) - self.rating(a)) / self.scale))

    def update(self, players: list[str], rewards: list[float], step: int | None = None) -> dict[str, float]:
        """Rate one match; returns each (distinct) player's rating change."""
        if len(players) != len(rewards):
            raise ValueError(f"{len(players)} players but {len(rewards)} rewards")
        n = len(players)
        deltas = {p: 0.0 for p in players}
        for i in range(n):
            for j in range(n):
                if i != j:
                    s = outcome(rewards[i], rewards[j])
                    deltas[players[i]] += self.k / (n - 1) * (s - self.expected(players[i], players[j]))
        step = self.updates if step is None else int(step)
        for p, d in deltas.items():
            self.ratings[p] = self.rating(p) + d
            self.games[p] = self.games.get(p, 0) + 1
            h = self.history.setdefault(p, [])
            if not h or h[-1][1] != self.ratings[p]:
                h.append((step, self.ratings[p]))
                if len(h) > self.max_history:  # thin the older points, keep the latest exactly
                    self.history[p] = h[:-1:2] + [h[-1]]
        self.updates += 1
        return deltas

    def state_dict(self) -> dict:
        return {"k": self.k, "scale": self.scale, "initial": self.initial, "ratings": dict(self.ratings),
                "history": {p: [list(x) for x in h] for p, h in self.history.items()},
                "games": dict(self.games), "updates": self.updates, "max_history": self.max_history}

    def load_state_dict(self, state: dict) -> Elo:
        for key in ("k", "scale", "initial", "updates", "max_history"):
            if key in state:
                setattr(self, key, state[key])
        self.ratings = {p: float(r) for p, r in state.get("ratings", {}).items()}
        self.history = {p: [(int(s), float(r)) for s, r in h] for p, h in state.get("history", {}).items()}
        self.games = {p: int(g) for p, g in state.get("games", {}).items()}
        return self

    @classmethod
    def from_state_dict(cls, state: dict) -> Elo:
        return cls().load_state_dict(state)


_RESULTS = {"win": 1.0, "draw": 0.5, "loss": 0.0}


class Payoff:
    """Decayed win/draw/loss counts per ordered pair (AlphaStar's payoff matrix)."""
    def __init__(self, decay: float = 0.99):
        self.decay = float(decay)
        self._stats: dict[str, dict[str, list[float]]] = {}  # a -> b -> [wins, draws, losses, games]

    def _get(self, a: str, b: str) -> list[float]:
        return self._stats.get(a, {}).get(b, [0.0, 0.0, 0.0, 0.0])

    def update(self, a: str, b: str, result: str | float) -> None:
        """Record one game of a against b; ``result`` is "win"/"draw"/"loss" or 1/0.5/0, from a's side."""
        s = _RESULTS[result] if isinstance(result, str) else float(result)
        if s not in (0.0, 0.5, 1.0):
            raise ValueError(f"result must be win/draw/loss or 1/0.5/0, got {result!r}")
        pairs = {(a, b): [s], (b, a): [1.0 - s]} if a != b else {(a, a): [s, 1.0 - s]}  # decayed once
        for (x, y), scores in pairs.items():
            st = [c * self.decay for c in self._get(x, y)]
            for sx in scores:
                st[0 if sx == 1 else 1 if sx == 0.5 else 2] += 1.0
                st[3] += 1.0
            self._stats.setdefault(x, {})[y] = st

    def update_match(self, players: list[str], rewards: list[float]) -> None:
        """Record every unordered pair of an N-player match, scored from the rewards."""
        for i in range(len(players)):
            for j in range(i + 1, len(players)):
                self.update(players[i], players[j], outcome(rewards[i], rewards[j]))

    def games(self, a: str, b: str) -> float:
        return self._get(a, b)[3]

    def win_rate(self, a: str, b: str) -> float:
        w, d, _, g = self._get(a, b)
        return (w + 0.5 * d) / g if g > 0 else 0.5

    def win_rates(self, a: str, opponents: list[str]) -> list[float]:
        return [self.win_rate(a, b) for b in opponents]

    def matrix(self, players: list[str] | None = None) -> list[list[float]]:
        players = self.players if players is None else players
        return [self.win_rates(a, players) for a in players]

    @property
    def players(self) -> list[str]:
        return sorted(set(self._stats) | {b for row in self._stats.values() for b in row})

    def state_dict(self) -> dict:
        stats = {a: {b: list(s) for b, s in row.items()} for a, row in self._stats.items()}
        return {"decay": self.decay, "stats": stats}

    def load_state_dict(self, state: dict) -> Payoff:
        self.decay = float(state.get("decay", self.decay))
        stats = state.get("stats", {})
        self._stats = {a: {b: [float(c) for c in s] for b, s in row.items()} for a, row in stats.items()}
        return self


class RelativePayoff:
    """Per unordered pair of players: the weighted count, sum and sum of squares of
    ``d = (r_a - r_b) / 2`` from the first player's side (antisymmetric by construction). A pair
    with a learner in it is decayed by ``decay`` on each of its games, as :class:`Payoff` is (the
    learner's policy moves); a pair of frozen players keeps every game, so its error keeps falling."""
    def __init__(self, decay: float = 0.99):
        self.decay = float(decay)
        self._stats: dict[str, list[float]] = {}  # "a\tb" (a < b) -> [weight, sum, sum of squares, sum of weight^2]
        self.low = self.high = None  # the range of d seen: what an unplayed pair can be at worst

    @staticmethod
    def _key(a: str, b: str) -> tuple[str, float]:
        return (f"{a}\t{b}", 1.0) if a < b else (f"{b}\t{a}", -1.0)

    def update(self, a: str, b: str, d: float, *, decay: bool = True) -> None:
        """One game of a against b whose relative reward to a was ``d``."""
        if a == b:
            return
        key, sign = self._key(a, b)
        w, s, q, w2 = self._stats.get(key, [0.0, 0.0, 0.0, 0.0])
        f = self.decay if decay else 1.0
        self._stats[key] = [f * w + 1.0, f * s + sign * d, f * q + d * d, f * f * w2 + 1.0]
        self.low = min(self.low, -abs(d)) if self.low is not None else -abs(d)
        self.high = -self.low

    def update_match(self, players: list[str], rewards: list[float], frozen: set[str] | frozenset = frozenset()) -> None:
        """Every unordered pair of an N-player game; pairs of two ``frozen`` players are not decayed."""
        for i in range(len(players)):
            for j in range(i + 1, len(players)):
                self.update(players[i], players[j], (float(rewards[i]) - float(rewards[j])) / 2,
                            decay=not (players[i] in frozen and players[j] in frozen))

    def update_games(self, games, frozen: set[str] | frozenset = frozenset()) -> None:
        """A round's ``(players, rewards, deal)`` games. The two-player games of one deal between the
        same two players are one sample, the mean of their relative rewards: a duplicate pair's
        luck (the cards, the seats) cancels in it, and its error is the pairs' spread. Every other
        game is a sample of its own (:meth:`update_match`)."""
        deals: dict[tuple, list[float]] = {}
        for ids, rewards, deal in games:
            if deal is None or len(ids) != 2 or ids[0] == ids[1]:
                self.update_match(ids, rewards, frozen)
                continue
            a, b = sorted(ids)
            d = (float(rewards[ids.index(a)]) - float(rewards[ids.index(b)])) / 2
            deals.setdefault((deal, a, b), []).append(d)
        for (_, a, b), ds in deals.items():
            self.update(a, b, sum(ds) / len(ds), decay=not (a in frozen and b in frozen))

    def stats(self, a: str, b: str) -> tuple[float, float, float]:
        """``(mean, standard error, effective games)`` of a against b; ``(nan, nan, 0)`` unplayed.
        The error shrinks the sample variance toward the widest one the range allows by one pseudo-game,
        so two equal results do not claim certainty."""
        if a == b:
            return 0.0, 0.0, math.inf
        key, sign = self._key(a, b)
        w, s, q, w2 = self._stats.get(key, [0.0, 0.0, 0.0, 0.0])
        if w <= 0:
            return math.nan, math.nan, 0.0
        mean = s / w
        n = w * w / w2
        prior = (self.high or 0.0) ** 2
        var = (max(q / w - mean * mean, 0.0) * n + prior) / (n + 1)
        return sign * mean, math.sqrt(var / n), n

    def matrices(self, ids: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(mean, stderr, games)`` matrices over ``ids`` (NaN where a pair never played)."""
        out = np.array([[self.stats(a, b) for b in ids] for a in ids], dtype=np.float64).reshape(len(ids), len(ids), 3)
        return out[..., 0], out[..., 1], out[..., 2]

    def state_dict(self) -> dict:
        return {"decay": self.decay, "stats": {k: list(v) for k, v in self._stats.items()}, "low": self.low}

    def load_state_dict(self, state: dict) -> RelativePayoff:
        self.decay = float(state.get("decay", self.decay))
        self._stats = {k: [float(c) for c in v] for k, v in state.get("stats", {}).items()}
        self.low = state.get("low")
        self.high = None if self.low is None else -self.low
        return self


def meta_weights(relative: RelativePayoff, ids: list[str], z: float = 1.0) -> dict[str, float]:
    """Each player's weight in the league's meta-strategy over ``ids``: the mixture that is surest
    to hold its own in the symmetric zero-sum meta-game of relative payoffs, each entry at
    ``mean - z * stderr`` and an unplayed one at the worst relative reward seen
    (``autocurricula.eval.meta.robust_mixture``). A player with no game against the others gets 0
    (nothing is known of it); uniform before any game."""
    ids = list(ids)
    if not ids:
        return {}
    mean, se, games = relative.matrices(ids)
    np.fill_diagonal(games, 0.0)
    played = [i for i, pid in enumerate(ids) if games[i].sum() > 0]
    if not played:
        return dict.fromkeys(ids, 1.0 / len(ids))
    sub = np.ix_(played, played)
    floor = relative.low if relative.low is not None else 0.0
    x = robust_mixture(mean[sub], se[sub], z=z, floor=floor)
    out = dict.fromkeys(ids, 0.0)
    out.update({ids[i]: float(w) for i, w in zip(played, x)})
    return out


def _fit_bt(ia, ib, s, w, n, ridge, max_iter, tol):
    """Maximise sum w*(s*log σ(θa-θb) + (1-s)*log σ(θb-θa)) - ridge/2 |θ|² by damped Newton."""
    N = np.zeros((n, n))  # games between i and j (symmetric)
    W = np.zeros((n, n))  # score of i against j
    np.add.at(N, (ia, ib), w)
    np.add.at(N, (ib, ia), w)
    np.add.at(W, (ia, ib), w * s)
    np.add.at(W, (ib, ia), w * (1.0 - s))

    def objective(t):
        d = t[:, None] - t[None, :]
        return float(np.sum(W * -np.logaddexp(0.0, -d)) - 0.5 * ridge * t @ t)

    theta = np.zeros(n)
    f = objective(theta)
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
        grad = W.sum(1) - (N * p).sum(1) - ridge * theta
        c = N * p * (1.0 - p)
        hess = np.diag(c.sum(1) + ridge) - c  # negative Hessian, positive definite
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-8:  # backtrack until the objective does not decrease
            f_new = objective(theta + t * step)
            if f_new >= f - 1e-12 * abs(f):
                break
            t *= 0.5
        theta, f = theta + t * step, f_new
        if np.max(np.abs(t * step)) < tol:
            break
    return theta


def _records(records):
    players = sorted({r[0] for r in records} | {r[1] for r in records})
    index = {p: i for i, p in enumerate(players)}
    keep = [r for r in records if r[0] != r[1]]  # self-play carries no information
    ia = np.array([index[r[0]] for r in keep], dtype=np.int64)
    ib = np.array([index[r[1]] for r in keep], dtype=np.int64)
    s = np.array([float(r[2]) for r in keep], dtype=np.float64)
    if s.size and (s.min() < 0 or s.max() > 1):
        raise ValueError("scores must lie in [0, 1]")
    return players, ia, ib, s


def _to_elo(theta, mask, scale, base, initial):
    r = theta * scale / math.log(base)
    return initial + r - r[mask].mean()


def bradley_terry(records, *, scale: float = 400.0, base: float = 10.0, initial: float = 1000.0,
                  ridge: float = 1e-3, max_iter: int = 100, tol: float = 1e-10) -> dict[str, float]:
    """Bradley–Terry ratings from ``(player_a, player_b, score_a)`` records (score in [0, 1]).

    Elo-scale, mean ``initial``; ``ridge`` is the Gaussian prior precision on natural-log strengths.
    """
    if ridge <= 0:
        raise ValueError("ridge must be > 0 (ratings are only defined up to a shift without it)")
    players, ia, ib, s = _records(list(records))
    if not players:
        return {}
    theta = _fit_bt(ia, ib, s, np.ones_like(s), len(players), ridge, max_iter, tol)
    r = _to_elo(theta, np.ones(len(players), bool), scale, base, initial)
    return dict(zip(players, r.tolist()))


def bradley_terry_bootstrap(records, rounds: int = 100, seed: int = 0, ci: float = 0.95, *,
                            scale: float = 400.0, base: float = 10.0, initial: float = 1000.0,
                            ridge: float = 1e-3, max_iter: int = 100,
                            tol: float = 1e-8) -> dict[str, tuple[float, float, float]]:
    """``{player: (rating, low, high)}``: the full-data fit and a percentile ``ci`` interval over
    ``rounds`` refits on records resampled with replacement (deterministic for a seed). Each round
    is anchored to mean ``initial`` over the players it contains; rounds that miss a player do not
    count for it. The interval is widened to contain the point estimate should it fall outside."""
    records = list(records)
    point = bradley_terry(records, scale=scale, base=base, initial=initial, ridge=ridge, max_iter=max_iter)
    if not point:
        return {}
    players, ia, ib, s = _records(records)
    n, m = len(players), len(s)
    rng = np.random.default_rng(seed)
    samples = np.full((rounds, n), np.nan)
    for k in range(rounds):
        w = np.bincount(rng.integers(0, m, m), minlength=m).astype(np.float64) if m else np.zeros(0)
        present = np.zeros(n, bool)
        present[ia[w > 0]] = present[ib[w > 0]] = True
        if not present.any():
            continue
        theta = _fit_bt(ia, ib, s, w, n, ridge, max_iter, tol)
        samples[k, present] = _to_elo(theta, present, scale, base, initial)[present]
    out = {}
    q = (1.0 - ci) / 2.0
    for i, p in enumerate(players):
        col = samples[:, i][~np.isnan(samples[:, i])]
        lo, hi = (np.quantile(col, [q, 1.0 - q]).tolist() if col.size else (point[p], point[p]))
        out[p] = (point[p], min(lo, point[p]), max(hi, point[p]))
    return out


def alpha_rank(payoff_matrix, players: list[str] | None = None, *, alpha: float = 100.0,
               population_size: int = 50):
    """α-Rank stationary distribution of a symmetric (single-population) meta-game via OpenSpiel.

    ``payoff_matrix[i][j]`` is i's payoff against j (e.g. ``Payoff.matrix(players)``). Returns a
    list of masses, or ``{player: mass}`` when ``players`` is given. Needs ``pip install open_spiel``.
    """
    try:
        from open_spiel.python.egt import alpharank  # open_spiel: optional (extra eval)
    except ImportError as e:
        raise ImportError("alpha_rank needs OpenSpiel; install it with `pip install open_spiel`") from e
    m = np.asarray(payoff_matrix, dtype=np.float64)
    pi = alpharank.compute([m], m=population_size, alpha=alpha)[2]
    pi = [float(x) for x in np.asarray(pi).ravel()]
    return dict(zip(players, pi)) if players is not None else pi


COLUMNS = ["rank", "id", "role", "epoch", "frozen", "elo", "bt", "bt_low", "bt_high", "games"]
DEPLOY_COLUMN = "deploy"  # weight in the Nash mixture over the players that have an adapter
META_COLUMN = "nash"  # weight in the league's meta-strategy over its meta-game's players, scripted ones included
UNRATED = "unrated"  # the Elo cell of a player without a game: its rating is the initial one, not a measurement
MIXTURE_NOTE = (f"{DEPLOY_COLUMN}: the meta-strategy over the players with an adapter (the mixture to deploy, "
                f"trainer.deployable_mixture()); {META_COLUMN}: over the meta-game's players "
                "(trainer.meta_population()), scripted ones included; both solve "
                "the relative payoffs with each entry at its lower confidence bound")


def nash_weights(payoff: Payoff, ids: list[str]) -> dict[str, float]:
    """The league's meta-strategy: each player's weight in the symmetric Nash mixture over the
    payoff matrix of ``ids`` (``autocurricula.eval.meta.nash_mixture``; uniform before any game)."""
    return nash_mixture(payoff.matrix(list(ids)), list(ids)) if ids else {}


def leaderboard_rows(players: list[dict], elo: Elo, bt: dict | None = None,
                     games: dict[str, int] | None = None, nash: dict[str, float] | None = None,
                     deploy: dict[str, float] | None = None) -> list[dict]:
    """One row per player: players with games best Elo first, then those without (unrated). ``bt``
    maps id -> rating or (rating, low, high). ``deploy`` and ``nash`` map id -> weight in a Nash
    mixture (``nash_weights``): ``deploy`` over the players with an adapter (the mixture to deploy),
    ``nash`` over every player; each is a column when given (``deploy`` is 0 for scripted players)."""
    games = elo.games if games is None else games
    rows = []
    for p in players:
        pid = p["id"]
        b = (bt or {}).get(pid)
        b, lo, hi = (tuple(b) if isinstance(b, (tuple, list)) else (b, None, None))
        rows.append({"id": pid, "role": p.get("role"), "epoch": p.get("epoch"), "frozen": p.get("frozen"),
                     "elo": elo.rating(pid), "bt": b, "bt_low": lo, "bt_high": hi, "games": games.get(pid, 0)})
        if deploy is not None:
            rows[-1][DEPLOY_COLUMN] = float(deploy.get(pid, 0.0))
        if nash is not None:
            rows[-1][META_COLUMN] = float(nash.get(pid, 0.0))
    rows.sort(key=lambda r: (not r["games"], -r["elo"], str(r["id"])))
    return [{"rank": i + 1, **r} for i, r in enumerate(rows)]


def _cell(v, column: str = "", row: dict | None = None) -> str:
    if column == "elo" and row is not None and not row.get("games"):
        return UNRATED
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.3f}" if column in (META_COLUMN, DEPLOY_COLUMN) else f"{v:.1f}"  # a weight needs its decimals
    return str(v)


def format_leaderboard(rows: list[dict], columns: list[str] | None = None) -> str:
    """Aligned plain-text table: numbers right-aligned, text left-aligned, missing values "-", the
    Elo of a player without games "unrated". By default the ``COLUMNS``, plus the mixture weights
    (``"deploy"``, ``"nash"``) that the rows carry, explained below the table when both are there."""
    if columns is None:
        columns = COLUMNS + [c for c in (DEPLOY_COLUMN, META_COLUMN) if any(c in r for r in rows)]
    cells = [[_cell(r.get(c), c, r) for c in columns] for r in rows]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) or r.get(c) is None
                   for r in rows) for c in columns]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()

    note = [MIXTURE_NOTE] if DEPLOY_COLUMN in columns and META_COLUMN in columns else []
    return "\n".join([line(columns)] + [line(row) for row in cells] + note)
