"""The engine: one thread owns every MLX operation of the process.

Callers on any thread submit generation requests, adapter loads/updates/unloads and arbitrary
jobs (e.g. training steps) to the thread's queue and get ``concurrent.futures.Future``s (await
them with ``asyncio.wrap_future``). Between two decode steps the thread runs queued jobs, admits
new requests (prefilled together, then joined to the running batch) and drops finished rows, so
rows of many players share every step (continuous batching) and adapters swap in place.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import math
import queue
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from autocurricula.engine.adapters import AdapterError, AdapterWeights, check_name, from_tensors, load_folder
from autocurricula.engine.cpu_kernels import prepare as prepare_cpu
from autocurricula.engine.errors import EngineDeadError, UnknownPlayerError
from autocurricula.engine.logprobs import completion_logprobs, tree_logprobs
from autocurricula.engine.lora import MultiLoRAModel, linear_dims
from autocurricula.engine.models import load as load_model
from autocurricula.engine.models.tree import enable_tree, tree_fallback
from autocurricula.engine.prefix_cache import PrefixCache
from autocurricula.engine.residency import Residency
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion, Request, Scheduler, TokenEvent, resolve
from autocurricula.engine.slots import SlotTable
from autocurricula.engine.spill import SpilledWeights, write_spill
from autocurricula.records import help_field

__all__ = ["Completion", "Engine", "EngineConfig", "EngineDeadError", "TokenEvent", "UnknownPlayerError"]

log = logging.getLogger(__name__)
_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _shutdown() -> None:
    # MLX needs each thread's streams cleared before the interpreter finalises, or the process
    # aborts at exit ("terminate called without an active exception"; mlx#4327).
    for engine in list(_LIVE):
        engine.close()
    if "mlx.core" in sys.modules:
        sys.modules["mlx.core"].clear_streams()


@dataclass
class EngineConfig:
    """Capacity and limits of one engine."""

    max_slots: int = help_field("adapters resident at once; more players than this are LRU-evicted to host memory", 64)
    max_batch: int = help_field("rows decoded together in one step", 64)
    initial_rank: int = help_field("LoRA rank the stacks start with; grows to the largest adapter loaded (smaller "
                                   "ranks are zero-padded)", 8)
    max_context: int | None = help_field("prompt + completion token limit; default: the model's "
                                         "max_position_embeddings (or 4096)", None)
    prefill_chunk: int = help_field("prompt tokens per prefill forward pass (bounds activation memory)", 512)
    max_prefill_tokens: int = help_field("prompt tokens admitted per prefill, cached ones included (bounds memory and "
                                         "the pause of running rows; rows are prefilled in groups of similar length, "
                                         "so padding at most doubles this)", 8192)
    max_wait_steps: int = help_field("decode steps a request may wait for an adapter slot while requests of resident "
                                     "players pass it; then those queue behind it (no starvation)", 32)
    preempt_after_steps: int | None = help_field("fair admission of requests submitted with a group (the server's): "
                                                 "when every row is taken and a group has fewer rows than its share, "
                                                 "rows of groups above their share that have run this many decode "
                                                 "steps are paused and resume later, so a small request waits at most "
                                                 "about this many steps for a row. None: never pause", 16)
    stuck_after_s: float = help_field("health reports the engine stuck when one step or job runs longer than this",
                                      120.0)
    keep_quantized: bool = help_field("CPU backend only: keep a quantized or bf16/fp16 base as stored instead of "
                                      "converting it to float32 at load (MLX's CPU quantized and half-precision "
                                      "matmuls are 3-14x slower than float32; float32 takes 8x the memory of 4-bit). "
                                      "Metal and CUDA always keep the stored weights", False)
    prefix_cache_mb: float = help_field("memory for KV rows of earlier prompts and completions, reused when a new "
                                        "prompt starts with the same tokens for the same adapter version (chat "
                                        "histories, shared system prompts); least recently used blocks are evicted. 0 "
                                        "turns prefix caching off", 64.0)
    prefix_block: int = help_field("tokens per prefix-cache block: prefixes are matched and reused in whole blocks, "
                                   "so a shared instruction is reused up to its last whole block (smaller blocks "
                                   "reach more of it, at more lookup and copy work per token)", 4)
    cpu_fast_kernels: bool = help_field("CPU backend only: compute SiLU in SwiGLU MLPs with a compiled rational "
                                        "approximation (within 3e-7 * max(1, |x|) of the exact one) instead of MLX's "
                                        "per-element exp", True)

    def __post_init__(self):
        for name in ("max_slots", "max_batch", "initial_rank", "prefill_chunk", "max_prefill_tokens", "max_wait_steps",
                     "prefix_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {v!r}")
        for name in ("keep_quantized", "cpu_fast_kernels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.prefix_cache_mb, bool) or not isinstance(self.prefix_cache_mb, (int, float)) \
                or not self.prefix_cache_mb >= 0:
            raise ValueError(f"EngineConfig.prefix_cache_mb must be a number of megabytes >= 0 (0 turns the prefix "
                             f"cache off), got {self.prefix_cache_mb!r}")
        if self.preempt_after_steps is not None and (not isinstance(self.preempt_after_steps, int)
                                                     or self.preempt_after_steps <= 0):
            raise ValueError(f"EngineConfig.preempt_after_steps must be a positive integer or None, "
                             f"got {self.preempt_after_steps!r}")
        if self.max_context is not None and self.max_context <= 1:
            raise ValueError("EngineConfig.max_context must be > 1 (or None for the model's limit)")


class Engine:
    """Multi-LoRA continuous-batching generator on one MLX thread.

    ``model`` is a Hub id or local folder (loaded with ``mlx_lm.load`` on the engine thread, plus
    the families of :mod:`autocurricula.engine.models`) or an already loaded mlx-lm model (then
    pass ``tokenizer``). docs/models.md lists the families served and those refused.
    """

    def __init__(self, model: Any, tokenizer: Any = None, config: EngineConfig | None = None,
                 name: str | None = None):
        self.config = config or EngineConfig()
        self.name = name or (str(model) if isinstance(model, (str, Path)) else "base")
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # orders "closed" against new submissions
        self._closed = False
        self.scheduler = Scheduler(self)
        self._ids = itertools.count(1)
        self._seed_rng = np.random.default_rng()
        self._encoded, self._decoded = _BoundedCache(max_key=2048), _BoundedCache(max_key=64)  # chars, tokens
        self._stop = False
        self._error: BaseException | None = None
        self._busy_since: float | None = None
        self.slots = SlotTable(self.config.max_slots)
        self.stats = {"steps": 0, "rows_stepped": 0, "tokens": 0, "prefill_tokens": 0, "completions": 0,
                      "swaps_mid_request": 0, "failed": 0,
                      # prompt tokens admitted, and those whose KV rows came from the prefix cache
                      "prefix_query_tokens": 0, "prefix_hit_tokens": 0, "prefix_hit_rate": 0.0,
                      "prefix_cached_tokens": 0, "prefix_evictions": 0,  # tokens held now, blocks evicted
                      "retried": 0,  # requests a failed worker left: none in one process
                      "paused": 0}  # rows paused to give another group a row (fair admission)
        self.prefix_cache = None  # set on the engine thread when EngineConfig.prefix_cache_mb > 0
        ready: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(model, tokenizer, ready),
                                        name="autocurricula-engine", daemon=True)
        self._thread.start()
        try:
            ready.result()  # re-raises a load error in the caller
        except Exception:  # the thread's load error (not a Ctrl-C here, which must not wait)
            # the thread ends at once (it clears its MLX streams): wait for it, or a process that exits
            # on the error can abort ("terminate called without an active exception")
            self._thread.join(timeout=30)
            raise
        _LIVE.add(self)

    # ------------------------------------------------------------------ public API (any thread)
    def submit(self, prompt: str | list[int], player: str | None = None, params: SamplingParams | None = None,
               on_token: Callable[[TokenEvent], None] | None = None, request_id: str | None = None,
               queue_timeout_s: float | None = None, group: str | None = None) -> Future:
        """Queue one completion; returns a Future of :class:`Completion`.

        Raises ``ValueError`` for a prompt that does not fit the context and ``UnknownPlayerError``
        for a player that is not loaded (``player=None`` or the engine's name means the base model).
        ``queue_timeout_s``: a request still queued (not started) after this many seconds fails with
        :class:`~autocurricula.engine.scheduler.QueueTimeoutError` (None: it waits as long as it takes).
        ``group``: requests with a group share the rows fairly between groups
        (:mod:`~autocurricula.engine.scheduler`); None: first come, first served.
        """
        req = self._request(prompt, player, params, on_token, request_id, queue_timeout_s, group)
        self._put(("submit", req))
        return req.future

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        """Queue several completions at once, ``[(prompt, player, params), ...]`` (optionally also
        ``on_token``, ``request_id``, ``queue_timeout_s``, ``group``, as in :meth:`submit`): they are admitted
        together, in this order, so they share their first batch whatever else is queued (the
        arena's lockstep ticks rely on it; with a ``group``, unless other groups wait for rows). All are checked first: one bad request queues none."""
        reqs = [self._request(*r) for r in requests]
        self._put(("submit_many", reqs))
        return [r.future for r in reqs]

    def _request(self, prompt, player=None, params=None, on_token=None, request_id=None,
                 queue_timeout_s=None, group=None) -> Request:
        self._check_alive()
        params = params or SamplingParams()
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt is empty; give at least one token")
        if any(t < 0 or t >= self.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(ids) + params.max_tokens > self.max_context:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context "
                             f"limit of {self.max_context} tokens; shorten the prompt or lower max_tokens")
        if player == self.name:
            player = None
        rec = self.slots.records.get(player) if player is not None else None
        if player is not None and (rec is None or rec.deleted):
            raise UnknownPlayerError(f"unknown player {player!r}; load its adapter first (loaded: {self.players()})")
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(2**63))
        req = Request(request_id or f"cmpl-{next(self._ids)}", ids, player, params, Future(), on_token,
                      (seed ^ (seed >> 32)) & 0xFFFFFFFF,
                      deadline=None if queue_timeout_s is None else time.monotonic() + queue_timeout_s, group=group)
        # a caller cancelling the future (e.g. asyncio.wait_for timing out) stops the generation
        req.future.add_done_callback(lambda f: f.cancelled() and self.cancel(req.id))
        return req

    def generate(self, prompt, player=None, params=None, **sampling) -> Completion:
        """Blocking :meth:`submit`; keyword sampling args build :class:`SamplingParams`."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("generate() would wait for the engine thread on itself; use submit() without "
                               "waiting (or call from another thread)")
        return self.submit(prompt, player, params or SamplingParams(**sampling)).result()

    async def agenerate(self, prompt, player=None, params=None, **sampling) -> Completion:
        """Awaitable :meth:`submit` for asyncio code."""
        return await asyncio.wrap_future(self.submit(prompt, player, params or SamplingParams(**sampling)))

    def cancel(self, request_id: str) -> None:
        """Stop a queued or running request; its future resolves with ``finish_reason="cancelled"``."""
        self._queue.put(("cancel", request_id))

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` on the engine thread between two decode steps.
        Called from the engine thread itself (a job or an ``on_token`` callback), it runs inline."""
        fut: Future = Future()
        if threading.current_thread() is self._thread:
            try:
                fut.set_result(fn(*args, **kwargs))
            except Exception as exc:
                fut.set_exception(exc)
            return fut
        self._check_alive()
        self._put(("job", (fn, args, kwargs), fut))
        return fut

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix. The trainer calls it at each checkpoint, so a run resumed
        from there starts from the same (empty) cache as the uninterrupted run: reused KV rows are
        not bit-identical to recomputed ones, and sampled tokens could otherwise differ."""
        def clear():
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
                self.stats["prefix_cached_tokens"] = 0

        if threading.current_thread() is self._thread or not self._thread.is_alive():
            clear()
        else:
            self.call(clear).result()

    def _put(self, item) -> None:
        with self._lock:
            if self._closed:
                raise EngineDeadError(f"the engine thread is not running ({self._error!r})")
            self._queue.put(item)

    def load_adapter(self, name: str, source: str | Path | AdapterWeights | dict, version: int | None = None) -> int:
        """Load or replace (hot-swap) a player's adapter; returns its new version.

        ``source``: a peft or mlx-lm adapter folder, :class:`AdapterWeights`, or a dict of tensors
        in peft or mlx-lm key format (with ``scale`` given as ``{"scale": s, "tensors": {...}}``).
        """
        check_name(name)
        if name == self.name:
            raise AdapterError(f"{name!r} is the base model's name; choose another player name")
        if isinstance(source, (str, Path)):
            weights = load_folder(source)
        elif isinstance(source, AdapterWeights):
            weights = source
        elif isinstance(source, dict) and isinstance(source.get("tensors"), dict):
            weights = from_tensors({k: np.asarray(v) for k, v in source["tensors"].items()}, scale=source.get("scale"))
        else:
            raise AdapterError("source must be an adapter folder, AdapterWeights, or {'tensors': {...}, 'scale': s}")
        return self.install(name, weights, version)

    update_adapter = load_adapter

    def install(self, name: str, weights: AdapterWeights, version: int | None = None, validate: bool = True) -> int:
        """Install or hot-swap ``weights`` as player ``name``; returns the new version. Runs inline
        when called on the engine thread (in a job such as a training step), else waits for it.
        ``validate=False`` skips the shape/finiteness check (for weights derived from installed ones)."""
        check_name(name)
        if name == self.name:
            raise AdapterError(f"{name!r} is the base model's name; choose another player name")
        if validate:
            weights.validate(self.linear_dims)
        return self.call(self._install, name, weights, version).result()

    def training_stacks(self, paths, rank: int):
        """Context manager for a training forward, on the engine thread only: makes ``paths`` (module
        paths) multi-LoRA layers with stacks at least ``rank`` wide, and yields a
        :class:`~autocurricula.engine.lora.StackOverride` to put differentiable per-player stacks in
        place (``.set``) and route rows to them (``.route``). On exit the serving stacks are back,
        so decoding continues with the installed adapters."""
        if threading.current_thread() is not self._thread:
            raise RuntimeError("training_stacks() runs on the engine thread: call it inside engine.call(job)")
        return self.lora.overridden(paths, rank)

    def token_logprobs(self, ids, pos, tgt, temperature: float, entropy: bool = False):
        """On the engine thread, inside :meth:`training_stacks`: the differentiable log-probabilities
        (rows, T) of tokens ``tgt`` at positions ``pos`` of ``ids`` (MLX arrays) under the rows'
        current routing, from logits divided by ``temperature``; with ``entropy``, also each
        position's entropy. The update's forward; the same computation as :meth:`completion_logprobs`."""
        return completion_logprobs(self.model, ids, pos, tgt, temperature, entropy=entropy)

    @property
    def num_layers(self) -> int:
        """The model's transformer blocks (the depth a float32 tolerance grows with)."""
        return len(self.model.layers)

    def tree_pair_cost(self) -> float:
        """One attention score of a tree-packed forward, in units of one token's work: the FLOPs of
        a score (q.k and p.v, every head and layer) over a token's linear FLOPs. Tree packing cuts
        its tries where their dense ancestor mask would cost more than sharing saves
        (:func:`~autocurricula.training.packing.tree_chunks`)."""
        args = self.model.args
        heads = args.num_attention_heads
        head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
        linear = sum(i * o for i, o in self.linear_dims.values())
        return 4 * self.num_layers * heads * head_dim / max(1, 2 * linear)

    def tree_fallback(self) -> str | None:
        """Why this model's update cannot run tree-packed (its rows are then packed one by one), or
        None where :meth:`tree_logprobs` is exact."""
        return tree_fallback(self.model_type)

    def tree_logprobs(self, ids, positions, tin, tout, pick, tgt, temperature: float, entropy: bool = False):
        """:meth:`token_logprobs` for rows packed as prefix trees (see
        :func:`~autocurricula.engine.logprobs.tree_logprobs`), on the engine thread, inside
        :meth:`training_stacks`; each tree is a batch row routed like one."""
        if not self._tree_ready:
            enable_tree(self.model)
            self._tree_ready = True
        return tree_logprobs(self.model, ids, positions, tin, tout, pick, tgt, temperature, entropy=entropy)

    def unload_adapter(self, name: str) -> None:
        """Remove a player; rows already running finish with its weights first."""
        rec = self.slots.records.get(name)
        if rec is None or rec.deleted:
            raise UnknownPlayerError(f"unknown player {name!r}")
        self.call(self._unload, name).result()

    def players(self) -> list[str]:
        return sorted(n for n, r in list(self.slots.records.items()) if not r.deleted)

    def sync_from(self, engine) -> dict:
        """Nothing to mirror: the trainer's engine is the one that plays. Returns
        ``{"pushed": [], "dropped": []}`` as a fleet's sync does."""
        return {"pushed": [], "dropped": []}

    def make_updater(self, engine, grpo_config=None) -> None:
        """None: the trainer builds its in-process :class:`~autocurricula.training.Updater`."""
        return None

    def adapter_info(self, name: str) -> dict:
        rec = self.slots.records.get(name)
        if rec is None:
            raise UnknownPlayerError(f"unknown player {name!r}")
        return {"name": name, "version": rec.version, "rank": rec.weights.rank, "scale": rec.weights.scale,
                "resident": rec.slot is not None, "modules": len(rec.weights.modules),
                "spilled": isinstance(rec.weights, SpilledWeights)}

    def adapter_weights(self, name: str) -> AdapterWeights:
        """The host copy of a player's current weights (what export, checkpoints and the updater
        read; read back from disk when spilled); ``UnknownPlayerError`` when none is held (a player
        unloaded while its last rows still run is still held)."""
        rec = self.slots.records.get(name)
        if rec is None:
            raise UnknownPlayerError(f"unknown player {name!r}")
        return self.residency.host_weights(rec)

    def spill_adapter(self, name: str, folder: str | Path) -> bool:
        """Write a player's host weights to a file in ``folder`` and free them; the player stays
        loaded, and a slot that needs it reads the file back (checked against its hash). False, and
        nothing changes, while a queued or running request uses the player."""
        rec = self.slots.records.get(name)
        if rec is None or rec.deleted:
            raise UnknownPlayerError(f"unknown player {name!r}")
        weights = rec.weights
        if isinstance(weights, SpilledWeights):
            return True
        spilled = write_spill(weights, folder, name)  # here, not on the engine thread: decoding goes on
        return self.call(self.residency.spill, name, weights, spilled, self.scheduler.wants).result()

    def logits(self, ids: list[int], player: str | None = None):
        """Full-sequence logits (numpy, (len(ids), vocab)) under a player's adapter, for tests and
        evaluation; runs as a job between decode steps."""
        if player == self.name:
            player = None
        if player is not None and player not in self.slots.records:
            raise UnknownPlayerError(f"unknown player {player!r}")
        return self.call(self._logits, list(ids), player).result()

    def _logits(self, ids, player):
        rec = None
        if player is not None:
            rec = self.residency.acquire(player)
            if rec is None:
                raise RuntimeError("every adapter slot is pinned by running rows; retry when they finish")
        try:
            self.lora.ctx.slots = mx.array([rec.slot], dtype=mx.uint32) if rec else None
            out = self.model(mx.array([ids], dtype=mx.int32))[0].astype(mx.float32)
            mx.eval(out)
            return np.array(out)
        finally:
            self.lora.ctx.slots = None
            if rec is not None:
                self.slots.release(player)

    def completion_logprobs(self, pairs: list[tuple[list[int], list[int]]], player: str | None = None,
                            temperature: float = 1.0) -> list[float]:
        """For each ``(prompt_ids, completion_ids)``, the sum of the completion's token log-probabilities
        after its prompt under a player's adapter (``None`` = the base model), from logits divided by
        ``temperature`` as sampling and the update use them. Right-padded batches of 64 rows, the LM
        head applied at completion positions only, one job between decode steps (branch credit
        scores a state's legal moves with it)."""
        if player == self.name:
            player = None
        if player is not None and player not in self.slots.records:
            raise UnknownPlayerError(f"unknown player {player!r}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        bad = [i for i, (p, c) in enumerate(pairs) if not p or not c]
        if bad:
            raise ValueError(f"pairs {bad[:5]} have an empty prompt or completion; each needs at least one token "
                             f"of both")
        pairs = [(list(p), list(c)) for p, c in pairs]
        return self.call(self._completion_logprobs, pairs, player, float(temperature)).result()

    def _completion_logprobs(self, pairs, player, temperature, rows: int = 64):
        rec = None
        if player is not None:
            rec = self.residency.acquire(player)
            if rec is None:
                raise RuntimeError("every adapter slot is pinned by running rows; retry when they finish")
        out = []
        try:
            for start in range(0, len(pairs), rows):
                chunk = pairs[start:start + rows]
                width = max(len(p) + len(c) for p, c in chunk) - 1  # inputs: every token but the last
                steps = max(len(c) for _, c in chunk)
                ids = np.zeros((len(chunk), width), dtype=np.int32)  # right padding: causal rows never see it
                pos = np.zeros((len(chunk), steps), dtype=np.int32)
                tgt = np.zeros((len(chunk), steps), dtype=np.int32)
                mask = np.zeros((len(chunk), steps), dtype=np.float64)
                for i, (p, c) in enumerate(chunk):
                    seq = p + c
                    ids[i, :len(seq) - 1] = seq[:-1]
                    pos[i, :len(c)] = np.arange(len(p) - 1, len(p) - 1 + len(c))
                    tgt[i, :len(c)] = c
                    mask[i, :len(c)] = 1.0
                self.lora.ctx.slots = mx.array([rec.slot] * len(chunk), dtype=mx.uint32) if rec else None
                logp = completion_logprobs(self.model, mx.array(ids), mx.array(pos), mx.array(tgt), temperature)
                mx.eval(logp)
                out.extend((np.array(logp, dtype=np.float64) * mask).sum(axis=1).tolist())
        finally:
            self.lora.ctx.slots = None
            if rec is not None:
                self.slots.release(player)
        return out

    def decode(self, ids: list[int]) -> str:
        """Token ids to text, special tokens dropped (what completions report)."""
        key = tuple(ids)
        text = self._decoded.get(key)
        if text is None:
            text = self._decoded.put(key, self.tokenizer.decode(ids, skip_special_tokens=True))
        return text

    def encode(self, text: str) -> list[int]:
        """Text to token ids; games repeat their prompts, so results are cached (bounded)."""
        ids = self._encoded.get(text)
        if ids is None:
            ids = self._encoded.put(text, tuple(self.tokenizer.encode(text)))
        return list(ids)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def health(self) -> dict:
        """``ok`` is False when the thread died or one step/job has run past ``stuck_after_s``."""
        alive = self._thread.is_alive() and self._error is None
        busy = self._busy_since
        stuck = busy is not None and time.monotonic() - busy > self.config.stuck_after_s
        return {"ok": alive and not stuck, "alive": alive, "stuck": stuck,
                "error": repr(self._error) if self._error else None,
                "running": len(self.scheduler.rows), "queued": len(self.scheduler.pending) + self._queue.qsize()}

    @property
    def occupancy(self) -> float:
        """Mean rows per decode step over ``max_batch`` since start."""
        return self.stats["rows_stepped"] / max(1, self.stats["steps"]) / self.config.max_batch

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still queued or running fail with :class:`EngineDeadError`."""
        self._stop = True
        self._queue.put(("wake",))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_alive(self):
        if self._error is not None or not self._thread.is_alive():
            raise EngineDeadError(f"the engine thread is not running ({self._error!r})")

    # ------------------------------------------------------------------ engine thread
    def _main(self, model, tokenizer, ready: Future) -> None:
        try:
            self._serve(model, tokenizer, ready)
        finally:
            mx.clear_streams()  # this thread's streams; see _shutdown

    def _serve(self, model, tokenizer, ready: Future) -> None:
        try:
            self._setup(model, tokenizer)
        except BaseException as exc:  # surfaced to the constructor
            self._error = exc
            self._closed = True
            ready.set_exception(exc)
            return
        ready.set_result(True)
        try:
            while not self._stop:
                self._drain(block=self.scheduler.idle)
                self._busy_since = time.monotonic()
                self.scheduler.admit()
                if self.scheduler.rows:
                    self.scheduler.step()
                self._busy_since = None
        except BaseException as exc:  # noqa: BLE001 - a dead engine must fail every waiter
            log.exception("engine thread died")
            self._error = exc
        finally:
            reason = EngineDeadError(f"engine thread died: {self._error!r}" if self._error else "engine closed")
            with self._lock:
                self._closed = True
            self.scheduler.fail_all(reason)
            while True:  # nothing can be queued after _closed: settle what is there
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "submit":
                    resolve(item[1].future, exc=reason)
                elif item[0] == "job":
                    resolve(item[2], exc=reason)

    def _setup(self, model, tokenizer) -> None:
        # runner imports mlx_lm, and with it transformers: loaded on the engine thread, not on import
        from autocurricula.engine.runner import make_batch_cache

        if isinstance(model, (str, Path)):
            model, tokenizer = load_model(str(model))  # mlx-lm's loader, plus OPT and named refusals
        if tokenizer is None:
            raise ValueError("pass the tokenizer together with an already loaded model")
        self.model, self.tokenizer = model, tokenizer
        self._tree_ready = False  # rotary modules wrapped for tree-packed forwards (on first use)
        self.cpu_paths = prepare_cpu(model, keep_quantized=self.config.keep_quantized,
                                     fast_kernels=self.config.cpu_fast_kernels)
        log.info("engine %s on %s: weights %s, fast SiLU in %d MLPs", self.name, self.cpu_paths["backend"],
                 self.cpu_paths["weights"], self.cpu_paths["fast_silu_mlps"])
        make_batch_cache(model, [0])  # fails early for unsupported cache types
        self.lora = MultiLoRAModel(model, self.config.max_slots + 1, self.config.initial_rank)
        self.residency = Residency(self.slots, self.lora, self.config.initial_rank)
        if self.config.prefix_cache_mb > 0:
            self.prefix_cache = PrefixCache(int(self.config.prefix_cache_mb * 2**20), self.config.prefix_block)
            self.residency.on_change.append(self.prefix_cache.forget)  # new or dropped weights: stale KV
        self.linear_dims = {p: linear_dims(m) for p, m in self.lora.linear_paths().items()}
        args = getattr(model, "args", None)
        # the family (config.json's model_type), which picks the default LoRA targets (LoraSpec.resolve)
        self.model_type = getattr(model, "model_type", None) or getattr(args, "model_type", None)
        limit = getattr(args, "max_position_embeddings", None) or 4096
        # longrope / dynamic rotary embeddings are computed as transformers computes them up to this
        # length only (autocurricula/engine/models/rope.py): the context stops there
        rope_limit = getattr(model, "rope_context_limit", None)
        if rope_limit:
            if self.config.max_context and self.config.max_context > rope_limit:
                raise ValueError(f"EngineConfig.max_context={self.config.max_context} is longer than the "
                                 f"{rope_limit} tokens this model's rotary embeddings are computed as transformers "
                                 "computes them (docs/models.md, 'Config formats and RoPE types'); lower it")
            limit = min(int(limit), int(rope_limit))
        self.max_context = self.config.max_context or int(limit)
        self.vocab_size = int(getattr(args, "vocab_size", 0) or model(mx.zeros((1, 1), dtype=mx.int32)).shape[-1])
        self.host_sampling = mx.default_device().type == mx.DeviceType.cpu
        eos = getattr(tokenizer, "eos_token_ids", None) or {tokenizer.eos_token_id}
        self.eos_ids = {int(e) for e in eos if e is not None}

    def _drain(self, block: bool) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.25) if block else self._queue.get_nowait()
            except queue.Empty:
                return
            block = False
            kind = item[0]
            if kind in ("submit", "submit_many"):
                for req in item[1] if kind == "submit_many" else [item[1]]:
                    if not req.future.done():  # not cancelled by its caller meanwhile
                        self.scheduler.pending.append(req)
            elif kind == "cancel":
                self.scheduler.cancel(item[1])
            elif kind == "job":
                (fn, args, kwargs), fut = item[1], item[2]
                if fut.set_running_or_notify_cancel():
                    self._busy_since = time.monotonic()
                    try:
                        fut.set_result(fn(*args, **kwargs))
                    except Exception as exc:  # the job's error belongs to its caller
                        fut.set_exception(exc)
                    except BaseException as exc:  # SystemExit & co. end the engine; settle the job first
                        fut.set_exception(exc)
                        raise
                    finally:
                        self._busy_since = None

    # adapters ----------------------------------------------------------
    def _install(self, name: str, weights: AdapterWeights, version: int | None = None) -> int:
        return self.residency.install(name, weights, version)

    def _unload(self, name: str) -> None:
        rec = self.slots.records.get(name)
        if rec is None:
            return
        rec.deleted = True
        for req in self.scheduler.pending:  # queued before the unload: still served with these weights
            if req.player == name:
                req.keep = True
        self.scheduler.maybe_drop(name)

    def _write_slot(self, rec) -> None:
        self.residency.write(rec)


class _BoundedCache:
    """A dict that empties itself when full: tokenizer calls cost more than the game logic around
    them, and single dict operations are safe across the engine and event-loop threads. Keys
    longer than ``max_key`` (long free-text prompts, which rarely repeat) are not kept."""

    def __init__(self, max_items: int = 65536, max_key: int = 1024):
        self.max_items, self.max_key, self._data = max_items, max_key, {}

    def get(self, key):
        return self._data.get(key)

    def put(self, key, value):
        if len(key) > self.max_key:
            return value
        if len(self._data) >= self.max_items:
            self._data = {}
        self._data[key] = value
        return value
