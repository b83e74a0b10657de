"""A tree-packed forward pass through mlx-lm definitions: many rows sharing prefixes, each token once.

A packed tree (see ``autocurricula.training.trie``) is one sequence whose tokens sit at their depth
along their own path, and in which a token attends to exactly its ancestors. mlx-lm's attention
layers read both from their KV cache: the rotation from ``cache.offset`` and the mask from
``cache.make_mask`` (through ``create_attention_mask``). :class:`TreeCache` stands in for every
layer's cache for one call, storing nothing: its ``offset`` carries each token's position
(:class:`TreePositions`) and its mask is the ancestor mask, cut to the window along the path for
sliding layers. Rotary modules take one offset per batch row, not per token, so
:func:`enable_tree` wraps each in :class:`TreeRoPE`, which rotates each token as a row of its own.

Families whose layers carry a recurrent or convolutional state along the sequence (LFM2, Qwen3.5)
would need that state at every fork; GPT-2 reads its learned positions as one offset per row.
They are computed per row (:func:`tree_fallback` says why).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

__all__ = ["TreeCache", "TreePositions", "TreeRoPE", "enable_tree", "tree_fallback"]

# model_type -> why a tree-packed forward is not exact there (the update packs per row instead)
FALLBACK = {
    "lfm2": "its convolutional layers carry a state along the sequence, which a fork would have to copy",
    "qwen3_5_text": "its linear-attention layers carry a recurrent state along the sequence, which a fork would "
                    "have to copy",
    "gpt2": "its learned position embeddings are read from the cache offset as one number per row",
}


class TreePositions:
    """Each token's position along its own path, shape (batch, length): passed as a cache's
    ``offset`` during a tree forward, read by :class:`TreeRoPE` and by learned-position tables."""

    __slots__ = ("positions",)

    def __init__(self, positions: mx.array):
        self.positions = positions


class TreeCache:
    """Every layer's stand-in cache for one tree-packed forward: keeps nothing, rotates each token
    at its depth and masks every query to its ancestors. ``tin`` and ``tout`` (batch, length) are the
    entry and exit indices of the depth-first walk; padding holds ``tin = i, tout = i + 1`` (a token
    that sees only itself, so no softmax row is empty)."""

    def __init__(self, positions: mx.array, tin: mx.array, tout: mx.array):
        self.offset = TreePositions(positions)
        self.positions, self.tin, self.tout = positions, tin, tout

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        return keys, values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        """(batch, 1, n, n) booleans: key k is visible to query q iff ``tin[k] <= tin[q] < tout[k]``
        (k on q's path) and, with a window, ``pos[q] - pos[k] < window_size`` (along the path)."""
        if n != self.tin.shape[1]:
            raise ValueError(f"a tree cache of {self.tin.shape[1]} tokens asked for a mask over {n}")
        tin_q, tin_k, tout_k = self.tin[:, :, None], self.tin[:, None, :], self.tout[:, None, :]
        mask = (tin_k <= tin_q) & (tin_q < tout_k)
        if window_size is not None:
            mask = mask & (self.positions[:, :, None] - self.positions[:, None, :] < window_size)
        return mask[:, None]


class TreeRoPE(nn.Module):
    """A rotary module that also takes :class:`TreePositions`: each token is rotated as a batch row of
    its own, at its own position, by the wrapped module (so scaled rotations stay the family's)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if not isinstance(offset, TreePositions):
            return self.inner(x, offset=offset)
        b, h, n, d = x.shape
        rows = x.transpose(0, 2, 1, 3).reshape(b * n, h, 1, d)
        out = self.inner(rows, offset=offset.positions.reshape(-1))
        return out.reshape(b, n, h, d).transpose(0, 2, 1, 3)


def _rope_kinds() -> tuple:
    from autocurricula.engine.models.rope import RoPE, _rope_classes

    return (*_rope_classes(), RoPE)


def tree_fallback(model_type: str | None) -> str | None:
    """Why a tree-packed forward of a model of this family would not be exact (None where it is):
    its entry in :data:`FALLBACK`, or a family outside the conformance matrix."""
    if model_type in FALLBACK:
        return f"model family {model_type!r}: {FALLBACK[model_type]}"
    from autocurricula.engine.models.config import FAMILIES

    if model_type not in FAMILIES:
        return f"model family {model_type!r} is not in the conformance matrix the tree forward is checked on"
    return None


def enable_tree(model) -> int:
    """Wrap every rotary module of ``model`` in :class:`TreeRoPE` (once; idempotent). Returns how
    many were wrapped. Rotary modules hold no weights, so the model's parameters are unchanged."""
    kinds, count = _rope_kinds(), 0
    for _, module in model.named_modules():
        if isinstance(module, TreeRoPE):
            continue
        for name, child in list(module.children().items()):
            if isinstance(child, kinds) and not isinstance(module, TreeRoPE):
                module[name] = TreeRoPE(child)
                count += 1
    return count
