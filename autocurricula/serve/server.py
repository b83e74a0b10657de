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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import math
import os
import shutil
import time
import uuid
from concurrent.futures import Future
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from autocurricula.engine import Engine, EngineConfig, EngineDeadError, SamplingParams, UnknownPlayerError
from autocurricula.engine.adapters import (MAX_HEADER_BYTES, MAX_TENSORS, AdapterError, AdapterPathError,
                                           adapter_from_parts, check_name, finite32, header_length, load_folder,
                                           parse_header)
from autocurricula.engine.fingerprint import fingerprint_engine, fingerprint_folder
from autocurricula.engine.sampling import INT32_MAX, SEED_MAX
from autocurricula.engine.spill import host_bytes
from autocurricula.engine.scheduler import QueueTimeoutError, RequestError
from autocurricula.serve.http_limits import BodyError, BodyReader, ClientGone, header_timeout_protocol

log = logging.getLogger(__name__)
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 408: "timeout_error", 409: "conflict_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable",
          507: "insufficient_storage"}
# Fields we do not implement: accepted only at their neutral value, so nobody gets silently ignored.
_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "best_of": 1,
            "logit_bias": None, "suffix": None, "tools": None, "tool_choice": "none", "min_tokens": 0}
_PARSE_ERROR = "There was an error parsing the body"  # FastAPI's detail when json.loads fails oddly
RETRY_LATER = {"Retry-After": "5"}  # seconds a request refused for a busy server is told to wait
CLOSE = {"Connection": "close"}  # after a refused body: the rest of it is not worth reading
MIN_UPLOAD_RATE = 1 << 20  # bytes/s an upload must keep up, beyond --body-timeout, before it is cut off


class APIError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def _error(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    err = {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": status}
    return JSONResponse({"error": err}, status_code=status, headers=headers)


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate {ascii(text[exc.start])} at character {exc.start}; send valid "
                         "Unicode text (a surrogate must be half of a pair)") from None
    return text


# Strings that can be encoded (and echoed back in errors): a lone surrogate is the sender's fault.
Text = Annotated[StrictStr, AfterValidator(_valid_unicode)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    # strict: no coercion (true is not 1, "yes" is not true); forbid: an unknown field is named
    model_config = ConfigDict(strict=True, extra="forbid")


class _Sampling(_Strict):
    model: Text | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=100)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1, le=INT32_MAX)] | None = None
    stop: Text | list[Text] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=SEED_MAX)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = 1
    stream: StrictBool = False
    ignore_eos: StrictBool = False
    return_token_ids: StrictBool = False
    # not implemented: accepted only at the neutral value (_NEUTRAL), refused by name otherwise
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] | None = None
    logit_bias: dict[str, Number] | None = None
    # harmless bookkeeping: accepted and ignored (usage is always in the last stream chunk)
    user: Text | None = None
    metadata: dict[str, Text] | None = None
    store: StrictBool | None = None
    service_tier: Text | None = None
    stream_options: dict[str, StrictBool] | None = None


class CompletionRequest(_Sampling):
    prompt: Text | list[StrictInt] | list[Text] | list[list[StrictInt]]
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    echo: StrictBool = False
    best_of: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    suffix: Text | None = None


class BatchCompletionRequest(_Strict):
    requests: list[CompletionRequest] = Field(min_length=1, max_length=4096)


MAX_CHAT_MESSAGES = 4096  # the schema's bound; create_app's max_chat_messages may be lower


class Message(_Strict):
    """One chat message: text only (no tools, images or names)."""

    role: Literal["system", "user", "assistant"]
    content: Text | list[dict[str, Any]]


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    tools: list[Any] | None = None
    tool_choice: Text | None = None
    parallel_tool_calls: StrictBool | None = None


class LoraRequest(_Strict):
    lora_name: Text
    lora_path: Text | None = None  # required by load_lora_adapter


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


class _BodyLimit:
    """Pure ASGI: reads the whole body before the app parses anything and answers 413 once it
    passes ``limit`` bytes (the declared Content-Length is checked first, then the bytes counted),
    or 408 when it has not all arrived ``timeout`` seconds after the headers.
    ``exempt`` requests (adapter uploads) stream to their route, which has its own limits."""

    def __init__(self, app, limit: int, timeout: float, exempt):
        self.app, self.limit, self.timeout, self.exempt = app, limit, timeout, exempt

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.exempt(scope):
            return await self.app(scope, receive, send)
        msg = (f"request body exceeds this server's limit of {self.limit} bytes (--max-request-bytes); "
               "send a shorter prompt")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await _error(413, msg, headers=CLOSE)(scope, receive, send)
        chunks, size, deadline = [], 0, time.monotonic() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                msg = f"request body did not arrive within {self.timeout:g} s (--body-timeout); send it at once"
                return await _error(408, msg, headers=CLOSE)(scope, receive, send)
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _error(413, msg, headers=CLOSE)(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():  # the buffered body once, then the real channel (disconnects)
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)




def _queue_timeout(exc: QueueTimeoutError) -> JSONResponse:
    return _error(503, f"{exc} (--max-queue-s): the server is busy; retry later", headers=RETRY_LATER)


def _failure_status(exc: BaseException) -> int:
    """The HTTP status of a request that failed inside the engine."""
    return {EngineDeadError: 503, UnknownPlayerError: 404, QueueTimeoutError: 503}.get(type(exc), 500)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        if e.get("type") == "json_invalid":
            return "request body is not valid JSON; send a JSON object with Content-Type: application/json"
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        msg = ("not supported by this server; omit it" if e.get("type") == "extra_forbidden"
               else e.get("msg"))
        if (part := f"{where}: {msg}") not in parts:
            parts.append(part)
    return "invalid request: " + "; ".join(parts[:6]) + " (fix these fields; see the OpenAI API reference)"


def _http_error(exc: StarletteHTTPException) -> JSONResponse:
    cause = exc.__cause__
    if exc.detail == _PARSE_ERROR and cause is not None:  # FastAPI's json.loads failed in a non-JSON way
        if isinstance(cause, UnicodeDecodeError):
            return _error(400, f"request body is not valid UTF-8 (byte {cause.start}); send JSON encoded as UTF-8")
        if isinstance(cause, RecursionError):
            return _error(400, "request body JSON is nested too deeply; send a flat JSON object as the "
                               "OpenAI API reference describes")
        return _error(400, f"request body cannot be parsed as JSON ({type(cause).__name__}); send a JSON object "
                           "with Content-Type: application/json")
    return _error(exc.status_code, str(exc.detail))


def _check_limits(counts: dict, seconds: dict, optional: tuple[str, ...] = ()) -> None:
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
    _check_limits(dict(max_upload_bytes=max_upload_bytes, max_request_bytes=max_request_bytes,
                       max_lora_rank=max_lora_rank, max_cpu_adapters=max_cpu_adapters,
                       max_cpu_adapter_bytes=max_cpu_adapter_bytes, max_concurrent_uploads=max_concurrent_uploads, max_batch_tokens=max_batch_tokens,
                       max_chat_messages=max_chat_messages),
                  dict(max_queue_s=max_queue_s, body_timeout_s=body_timeout_s),
                  optional=("max_lora_rank", "max_cpu_adapters", "max_cpu_adapter_bytes", "max_batch_tokens",
                            "max_queue_s"))
    if max_chat_messages > MAX_CHAT_MESSAGES:
        raise ValueError(f"max_chat_messages must be at most {MAX_CHAT_MESSAGES}, got {max_chat_messages}")
    app = FastAPI(title="autocurricula", version="0.1.0", lifespan=_remove_spill_folder)
    app.state.spill_dir = None  # set below with an adapter root
    uploads = lambda scope: scope["method"] == "PUT" and scope["path"].startswith("/v1/adapters/")  # noqa: E731
    app.add_middleware(_BodyLimit, limit=max_request_bytes, timeout=body_timeout_s, exempt=uploads)
    if api_key:  # added last: runs first, so an unauthenticated body is never read
        app.add_middleware(_AuthMiddleware, api_key=api_key)
    limit = max_tokens_limit or engine.max_context
    batch_tokens = max_batch_tokens or engine.config.max_batch * limit
    upload_slots = asyncio.Semaphore(max_concurrent_uploads)
    install_lock = asyncio.Lock()  # the adapter count is checked and raised in one step
    root = os.path.realpath(adapter_root) if adapter_root else None
    spill_dir = os.path.join(root, ".spilled", uuid.uuid4().hex[:12]) if root else None  # this server's alone
    app.state.spill_dir = spill_dir
    last_use: dict[str, int] = {}  # player -> tick of its last request or install (LRU spilling)
    sizes: dict[str, int] = {}  # player -> bytes of its weights in memory
    ticks = itertools.count()
    folders: dict[str, str] = {}  # player -> folder it was loaded from (shown in /v1/models)
    instance = uuid.uuid4().hex  # a client that sees it change knows the server lost its adapters
    prints: list[dict] = [fingerprint] if fingerprint else []
    if max_cpu_adapters is not None and len(adapters or {}) > max_cpu_adapters:
        raise ValueError(f"{len(adapters)} adapters to preload exceed max_cpu_adapters={max_cpu_adapters}; raise it")
    for name, folder in (adapters or {}).items():
        check_name(name)
        weights = load_folder(folder, None, max_lora_rank)
        engine.load_adapter(name, weights)
        sizes[name] = host_bytes(weights)
        folders[name] = os.path.realpath(folder)

    handlers = {
        APIError: lambda r, e: _error(e.status, e.message, e.param, e.headers),
        QueueTimeoutError: lambda r, e: _queue_timeout(e),
        UnknownPlayerError: lambda r, e: _error(404, str(e), "model"),
        AdapterError: lambda r, e: _error(400, str(e)),
        AdapterPathError: lambda r, e: _error(403, str(e), "lora_path"),
        EngineDeadError: lambda r, e: _error(503, f"{e}; the server must be restarted"),
        RequestError: lambda r, e: _error(500, f"{e}; the server goes on serving other requests"),
        RequestValidationError: lambda r, e: _error(400, _validation_message(e)),
        StarletteHTTPException: lambda r, e: _http_error(e),
        UnicodeEncodeError: lambda r, e: _error(400, "request text contains a lone surrogate; send valid Unicode"),
        Exception: lambda r, e: _error(500, f"internal server error: {e!r}"),
    }
    for cls, fn in handlers.items():
        app.add_exception_handler(cls, fn)

    # ---------------------------------------------------------------- generation helpers
    def params_for(body: _Sampling, max_tokens: int) -> SamplingParams:
        for key, neutral in _NEUTRAL.items():
            value = getattr(body, key, None)
            if value not in (None, neutral, [], {}):
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

    token_chars: list[int] = []  # longest token of the vocabulary, in characters (computed once)

    def check_fits(text: str, param: str) -> None:
        """Refuse text that cannot fit the context without tokenizing all of it: no token is
        longer than the vocabulary's longest, and a prefix's tokens already count."""
        ctx = engine.max_context
        if not token_chars:
            try:
                token_chars.append(max(len(t) for t in engine.tokenizer.get_vocab()))
            except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: a generous bound
                token_chars.append(256)
        cap = ctx * token_chars[0]
        if len(text) > cap:
            raise APIError(400, f"{param} has {len(text)} characters, more than the context of {ctx} tokens "
                                f"can hold with this tokenizer (at most {cap}); shorten it", param)
        probe = 4 * ctx
        if len(text) > probe and (n := len(engine.encode(text[:probe]))) > ctx + 64:  # 64: a cut last word
            raise APIError(400, f"{param} is longer than the context of {ctx} tokens (its first {probe} "
                                f"characters alone are {n} tokens); shorten it", param)

    def submit(prompt, player, params, on_token, rid) -> Future:
        if isinstance(prompt, str):
            check_fits(prompt, "prompt")
        if player is not None:
            last_use[player] = next(ticks)
        try:
            return engine.submit(prompt, player, params, on_token=on_token, request_id=rid, queue_timeout_s=max_queue_s,
                                 group=rid)  # each HTTP request is one group: rows are shared between them
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
        c = (await settle(request, [fut], [rid]))[0].result()
        ch = choice(chat, c.text, c.token_ids, c.logprobs, c.finish_reason, want_lp, want_ids, c.prompt_ids)
        return JSONResponse(envelope(chat, rid, model, [ch], **summary(c)))

    async def settle(request: Request, futs: list[Future], rids: list[str]) -> list[asyncio.Future]:
        """Wait for every future; a client that goes away cancels them all (499)."""
        waiters = [asyncio.wrap_future(f) for f in futs]
        try:
            while not all(w.done() for w in waiters):
                await asyncio.wait(waiters, timeout=0.25, return_when=asyncio.ALL_COMPLETED)
                if not all(w.done() for w in waiters) and await request.is_disconnected():
                    for rid in rids:
                        engine.cancel(rid)
                    raise APIError(499, "client disconnected")
        except asyncio.CancelledError:
            for rid in rids:
                engine.cancel(rid)
            raise
        return waiters

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
                            yield sse(json.loads(_error(_failure_status(exc), str(exc)).body))
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

    def chat_prompt(messages: list[Message]) -> list[int]:
        if len(messages) > max_chat_messages:
            raise APIError(400, f"messages holds {len(messages)} messages, more than this server's limit of "
                                f"{max_chat_messages} (--max-chat-messages); shorten the conversation", "messages")
        norm = []
        for i, m in enumerate(messages):
            content = m.content
            if isinstance(content, list):  # OpenAI content parts: only text is understood
                if any(not isinstance(p, dict) or p.get("type") != "text" or set(p) - {"type", "text"}
                       or not isinstance(p.get("text"), str) for p in content):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported, as "
                                        '{"type": "text", "text": "..."}', "messages")
                content = "".join(p["text"] for p in content)
                try:
                    _valid_unicode(content)
                except ValueError as exc:
                    raise APIError(400, f"messages[{i}].content {exc}", "messages") from None
            norm.append({"role": m.role, "content": content})
        check_fits("".join(m["content"] for m in norm), "messages")
        try:  # the rendered text is checked before it is tokenized: the template adds text per message
            check_fits(engine.tokenizer.apply_chat_template(norm, add_generation_prompt=True, tokenize=False),
                       "messages")
            return engine.apply_chat_template(norm)
        except APIError:
            raise
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

    @app.post("/v1/batch/completions")
    async def batch_completions(body: BatchCompletionRequest, request: Request):
        """Several text completions, each with its own ``model`` (player) and sampling fields,
        admitted to the engine together in this order, so they share their first batch (what a
        trainer's lockstep tick needs). Answers ``{"object": "list", "data": [...]}``: one
        ``text_completion`` per request, in order, or ``{"error": {...}}`` for one that failed in
        the engine. A request that is invalid, or names an unknown player, refuses the whole batch
        (400 / 404; the fields checked here name ``requests[i]``, the engine's checks of prompt
        length and token ids name the problem), and none of it runs."""
        items, group = [], f"batch-{uuid.uuid4().hex}"  # the whole batch is one group of the fair queue
        for i, item in enumerate(body.requests):
            where = f"requests[{i}]"
            prompt = item.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise APIError(400, f"{where}.prompt: one prompt per request; add a request per prompt", where)
                prompt = prompt[0]
            if item.stream:
                raise APIError(400, f"{where}.stream: a batch is answered as a whole; stream with "
                                    "/v1/completions instead", where)
            if item.echo:
                raise APIError(400, f"{where}.echo is not supported", where)
            try:
                params = params_for(item, 16 if item.max_tokens is None else item.max_tokens)
                if isinstance(prompt, str):
                    check_fits(prompt, where)
            except APIError as exc:
                raise APIError(exc.status, f"{where}: {exc.message}", where) from None
            player = None if item.model in (None, engine.name) else item.model
            items.append((prompt, player, params, None, f"cmpl-{uuid.uuid4().hex}", max_queue_s, group))
        if (asked := sum(it[2].max_tokens for it in items)) > batch_tokens:
            raise APIError(400, f"the batch asks for {asked} tokens (the sum of its max_tokens), more than this "
                                f"server's limit of {batch_tokens} (--max-batch-tokens); split it or lower max_tokens",
                           "requests")
        for it in items:
            if it[1] is not None:
                last_use[it[1]] = next(ticks)
        try:
            futs = await run_in_threadpool(engine.submit_many, items)
        except ValueError as exc:  # which request: the engine checks them in order
            raise APIError(400, f"a request of the batch: {exc}", "requests") from None
        rids = [it[4] for it in items]
        data = []
        for item, rid, w in zip(body.requests, rids, await settle(request, futs, rids)):
            if w.exception() is not None:
                exc = w.exception()
                resp = _queue_timeout(exc) if isinstance(exc, QueueTimeoutError) else _error(_failure_status(exc), str(exc))
                data.append(json.loads(resp.body))
                continue
            c = w.result()
            ch = choice(False, c.text, c.token_ids, c.logprobs, c.finish_reason, item.logprobs is not None,
                        item.return_token_ids, c.prompt_ids)
            data.append(envelope(False, rid, item.model or engine.name, [ch], **summary(c)))
        return {"object": "list", "data": data}

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
    def held_in_memory() -> list[str]:
        """Players whose weights are in memory (not spilled), least recently used first."""
        infos = [engine.adapter_info(n) for n in engine.players()]
        return sorted((i["name"] for i in infos if not i["spilled"]), key=lambda n: last_use.get(n, -1))

    def check_room(name: str) -> None:
        """Without a spill folder, refuse a new player beyond the cap before its body is read."""
        held = engine.players()
        if max_cpu_adapters is not None and spill_dir is None and name not in held and len(held) >= max_cpu_adapters:
            raise APIError(507, f"the server holds {len(held)} adapters, its limit (--max-cpu-adapters "
                                f"{max_cpu_adapters}); DELETE /v1/adapters/{{name}} of a player no longer needed, "
                                "raise the limit, or start the server with --adapter-root DIR to spill the least "
                                "recently used adapters to disk")

    async def make_room(name: str, size: int) -> None:
        """Spill least recently used idle players until ``name``'s ``size`` bytes fit under the caps
        (507 when they cannot)."""
        if max_cpu_adapters is None and max_cpu_adapter_bytes is None:
            return
        if max_cpu_adapter_bytes is not None and size > max_cpu_adapter_bytes:
            raise APIError(507, f"the adapter's weights take {size} bytes, more than this server holds for all "
                                f"adapters (--max-cpu-adapter-bytes {max_cpu_adapter_bytes}); send a smaller rank, "
                                "or raise the limit")
        check_room(name)
        others = [n for n in held_in_memory() if n != name]
        count, total = len(others) + 1, sum(sizes.get(n, 0) for n in others) + size

        def over() -> bool:
            return ((max_cpu_adapters is not None and count > max_cpu_adapters)
                    or (max_cpu_adapter_bytes is not None and total > max_cpu_adapter_bytes))

        for victim in others:
            if not over():
                break
            try:
                freed = await run_in_threadpool(engine.spill_adapter, victim, spill_dir) if spill_dir else False
            except UnknownPlayerError:  # deleted meanwhile: its room is free
                freed = True
            except OSError as exc:
                raise APIError(507, f"cannot spill adapter {victim!r} to {spill_dir} ({exc}); free disk space, or "
                                    "raise --max-cpu-adapters / --max-cpu-adapter-bytes") from None
            if freed:
                count, total = count - 1, total - sizes.get(victim, 0)
        if over():
            why = ("start the server with --adapter-root DIR to spill the least recently used adapters to disk"
                   if spill_dir is None else "every other one is in use by a queued or running request, so none "
                                             "can be spilled to disk; retry when they finish")
            raise APIError(507, f"the server holds {len(others)} adapters of {total - size} bytes in memory, and this "
                                f"one does not fit its limits (--max-cpu-adapters {max_cpu_adapters}, "
                                f"--max-cpu-adapter-bytes {max_cpu_adapter_bytes}): {why}, or raise the limit",
                           headers=RETRY_LATER if spill_dir else None)

    async def install(name: str, source, version: int | None = None) -> int:
        check_name(name)
        try:
            check_room(name)  # before a folder is read, and again under the lock
            if isinstance(source, str):  # a folder: every file must resolve inside the root
                source = await run_in_threadpool(load_folder, source, root, max_lora_rank)
            async with install_lock:
                await make_room(name, host_bytes(source))
                last_use[name] = next(ticks)
                version = await run_in_threadpool(engine.load_adapter, name, source, version)
                sizes[name] = host_bytes(source)
                return version
        except (AdapterError, APIError):
            raise
        except ValueError as exc:
            if version is not None:  # the engine's one check of a given version: newer than every earlier one
                raise APIError(409, f"adapter {name!r}: {exc}; send a newer version (or none, to take the "
                                    "next one)", "version") from None
            raise APIError(400, f"cannot load adapter {name!r}: {exc}") from None
        except OSError as exc:  # e.g. an unreadable folder
            raise APIError(400, f"cannot load adapter {name!r}: {exc}") from None

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoraRequest):
        """vLLM: load (or hot-swap) a peft / mlx-lm adapter folder that lies inside ``adapter_root``."""
        check_name(body.lora_name)
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
    async def put_adapter(name: str, request: Request, scale: float | None = None, version: int | None = None):
        """Create or hot-swap a player from raw safetensors bytes (peft or mlx-lm keys), at
        ``version`` when given (it must be newer than the loaded one)."""
        name = check_name(sent_name(request))
        if version is not None and not 1 <= version <= INT32_MAX:
            raise APIError(400, f"version must be an integer in [1, {INT32_MAX}]", "version")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("", "application/octet-stream", "application/x-safetensors"):
            raise APIError(415, f"content-type {ctype!r} is not accepted; send the raw .safetensors bytes "
                                "as application/octet-stream")
        if scale is not None and not finite32(scale):  # 1e39 is finite only as float64
            raise APIError(400, "scale must be a finite number in float32's range (|scale| <= 3.4e38)", "scale")
        declared = request.headers.get("content-length")
        declared = int(declared) if declared and declared.isdigit() else None
        if declared is not None and declared > max_upload_bytes:
            raise APIError(413, f"adapter upload of {declared} bytes exceeds the limit of {max_upload_bytes} bytes "
                                "(--max-upload-bytes)", headers=CLOSE)
        check_room(name)
        try:  # uploads beyond the limit wait for a turn, without reading their bodies
            await asyncio.wait_for(upload_slots.acquire(), timeout=body_timeout_s)
        except TimeoutError:
            raise APIError(429, f"{max_concurrent_uploads} adapter uploads are in progress (--max-concurrent-uploads); "
                                "retry later", headers=RETRY_LATER) from None
        try:
            weights = await read_upload(request, declared, scale)
        except BodyError as exc:
            raise APIError(exc.status, f"adapter upload: {exc.message}", headers=CLOSE) from None
        except AdapterError as exc:
            raise APIError(400, str(exc), headers=CLOSE) from None
        except APIError as exc:
            raise APIError(exc.status, exc.message, exc.param, CLOSE) from None
        except ClientGone:
            raise APIError(499, "client disconnected") from None
        finally:
            upload_slots.release()
        version = await install(name, weights, version)
        folders.pop(name, None)
        return {"name": name, "version": version}

    def sent_name(request: Request) -> str:
        """The adapter name exactly as sent: the route's pattern ends in ``$``, which would match
        before a trailing newline and hand ``bob`` to a request for ``bob\\n``."""
        return request.scope["path"].split("/v1/adapters/", 1)[1]

    async def read_upload(request: Request, declared: int | None, scale: float | None):
        """Read and parse a safetensors upload: the header length before the header, the header
        before the data, and the data into one buffer of the size the header declares."""
        hint = f"--body-timeout {body_timeout_s:g} s plus 1 s per MiB"
        reader = BodyReader(request.receive, time.monotonic() + body_timeout_s, hint)
        n = header_length(await reader.read(8), MAX_HEADER_BYTES)
        if declared is not None and 8 + n > declared:
            raise AdapterError(f"the header length ({n} bytes) runs past the body's {declared} bytes; send the "
                               "bytes of a .safetensors file")
        header = await run_in_threadpool(parse_header, await reader.read(n), MAX_TENSORS)
        total = header.total_bytes
        if total > max_upload_bytes:
            raise APIError(413, f"the adapter's tensors make a file of {total} bytes, more than the limit of "
                                f"{max_upload_bytes} bytes (--max-upload-bytes)")
        if declared is not None and declared != total:
            raise AdapterError(f"the body has {declared} bytes but the file its header describes has {total}; send "
                               "the .safetensors file as written, without padding or truncation")
        reader.deadline += header.data_bytes / MIN_UPLOAD_RATE
        data = await reader.read_into(header.data_bytes)
        if await reader.trailing():
            raise AdapterError(f"bytes follow the {total} bytes that the header describes, and no tensor covers "
                               "them; send the .safetensors file as written")
        return await run_in_threadpool(adapter_from_parts, header, data, scale, max_lora_rank)

    @app.get("/v1/adapters")
    async def list_adapters():
        """Every loaded player's version, rank, scale and residency, in OpenAI list format."""
        return {"object": "list", "data": [engine.adapter_info(n) for n in engine.players()]}

    @app.get("/v1/adapters/{name:path}")
    async def get_adapter(name: str, request: Request):
        """Version, rank, scale and residency of one player's adapter."""
        return engine.adapter_info(sent_name(request))

    @app.delete("/v1/adapters/{name:path}")
    async def delete_route(name: str, request: Request):
        """Remove a player."""
        return await delete_adapter(sent_name(request))

    async def delete_adapter(name: str):
        await run_in_threadpool(engine.unload_adapter, name)
        folders.pop(name, None)
        last_use.pop(name, None)
        sizes.pop(name, None)
        return {"name": name, "deleted": True}

    # ---------------------------------------------------------------- operations
    @app.get("/health")
    async def health():
        """200 while the engine thread runs and is not stuck, else 503."""
        h = engine.health()
        return JSONResponse({"status": "ok" if h["ok"] else "unhealthy", "instance": instance, **h},
                            status_code=200 if h["ok"] else 503)

    @app.get("/v1/fingerprint")
    async def get_fingerprint():
        """Hashes of the base model's config and weights: clients check them before playing."""
        if not prints:
            prints.append(await run_in_threadpool(fingerprint_engine, engine))
        return {"model": engine.name, "instance": instance, **prints[0]}

    @app.get("/v1/stats")
    async def stats():
        """Engine counters, batch occupancy, health, queue depth, loaded players and the limits."""
        health = engine.health()
        return {"stats": dict(engine.stats), "occupancy": engine.occupancy, "health": health,
                "queue": {"waiting": health["queued"], "running": health["running"],
                          "paused": engine.stats["paused"]},  # rows paused so far to give another request a row
                "players": engine.players(), "limits": limits}

    limits = {"max_tokens": limit, "max_batch_tokens": batch_tokens, "max_request_bytes": max_request_bytes,
              "max_upload_bytes": max_upload_bytes, "max_header_bytes": MAX_HEADER_BYTES, "max_tensors": MAX_TENSORS,
              "max_lora_rank": max_lora_rank, "max_cpu_adapters": max_cpu_adapters,
              "max_cpu_adapter_bytes": max_cpu_adapter_bytes,
              "max_concurrent_uploads": max_concurrent_uploads, "max_queue_s": max_queue_s,
              "max_chat_messages": max_chat_messages, "body_timeout_s": body_timeout_s,
              "preempt_after_steps": engine.config.preempt_after_steps}

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
    import uvicorn

    if threads is not None:
        from autocurricula.engine import blas as _blas
        _blas.use_threads(threads)

    _check_limits(dict(max_connections=max_connections),
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
