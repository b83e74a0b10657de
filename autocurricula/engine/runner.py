"""The model maths of one engine step: batched prefill and decode over a left-padded KV cache.

Runs only on the engine thread. Rows of different players share each forward pass; the
multi-LoRA layers read each row's slot from the shared ``LoraContext``.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, RotatingKVCache

from autocurricula.engine.sampling import sample, sample_np


class WindowedBatchKVCache(BatchKVCache):
    """A ``BatchKVCache`` of a sliding-window layer: it keeps every KV row, and its masks hide
    positions more than ``window`` tokens back unless the model asks for another window."""

    def __init__(self, window: int, left_padding: list[int]):
        super().__init__(left_padding)
        self.window = window

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs):
        return super().make_mask(N, return_array=return_array, window_size=window_size or self.window, **kwargs)


def make_batch_cache(model, left_padding: list[int]) -> list:
    """One batch cache per layer, left-padded by ``left_padding``: a ``BatchKVCache`` for every
    attention layer and an ``ArraysCache`` (one recurrent state per row) for every recurrent layer.

    A sliding-window layer (mlx-lm's ``RotatingKVCache``) keeps its full KV rows too, and masks
    positions older than its window: exact for every row, and one cache layout for the prefix
    cache and row merging."""
    if not hasattr(model, "make_cache"):
        return [BatchKVCache(list(left_padding)) for _ in model.layers]
    out = []
    for c in model.make_cache():
        if type(c) is KVCache:
            out.append(BatchKVCache(list(left_padding)))
        elif type(c) is RotatingKVCache and not c.keep:  # a kept prefix (attention sinks) is not masked here
            out.append(WindowedBatchKVCache(c.max_size, list(left_padding)))
        elif type(c) is ArraysCache:
            out.append(ArraysCache(len(c.cache), left_padding=list(left_padding)))
        else:
            raise NotImplementedError(
                f"the batched engine batches plain, sliding-window and recurrent (ArraysCache) layers; this model "
                f"has a layer with a {type(c).__name__}. See docs/models.md for the families it serves")
    return out


def _kv_layers(cache) -> list:
    return [c for c in cache if isinstance(c, BatchKVCache)]


def _state_layers(cache) -> list:
    return [c for c in cache if isinstance(c, ArraysCache)]


def _is_stateful(model) -> bool:
    """True when some layer keeps a recurrent state (an ``ArraysCache``)."""
    return bool(_state_layers(make_batch_cache(model, [0])))


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
    """Run the prompts of ``rows`` and sample each row's first token. Rows whose prompt starts
    with blocks in the engine's prefix cache start from those KV rows. Rows are prefilled in
    groups of similar work (:func:`prefill_groups`), each one forward over its rows' longest
    uncached suffix, left-padded; the groups' batch caches are then merged in the order of ``rows``."""
    stateful = engine.prefix_cache is not None and _is_stateful(engine.model)
    hits = _prefix_hits(engine, rows, stateful)
    groups = prefill_groups([len(r.context) - sum(b.kv.shape[3] for b in h) for r, h in zip(rows, hits)],
                            [bool(h) and stateful for h in hits])
    parts = [_forward_prompts(engine, [rows[i] for i in g], [hits[i] for i in g], stateful) for g in groups]
    logits, cache = parts[0]
    if len(parts) > 1:
        for _, more in parts[1:]:
            for mine, new in zip(cache, more):
                mine.extend(new)
        back = mx.array(np.argsort([i for g in groups for i in g]))
        for c in cache:
            c.filter(back)
        logits = mx.concatenate([lg for lg, _ in parts])[back]
    tokens, logprobs, errors = _sample_rows(engine, rows, logits)
    return tokens, logprobs, errors, cache


def prefill_groups(work: list[int], alone: list[bool]) -> list[list[int]]:
    """Rows (by index) prefilled in one forward each: ``work[i]`` is the columns row ``i`` must
    compute (its uncached suffix), and a forward computes its widest row's for every row. Rows
    go widest first, and a row starts a new group where it needs at most half its group's width,
    so padding never more than doubles a row's work; a group keeps its rows in their order.
    ``alone[i]``: a row of a recurrent model that reuses a cached state prefills by itself (a
    state cannot be recomputed part way)."""
    groups: list[list[int]] = []
    for i in sorted((i for i in range(len(work)) if not alone[i]), key=lambda i: -work[i]):
        if groups and 2 * work[i] > work[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(g) for g in groups] + [[i] for i in range(len(work)) if alone[i]]  # rows in order within


def _forward_prompts(engine, rows, hits, stateful: bool) -> tuple[mx.array, list]:
    """The last-position logits of ``rows``' prompts and their batch cache (see :func:`prefill`)."""
    prompts = [r.context for r in rows]  # a resumed row recomputes its tokens too
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    tokens = mx.array(np.array([[0] * pad + p for pad, p in zip(pads, prompts)], dtype=np.int32))
    cache = make_batch_cache(engine.model, pads)
    suffix = max(len(p) - sum(b.kv.shape[3] for b in h) for p, h in zip(prompts, hits))
    reused = [max(0, len(p) - suffix) for p in prompts]
    start = width - suffix
    # the cache holds the prompt and the rows' first tokens (not a zero-filled 256-step block), so
    # decoding writes in place: a cache exactly as wide as the prompt regrows at the first step
    cap = width + min(256, max(r.req.params.max_tokens for r in rows))
    if any(reused):
        _fill_from_prefix(cache, hits, reused, pads, cap, start)
    else:
        for c in _kv_layers(cache):
            c.step = cap
    _set_slots(engine, rows)
    # recurrent states to keep: each row's after the last whole block before its last token
    block = engine.prefix_cache.block if stateful else 0
    marks = {} if not stateful else {
        i: (pads[i] + n, n) for i, p in enumerate(prompts) if (n := (len(p) - 1) // block * block) > reused[i]}
    chunks = set(range(start + engine.config.prefill_chunk, width - 1, engine.config.prefill_chunk)) | {width - 1}
    at = start
    for stop in sorted(chunks | {c for c, _ in marks.values()}):  # all but the last token: only the cache is needed
        if stop not in chunks and not any(c == stop for c, _ in marks.values()):
            continue  # a mark dropped below
        if stop > at:
            engine.model(tokens[:, at:stop], cache=cache)
            mx.eval([_arrays(c) for c in cache])
            at = stop
        if marks and not _state_fits(engine, cache):
            marks = {}
        for i, (column, n) in marks.items():
            if column == stop:
                _keep_state(rows[i], n, _snapshot_state(cache, i))
    logits = engine.model(tokens[:, width - 1 :], cache=cache)[:, -1, :]
    for c in cache:
        c.__dict__.pop("step", None)  # decoding grows the cache in the usual 256-step blocks
    if stateful and _state_fits(engine, cache):
        for i, p in enumerate(prompts):
            if len(p) % block == 0:
                _keep_state(rows[i], len(p), _snapshot_state(cache, i))
    stats = engine.stats
    stats["prefix_query_tokens"] += sum(len(p) for p in prompts)
    stats["prefix_hit_tokens"] += sum(reused)
    stats["prefix_hit_rate"] = round(stats["prefix_hit_tokens"] / max(1, stats["prefix_query_tokens"]), 4)
    return logits, cache


def _arrays(c) -> list:
    return [a for a in c.cache if a is not None] if isinstance(c, ArraysCache) else [c.keys, c.values]


def _state_fits(engine, cache) -> bool:
    """Whether one row's recurrent state takes at most an eighth of the prefix cache: rows hold
    their states until they finish, so a state the cache could keep only a few of is not copied
    (raise ``EngineConfig.prefix_cache_mb`` for such a model)."""
    size = sum(a.nbytes // a.shape[0] for c in _state_layers(cache) for a in c.cache if a is not None)
    return 8 * size <= engine.prefix_cache.capacity


def _snapshot_state(cache, row: int) -> list[list[np.ndarray]]:
    """Host copies of batch row ``row``'s state in every recurrent layer."""
    return [[np.array(_to_host(a[row : row + 1])) for a in c.cache] for c in _state_layers(cache)]


def _keep_state(row, tokens: int, state: list) -> None:
    """Keep ``state`` (after ``tokens`` tokens) on ``row`` for the prefix cache: the one after
    the prompt's last whole block, and the latest one after it (a real model's state takes
    megabytes; an entry reuses only the deepest)."""
    prompt = len(row.req.prompt_ids)
    if tokens > prompt:
        row.states = {n: s for n, s in row.states.items() if n <= prompt}
    row.states[tokens] = state


def _prefix_hits(engine, rows, stateful: bool) -> list[list]:
    pc = engine.prefix_cache
    if pc is None:
        return [[] for _ in rows]
    # at least the last prompt token is computed: its logits give the first sampled token
    return [pc.lookup(r.kv_key, r.context, len(r.context) - 1, stateful) for r in rows]


def _fill_from_prefix(cache, hits, reused, pads, cap, start) -> None:
    """Place each row's reused KV rows at its columns ``[pad, start)`` of a cache ``cap`` columns
    wide (built on the host, then one copy into MLX), and a row's recurrent state from its last
    block (such a row is alone in its batch and reuses whole blocks)."""
    states = _state_layers(cache)
    if states:
        (h,), (n,) = hits, reused
        assert n == sum(b.kv.shape[3] for b in h), "a recurrent state is reused at its block's end only"
        for c, arrays in zip(states, h[-1].state):
            c.cache = [_from_host(a) for a in arrays]
    layers = _kv_layers(cache)
    if not layers:
        return
    some = next(b.kv for h in hits for b in h)
    _, _, heads, _, dim = some.shape
    host = np.zeros((len(hits), len(layers), 2, heads, cap, dim), dtype=some.dtype)
    for r, (h, n, pad) in enumerate(zip(hits, reused, pads)):
        at = pad
        for b in h:
            take = min(b.kv.shape[3], pad + n - at)
            if take <= 0:
                break
            host[r, :, :, :, at : at + take] = b.kv[:, :, :, :take]
            at += take
    for i, c in enumerate(layers):  # one contiguous array each, so decoding writes into it in place
        c.keys, c.values = (_from_host(np.ascontiguousarray(host[:, i, kv])) for kv in (0, 1))
        c._idx = start
        c.offset = c.offset + start


def _to_host(x: mx.array) -> np.ndarray:
    # NumPy has no bfloat16: its bits travel as uint16; on CPU (and unified memory) a view, no copy
    return np.asarray(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x)


def _from_host(a: np.ndarray) -> mx.array:
    return mx.array(a).view(mx.bfloat16) if a.dtype == np.uint16 else mx.array(a)  # KV is never uint16


def prefix_gather(cache, block: int):
    """``gather`` for :meth:`PrefixCache.insert_many`: the KV rows of ``[(row, start), ...]``
    blocks out of a batch cache (row ``r``'s token ``t`` sits at column ``left_padding[r] + t``),
    one ``(attention layers, 2, kv_heads, block, head_dim)`` host array per block, copied by
    NumPy slicing; None when the cache's keys and values differ in shape (one array cannot hold
    both)."""
    layers = _kv_layers(cache)
    if any(c.keys is None or c.keys.shape[-1] != c.values.shape[-1] for c in layers):
        return None
    pads = layers[0].left_padding.tolist() if layers else []

    def gather(blocks: list[tuple[int, int]]) -> list[np.ndarray]:
        mx.eval([(c.keys, c.values) for c in layers])
        kvs = [(_to_host(c.keys), _to_host(c.values)) for c in layers]
        if not kvs:  # recurrent layers only: a block is its tokens and state
            return [np.zeros((0, 2, 0, block, 0), dtype=np.float32) for _ in blocks]
        _, heads, _, dim = kvs[0][0].shape
        out = []
        for r, s in blocks:
            a = pads[r] + s
            kv = np.empty((len(kvs), 2, heads, block, dim), dtype=kvs[0][0].dtype)
            for i, (k, v) in enumerate(kvs):
                kv[i, 0], kv[i, 1] = k[r, :, a : a + block], v[r, :, a : a + block]
            out.append(kv)
        return out
    return gather


def decode_step(engine, rows) -> tuple[np.ndarray, np.ndarray, dict]:
    """One token for every running row (and the rows whose sampling failed)."""
    last = mx.array(np.array([[r.tokens[-1]] for r in rows], dtype=np.int32))
    _set_slots(engine, rows)
    cache = engine.scheduler.cache
    logits = engine.model(last, cache=cache)[:, -1, :]
    out = _sample_rows(engine, rows, logits)
    pc = engine.prefix_cache
    if pc is not None and _state_layers(cache) and _state_fits(engine, cache):  # each block boundary reached
        for i, r in enumerate(rows):
            fed = len(r.req.prompt_ids) + len(r.tokens)
            if fed % pc.block == 0:
                _keep_state(r, fed, _snapshot_state(cache, i))
    return out
