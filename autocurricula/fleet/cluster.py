"""Rollouts on Ray actors (``pip install autocurricula[ray]``): :class:`RayEngine` is a
:class:`~autocurricula.fleet.fleet.Fleet` over :class:`RayWorker` transports, one per actor owning an
in-process :class:`~autocurricula.engine.Engine` of the same base model::

    ray.init()                                   # or ray.init(address="auto") on a cluster node
    trainer.train("path/to/model", play, servers=RayEngine("path/to/model", num_actors=4))

Adapters travel through Ray's object store, one ``ray.put`` per version. Calls carry the actor
instance they are meant for, so an actor Ray restarted refuses them until the poll has re-installed
its players. With ``learners=N``, N learner actors own disjoint sets of players and update them in
parallel: players are independent learners, so nothing is all-reduced and the result is the fused
update's; adapters and optimizer state come back to the trainer's engine after each step.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from autocurricula.engine import Engine, EngineConfig
from autocurricula.engine.adapters import AdapterWeights, from_tensors, load_folder
from autocurricula.engine.fingerprint import BaseModelMismatchError, compare, fingerprint_engine
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion
from autocurricula.fleet.fleet import Fleet, WorkerDown
from autocurricula.training import Updater
from autocurricula.training.config import coerce_grpo_config
from autocurricula.training.update import TOKEN_COUNTS

__all__ = ["ActorRestartedError", "BaseModelMismatchError", "LearnerActor", "RayEngine", "RayUpdater", "RayWorker",
           "RolloutActor", "require_ray"]

log = logging.getLogger(__name__)


def require_ray():
    """``import ray``, or an ImportError that says how to install it."""
    try:
        import ray  # ray: optional (extra ray)
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
        """``[(ids, player, params, request_id), ...]`` admitted together (one lockstep tick); an
        exception is returned in place of the completion it stopped."""
        self._same(instance)
        futs = self.engine.submit_many([(ids, player, params, None, rid) for ids, player, params, rid in requests])
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


class RayWorker:
    """The :class:`~autocurricula.fleet.fleet.Worker` transport of one :class:`RolloutActor`: its calls go
    through Ray, adapters through the object store (one ``ray.put`` per version, fetched by each
    actor that serves the player). Every call but ``health`` may take ``timeout`` seconds before
    the actor counts as failed."""

    def __init__(self, index: int, handle: Any, ray: Any, timeout: float):
        self.key = self.index = index
        self.label = f"rollout actor {index}"
        self.handle, self._ray, self.timeout = handle, ray, timeout
        self.instance: str | None = None  # the actor instance calls are meant for

    async def ready(self) -> dict:
        info = await self._run(self.handle.ready.remote())
        self.instance = info["instance"]
        return info

    async def holding(self, names: list[str]) -> dict[str, int]:
        return dict((await self._run(self.handle.ready.remote()))["players"])

    def pack(self, source: Any) -> Any:
        return self._ray.put(_weights_of(source))

    async def load(self, name: str, payload: Any, version: int) -> None:
        await self._run(self.handle.load.remote(name, payload, version, self.instance))

    async def unload(self, name: str) -> None:
        await self._run(self.handle.unload.remote(name))

    async def complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        return await self._run(self.handle.complete.remote(ids, player, params, rid, self.instance))

    async def complete_many(self, requests: list[tuple]) -> list:
        return await self._run(self.handle.complete_many.remote(requests, self.instance))

    async def health(self) -> dict:
        return await self._run(self.handle.health.remote(), min(10.0, self.timeout))

    async def occupancy(self) -> float:
        return float((await self.health())["occupancy"])

    async def close(self) -> None:
        self._ray.kill(self.handle, no_restart=True)

    async def _run(self, ref, timeout: float | None = None):
        """Await an actor call; a dead, restarted or silent actor raises WorkerDown."""
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError  # ray: optional (extra ray)

        try:
            return await asyncio.wait_for(_awaitable(ref), timeout or self.timeout)
        except (RayActorError, asyncio.TimeoutError, GetTimeoutError, RayTaskError) as exc:
            if isinstance(exc, RayTaskError) and not isinstance(exc.cause, ActorRestartedError):
                raise  # the request's own error (e.g. a prompt too long), not the actor's
            raise WorkerDown(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


class RayEngine(Fleet):
    """The rollout engine over Ray actors (module docstring). ``model``: a folder or Hub id every node
    can load. ``num_actors`` rollout actors, placed by ``num_cpus`` / ``num_gpus`` / ``actor_options``
    (any ``ray.remote`` option), each built with ``engine_config``. ``address``: for ``ray.init`` if
    Ray is not initialized. ``max_restarts``: Ray's (-1: always). ``timeout``: seconds before a request's
    actor counts as failed. ``down_timeout``: how long requests wait for an actor once every actor is
    down (default ``connect_timeout``: Ray restarts a dead actor, which loads the model again), then
    they fail naming the actors. ``poll_s``: health-probe period. ``base``:
    an Engine or fingerprint to check now (else at the first :meth:`sync_from`). ``learners``: learner
    actors for the updates (0: in process), with ``learner_options``.
    """

    group, key_name, request_prefix = "actors", "index", "ray"
    hint = "check that the cluster has the CPUs/GPUs they ask for (num_cpus, num_gpus)"

    def __init__(self, model: str | Path, num_actors: int = 2, *, engine_config: Any = None,
                 num_cpus: float = 1, num_gpus: float = 0, actor_options: dict | None = None,
                 address: str | None = None, max_restarts: int = -1, timeout: float = 600.0,
                 poll_s: float = 1.0, connect_timeout: float = 300.0, base: Any = None, tokenizer: Any = None,
                 name: str | None = None, learners: int = 0, learner_options: dict | None = None,
                 down_timeout: float | None = None):
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
        name = name or self.model  # as the trainer's engine names a base loaded from the same path
        if engine_config is not None and not isinstance(engine_config, dict):
            engine_config = asdict(engine_config)
        remote_cls = ray.remote(RolloutActor)
        opts = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": max_restarts, "max_task_retries": 0,
                "max_concurrency": 1000, **(actor_options or {})}
        handles = [remote_cls.options(**opts).remote(self.model, engine_config, name) for _ in range(num_actors)]
        self._engine_config, self._connect_timeout = engine_config, connect_timeout
        self.learners, self._learner_options = learners, {"num_cpus": num_cpus, "num_gpus": num_gpus,
                                                          **(learner_options or {})}
        self._updaters: list[RayUpdater] = []
        expected = None if base is None else base if isinstance(base, dict) else fingerprint_engine(base)
        super().__init__(lambda: [RayWorker(i, h, ray, timeout) for i, h in enumerate(handles)], name=name,
                         tokenizer=tokenizer if tokenizer is not None else _load_tokenizer(self.model),
                         expected=expected, timeout=timeout, poll_s=poll_s, connect_timeout=connect_timeout,
                         down_timeout=connect_timeout if down_timeout is None else down_timeout)

    @property
    def actors(self) -> list[RayWorker]:
        """The rollout actors' transports (``index``, ``handle``), in order."""
        return self.workers

    def make_updater(self, engine, grpo_config=None) -> RayUpdater | None:
        """The trainer's updater: a :class:`RayUpdater` on ``learners`` learner actors, or None
        (``learners=0``: the trainer updates in its own process)."""
        if not self.learners:
            return None
        up = RayUpdater(engine, grpo_config, self.model, self.learners, engine_config=self._engine_config,
                        actor_options=self._learner_options, name=self.name, connect_timeout=self._connect_timeout)
        self._updaters.append(up)
        return up

    def adapter_weights(self, name: str) -> AdapterWeights:
        """A player's current adapter, as put into the object store."""
        return self._ray.get(self._held(name).payload)

    def wait_until_up(self, index: int, timeout: float = 60.0) -> bool:
        """Block until actor ``index`` is up (re-checked) or ``timeout`` runs out."""
        return super().wait_until_up(index, timeout)

    def close(self) -> None:
        """Stop polling, kill the rollout and learner actors (Ray itself stays initialized)."""
        super().close()
        for up in self._updaters:
            up.close()


class RayUpdater:
    """The trainer's :class:`~autocurricula.training.Updater` with the work on Ray learner actors
    (see the module docstring): same ``step``, ``optim`` and ``steps``.

    ``engine``: the trainer's in-process engine (it holds every player's current adapter and
    takes the new ones). ``model``: the base model path every learner loads. ``num_learners``:
    learner actors; ``actor_options``: their ``ray.remote`` options."""

    def __init__(self, engine, config=None, model: str | Path | None = None, num_learners: int = 2, *,
                 engine_config: dict | None = None, actor_options: dict | None = None, name: str | None = None,
                 max_restarts: int = -1, connect_timeout: float = 300.0):
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
        from ray.exceptions import GetTimeoutError  # ray: optional (extra ray)

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
        from ray.exceptions import RayActorError  # ray: optional (extra ray)

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
                if k in ("players", "rows", "loss", "tokens", *TOKEN_COUNTS):  # each learner's own players
                    metrics[k] = metrics.get(k, 0) + v
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


def _weights_of(source: Any) -> AdapterWeights:
    if isinstance(source, AdapterWeights):
        return source
    if isinstance(source, (str, Path)):
        return load_folder(source)
    if isinstance(source, dict) and isinstance(source.get("tensors"), dict):
        return from_tensors({k: np.asarray(v) for k, v in source["tensors"].items()}, scale=source.get("scale"))
    raise TypeError("source must be AdapterWeights, an adapter folder or {'tensors': {...}, 'scale': s}")


def _load_tokenizer(model: str):
    from mlx_lm.utils import load_tokenizer  # mlx_lm imports transformers: only when no tokenizer is given

    return load_tokenizer(Path(model) if Path(model).exists() else str(model))
