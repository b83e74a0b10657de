"""Llama and Mistral with Mistral's sliding window, as transformers computes them.

mlx-lm serves ``mistral`` with its Llama definition, which applies ``sliding_window`` only to
layers the config's ``layer_types`` names as sliding; a Mistral config sets ``sliding_window``
without ``layer_types``, and transformers then slides every layer. This definition does the same;
with neither key set it is mlx-lm's Llama unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn
from mlx_lm.models import llama as mlx_llama

from autocurricula.engine.models.windows import FULL, layer_types


@dataclass
class ModelArgs(mlx_llama.ModelArgs):
    def __post_init__(self):
        if self.layer_types is None and self.sliding_window:
            self.layer_types = layer_types(None, self.num_hidden_layers, lambda i: True)
        super().__post_init__()


class LlamaModel(mlx_llama.LlamaModel):
    def __init__(self, args: ModelArgs):
        if FULL in args.layer_types:
            super().__init__(args)
            return
        # every layer slides: mlx-lm's constructor looks for a full-attention layer, so it is
        # built with the first one marked full and then marked sliding like the others
        super().__init__(ModelArgs(**{**args.__dict__, "layer_types": [FULL] + args.layer_types[1:]}))
        self.args, self.layer_types = args, args.layer_types
        self.layers[0].use_sliding = True
        self.swa_idx = 0


class Model(mlx_llama.Model):
    def __init__(self, args: ModelArgs):
        nn.Module.__init__(self)
        self.args = args
        self.model_type = args.model_type
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
