"""The state one server app shares between its routes: the engine, the limits it was started
with, and the adapter bookkeeping (last use, sizes, source folders) that spilling needs. Routes
get it with :data:`StateDep`; the plain functions take it as an argument."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import random
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from autocurricula.engine.adapters import MAX_HEADER_BYTES, MAX_TENSORS
from autocurricula.serve.http_limits import MIN_UPLOAD_RATE, UploadSlots, upload_allowance
from autocurricula.serve.sessions import ServedMixture, SessionTable
from autocurricula.serve.validation import check_fits, longest_token_chars


UPLOAD_CEILING = 4  # all clients together: this many times max_concurrent_uploads


def check_limits(counts: dict, seconds: dict, optional: tuple[str, ...] = ()) -> None:
    """``counts`` must be positive integers, ``seconds`` positive finite numbers; those named in
    ``optional`` may also be None (no limit)."""
    for name, value in {**counts, **seconds}.items():
        if value is None and name in optional:
            continue
        kinds = int if name in counts else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
            what = "integer" if name in counts else "number of seconds"
            raise ValueError(f"{name} must be a positive {what}{' (or None)' if name in optional else ''}, "
                             f"got {value!r}")


@dataclass(eq=False)
class ServerState:
    """``engine`` is an :class:`~autocurricula.engine.Engine` (or anything with its public API);
    the limits are those of :func:`~autocurricula.serve.server.create_app`, resolved:
    ``max_tokens`` per request, ``max_batch_tokens`` per batch."""

    engine: Any
    max_tokens: int
    max_batch_tokens: int
    max_request_bytes: int = 8 << 20
    max_upload_bytes: int = 2 << 30
    max_lora_rank: int | None = 64
    max_cpu_adapters: int | None = 256
    max_cpu_adapter_bytes: int | None = None
    max_concurrent_uploads: int = 2  # per client (API key, or address without keys)
    max_queue_s: float | None = 120.0
    max_chat_messages: int = 1024
    body_timeout_s: float = 60.0
    adapter_root: str | None = None  # resolved (realpath): every folder read must lie inside it
    spill_dir: str | None = None  # this server's own folder under the root, for spilled adapters
    fingerprint: dict | None = None  # computed on first request when not given
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)  # changes on restart: adapters are gone
    last_use: dict[str, int] = field(default_factory=dict)  # player -> tick of its last request or install
    sizes: dict[str, int] = field(default_factory=dict)  # player -> bytes of its weights in memory
    folders: dict[str, str] = field(default_factory=dict)  # player -> folder it was loaded from (/v1/models)
    token_chars: int | None = None  # longest token of the vocabulary, in characters (computed once)
    keyed: bool = False  # the server checks API keys: upload slots go by key, not by address
    max_mixture_sessions: int = 100_000  # conversations whose drawn adapter is remembered (LRU beyond)
    mixture_seed: int | None = None  # seed of the mixtures' draws (None: fresh at each start)
    mixtures: dict[str, ServedMixture] = field(default_factory=dict)  # model name -> mixture

    def __post_init__(self):
        self.ticks = itertools.count()
        self.upload_slots = UploadSlots(self.max_concurrent_uploads, UPLOAD_CEILING * self.max_concurrent_uploads)
        self.install_lock = asyncio.Lock()  # the adapter count is checked and raised in one step
        self.sessions = SessionTable(self.max_mixture_sessions)
        self.mixture_rng = random.Random(self.mixture_seed)

    def client_of(self, request: Request) -> str:
        """Who sent ``request``, for the upload slots: a digest of its API key when the server
        checks keys (the middleware has already refused a wrong one), else its address."""
        if self.keyed:
            return hashlib.sha256(request.headers.get("authorization", "").encode()).hexdigest()[:16]
        return request.client.host if request.client else ""

    def touch(self, player: str | None) -> None:
        """Mark ``player`` used now (the least recently used idle players are spilled first)."""
        if player is not None:
            self.last_use[player] = next(self.ticks)

    def player_of(self, model: str | None) -> str | None:
        """The player a request's ``model`` names: None for the base model (by name or omitted)."""
        return None if model in (None, self.engine.name) else model

    def resolve(self, model: str | None, session: str | None, request: Request | None = None) -> tuple[str | None, str]:
        """``(player, name)`` of a request's ``model``: a mixture's player drawn for conversation
        ``session`` (kept for its later turns; :mod:`.sessions`) and that player's name, or
        :meth:`player_of` and ``model`` (the base model's name when omitted). Sessions are the
        client's own when the server checks API keys (``request``: whose)."""
        mixture = self.mixtures.get(model) if model is not None else None
        if mixture is None:
            return self.player_of(model), model or self.engine.name
        scope = self.client_of(request) if self.keyed and request is not None else ""
        player = self.sessions.player(mixture, session, self.mixture_rng, scope)
        return player, player

    def mixture_of(self, player: str) -> str | None:
        """The mixture whose adapter ``player`` is, if any."""
        return next((m.name for m in self.mixtures.values() if player in m.players.values()), None)

    def forget(self, name: str) -> None:
        """Drop a removed player's bookkeeping."""
        for book in (self.folders, self.last_use, self.sizes):
            book.pop(name, None)

    def check_fits(self, text: str, param: str) -> None:
        """400 for text that cannot fit the engine's context (see :func:`validation.check_fits`)."""
        if self.token_chars is None:
            self.token_chars = longest_token_chars(self.engine.tokenizer)
        check_fits(text, param, self.engine.max_context, self.token_chars, self.engine.encode)

    def limits(self) -> dict:
        """Every limit in force, as ``GET /v1/stats`` reports them."""
        return {"max_tokens": self.max_tokens, "max_batch_tokens": self.max_batch_tokens,
                "max_request_bytes": self.max_request_bytes, "max_upload_bytes": self.max_upload_bytes,
                "max_header_bytes": MAX_HEADER_BYTES, "max_tensors": MAX_TENSORS, "max_lora_rank": self.max_lora_rank,
                "max_cpu_adapters": self.max_cpu_adapters, "max_cpu_adapter_bytes": self.max_cpu_adapter_bytes,
                "max_concurrent_uploads": self.max_concurrent_uploads,
                "max_total_uploads": self.upload_slots.total, "max_queue_s": self.max_queue_s,
                "max_chat_messages": self.max_chat_messages, "body_timeout_s": self.body_timeout_s,
                "upload_allowance_s": upload_allowance(self.body_timeout_s), "min_upload_bytes_per_s": MIN_UPLOAD_RATE,
                "preempt_after_steps": self.engine.config.preempt_after_steps,
                "max_mixture_sessions": self.max_mixture_sessions}


def state_of(request: Request) -> ServerState:
    return request.app.state.server


StateDep = Annotated[ServerState, Depends(state_of)]
