"""What the card games' exploitability harnesses share: replies read as the game parses them, the
reach weights of a mixture of behaviour strategies (Kuhn's theorem), the backend choice, and a
per-epoch callback scoring a trainer's ``deployable_mixture()`` as played.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

__all__ = ["BACKENDS", "MixtureFigures", "check_weights", "reach_weights", "read_sets", "reply_masses",
           "resolve_backend"]

BACKENDS = ("auto", "openspiel", "python")


def reply_masses(engine, player: str | None, prompt_ids: Sequence[int], parse: Callable[[str], str | None],
                 legal: Collection[str], *, temperature: float = 1.0, max_tokens: int = 3,
                 threshold: float = 1e-4) -> tuple[dict[str, float], float, float]:
    """``({legal word: probability}, invalid, unresolved)`` of ``player``'s reply (None: the base model)
    after ``prompt_ids`` at ``temperature`` (top-p 1), from the tree of replies token by token: a
    branch ends when ``parse`` names a word (an illegal one is invalid), at an end token or at
    ``max_tokens`` (invalid). Branches below ``threshold`` are ``unresolved``."""
    tok = engine.tokenizer
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    prompt = list(prompt_ids)
    words = dict.fromkeys(legal, 0.0)
    invalid = unresolved = 0.0
    stack = [((), 1.0)]
    while stack:
        tokens, p = stack.pop()
        word = parse(tok.decode(list(tokens), skip_special_tokens=True)) if tokens else None
        if word is not None:
            if word in words:
                words[word] += p
            else:
                invalid += p
            continue
        if len(tokens) == max_tokens or (tokens and tokens[-1] in eos):
            invalid += p
            continue
        logits = np.asarray(engine.logits(prompt + list(tokens), player), dtype=np.float64)[-1] / temperature
        q = np.exp(logits - logits.max())
        q = p * q / q.sum()
        keep = np.flatnonzero(q >= threshold)
        unresolved += float(q.sum() - q[keep].sum())
        stack += [(tokens + (int(t),), float(q[t])) for t in keep]
    return words, invalid, unresolved


def read_sets(engine, player: str | None, sets: Mapping[str, tuple[str, Collection[str]]],
              parse: Callable[[str], str | None], **sampling) -> tuple[dict[str, tuple[dict, float]], float]:
    """:func:`reply_masses` at each of ``sets`` (``{key: (prompt, legal words)}``): ``{key: (words,
    invalid + unread)}`` and the largest unread mass."""
    out, unresolved = {}, 0.0
    for key, (prompt, legal) in sets.items():
        words, invalid, lost = reply_masses(engine, player, engine.encode(prompt), parse, legal, **sampling)
        unresolved = max(unresolved, lost)
        out[key] = (words, invalid + lost)
    return out, unresolved


def check_weights(n: int, weights: Sequence[float]) -> list[float]:
    """``weights`` as floats, checked: one per strategy (``n``), finite, non-negative, not all zero."""
    if n != len(weights) or not n:
        raise ValueError(f"give one weight per strategy, got {n} strategies and {len(weights)} weights")
    w = [float(x) for x in weights]
    if any(x < 0 or not math.isfinite(x) for x in w) or sum(w) <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {weights!r}")
    return w


def reach_weights(weights: Sequence[float], reaches: Sequence[float]) -> list[float]:
    """Players' normalised weights at one set: weight x own reach (unreached: the plain weights)."""
    r = [w * x for w, x in zip(weights, reaches)]
    if sum(r) <= 1e-15:
        r = list(weights)
    total = sum(r)
    return [x / total for x in r]


def resolve_backend(backend: str) -> str:
    """"openspiel" or "python" for ``backend`` ("auto": OpenSpiel when importable)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'openspiel' or 'python', got {backend!r}")
    if backend != "auto":
        return backend
    try:
        import pyspiel  # noqa: F401 - open_spiel: optional (extra eval), only probed
        return "openspiel"
    except ImportError:
        return "python"


class MixtureFigures:
    """A per-epoch callback: the ``deployable_mixture()``'s players read by ``read(engine, player,
    temperature) -> (strategy, unresolved)`` (frozen ones once), combined by ``mixture(strategies,
    weights)``, scored by ``score(mix) -> {figure: value}`` and returned under ``eval/`` (``exploitability``
    as ``eval/exploitability_played``); each epoch's row goes to ``rows`` and, as JSON, to ``printer``."""

    def __init__(self, read: Callable, mixture: Callable, score: Callable, *, name: str, seed: int,
                 printer: Callable[[str], None] | None = print):
        self.read, self.mixture, self.score = read, mixture, score
        self.name, self.seed, self.printer = name, seed, printer
        self.rows: list[dict] = []
        self.cache: dict[str, tuple] = {}
        self.t0 = time.perf_counter()

    def __call__(self, trainer) -> dict:
        weights = trainer.deployable_mixture()
        strategies, unresolved = [], 0.0
        for pid in weights:
            frozen = next(p for p in trainer.players if p.id == pid).frozen
            if pid not in self.cache or not frozen:
                self.cache[pid] = self.read(trainer.engine, pid, trainer.run.grpo.temperature)
            strategies.append(self.cache[pid][0])
            unresolved = max(unresolved, self.cache[pid][1])
        mix = self.mixture(strategies, list(weights.values()))
        figures = {k: round(float(v), 4) for k, v in self.score(mix).items()}
        row = {"trainer": self.name, "seed": self.seed, "epoch": trainer.current_epoch, **figures,
               "unresolved": round(unresolved, 6), "players": len(trainer.players),
               "mixture": {k: round(v, 3) for k, v in weights.items()},
               "minutes": round((time.perf_counter() - self.t0) / 60, 1)}
        self.rows.append(row)
        if self.printer is not None:
            self.printer(json.dumps(row))
        return {("eval/exploitability_played" if k == "exploitability" else f"eval/{k}"): v for k, v in figures.items()}
