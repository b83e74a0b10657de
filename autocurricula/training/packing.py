"""How one step's rows are cut into micro-batches: one row per batch row, or prefix trees.

Pure functions of the rows' token ids and owners. Per-row packing pads rows to the longest in the
micro-batch; tree packing (``GRPOConfig.packing="tree"``) packs each player's rows as prefix tries
(``autocurricula.training.trie``), one trie per batch row, so a token shared by several rows is
computed once.

Memory. A per-row micro-batch of ``budget`` tokens at width ``w`` holds ``budget`` tokens of
activations and ``budget * w`` attention scores per head. A tree of ``n`` tokens holds ``n`` and
``n * n``. So a tree is cut at ``cap = max(w, min(budget, sqrt(budget * w)))`` tokens (``w`` the
step's longest row), and a micro-batch of trees padded to ``n`` holds at most ``budget`` tokens and
``budget * w`` scores: never more than the per-row packing of the same rows would.

Time. A tree's ancestor mask is dense, so a tree of ``n`` tokens computes ``n * n`` scores however
few pairs it keeps. :func:`tree_chunks` cuts each player's rows where the scores would cost more than
the shared tokens save (``pair_cost``: one score's work in tokens, from the engine's model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autocurricula.training.trie import PackedTrie, pack

__all__ = ["TreeChunk", "row_microbatches", "tree_cap", "tree_chunks", "tree_microbatches"]


def row_microbatches(lengths: Sequence[int], players: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices in micro-batches of at most ``budget`` padded tokens (rows x longest input, an
    input being a row without its last token), longest first; a row longer than ``budget`` goes
    alone. Within a batch the rows of one player sit together, so the multi-LoRA ``gather_mm`` runs
    on sorted indices."""
    batches, cur, width = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        w = max(width, lengths[i] - 1)
        if cur and w * (len(cur) + 1) > budget:
            batches.append(cur)
            cur, w = [], lengths[i] - 1
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    return [sorted(b, key=lambda i: players[i]) for b in batches]


@dataclass(frozen=True)
class TreeChunk:
    """Rows of one player packed as one trie: ``rows[j]`` (an index into the step's rows) is
    ``trie.rows[j]``."""

    player: int
    rows: tuple[int, ...]
    trie: PackedTrie


def tree_cap(budget: int, longest: int) -> int:
    """The most tokens one tree may hold (see the module docstring)."""
    return max(longest, min(budget, math.isqrt(budget * longest)))


def tree_chunks(ids: Sequence[Sequence[int]], players: Sequence[int], budget: int,
                pair_cost: float = 0.0) -> list[TreeChunk]:
    """Each player's rows as tries of at most :func:`tree_cap` tokens, cut where sharing stops
    paying. The rows are taken in lexicographic order (rows sharing a prefix are neighbours); a
    trie of ``n`` tokens costs ``n + pair_cost * n * n`` (its tokens' work, and the attention scores
    of its dense ancestor mask, ``pair_cost`` being one score's cost in tokens), and the cut points
    minimise the total over each player's run of rows (dynamic programming). A row alone costs what
    per-row packing costs it, so the plan never costs more than per-row packing under this model;
    with ``pair_cost == 0`` tries are as large as the cap allows. A trie holds the rows of one
    player only."""
    if len(ids) != len(players):
        raise ValueError(f"one player per row: {len(players)} players for {len(ids)} rows")
    arrs = [np.asarray(r, np.int64) for r in ids]
    cap = tree_cap(budget, max((a.shape[0] for a in arrs), default=1))
    mine: dict[int, list[int]] = {}
    for i, p in enumerate(players):
        mine.setdefault(p, []).append(i)
    out = []
    for p in sorted(mine):
        order = sorted(mine[p], key=lambda i: arrs[i].tolist())
        for lo, hi in _cuts([arrs[i] for i in order], cap, pair_cost):
            out.append(order[lo:hi])
    return [TreeChunk(players[c[0]], tuple(c), pack([arrs[i] for i in c])) for c in out]


def _cuts(rows: list[np.ndarray], cap: int, pair_cost: float) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]``: consecutive runs of the sorted ``rows``, each of at most ``cap`` trie
    tokens, minimising the summed ``n + pair_cost * n * n``."""
    m = len(rows)
    lengths = [r.shape[0] for r in rows]
    new = [lengths[0]] + [lengths[k] - _lcp(rows[k - 1], rows[k]) for k in range(1, m)]
    best = [0.0] + [math.inf] * m
    back = [0] * (m + 1)
    for hi in range(1, m + 1):  # rows[lo:hi] as one trie: lengths[lo] + new[lo+1] + ... + new[hi-1] tokens
        shared = 0
        for lo in range(hi - 1, -1, -1):
            if lo < hi - 1:
                shared += new[lo + 1]
            n = lengths[lo] + shared
            if n > cap and lo < hi - 1:
                break
            cost = best[lo] + n + pair_cost * n * n
            if cost < best[hi]:
                best[hi], back[hi] = cost, lo
    cuts, hi = [], m
    while hi > 0:
        cuts.append((back[hi], hi))
        hi = back[hi]
    return cuts[::-1]


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m


def tree_microbatches(chunks: Sequence[TreeChunk], budget: int, longest: int) -> list[list[TreeChunk]]:
    """Tries in micro-batches, largest first: each padded to its batch's largest, at most ``budget``
    tokens and ``budget * longest`` attention scores per head (a tree alone may reach its cap);
    within a batch the tries of one player sit together (sorted multi-LoRA routing)."""
    cells = budget * max(1, longest)
    batches, cur, width = [], [], 0
    for c in sorted(chunks, key=lambda c: -len(c.trie)):
        w = max(width, len(c.trie))
        n = len(cur) + 1
        if cur and (w * n > budget or w * w * n > cells):
            batches.append(cur)
            cur, w = [], len(c.trie)
        cur.append(c)
        width = w
    if cur:
        batches.append(cur)
    return [sorted(b, key=lambda c: c.player) for b in batches]
