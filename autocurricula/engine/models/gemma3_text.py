"""Gemma 3 text models (arXiv 2503.19786) with the config's ``layer_types``, as transformers reads it.

mlx-lm's definition places the full-attention layers by ``sliding_window_pattern`` alone (every
sixth layer) and reads the mask of the first full layer from ``cache[pattern - 1]``, so a model
whose ``layer_types`` say otherwise, or with fewer layers than the pattern, is computed wrong or
fails. This one takes each layer's kind, rotary base and mask from ``layer_types`` (derived from
the pattern when the config has none), and reads the rotary bases transformers 5 writes under
``rope_parameters``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models import gemma3_text as mlx_gemma3
from mlx_lm.models.rope_utils import initialize_rope

from autocurricula.engine.models.windows import SLIDING, layer_masks, layer_types, make_cache


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


class Gemma3Model(mlx_gemma3.Gemma3Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        for layer, kind in zip(self.layers, args.layer_types):
            attn = layer.self_attn
            attn.is_sliding = kind == SLIDING
            if attn.is_sliding:
                attn.rope = initialize_rope(dims=args.head_dim, base=args.rope_local_base_freq, traditional=False)
            else:
                attn.rope = initialize_rope(dims=args.head_dim, base=args.rope_theta, traditional=False,
                                            max_position_embeddings=args.max_position_embeddings,
                                            scaling_config=args.rope_scaling)

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
