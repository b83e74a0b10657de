"""OpenAI/vLLM-compatible HTTP server over one :class:`~autocurricula.engine.Engine`.

Generation: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream: true``
as server-sent events ending in ``data: [DONE]``), ``GET /v1/models``. The request's ``model``
names the player (a loaded LoRA adapter, as in vLLM); the base model's name or no ``model`` means
no adapter. Adapters: ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter`` (vLLM;
folders must lie inside ``adapter_root``), ``PUT /v1/adapters/{name}`` (raw safetensors body,
optional ``?scale=``; creates or hot-swaps), ``GET`` / ``DELETE /v1/adapters/{name}``.
``load_lora_adapter`` with a loaded name hot-swaps it (vLLM refuses). Operations: ``GET /health``
(503 when the engine thread is dead or stuck; never needs the key), ``GET /v1/stats``. Errors are
OpenAI-style ``{"error": {"message", "type", "param", "code"}}`` with 4xx/503 statuses.

Extension fields beyond OpenAI:

* request: ``top_k`` (0/-1 = off), ``ignore_eos``, ``return_token_ids`` (as in vLLM).
* response: ``adapter_version`` (version of the player's adapter that produced the last token;
  null for the base model) and ``version_spans`` (``[[start, end, version], ...]`` over completion
  token indices; more than one span means the adapter was hot-swapped mid-completion). With
  ``return_token_ids`` each choice carries ``prompt_token_ids`` and ``token_ids``.
* streaming: every chunk carries ``adapter_version`` of its token (and ``token_ids`` with
  ``return_token_ids``); the last chunk before ``[DONE]`` has an empty delta, the
  ``finish_reason``, ``usage`` and ``version_spans``.
* completions ``logprobs``: ``top_logprobs`` holds only the sampled token (the engine computes no
  alternatives); chat ``top_logprobs`` > 0 is rejected for the same reason.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import math
import os
import time
import uuid
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from autocurricula.engine import Engine, EngineConfig, EngineDeadError, SamplingParams, UnknownPlayerError
from autocurricula.engine.adapters import AdapterError, check_name, from_safetensors_bytes

log = logging.getLogger(__name__)
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "invalid_request_error", 415: "invalid_request_error",
          503: "service_unavailable"}
# Fields we do not implement: accepted only at their neutral value, so nobody gets silently ignored.
_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "best_of": 1,
            "logit_bias": None, "suffix": None, "tools": None, "min_tokens": 0}


class APIError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    err = {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": status}
    return JSONResponse({"error": err}, status_code=status)


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = 1
    stream: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None


class LoraRequest(BaseModel):
    lora_name: str
    lora_path: str | None = None  # required by load_lora_adapter


class _AuthMiddleware:
    """Pure ASGI (unlike ``BaseHTTPMiddleware`` it keeps streaming and disconnect detection intact);
    covers every path, docs and unknown routes included, except ``/health``."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                msg = "missing or wrong API key; send the header 'Authorization: Bearer <key>'"
                return await _error(401, msg)(scope, receive, send)
        await self.app(scope, receive, send)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        if e.get("type") == "json_invalid":
            return "request body is not valid JSON; send a JSON object with Content-Type: application/json"
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        if (part := f"{where}: {e.get('msg')}") not in parts:
            parts.append(part)
    return "invalid request: " + "; ".join(parts[:6]) + " (fix these fields; see the OpenAI API reference)"


def create_app(engine: Engine, *, api_key: str | None = None, adapter_root: str | None = None,
               max_tokens_limit: int | None = None, max_upload_bytes: int = 2 << 30) -> FastAPI:
    """Build the FastAPI app serving ``engine``.

    ``api_key``: require ``Authorization: Bearer <key>`` everywhere but ``/health``.
    ``adapter_root``: the only folder ``/v1/load_lora_adapter`` may read from (disabled if None).
    ``max_tokens_limit``: largest ``max_tokens`` a request may ask for (default: the context).
    """
    app = FastAPI(title="autocurricula", version="0.1.0")
    if api_key:
        app.add_middleware(_AuthMiddleware, api_key=api_key)
    limit = max_tokens_limit or engine.max_context
    root = os.path.realpath(adapter_root) if adapter_root else None
    folders: dict[str, str] = {}  # player -> folder it was loaded from (shown in /v1/models)

    handlers = {
        APIError: lambda r, e: _error(e.status, e.message, e.param),
        UnknownPlayerError: lambda r, e: _error(404, str(e), "model"),
        AdapterError: lambda r, e: _error(400, str(e)),
        EngineDeadError: lambda r, e: _error(503, f"{e}; the server must be restarted"),
        RequestValidationError: lambda r, e: _error(400, _validation_message(e)),
        StarletteHTTPException: lambda r, e: _error(e.status_code, str(e.detail)),
        Exception: lambda r, e: _error(500, f"internal server error: {e!r}"),
    }
    for cls, fn in handlers.items():
        app.add_exception_handler(cls, fn)

    # ---------------------------------------------------------------- generation helpers
    def params_for(body: _Sampling, max_tokens: int) -> SamplingParams:
        for key, value in (body.model_extra or {}).items():
            if key in _NEUTRAL and value not in (None, _NEUTRAL[key], [], {}):
                raise APIError(400, f"{key} is not supported by this server; omit it", key)
        if body.n not in (None, 1):
            raise APIError(400, "only n=1 is supported; send n requests instead (the server batches them)", "n")
        if max_tokens > limit:
            raise APIError(400, f"max_tokens={max_tokens} exceeds this server's limit of {limit}; lower it",
                           "max_tokens")
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                stop=body.stop or [], seed=body.seed, ignore_eos=body.ignore_eos)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    def submit(prompt, player, params, on_token, rid) -> Future:
        try:
            return engine.submit(prompt, player, params, on_token=on_token, request_id=rid)
        except ValueError as exc:  # prompt too long / empty / bad token ids
            raise APIError(400, str(exc), "prompt") from None

    def logprobs_of(chat: bool, ids: list[int], lps: list[float]) -> dict | None:
        if not ids:
            return None
        toks = [engine.tokenizer.decode([t]) for t in ids]
        if chat:
            return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                for t, lp in zip(toks, lps)], "refusal": None}
        offsets = [0, *itertools.accumulate(len(t) for t in toks)][:-1]
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": [{t: lp} for t, lp in zip(toks, lps)],
                "text_offset": offsets}

    def choice(chat, text, ids, lps, finish, want_lp, want_ids, prompt_ids=None, delta=False) -> dict:
        c: dict[str, Any] = {"index": 0}
        if chat:
            c["delta" if delta else "message"] = {"content": text} if delta else {"role": "assistant", "content": text}
        else:
            c["text"] = text
        c["logprobs"] = logprobs_of(chat, ids, lps) if want_lp else None
        c["finish_reason"] = finish
        if want_ids:
            c["token_ids"] = ids
            if prompt_ids is not None:
                c["prompt_token_ids"] = prompt_ids
        return c

    def envelope(chat, rid, model, choices, chunk=False, **extra) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices, **extra}

    def summary(c) -> dict:
        n, m = len(c.prompt_ids), len(c.token_ids)
        return {"usage": {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m},
                "adapter_version": c.adapter_version, "version_spans": [list(s) for s in c.version_spans]}

    async def respond(chat: bool, request: Request, body: _Sampling, prompt, max_tokens: int, want_lp: bool):
        params = params_for(body, max_tokens)
        player = None if body.model in (None, engine.name) else body.model
        model, want_ids = body.model or engine.name, body.return_token_ids
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if body.stream:
            return await stream(chat, prompt, player, params, rid, model, want_lp, want_ids)
        fut = await run_in_threadpool(submit, prompt, player, params, None, rid)
        waiter = asyncio.wrap_future(fut)
        try:
            while not waiter.done():
                await asyncio.wait([waiter], timeout=0.25)
                if not waiter.done() and await request.is_disconnected():
                    engine.cancel(rid)
                    raise APIError(499, "client disconnected")
        except asyncio.CancelledError:
            engine.cancel(rid)
            raise
        c = waiter.result()
        ch = choice(chat, c.text, c.token_ids, c.logprobs, c.finish_reason, want_lp, want_ids, c.prompt_ids)
        return JSONResponse(envelope(chat, rid, model, [ch], **summary(c)))

    async def stream(chat, prompt, player, params, rid, model, want_lp, want_ids) -> StreamingResponse:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        fut = await run_in_threadpool(
            submit, prompt, player, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev), rid)
        # Tokens and the final result travel through one FIFO, so the result comes after the last token.
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, f))

        def sse(obj) -> str:
            return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"

        async def gen():
            finished = False
            try:
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}
                    yield sse(envelope(chat, rid, model, [first], chunk=True))
                while True:
                    ev = await events.get()
                    if isinstance(ev, Future):
                        finished = True
                        try:
                            c = ev.result()
                        except Exception as exc:  # the status line is sent already: report in-band
                            status = {EngineDeadError: 503, UnknownPlayerError: 404}.get(type(exc), 500)
                            yield sse(json.loads(_error(status, str(exc)).body))
                        else:
                            last = choice(chat, "", [], [], c.finish_reason, False, want_ids, c.prompt_ids, True)
                            yield sse(envelope(chat, rid, model, [last], chunk=True, **summary(c)))
                        yield "data: [DONE]\n\n"
                        return
                    ch = choice(chat, ev.text, [ev.token_id], [ev.logprob], None, want_lp, want_ids, delta=True)
                    yield sse(envelope(chat, rid, model, [ch], chunk=True, adapter_version=ev.version))
            finally:
                if not finished:  # the client went away (generator cancelled or closed)
                    engine.cancel(rid)

        return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def chat_prompt(messages: list[dict]) -> list[int]:
        norm = []
        for i, m in enumerate(messages):
            content = m.get("content")
            if isinstance(content, list):  # OpenAI content parts: only text is understood
                if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported", "messages")
                content = "".join(p.get("text", "") for p in content)
            if not isinstance(m.get("role"), str) or not isinstance(content, str):
                raise APIError(400, f"messages[{i}] needs a string 'role' and text 'content'", "messages")
            norm.append({"role": m["role"], "content": content})
        try:
            return engine.apply_chat_template(norm)
        except Exception as exc:  # template errors are the conversation's fault
            raise APIError(400, f"cannot apply the chat template: {exc}", "messages") from None

    # ---------------------------------------------------------------- generation routes
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        """OpenAI text completion (one prompt: a string or a list of token ids)."""
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported; send one request per "
                                    "prompt (the server batches concurrent requests)", "prompt")
            prompt = prompt[0]
        if body.echo:
            raise APIError(400, "echo is not supported; prepend the prompt to the returned text yourself", "echo")
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        return await respond(False, request, body, prompt, max_tokens, body.logprobs is not None)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        """OpenAI chat completion; ``messages`` go through the tokenizer's chat template."""
        if body.top_logprobs:
            raise APIError(400, "top_logprobs is not supported (only the sampled token's logprob is "
                                "computed); use logprobs: true without top_logprobs", "top_logprobs")
        ids = await run_in_threadpool(chat_prompt, body.messages)
        max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
        if max_tokens is None:
            max_tokens = min(limit, engine.max_context - len(ids))
            if max_tokens <= 0:
                raise APIError(400, f"the conversation ({len(ids)} tokens) fills the context of "
                                    f"{engine.max_context} tokens; shorten it", "messages")
        return await respond(True, request, body, ids, max_tokens, body.logprobs)

    @app.get("/v1/models")
    async def models():
        """The base model and every loaded player (LoRA), in OpenAI list format."""
        cards = [(engine.name, engine.name, None)] + [(n, folders.get(n, n), engine.name) for n in engine.players()]
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "autocurricula", "root": root_,
             "parent": parent, "max_model_len": engine.max_context} for name, root_, parent in cards]}

    # ---------------------------------------------------------------- adapter routes
    async def install(name: str, source) -> int:
        check_name(name)
        try:
            return await run_in_threadpool(engine.load_adapter, name, source)
        except AdapterError:
            raise
        except (ValueError, OSError) as exc:  # e.g. an unreadable folder or a broken adapter_config.json
            raise APIError(400, f"cannot load adapter {name!r}: {exc}") from None

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoraRequest):
        """vLLM: load (or hot-swap) a peft / mlx-lm adapter folder that lies inside ``adapter_root``."""
        if root is None:
            raise APIError(403, "loading adapters from server paths is disabled; start the server with "
                                "--adapter-root DIR (or upload the weights with PUT /v1/adapters/{name})", "lora_path")
        if not body.lora_path:
            raise APIError(400, "lora_path is required: the adapter folder, relative to the adapter root", "lora_path")
        if "\x00" in body.lora_path:
            raise APIError(400, "lora_path contains a NUL character", "lora_path")
        path = os.path.realpath(os.path.join(root, body.lora_path))
        if os.path.commonpath([root, path]) != root:
            raise APIError(403, f"lora_path {body.lora_path!r} is outside the server's adapter root; "
                                "put the adapter folder inside --adapter-root", "lora_path")
        if not os.path.isdir(path):
            raise APIError(400, f"lora_path {body.lora_path!r} is not a folder inside the adapter root", "lora_path")
        version = await install(body.lora_name, path)
        folders[body.lora_name] = path
        return {"name": body.lora_name, "version": version,
                "message": f"Success: LoRA adapter '{body.lora_name}' added successfully."}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: LoraRequest):
        """vLLM: remove a player; running requests finish with its weights first."""
        return await delete_adapter(body.lora_name)

    @app.put("/v1/adapters/{name:path}")
    async def put_adapter(name: str, request: Request, scale: float | None = None):
        """Create or hot-swap a player from raw safetensors bytes (peft or mlx-lm keys)."""
        check_name(name)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("", "application/octet-stream", "application/x-safetensors"):
            raise APIError(415, f"content-type {ctype!r} is not accepted; send the raw .safetensors bytes "
                                "as application/octet-stream")
        if scale is not None and not math.isfinite(scale):
            raise APIError(400, "scale must be a finite number", "scale")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_upload_bytes:
            raise APIError(413, f"adapter upload of {declared} bytes exceeds the limit of {max_upload_bytes} bytes")
        body = bytearray()
        async for chunk in request.stream():  # enforce the limit without trusting content-length
            body += chunk
            if len(body) > max_upload_bytes:
                raise APIError(413, f"adapter upload exceeds the limit of {max_upload_bytes} bytes")
        weights = await run_in_threadpool(from_safetensors_bytes, bytes(body), scale)
        version = await install(name, weights)
        folders.pop(name, None)
        return {"name": name, "version": version}

    @app.get("/v1/adapters/{name:path}")
    async def get_adapter(name: str):
        """Version, rank, scale and residency of one player's adapter."""
        return engine.adapter_info(name)

    @app.delete("/v1/adapters/{name:path}")
    async def delete_adapter(name: str):
        """Remove a player."""
        await run_in_threadpool(engine.unload_adapter, name)
        folders.pop(name, None)
        return {"name": name, "deleted": True}

    # ---------------------------------------------------------------- operations
    @app.get("/health")
    async def health():
        """200 while the engine thread runs and is not stuck, else 503."""
        h = engine.health()
        return JSONResponse({"status": "ok" if h["ok"] else "unhealthy", **h}, status_code=200 if h["ok"] else 503)

    @app.get("/v1/stats")
    async def stats():
        """Engine counters, batch occupancy, health and loaded players."""
        return {"stats": dict(engine.stats), "occupancy": engine.occupancy, "health": engine.health(),
                "players": engine.players()}

    return app


def serve(model, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None, max_slots: int = 16,
          adapter_root: str | None = None, max_tokens_limit: int | None = None,
          served_model_name: str | None = None, max_batch: int = 64) -> None:
    """Load ``model`` (Hub id or folder) into an :class:`Engine` and serve it with uvicorn until stopped.

    ``served_model_name`` is the base model's name in the API (default: ``model`` as given)."""
    import uvicorn

    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who can reach it can load adapters", host)
    engine = Engine(model, config=EngineConfig(max_slots=max_slots, max_batch=max_batch), name=served_model_name)
    try:
        app = create_app(engine, api_key=api_key, adapter_root=adapter_root, max_tokens_limit=max_tokens_limit)
        uvicorn.run(app, host=host, port=port)
    finally:
        engine.close()
