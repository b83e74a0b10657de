"""HTTP clients for :mod:`autocurricula.serve.server` (sync :class:`Client`, asyncio :class:`AsyncClient`).

On :class:`AsyncClient` the methods are coroutines and the streaming ones async iterators.
Connection errors, 429 and 503 are retried with exponential backoff (at least ``Retry-After``, at
most ``max_backoff``); other errors raise a :class:`ServerError` subclass with the server's message::

    with Client("http://127.0.0.1:8000") as c:
        c.upload_adapter("alice", weights)
        print(c.completions("Once upon", model="alice", max_tokens=16)["choices"][0]["text"])
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator
from urllib.parse import quote

import httpx

from autocurricula.engine.adapters import to_safetensors_bytes


class ServerError(Exception):
    """An error answer from the server, or no answer (``status`` None: unreachable, timed out)."""

    def __init__(self, status: int | None, message: str, body: Any = None):
        super().__init__(f"[{status}] {message}" if status else message)
        self.status, self.message, self.body = status, message, body


class BadRequestError(ServerError):
    """400 / 415: the request is invalid; the message says which field and how to fix it."""


class AuthError(ServerError):
    """401: missing or wrong API key."""


class PermissionDeniedError(ServerError):
    """403: the server does not allow this (e.g. a path outside its adapter root)."""


class NotFoundError(ServerError):
    """404: unknown model/player, adapter or route."""


class ConflictError(ServerError):
    """409: an adapter upload's version is not newer than the one the server holds."""


class UnavailableError(ServerError):
    """503 after all retries (engine dead or stuck, or its queue full), or the server could not be reached."""


class TooManyRequestsError(UnavailableError):
    """429 after all retries: the server's limit on concurrent adapter uploads was reached."""


class InsufficientStorageError(ServerError):
    """507: the server holds as many adapters as its ``--max-cpu-adapters`` allows; delete one first."""


_BY_STATUS = {400: BadRequestError, 401: AuthError, 403: PermissionDeniedError, 404: NotFoundError,
              408: BadRequestError, 409: ConflictError, 413: BadRequestError, 415: BadRequestError,
              422: BadRequestError, 429: TooManyRequestsError, 503: UnavailableError, 507: InsufficientStorageError}
_RETRY_STATUS = (None, 429, 503)
# Retried: the connection failed before an answer came. ReadError / WriteError /
# RemoteProtocolError are what a reused keep-alive connection gives when the server closed it as
# the request went out; sending again is safe because every request of this client is idempotent
# (generation changes no state; adapter PUT / load set the same weights again; a versioned PUT
# that already went through answers 409, see RemoteEngine). Timeouts are not retried: the server
# may still be working on the request.
_RETRY_ON = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
             httpx.WriteError)


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else json.dumps(body)
    except (ValueError, KeyError, TypeError, AttributeError):
        body, message = None, resp.text or resp.reason_phrase
    raise _BY_STATUS.get(resp.status_code, ServerError)(resp.status_code, message, body)


_DONE = object()


def _sse_data(line: str):
    """The JSON of one ``data:`` line, None for other lines, ``_DONE`` at ``data: [DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return _DONE
    obj = json.loads(data)
    if isinstance(obj.get("error"), dict):  # an error after the stream had started
        err = obj["error"]
        raise _BY_STATUS.get(err.get("code"), ServerError)(err.get("code"), err.get("message", ""), obj)
    return obj


@dataclass
class _Req:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict | None = None
    headers: dict = field(default_factory=dict)
    retry: bool = True
    ok: tuple[int, ...] = ()  # error statuses returned as a body instead of raised
    result: Any = None  # post-processing of the JSON body
    text: bool = False  # the body as text (not JSON); JSON bodies of errors are still read


class _Base:
    """Request builders shared by both clients; subclasses implement ``_run`` and ``_stream``."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 600.0,
                 max_retries: int = 3, backoff: float = 0.5, max_backoff: float = 8.0, transport=None):
        """``backoff`` seconds before the first retry, doubling up to ``max_backoff``; ``transport``
        is passed to httpx (tests use ``httpx.MockTransport``)."""
        self.base_url = base_url.rstrip("/")
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = self._http_class(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def _delay(self, attempt: int, resp: httpx.Response | None = None) -> float:
        wait = self.backoff * 2**attempt
        hint = resp.headers.get("retry-after", "") if resp is not None else ""
        if hint.isdigit():
            wait = max(wait, float(hint))
        return min(self.max_backoff, wait)

    def _failed(self, exc: httpx.TransportError) -> ServerError:
        if isinstance(exc, _RETRY_ON):
            return UnavailableError(None, f"cannot reach {self.base_url}: {exc!r}")
        return ServerError(None, f"request to {self.base_url} failed: {exc!r}")  # e.g. a read timeout

    def completions(self, prompt: str | list[int], model: str | None = None, max_tokens: int = 16, **params):
        """``POST /v1/completions``; ``params`` are OpenAI/vLLM fields (temperature, stop, seed,
        logprobs, return_token_ids, ...). Returns the response JSON."""
        body = self._body(prompt=prompt, model=model, max_tokens=max_tokens, **params)
        return self._run(_Req("POST", "/v1/completions", json=body))

    def batch_completions(self, requests: list[dict]):
        """``POST /v1/batch/completions``: each dict holds one completion request's fields
        (``prompt``, ``model``, ``max_tokens``, ...); the server admits them together. Returns the
        list of ``text_completion`` bodies, in order (an entry that failed in the engine is an
        ``{"error": {...}}`` dict)."""
        body = {"requests": [self._body(**r) for r in requests]}
        return self._run(_Req("POST", "/v1/batch/completions", json=body, result=lambda b: b["data"]))

    def chat(self, messages: list[dict], model: str | None = None, **params):
        """``POST /v1/chat/completions``; returns the response JSON."""
        body = self._body(messages=messages, model=model, **params)
        return self._run(_Req("POST", "/v1/chat/completions", json=body))

    def stream_completions(self, prompt: str | list[int], model: str | None = None, max_tokens: int = 16, **params):
        """Streaming :meth:`completions`: iterate over the chunk dicts (the last one has usage)."""
        body = self._body(prompt=prompt, model=model, max_tokens=max_tokens, stream=True, **params)
        return self._stream(_Req("POST", "/v1/completions", json=body))

    def stream_chat(self, messages: list[dict], model: str | None = None, **params):
        """Streaming :meth:`chat`: iterate over ``chat.completion.chunk`` dicts."""
        body = self._body(messages=messages, model=model, stream=True, **params)
        return self._stream(_Req("POST", "/v1/chat/completions", json=body))

    def models(self):
        """The served models: the base model first, then every loaded player."""
        return self._run(_Req("GET", "/v1/models", result=lambda body: body["data"]))

    def load_adapter(self, name: str, path: str):
        """Load or hot-swap a player from a peft / mlx-lm folder inside the server's adapter root."""
        return self._run(_Req("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}))

    def unload_adapter(self, name: str):
        """Remove a player."""
        return self._run(_Req("DELETE", f"/v1/adapters/{quote(name, safe='')}"))

    def load_lora_adapter(self, name: str, path: str):
        """``POST /v1/load_lora_adapter`` as vLLM answers it (a text body): load the adapter folder
        ``path`` (as the server sees it) under ``name``. Returns the body's text."""
        return self._run(_Req("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
                              text=True))

    def unload_lora_adapter(self, name: str):
        """``POST /v1/unload_lora_adapter`` (vLLM's route, which our server answers too): remove a
        loaded adapter by name. Returns the body's text."""
        return self._run(_Req("POST", "/v1/unload_lora_adapter", json={"lora_name": name}, text=True))

    def tokenize(self, prompt: str, model: str | None = None, add_special_tokens: bool = True):
        """``POST /tokenize`` (vLLM's route): the token ids of ``prompt`` with the server's tokenizer."""
        body = self._body(prompt=prompt, model=model, add_special_tokens=add_special_tokens)
        return self._run(_Req("POST", "/tokenize", json=body, result=lambda b: list(b["tokens"])))

    def live(self) -> str:
        """``GET /health`` as vLLM answers it (200 with no JSON body): the body's text; an error
        status raises. Not retried."""
        return self._run(_Req("GET", "/health", retry=False, text=True))

    def metrics(self) -> str:
        """``GET /metrics``: vLLM's Prometheus text."""
        return self._run(_Req("GET", "/metrics", text=True))

    def upload_adapter(self, name: str, weights, scale: float | None = None, version: int | None = None):
        """Create or hot-swap a player from ``AdapterWeights`` or safetensors bytes, at ``version``
        when given (:class:`ConflictError` if the server holds that version or a newer one);
        returns ``{"name", "version"}``."""
        if not isinstance(weights, (bytes, bytearray, memoryview)):
            weights = to_safetensors_bytes(weights)
        params = {k: v for k, v in (("scale", scale), ("version", version)) if v is not None}
        return self._run(_Req("PUT", f"/v1/adapters/{quote(name, safe='')}", content=bytes(weights),
                              params=params or None, headers={"Content-Type": "application/octet-stream"}))

    def adapter_info(self, name: str):
        """Version, rank, scale and residency of a player's adapter."""
        return self._run(_Req("GET", f"/v1/adapters/{quote(name, safe='')}"))

    def adapters(self):
        """:meth:`adapter_info` of every loaded player, as a list."""
        return self._run(_Req("GET", "/v1/adapters", result=lambda body: body["data"]))

    def fingerprint(self):
        """The base model's fingerprint (``kind``, ``config``, ``weights`` hashes), its ``model``
        name and the server's ``instance`` id."""
        return self._run(_Req("GET", "/v1/fingerprint"))

    def stats(self):
        """Engine counters, occupancy, health and loaded players."""
        return self._run(_Req("GET", "/v1/stats"))

    def health(self):
        """The server's health dict (``status`` is ``"ok"`` or ``"unhealthy"``); not retried."""
        return self._run(_Req("GET", "/health", retry=False, ok=(503,)))

    @staticmethod
    def _body(**fields) -> dict:
        return {k: v for k, v in fields.items() if v is not None}

    def _kwargs(self, req: _Req) -> dict:
        return {"json": req.json, "content": req.content, "params": req.params, "headers": req.headers}

    def _finish(self, req: _Req, resp: httpx.Response):
        if resp.status_code not in req.ok:
            _raise_for(resp)
        if req.text:
            return resp.text
        body = resp.json()
        return req.result(body) if req.result else body

    def _should_retry(self, req: _Req, attempt: int, status: int | None) -> bool:
        return req.retry and attempt < self.max_retries and status in _RETRY_STATUS


class Client(_Base):
    """Synchronous client (``httpx.Client``). Use as a context manager or call :meth:`close`."""

    _http_class = httpx.Client

    def _send(self, req: _Req, stream: bool = False) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            resp = None
            try:
                request = self._http.build_request(req.method, req.path, **self._kwargs(req))
                resp = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if not (isinstance(exc, _RETRY_ON) and self._should_retry(req, attempt, None)):
                    raise self._failed(exc) from exc
            else:
                if resp.status_code in req.ok or not self._should_retry(req, attempt, resp.status_code):
                    return resp
                resp.close()
            time.sleep(self._delay(attempt, resp))
        raise AssertionError("unreachable")

    def _run(self, req: _Req):
        return self._finish(req, self._send(req))

    def _stream(self, req: _Req) -> Iterator[dict]:
        resp = self._send(req, stream=True)
        try:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            for line in resp.iter_lines():
                chunk = _sse_data(line)
                if chunk is _DONE:
                    return
                if chunk is not None:
                    yield chunk
        finally:
            resp.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncClient(_Base):
    """asyncio client (``httpx.AsyncClient``): same methods as :class:`Client`, awaited; the
    ``stream_*`` methods return async iterators. Use ``async with`` or await :meth:`aclose`."""

    _http_class = httpx.AsyncClient

    async def _send(self, req: _Req, stream: bool = False) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            resp = None
            try:
                request = self._http.build_request(req.method, req.path, **self._kwargs(req))
                resp = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if not (isinstance(exc, _RETRY_ON) and self._should_retry(req, attempt, None)):
                    raise self._failed(exc) from exc
            else:
                if resp.status_code in req.ok or not self._should_retry(req, attempt, resp.status_code):
                    return resp
                await resp.aclose()
            await asyncio.sleep(self._delay(attempt, resp))
        raise AssertionError("unreachable")

    async def _run(self, req: _Req):
        return self._finish(req, await self._send(req))

    async def _stream(self, req: _Req) -> AsyncIterator[dict]:
        resp = await self._send(req, stream=True)
        try:
            if resp.status_code >= 400:
                await resp.aread()
                _raise_for(resp)
            async for line in resp.aiter_lines():
                chunk = _sse_data(line)
                if chunk is _DONE:
                    return
                if chunk is not None:
                    yield chunk
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
