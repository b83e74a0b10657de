"""Rollouts on Ray actors: the engine protocol over a cluster (``pip install autocurricula[ray]``).

:class:`RayEngine` implements :class:`~autocurricula.engine.protocol.EngineProtocol` over Ray
actors, each owning an in-process :class:`~autocurricula.engine.Engine` of the same base model
(loaded from the same path on its node). The trainer plays every game through it, exactly as
through ``autocurricula serve`` servers::

    import ray
    from autocurricula.cluster import RayEngine

    ray.init()                                   # or ray.init(address="auto") on a cluster node
    rollout = RayEngine("path/to/model", num_actors=4)
    trainer.train("path/to/model", play, servers=rollout)

- At the first sync, every actor's base model must have the fingerprint of the trainer's
  (config and weights); a mismatch raises
  :class:`~autocurricula.engine.fingerprint.BaseModelMismatchError` before any game.
- Players are placed on actors: sticky per player (its adapter stays resident there), a new
  player goes to the actor with the fewest players. Adapters travel through Ray's object store:
  one ``ray.put`` per version, fetched by each actor that serves the player.
- An actor that dies (or does not answer within ``timeout``) is marked down; its in-flight
  requests are sent again to another actor (counted in ``stats["retried"]``), so every game
  finishes and none is played twice. Ray restarts a dead actor (``max_restarts``); a poll brings
  it back once it answers, its base model checked again, before it gets work. A restarted actor
  holds no adapter: each player it gets is uploaded at its current version first.

Learning is shared out by player with ``RayEngine(..., learners=N)``: N learner actors, each with
its own Engine and :class:`~autocurricula.training.Updater`, own disjoint sets of players (sticky,
least loaded first) and update them in parallel; players are independent learners (per-player
loss weights, gradient clipping and optimizer state), so no gradient is all-reduced and the
result is the fused update's. Each step ships a player's adapter and optimizer state through the
object store and takes the new ones back into the trainer's engine, so checkpoints, export and
the rollout sync work as with the in-process updater, and a learner that dies loses nothing: its
share of the step runs again on another learner (``stats["learner_retried"]``).

All Ray calls of the driver run on one asyncio loop in a background thread; :meth:`submit`
returns a ``concurrent.futures.Future`` like the in-process engine's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autocurricula.engine.adapters import AdapterWeights, from_tensors, load_folder
from autocurricula.engine.engine import UnknownPlayerError
from autocurricula.engine.fingerprint import BaseModelMismatchError, compare, fingerprint_engine
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion
from autocurricula.placement import FleetFront, pick_worker

__all__ = ["ActorRestartedError", "BaseModelMismatchError", "LearnerActor", "RayEngine", "RayUpdater", "RolloutActor",
           "require_ray"]

log = logging.getLogger(__name__)


def require_ray():
    """``import ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Ray is not installed; install the extra: pip install 'autocurricula[ray]'") from exc
    return ray


class ActorRestartedError(RuntimeError):
    """A call meant for an actor instance that Ray has since restarted (it holds no adapter)."""


class RolloutActor:
    """What runs inside one Ray actor: an in-process Engine and a few calls on it.

    Wrapped with ``ray.remote`` by :class:`RayEngine`; its async methods let one actor serve many
    requests at once, so the engine batches them."""

    def __init__(self, model: str, engine_config: dict | None = None, name: str | None = None):
        from autocurricula.engine import Engine, EngineConfig

        self.engine = Engine(model, config=EngineConfig(**(engine_config or {})), name=name)
        self.instance = uuid.uuid4().hex  # a restarted actor has a new one: it holds no adapter
        self._fingerprint: dict | None = None

    async def ready(self) -> dict:
        """``{"instance", "fingerprint", "players"}`` once the model is loaded."""
        if self._fingerprint is None:
            self._fingerprint = await asyncio.to_thread(fingerprint_engine, self.engine)
        return {"instance": self.instance, "fingerprint": self._fingerprint,
                "players": {n: self.engine.adapter_info(n)["version"] for n in self.engine.players()}}

    def _same(self, instance: str) -> None:
        # a call queued while Ray restarted this actor was meant for the old one and its adapters
        if instance != self.instance:
            raise ActorRestartedError(f"actor restarted (now {self.instance}, call meant for {instance})")

    async def complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str,
                       instance: str) -> Completion:
        self._same(instance)
        return await asyncio.wrap_future(self.engine.submit(ids, player, params, request_id=rid))

    async def complete_many(self, requests: list[tuple], instance: str) -> list:
        """``[(ids, player, params), ...]`` admitted together (one lockstep tick); an exception is
        returned in place of the completion it stopped."""
        self._same(instance)
        futs = self.engine.submit_many(requests)
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futs), return_exceptions=True))

    async def load(self, name: str, weights: AdapterWeights, version: int, instance: str) -> int:
        self._same(instance)
        return await asyncio.to_thread(self.engine.load_adapter, name, weights, version)

    async def unload(self, name: str) -> None:
        if name in self.engine.players():
            await asyncio.to_thread(self.engine.unload_adapter, name)

    async def health(self) -> dict:
        return {**self.engine.health(), "instance": self.instance, "occupancy": self.engine.occupancy}

    def close(self) -> None:
        self.engine.close()


class LearnerActor:
    """What runs inside one Ray learner actor: an Engine (the base model) and an Updater. It keeps
    no state the driver lacks: every step brings the players' adapters and optimizer states."""

    def __init__(self, model: str, engine_config: dict | None = None, grpo_config: Any = None,
                 name: str | None = None):
        from autocurricula.engine import Engine, EngineConfig
        from autocurricula.training import Updater

        self.engine = Engine(model, config=EngineConfig(**(engine_config or {})), name=name)
        self.updater = Updater(self.engine, grpo_config)

    def ready(self) -> dict:
        return {"fingerprint": fingerprint_engine(self.engine)}

    def step(self, players: dict, turns: list, lr: dict) -> tuple[dict, dict, dict]:
        """``players``: ``{name: (AdapterWeights, version, AdamWState | None)}``. Returns
        ``(metrics, {name: (new weights, new version)}, {name: new optimizer state})``."""
        for name, (weights, version, _) in players.items():
            held = self.engine.adapter_info(name)["version"] if name in self.engine.players() else None
            if held != version:
                self.engine.install(name, weights, version, validate=False)  # versions only grow
        self.updater.optim = {n: st for n, (_, _, st) in players.items() if st is not None}
        metrics = self.updater.step(turns, lr)
        new = {n: (self.engine.adapter_weights(n), self.engine.adapter_info(n)["version"]) for n in players}
        return metrics, new, {n: self.updater.optim[n] for n in players if n in self.updater.optim}


@dataclass
class _Adapter:
    ref: Any  # ray.ObjectRef of the AdapterWeights
    version: int
    weights: AdapterWeights


@dataclass
class _Actor:
    index: int
    handle: Any
    up: bool = False
    instance: str | None = None
    held: dict[str, int] = field(default_factory=dict)  # player -> version it holds
    inflight: int = 0
    completions: int = 0
    error: str | None = None
    fingerprint: dict | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock(self, player: str) -> asyncio.Lock:
        return self.locks.setdefault(player, asyncio.Lock())


class RayEngine(FleetFront):
    """The engine protocol over Ray rollout actors (see the module docstring).

    ``model``: the base model as a folder or Hub id every node can load (the same path on every
    node, or a Hub id). ``num_actors``: rollout actors, each with its own Engine; ``num_cpus`` /
    ``num_gpus`` and ``actor_options`` (any ``ray.remote`` option, e.g. ``resources``) place them.
    ``engine_config``: an :class:`~autocurricula.engine.EngineConfig` (or its dict) for every
    actor's engine. ``address``: passed to ``ray.init`` when Ray is not initialized yet (``"auto"``
    joins the cluster this node belongs to; None starts a local one). ``max_restarts``: how often
    Ray restarts a dead actor (-1: always). ``timeout``: seconds one request may take before its
    actor counts as failed, and how long a request waits for an actor when all are down.
    ``poll_s``: how often down actors are probed. ``base``: the trainer's base model as an Engine
    or fingerprint dict to check now; otherwise it is checked at the first :meth:`sync_from`.
    ``learners``: learner actors the trainer's updates run on (0: the trainer's own process);
    ``learner_options``: their ``ray.remote`` options (default: ``num_cpus``, ``num_gpus``).
    """

    def __init__(self, model: str | Path, num_actors: int = 2, *, engine_config: Any = None,
                 num_cpus: float = 1, num_gpus: float = 0, actor_options: dict | None = None,
                 address: str | None = None, max_restarts: int = -1, timeout: float = 600.0,
                 poll_s: float = 1.0, connect_timeout: float = 300.0, base: Any = None, tokenizer: Any = None,
                 name: str | None = None, learners: int = 0, learner_options: dict | None = None):
        if not isinstance(model, (str, Path)) or not str(model):
            raise ValueError("model must be a model folder or Hub id that every Ray node can load, got "
                             f"{model!r} (an Engine object cannot be sent to other processes)")
        if not isinstance(num_actors, int) or num_actors < 1:
            raise ValueError(f"num_actors must be a positive integer, got {num_actors!r}")
        if not isinstance(learners, int) or learners < 0:
            raise ValueError(f"learners must be an integer >= 0 (0: updates in the trainer's process), got {learners!r}")
        if not (isinstance(poll_s, (int, float)) and poll_s > 0 and timeout > 0 and connect_timeout > 0):
            raise ValueError("poll_s, timeout and connect_timeout must be positive numbers of seconds")
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=address)
        self._ray = ray
        self.model = str(model)
        self.name = name or self.model  # as the trainer's engine names a base loaded from the same path
        if engine_config is not None and not isinstance(engine_config, dict):
            engine_config = asdict(engine_config)
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(self.model)
        self.poll_s, self.timeout = poll_s, timeout
        self.stats = {"completions": 0, "retried": 0, "uploads": 0, "resyncs": 0, "failed": 0}
        self.expected: dict | None = None
        self._adapters: dict[str, _Adapter] = {}
        self._last_version: dict[str, int] = {}
        self._placement: dict[str, _Actor] = {}
        self._ids = itertools.count(1)
        self._closed = False
        remote_cls = ray.remote(RolloutActor)
        opts = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": max_restarts, "max_task_retries": 0,
                "max_concurrency": 1000, **(actor_options or {})}
        self.actors = [_Actor(i, remote_cls.options(**opts).remote(self.model, engine_config, self.name))
                       for i in range(num_actors)]
        self._engine_config, self._connect_timeout = engine_config, connect_timeout
        self.learners, self._learner_options = learners, {"num_cpus": num_cpus, "num_gpus": num_gpus,
                                                          **(learner_options or {})}
        self._updaters: list[RayUpdater] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="autocurricula-ray", daemon=True)
        self._thread.start()
        try:
            if base is not None:
                self.expected = base if isinstance(base, dict) else fingerprint_engine(base)
            self._call(self._connect(connect_timeout)).result()
        except BaseException:
            self.close()
            raise
        self._poller = self._call(self._poll())

    # ------------------------------------------------------------------ protocol (any thread)
    def submit(self, prompt: str | list[int], player: str | None = None, params: SamplingParams | None = None,
               on_token=None, request_id: str | None = None) -> Future:
        """Queue one completion on an actor; returns a Future of
        :class:`~autocurricula.engine.scheduler.Completion`."""
        if on_token is not None:
            raise ValueError("RayEngine does not stream tokens to on_token; use the in-process Engine")
        ids, player, params = self._check(prompt, player, params)
        return self._call(self._complete(ids, player, params, request_id or f"ray-{next(self._ids)}"))

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        """Queue ``[(prompt, player, params), ...]``: all are checked first, then each actor admits
        its share of them together, in order (one lockstep tick per actor)."""
        checked = [self._check(*r) for r in requests]
        futs = [Future() for _ in checked]
        rids = [f"ray-{next(self._ids)}" for _ in checked]
        self._call(self._complete_many(checked, rids, futs))
        return futs

    def sync_from(self, engine) -> dict:
        """Make this engine's players those of ``engine`` (the trainer's in-process engine): check
        the base model once, push every adapter whose version differs, drop the players it no
        longer has. Returns ``{"pushed": [...], "dropped": [...]}``."""
        if self.expected is None:
            self.expected = fingerprint_engine(engine)
            self._call(self._check_all_bases()).result()
        return super().sync_from(engine)

    def make_updater(self, engine, grpo_config=None) -> RayUpdater | None:
        """The trainer's updater: a :class:`RayUpdater` on ``learners`` learner actors, or None
        (``learners=0``: the trainer updates in its own process)."""
        if not self.learners:
            return None
        up = RayUpdater(engine, grpo_config, self.model, self.learners, engine_config=self._engine_config,
                        actor_options=self._learner_options, name=self.name, connect_timeout=self._connect_timeout)
        self._updaters.append(up)
        return up

    def _adapter(self, source: Any, version: int) -> _Adapter:
        weights = _weights_of(source)  # put once into the object store, fetched by each actor
        return _Adapter(self._ray.put(weights), version, weights)

    def adapter_info(self, name: str) -> dict:
        """``{"name", "version", "actors"}``: the current version and the actors holding it."""
        ad = self._held(name)
        return {"name": name, "version": ad.version,
                "actors": [a.index for a in self.actors if a.held.get(name) == ad.version]}

    def adapter_weights(self, name: str) -> AdapterWeights:
        return self._held(name).weights


    def placement(self, name: str) -> int | None:
        """The index of the actor a player's requests go to (None before its first request)."""
        a = self._placement.get(name)
        return a.index if a else None

    def health(self) -> dict:
        """``ok`` while at least one actor takes work; one entry per actor."""
        actors = [{"index": a.index, "up": a.up, "inflight": a.inflight, "players": sorted(a.held),
                   "completions": a.completions, "error": a.error} for a in self.actors]
        return {"ok": not self._closed and any(a.up for a in self.actors), "actors": actors}

    def wait_until_up(self, index: int, timeout: float = 60.0) -> bool:
        """Block until actor ``index`` is up (re-checked) or ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        while not self.actors[index].up and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.actors[index].up

    def close(self) -> None:
        """Stop polling and kill the actors (Ray itself stays initialized)."""
        if self._closed:
            return
        self._closed = True
        loop = getattr(self, "_loop", None)
        if loop is not None:
            async def shutdown():
                for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                    task.cancel()

            try:
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join(10)
        for a in getattr(self, "actors", []):
            try:
                self._ray.kill(a.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        for up in getattr(self, "_updaters", []):
            up.close()

    # ------------------------------------------------------------------ loop thread
    def _check(self, prompt, player, params) -> tuple[list[int], str | None, SamplingParams]:
        self._check_open()
        params = params or SamplingParams()
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt is empty; give at least one token")
        if player == self.name:
            player = None
        if player is not None and player not in self._adapters:
            raise UnknownPlayerError(f"unknown player {player!r}; load its adapter first (loaded: {self.players()})")
        return ids, player, params

    async def _connect(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.gather(*(self._bring_up(a) for a in self.actors)), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the rollout actors did not load the model within {timeout:g} s; check that the "
                               "cluster has the CPUs/GPUs they ask for (num_cpus, num_gpus)") from None

    async def _bring_up(self, actor: _Actor) -> None:
        """Check an actor's base model and re-install what it held; then it takes work."""
        info = await actor.handle.ready.remote()
        if self.expected is not None:
            compare(self.expected, info["fingerprint"], f"rollout actor {actor.index}")
        actor.fingerprint = info["fingerprint"]
        if info["instance"] != actor.instance:  # new or restarted: it holds what it says it holds
            if actor.instance is not None:
                self.stats["resyncs"] += 1
            actor.held, actor.instance = dict(info["players"]), info["instance"]
        for player in list(actor.held):
            if player not in self._adapters:
                actor.held.pop(player)
                await actor.handle.unload.remote(player)
            else:
                await self._ensure(actor, player)
        actor.error, actor.up = None, True

    async def _check_all_bases(self) -> None:
        for a in self.actors:
            if a.fingerprint is not None:
                compare(self.expected, a.fingerprint, f"rollout actor {a.index}")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await asyncio.gather(*(self._revive(a) for a in self.actors if not a.up), return_exceptions=True)

    async def _revive(self, actor: _Actor) -> None:
        try:
            await asyncio.wait_for(self._bring_up(actor), max(self.poll_s, 30.0))
        except BaseModelMismatchError as exc:
            if actor.error != str(exc):
                log.error("rollout actor %d stays out of rotation: %s", actor.index, exc)
            actor.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - dead for good, or still restarting: stays down
            actor.error = f"{type(exc).__name__}: {exc}"
        else:
            log.warning("rollout actor %d is back and re-synced (%d players)", actor.index, len(actor.held))

    def _down(self, actor: _Actor, why: str) -> None:
        if actor.up:
            log.warning("rollout actor %d is down (%s); its requests go to the other actors", actor.index, why)
        actor.up, actor.error = False, why

    def _pick(self, player: str | None, tried: set[int]) -> _Actor | None:
        return pick_worker([a for a in self.actors if a.up and a.index not in tried], self._placement, player,
                           key=lambda a: a.index)

    async def _ensure(self, actor: _Actor, player: str) -> None:
        """Install the player's current version unless the actor holds it already."""
        ad = self._adapters.get(player)
        if ad is not None and actor.held.get(player) == ad.version:
            return
        async with actor.lock(player):
            while True:
                ad = self._adapters.get(player)
                if ad is None:
                    raise UnknownPlayerError(f"player {player!r} was unloaded")
                if actor.held.get(player) == ad.version:
                    return
                await actor.handle.load.remote(player, ad.ref, ad.version, actor.instance)
                self.stats["uploads"] += 1
                actor.held[player] = ad.version

    async def _pick_up(self, player: str | None, tried: set[int], deadline: float) -> _Actor:
        """An actor that is up, another than the ones tried first; waits while all are down."""
        while True:
            actor = self._pick(player, tried) or self._pick(player, set())
            if actor is not None:
                return actor
            if time.monotonic() > deadline:
                self.stats["failed"] += 1
                raise RuntimeError(f"no rollout actor came up within {self.timeout:g} s (" + "; ".join(
                    f"actor {a.index}: {a.error}" for a in self.actors) + ")")
            await asyncio.sleep(min(0.1, self.poll_s))

    async def _on_actor(self, actor: _Actor, player: str | None, call):
        """Run ``call()`` (an ObjectRef maker) on ``actor`` after installing the player there;
        returns ``(ok, result)``, ``ok`` False when the actor died or timed out."""
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        actor.inflight += 1
        try:
            if player is not None:
                await self._ensure(actor, player)
            return True, await asyncio.wait_for(call(), self.timeout)
        except (RayActorError, asyncio.TimeoutError, GetTimeoutError, RayTaskError) as exc:
            if isinstance(exc, RayTaskError) and not isinstance(getattr(exc, "cause", None), ActorRestartedError):
                raise  # the request's own error (e.g. a prompt too long), not the actor's
            self._down(actor, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return False, exc
        finally:
            actor.inflight -= 1

    async def _complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        tried: set[int] = set()
        deadline = time.monotonic() + self.timeout
        while True:
            actor = await self._pick_up(player, tried, deadline)
            ok, out = await self._on_actor(actor, player, lambda: _awaitable(actor.handle.complete.remote(
                ids, player, params, rid, actor.instance)))
            if ok:
                actor.completions += 1
                self.stats["completions"] += 1
                return out
            tried.add(actor.index)
            self.stats["retried"] += 1

    async def _complete_many(self, checked: list[tuple], rids: list[str], futs: list[Future]) -> None:
        """One ``complete_many`` per actor (its share, in order); a failed actor's share is sent
        again request by request."""
        groups: dict[int, list[int]] = {}
        actors: dict[int, _Actor] = {}
        try:
            for i, (_, player, _) in enumerate(checked):
                actor = await self._pick_up(player, set(), time.monotonic() + self.timeout)
                groups.setdefault(actor.index, []).append(i)
                actors[actor.index] = actor
        except BaseException as exc:  # noqa: BLE001 - every future gets the error
            for f in futs:
                f.set_exception(exc)
            return

        async def run(actor: _Actor, idx: list[int]) -> None:
            reqs = [checked[i] for i in idx]
            players = sorted({p for _, p, _ in reqs if p is not None})

            async def install_then_call():
                for p in players:
                    await self._ensure(actor, p)
                return await actor.handle.complete_many.remote(reqs, actor.instance)

            try:
                ok, out = await self._on_actor(actor, None, install_then_call)
            except BaseException as exc:  # noqa: BLE001 - a refused request or adapter: its games fail, none hangs
                for i in idx:
                    futs[i].set_exception(exc)
                return
            if not ok:
                self.stats["retried"] += len(idx)
                outs = await asyncio.gather(*(self._complete(*checked[i], rids[i]) for i in idx),
                                            return_exceptions=True)
            else:
                actor.completions += len(idx)
                self.stats["completions"] += len(idx)
                outs = out
            for i, r in zip(idx, outs):
                if isinstance(r, BaseException):
                    futs[i].set_exception(r)
                else:
                    futs[i].set_result(r)

        await asyncio.gather(*(run(actors[k], idx) for k, idx in groups.items()))

    async def _install(self, name: str, ad: _Adapter) -> int:
        old = self._adapters.get(name)
        self._adapters[name], self._last_version[name] = ad, ad.version
        holders = [a for a in self.actors if a.up and name in a.held]
        results = await asyncio.gather(*(self._on_actor(a, name, _noop) for a in holders), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):  # a refused adapter (bad shapes): keep serving the old one
                if old is not None:
                    self._adapters[name] = old
                else:
                    self._adapters.pop(name, None)
                raise r
        return ad.version

    async def _drop(self, name: str) -> None:
        self._adapters.pop(name, None)
        self._placement.pop(name, None)
        for a in self.actors:
            if name in a.held:
                a.held.pop(name)
                if a.up:
                    await self._on_actor(a, None, lambda a=a: _awaitable(a.handle.unload.remote(name)))

    async def _occupancy(self) -> float:
        vals = []
        for a in self.actors:
            if a.up:
                ok, h = await self._on_actor(a, None, lambda a=a: _awaitable(a.handle.health.remote()))
                if ok:
                    vals.append(float(h["occupancy"]))
        return sum(vals) / len(vals) if vals else 0.0


class RayUpdater:
    """The trainer's :class:`~autocurricula.training.Updater` with the work on Ray learner actors
    (see the module docstring): same ``step``, ``optim`` and ``steps``.

    ``engine``: the trainer's in-process engine (it holds every player's current adapter and
    takes the new ones). ``model``: the base model path every learner loads. ``num_learners``:
    learner actors; ``actor_options``: their ``ray.remote`` options."""

    def __init__(self, engine, config=None, model: str | Path | None = None, num_learners: int = 2, *,
                 engine_config: dict | None = None, actor_options: dict | None = None, name: str | None = None,
                 max_restarts: int = -1, connect_timeout: float = 300.0):
        from autocurricula.training.config import coerce_grpo_config

        ray = require_ray()
        if not ray.is_initialized():
            ray.init()
        if not isinstance(num_learners, int) or num_learners < 1:
            raise ValueError(f"num_learners must be a positive integer, got {num_learners!r}")
        self._ray = ray
        self.engine = engine
        self.config = coerce_grpo_config(config)
        self.model = str(model if model is not None else engine.name)
        self.optim: dict = {}  # player -> AdamWState, kept here: checkpoints read it, learners get it each step
        self.steps = 0
        self.stats = {"learner_retried": 0}
        self._owner: dict[str, int] = {}
        opts = {"num_cpus": 1, "max_restarts": max_restarts, "max_task_retries": 0, **(actor_options or {})}
        cls = ray.remote(LearnerActor)
        self.learners = [cls.options(**opts).remote(self.model, engine_config, self.config, name or self.model)
                         for _ in range(num_learners)]
        from ray.exceptions import GetTimeoutError

        try:
            expected = fingerprint_engine(engine)
            try:
                infos = ray.get([a.ready.remote() for a in self.learners], timeout=connect_timeout)
            except GetTimeoutError:
                raise TimeoutError(f"the learner actors did not load the model within {connect_timeout:g} s; check "
                                   "that the cluster has the CPUs/GPUs they ask for besides the rollout actors' "
                                   "(num_cpus, learner_options; `ray status` shows what is free)") from None
            for i, info in enumerate(infos):
                compare(expected, info["fingerprint"], f"learner actor {i}")
        except BaseException:
            self.close()
            raise

    def owner(self, player: str) -> int | None:
        """The index of the learner that updates a player (None before its first update)."""
        return self._owner.get(player)

    def _assign(self, names: list[str], down: set[int]) -> dict[int, list[str]]:
        live = [i for i in range(len(self.learners)) if i not in down]
        if not live:
            raise RuntimeError("every learner actor failed; see the Ray logs (ray status, ray logs)")
        counts = {i: 0 for i in live}
        for i in self._owner.values():
            if i in counts:
                counts[i] += 1
        out: dict[int, list[str]] = {}
        for n in names:
            i = self._owner.get(n)
            if i not in counts:  # new player, or its learner failed: the least loaded one takes it
                i = min(live, key=lambda j: (counts[j], j))
                self._owner[n] = i
                counts[i] += 1
            out.setdefault(i, []).append(n)
        return out

    def step(self, turns: list, lr: dict[str, float] | None = None, skip=()) -> dict:
        """One update of every player with turns (except ``skip``), each learner updating its own
        players in parallel; the new adapters are installed in the trainer's engine. Returns the
        merged metrics."""
        from ray.exceptions import RayActorError

        skip, lr = set(skip), dict(lr or {})
        turns = [t for t in turns if t.player not in skip]
        names = sorted({t.player for t in turns})
        unknown = [n for n in names if n not in self.engine.players()]
        if unknown:
            raise ValueError(f"turns of players with no adapter loaded: {unknown}")
        if not names:
            return {"players": 0, "rows": 0}
        results, down, todo = [], set(), names
        while todo:
            groups = self._assign(todo, down)
            refs = {}
            for i, mine in groups.items():
                players = {n: (self.engine.adapter_weights(n), self.engine.adapter_info(n)["version"],
                               self.optim.get(n)) for n in mine}
                share = [t for t in turns if t.player in players]
                refs[i] = self.learners[i].step.remote(self._ray.put(players), share,
                                                        {n: v for n, v in lr.items() if n in players})
            todo = []
            for i, ref in refs.items():
                try:
                    results.append(self._ray.get(ref))
                except RayActorError as exc:  # its players' step runs again on another learner
                    log.warning("learner actor %d failed (%s); its players' update runs on another", i,
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    down.add(i)
                    todo += groups[i]
                    self.stats["learner_retried"] += 1
        metrics: dict = {"players": 0, "rows": 0, "loss": 0.0, "tokens": 0}
        weighted = {}
        for m, new, optim in results:
            for n, (w, v) in new.items():
                if v != self.engine.adapter_info(n)["version"]:
                    self.engine.install(n, w, v, validate=False)
            self.optim.update(optim)
            for k, v in m.items():
                if k in ("players", "rows", "loss", "tokens"):
                    metrics[k] += v
                elif k in ("clip_ratio", "kl", "entropy"):  # per-token means: weight by tokens
                    weighted[k] = weighted.get(k, 0.0) + v * m.get("tokens", 0)
                else:
                    metrics[k] = v  # grad_norm/NAME, version/NAME
        for k, v in weighted.items():
            metrics[k] = v / max(1, metrics["tokens"])
        for n in names:  # the versions the trainer's engine now serves
            metrics[f"version/{n}"] = self.engine.adapter_info(n)["version"]
        self.steps += self.config.num_iterations
        return metrics

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def close(self) -> None:
        for a in getattr(self, "learners", []):
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.learners = []


async def _awaitable(ref):
    return await ref


async def _noop():
    return None


def _weights_of(source: Any) -> AdapterWeights:
    if isinstance(source, AdapterWeights):
        return source
    if isinstance(source, (str, Path)):
        return load_folder(source)
    if isinstance(source, dict) and isinstance(source.get("tensors"), dict):
        import numpy as np

        return from_tensors({k: np.asarray(v) for k, v in source["tensors"].items()}, scale=source.get("scale"))
    raise TypeError("source must be AdapterWeights, an adapter folder or {'tensors': {...}, 'scale': s}")


def _load_tokenizer(model: str):
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(Path(model) if Path(model).exists() else str(model))
