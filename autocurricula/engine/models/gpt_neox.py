"""GPT-NeoX / Pythia (Black et al. 2022, arXiv 2204.06745) as transformers computes it.

mlx-lm's definition, with what its MLP and attention fix in place read from the config as
transformers' ``GPTNeoXForCausalLM`` reads it: the activation (``hidden_act``, the exact GELU for
Pythia's ``"gelu"`` where mlx-lm always applies the tanh approximation), the MLP width
(``intermediate_size``), the attention biases (``attention_bias``) and the rotary settings, which
transformers 5 writes under ``rope_parameters``. Module paths are mlx-lm's (``model.h.N...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gpt_neox as mlx_gpt_neox

from autocurricula.engine.models.activations import activation

# transformers' GPTNeoXConfig defaults for the rotary settings
_ROPE_THETA = 10000.0
_ROTARY_PCT = 0.25


@dataclass
class ModelArgs(mlx_gpt_neox.ModelArgs):
    rotary_emb_base: Optional[float] = None
    rotary_pct: Optional[float] = None
    hidden_act: str = "gelu"
    intermediate_size: Optional[int] = None
    attention_bias: bool = True
    rope_parameters: Optional[dict] = None

    def __post_init__(self):
        super().__post_init__()
        # a scaled rope_type is applied by the rotary module autocurricula.engine.models.load swaps in
        rope = self.rope_parameters or {}
        if self.rotary_emb_base is None:
            self.rotary_emb_base = rope.get("rope_theta", _ROPE_THETA)
        if self.rotary_pct is None:
            self.rotary_pct = rope.get("partial_rotary_factor", _ROTARY_PCT)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        activation(self.hidden_act, "GPT-NeoX")


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.act = activation(args.hidden_act, "GPT-NeoX")
        self.dense_h_to_4h = nn.Linear(args.hidden_size, args.intermediate_size)
        self.dense_4h_to_h = nn.Linear(args.intermediate_size, args.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class Model(mlx_gpt_neox.Model):
    """``GPTNeoXForCausalLM``: mlx-lm's model with the MLP and attention projections the config names."""

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        dim = args.hidden_size
        # the modules mlx-lm built are replaced before any weight is loaded (MLX arrays are lazy)
        for block in self.layers:
            block.mlp = MLP(args)
            if not args.attention_bias:
                block.attention.query_key_value = nn.Linear(dim, 3 * dim, bias=False)
                block.attention.dense = nn.Linear(dim, dim, bias=False)
