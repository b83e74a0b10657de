"""One engine made of many workers of the same base model: placement, failover and adapter sync.

:class:`Fleet` implements :class:`~autocurricula.engine.protocol.RolloutEngine` over :class:`Worker`
transports (HTTP servers: :class:`~autocurricula.fleet.remote.RemoteEngine`; Ray actors:
:class:`~autocurricula.fleet.cluster.RayEngine`), and owns what both share:

- a worker's base model must match the expected fingerprint at connect and on every return
  (:class:`~autocurricula.engine.fingerprint.BaseModelMismatchError` before any request);
- placement (:func:`~autocurricula.fleet.placement.pick_worker`), and a player's current version
  installed on a worker before it serves the player;
- failover: a worker that raises :class:`WorkerDown` loses its requests to another
  (``stats["retried"]``) until a background poll finds it healthy and re-installs its adapters;
- failing fast: while every worker is down, requests wait for one to come back for at most
  ``down_timeout`` seconds from the moment the last one went down, then fail with an error that
  names the workers and why they are down (a round stops then, not after its games' timeout).

Worker calls run on one asyncio loop in a background thread; :meth:`Fleet.submit` returns a
``concurrent.futures.Future``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol, Sequence, runtime_checkable

from autocurricula.engine.adapters import check_name
from autocurricula.engine.errors import UnknownPlayerError
from autocurricula.engine.fingerprint import compare, fingerprint_engine
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion
from autocurricula.fleet.placement import pick_worker

__all__ = ["AdapterLost", "Fleet", "Worker", "WorkerDown"]

log = logging.getLogger(__name__)


class WorkerDown(Exception):
    """The worker, not the request, failed: unreachable, dead, restarted or timed out."""


class AdapterLost(Exception):
    """The worker no longer holds an adapter it was given (it restarted between two polls)."""


@runtime_checkable
class Worker(Protocol):
    """One worker's transport. Each call raises :class:`WorkerDown` when the worker failed and
    the request's own error (a bad prompt, a refused adapter) otherwise."""

    key: Hashable  # how health() and placement() name it: a URL, an actor index
    label: str  # how messages name it: "server http://...", "rollout actor 0"

    async def ready(self) -> dict:
        """``{"instance", "fingerprint"}`` of the worker now (a restarted worker has a new instance)."""
        ...

    async def holding(self, names: list[str]) -> dict[str, int]:
        """The versions of the adapters it holds: at least those of ``names`` that it holds."""
        ...

    def pack(self, source: Any) -> Any:
        """An adapter source in the form :meth:`load` sends (once per version, for every worker)."""
        ...

    async def load(self, name: str, payload: Any, version: int) -> None:
        """Install a player's adapter at ``version``."""
        ...

    async def unload(self, name: str) -> None:
        """Drop a player; nothing when it holds none."""
        ...

    async def complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        """One completion; :class:`AdapterLost` when it does not hold ``player``."""
        ...

    async def complete_many(self, requests: list[tuple]) -> list:
        """``[(ids, player, params, rid), ...]`` admitted together, in order; each request's error
        in place of its completion."""
        ...

    async def health(self) -> dict:
        """``{"ok": bool, "instance": ...}``; a short probe."""
        ...

    async def occupancy(self) -> float:
        """Its engine's mean batch occupancy."""
        ...

    async def close(self) -> None:
        """Release its connections (or the actor)."""
        ...


@dataclass
class _Adapter:
    payload: Any  # the worker transport's form, made once per version
    version: int


@dataclass
class _Member:
    """A worker and what the fleet knows of it."""

    index: int
    worker: Worker
    up: bool = False
    instance: str | None = None
    fingerprint: dict | None = None
    held: dict[str, int | None] = field(default_factory=dict)  # player -> version it holds (None: unknown)
    inflight: int = 0
    completions: int = 0
    error: str | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock(self, player: str) -> asyncio.Lock:
        return self.locks.setdefault(player, asyncio.Lock())


class Fleet:
    """The rollout engine over ``make_workers()`` (called on the fleet's loop), see the module
    docstring. ``expected``: the base model's fingerprint every worker must have; with
    ``check_base`` and none given, the first :meth:`sync_from` takes the trainer's engine's.
    ``timeout``: the longest a request waits for a worker, whatever happens. ``down_timeout``: how
    long requests wait once every worker is down, counted from when the last one went down (then
    they fail at once until one is back). ``poll_s``: how often the workers' health is probed.
    Subclasses name their workers (``group``, ``key_name``)."""

    group = "workers"  # health()'s key and messages: "servers", "actors"
    key_name = "key"  # a worker's key in health(): "url", "index"
    request_prefix = "fleet"  # request ids: "<prefix>-N"
    hint = ""  # what to check when no worker comes up

    def __init__(self, make_workers: Callable[[], Sequence[Worker]], *, name: str, tokenizer: Any,
                 expected: dict | None = None, check_base: bool = True, timeout: float = 600.0,
                 poll_s: float = 1.0, connect_timeout: float = 30.0, down_timeout: float = 30.0):
        if not (isinstance(down_timeout, (int, float)) and down_timeout > 0):
            raise ValueError(f"down_timeout must be a positive number of seconds, got {down_timeout!r}")
        self.name, self.tokenizer = name, tokenizer
        self.expected, self.check_base = expected, check_base
        self.poll_s, self.timeout, self.down_timeout = poll_s, timeout, down_timeout
        self._all_down_since: float | None = None  # when the last worker up went down (None: one is up)
        self.stats = {"completions": 0, "retried": 0, "uploads": 0, "resyncs": 0, "failed": 0}
        self._adapters: dict[str, _Adapter] = {}
        self._last_version: dict[str, int] = {}
        self._placement: dict[str, _Member] = {}
        self._members: list[_Member] = []
        self._ids = itertools.count(1)
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"autocurricula-{self.request_prefix}",
                                        daemon=True)
        self._thread.start()

        async def make():  # transports that open connections want the loop they will run on
            return [_Member(i, w) for i, w in enumerate(make_workers())]

        try:
            self._members = self._call(make()).result()
            self._call(self._connect(connect_timeout)).result()
        except BaseException:
            self.close()
            raise
        self._poller = self._call(self._poll())

    # ------------------------------------------------------------------ protocol (any thread)
    @property
    def workers(self) -> list[Worker]:
        """The worker transports, in the order given."""
        return [m.worker for m in self._members]

    def submit(self, prompt: str | list[int], player: str | None = None, params: SamplingParams | None = None,
               on_token=None, request_id: str | None = None) -> Future:
        """Queue one completion on a worker; returns a Future of
        :class:`~autocurricula.engine.scheduler.Completion` with the worker's token ids."""
        if on_token is not None:
            raise ValueError(f"{type(self).__name__} does not stream tokens to on_token; use the in-process Engine")
        return self._call(self._complete(*self._prepare(prompt, player, params, request_id)))

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        """Queue ``[(prompt, player, params), ...]`` together: each worker admits its share in one
        call, together and in this order, as an in-process engine admits a lockstep tick. What a
        failed worker leaves is retried request by request on the others. All are checked first:
        one bad request queues none."""
        items = [self._prepare(*r) for r in requests]
        futs = [Future() for _ in items]
        self._call(self._complete_many(items, futs))
        return futs

    def players(self) -> list[str]:
        return sorted(self._adapters)

    def sync_from(self, engine) -> dict:
        """Make this engine's players those of ``engine`` (the trainer's in-process engine): check
        the base model if not yet done, push every adapter whose version differs, at the engine's
        version, and drop the players it no longer has. Call it after every update and every
        change of the league. Returns ``{"pushed": [...], "dropped": [...]}``."""
        if self.check_base and self.expected is None:
            self.expected = fingerprint_engine(engine)
            for m in self._members:
                if m.fingerprint is not None:
                    compare(self.expected, m.fingerprint, m.worker.label)
        local = {name: engine.adapter_info(name)["version"] for name in engine.players()}
        pushed = [n for n, v in sorted(local.items()) if n not in self._adapters or self._adapters[n].version != v]
        for name in pushed:
            self.load_adapter(name, engine.adapter_weights(name), version=local[name])
        dropped = [n for n in self.players() if n not in local]
        for name in dropped:
            self.unload_adapter(name)
        return {"pushed": pushed, "dropped": dropped}

    def make_updater(self, engine, grpo_config=None) -> Any:
        """None: the trainer updates its players in its own process."""
        return None

    def load_adapter(self, name: str, source: Any, version: int | None = None) -> int:
        """Install or hot-swap a player at ``version`` (default: the next one): installed now on
        every worker that holds the player (a new player on the worker placement picks for it), on
        the others at its first request there. Returns the version."""
        check_name(name)
        if name == self.name:
            raise ValueError(f"{name!r} is the base model's name; choose another player name")
        self._check_open()
        last = self._last_version.get(name, 0)
        if version is None:
            version = last + 1
        elif not isinstance(version, int) or version <= last:
            raise ValueError(f"version {version!r} of {name!r} is not newer than {last}; versions only grow")
        ad = _Adapter(self._members[0].worker.pack(source), version)
        return self._call(self._install(name, ad)).result()

    def unload_adapter(self, name: str) -> None:
        """Drop a player on every worker."""
        self._held(name)
        self._call(self._drop(name)).result()

    def adapter_info(self, name: str) -> dict:
        """``{"name", "version", <group>}``: the current version and the workers holding it."""
        ad = self._held(name)
        return {"name": name, "version": ad.version,
                self.group: [m.worker.key for m in self._members if m.held.get(name) == ad.version]}

    def placement(self, name: str) -> Any:
        """The key of the worker a player's requests go to (None before its first request)."""
        m = self._placement.get(name)
        return m.worker.key if m else None

    def health(self) -> dict:
        """``ok`` while at least one worker takes work; one entry per worker."""
        rows = [{self.key_name: m.worker.key, "up": m.up, "inflight": m.inflight, "players": sorted(m.held),
                 "completions": m.completions, "error": m.error} for m in self._members]
        return {"ok": not self._closed and any(m.up for m in self._members), self.group: rows}

    def wait_until_up(self, key: Any, timeout: float = 30.0) -> bool:
        """Block until the worker ``key`` is up (re-synced) or ``timeout`` runs out."""
        m = next(m for m in self._members if m.worker.key == key)
        deadline = time.monotonic() + timeout
        while not m.up and time.monotonic() < deadline:
            time.sleep(0.05)
        return m.up

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def generate(self, prompt, player=None, params=None, **sampling):
        """Blocking ``submit``; keyword sampling args build :class:`SamplingParams`."""
        return self.submit(prompt, player, params or SamplingParams(**sampling)).result()

    @property
    def occupancy(self) -> float:
        """Mean batch occupancy of the workers that are up (0.0 if none answers)."""
        if self._closed:
            return 0.0
        try:
            return self._call(self._occupancy()).result(10)
        except Exception:  # noqa: BLE001 - a metric must not stop training
            return 0.0

    def close(self) -> None:
        """Stop polling and release every worker's connections (or actors)."""
        if self._closed:
            return
        self._closed = True

        async def shutdown():
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
            for m in self._members:
                try:
                    await m.worker.close()
                except Exception:  # noqa: BLE001 - already gone
                    pass

        try:
            self._call(shutdown()).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed; create a new one")

    def _held(self, name: str) -> _Adapter:
        ad = self._adapters.get(name)
        if ad is None:
            raise UnknownPlayerError(f"unknown player {name!r}")
        return ad

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
        return ids, player, params, request_id or f"{self.request_prefix}-{next(self._ids)}"

    def _unavailable(self, message: str) -> Exception:
        """The error a request gets when no worker came up in time (a transport may name its own)."""
        return RuntimeError(message)

    # ------------------------------------------------------------------ loop thread
    async def _connect(self, timeout: float) -> None:
        try:
            results = await asyncio.wait_for(asyncio.gather(
                *(self._bring_up(m) for m in self._members), return_exceptions=True), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the {self.group} did not come up within {timeout:g} s; {self.hint}") from None
        for r in results:  # a wrong key or base model is an error; a worker that is down is polled
            if isinstance(r, BaseException) and not isinstance(r, WorkerDown):
                raise r
        if not any(m.up for m in self._members):
            raise self._unavailable(f"no {self.group[:-1]} could be reached: {self._errors()}; {self.hint}")

    async def _bring_up(self, m: _Member) -> None:
        """Check a worker's base model and re-install every adapter it held; then it takes work."""
        try:
            info = await m.worker.ready()
            if self.check_base and self.expected is not None:
                compare(self.expected, info["fingerprint"], m.worker.label)
            m.fingerprint = info["fingerprint"]
            there = await m.worker.holding(list(m.held))
            for player in [p for p in there if p not in self._adapters]:  # dropped while it was away
                await m.worker.unload(player)
            m.held = {p: there.get(p) for p in {**m.held, **there} if p in self._adapters}
            for player in list(m.held):
                await self._ensure(m, player)
        except Exception as exc:
            m.error = str(exc) or type(exc).__name__
            raise
        if m.instance is not None:
            self.stats["resyncs"] += 1
        m.instance, m.error, m.up = info.get("instance"), None, True
        self._all_down_since = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            # concurrently: a hung worker's probe timing out must not delay noticing the others
            await asyncio.gather(*(self._check(m) for m in self._members))

    async def _check(self, m: _Member) -> None:
        try:
            h = await m.worker.health()
        except Exception as exc:  # noqa: BLE001 - unreachable, or answering unhealthy
            h = {"ok": False, "why": str(exc) or type(exc).__name__}
        if m.up and (not h["ok"] or h.get("instance") != m.instance):  # down, or restarted between polls
            self._down(m, h.get("why") or f"health: ok {h['ok']}, instance {h.get('instance')}")
        if not m.up and h["ok"]:
            error = m.error
            try:
                await self._bring_up(m)
            except Exception as exc:  # noqa: BLE001 - stays down; said in health()
                if error != m.error and not isinstance(exc, WorkerDown):  # once per new reason, not every poll
                    log.error("%s stays out of rotation: %s", m.worker.label, exc)
            if m.up:
                log.warning("%s is back and re-synced (%d players)", m.worker.label, len(m.held))

    def _down(self, m: _Member, why: str) -> None:
        if m.up:
            if any(o.up for o in self._members if o is not m):
                log.warning("%s is down (%s); its requests go to the other %s", m.worker.label, why, self.group)
            else:
                alone = len(self._members) == 1
                log.warning("%s is down (%s) and %s: requests wait up to %g s (down_timeout) for a %s to come "
                            "back, then fail", m.worker.label, why,
                            f"it is the only {self.group[:-1]}" if alone else f"no other {self.group[:-1]} is up",
                            self.down_timeout, self.group[:-1])
        m.up, m.error = False, why
        m.held = dict.fromkeys(m.held)  # versions unknown until it is checked again
        if self._all_down_since is None and not any(o.up for o in self._members):
            self._all_down_since = time.monotonic()

    def _errors(self) -> str:
        return "; ".join(f"{m.worker.label}: {m.error}" for m in self._members)

    def _pick(self, player: str | None, tried: set[int]) -> _Member | None:
        return pick_worker([m for m in self._members if m.up and m.index not in tried], self._placement, player,
                           key=lambda m: m.index)

    async def _pick_up(self, player: str | None, tried: set[int], deadline: float) -> _Member:
        """A worker that is up, another than the ones tried first; waits while all are down, at most
        ``down_timeout`` from when the last one went down (then fails at once)."""
        while True:
            # the failed ones again once the poll has brought them back
            m = self._pick(player, tried) or self._pick(player, set())
            if m is not None:
                return m
            now = time.monotonic()
            if self._all_down_since is None:  # none up, whatever path took them down
                self._all_down_since = now
            if now - self._all_down_since >= self.down_timeout:
                self.stats["failed"] += 1
                raise self._unavailable(self._gone())
            if now > deadline:
                self.stats["failed"] += 1
                raise self._unavailable(f"no {self.group[:-1]} came up within {self.timeout:g} s ({self._errors()})")
            await asyncio.sleep(min(0.1, self.poll_s))

    def _gone(self) -> str:
        """The error of a request made while every worker has been down for ``down_timeout``."""
        down = [m for m in self._members if not m.up]
        names = "; ".join(f"{m.worker.label} ({m.error or 'down'})" for m in down)
        return (f"every {self.group[:-1]} is down and none came back within {self.down_timeout:g} s "
                f"(down_timeout): {names}. Fix: {self.hint}, then train again (resume_from_checkpoint continues "
                "from the last checkpoint)")

    async def _ensure(self, m: _Member, player: str) -> None:
        """Install the player's current version unless the worker holds it already."""
        ad = self._adapters.get(player)
        if ad is not None and m.held.get(player) == ad.version:  # the common case: no lock
            return
        async with m.lock(player):
            while True:
                ad = self._adapters.get(player)
                if ad is None:
                    raise UnknownPlayerError(f"player {player!r} was unloaded")
                if m.held.get(player) == ad.version:
                    return
                await m.worker.load(player, ad.payload, ad.version)
                self.stats["uploads"] += 1
                m.held[player] = ad.version

    async def _complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        tried: set[int] = set()
        lost_adapter = False
        deadline = time.monotonic() + self.timeout
        while True:
            m = await self._pick_up(player, tried, deadline)
            m.inflight += 1
            try:
                if player is not None:
                    await self._ensure(m, player)
                out = await m.worker.complete(ids, player, params, rid)
            except AdapterLost as exc:
                if player is None or lost_adapter:
                    raise exc.__cause__ or exc
                lost_adapter = True  # restarted between two polls: install again, same worker
                m.held[player] = None
                continue
            except WorkerDown as exc:
                self._down(m, str(exc))
                tried.add(m.index)
                self.stats["retried"] += 1
                continue
            finally:
                m.inflight -= 1
            m.completions += 1
            self.stats["completions"] += 1
            return out

    async def _complete_many(self, items: list[tuple], futs: list[Future]) -> None:
        groups: dict[int, tuple[_Member, list[int]]] = {}
        try:
            for i, (_, player, _, _) in enumerate(items):
                m = await self._pick_up(player, set(), time.monotonic() + self.timeout)
                groups.setdefault(m.index, (m, []))[1].append(i)
        except BaseException as exc:  # noqa: BLE001 - every future gets the error
            for f in futs:
                _deliver(f, exc=exc)
            return
        await asyncio.gather(*(self._batch_on(m, idx, items, futs) for m, idx in groups.values()))

    async def _batch_on(self, m: _Member, idx: list[int], items: list[tuple], futs: list[Future]) -> None:
        """One ``complete_many`` on ``m``; what it cannot answer goes request by request
        (:meth:`_complete` re-installs a lost adapter and retries on another worker)."""
        counted = len(idx)
        m.inflight += counted
        try:
            for player in dict.fromkeys(items[i][1] for i in idx):
                if player is None:
                    continue
                try:
                    await self._ensure(m, player)
                except UnknownPlayerError as exc:  # unloaded meanwhile: only its own requests fail
                    for i in [i for i in idx if items[i][1] == player]:
                        _deliver(futs[i], exc=exc)
                    idx = [i for i in idx if items[i][1] != player]
            outs = await m.worker.complete_many([items[i] for i in idx]) if idx else []
        except AdapterLost:
            outs = None
        except WorkerDown as exc:
            self._down(m, str(exc))
            self.stats["retried"] += len(idx)
            outs = None
        except BaseException as exc:  # noqa: BLE001 - anything else: every request of the call gets it
            for i in idx:
                _deliver(futs[i], exc=exc)
            return
        finally:
            m.inflight -= counted
        if outs is None:
            outs = await asyncio.gather(*(self._complete(*items[i]) for i in idx), return_exceptions=True)
        else:
            done = sum(not isinstance(r, BaseException) for r in outs)
            m.completions += done
            self.stats["completions"] += done
        for i, r in zip(idx, outs):
            _deliver(futs[i], exc=r) if isinstance(r, BaseException) else _deliver(futs[i], result=r)

    async def _install(self, name: str, ad: _Adapter) -> int:
        old = self._adapters.get(name)
        self._adapters[name], self._last_version[name] = ad, ad.version
        holders = [m for m in self._members if m.up and name in m.held]
        if not holders:  # a new player goes to its worker now, so the fleet holds every player it was given
            placed = self._pick(name, set())
            holders = [placed] if placed is not None else []
        results = await asyncio.gather(*(self._ensure(m, name) for m in holders), return_exceptions=True)
        for m, r in zip(holders, results):
            if isinstance(r, WorkerDown):
                self._down(m, str(r))  # re-synced when it is back
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
        for m in self._members:
            if name in m.held:
                m.held.pop(name)
                if m.up:
                    try:
                        await m.worker.unload(name)
                    except WorkerDown as exc:
                        self._down(m, str(exc))

    async def _occupancy(self) -> float:
        vals = []
        for m in self._members:
            if m.up:
                try:
                    vals.append(float(await m.worker.occupancy()))
                except Exception:  # noqa: BLE001 - a worker that does not answer gives no figure
                    pass
        return sum(vals) / len(vals) if vals else 0.0


def _deliver(fut: Future, result: Any = None, exc: BaseException | None = None) -> None:
    if not fut.done():  # set once, whatever path answers first
        fut.set_exception(exc) if exc is not None else fut.set_result(result)
