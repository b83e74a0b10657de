"""OPT (Zhang et al. 2022, arXiv 2205.01068) in MLX, for the families mlx-lm does not ship.

Module paths follow transformers' ``OPTForCausalLM`` (``model.decoder.layers.N.self_attn.q_proj``,
``fc1``, ``fc2``...), so adapters export to peft under the same names. Positions are learned and
offset by 2, as in the original checkpoints; in a batched, left-padded cache a row's positions
start at its first real token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import BaseModelArgs, create_attention_mask, scaled_dot_product_attention

from autocurricula.engine.models.activations import activation
from autocurricula.engine.models.tree import TreePositions

_POSITION_OFFSET = 2  # OPT's learned positions start at row 2 of the table


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    ffn_dim: int
    max_position_embeddings: int = 2048
    word_embed_proj_dim: Optional[int] = None
    do_layer_norm_before: bool = True
    _remove_final_layer_norm: bool = False
    enable_bias: bool = True
    layer_norm_elementwise_affine: bool = True
    activation_function: str = "relu"
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.word_embed_proj_dim is None:
            self.word_embed_proj_dim = self.hidden_size
        activation(self.activation_function, "OPT")


def _layer_norm(args: ModelArgs) -> nn.LayerNorm:
    return nn.LayerNorm(args.hidden_size, eps=1e-5, affine=args.layer_norm_elementwise_affine)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.scale = (args.hidden_size // self.n_heads) ** -0.5
        dim, bias = args.hidden_size, args.enable_bias
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)

    def __call__(self, x: mx.array, mask=None, cache: Optional[Any] = None) -> mx.array:
        B, L, _ = x.shape
        q, k, v = (p(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.pre_norm = args.do_layer_norm_before
        self.act = activation(args.activation_function, "OPT")
        self.self_attn = Attention(args)
        self.self_attn_layer_norm = _layer_norm(args)
        self.fc1 = nn.Linear(args.hidden_size, args.ffn_dim, bias=args.enable_bias)
        self.fc2 = nn.Linear(args.ffn_dim, args.hidden_size, bias=args.enable_bias)
        self.final_layer_norm = _layer_norm(args)

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        # opt-350m normalises after each residual add, every other size before each sublayer
        h = self.self_attn(self.self_attn_layer_norm(x) if self.pre_norm else x, mask, cache)
        x = x + h
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        h = self.fc2(self.act(self.fc1(self.final_layer_norm(x) if self.pre_norm else x)))
        x = x + h
        return x if self.pre_norm else self.final_layer_norm(x)


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.word_embed_proj_dim)
        self.embed_positions = nn.Embedding(args.max_position_embeddings + _POSITION_OFFSET, args.hidden_size)
        projected = args.word_embed_proj_dim != args.hidden_size
        if projected:
            self.project_in = nn.Linear(args.word_embed_proj_dim, args.hidden_size, bias=False)
            self.project_out = nn.Linear(args.hidden_size, args.word_embed_proj_dim, bias=False)
        self.projected = projected
        self.final_norm = args.do_layer_norm_before and not args._remove_final_layer_norm
        if self.final_norm:
            self.final_layer_norm = _layer_norm(args)
        self.layers = [DecoderLayer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        L = inputs.shape[1]
        if cache is None:
            cache = [None] * len(self.layers)
        offset = cache[0].offset if cache[0] is not None else 0
        # a batch cache's offset is per row and negative over left padding; padded columns are
        # masked, so their (clipped) positions never reach a real token
        if isinstance(offset, TreePositions):  # a tree-packed forward: each token's depth on its path
            positions = offset.positions + _POSITION_OFFSET
        else:
            positions = mx.maximum(mx.array(offset)[..., None] + mx.arange(L), 0) + _POSITION_OFFSET
        h = self.embed_tokens(inputs)
        if self.projected:
            h = self.project_in(h)
        h = h + self.embed_positions(positions)
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        if self.final_norm:
            h = self.final_layer_norm(h)
        return self.project_out(h) if self.projected else h


class OPTModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.decoder = Decoder(args)

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        return self.decoder(inputs, cache)


class Model(nn.Module):
    """``OPTForCausalLM``: the decoder and an LM head (tied to the token embedding unless the
    config says otherwise)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = OPTModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.word_embed_proj_dim, args.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache=None, input_embeddings=None) -> mx.array:
        h = self.model(inputs, cache)
        if self.args.tie_word_embeddings:
            return self.model.decoder.embed_tokens.as_linear(h)
        return self.lm_head(h)

    def sanitize(self, weights: dict) -> dict:
        # checkpoints saved from OPTModel (e.g. the facebook/opt-* ones) have no "model." prefix
        out = {}
        for k, v in weights.items():
            if k.startswith("decoder."):
                k = "model." + k
            if k == "lm_head.weight" and self.args.tie_word_embeddings:
                continue
            out[k] = v
        return out

    @property
    def layers(self):
        return self.model.decoder.layers
