"""OpenAI/vLLM-compatible HTTP server over one :class:`~autocurricula.engine.Engine`; routes, input
rules and limits are in docs/server.md. The request's ``model`` names the player (a LoRA adapter, as
in vLLM), or a mixture, which serves each conversation by one of its adapters (docs/deploy.md).
Beyond docs/server.md: ``load_lora_adapter`` on a loaded name hot-swaps it (vLLM refuses);
``PUT /v1/adapters/{name}`` takes ``?scale=``; ``/health``'s ``instance`` changes on restart; errors
are OpenAI-style ``{"error": {"message", "type", "param", "code"}}``. ``adapter_version`` is the
version that produced the last token (null: base model); ``version_spans`` ``[[start, end,
version], ...]`` shows mid-completion hot swaps. A stream's chunks carry their token's
``adapter_version``, its last one before ``[DONE]`` the ``finish_reason``, ``usage`` and
``version_spans``. ``top_logprobs`` holds only the sampled token (chat ``top_logprobs`` > 0 is refused).

This module assembles the app; the pieces live beside it: :mod:`.state` (what the routes share),
:mod:`.request_models` and :mod:`.validation` (what a request may say), :mod:`.generation` and
:mod:`.adapter_store` / :mod:`.adapter_upload` (the work), :mod:`.sessions` and
:mod:`.mixture_store` (mixtures served as models, one adapter per conversation), :mod:`.responses`
and :mod:`.errors` (the answers), the ``*_routes`` modules (thin handlers) and :mod:`.middleware`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Sequence

import uvicorn
from fastapi import FastAPI

from autocurricula import __version__
from autocurricula.engine import Engine, EngineConfig, blas
from autocurricula.engine.fingerprint import fingerprint_folder
from autocurricula.serve import adapter_routes, generation_routes, operation_routes
from autocurricula.serve.adapter_store import preload
from autocurricula.serve.errors import add_error_handlers
from autocurricula.serve.http_limits import header_timeout_protocol
from autocurricula.serve.mixture_store import preload_mixtures
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


def create_app(engine: Engine, *, api_key: str | Sequence[str] | None = None,
               adapter_root: str | None = None,
               max_tokens_limit: int | None = None, max_upload_bytes: int = 2 << 30,
               max_request_bytes: int = 8 << 20, max_lora_rank: int | None = 64,
               adapters: dict[str, str] | None = None, fingerprint: dict | None = None,
               max_cpu_adapters: int | None = 256, max_cpu_adapter_bytes: int | None = None,
               max_concurrent_uploads: int = 2,
               max_batch_tokens: int | None = None, max_queue_s: float | None = 120.0,
               max_chat_messages: int = 1024, body_timeout_s: float = 60.0,
               mixtures: dict[str, str] | None = None, max_mixture_sessions: int = 100_000,
               mixture_seed: int | None = None) -> FastAPI:
    """Build the FastAPI app serving ``engine``.

    ``api_key``: require ``Authorization: Bearer <key>`` everywhere but ``/health``; several keys
    (one per client) are accepted alike, and each key has its own adapter upload slots.
    ``adapter_root``: the only folder ``/v1/load_lora_adapter`` may read from (None: disabled), and
    where idle adapters beyond ``max_cpu_adapters`` spill (``.spilled/``, removed with the app).
    ``adapters``: ``{name: folder}`` loaded first (not limited to ``adapter_root``).
    ``mixtures``: ``{name: folder}`` of mixtures (``trainer.export_mixture``) served as models ``name``,
    each conversation drawing one adapter (not limited to ``adapter_root``; docs/deploy.md);
    ``max_mixture_sessions`` conversations keep their draw (least recently used forgotten first);
    ``mixture_seed``: seed of the draws (None: fresh).
    ``fingerprint``: the base model's (default: computed from the engine when first asked).
    The ``max_*`` limits and ``body_timeout_s`` are docs/server.md's Limits table (None: no limit).
    Raises ``ValueError`` for a limit out of range.
    """
    check_limits(dict(max_upload_bytes=max_upload_bytes, max_request_bytes=max_request_bytes,
                      max_lora_rank=max_lora_rank, max_cpu_adapters=max_cpu_adapters,
                      max_cpu_adapter_bytes=max_cpu_adapter_bytes, max_concurrent_uploads=max_concurrent_uploads,
                      max_batch_tokens=max_batch_tokens, max_chat_messages=max_chat_messages,
                      max_mixture_sessions=max_mixture_sessions),
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
        fingerprint=fingerprint or None, keyed=bool(api_key), max_mixture_sessions=max_mixture_sessions,
        mixture_seed=mixture_seed)
    preload(state, adapters or {})
    preload_mixtures(state, mixtures or {}, preloaded=len(adapters or {}))

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
          adapters: dict[str, str] | None = None, mixtures: dict[str, str] | None = None,
          prefix_cache_mb: float = 64.0, threads: int | None = None,
          header_timeout_s: float = 30.0, max_connections: int = 512, preempt_after_steps: int | None = 16,
          **limits) -> None:
    """Load ``model`` (Hub id or folder) into an :class:`Engine` and serve it with uvicorn until stopped.

    ``served_model_name``: the base model's name in the API (default: ``model``).
    ``timeout_keep_alive``: above the clients' idle limits, so the client, not the server, closes
    idle connections and never sends on one the server has just closed. ``keep_quantized``,
    ``prefix_cache_mb`` (0: off), ``preempt_after_steps``: see :class:`EngineConfig`. ``adapters``:
    ``{player: folder}`` loaded first. ``threads``: BLAS threads of the CPU backend (default: every
    core; leave a co-located trainer the rest). ``header_timeout_s``, ``max_connections`` and
    ``limits`` (:func:`create_app`'s): docs/server.md's Limits table."""
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
                         max_lora_rank=max_lora_rank, adapters=adapters, mixtures=mixtures, fingerprint=print_,
                         **limits)
        uvicorn.run(app, host=host, port=port, timeout_keep_alive=timeout_keep_alive,
                    http=header_timeout_protocol(header_timeout_s), limit_concurrency=max_connections)
    finally:
        engine.close()
