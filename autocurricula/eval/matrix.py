"""Matrix games (``autocurricula.games.matrix``) scored as they are played: a *policy* is, per seat,
the probability of each legal word and of an invalid reply, read exactly from the next-token
distribution (one-token replies). Nothing is renormalised: an invalid reply forfeits, as in play.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from autocurricula.eval.meta import zero_sum_nash

__all__ = ["exploitability_as_played", "extended_payoff", "figures", "read_policy", "seat_distributions"]


def read_policy(engine, player: str | None, game, *, temperature: float = 1.0) -> list[np.ndarray]:
    """``[rows, columns]``: per seat, ``len(words) + 1`` probabilities (each legal word, then
    invalid) of ``player``'s reply (None = the base model) at ``temperature``, top-p 1."""
    if game.max_tokens != 1:
        raise ValueError("read_policy is exact for one-token replies only: build the game with max_tokens=1")
    tok = engine.tokenizer
    words = set(game.words[0]) | set(game.words[1])
    spelled: dict[str, list[int]] = {w: [] for w in words}  # the tokens that decode to each word
    for t in range(len(tok)):
        text = tok.decode([t]).strip()
        if text in spelled:
            spelled[text].append(t)
    out = []
    for seat in (0, 1):
        ids = engine.encode(game.prompt(seat))
        logits = np.asarray(engine.logits(ids, player), dtype=np.float64)[-1] / float(temperature)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        probs = np.zeros(len(game.words[seat]) + 1)
        for i, word in enumerate(game.words[seat]):
            probs[i] = p[[t for t in spelled[word] if t < len(p)]].sum()
        probs[-1] = max(0.0, 1.0 - probs[:-1].sum())
        out.append(probs)
    return out


def seat_distributions(policies: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list[np.ndarray]:
    """The mixture's action distribution per seat (words then invalid), a player drawn by ``weights``."""
    w = np.asarray(weights, dtype=np.float64)
    if len(w) != len(policies) or not len(w) or w.min() < 0 or w.sum() <= 0:
        raise ValueError("give one non-negative weight per policy, not all zero")
    w = w / w.sum()
    return [sum(wk * np.asarray(pol[seat], dtype=np.float64) for wk, pol in zip(w, policies)) for seat in (0, 1)]


def extended_payoff(game) -> np.ndarray:
    """The payoff to rows with a forfeit row and column appended (the game's invalid outcomes)."""
    m, n = game.shape
    a = np.zeros((m + 1, n + 1))
    for i in range(m + 1):
        for j in range(n + 1):
            a[i, j] = game.rewards(i if i < m else None, j if j < n else None)[0]
    return a


def exploitability_as_played(game, policies: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> float:
    """Half the NashConv of the mixture, invalid replies included: the mean over the two seats of
    what an exact (legal) best response gains over the game's value."""
    x, y = seat_distributions(policies, weights)
    a, (m, n) = extended_payoff(game), game.shape
    value = zero_sum_nash(np.asarray(game.payoff))[2]
    best_row = (a[:m] @ y).max()  # a best response plays a legal word
    best_col = (x @ a[:, :n]).min()
    return float(((best_row - value) + (value - best_col)) / 2)


def figures(game, policies: Mapping[str, Sequence[np.ndarray]], weights: Mapping[str, float]) -> dict:
    """``exploitability`` (payoff units), ``exploitability_share`` (of the payoff range),
    ``invalid_rate`` (the mixture's, mean over seats) and ``value`` (the game's, rows' side)."""
    ids = [pid for pid, w in weights.items() if w > 0]
    pols = [policies[pid] for pid in ids]
    w = [weights[pid] for pid in ids]
    expl = exploitability_as_played(game, pols, w)
    x, y = seat_distributions(pols, w)
    flat = np.asarray(game.payoff)
    return {"exploitability": expl, "exploitability_share": expl / float(np.ptp(flat)),
            "invalid_rate": float((x[-1] + y[-1]) / 2), "value": float(zero_sum_nash(flat)[2])}
