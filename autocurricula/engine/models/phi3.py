"""Phi-3 with its sliding window, as transformers computes it.

mlx-lm's definition attends over the whole context; transformers' ``Phi3ForCausalLM`` masks every
layer to the last ``sliding_window`` positions when the config sets one (Phi-3-mini-4k: 2047 of
4096 positions). This one does the same; with no window it is mlx-lm's Phi-3 unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models import phi3 as mlx_phi3
from mlx_lm.models.base import create_attention_mask

from autocurricula.engine.models.windows import layer_types, make_cache


@dataclass
class ModelArgs(mlx_phi3.ModelArgs):
    sliding_window: Optional[int] = None


class Phi3Model(mlx_phi3.Phi3Model):
    def __call__(self, inputs: mx.array, cache=None):
        h = self.embed_tokens(inputs)
        if cache is None:
            cache = [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0], window_size=self.args.sliding_window)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)


class Model(mlx_phi3.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = Phi3Model(args)

    def make_cache(self):
        window = self.args.sliding_window
        return make_cache(layer_types(None, self.args.num_hidden_layers, lambda i: bool(window)), window)
