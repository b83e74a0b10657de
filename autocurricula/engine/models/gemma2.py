"""Gemma 2 (arXiv 2408.00118) with its sliding-window layers, as transformers computes it.

mlx-lm's definition attends over the whole context in every layer; transformers' Gemma 2
alternates sliding-window layers (``sliding_window`` positions; even layers unless the config's
``layer_types`` says otherwise) with full ones, so past the window the two disagree. This one
masks each layer as transformers does, and exposes the LM head with the final logit soft-capping
as ``lm_head``, so code that applies the head to hidden states gets the model's logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models import gemma2 as mlx_gemma2

from autocurricula.engine.models.windows import layer_masks, layer_types, make_cache

# transformers' Gemma2Config default window
_WINDOW = 4096


@dataclass
class ModelArgs(mlx_gemma2.ModelArgs):
    sliding_window: Optional[int] = _WINDOW
    layer_types: Optional[list] = None

    def __post_init__(self):
        self.sliding_window = self.sliding_window or _WINDOW
        self.layer_types = layer_types(self.layer_types, self.num_hidden_layers, lambda i: i % 2 == 0)


class GemmaModel(mlx_gemma2.GemmaModel):
    def __call__(self, inputs: mx.array, cache=None):
        h = self.embed_tokens(inputs)
        h = h * (self.args.hidden_size**0.5)
        if cache is None:
            cache = [None] * len(self.layers)
        # the attention soft-caps its scores by hand, so it takes array masks only
        masks = layer_masks(h, cache, self.args.layer_types, self.args.sliding_window, return_array=True)
        if self.args.num_key_value_heads < self.args.num_attention_heads:
            # grouped queries score as (batch, kv heads, group, L, S): a batch's (batch, 1, L, S)
            # mask needs the group axis to broadcast
            masks = [m[:, :, None] if m is not None and m.ndim == 4 else m for m in masks]
        for layer, c, mask in zip(self.layers, cache, masks):
            h = layer(h, mask, c)
        return self.norm(h)


class Model(mlx_gemma2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = GemmaModel(args)

    def __call__(self, inputs: mx.array, cache=None):
        return self.lm_head(self.model(inputs, cache))

    @property
    def lm_head(self):
        """Tied embeddings, then ``tanh`` soft-capping at ``final_logit_softcapping``."""
        cap, embed = self.final_logit_softcapping, self.model.embed_tokens
        return lambda h: mx.tanh(embed.as_linear(h) / cap) * cap

    def make_cache(self):
        return make_cache(self.args.layer_types, self.args.sliding_window)
