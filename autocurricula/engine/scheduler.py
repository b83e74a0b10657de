"""Continuous batching: admit queued requests, step the running rows, stream, retire.

Owned by the engine thread. Admission has two budgets (batch rows and prompt tokens per prefill;
the prefill groups rows of similar length, so short prompts do not pad to a long one's width). A
request that finds every adapter slot pinned waits; requests of players already in a slot may
pass it, which keeps batches full, but only for ``max_wait_steps`` decode steps: after that,
later requests needing a slot wait behind it, so a busy player cannot starve another.

Requests without a ``group`` are admitted first come, first served. Requests with one (the
server gives each HTTP request its own) share the rows fairly: free rows go round-robin to the
group holding the fewest, and when every row is taken while a group holds less than its share
(``max_batch`` over the groups present), rows of groups above their share that have run
``preempt_after_steps`` decode steps are paused: their KV rows go to the prefix cache, they
rejoin the queue, and they resume later from their prompt and the tokens they already have. So
a small request waits at most that many steps for a row, however large a batch is running.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from autocurricula.engine.adapters import AdapterError
from autocurricula.engine.errors import UnknownPlayerError
from autocurricula.engine.sampling import SamplingParams

log = logging.getLogger(__name__)


def resolve(fut: Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Set a future's outcome unless it is already settled (e.g. cancelled by its caller)."""
    if fut.done():
        return
    try:
        fut.set_exception(exc) if exc is not None else fut.set_result(result)
    except InvalidStateError:  # settled between the check and the set
        pass


class RequestError(RuntimeError):
    """Generating this one request failed (its cause is chained); the engine keeps serving the others."""


class QueueTimeoutError(RuntimeError):
    """A request waited in the queue past its ``queue_timeout_s`` without starting; nothing ran."""


@dataclass
class Completion:
    """One finished generation. ``version_spans`` lists ``(start, end, version)`` over completion
    token indices: more than one span means the adapter was hot-swapped mid-completion."""

    request_id: str
    player: str | None
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    adapter_version: int | None
    version_spans: list[tuple[int, int, int | None]]

    @property
    def swapped(self) -> bool:
        return len(self.version_spans) > 1


@dataclass
class TokenEvent:
    """Streamed to ``on_token`` (on the engine thread: keep the callback cheap)."""

    request_id: str
    token_id: int | None  # None on a final event that carries no new token (cancellation)
    logprob: float | None
    text: str  # new text since the previous event (held back while a character or stop string is incomplete)
    version: int | None
    finish_reason: str | None = None


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    player: str | None
    params: SamplingParams
    future: Future
    on_token: Callable[[TokenEvent], None] | None
    seed32: int
    cancelled: bool = False
    keep: bool = False  # queued before its player was unloaded: still served with those weights
    blocked_at: int | None = None  # decode step when it first found every slot pinned
    deadline: float | None = None  # monotonic time by which it must start, else QueueTimeoutError
    group: str | None = None  # fair admission: rows are shared between groups (None: first come, first served)
    paused: "Row | None" = None  # its row, paused to give another group a row; resumes from its tokens


@dataclass
class Row:
    req: Request
    slot: int
    kv_key: tuple = (None, 0)  # (player, adapter version) its KV rows are computed with
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)
    text: str = ""  # decoded so far (incrementally), cut at a stop string
    prefix: int = 0  # incremental detokenizer offsets (as in TGI / vLLM)
    read: int = 0
    checked: int = 0  # characters already searched for stop strings
    emitted: int = 0  # characters already streamed
    finish: str | None = None
    cut: bool = False  # text was cut at a stop string
    error: BaseException | None = None  # set with finish="error": the future gets it instead of a completion
    states: dict = field(default_factory=dict)  # tokens fed -> recurrent layers' state then, for the prefix cache
    since: int = 0  # decode step at which it joined (or rejoined) the batch

    @property
    def context(self) -> list[int]:
        """What the next forward pass conditions on: the prompt, then every token generated so far."""
        return self.req.prompt_ids + self.tokens


class Scheduler:
    def __init__(self, engine: Any):  # the Engine that owns this scheduler
        self.e = engine
        self.pending: list[Request] = []
        self.rows: list[Row] = []
        self.cache = None

    @property
    def idle(self) -> bool:
        return not self.rows and not self.pending

    # ------------------------------------------------------------------ queue side
    def cancel(self, request_id: str) -> None:
        for req in list(self.pending):
            if req.id == request_id:
                self.pending.remove(req)
                row = req.paused or Row(req, 0)
                row.finish = "cancelled"
                resolve(req.future, self._completion(row))
                self.maybe_drop(req.player)
        for row in self.rows:
            if row.req.id == request_id:
                row.req.cancelled = True

    def fail_all(self, exc: BaseException) -> None:
        for req in [r.req for r in self.rows] + self.pending:
            resolve(req.future, exc=exc)
        self.rows, self.pending, self.cache = [], [], None

    def maybe_drop(self, player: str | None) -> None:
        """Remove an unloaded player once no running row and no queued request needs it."""
        rec = self.e.slots.records.get(player) if player else None
        if rec is not None and rec.deleted and rec.pins == 0 and not self.wants(player):
            self.e.residency.drop(rec)

    def wants(self, player: str) -> bool:
        """Whether a queued request (paused rows included) names ``player``."""
        return any(r.player == player for r in self.pending)

    # ------------------------------------------------------------------ admission
    def admit(self) -> None:
        from autocurricula.engine.runner import prefill  # runner: mlx_lm and transformers, not on import

        e, cfg = self.e, self.e.config
        self._expire()
        self._rebalance()
        room = cfg.max_batch - len(self.rows)
        if room <= 0 or not self.pending:
            return
        admitted: list[Row] = []
        waiting: list[Request] = []
        budget, blocked = cfg.max_prefill_tokens, False
        for req in self._fair_order():
            size = len(req.prompt_ids) + (len(req.paused.tokens) if req.paused else 0)
            if len(admitted) >= room or (admitted and size > budget):
                waiting.append(req)
                continue
            slot, version = 0, 0
            if req.player is not None:
                rec = e.slots.records.get(req.player)
                if rec is None or (rec.deleted and not req.keep):
                    resolve(req.future, exc=UnknownPlayerError(f"unknown player {req.player!r} (unloaded)"))
                    continue
                try:
                    rec = None if blocked else e.residency.acquire(req.player)
                except AdapterError as exc:  # its weights cannot be read back: this request fails alone
                    self._fail(req, exc, pinned=False)
                    continue
                if rec is None:  # every slot is pinned by running rows: wait for one
                    if req.blocked_at is None:
                        req.blocked_at = e.stats["steps"]
                    # waited too long: later slot users queue behind it until it gets a slot
                    blocked = blocked or e.stats["steps"] - req.blocked_at >= cfg.max_wait_steps
                    waiting.append(req)
                    continue
                slot, version = rec.slot, rec.version
            row, req.paused, req.deadline = req.paused or Row(req, slot), None, None  # started: no queue deadline
            row.slot, row.kv_key, row.since = slot, (req.player, version), e.stats["steps"]
            admitted.append(row)
            budget -= size
        self.pending = waiting
        if not admitted:
            return
        try:
            tokens, logprobs, errors, cache = prefill(e, admitted)
        except Exception as exc:  # the forward pass of these prompts failed: fail them, keep serving
            log.exception("prefill of %d request(s) failed", len(admitted))
            for row in admitted:
                self._fail(row.req, exc)
            return
        except BaseException:
            for row in admitted:  # give the pins back and requeue, so nothing is lost or leaked
                if row.req.player is not None:
                    e.slots.release(row.req.player)
                if row.tokens:
                    row.req.paused = row
            self.pending = [r.req for r in admitted] + self.pending
            raise
        e.stats["prefill_tokens"] += sum(len(r.context) for r in admitted)
        if self.cache is None:
            self.cache = cache
        else:
            for mine, new in zip(self.cache, cache):
                mine.extend(new)
        self.rows.extend(admitted)
        self.accept(admitted, tokens, logprobs, errors)

    def _fair_order(self) -> list[Request]:
        """The queue in admission order: first come, first served, except that requests with a
        group take turns, the group holding the fewest rows first (ties: the earliest queued)."""
        if not any(r.group is not None for r in self.pending):
            return self.pending
        held = Counter(row.req.group for row in self.rows)
        queues: dict = {}
        for req in self.pending:
            queues.setdefault(req.group if req.group is not None else ("", req.id), []).append(req)
        heap = [(held[g], i, g) for i, g in enumerate(queues)]
        heapq.heapify(heap)
        order, heads = [], dict.fromkeys(queues, 0)
        while heap:
            n, i, g = heapq.heappop(heap)
            order.append(queues[g][heads[g]])
            heads[g] += 1
            if heads[g] < len(queues[g]):
                heapq.heappush(heap, (n + 1, i, g))
        return order

    def _rebalance(self) -> None:
        """When every row is taken and a group waits with fewer rows than its share, pause rows of
        the groups above their share (those that have run ``preempt_after_steps`` steps, the
        shortest first: the cheapest to resume), one for each row the waiting groups lack."""
        e, cfg = self.e, self.e.config
        after = cfg.preempt_after_steps
        if after is None or len(self.rows) < cfg.max_batch or not any(r.group is not None for r in self.pending):
            return
        held = Counter(row.req.group for row in self.rows)
        asking = Counter(r.group for r in self.pending if r.group is not None)
        groups = set(asking) | set(held)
        share = max(1, cfg.max_batch // len(groups))
        need = sum(min(n, share - held[g]) for g, n in asking.items() if held[g] < share)
        if need <= 0:
            return
        now = e.stats["steps"]
        movable = sorted((i for i, row in enumerate(self.rows)
                          if row.req.group is not None and held[row.req.group] > share and now - row.since >= after
                          and not row.finish), key=lambda i: len(self.rows[i].context))
        chosen = []
        for i in movable:
            g = self.rows[i].req.group
            if len(chosen) < need and held[g] > share:
                held[g] -= 1
                chosen.append(i)
        if chosen:
            self.pause(chosen)

    def pause(self, indices: list[int]) -> None:
        """Take running rows out of the batch and queue them in front, to resume from their tokens."""
        e = self.e
        if e.prefix_cache is not None:  # their KV rows, so resuming recomputes little
            self._cache_prefixes(indices)
        rows = [self.rows[i] for i in sorted(indices)]
        for row in rows:
            row.req.paused = row
            if row.req.player is not None:
                e.slots.release(row.req.player)
        self._remove(indices)
        self.pending = [row.req for row in rows] + self.pending
        e.stats["paused"] += len(rows)

    def _expire(self) -> None:
        """Settle queued requests whose start deadline has passed, so a long queue answers its
        clients instead of holding them."""
        if not any(r.deadline is not None for r in self.pending):
            return
        now, kept = time.monotonic(), []
        for req in self.pending:
            if req.deadline is not None and now > req.deadline:
                resolve(req.future, exc=QueueTimeoutError(f"request {req.id} waited in the queue past its limit "
                                                          "without starting"))
                self.maybe_drop(req.player)
            else:
                kept.append(req)
        self.pending = kept

    def step(self) -> None:
        from autocurricula.engine.runner import decode_step  # runner: mlx_lm and transformers, not on import

        try:
            tokens, logprobs, errors = decode_step(self.e, self.rows)
        except Exception as exc:  # the shared forward pass failed: its rows fail, the engine goes on
            log.exception("decode step of %d row(s) failed", len(self.rows))
            for row in self.rows:
                row.error, row.finish = exc, "error"
            self.retire(list(range(len(self.rows))))
            return
        self.e.stats["steps"] += 1
        self.e.stats["rows_stepped"] += len(self.rows)
        self.accept(self.rows, tokens, logprobs, errors)

    def _fail(self, req: Request, exc: BaseException, pinned: bool = True) -> None:
        """Settle a request that never joined the batch with ``exc``, releasing its slot pin (when
        it holds one)."""
        err = RequestError(f"request {req.id} failed: {exc!r}")
        err.__cause__ = exc
        resolve(req.future, exc=err)
        self.e.stats["failed"] += 1
        if req.player is not None:
            if pinned:
                self.e.slots.release(req.player)
            self.maybe_drop(req.player)

    # ------------------------------------------------------------------ per-token bookkeeping
    def accept(self, rows: list[Row], tokens: np.ndarray, logprobs: np.ndarray,
               errors: dict[int, BaseException] | None = None) -> None:
        """Append one sampled token per row, stream it, and retire rows that are done. A row whose
        sampling (``errors``) or bookkeeping raises fails alone."""
        for i, (row, tok, lp) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist())):
            if errors and i in errors:
                row.error, row.finish = errors[i], "error"
                continue
            try:
                self._accept_one(row, tok, lp)
            except Exception as exc:  # noqa: BLE001 - e.g. detokenising; reported on that request
                log.exception("request %s failed", row.req.id)
                row.error, row.finish = exc, "error"
        done = [i for i, r in enumerate(self.rows) if r.finish]
        if done:
            self.retire(done)

    def _accept_one(self, row: Row, tok: int, lp: float) -> None:
        e = self.e
        req, p = row.req, row.req.params
        if req.cancelled:  # the token sampled after the cancel is dropped
            row.finish = "cancelled"
            self._emit(row, None, None)
            return
        rec = e.slots.records.get(req.player) if req.player else None
        row.tokens.append(tok)
        row.logprobs.append(lp)
        row.versions.append(rec.version if rec else None)
        if rec and len(row.versions) > 1 and row.versions[-2] != row.versions[-1]:
            e.stats["swaps_mid_request"] += 1
        e.stats["tokens"] += 1
        if tok in e.eos_ids and not p.ignore_eos:
            row.finish = "stop"
        elif len(row.tokens) >= p.max_tokens or len(req.prompt_ids) + len(row.tokens) >= e.max_context:
            row.finish = "length"
        if p.stop or req.on_token is not None:
            self._advance_text(row)
            for s in p.stop:
                at = row.text.find(s, max(0, row.checked - len(s) + 1))
                if at >= 0:
                    row.text, row.finish, row.cut = row.text[:at], "stop", True
                    break
            row.checked = len(row.text)
        self._emit(row, tok, lp)

    def _advance_text(self, row: Row) -> None:
        # decode only a short suffix each token: text grows when the new suffix decodes cleanly
        if row.cut:
            return
        ids = [t for t in row.tokens if t not in self.e.eos_ids]
        prefix = self.e.decode(ids[row.prefix : row.read])
        full = self.e.decode(ids[row.prefix :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            row.text += full[len(prefix) :]
            row.prefix, row.read = row.read, len(ids)

    def _final_text(self, row: Row) -> str:
        return row.text if row.cut else self.e.decode([t for t in row.tokens if t not in self.e.eos_ids])

    def _emit(self, row: Row, tok, lp) -> None:
        req = row.req
        if req.on_token is None:
            return
        if row.finish:
            text = self._final_text(row)
            safe = len(text)
        else:
            text, safe = row.text, len(row.text)
            if req.params.stop:  # a stop string may still be forming at the end
                safe = max(row.emitted, safe - max(len(s) for s in req.params.stop) + 1)
        delta, row.emitted = text[row.emitted : safe], max(row.emitted, safe)
        try:
            req.on_token(TokenEvent(req.id, tok, lp, delta, row.versions[-1] if row.versions else None, row.finish))
        except Exception:  # a broken stream consumer must not kill the engine
            log.exception("on_token callback failed; cancelling %s", req.id)
            req.cancelled = True

    def _cache_prefixes(self, done: list[int]) -> None:
        """Keep finished rows' KV (prompt and completion) for prompts that extend them, when every
        token was computed with the adapter version that is still current."""
        from autocurricula.engine.runner import prefix_gather  # runner: mlx_lm and transformers, not on import

        pc, entries = self.e.prefix_cache, []
        gather = prefix_gather(self.cache, pc.block)
        if gather is None:
            return
        for i in done:
            row = self.rows[i]
            player, version = row.kv_key
            if row.error is not None or not row.tokens:
                continue
            if player is not None:
                rec = self.e.slots.records.get(player)
                if rec is None or rec.deleted or rec.version != version or any(v != version for v in row.versions):
                    continue
            seq = row.req.prompt_ids + row.tokens[:-1]  # the last token was sampled, never fed back
            if len(seq) >= pc.block:
                entries.append((row.kv_key, seq, i, row.states))
        if entries:
            pc.insert_many(entries, gather)
        self.e.stats["prefix_cached_tokens"] = pc.tokens
        self.e.stats["prefix_evictions"] = pc.evictions

    def retire(self, done: list[int]) -> None:
        e = self.e
        if e.prefix_cache is not None:
            self._cache_prefixes(done)
        for i in done:
            row = self.rows[i]
            req = row.req
            if row.error is not None:
                err = RequestError(f"request {req.id} failed: {row.error!r}")
                err.__cause__ = row.error
                resolve(req.future, exc=err)
                e.stats["failed"] += 1
            else:
                resolve(req.future, self._completion(row))
                e.stats["completions"] += 1
            if req.player is not None:
                e.slots.release(req.player)
                self.maybe_drop(req.player)
        self._remove(done)

    def _completion(self, row: Row) -> Completion:
        req, spans, start = row.req, [], 0
        for j in range(1, len(row.versions) + 1):
            if j == len(row.versions) or row.versions[j] != row.versions[start]:
                spans.append((start, j, row.versions[start]))
                start = j
        return Completion(req.id, req.player, req.prompt_ids, row.tokens, row.logprobs,
                          self._final_text(row) if row.tokens else "", row.finish,
                          row.versions[-1] if row.versions else None, spans)

    def _remove(self, done: list[int]) -> None:
        """Drop rows (by index) from the batch and its KV cache."""
        done_set = set(done)
        keep = [i for i in range(len(self.rows)) if i not in done_set]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.cache = None
        else:
            idx = mx.array(keep)
            for c in self.cache:
                c.filter(idx)
