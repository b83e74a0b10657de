"""Connection and body limits of the HTTP server: a header timeout in uvicorn's h11 protocol, and
an ASGI body reader that reads exact byte counts for as long as they keep arriving at a minimum
rate (adapter uploads)."""

from __future__ import annotations

import asyncio
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

MIN_UPLOAD_RATE = 1 << 20  # bytes/s an adapter upload must keep up on average, after its allowance
UPLOAD_ALLOWANCE_S = 10.0  # seconds before that rate counts, and an upload's longest pause


def upload_allowance(body_timeout_s: float) -> float:
    """The fixed allowance of an upload's arrival: :data:`UPLOAD_ALLOWANCE_S`, or ``--body-timeout`` if shorter."""
    return min(UPLOAD_ALLOWANCE_S, body_timeout_s)


class UploadSlotsBusy(Exception):
    """No upload slot came free in time; the message names the limit that was full."""


class UploadSlots:
    """Adapter upload slots per client: each client (its API key, or its address on a server
    without keys) has at most ``per_client`` uploads in flight, and all clients together at most
    ``total``, so one client holding its slots never stops another's upload."""

    def __init__(self, per_client: int, total: int):
        self.per_client, self.total = per_client, total
        self._all = asyncio.Semaphore(total)
        self._clients: dict[str, list] = {}  # client -> [its semaphore, uploads holding or waiting, holding]

    def held(self, client: str = "") -> int:
        """Slots ``client`` holds now."""
        entry = self._clients.get(client)
        return entry[2] if entry else 0

    def locked(self, client: str = "") -> bool:
        """True when ``client`` could not take a slot now (its own are held, or every slot is)."""
        return self.held(client) >= self.per_client or self._all.locked()

    async def acquire(self, client: str = "", timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for a slot of ``client``'s, then for one of the total;
        :class:`UploadSlotsBusy` when either stays full."""
        entry = self._clients.setdefault(client, [asyncio.Semaphore(self.per_client), 0, 0])
        entry[1] += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            try:
                await asyncio.wait_for(entry[0].acquire(), timeout)
            except TimeoutError:
                raise UploadSlotsBusy(f"this client already has {self.per_client} adapter uploads in progress "
                                      "(--max-concurrent-uploads, per API key or address)") from None
            try:
                left = None if deadline is None else max(0.001, deadline - time.monotonic())
                await asyncio.wait_for(self._all.acquire(), left)
            except BaseException as exc:
                entry[0].release()
                if isinstance(exc, TimeoutError):
                    raise UploadSlotsBusy(f"{self.total} adapter uploads are in progress on this server (4 x "
                                          "--max-concurrent-uploads, all clients together)") from None
                raise
        except BaseException:
            self._drop(client)
            raise
        entry[2] += 1

    def release(self, client: str = "") -> None:
        """Give back a slot ``client`` holds."""
        entry = self._clients[client]
        entry[2] -= 1
        self._all.release()
        entry[0].release()
        self._drop(client)

    def _drop(self, client: str) -> None:
        entry = self._clients[client]
        entry[1] -= 1
        if entry[1] == 0:  # nobody holds or waits: forget the client
            del self._clients[client]


class BodyError(Exception):
    """The body broke a limit or ended early; ``status`` is the HTTP answer (400, 408, 413)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class ClientGone(Exception):
    """The client disconnected while its body was being read."""


def header_timeout_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers have not all arrived
    ``header_timeout_s`` after it opened or after its previous response (slow or idle sockets)."""

    class HeaderTimeoutH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._disarm()
            elif self._header_timer is None:  # first bytes of the next request's headers
                self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # idle from here: uvicorn's keep-alive timer takes over

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11


class BodyReader:
    """Reads an ASGI request body in exact amounts for as long as it keeps arriving. Byte ``k`` is
    due ``allowance_s + k / min_rate`` seconds after the reader starts (a minimum average rate
    after a fixed allowance), and the reader waits at most ``allowance_s`` for any one chunk: a
    client that stops sending is dropped within ``allowance_s``, whatever its body declares, and
    one that keeps sending holds the connection only as long as its bytes take at ``min_rate``.
    ``hint`` ends the 408's message (the settings that gave these numbers)."""

    def __init__(self, receive, allowance_s: float, min_rate: float, hint: str):
        self.receive, self.allowance_s, self.min_rate, self.hint = receive, allowance_s, min_rate, hint
        self.start = time.monotonic()
        self.received = 0
        self.buffer, self.more = b"", True

    async def _chunk(self) -> bytes:
        left = self.start + self.allowance_s + self.received / self.min_rate - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            message = await asyncio.wait_for(self.receive(), timeout=min(left, self.allowance_s))
        except TimeoutError:
            raise BodyError(408, f"the request body did not arrive in time: {self.received} bytes came in "
                                 f"{time.monotonic() - self.start:.1f} s ({self.hint})") from None
        if message["type"] != "http.request":
            raise ClientGone()
        self.more = message.get("more_body", False)
        body = message.get("body", b"")
        self.received += len(body)
        return body

    async def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes (400 when the body ends first), gathered as they arrive."""
        out = bytearray(self.buffer[:n])
        self.buffer = self.buffer[n:]
        while len(out) < n:
            if not self.more:
                raise BodyError(400, f"the body ends after {len(out)} of the {n} bytes expected; send the whole file")
            chunk = await self._chunk()
            take = n - len(out)
            out += chunk[:take]
            self.buffer = chunk[take:]
        return bytes(out)

    async def read_into(self, target: memoryview) -> None:
        """Fill ``target`` (a writable byte view, e.g. of a tensor's array) with the next
        ``len(target)`` bytes, each chunk copied in as it arrives (400 when the body ends first)."""
        n = len(target)
        filled = min(n, len(self.buffer))
        target[:filled] = self.buffer[:filled]
        self.buffer = self.buffer[filled:]
        while filled < n:
            if not self.more:
                raise BodyError(400, f"the body ends {n - filled} bytes short of what its header declares; "
                                     "send the whole file")
            chunk = await self._chunk()
            take = min(n - filled, len(chunk))
            target[filled : filled + take] = memoryview(chunk)[:take]
            filled += take
            self.buffer = chunk[take:]

    async def trailing(self) -> int:
        """How many bytes follow what was read (0 at the end). Stops at the first extra byte."""
        while not self.buffer and self.more:
            self.buffer = await self._chunk()
        return len(self.buffer)
