"""What the exact-exploitability harnesses of the card games share: a player's replies read as the
game parses them, the weights of a mixture of behaviour strategies, and the choice of backend.

* ``reply_masses``: the probability of each legal word, of an invalid reply and of what was left
  unread, from the tree of a model's replies at one prompt; ``read_sets`` at every information
  set of a game (``eval.kuhn.read_played``, ``eval.leduc.read_played``).
* ``check_weights`` / ``reach_weights``: a mixture that draws one player per hand is one behaviour
  strategy whose information sets average the players weighted by weight x own reach (Kuhn's
  theorem); these give those weights.
* ``resolve_backend``: "auto" is OpenSpiel when it is importable, else the exact pure-Python one.
* ``MixtureFigures``: a per-epoch callback scoring a trainer's ``deployable_mixture()`` as played.
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
    """``({legal word: probability}, invalid, unresolved)`` of ``player``'s reply (None = the base
    model) after ``prompt_ids``, sampled at ``temperature`` (top-p 1) with ``max_tokens``.

    Walks the tree of replies token by token, parsing each branch's text with ``parse`` (the game's
    first-action parser: the first action word, legal or not, which later text cannot change). A
    branch ends when it names a word (legal: its mass goes to the word; not legal: invalid), at an
    end token or at the token limit (invalid). A branch below ``threshold`` is not followed; its
    mass is ``unresolved`` (callers count it invalid: it may not be)."""
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
    """``reply_masses`` at each information set of ``sets`` (``{key: (prompt, legal words)}``):
    ``{key: ({legal word: probability}, invalid and unread mass)}`` and the largest unread mass.
    ``sampling``: ``temperature``, ``max_tokens``, ``threshold``."""
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
    """The normalised weights of the players at one information set: weight x the player's own
    probability of reaching it; where no player reaches it, the plain weights."""
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
    """A per-epoch callback: each player of ``trainer.deployable_mixture()`` read as played with
    ``read(engine, player, temperature)`` -> ``(strategy, unresolved)`` (frozen players once), made
    one strategy by ``mixture(strategies, weights)`` and scored by ``score(mix)`` -> ``{figure:
    value}`` (``exploitability`` among them). Each epoch's row (``name``, ``seed``, the figures,
    the largest unresolved mass, the mixture, the minutes since start) goes to ``rows`` and, as
    one JSON line, to ``printer``; the trainer logs ``eval/exploitability_played`` and the other
    figures under ``eval/``."""

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
            frozen = next(p for p in trainer.players if p["id"] == pid)["frozen"]
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
