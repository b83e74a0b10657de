"""Which layers of a model attend over a sliding window, read from its config as transformers reads it.

Pure functions shared by the Llama/Mistral, Phi-3, Gemma 2 and Gemma 3 definitions of this package.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache

SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(given: list[str] | None, n_layers: int, sliding: Callable[[int], bool]) -> list[str]:
    """``given`` (the config's ``layer_types``) when set, else ``SLIDING`` for each layer index
    ``i`` with ``sliding(i)`` and ``FULL`` for the others."""
    if given is not None:
        if len(given) != n_layers:
            raise ValueError(f"layer_types names {len(given)} layers but the model has {n_layers}")
        return list(given)
    return [SLIDING if sliding(i) else FULL for i in range(n_layers)]


def layer_masks(h: mx.array, cache: list, types: list[str], window: int, return_array: bool = False) -> list:
    """One attention mask per layer: causal for full layers, causal within the last ``window``
    positions (the query's own included, as transformers counts) for sliding ones. Each mask is
    built from the cache of the first layer of its kind, so a batch cache masks its padding."""
    masks = {}
    for kind in (FULL, SLIDING):
        if kind in types:
            c = cache[types.index(kind)]
            masks[kind] = create_attention_mask(h, c, window_size=window if kind == SLIDING else None,
                                                return_array=return_array)
    return [masks[t] for t in types]


def make_cache(types: list[str], window: int) -> list:
    """mlx-lm's single-sequence caches: a rotating one of ``window`` positions for sliding layers."""
    return [RotatingKVCache(max_size=window) if t == SLIDING else KVCache() for t in types]
