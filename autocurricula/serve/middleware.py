"""The server's ASGI middleware: the API key check and the JSON body limit. Pure ASGI (unlike
``BaseHTTPMiddleware``), so streaming and disconnect detection stay intact."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Sequence

from autocurricula.serve.errors import CLOSE, error_response


def is_adapter_upload(scope) -> bool:
    """``PUT /v1/adapters/{name}``: streams to its route, which has its own limits."""
    return scope["method"] == "PUT" and scope["path"].startswith("/v1/adapters/")


class AuthMiddleware:
    """Requires ``Authorization: Bearer <api_key>`` on every path, docs and unknown routes
    included, except ``/health``. ``api_key``: one key, or several (one per client)."""

    def __init__(self, app, api_key: str | Sequence[str]):
        keys = [api_key] if isinstance(api_key, str) else list(api_key)
        self.app, self.expected = app, [f"Bearer {key}".encode() for key in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not any([hmac.compare_digest(given, key) for key in self.expected]):  # every key compared
                msg = "missing or wrong API key; send the header 'Authorization: Bearer <key>'"
                return await error_response(401, msg)(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads the whole body before the app parses anything and answers 413 once it passes
    ``limit`` bytes (the declared Content-Length is checked first, then the bytes counted), or 408
    when it has not all arrived ``timeout`` seconds after the headers. ``exempt`` requests pass
    through unread."""

    def __init__(self, app, limit: int, timeout: float, exempt):
        self.app, self.limit, self.timeout, self.exempt = app, limit, timeout, exempt

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.exempt(scope):
            return await self.app(scope, receive, send)
        msg = (f"request body exceeds this server's limit of {self.limit} bytes (--max-request-bytes); "
               "send a shorter prompt")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await error_response(413, msg, headers=CLOSE)(scope, receive, send)
        chunks, size, deadline = [], 0, time.monotonic() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                msg = f"request body did not arrive within {self.timeout:g} s (--body-timeout); send it at once"
                return await error_response(408, msg, headers=CLOSE)(scope, receive, send)
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await error_response(413, msg, headers=CLOSE)(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():  # the buffered body once, then the real channel (disconnects)
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)
