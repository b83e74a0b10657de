"""Per-request sampling parameters and a vectorised per-row sampler.

Seeded sampling must not depend on which other rows share the batch, so the random numbers of a
row come from a counter-based hash of (request seed, token position, vocab index) instead of a
shared generator: the same seed and prompt give the same completion alone or in a batch of 64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np


@dataclass
class SamplingParams:
    """How to sample one completion (OpenAI / vLLM names)."""

    max_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        # Every integer ends up in a fixed-width array of the sampler (int32 / uint32 / int64), so
        # each is bounded here: one request must never raise inside the batched step.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= INT32_MAX:
            raise ValueError(f"max_tokens must be an integer in [1, {INT32_MAX}], got {self.max_tokens!r}")
        if not (_is_real(self.temperature) and math.isfinite(self.temperature) and 0 <= self.temperature <= 100):
            raise ValueError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if 0 < self.temperature < TEMPERATURE_EPS:  # as vLLM: logits / 1e-40 overflow float32; greedy instead
            self.temperature = 0.0
        if not (_is_real(self.top_p) and 0 < self.top_p <= 1 and np.float32(self.top_p) > 0):
            raise ValueError(f"top_p must be a number in (0, 1] (and not 0 in float32), got {self.top_p!r}")
        if not _is_int(self.top_k) or not -1 <= self.top_k <= INT32_MAX:
            raise ValueError(f"top_k must be an integer in [-1, {INT32_MAX}] (0 or -1 = off), got {self.top_k!r}")
        if self.top_k == -1:
            self.top_k = 0
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= SEED_MAX):
            raise ValueError(f"seed must be an integer in [0, {SEED_MAX}], got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if any(not isinstance(s, str) or not s for s in self.stop) or len(self.stop) > 16:
            raise ValueError("stop must be up to 16 non-empty strings")


INT32_MAX = 2**31 - 1
SEED_MAX = 2**63 - 1
TEMPERATURE_EPS = 1e-5  # vLLM's _SAMPLING_EPS: smaller temperatures sample greedily


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _fmix32(x: mx.array) -> mx.array:
    # murmur3 finaliser: a cheap, well-mixed integer hash on uint32 lanes.
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


def row_uniforms(seeds: mx.array, positions: mx.array, vocab: int) -> mx.array:
    """Uniforms in (0, 1) of shape (B, vocab), a pure function of (seed, position, index)."""
    v = mx.arange(vocab, dtype=mx.uint32)[None, :]
    h = _fmix32(seeds[:, None] ^ _fmix32(positions[:, None] * 0x9E3779B1 + 0x7F4A7C15))
    return unit(_fmix32(h + v * 0x27D4EB2F))


def unit(x: mx.array) -> mx.array:
    """uint32 -> float32 strictly inside (0, 1). 23 bits: (k + 0.5) / 2**23 is exact in float32;
    24 bits would round the top value to 1.0, and -log(-log(1)) = inf picks that token whatever
    its probability."""
    return ((x >> 9).astype(mx.float32) + 0.5) * (1.0 / (1 << 23))


def _fmix32_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


def row_uniforms_np(seeds: np.ndarray, positions: np.ndarray, vocab: int) -> np.ndarray:
    """NumPy twin of :func:`row_uniforms` (bit-identical)."""
    u32 = np.uint32
    v = np.arange(vocab, dtype=u32)[None, :]
    pos = positions.astype(u32)[:, None]
    h = _fmix32_np(seeds.astype(u32)[:, None] ^ _fmix32_np(pos * u32(0x9E3779B1) + u32(0x7F4A7C15)))
    return unit_np(_fmix32_np(h + v * u32(0x27D4EB2F)))


def unit_np(x: np.ndarray) -> np.ndarray:
    """NumPy twin of :func:`unit`."""
    return ((x >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / (1 << 23))


def sample_np(logits: np.ndarray, temps: np.ndarray, top_ps: np.ndarray, top_ks: np.ndarray,
              seeds: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of :func:`sample`, used on the CPU backend where MLX's exp/log are scalar and
    ~10x slower than NumPy's vectorised ones; same random numbers, so the same tokens."""
    logits = logits.astype(np.float32, copy=False)
    greedy = temps <= 0
    t = np.where(greedy, 1.0, temps).astype(np.float32)[:, None]
    scaled = logits / t
    m = scaled.max(axis=-1, keepdims=True)
    logp = scaled - (m + np.log(np.exp(scaled - m).sum(axis=-1, keepdims=True)))
    tokens = logits.argmax(axis=-1)
    rows = np.flatnonzero(~greedy)
    if rows.size:
        lp = logp[rows]
        k, p = top_ks[rows], top_ps[rows]
        if (k > 0).any() or (p < 1).any():
            order = np.argsort(-lp, axis=-1, kind="stable")
            sorted_lp = np.take_along_axis(lp, order, axis=-1)
            keep = np.ones(sorted_lp.shape, dtype=bool)
            keep &= np.arange(lp.shape[-1])[None, :] < np.where(k > 0, k, lp.shape[-1])[:, None]
            probs = np.exp(sorted_lp)
            keep &= (np.cumsum(probs, axis=-1) - probs) < p[:, None]
            mask = np.empty_like(keep)
            np.put_along_axis(mask, order, keep, axis=-1)
            lp = np.where(mask, lp, -np.inf)
        u = row_uniforms_np(seeds[rows], positions[rows], lp.shape[-1])
        tokens[rows] = (lp - np.log(-np.log(u))).argmax(axis=-1)
    chosen = np.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen


def sample(logits: mx.array, temps: np.ndarray, top_ps: np.ndarray, top_ks: np.ndarray,
           seeds: np.ndarray, positions: np.ndarray) -> tuple[mx.array, mx.array]:
    """Sample one token per row; returns (tokens (B,), logprobs (B,)).

    ``logprobs`` are log-softmax(logits / T) of the chosen token (T = 1 for greedy rows) before any
    top-k/top-p truncation -- the same quantity trl computes for the policy, so importance ratios
    against it are meaningful.
    """
    logits = logits.astype(mx.float32)
    greedy = temps <= 0
    t = mx.array(np.where(greedy, 1.0, temps).astype(np.float32))[:, None]
    scaled = logits / t
    logp = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    if greedy.all():
        tokens = mx.argmax(logits, axis=-1)
    else:
        masked = logp
        vocab = logits.shape[-1]
        if (top_ks > 0).any() or (top_ps < 1).any():
            order = mx.argsort(-logp, axis=-1)
            sorted_lp = mx.take_along_axis(logp, order, axis=-1)
            keep = mx.ones(sorted_lp.shape, dtype=mx.bool_)
            if (top_ks > 0).any():
                k = mx.array(np.where(top_ks > 0, top_ks, vocab).astype(np.int32))[:, None]
                keep = keep & (mx.arange(vocab)[None, :] < k)
            if (top_ps < 1).any():
                cum = mx.cumsum(mx.exp(sorted_lp), axis=-1)
                # keep the smallest prefix whose mass reaches top_p (always at least one token)
                keep = keep & ((cum - mx.exp(sorted_lp)) < mx.array(top_ps.astype(np.float32))[:, None])
            inv = mx.argsort(order, axis=-1)
            keep = mx.take_along_axis(keep, inv, axis=-1)
            masked = mx.where(keep, logp, -mx.inf)
        u = row_uniforms(mx.array(seeds.astype(np.uint32)), mx.array(positions.astype(np.uint32)), vocab)
        gumbel = -mx.log(-mx.log(u))
        drawn = mx.argmax(masked + gumbel, axis=-1)
        tokens = mx.where(mx.array(greedy), mx.argmax(logits, axis=-1), drawn)
    chosen = mx.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen
