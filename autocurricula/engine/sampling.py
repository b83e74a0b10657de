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


def _uniforms_at(row_hash: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """:func:`row_uniforms_np` at chosen vocab indices: ``row_hash`` (n,) is each element's row
    hash, ``cols`` (n,) or broadcastable its index. In-place passes, bit-identical values."""
    u32 = np.uint32
    x = cols.astype(u32) * u32(0x27D4EB2F) + row_hash
    tmp = np.empty_like(x)
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        np.right_shift(x, u32(shift), out=tmp)
        x ^= tmp
        if mult is not None:
            x *= u32(mult)
    x >>= u32(9)
    u = x.astype(np.float32)
    u += np.float32(0.5)
    u *= np.float32(1.0 / (1 << 23))
    return u


def _row_hashes(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    u32 = np.uint32
    pos = positions.astype(u32)
    return _fmix32_np(seeds.astype(u32) ^ _fmix32_np(pos * u32(0x9E3779B1) + u32(0x7F4A7C15)))


def _gumbel_keys(lp: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``lp - log(-log(u))`` in float32 (the Gumbel-max key), computed in place in ``u``."""
    np.log(u, out=u)
    np.negative(u, out=u)
    np.log(u, out=u)
    np.subtract(lp, u, out=u)
    return u


# The largest Gumbel noise a 23-bit uniform can give: -log(-log(1 - 2**-24)) = 16.635; a token
# whose log-probability is more than this below a known key can never win the draw.
_GUMBEL_MAX = 16.7
_DENSE_VOCAB = 16384  # below this, one vectorised pass beats per-row pruning


def _truncated(lp: np.ndarray, k: int, p: float) -> np.ndarray:
    """Indices (ascending) of the top-k / top-p set of one row: the smallest prefix, in stable
    descending order of ``lp``, whose mass reaches ``p`` (at least one token), cut at ``k``.
    Sorts only an upper set of the row, grown until the prefix ends inside it."""
    vocab = lp.shape[0]
    k = k if k > 0 else vocab
    m = min(vocab, max(64, min(k, 1024)))
    while True:
        # an upper set {lp >= t}: its stable sort is exactly the head of the full stable sort
        top = np.flatnonzero(lp >= np.partition(lp, vocab - m)[vocab - m]) if m < vocab else np.arange(vocab)
        order = top[np.argsort(-lp[top], kind="stable")]
        probs = np.exp(lp[order])
        keep = np.arange(order.size) < k
        keep &= (np.cumsum(probs) - probs) < p
        n = int(keep.sum())  # keep is a prefix: cumsum never decreases
        if n < order.size or order.size == vocab:
            return np.sort(order[:n])
        m = min(vocab, 4 * m)


def sample_np(logits: np.ndarray, temps: np.ndarray, top_ps: np.ndarray, top_ks: np.ndarray,
              seeds: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of :func:`sample`, used on the CPU backend where MLX's exp/log run one element
    at a time and NumPy's are vectorised (docs/benchmarks.md); same random numbers, so the same tokens.

    One exp pass over the vocabulary (the log-softmax normaliser); the Gumbel noise is hashed
    only where a token can still win: a row's argmax token gives a key, and tokens whose
    log-probability lies more than the largest possible noise below it are skipped. Top-k/top-p
    sort only the head of a row. Only rows that ask for top-k/top-p are truncated."""
    logits = logits.astype(np.float32, copy=False)
    greedy = temps <= 0
    t = np.where(greedy, 1.0, temps).astype(np.float32)[:, None]
    scaled = logits if (t == 1).all() else logits / t  # x / 1 == x: skip a pass
    m = scaled.max(axis=-1, keepdims=True)
    e = scaled - m
    np.exp(e, out=e)
    lse = m + np.log(e.sum(axis=-1, keepdims=True))
    del e
    tokens = logits.argmax(axis=-1)
    rows = np.flatnonzero(~greedy)
    if rows.size:
        vocab = logits.shape[-1]
        hashes = _row_hashes(seeds[rows], positions[rows])
        cut = (top_ks[rows] > 0) | (top_ps[rows] < 1)
        dense = np.flatnonzero(~cut) if vocab <= _DENSE_VOCAB else np.empty(0, dtype=np.intp)
        if dense.size:  # small vocabularies: every row at once
            r = rows[dense]
            keys = _gumbel_keys(scaled[r] - lse[r], _uniforms_at(hashes[dense, None], np.arange(vocab)[None, :]))
            tokens[r] = keys.argmax(axis=-1)
        for i in np.setdiff1d(np.arange(rows.size), dense):
            r = rows[i]
            if cut[i]:
                lp_row = scaled[r] - lse[r]
                cols = _truncated(lp_row, int(top_ks[r]), float(top_ps[r]))
                lp = lp_row[cols]
            else:
                # only tokens that can beat the argmax token's key (the margin covers rounding)
                top = tokens[r]
                key = _gumbel_keys(scaled[r, top] - lse[r, 0], _uniforms_at(hashes[i], np.array([top])))[0]
                cols = np.flatnonzero(scaled[r] >= key + lse[r, 0] - np.float32(_GUMBEL_MAX))
                lp = scaled[r, cols] - lse[r, 0]
            keys = _gumbel_keys(lp, _uniforms_at(hashes[i], cols))
            tokens[r] = cols[int(keys.argmax())]
    chosen = np.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - lse[:, 0]
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
