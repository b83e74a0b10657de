"""Phi-3 with its sliding window and its longrope rotation, as transformers computes them.

mlx-lm's definition attends over the whole context; transformers' ``Phi3ForCausalLM`` masks every
layer to the last ``sliding_window`` positions when the config sets one (Phi-3-mini-4k: 2047 of
4096 positions). This one does the same. mlx-lm also applies longrope's long factors to every
sequence (Phi-3.5-mini, Phi-3-mini-128k, Phi-4-mini), where transformers applies the short ones up
to ``original_max_position_embeddings``: a longrope ``rope_scaling`` (the older config style,
which ``mlx_lm.load`` passes as is) is computed here as transformers computes it (``rope.RoPE``).
``autocurricula.engine.models.load`` reads either config style and swaps the rotation in after
loading instead. With neither a window nor longrope it is mlx-lm's Phi-3 unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models import phi3 as mlx_phi3
from mlx_lm.models.base import create_attention_mask

from autocurricula.engine.models.rope import RoPE
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


def longrope(args: ModelArgs) -> dict | None:
    """The canonical longrope parameters of an older-style ``rope_scaling`` (type ``longrope``, or
    Phi-3's earlier names ``su`` and ``yarn``), or None."""
    scaling = dict(args.rope_scaling or {})
    if (scaling.pop("rope_type", None) or scaling.pop("type", None)) not in ("longrope", "su", "yarn"):
        return None
    return {**scaling, "rope_type": "longrope", "rope_theta": args.rope_theta,
            "original_max_position_embeddings": args.original_max_position_embeddings}


class Model(mlx_phi3.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = Phi3Model(args)
        params = longrope(args)
        if params is not None:
            for layer in self.model.layers:
                attn = layer.self_attn
                attn.rope = RoPE(attn.rope.dim, params, args.max_position_embeddings)

    def make_cache(self):
        window = self.args.sliding_window
        return make_cache(layer_types(None, self.args.num_hidden_layers, lambda i: bool(window)), window)
