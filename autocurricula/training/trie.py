"""Prefix tries of one step's rows, packed for a tree update: pure NumPy functions.

The rows of one player in an update (each a turn's prompt ids followed by its completion ids)
repeat their prefixes: a GRPO group is G completions of one prompt, a multi-turn chat's turn is the
previous turn's prompt, reply and the opponent's message, and every prompt of a game starts with
its instructions. The rows form a prefix trie, one node per distinct prefix. Packed in depth-first
order it is one sequence in which every token appears once:

- ``tokens[i]``: the token of node ``i`` (the last token of its prefix);
- ``positions[i]``: its depth along its path, 0 for a first token: the position it has in every row
  through it (not its packed index), which is what RoPE and learned positions must see;
- ``parent[i]``: the packed index of the token before it on its path (-1 for a first token);
- ``tin[i]``, ``tout[i]``: entry and exit indices of the depth-first walk (``tin`` is ``i`` itself,
  the packing being pre-order); node ``i``'s subtree is ``tin[i] .. tout[i] - 1``. Token ``q``
  attends to token ``k`` iff ``k`` is on ``q``'s path, i.e. iff ``tin[k] <= tin[q] < tout[k]``
  (:func:`ancestor_mask`);
- ``rows[r]``: the packed index of each token of original row ``r``, so that a loss defined on the
  original rows gathers its log-probabilities from the packed output (:func:`completion_targets`).

A trie holds the rows of one player only: players' adapters change the activations, so their rows
never share a node (:func:`pack_players`). Rows that are equal share every node; an empty row has
no node. Siblings are ordered by token id.

Built from the rows sorted lexicographically: a sorted row shares with all earlier rows exactly its
longest common prefix with the row before it, so the new nodes are each row's tokens after that
prefix, emitted in order (which is the depth-first order) without any per-token Python work.
:func:`trie_size` counts the nodes the same way (``update/tree_tokens``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PackedTrie", "ancestor_mask", "check_ancestor_mask", "check_packing", "completion_targets", "pack",
           "pack_players", "token_counts", "trie_size"]


@dataclass(frozen=True)
class PackedTrie:
    """One player's rows as a packed prefix trie (see the module docstring)."""

    tokens: np.ndarray     # (N,) int64: the token of each node, depth-first
    positions: np.ndarray  # (N,) int64: depth of each node along its path
    parent: np.ndarray     # (N,) int64: packed index of the node before it on its path, -1 for a first token
    tin: np.ndarray        # (N,) int64: entry index (arange(N))
    tout: np.ndarray       # (N,) int64: exit index, one past the last node of its subtree
    rows: tuple[np.ndarray, ...]  # per original row, the packed index of each of its tokens

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def mask(self) -> np.ndarray:
        """The (N, N) ancestor mask: ``mask[q, k]`` is True iff token ``q`` may attend to token ``k``."""
        return ancestor_mask(self.tin, self.tout)


def _arrays(rows: Sequence[Sequence[int]]) -> list[np.ndarray]:
    out = []
    for i, r in enumerate(rows):
        a = np.asarray(r, dtype=np.int64)
        if a.ndim != 1:
            raise ValueError(f"row {i} is not a flat sequence of token ids (shape {a.shape})")
        out.append(a)
    return out


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(a.shape[0], b.shape[0])
    if m == 0:
        return 0
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m


def _sorted_lcps(arrs: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """The rows' lexicographic order and, per sorted row, its common prefix with the row before it."""
    order = sorted(range(len(arrs)), key=lambda i: arrs[i].tolist())
    lcps = [0] * len(order)
    for s in range(1, len(order)):
        lcps[s] = _lcp(arrs[order[s - 1]], arrs[order[s]])
    return order, lcps


def trie_size(rows: Sequence[Sequence[int]]) -> int:
    """Nodes of the rows' prefix trie: the tokens a tree-packed forward of these rows computes."""
    arrs = _arrays(rows)
    order, lcps = _sorted_lcps(arrs)
    return sum(arrs[i].shape[0] - lcp for i, lcp in zip(order, lcps))


def pack(rows: Sequence[Sequence[int]]) -> PackedTrie:
    """The prefix trie of ``rows`` (token id sequences of one player), packed depth-first."""
    arrs = _arrays(rows)
    order, lcps = _sorted_lcps(arrs)
    maps: list[np.ndarray | None] = [None] * len(arrs)
    tokens, positions, parents, starts = [], [], [], []
    n, prev = 0, None
    for i, lcp in zip(order, lcps):
        a = arrs[i]
        length = a.shape[0]
        idx = np.empty(length, np.int64)
        if lcp:
            idx[:lcp] = maps[prev][:lcp]
        idx[lcp:] = np.arange(n, n + length - lcp)
        if length > lcp:
            par = np.empty(length - lcp, np.int64)
            if lcp == 0:
                par[0] = -1
                par[1:] = idx[: length - 1]
            else:
                par[:] = idx[lcp - 1: length - 1]
            tokens.append(a[lcp:])
            positions.append(np.arange(lcp, length, dtype=np.int64))
            parents.append(par)
        starts.append(n)
        n += length - lcp
        maps[i], prev = idx, i
    tout = _exits(order, lcps, [arrs[i].shape[0] for i in order], starts, n)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return PackedTrie(cat(tokens), cat(positions), cat(parents), np.arange(n, dtype=np.int64), tout,
                      tuple(maps))


def _exits(order, lcps, lengths, starts, n: int) -> np.ndarray:
    """``tout`` of every node. The node of sorted row s at depth j (j >= lcps[s]) ends its subtree
    where the first later row s2 with ``lcps[s2] <= j`` starts its new nodes (or at n): scanning
    the rows backwards, a stack keeps the later rows whose common prefix is below every one before
    them (strictly rising from bottom to top), and each depth finds its row by binary search."""
    tout = np.empty(n, np.int64)
    stack_lcp = np.empty(len(order), np.int64)
    stack_start = np.empty(len(order), np.int64)
    top = 0
    for s in range(len(order) - 1, -1, -1):
        lcp, length, start = lcps[s], lengths[s], starts[s]
        if length > lcp:
            depths = np.arange(lcp, length)
            at = np.searchsorted(stack_lcp[:top], depths, side="right") - 1
            tout[start: start + length - lcp] = np.where(at >= 0, stack_start[np.maximum(at, 0)], n)
        while top and stack_lcp[top - 1] >= lcp:
            top -= 1
        stack_lcp[top], stack_start[top] = lcp, start
        top += 1
    return tout


def pack_players(players: Sequence[Hashable], rows: Sequence[Sequence[int]]) -> dict:
    """One trie per player: ``{player: (PackedTrie, [indices of its rows in rows])}``, the trie's
    ``rows[j]`` being the map of ``rows[indices[j]]``. Rows of different players never share a trie."""
    if len(players) != len(rows):
        raise ValueError(f"one player per row: {len(players)} players for {len(rows)} rows")
    mine: dict = {}
    for i, p in enumerate(players):
        mine.setdefault(p, []).append(i)
    return {p: (pack([rows[i] for i in idx]), idx) for p, idx in mine.items()}


def token_counts(players: Sequence[Hashable], rows: Sequence[Sequence[int]]) -> dict:
    """``row_tokens`` (the rows' tokens, each row on its own) and ``tree_tokens`` (the nodes of each
    player's trie, summed over players): what per-row and tree packing would compute."""
    if len(players) != len(rows):
        raise ValueError(f"one player per row: {len(players)} players for {len(rows)} rows")
    mine: dict = {}
    for p, r in zip(players, rows):
        mine.setdefault(p, []).append(r)
    return {"row_tokens": sum(len(r) for r in rows), "tree_tokens": sum(trie_size(rs) for rs in mine.values())}


def ancestor_mask(tin: np.ndarray, tout: np.ndarray) -> np.ndarray:
    """``mask[q, k] = tin[k] <= tin[q] < tout[k]``: token q sees token k iff k is on q's path (itself
    included). Two interval comparisons per pair, no walk along the paths."""
    tin, tout = np.asarray(tin), np.asarray(tout)
    return (tin[None, :] <= tin[:, None]) & (tin[:, None] < tout[None, :])


def _ancestors(parent: np.ndarray) -> np.ndarray:
    n = parent.shape[0]
    want = np.zeros((n, n), bool)
    for q in range(n):
        k = q
        while k >= 0:
            want[q, k] = True
            k = int(parent[k])
    return want


def check_ancestor_mask(mask: np.ndarray, parent: np.ndarray) -> None:
    """Raise ValueError unless ``mask[q, k]`` holds exactly when k is q or an ancestor of q, the
    ancestors read from ``parent`` (a walk up each path: for tests and debugging)."""
    parent = np.asarray(parent)
    n = parent.shape[0]
    if mask.shape != (n, n):
        raise ValueError(f"mask of shape {mask.shape} for {n} tokens")
    if np.any(parent >= np.arange(n)):
        raise ValueError("a token's parent is not packed before it")
    want = _ancestors(parent)
    bad = np.argwhere(mask != want)
    if bad.size:
        q, k = (int(x) for x in bad[0])
        raise ValueError(f"{len(bad)} wrong mask entries; first: token {q} {'sees' if mask[q, k] else 'misses'} "
                         f"token {k}, which is {'' if want[q, k] else 'not '}on its path")


def check_packing(trie: PackedTrie, rows: Sequence[Sequence[int]]) -> None:
    """Raise ValueError unless ``trie`` packs ``rows`` exactly: each row's map walks one path whose
    tokens are the row's and whose positions count 0, 1, ...; every node lies on some row's path, no
    two siblings hold the same token; the (tin, tout) intervals nest along the paths, siblings'
    intervals are disjoint and each spans its subtree, so that :func:`ancestor_mask` is the ancestor
    relation. O(N log N), no (N, N) array."""
    n = len(trie)
    tokens, pos, parent, tin, tout = trie.tokens, trie.positions, trie.parent, trie.tin, trie.tout
    if not all(x.shape == (n,) for x in (pos, parent, tin, tout)):
        raise ValueError("tokens, positions, parent, tin and tout differ in length")
    if len(trie.rows) != len(rows):
        raise ValueError(f"{len(trie.rows)} row maps for {len(rows)} rows")
    seen = np.zeros(n, bool)
    for r, (row, idx) in enumerate(zip(_arrays(rows), trie.rows)):
        if idx.shape != row.shape:
            raise ValueError(f"row {r}: a map of {idx.shape[0]} indices for {row.shape[0]} tokens")
        if not row.size:
            continue
        if np.any(tokens[idx] != row):
            raise ValueError(f"row {r}: its map reads other tokens than the row's")
        if np.any(pos[idx] != np.arange(row.size)):
            raise ValueError(f"row {r}: positions along its path are not 0, 1, ...")
        if parent[idx[0]] != -1 or np.any(parent[idx[1:]] != idx[:-1]):
            raise ValueError(f"row {r}: its map is not one path from a first token")
        seen[idx] = True
    if not seen.all():
        raise ValueError(f"{int((~seen).sum())} packed tokens lie on no row's path")
    if not np.array_equal(np.sort(tin), np.arange(n)):
        raise ValueError("tin is not a numbering of the tokens")
    has = parent >= 0
    key = np.stack([parent, tokens], 1)
    if len(np.unique(key, axis=0)) != n:
        raise ValueError("two siblings hold the same token: the trie is not minimal")
    if np.any(tin[parent[has]] >= tin[has]) or np.any(tout[has] > tout[parent[has]]):
        raise ValueError("a token's interval is not inside its parent's")
    size = tout - tin
    below = np.zeros(n, np.int64)
    np.add.at(below, parent[has], size[has])
    if np.any(size != 1 + below):
        raise ValueError("an interval does not span exactly its subtree")
    by = np.lexsort((tin, parent))  # siblings (roots: parent -1) side by side, in entry order
    same = parent[by[1:]] == parent[by[:-1]]
    if np.any(tout[by[:-1]][same] > tin[by[1:]][same]):
        raise ValueError("two siblings' intervals overlap")


def completion_targets(trie: PackedTrie, starts: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where a loss on the original rows reads the packed output: for every completion token of
    every row (row r's completion starts at ``starts[r]`` >= 1), the packed index of the token that
    predicts it (the token before it on the row's path), the token itself, and the row. Concatenated
    row after row, in the order of ``trie.rows``; the logits at a node are shared by every row through
    it, each row reading its own next token's log-probability there."""
    if len(starts) != len(trie.rows):
        raise ValueError(f"{len(starts)} completion starts for {len(trie.rows)} rows")
    pred, tgt, row = [], [], []
    for r, (idx, start) in enumerate(zip(trie.rows, starts)):
        if not 1 <= start <= idx.shape[0]:
            raise ValueError(f"row {r}: completion start {start} outside 1..{idx.shape[0]} (the first completion "
                             "token needs a token before it)")
        pred.append(idx[start - 1: -1])
        tgt.append(trie.tokens[idx[start:]])
        row.append(np.full(idx.shape[0] - start, r, np.int64))
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return cat(pred), cat(tgt), cat(row)
