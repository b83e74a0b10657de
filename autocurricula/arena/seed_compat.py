"""The seed's synchronous dialect of games, adapted to the native async handle.

A seed-style ``play(players, model, tokenizer)`` runs in a daemon thread of its own with a
:class:`SeedHandle` whose calls block: transformers-style ``set_player(model, player)`` then
``model.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=...)`` returns prompt +
completion ids; ``model.generate(player, prompt)``, ``judge`` and ``play`` return what awaiting the
native calls would. It may return ``([rewards], [experiences])`` (:func:`split_seed_return`). Turns,
seeds and call order are those of the same game written with ``await``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import sys
import threading
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from autocurricula.arena.game import check_rewards

__all__ = ["GameCancelled", "SeedHandle", "is_sync_play", "normalise_rewards", "run_seed_play", "set_player",
           "split_seed_return"]

_CANCELLED = "the game was cancelled (it ran past game_timeout_s)"


class GameCancelled(RuntimeError):
    """Raised in a timed-out game's thread by its next ``model.generate``."""


def set_player(model: "SeedHandle", player: dict) -> None:
    """Make ``player``'s adapter the one ``model.generate(**inputs)`` uses."""
    model.current_player = player


def is_sync_play(play: Callable) -> bool:
    """Whether ``play`` is a seed-style synchronous function (or callable object)."""
    return not (inspect.iscoroutinefunction(play) or inspect.iscoroutinefunction(getattr(play, "__call__", None)))


def split_seed_return(out) -> tuple[Any, Any]:
    """``(rewards, experiences)`` from what a seed-style play returned: the seed's
    ``([rewards], [experiences])``, else ``(out, None)``."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], (list, tuple)) and out[0] \
            and isinstance(out[0][0], (list, tuple)):
        return out[0][0], out[1]
    return out, None


def normalise_rewards(out, n_players: int) -> tuple[list[float], Any]:
    """One float per player and the experiences (None unless the seed's shape was returned)."""
    rewards, experiences = split_seed_return(out)
    return check_rewards(rewards, n_players, returned=out), experiences


class _Cancellation:
    """The blocking waits of one seed-style game's thread, cancelled together when the game times out."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lock = threading.Lock()
        self.cancelled = False
        self.pending: set = set()

    def wait(self, coro):
        with self.lock:
            if self.cancelled:
                coro.close()
                raise GameCancelled(_CANCELLED)
            cf = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self.pending.add(cf)
        try:
            return cf.result()
        except concurrent.futures.CancelledError:
            raise GameCancelled(_CANCELLED) from None
        finally:
            with self.lock:
                self.pending.discard(cf)

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            pending, self.pending = list(self.pending), set()
        for cf in pending:
            cf.cancel()


class SeedHandle:
    """The ``model`` a seed-style play gets: the native handle's calls, blocking, plus the
    transformers-style ``generate(input_ids=..., max_new_tokens=...)`` after :func:`set_player`."""

    def __init__(self, native, tokenizer, cancellation: _Cancellation):
        self.native, self.tokenizer = native, tokenizer
        self.current_player: dict | None = None
        self._cancellation = cancellation

    def __getattr__(self, name: str):
        # everything else (seed, record, game, encode...) is the native handle's
        return getattr(self.native, name)

    def generate(self, *args, **kwargs):
        """``generate(player, prompt, **sampling)`` (``player=None``: a judge call), blocking; or
        ``generate(input_ids=..., max_new_tokens=..., do_sample=...)`` for the player set by
        :func:`set_player` (``trainable=False`` keeps the call out of training)."""
        if "player" in kwargs:
            return self._cancellation.wait(self.native.generate(kwargs.pop("player"), *args, **kwargs))
        if args and (isinstance(args[0], Mapping) or args[0] is None):  # a Player or a dict
            return self._cancellation.wait(self.native.generate(*args, **kwargs))
        return self._transformers_generate(*args, **kwargs)

    def judge(self, prompt, *, player: dict | str | None = None, **sampling):
        """The native ``judge``, blocking."""
        return self._cancellation.wait(self.native.judge(prompt, player=player, **sampling))

    def play(self, sub_play: Callable, players: list[dict], *, group: str | None = None, trainable: bool = True,
             name: str | None = None, **kwargs):
        """The native ``play`` (a nested game), blocking; siblings are grouped by this call site."""
        name = name or getattr(sub_play, "__name__", None) or type(sub_play).__name__
        if group is None:  # the caller's line, as the native handle takes it
            caller = sys._getframe(1)
            group = f"{name}@{caller.f_code.co_name}:{caller.f_lineno}"
        return self._cancellation.wait(self.native.play(sub_play, players, group=group, trainable=trainable,
                                                        name=name, **kwargs))

    def _transformers_generate(self, input_ids=None, attention_mask=None, max_new_tokens: int = 20,
                               do_sample: bool = True, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                               trainable: bool = True, **_ignored):
        if self.current_player is None:
            raise RuntimeError("call set_player(model, player) before model.generate(...) in a seed-style play")
        rows = np.asarray(input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)
        rows = rows.reshape(1, -1) if rows.ndim == 1 else rows
        outs = []
        for row in rows:
            gen = self._cancellation.wait(self.native.generate(
                self.current_player, [int(t) for t in row], max_tokens=max_new_tokens,
                temperature=temperature if do_sample else 0.0, top_p=top_p, top_k=top_k or 0, trainable=trainable))
            outs.append(list(row) + list(gen.token_ids or self.native.encode(gen.text)))
        width = max(len(o) for o in outs)
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0
        out = np.array([o + [pad] * (width - len(o)) for o in outs])
        if type(input_ids).__module__.startswith("torch"):
            import torch  # torch: optional; installed, since the game passed torch tensors

            return torch.tensor(out)
        return out


async def run_seed_play(play: Callable, players: list[dict], model, tokenizer, **kwargs):
    """Run a seed-style ``play`` in a daemon thread of its own, with a :class:`SeedHandle` over the
    native handle ``model``, and return what it returned. Cancelling the caller (a game timeout)
    makes the thread's waiting and next model calls raise :class:`GameCancelled`."""
    # a daemon thread, not an executor: a hung game that timed out must not keep the process alive
    # at exit (executor threads are joined then)
    loop = asyncio.get_running_loop()
    cancellation = _Cancellation(loop)
    handle = SeedHandle(model, tokenizer, cancellation)
    fut = loop.create_future()

    def settle(out, exc):
        if not fut.done():
            fut.set_exception(exc) if exc is not None else fut.set_result(out)

    def target():
        try:
            out, exc = play(players, handle, tokenizer, **kwargs), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            out, exc = None, e
        try:
            loop.call_soon_threadsafe(settle, out, exc)
        except RuntimeError:  # the loop has closed: the round moved on without this game
            pass

    threading.Thread(target=target, name="play", daemon=True).start()
    try:
        return await fut
    except asyncio.CancelledError:
        cancellation.cancel()
        raise
