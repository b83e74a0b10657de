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
    ``self.tokenizer``, the player list over ``self._adapters``, blocking :meth:`generate`, and
    calls onto its asyncio loop thread (``self._loop``). Subclasses define ``submit``, ``close``,
    ``_occupancy`` and ``_closed``."""

    tokenizer: Any
    _adapters: dict
    _loop: asyncio.AbstractEventLoop
    _closed: bool

    def players(self) -> list[str]:
        return sorted(self._adapters)

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
