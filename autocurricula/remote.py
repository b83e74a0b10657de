"""An engine made of ``autocurricula serve`` servers: rollouts over HTTP, adapters pushed to them.

:class:`RemoteEngine` implements :class:`~autocurricula.engine.protocol.EngineProtocol` over one
or many servers that run the same base model::

    remote = RemoteEngine(["http://127.0.0.1:8000", "http://127.0.0.1:8001"], base="path/to/model")
    remote.load_adapter("alice", weights, version=3)     # pushed to every server holding alice
    c = remote.submit("Once upon", "alice", SamplingParams(max_tokens=16)).result()
    c.token_ids, c.logprobs, c.adapter_version             # from the server, never re-tokenized

- At connect, each server's base model must have the fingerprint of ``base`` (config and
  weights, :mod:`autocurricula.engine.fingerprint`); a mismatch raises
  :class:`~autocurricula.engine.fingerprint.BaseModelMismatchError` before any request.
- Players are placed on servers: sticky per player (its adapter stays resident there), a new
  player goes to the server with the fewest players. A server that does not hold a player's
  current version gets it uploaded (binary safetensors, with the version) before the request.
- A server that cannot be reached, answers 503 or times out is marked down; the request is sent
  again to another server (after uploading the player there), counted in ``stats["retried"]``.
  A background poll brings a down server back once it is healthy, its base model checked again
  and every adapter it held re-uploaded at its current version, before it gets work.

All HTTP work runs on one asyncio loop in a background thread; :meth:`RemoteEngine.submit`
returns a ``concurrent.futures.Future`` like the in-process engine's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autocurricula.client import AsyncClient, ConflictError, NotFoundError, ServerError, UnavailableError
from autocurricula.engine.adapters import AdapterWeights, from_tensors, load_folder, to_safetensors_bytes
from autocurricula.engine.engine import UnknownPlayerError
from autocurricula.engine.fingerprint import BaseModelMismatchError, compare, fingerprint_engine, fingerprint_folder
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion
from autocurricula.placement import FleetFront, pick_worker

__all__ = ["BaseModelMismatchError", "RemoteEngine"]

log = logging.getLogger(__name__)


@dataclass
class _Adapter:
    data: bytes  # safetensors, scale in the metadata
    version: int


@dataclass
class _Server:
    url: str
    client: AsyncClient  # generation and uploads
    probe: AsyncClient  # health and fingerprint, short timeout
    up: bool = False
    instance: str | None = None
    held: dict[str, int | None] = field(default_factory=dict)  # player -> version it holds (None: unknown)
    # player -> server version minus ours, for players the server knew from an earlier run (its
    # versions of a name only grow); applied to every upload and every completion
    offset: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    completions: int = 0
    error: str | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock(self, player: str) -> asyncio.Lock:
        return self.locks.setdefault(player, asyncio.Lock())


def _failed_server(exc: ServerError) -> bool:
    """No answer (refused, reset, timed out) or 503: the server, not the request, is at fault."""
    return exc.status in (None, 503)


class RemoteEngine(FleetFront):
    """The engine protocol over ``autocurricula serve`` servers (see the module docstring).

    ``servers``: one URL or a list. ``base``: the trainer's base model, as a model folder / Hub
    id or a loaded :class:`~autocurricula.engine.Engine`; it gives the tokenizer and the
    fingerprint every server must match (or pass ``tokenizer`` and ``fingerprint``, or
    ``check_base=False``). ``api_key``: sent to every server. ``timeout``: seconds one request may
    take before its server counts as failed, and how long a request waits for a server to come
    back when all are down. ``poll_s``: how often the servers' health is probed.
    """

    def __init__(self, servers: str | list[str], base: Any = None, *, tokenizer: Any = None,
                 api_key: str | None = None, timeout: float = 600.0, check_base: bool = True,
                 fingerprint: dict | None = None, poll_s: float = 1.0, connect_timeout: float = 30.0):
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError("servers must be a list of http(s):// URLs of `autocurricula serve` servers, "
                             f"got {servers!r}")
        urls = [u.rstrip("/") for u in urls]
        if len(set(urls)) != len(urls):
            raise ValueError(f"servers lists a URL twice: {urls}")
        if not (isinstance(poll_s, (int, float)) and poll_s > 0 and timeout > 0):
            raise ValueError("poll_s and timeout must be positive numbers of seconds")
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer_of(base)
        if check_base and fingerprint is None:
            if base is None:
                raise ValueError("pass base= (the trainer's model folder, Hub id or Engine) so the servers' base "
                                 "model can be checked, or check_base=False")
            fingerprint = fingerprint_engine(base) if hasattr(base, "submit") else fingerprint_folder(base)
        self.expected = fingerprint if check_base else None
        self.poll_s, self.timeout = poll_s, timeout
        self.name = getattr(base, "name", None) or (str(base) if base is not None else "base")
        self.stats = {"completions": 0, "retried": 0, "uploads": 0, "resyncs": 0, "failed": 0}
        self._adapters: dict[str, _Adapter] = {}
        self._last_version: dict[str, int] = {}
        self._placement: dict[str, _Server] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="autocurricula-remote", daemon=True)
        self._thread.start()

        async def make():
            return [_Server(u, AsyncClient(u, api_key=api_key, timeout=timeout, max_retries=0),
                            AsyncClient(u, api_key=api_key, timeout=min(10.0, timeout), max_retries=0)) for u in urls]

        self.servers: list[_Server] = self._call(make()).result()
        try:
            self._call(self._connect()).result(connect_timeout)
        except BaseException:
            self.close()
            raise
        self._poller = self._call(self._poll())

    # ------------------------------------------------------------------ protocol (any thread)
    def submit(self, prompt: str | list[int], player: str | None = None, params: SamplingParams | None = None,
               on_token=None, request_id: str | None = None) -> Future:
        """Queue one completion on a server; returns a Future of
        :class:`~autocurricula.engine.scheduler.Completion` with the server's token ids."""
        if on_token is not None:
            raise ValueError("RemoteEngine does not stream tokens to on_token; use the in-process Engine, or "
                             "Client.stream_completions for one server")
        ids, player, params, rid = self._prepare(prompt, player, params, request_id)
        return self._call(self._complete(ids, player, params, rid))

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        """Queue ``[(prompt, player, params), ...]`` together. The requests bound for one server
        leave in one call (``POST /v1/batch/completions``) and are admitted there together, in
        this order, as an in-process engine admits a lockstep tick. The part of a server that
        fails is retried request by request on the others. All are checked first: one bad
        request queues none."""
        items = [self._prepare(*r) for r in requests]
        futs = [Future() for _ in items]
        self._call(self._complete_many(items, futs))
        return futs

    def _prepare(self, prompt, player=None, params=None, request_id=None) -> tuple:
        self._check_open()
        params = params or SamplingParams()
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt is empty; give at least one token")
        if player == self.name:
            player = None
        if player is not None and player not in self._adapters:
            raise UnknownPlayerError(f"unknown player {player!r}; load its adapter first (loaded: {self.players()})")
        return ids, player, params, request_id or f"remote-{next(self._ids)}"

    def _adapter(self, source: Any, version: int) -> _Adapter:
        return _Adapter(_safetensors_of(source), version)

    def adapter_info(self, name: str) -> dict:
        """``{"name", "version", "servers"}``: the current version and the servers holding it."""
        ad = self._held(name)
        return {"name": name, "version": ad.version,
                "servers": [s.url for s in self.servers if s.held.get(name) == ad.version]}


    def placement(self, name: str) -> str | None:
        """The URL of the server a player's requests go to (None before its first request)."""
        srv = self._placement.get(name)
        return srv.url if srv else None

    def health(self) -> dict:
        """``ok`` while at least one server takes work; one entry per server."""
        servers = [{"url": s.url, "up": s.up, "inflight": s.inflight, "players": sorted(s.held),
                    "completions": s.completions, "error": s.error} for s in self.servers]
        return {"ok": not self._closed and any(s.up for s in self.servers), "servers": servers}

    def wait_until_up(self, url: str, timeout: float = 30.0) -> bool:
        """Block until the server at ``url`` is up (re-synced) or ``timeout`` runs out."""
        srv = next(s for s in self.servers if s.url == url.rstrip("/"))
        deadline = time.monotonic() + timeout
        while not srv.up and time.monotonic() < deadline:
            time.sleep(0.05)
        return srv.up

    def close(self) -> None:
        """Stop polling and close every connection."""
        if self._closed:
            return
        self._closed = True

        async def shutdown():
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
            for s in getattr(self, "servers", []):
                await s.client.aclose()
                await s.probe.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    # ------------------------------------------------------------------ loop thread
    async def _connect(self) -> None:
        results = await asyncio.gather(*(self._bring_up(s) for s in self.servers), return_exceptions=True)
        for r in results:  # a wrong key or base model is an error; an unreachable server is polled
            if isinstance(r, BaseException):
                raise r
        if not any(s.up for s in self.servers):
            raise UnavailableError(None, "no server could be reached: " + "; ".join(
                f"{s.url}: {s.error}" for s in self.servers) + "; start them with `autocurricula serve --model M`")

    async def _bring_up(self, srv: _Server) -> None:
        """Check a server's base model and re-upload every adapter it held; then it takes work."""
        try:
            fp = await srv.probe.fingerprint()
            if self.expected is not None:
                compare(self.expected, fp, srv.url)
            if fp.get("instance") != srv.instance and srv.instance is not None:
                srv.held = dict.fromkeys(srv.held)  # restarted: it holds nothing it held before
            for player in list(srv.held):
                if player not in self._adapters:
                    srv.held.pop(player, None)
                    continue
                try:
                    info = await srv.client.adapter_info(player)
                    srv.held[player] = info["version"] - srv.offset.get(player, 0)
                except NotFoundError:
                    srv.held[player] = None
                await self._ensure(srv, player)
            if srv.instance is not None:
                self.stats["resyncs"] += 1
            srv.instance, srv.error, srv.up = fp.get("instance"), None, True
        except BaseModelMismatchError as exc:
            srv.error = str(exc)
            raise
        except ServerError as exc:
            srv.error = exc.message
            if exc.status not in (None, 503):
                raise

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            # concurrently: a hung server's probe timing out must not delay noticing the others
            await asyncio.gather(*(self._check(s) for s in self.servers))

    async def _check(self, srv: _Server) -> None:
        try:
            h = await srv.probe.health()
        except ServerError:
            h = {"status": "unreachable"}
        ok = h.get("status") == "ok"
        if srv.up and (not ok or h.get("instance") != srv.instance):  # down, or restarted between polls
            self._down(srv, f"health: {h.get('status')}, instance {h.get('instance')}")
        if not srv.up and ok:
            try:
                await self._bring_up(srv)
            except Exception as exc:  # noqa: BLE001 - stays down; said in health()
                if srv.error != str(exc):  # once per new reason, not every poll
                    log.error("server %s stays out of rotation: %s", srv.url, exc)
                srv.error = str(exc)
            if srv.up:
                log.warning("server %s is back and re-synced (%d players)", srv.url, len(srv.held))

    def _down(self, srv: _Server, why: str) -> None:
        if srv.up:
            log.warning("server %s is down (%s); its requests go to the other servers", srv.url, why)
        srv.up, srv.error = False, why
        srv.held = dict.fromkeys(srv.held)  # versions unknown until it is checked again

    def _pick(self, player: str | None, tried: set[int]) -> _Server | None:
        return pick_worker([s for s in self.servers if s.up and id(s) not in tried], self._placement, player)

    async def _ensure(self, srv: _Server, player: str) -> None:
        """Upload the player's current version unless the server holds it already."""
        ad = self._adapters.get(player)
        if ad is not None and srv.held.get(player) == ad.version:  # the common case: no lock
            return
        async with srv.lock(player):
            while True:
                ad = self._adapters.get(player)
                if ad is None:
                    raise UnknownPlayerError(f"player {player!r} was unloaded")
                if srv.held.get(player) == ad.version:
                    return
                off = srv.offset.get(player, 0)
                try:
                    await srv.client.upload_adapter(player, ad.data, version=ad.version + off)
                except ConflictError:
                    try:
                        now = (await srv.client.adapter_info(player))["version"]
                    except NotFoundError:
                        now = None
                    if now != ad.version + off:  # not a lost answer: the name was used before there
                        there = (await srv.client.upload_adapter(player, ad.data))["version"]
                        srv.offset[player] = there - ad.version
                        log.warning("server %s knew player %r from an earlier run (version %d there is %d "
                                    "here); serving it under a version offset", srv.url, player, there, ad.version)
                self.stats["uploads"] += 1
                srv.held[player] = ad.version

    async def _complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        tried: set[int] = set()
        lost_adapter = False
        deadline = time.monotonic() + self.timeout
        while True:
            # another server first; the failed ones again once the poll has brought them back
            srv = self._pick(player, tried) or self._pick(player, set())
            if srv is None:  # every server down: wait for one to come back, up to the request timeout
                if time.monotonic() > deadline:
                    self.stats["failed"] += 1
                    raise UnavailableError(None, f"no server came up within {self.timeout:g} s (" + "; ".join(
                        f"{s.url}: {s.error}" for s in self.servers) + ")")
                await asyncio.sleep(min(0.1, self.poll_s))
                continue
            srv.inflight += 1
            try:
                if player is not None:
                    await self._ensure(srv, player)
                body = await srv.client.completions(**_fields(ids, player, params))
            except NotFoundError:
                if player is None or lost_adapter:
                    raise
                lost_adapter = True  # restarted between two polls: upload again, same server
                srv.held[player] = None
                continue
            except ServerError as exc:
                if not _failed_server(exc):
                    raise
                self._down(srv, exc.message)
                tried.add(id(srv))
                self.stats["retried"] += 1
                continue
            finally:
                srv.inflight -= 1
            srv.completions += 1
            self.stats["completions"] += 1
            return _completion(body, rid, player, srv.offset.get(player, 0) if player else 0)

    async def _complete_many(self, items: list[tuple], futs: list[Future]) -> None:
        groups: dict[int, tuple[_Server | None, list[int]]] = {}
        for i, (_, player, _, _) in enumerate(items):
            srv = self._pick(player, set())
            groups.setdefault(id(srv), (srv, []))[1].append(i)
        await asyncio.gather(*(self._batch_on(srv, idx, items, futs) for srv, idx in groups.values()))

    async def _batch_on(self, srv: _Server | None, idx: list[int], items: list[tuple], futs: list[Future]) -> None:
        """One batch call to ``srv``; what it cannot answer goes request by request (``_complete``
        waits for a server, re-uploads a lost adapter, retries on another server)."""
        async def one(i: int) -> None:
            try:
                _deliver(futs[i], result=await self._complete(*items[i]))
            except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
                _deliver(futs[i], exc=exc)

        if srv is None or len(idx) == 1:
            await asyncio.gather(*(one(i) for i in idx))
            return
        counted = len(idx)
        srv.inflight += counted
        try:
            for player in dict.fromkeys(items[i][1] for i in idx):
                if player is None:
                    continue
                try:
                    await self._ensure(srv, player)
                except UnknownPlayerError as exc:  # unloaded meanwhile: only its own requests fail
                    for i in [i for i in idx if items[i][1] == player]:
                        _deliver(futs[i], exc=exc)
                    idx = [i for i in idx if items[i][1] != player]
            if not idx:
                return
            bodies = await srv.client.batch_completions([_fields(*items[i][:3]) for i in idx])
        except NotFoundError:  # restarted between two polls: the one-by-one path uploads again
            bodies = None
        except ServerError as exc:
            if not _failed_server(exc):
                for i in idx:
                    _deliver(futs[i], exc=exc)
                return
            self._down(srv, exc.message)
            self.stats["retried"] += len(idx)
            bodies = None
        except BaseException as exc:  # noqa: BLE001 - anything else: every request of the call gets it
            for i in idx:
                _deliver(futs[i], exc=exc)
            return
        finally:
            srv.inflight -= counted
        if bodies is None:
            await asyncio.gather(*(one(i) for i in idx))
            return
        for i, body in zip(idx, bodies):
            _, player, _, rid = items[i]
            if "error" in body:
                err = body["error"]
                _deliver(futs[i], exc=ServerError(err.get("code"), err.get("message", str(err)), body))
                continue
            srv.completions += 1
            self.stats["completions"] += 1
            _deliver(futs[i], result=_completion(body, rid, player, srv.offset.get(player, 0) if player else 0))

    async def _install(self, name: str, ad: _Adapter) -> int:
        old = self._adapters.get(name)
        self._adapters[name], self._last_version[name] = ad, ad.version
        holders = [s for s in self.servers if s.up and name in s.held]
        results = await asyncio.gather(*(self._ensure(s, name) for s in holders), return_exceptions=True)
        for s, r in zip(holders, results):
            if isinstance(r, ServerError) and _failed_server(r):
                self._down(s, r.message)  # re-synced when it is back
            elif isinstance(r, BaseException):
                if old is not None:  # a refused adapter (bad shapes): keep serving the old one
                    self._adapters[name] = old
                else:
                    self._adapters.pop(name, None)
                raise r
        return ad.version

    async def _drop(self, name: str) -> None:
        self._adapters.pop(name, None)
        self._placement.pop(name, None)
        for s in self.servers:
            if name in s.held:
                s.held.pop(name)
                if s.up:
                    try:
                        await s.client.unload_adapter(name)
                    except NotFoundError:
                        pass
                    except ServerError as exc:
                        if not _failed_server(exc):
                            raise
                        self._down(s, exc.message)

    async def _occupancy(self) -> float:
        vals = []
        for s in self.servers:
            if s.up:
                try:
                    vals.append(float((await s.probe.stats())["occupancy"]))
                except ServerError:
                    pass
        return sum(vals) / len(vals) if vals else 0.0


def _fields(ids: list[int], player: str | None, params: SamplingParams) -> dict:
    """A completion request's fields: token ids in, token ids and logprobs back."""
    return dict(prompt=ids, model=player, max_tokens=params.max_tokens, temperature=params.temperature,
                top_p=params.top_p, top_k=params.top_k, stop=params.stop or None, seed=params.seed,
                ignore_eos=params.ignore_eos or None, logprobs=0, return_token_ids=True)


def _deliver(fut: Future, result: Any = None, exc: BaseException | None = None) -> None:
    if not fut.done():  # set once, whatever path answers first
        fut.set_exception(exc) if exc is not None else fut.set_result(result)


def _completion(body: dict, rid: str, player: str | None, offset: int = 0) -> Completion:
    ch = body["choices"][0]
    lps = (ch.get("logprobs") or {}).get("token_logprobs") or []
    ours = lambda v: None if v is None else v - offset  # noqa: E731 - the server's version in the trainer's numbering
    return Completion(request_id=rid, player=player, prompt_ids=list(ch["prompt_token_ids"]),
                      token_ids=list(ch["token_ids"]), logprobs=[float(x) for x in lps], text=ch["text"],
                      finish_reason=ch["finish_reason"], adapter_version=ours(body.get("adapter_version")),
                      version_spans=[(s, e, ours(v)) for s, e, v in body.get("version_spans") or []])


def _safetensors_of(source: Any) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, Path)):
        source = load_folder(source)
    elif isinstance(source, dict) and isinstance(source.get("tensors"), dict):
        import numpy as np

        source = from_tensors({k: np.asarray(v) for k, v in source["tensors"].items()}, scale=source.get("scale"))
    if not isinstance(source, AdapterWeights):
        raise TypeError("source must be AdapterWeights, an adapter folder, safetensors bytes or "
                        "{'tensors': {...}, 'scale': s}")
    return to_safetensors_bytes(source)


def _tokenizer_of(base: Any):
    if base is None:
        raise ValueError("pass base= (the trainer's model folder, Hub id or Engine) or tokenizer= so prompts "
                         "can be tokenized as the servers do")
    if hasattr(base, "tokenizer"):
        return base.tokenizer
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(Path(base) if Path(base).exists() else str(base))
