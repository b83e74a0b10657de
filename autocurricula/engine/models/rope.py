"""Rotary position embeddings as transformers computes them (``modeling_rope_utils.py``), in MLX.

:func:`inverse_frequencies` is transformers' ``ROPE_INIT_FUNCTIONS[rope_type]`` for the types the
engine serves (``default``, ``linear``, ``dynamic``, ``llama3``, ``yarn``, ``longrope``), on the
canonical ``rope_parameters`` of :mod:`autocurricula.engine.models.config`: the same float32
operations in the same order, so each position is rotated by the angle transformers rotates it
by. :class:`RoPE` applies them with ``mx.fast.rope``; :func:`swap_ropes` puts it in place of the
rotary module a definition built (``nn.RoPE`` and mlx-lm's scaled variants).

Where mlx-lm departs from transformers (why the scaled types are not left to mlx-lm):

- ``longrope`` (Phi-3.5, Phi-3-mini-128k, Phi-4-mini): mlx-lm always applies ``long_factor``;
  transformers applies ``short_factor`` while the sequence holds at most
  ``original_max_position_embeddings`` tokens, and ``long_factor`` past it. mlx-lm also ignores
  the ``factor`` and ``attention_factor`` of the parameters.
- ``yarn``: mlx-lm ignores ``attention_factor``, ``truncate`` and a ``factor`` of None, and
  reads ``mscale`` without ``mscale_all_dim`` differently.
- ``dynamic``: mlx-lm's fails on a batch cache (one offset per row).
- ``llama3`` and ``linear`` agree with transformers once ``original_max_position_embeddings``
  defaults to ``max_position_embeddings`` as transformers defaults it (mlx-lm: 8192); they are
  computed here too, so every type has one code path.

Types whose angles depend on the sequence length:

- ``longrope`` switches from short to long factors once the sequence is longer than
  ``original_max_position_embeddings``. transformers' ``generate`` then recomputes the whole
  cache with the long factors (``Phi3ForCausalLM.prepare_inputs_for_generation``). A forward
  pass without a cache, or from offset 0, is computed here as transformers computes it; a call
  that crosses the boundary on top of a cache filled with the short factors raises, since the
  cached keys would need the recomputation. The engine caps a longrope model's context at
  ``original_max_position_embeddings`` (:func:`context_limit`), where the short factors hold.
- ``dynamic`` rescales its base once the sequence passes ``max_position_embeddings``; within it,
  it is the default rotation. With one integer offset (one sequence), each call is rotated for
  its own length, as transformers' ``generate`` does; with a batch cache (one offset per row)
  the default rotation is used, so the engine caps such a model's context at
  ``max_position_embeddings``.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from autocurricula.engine.models.config import ROPE_TYPES


def _exponents(dim: int) -> np.ndarray:
    # torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)


def _pow(base, exponents: np.ndarray) -> np.ndarray:
    return (np.float32(base) ** exponents).astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inverse_frequencies(params: dict, dim: int, max_position_embeddings: int | None,
                        seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """transformers' ``(inv_freq, attention_factor)`` for canonical rope ``params`` over ``dim``
    rotary dimensions (the head size times ``partial_rotary_factor``). ``seq_len`` is the
    sequence length the dynamic and longrope types depend on (None: as at initialisation)."""
    kind = params.get("rope_type", "default")
    base = params["rope_theta"]
    exps = _exponents(dim)
    one = np.float32(1.0)
    if kind in ("default", "linear"):
        inv = one / _pow(base, exps)
        if kind == "linear":
            inv = (inv / np.float32(params["factor"])).astype(np.float32)
        return inv, 1.0
    if kind == "dynamic":
        factor = params["factor"]
        seq = max(seq_len or max_position_embeddings, max_position_embeddings)
        base = base * ((factor * seq / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
        return one / _pow(base, exps), 1.0
    if kind == "llama3":
        inv = one / _pow(base, exps)
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
        scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if kind == "yarn":
        factor = params.get("factor")
        orig = params["original_max_position_embeddings"]
        if factor is None:
            factor = max_position_embeddings / orig
        attention = params.get("attention_factor")
        if attention is None:
            mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
            attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
                         else _yarn_mscale(factor))
        beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

        def correction_dim(rotations):
            return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if params.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(lo)) / np.float32(hi - lo), 0, 1)
        extrapolation = (1 - ramp).astype(np.float32)
        pos = _pow(base, exps)
        inv_extra, inv_inter = one / pos, one / (np.float32(factor) * pos)
        inv = inv_inter * (1 - extrapolation) + inv_extra * extrapolation
        return inv.astype(np.float32), float(attention)
    if kind == "longrope":
        orig = params["original_max_position_embeddings"]
        factor = params.get("factor")
        if factor is None:
            factor = max_position_embeddings / orig
        attention = params.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = params["long_factor"] if seq_len and seq_len > orig else params["short_factor"]
        inv = one / (np.asarray(ext, dtype=np.float32) * _pow(base, exps))
        return inv.astype(np.float32), float(attention)
    raise ValueError(f"rope_type {kind!r} is not computed by the engine (served: {', '.join(ROPE_TYPES)})")


def context_limit(params: dict | None, max_position_embeddings: int | None) -> int | None:
    """The longest sequence the engine computes as transformers does for these rope parameters,
    when shorter than the model's own limit: ``original_max_position_embeddings`` for longrope,
    ``max_position_embeddings`` for dynamic (see the module's docstring); None otherwise."""
    kind = (params or {}).get("rope_type", "default")
    if kind == "longrope":
        return int(params["original_max_position_embeddings"])
    if kind == "dynamic" and max_position_embeddings:
        return int(max_position_embeddings)
    return None


class RoPE(nn.Module):
    """A rotary embedding over the first ``dims`` features with transformers' frequencies for
    ``params``; called as mlx-lm's rotary modules are, ``rope(x, offset)`` with ``x`` of shape
    ``(batch, heads, length, head size)`` and ``offset`` an int or one offset per batch row."""

    def __init__(self, dims: int, params: dict, max_position_embeddings: int | None, traditional: bool = False):
        super().__init__()
        self.dims, self.traditional, self.max_position_embeddings = dims, traditional, max_position_embeddings
        self.rope_type = params.get("rope_type", "default")
        self._params = MappingProxyType(dict(params))  # not a dict: MLX would walk a dict as a child
        inv, self._scale = inverse_frequencies(params, dims, max_position_embeddings)
        self._freqs = mx.array(np.float32(1.0) / inv)  # mx.fast.rope takes periods, 1 / inv_freq
        self._long = None
        if self.rope_type == "longrope":
            self._switch = int(params["original_max_position_embeddings"])
            inv, self._long_scale = inverse_frequencies(params, dims, max_position_embeddings, self._switch + 1)
            self._long = mx.array(np.float32(1.0) / inv)

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}, rope_type={self.rope_type!r}"

    def _frequencies(self, length: int, offset) -> tuple[mx.array, float]:
        if not isinstance(offset, int):  # a batch cache: one offset per row (see the module's docstring)
            return self._freqs, self._scale
        seq = offset + length
        if self._long is not None and seq > self._switch:
            if 0 < offset <= self._switch:
                raise ValueError(
                    f"longrope: this sequence passes original_max_position_embeddings={self._switch} on top of a "
                    f"cache of {offset} tokens rotated with the short factors; transformers recomputes the whole "
                    "cache with the long factors there, which a cached forward pass cannot. Run the whole sequence "
                    "in one forward pass, or keep it within the limit (the engine caps its context there)")
            return self._long, self._long_scale
        if self.rope_type == "dynamic" and seq > self.max_position_embeddings:
            inv, scale = inverse_frequencies(self._params, self.dims, self.max_position_embeddings, seq)
            return mx.array(np.float32(1.0) / inv), scale
        return self._freqs, self._scale

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        freqs, scale = self._frequencies(x.shape[-2], offset)
        if scale != 1.0:  # transformers scales cos and sin: the rotated features of q and k
            x = x.at[..., : self.dims].multiply(scale) if self.dims < x.shape[-1] else x * scale
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset,
                            freqs=freqs)


def _rope_classes() -> tuple:
    from mlx_lm.models import rope_utils  # mlx_lm imports transformers: only when a model is loaded

    return (nn.RoPE, rope_utils.Llama3RoPE, rope_utils.YarnRoPE, rope_utils.SuScaledRoPE,
            rope_utils.DynamicNTKScalingRoPE)


def swap_ropes(model: nn.Module, params: dict, max_position_embeddings: int | None) -> int:
    """Replace every rotary module of ``model`` (``nn.RoPE`` or one of mlx-lm's scaled variants)
    with a :class:`RoPE` of the same size and layout computing ``params`` as transformers does;
    returns how many were replaced. Rotary modules hold no weights, so this may follow loading."""
    kinds, count = _rope_classes(), 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if isinstance(child, kinds):
                dims = getattr(child, "dims", None) or getattr(child, "dim")
                module[name] = RoPE(dims, params, max_position_embeddings, getattr(child, "traditional", False))
                count += 1
    return count
