"""The model maths of one engine step: batched prefill and decode over a left-padded KV cache.

Runs only on the engine thread. Rows of different players share each forward pass; the
multi-LoRA layers read each row's slot from the shared ``LoraContext``.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, RotatingKVCache

from autocurricula.engine.sampling import sample, sample_np


def make_batch_cache(model, left_padding: list[int]) -> list:
    """One batch cache per layer, left-padded by ``left_padding``: a ``BatchKVCache`` for every
    attention layer and an ``ArraysCache`` (one recurrent state per row) for every recurrent layer.

    A sliding-window layer keeps its full KV rows too: the model masks positions older than its
    window (mlx-lm builds the mask from the cache with ``window_size``), which is exact for every
    row and keeps one cache layout for the prefix cache and row merging."""
    if not hasattr(model, "make_cache"):
        return [BatchKVCache(list(left_padding)) for _ in model.layers]
    out = []
    for c in model.make_cache():
        if type(c) in (KVCache, RotatingKVCache):
            out.append(BatchKVCache(list(left_padding)))
        elif type(c) is ArraysCache:
            out.append(ArraysCache(len(c.cache), left_padding=list(left_padding)))
        else:
            raise NotImplementedError(
                f"the batched engine batches plain, sliding-window and recurrent (ArraysCache) layers; this model "
                f"has a layer with a {type(c).__name__}. See docs/models.md for the families it serves")
    return out


def prefix_cacheable(model) -> bool:
    """True when every layer keeps KV rows: a recurrent layer's state is one summary of the whole
    prefix, which the block-wise prefix cache cannot split, so such models run without it."""
    return all(isinstance(c, BatchKVCache) for c in make_batch_cache(model, [0]))


def _set_slots(engine, rows) -> None:
    slots = [r.slot for r in rows]
    engine.lora.ctx.slots = mx.array(slots, dtype=mx.uint32) if any(slots) else None


def _sample_batch(engine, rows, logits: mx.array) -> tuple[np.ndarray, np.ndarray]:
    params = [r.req.params for r in rows]
    args = dict(
        temps=np.array([p.temperature for p in params], dtype=np.float32),
        top_ps=np.array([p.top_p for p in params], dtype=np.float32),
        top_ks=np.array([p.top_k for p in params], dtype=np.int32),
        seeds=np.array([r.req.seed32 for r in rows], dtype=np.uint32),
        positions=np.array([len(r.req.prompt_ids) + len(r.tokens) for r in rows], dtype=np.uint32),
    )
    if engine.host_sampling:  # CPU backend: logits already live in host memory
        return sample_np(np.array(logits.astype(mx.float32)), **args)
    tokens, logprobs = sample(logits, **args)
    mx.eval(tokens, logprobs)
    return np.array(tokens), np.array(logprobs)


def _sample_rows(engine, rows, logits: mx.array) -> tuple[np.ndarray, np.ndarray, dict[int, Exception]]:
    """Sample every row; returns (tokens, logprobs, errors by row index). When the batched call
    fails, each row is sampled alone (same numbers: sampling is per-row), so one bad request
    fails by itself instead of taking the batch, or the engine, with it."""
    try:
        return (*_sample_batch(engine, rows, logits), {})
    except Exception:
        if len(rows) == 1:
            raise
    tokens, logprobs = np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.float32)
    errors: dict[int, Exception] = {}
    for i, row in enumerate(rows):
        try:
            t, lp = _sample_batch(engine, [row], logits[i : i + 1])
            tokens[i], logprobs[i] = t[0], lp[0]
        except Exception as exc:  # noqa: BLE001 - reported on that request's future
            errors[i] = exc
    return tokens, logprobs, errors


def prefill(engine, rows) -> tuple[np.ndarray, np.ndarray, dict, list]:
    """Run the prompts of ``rows`` (left-padded) and sample each row's first token. Rows whose
    prompt starts with blocks in the engine's prefix cache start from those KV rows: only the
    columns after the shortest reusable prefix are computed (one forward over a common suffix
    width, so a row reuses at most ``len(prompt) - suffix`` cached tokens)."""
    prompts = [r.req.prompt_ids for r in rows]
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    tokens = mx.array(np.array([[0] * pad + p for pad, p in zip(pads, prompts)], dtype=np.int32))
    cache = make_batch_cache(engine.model, pads)
    hits = _prefix_hits(engine, rows)
    suffix = max(len(p) - sum(b.kv.shape[3] for b in h) for p, h in zip(prompts, hits))
    reused = [max(0, len(p) - suffix) for p in prompts]
    start = width - suffix
    # the cache holds the prompt and the rows' first tokens (not a zero-filled 256-step block), so
    # decoding writes in place: a cache exactly as wide as the prompt regrows at the first step
    cap = width + min(256, max(r.req.params.max_tokens for r in rows))
    if any(reused):
        _fill_from_prefix(cache, hits, reused, pads, cap, start)
    else:
        for c in cache:
            c.step = cap
    _set_slots(engine, rows)
    chunk = engine.config.prefill_chunk
    for at in range(start, width - 1, chunk):  # all but the last token: only the cache is needed
        stop = min(at + chunk, width - 1)
        engine.model(tokens[:, at:stop], cache=cache)
        mx.eval([c.state for c in cache])
    logits = engine.model(tokens[:, width - 1 :], cache=cache)[:, -1, :]
    for c in cache:
        c.__dict__.pop("step", None)  # decoding grows the cache in the usual 256-step blocks
    stats = engine.stats
    stats["prefix_query_tokens"] += sum(len(p) for p in prompts)
    stats["prefix_hit_tokens"] += sum(reused)
    stats["prefix_hit_rate"] = round(stats["prefix_hit_tokens"] / max(1, stats["prefix_query_tokens"]), 4)
    tokens, logprobs, errors = _sample_rows(engine, rows, logits)
    return tokens, logprobs, errors, cache


def _prefix_hits(engine, rows) -> list[list]:
    pc = engine.prefix_cache
    if pc is None:
        return [[] for _ in rows]
    # at least the last prompt token is computed: its logits give the first sampled token
    return [pc.lookup(r.kv_key, r.req.prompt_ids, len(r.req.prompt_ids) - 1) for r in rows]


def _fill_from_prefix(cache, hits, reused, pads, cap, start) -> None:
    """Place each row's reused KV rows at its columns ``[pad, start)`` of a cache ``cap`` columns
    wide (built on the host, then one copy into MLX)."""
    some = next(b.kv for h in hits for b in h)
    n_layers, _, heads, _, dim = some.shape
    host = np.zeros((len(hits), n_layers, 2, heads, cap, dim), dtype=some.dtype)
    for r, (h, n, pad) in enumerate(zip(hits, reused, pads)):
        at = pad
        for b in h:
            take = min(b.kv.shape[3], pad + n - at)
            if take <= 0:
                break
            host[r, :, :, :, at : at + take] = b.kv[:, :, :, :take]
            at += take
    for i, c in enumerate(cache):  # one contiguous array each, so decoding writes into it in place
        c.keys, c.values = (_from_host(np.ascontiguousarray(host[:, i, kv])) for kv in (0, 1))
        c._idx = start
        c.offset = c.offset + start


def _to_host(x: mx.array) -> np.ndarray:
    # NumPy has no bfloat16: its bits travel as uint16; on CPU (and unified memory) a view, no copy
    return np.asarray(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x)


def _from_host(a: np.ndarray) -> mx.array:
    return mx.array(a).view(mx.bfloat16) if a.dtype == np.uint16 else mx.array(a)  # KV is never uint16


def gather_blocks(cache, pads: list[int], block: int):
    """``gather`` for :meth:`PrefixCache.insert_many`: the KV rows of ``[(row, start), ...]``
    blocks out of a batch cache (row ``r``'s token ``t`` sits at column ``pads[r] + t``), one
    ``(layers, 2, kv_heads, block, head_dim)`` host array per block, copied by NumPy slicing."""
    def gather(blocks: list[tuple[int, int]]) -> list[np.ndarray]:
        mx.eval([(c.keys, c.values) for c in cache])
        layers = [(_to_host(c.keys), _to_host(c.values)) for c in cache]
        _, heads, _, dim = layers[0][0].shape
        out = []
        for r, s in blocks:
            a = pads[r] + s
            kv = np.empty((len(layers), 2, heads, block, dim), dtype=layers[0][0].dtype)
            for i, (k, v) in enumerate(layers):
                kv[i, 0], kv[i, 1] = k[r, :, a : a + block], v[r, :, a : a + block]
            out.append(kv)
        return out
    return gather


def decode_step(engine, rows) -> tuple[np.ndarray, np.ndarray, dict]:
    """One token for every running row (and the rows whose sampling failed)."""
    last = mx.array(np.array([[r.tokens[-1]] for r in rows], dtype=np.int32))
    _set_slots(engine, rows)
    logits = engine.model(last, cache=engine.scheduler.cache)[:, -1, :]
    return _sample_rows(engine, rows, logits)
