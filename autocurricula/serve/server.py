"""OpenAI/vLLM-compatible HTTP server over one :class:`~autocurricula.engine.Engine`.

Generation: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream: true``
as server-sent events ending in ``data: [DONE]``), ``GET /v1/models``. The request's ``model``
names the player (a loaded LoRA adapter, as in vLLM); the base model's name or no ``model`` means
no adapter. Adapters: ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter`` (vLLM;
folders must lie inside ``adapter_root``), ``PUT /v1/adapters/{name}`` (raw safetensors body,
optional ``?scale=``; creates or hot-swaps), ``GET`` / ``DELETE /v1/adapters/{name}``.
``load_lora_adapter`` with a loaded name hot-swaps it (vLLM refuses). ``PUT`` takes an optional
``?version=`` (the trainer's version of the weights; 409 when it is not newer than the loaded one).
Operations: ``GET /health`` (503 when the engine thread is dead or stuck; never needs the key; its
``instance`` changes when the server restarts), ``GET /v1/stats``, ``GET /v1/fingerprint`` (hashes
of the base model's config and weights, see :mod:`autocurricula.engine.fingerprint`). Errors are
OpenAI-style ``{"error": {"message", "type", "param", "code"}}`` with 4xx/503 statuses.

Extension fields beyond OpenAI:

* request: ``top_k`` (0/-1 = off), ``ignore_eos``, ``return_token_ids`` (as in vLLM).
* response: ``adapter_version`` (version of the player's adapter that produced the last token;
  null for the base model) and ``version_spans`` (``[[start, end, version], ...]`` over completion
  token indices; more than one span means the adapter was hot-swapped mid-completion). With
  ``return_token_ids`` each choice carries ``prompt_token_ids`` and ``token_ids``.
* ``POST /v1/batch/completions``: ``{"requests": [<completion request>, ...]}`` admitted to the
  engine together (one batch for the lot, each with its own player, unless other requests wait
  for rows: admission is fair between HTTP requests, a batch counting as one); answers
  ``{"object": "list", "data": [<text_completion or {"error": ...}>, ...]}`` in order.
* streaming: every chunk carries ``adapter_version`` of its token (and ``token_ids`` with
  ``return_token_ids``); the last chunk before ``[DONE]`` has an empty delta, the
  ``finish_reason``, ``usage`` and ``version_spans``.
* completions ``logprobs``: ``top_logprobs`` holds only the sampled token (the engine computes no
  alternatives); chat ``top_logprobs`` > 0 is rejected for the same reason.

Input is strict: JSON types must match exactly (``max_tokens: true`` or ``stream: "yes"`` is a
400), integers are bounded, and a field this server does not implement is refused by name
(``response_format``, ``tools``, ...; penalties and ``best_of`` only at their neutral value).
Harmless bookkeeping fields (``user``, ``metadata``, ``store``, ``service_tier``,
``stream_options``, ``parallel_tool_calls``) are accepted and ignored. Limits: JSON bodies up to
``max_request_bytes`` (413 above, checked before parsing), adapter uploads up to
``max_upload_bytes``, adapter rank up to ``max_lora_rank``; a text prompt that cannot fit the
context is refused before it is tokenized in full.

This module assembles the app; the pieces live beside it: :mod:`.state` (what the routes share),
:mod:`.request_models` and :mod:`.validation` (what a request may say), :mod:`.generation` and
:mod:`.adapter_store` / :mod:`.adapter_upload` (the work), :mod:`.responses` and :mod:`.errors`
(the answers), the ``*_routes`` modules (thin handlers) and :mod:`.middleware`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid

import uvicorn
from fastapi import FastAPI

from autocurricula import __version__
from autocurricula.engine import Engine, EngineConfig, blas
from autocurricula.engine.fingerprint import fingerprint_folder
from autocurricula.serve import adapter_routes, generation_routes, operation_routes
from autocurricula.serve.adapter_store import preload
from autocurricula.serve.errors import add_error_handlers
from autocurricula.serve.http_limits import header_timeout_protocol
from autocurricula.serve.middleware import AuthMiddleware, BodyLimit, is_adapter_upload
from autocurricula.serve.request_models import MAX_CHAT_MESSAGES
from autocurricula.serve.state import ServerState, check_limits

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def _remove_spill_folder(app: FastAPI):
    """The app's spilled adapters go with it (uvicorn ends a SIGTERM'd process before ``finally``
    blocks after the app, so this runs in the app's own shutdown)."""
    try:
        yield
    finally:
        if app.state.spill_dir:
            shutil.rmtree(app.state.spill_dir, ignore_errors=True)


def create_app(engine: Engine, *, api_key: str | None = None, adapter_root: str | None = None,
               max_tokens_limit: int | None = None, max_upload_bytes: int = 2 << 30,
               max_request_bytes: int = 8 << 20, max_lora_rank: int | None = 64,
               adapters: dict[str, str] | None = None, fingerprint: dict | None = None,
               max_cpu_adapters: int | None = 256, max_cpu_adapter_bytes: int | None = None,
               max_concurrent_uploads: int = 2,
               max_batch_tokens: int | None = None, max_queue_s: float | None = 120.0,
               max_chat_messages: int = 1024, body_timeout_s: float = 60.0) -> FastAPI:
    """Build the FastAPI app serving ``engine``.

    ``api_key``: require ``Authorization: Bearer <key>`` everywhere but ``/health``.
    ``adapter_root``: the only folder ``/v1/load_lora_adapter`` may read from (disabled if None);
    every file read must resolve inside it too (no symlinks out).
    ``max_tokens_limit``: largest ``max_tokens`` a request may ask for (default: the context).
    ``max_request_bytes``: largest JSON body (413 above); ``max_upload_bytes``: largest adapter
    upload (``PUT /v1/adapters/{name}``). ``max_lora_rank``: largest adapter rank (None: no limit).
    ``adapters``: players to load before serving, ``{name: adapter folder}`` (the operator's own
    folders: not limited to ``adapter_root``, but to ``max_lora_rank``).
    ``fingerprint``: the base model's fingerprint (``serve`` computes it from the model folder at
    load); default: computed from the engine on the first ``GET /v1/fingerprint``.
    ``max_cpu_adapters``: players whose weights are held in memory at once (None: no limit). With
    an ``adapter_root``, a player beyond it spills the least recently used idle ones to disk (under
    ``adapter_root/.spilled/``; they stay loaded and are read back, checked, when requested);
    without one, or when every held player is in use, a new player gets a 507.
    ``max_cpu_adapter_bytes``: the same cap on the bytes of the weights held (None: no limit).
    The app removes its spill folder when it shuts down: an engine that outlives it needs its
    spilled adapters uploaded again.
    ``max_concurrent_uploads``: adapter uploads read and parsed at once; others wait up to
    ``body_timeout_s``, then get a 429 with ``Retry-After``.
    ``max_batch_tokens``: the sum of ``max_tokens`` over one ``/v1/batch/completions`` (default:
    the engine's ``max_batch`` times the per-request limit).
    ``max_queue_s``: a request not started after this many seconds in the queue gets a 503 with
    ``Retry-After`` (None: it waits as long as it takes).
    ``max_chat_messages``: messages in one chat request (at most :data:`MAX_CHAT_MESSAGES`).
    ``body_timeout_s``: seconds for a JSON body to arrive after its headers; an upload gets this
    plus one second per MiB.
    """
    check_limits(dict(max_upload_bytes=max_upload_bytes, max_request_bytes=max_request_bytes,
                      max_lora_rank=max_lora_rank, max_cpu_adapters=max_cpu_adapters,
                      max_cpu_adapter_bytes=max_cpu_adapter_bytes, max_concurrent_uploads=max_concurrent_uploads,
                      max_batch_tokens=max_batch_tokens, max_chat_messages=max_chat_messages),
                 dict(max_queue_s=max_queue_s, body_timeout_s=body_timeout_s),
                 optional=("max_lora_rank", "max_cpu_adapters", "max_cpu_adapter_bytes", "max_batch_tokens",
                           "max_queue_s"))
    if max_chat_messages > MAX_CHAT_MESSAGES:
        raise ValueError(f"max_chat_messages must be at most {MAX_CHAT_MESSAGES}, got {max_chat_messages}")
    limit = max_tokens_limit or engine.max_context
    root = os.path.realpath(adapter_root) if adapter_root else None
    state = ServerState(
        engine, max_tokens=limit, max_batch_tokens=max_batch_tokens or engine.config.max_batch * limit,
        max_request_bytes=max_request_bytes, max_upload_bytes=max_upload_bytes, max_lora_rank=max_lora_rank,
        max_cpu_adapters=max_cpu_adapters, max_cpu_adapter_bytes=max_cpu_adapter_bytes,
        max_concurrent_uploads=max_concurrent_uploads, max_queue_s=max_queue_s, max_chat_messages=max_chat_messages,
        body_timeout_s=body_timeout_s, adapter_root=root,
        spill_dir=os.path.join(root, ".spilled", uuid.uuid4().hex[:12]) if root else None,  # this server's alone
        fingerprint=fingerprint or None)
    preload(state, adapters or {})

    app = FastAPI(title="autocurricula", version=__version__, lifespan=_remove_spill_folder)
    app.state.server, app.state.spill_dir = state, state.spill_dir
    app.add_middleware(BodyLimit, limit=max_request_bytes, timeout=body_timeout_s, exempt=is_adapter_upload)
    if api_key:  # added last: runs first, so an unauthenticated body is never read
        app.add_middleware(AuthMiddleware, api_key=api_key)
    add_error_handlers(app)
    for routes in (generation_routes, adapter_routes, operation_routes):  # on the app itself: app.routes lists them
        for method, path, handler in routes.ROUTES:
            app.add_api_route(path, handler, methods=[method])
    return app


def serve(model, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None, max_slots: int = 64,
          adapter_root: str | None = None, max_tokens_limit: int | None = None,
          served_model_name: str | None = None, max_batch: int = 64, max_request_bytes: int = 8 << 20,
          max_upload_bytes: int = 2 << 30, max_lora_rank: int | None = 64,
          timeout_keep_alive: float = 75.0, keep_quantized: bool = False,
          adapters: dict[str, str] | None = None, prefix_cache_mb: float = 64.0, threads: int | None = None,
          header_timeout_s: float = 30.0, max_connections: int = 512, preempt_after_steps: int | None = 16,
          **limits) -> None:
    """Load ``model`` (Hub id or folder) into an :class:`Engine` and serve it with uvicorn until stopped.

    ``served_model_name`` is the base model's name in the API (default: ``model`` as given).
    ``timeout_keep_alive``: seconds an idle connection stays open; above the clients' own idle
    limits (httpx 5 s, aiohttp 15 s), so the client, not the server, closes idle connections and
    never sends on one the server has just closed. ``keep_quantized``: on the CPU backend, keep a
    quantized or half-precision base as stored (see :class:`EngineConfig`). ``adapters``:
    ``{player: folder}`` loaded before the first request. ``prefix_cache_mb``: memory of the
    engine's prefix cache (0 = off). ``threads``: BLAS threads of the CPU backend's matmuls
    (default: every core); a server sharing the machine with a trainer gives it the rest.
    ``header_timeout_s``: a connection whose request headers have not all arrived this many seconds
    after it opened (or after its last response) is closed. ``max_connections``: connections and
    requests at once; beyond it uvicorn answers 503. ``preempt_after_steps``: fair admission (see
    :class:`EngineConfig`): a request waits about this many decode steps at most for a row while
    other requests hold them all (None: it waits for a row to finish). ``limits``: the other limits of
    :func:`create_app` (``max_cpu_adapters``, ``max_queue_s``, ...)."""
    if threads is not None:
        blas.use_threads(threads)

    check_limits(dict(max_connections=max_connections),
                 dict(timeout_keep_alive=timeout_keep_alive, header_timeout_s=header_timeout_s))

    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who can reach it can load adapters", host)
    engine = Engine(model, config=EngineConfig(max_slots=max_slots, max_batch=max_batch, keep_quantized=keep_quantized,
                                                prefix_cache_mb=prefix_cache_mb, preempt_after_steps=preempt_after_steps),
                    name=served_model_name)
    try:
        # hashed from the stored files, as the trainer does: the same folder gives the same print
        # whatever the engine converted at load
        print_ = fingerprint_folder(model) if isinstance(model, (str, os.PathLike)) else None
        app = create_app(engine, api_key=api_key, adapter_root=adapter_root, max_tokens_limit=max_tokens_limit,
                         max_request_bytes=max_request_bytes, max_upload_bytes=max_upload_bytes,
                         max_lora_rank=max_lora_rank, adapters=adapters, fingerprint=print_, **limits)
        uvicorn.run(app, host=host, port=port, timeout_keep_alive=timeout_keep_alive,
                    http=header_timeout_protocol(header_timeout_s), limit_concurrency=max_connections)
    finally:
        engine.close()
