"""Where a player's requests go among several workers (servers or Ray actors), and the local
side that every engine made of remote workers shares (tokenizer, blocking calls, its loop thread).

:func:`pick_worker` is the placement policy of :class:`~autocurricula.remote.RemoteEngine` and
:class:`~autocurricula.cluster.RayEngine`: sticky per player (its adapter stays resident), a new
player goes to the worker with the fewest players, ties broken by requests in flight.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, Callable, Hashable, Sequence


def pick_worker(up: Sequence[Any], placement: dict[str, Any], player: str | None,
                key: Callable[[Any], Hashable] = id) -> Any | None:
    """The worker of ``up`` (workers that take work, each with an ``inflight`` count) for
    ``player``. Records a new player's choice in ``placement``; ``None`` when ``up`` is empty."""
    if not up:
        return None
    if player is None:  # the base model: any worker, the least busy
        return min(up, key=lambda w: w.inflight)
    cur = placement.get(player)
    if cur is not None and cur in up:
        return cur
    counts = {key(w): 0 for w in up}
    for w in placement.values():
        if key(w) in counts:
            counts[key(w)] += 1
    chosen = min(up, key=lambda w: (counts[key(w)], w.inflight))
    placement[player] = chosen
    return chosen


class FleetFront:
    """What an engine made of remote workers answers locally: text and chat-template helpers over
    ``self.tokenizer``, the players' bookkeeping (``self._adapters``, ``self._last_version``:
    versions only grow), blocking :meth:`generate`, and calls onto its asyncio loop thread
    (``self._loop``). Subclasses define ``submit``, ``close``, ``_occupancy``, ``_closed``,
    ``_adapter(source, version)`` (the record to install), and the coroutines ``_install`` and
    ``_drop``."""

    tokenizer: Any
    name: str
    _adapters: dict
    _last_version: dict
    _loop: asyncio.AbstractEventLoop
    _closed: bool

    def players(self) -> list[str]:
        return sorted(self._adapters)

    # ------------------------------------------------------------------ players (subclasses: _adapter, _install, _drop)
    def sync_from(self, engine) -> dict:
        """Make this engine's players those of ``engine`` (the trainer's in-process engine): push
        every adapter whose version differs, at the engine's version, and drop the players it no
        longer has. Call it after every update and every change of the league. Returns
        ``{"pushed": [...], "dropped": [...]}``."""
        local = {name: engine.adapter_info(name)["version"] for name in engine.players()}
        pushed = [n for n, v in sorted(local.items()) if n not in self._adapters or self._adapters[n].version != v]
        for name in pushed:
            self.load_adapter(name, engine.adapter_weights(name), version=local[name])
        dropped = [n for n in self.players() if n not in local]
        for name in dropped:
            self.unload_adapter(name)
        return {"pushed": pushed, "dropped": dropped}

    def load_adapter(self, name: str, source: Any, version: int | None = None) -> int:
        """Install or hot-swap a player at ``version`` (default: the next one): installed now on
        every worker that holds the player, on the others at its first request there. Returns the
        version."""
        from autocurricula.engine.adapters import check_name

        check_name(name)
        if name == self.name:
            raise ValueError(f"{name!r} is the base model's name; choose another player name")
        self._check_open()
        last = self._last_version.get(name, 0)
        if version is None:
            version = last + 1
        elif not isinstance(version, int) or version <= last:
            raise ValueError(f"version {version!r} of {name!r} is not newer than {last}; versions only grow")
        return self._call(self._install(name, self._adapter(source, version))).result()

    def unload_adapter(self, name: str) -> None:
        """Drop a player on every worker."""
        self._held(name)
        self._call(self._drop(name)).result()

    def _held(self, name: str):
        """The local record of a player's current adapter (``.version``); UnknownPlayerError if none."""
        from autocurricula.engine.engine import UnknownPlayerError

        ad = self._adapters.get(name)
        if ad is None:
            raise UnknownPlayerError(f"unknown player {name!r}")
        return ad

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def generate(self, prompt, player=None, params=None, **sampling):
        """Blocking ``submit``; keyword sampling args build :class:`SamplingParams`."""
        from autocurricula.engine.sampling import SamplingParams

        return self.submit(prompt, player, params or SamplingParams(**sampling)).result()

    @property
    def occupancy(self) -> float:
        """Mean batch occupancy of the workers that are up (0.0 if none answers)."""
        try:
            return self._call(self._occupancy()).result(10)
        except Exception:  # noqa: BLE001 - a metric must not stop training
            return 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed; create a new one")
