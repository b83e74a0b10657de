"""Gemma 3 text models (arXiv 2503.19786) with the config's ``layer_types``, as transformers reads it.

mlx-lm's definition places the full-attention layers by ``sliding_window_pattern`` alone (every
sixth layer) and reads the mask of the first full layer from ``cache[pattern - 1]``, so a model
whose ``layer_types`` say otherwise, or with fewer layers than the pattern, is computed wrong or
fails. This one takes each layer's kind, rotary base and mask from ``layer_types`` (derived from
the pattern when the config has none), and reads the rotary settings transformers 5 writes under
``rope_parameters``, one per layer kind, computed as transformers computes them (``rope.RoPE``:
Gemma 3 4B and larger scale the full-attention layers' rotation linearly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models import gemma3_text as mlx_gemma3

from autocurricula.engine.models.rope import RoPE
from autocurricula.engine.models.windows import FULL, SLIDING, layer_masks, layer_types, make_cache


@dataclass
class ModelArgs(mlx_gemma3.ModelArgs):
    layer_types: Optional[list] = None
    rope_parameters: Optional[dict] = None

    def __post_init__(self):
        pattern = self.sliding_window_pattern
        self.layer_types = layer_types(self.layer_types, self.num_hidden_layers, lambda i: (i + 1) % pattern != 0)
        rope = self.rope_parameters or {}
        if "sliding_attention" in rope:  # transformers 5: one rotary setting per layer kind
            self.rope_local_base_freq = rope["sliding_attention"].get("rope_theta", self.rope_local_base_freq)
            full = rope.get("full_attention", {})
            self.rope_theta = full.get("rope_theta", self.rope_theta)
            if self.rope_scaling is None and full.get("rope_type", "default") != "default":
                self.rope_scaling = full


def rope_settings(args: ModelArgs) -> dict:
    """One rope dict per layer kind (``rope_type``, ``rope_theta`` and the type's factors): those
    under ``rope_parameters`` (transformers 5, or as ``autocurricula.engine.models.load`` reads
    either style), else the older top-level keys."""
    rope = args.rope_parameters or {}
    full = dict(rope.get(FULL) or args.rope_scaling or {})
    full.setdefault("rope_type", full.pop("type", "default"))
    full.setdefault("rope_theta", args.rope_theta)
    if full["rope_type"] in ("llama3", "yarn", "longrope"):
        full.setdefault("original_max_position_embeddings", args.max_position_embeddings)
    sliding = dict(rope.get(SLIDING) or {})
    sliding.setdefault("rope_type", sliding.pop("type", "default"))
    sliding.setdefault("rope_theta", args.rope_local_base_freq)
    return {FULL: full, SLIDING: sliding}


class Gemma3Model(mlx_gemma3.Gemma3Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        settings = rope_settings(args)
        for layer, kind in zip(self.layers, args.layer_types):
            attn = layer.self_attn
            attn.is_sliding = kind == SLIDING
            attn.rope = RoPE(args.head_dim, settings[kind], args.max_position_embeddings)

    def __call__(self, inputs: mx.array, cache=None, input_embeddings: Optional[mx.array] = None):
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        h *= mx.array(self.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
        if cache is None:
            cache = [None] * len(self.layers)
        masks = layer_masks(h, cache, self.args.layer_types, self.window_size)
        for layer, c, mask in zip(self.layers, cache, masks):
            h = layer(h, mask, c)
        return self.norm(h)


class Model(mlx_gemma3.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = Gemma3Model(args)

    def make_cache(self):
        return make_cache(self.args.layer_types, self.args.sliding_window)
