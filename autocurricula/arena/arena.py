"""The ``model`` handed to ``play``: generation for players, turn recording, nested games, judges.

``await model.generate(player, prompt_or_messages, **sampling)`` returns a :class:`Generation`;
every call for a trainable player (without ``trainable=False``) is that player's turn in this game,
and ``play`` returns one reward per player or a :class:`GameResult`. Judges (``model.judge``, or
``model.generate(None, ...)``) are never trained. A synchronous seed-style ``play`` runs through
:mod:`autocurricula.arena.seed_compat`.

Nested games (as in the Legos / Self-Play Engine designs): ``await model.play(sub_play, players)``
runs a game of its own whose rewards go to its own turns; sibling sub-games share ``level + 1``,
``parent`` and ``group``, so GRPO compares them only with each other.

In lockstep mode (the training default) the pending calls of all running games go to the engine
together, in a fixed order, once every game waits: every batch, hence every float, is the same on
every run with the same seed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import inspect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Callable

import numpy as np

from autocurricula.engine import SamplingParams
from autocurricula.arena.game import check_rewards
from autocurricula.records import Call, GameRecord, Generation, Turn, call_scripted, is_scripted
from autocurricula.arena.seed_compat import GameCancelled, is_sync_play, run_seed_play, set_player, split_seed_return

__all__ = ["Arena", "BASE_JUDGE", "Call", "GameCancelled", "GameHandle", "GameRecord", "GameResult", "Generation",
           "PlayTokenizer", "derive_seed", "game_result", "run_async", "set_player"]

log = logging.getLogger(__name__)

def run_async(coro):
    """``asyncio.run`` that also works when the caller already runs an event loop (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except block: a game's traceback must not chain "no running event loop"
        return asyncio.run(coro)
    box: dict = {}

    def target():
        try:
            box["out"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["exc"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from any printable parts (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class PlayTokenizer:
    """The ``tokenizer`` handed to ``play``: the model's Hugging Face tokenizer, with
    ``return_tensors="pt"`` falling back to NumPy when torch is not installed."""

    def __init__(self, tokenizer):
        self._tok = getattr(tokenizer, "_tokenizer", tokenizer)

    def __call__(self, text, return_tensors=None, **kwargs):
        if return_tensors == "pt":
            try:
                import torch  # noqa: F401 - torch: optional (extra hf), only probed
            except ImportError:
                return_tensors = "np"
        return self._tok(text, return_tensors=return_tensors, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


class GameResult(Sequence):
    """What a game returns: one reward per player, plus ``extras`` (e.g. a pass rate) for whoever
    spawned it. Reads as the list of rewards (``result[0]``, ``list(result)``). ``play`` may return one."""

    def __init__(self, rewards, extras: dict | None = None, turns: int = 0):
        self.rewards = [float(r) for r in rewards]
        self.extras = dict(extras or {})
        self.turns = turns  # turns recorded in the (sub-)game, its own sub-games included

    def __getitem__(self, i):
        return self.rewards[i]

    def __len__(self) -> int:
        return len(self.rewards)

    def __eq__(self, other) -> bool:
        if isinstance(other, GameResult):
            return self.rewards == other.rewards and self.extras == other.extras
        return isinstance(other, (list, tuple)) and list(other) == self.rewards

    def __repr__(self) -> str:
        return f"GameResult(rewards={self.rewards}, extras={self.extras}, turns={self.turns})"


BASE_JUDGE = {"id": "base", "adapter": None}  # the base model without any adapter


class GameHandle:
    """The ``model`` argument of one ``play`` call (one per game and per sub-game, so turn recording
    never mixes between concurrent games)."""

    def __init__(self, arena: "Arena", record: GameRecord, game: str, level: int = 0, parent: str | None = None,
                 seats: list[dict] | None = None, *, node: str | None = None, group: str | None = None,
                 trainable: bool = True, chance: str | None = None, parent_chance: str | None = None):
        self.arena, self.record, self.game = arena, record, game
        self.level, self.parent = level, parent
        # this (sub-)game's id: the game_id of its turns (a replay keeps the recorded game's, hence its seeds)
        self.node = node or getattr(record.replay, "node", None) or record.game_id
        # what the game's own randomness derives from: its node, or its deal, which mirrored games share
        self.chance = chance or record.deal or self.node
        self.parent_chance = parent_chance or parent
        self.group = group  # the sibling key of a sub-game (None at the top level)
        self.trainable = trainable  # False: none of this game's calls become turns
        self.seats = seats if seats is not None else record.players
        self._calls = 0
        self._subgames = 0

    @property
    def seed(self) -> int:
        """A stable seed for the game's own randomness (openings, deals): the same run seed and game
        id (or deal) give the same game again, so league runs and resumed runs stay reproducible."""
        return derive_seed(self.arena.seed, self.chance, self.level, self.parent_chance, "game")

    async def generate(self, player: dict | None, prompt, **sampling) -> Generation:
        """``player``'s reply to ``prompt`` (text, token ids or chat messages), a turn of this game
        when the player is trainable. Sampling: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
        ``stop``, ``seed``; ``trainable=False`` keeps the call out of training; ``group`` / ``role``
        name its GRPO group and role. ``player=None`` is a judge call on the base model."""
        if player is None:
            return await self.judge(prompt, **sampling)
        return await self._agenerate(player, prompt, **sampling)

    def judge(self, prompt, *, player: dict | str | None = None, **sampling):
        """A judge's reply (a :class:`Generation`, awaited), never a turn: ``player=None`` asks the
        base model (no adapter), a player dict or player id asks that player's adapter (e.g. a
        frozen snapshot), a scripted player dict asks its policy."""
        if "trainable" in sampling:
            raise TypeError("judge calls are never trained: drop trainable=")
        if player is None:
            judge = BASE_JUDGE
        elif isinstance(player, str):
            judge = {"id": player}
        elif isinstance(player, Mapping) and "id" in player:  # a Player or a dict
            judge = player
        else:
            raise TypeError(f"judge(player=...) takes None (the base model), a player id or a player dict, "
                            f"got {player!r}")
        return self._agenerate(judge, prompt, trainable=False, **sampling)

    def encode(self, text: str) -> list[int]:
        """The token ids the model reads for ``text``."""
        return self.arena.engine.encode(text)

    async def _agenerate(self, player: dict, prompt, *, trainable: bool = True, max_tokens: int | None = None,
                         temperature: float | None = None, top_p: float = 1.0, top_k: int = 0, stop=None,
                         seed: int | None = None, group: str | None = None, role: str | None = None) -> Generation:
        seat = self._seat(player)
        logged_seat = seat if trainable else -1  # a seated player asked as a judge is logged as a judge
        call = self._calls
        self._calls += 1
        if seed is None:
            seed = derive_seed(self.arena.seed, self.node, self.level, self.parent, call)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            ids = self.arena.engine.apply_chat_template(prompt)
        elif isinstance(prompt, str):
            ids = self.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        key = (self.level, self.node, call)
        if self.record.replay is not None:  # autocurricula.arena.replay: the recorded answer, or a branch's own seed
            forced = self.record.replay.forced(key, player, ids)
            if forced is not None:
                return self._logged(key, player, ids, forced, None, logged_seat)
            seed = self.record.replay.seed(key, seed)
            if trainable:  # a branch's continuation policy; judges keep their sampling
                temperature = self.record.replay.sampling_temperature(temperature)
        if is_scripted(player):  # a Python callable, never trained
            text = prompt if isinstance(prompt, str) else self.arena.engine.decode(ids)
            gen = Generation(self.arena.scripted(player, text, seed), [], [], ids, "stop", None, player["id"])
            return self._logged(key, player, ids, gen, None, logged_seat)
        params = SamplingParams(max_tokens=max_tokens or self.arena.max_tokens,
                                temperature=self.arena.temperature if temperature is None else temperature,
                                top_p=top_p, top_k=top_k, stop=list(stop or []), seed=seed)
        c = await self.arena.complete(self.record.game_id, (self.level, self.node, call), ids, player, params)
        gen = Generation(c.text, c.token_ids, c.logprobs, c.prompt_ids, c.finish_reason, c.adapter_version, player["id"])
        if trainable and self.trainable and self.arena.is_trainable(player) and c.token_ids:
            role = role or player.get("seat_role", f"seat{seat}")
            if self.group is not None:  # siblings share the group; roles stay apart within it
                group = f"{self.group}|{group if group is not None else 'role:' + role}"
            self.record.turns.append(Turn(
                player=player["id"], game_id=self.node, role=role,
                prompt_ids=list(ids), completion_ids=list(c.token_ids), logprobs=list(c.logprobs),
                version=c.adapter_version, game=self.game, group=group, level=self.level, parent=self.parent,
                truncated=c.finish_reason == "length", seat=seat))
            return self._logged(key, player, ids, gen, self.record.turns[-1], logged_seat)
        return self._logged(key, player, ids, gen, None, logged_seat)

    def _logged(self, key: tuple, player: dict, ids: list[int], gen: Generation, turn: Turn | None,
                seat: int) -> Generation:
        if self.record.calls is not None:  # kept for replays (autocurricula.arena.replay)
            self.record.calls.append(Call(key, player["id"], list(ids), gen, turn, seat))
        return gen

    # ------------------------------------------------------------------ nested games
    def play(self, sub_play: Callable, players: list[dict], *, group: str | None = None, trainable: bool = True,
             name: str | None = None, **kwargs):
        """Run ``sub_play(players, model, tokenizer, **kwargs)`` as a nested game; ``await`` its
        :class:`GameResult`. Its turns get its rewards and ``group`` (default: the call site).
        ``trainable=False``: none of its turns (nor its sub-games') is trained. ``name``: its name
        in RAE baselines (default: ``sub_play``'s)."""
        self._subgames += 1
        sub_name = name or getattr(sub_play, "__name__", None) or type(sub_play).__name__
        if group is None:  # the call site: the same line spawns siblings, e.g. in a loop or gather
            caller = sys._getframe(1)
            group = f"{sub_name}@{caller.f_code.co_name}:{caller.f_lineno}"
        child = GameHandle(self.arena, self.record, f"{self.game}/{sub_name}", self.level + 1, self.node,
                           seats=list(players), node=f"{self.node}/{self._subgames}", group=str(group),
                           trainable=self.trainable and trainable, chance=f"{self.chance}/{self._subgames}",
                           parent_chance=self.chance)
        return self._run_sub(child, sub_play, players, kwargs)

    async def _run_sub(self, child: "GameHandle", sub_play: Callable, players: list[dict], kwargs: dict):
        try:
            if is_sync_play(sub_play):  # its blocking calls need a thread of their own
                out, _ = split_seed_return(await run_seed_play(sub_play, players, child, self.arena.tokenizer,
                                                               **kwargs))
            else:
                out = await sub_play(players, child, self.arena.tokenizer, **kwargs)
            if inspect.isawaitable(out):
                out = await out
        except BaseException:
            child._drop_turns()
            raise
        return child._finish(out, len(players))

    def _subtree(self, turn: Turn) -> bool:
        return turn.game_id == self.node or turn.game_id.startswith(self.node + "/")

    def _drop_turns(self) -> None:
        # a sub-game that raised leaves no turns behind (as a failed top-level game)
        self.record.turns[:] = [t for t in self.record.turns if not self._subtree(t)]

    def _finish(self, out, n_players: int) -> GameResult:
        try:
            rewards, extras = game_result(out, n_players)
        except Exception:
            self._drop_turns()
            raise
        kept, count = [], 0
        for t in self.record.turns:
            if t.game_id == self.node:
                if not 0 <= t.seat < len(rewards):
                    continue  # made for a player not seated in this sub-game: no reward of its own
                t.reward = rewards[t.seat]
            count += self._subtree(t)
            kept.append(t)
        self.record.turns[:] = kept
        return GameResult(rewards, extras, turns=count)

    def _seat(self, player: dict) -> int:
        for i, p in enumerate(self.seats):
            if p is player:
                return i
        for i, p in enumerate(self.seats):
            if p.get("id") == player.get("id"):
                return i
        return -1  # a judge or another non-seated model call


def game_result(out, n_players: int) -> tuple[list[float], dict]:
    """Rewards and extras of what a (sub-)game returned: a :class:`GameResult`, or one number per
    player (then the extras are empty)."""
    if isinstance(out, GameResult):
        return check_rewards(list(out.rewards), n_players), dict(out.extras)
    return check_rewards(out, n_players), {}


class Arena:
    """Runs games against one engine. ``lockstep=True`` batches the calls of all running games
    together in a fixed order (full batches, run-to-run determinism)."""

    def __init__(self, engine, *, seed: int = 0, temperature: float = 1.0, max_tokens: int = 64,
                 lockstep: bool = True, frozen: Callable[[dict], bool] | None = None):
        self.engine, self.seed = engine, seed
        self.temperature, self.max_tokens, self.lockstep = temperature, max_tokens, lockstep
        self.tokenizer = PlayTokenizer(engine.tokenizer)
        self._frozen = frozen or (lambda p: bool(p.get("frozen")))
        self.loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[tuple] = []  # calls not yet submitted
        self._queued: dict[str, int] = {}  # per game: calls in _waiting
        self._inflight = 0  # submitted calls whose results have not reached their game yet
        self._live: set[str] = set()
        self._wake: asyncio.Event | None = None
        self.split_ticks = 0  # lockstep ticks submitted without a game that was busy past the grace
        self._memo: dict | None = None  # Arena.run(greedy_memo=...): greedy answers of this run, by request

    def is_trainable(self, player: dict) -> bool:
        return not is_scripted(player) and not self._frozen(player)

    def adapter_of(self, player: dict) -> str | None:
        return player.get("adapter", player["id"])

    def scripted(self, player: dict, prompt: str, seed: int) -> str:
        """A scripted player's reply, its policy given a NumPy generator seeded with ``seed``."""
        return call_scripted(player["policy"], prompt, np.random.default_rng(seed))

    def _memo_key(self, adapter, ids, params: SamplingParams):
        """The key of a greedy request in ``greedy_memo`` (None: not memoised). A greedy answer is a
        function of the adapter's weights and these, whatever the seed."""
        if self._memo is None or params.temperature != 0:
            return None
        return adapter, tuple(ids), params.max_tokens, tuple(params.stop), params.ignore_eos

    async def complete(self, game_id: str, order: tuple, ids: list[int], player: dict, params: SamplingParams):
        if not self.lockstep:
            mk = self._memo_key(self.adapter_of(player), ids, params)
            if mk is not None and mk in self._memo:
                return self._memo[mk]
            out = await asyncio.wrap_future(self.engine.submit(ids, self.adapter_of(player), params))
            if mk is not None:
                self._memo[mk] = out
            return out
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(((game_id, *order), ids, self.adapter_of(player), params, fut))
        self._queued[game_id] = self._queued.get(game_id, 0) + 1
        self._wake.set()
        return await fut

    def _ready(self) -> bool:
        return bool(self._waiting) and not self._inflight and all(self._queued.get(g, 0) > 0 for g in self._live)

    async def _coordinator(self, grace_s: float = 1.0) -> None:
        # One tick: wait until every live game has its next call queued (or finished), submit all of
        # them in a fixed order, let the results flow back, repeat. A game busy with something other
        # than generate delays a tick by at most grace_s after the last call that arrived.
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._waiting or self._inflight:
                continue
            deadline, queued = time.monotonic() + grace_s, len(self._waiting)
            while not self._ready() and self._waiting and not self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.clear()  # set by the next call, result or finished game: no polling
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except asyncio.TimeoutError:
                    pass
                if len(self._waiting) != queued:  # games are still arriving: the grace counts from the last one
                    deadline, queued = time.monotonic() + grace_s, len(self._waiting)
            if not self._waiting or self._inflight:
                continue
            if not self._ready():  # the tick goes without a busy game: its composition depends on timing
                self.split_ticks += 1
                if self.split_ticks == 1:
                    logging.getLogger(__name__).warning(
                        "lockstep: a game spent over %g s between model calls on other work; ticks went on "
                        "without it, so batches now depend on timing and a rerun may differ in the last bits", grace_s)
            batch, self._waiting = sorted(self._waiting, key=lambda w: w[0]), []
            for (key, *_rest) in batch:
                self._queued[key[0]] -= 1
            send, owners = self._requests(batch)
            self._inflight += sum(len(waiters) for _, waiters in owners)
            try:  # admitted together, in this order: the tick is one batch whatever else is queued
                futs = self.engine.submit_many(send) if send else []
            except BaseException as exc:  # noqa: BLE001 - the tick's games get the error, the coordinator lives on
                for _, waiters in owners:
                    self._inflight -= len(waiters)
                    for waiter in waiters:
                        if not waiter.done():  # a cancelled (timed-out) game's waiter is done already
                            waiter.set_exception(exc)
                continue
            loop = self.loop  # this run's: a later run's loop must not settle this run's waiters
            for (mk, waiters), f in zip(owners, futs):
                f.add_done_callback(lambda cf, ws=waiters, k=mk: _post(loop, self._settle, ws, cf, k))

    def _requests(self, batch: list[tuple]) -> tuple[list[tuple], list[tuple]]:
        """A tick's engine requests, and per request (its memo key, the waiters it answers). With a
        greedy memo, a greedy request answered in an earlier tick is answered here at once, and
        identical greedy requests of one tick go to the engine once."""
        send, owners, first = [], [], {}
        for _, ids, adapter, params, waiter in batch:
            mk = self._memo_key(adapter, ids, params)
            if mk is not None and mk in self._memo:
                if not waiter.done():
                    waiter.set_result(self._memo[mk])
                continue
            if mk is not None and mk in first:
                owners[first[mk]][1].append(waiter)
                continue
            if mk is not None:
                first[mk] = len(send)
            send.append((ids, adapter, params))
            owners.append((mk, [waiter]))
        return send, owners

    def _settle(self, waiters: list[asyncio.Future], cf, memo_key=None) -> None:
        self._inflight -= len(waiters)
        self._wake.set()
        exc = cf.exception()
        if exc is None and memo_key is not None and self._memo is not None:
            self._memo[memo_key] = cf.result()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(exc) if exc else waiter.set_result(cf.result())

    async def run(self, games: list[tuple[Callable, list[dict], GameRecord, str]], max_concurrent: int = 64,
                  sync_workers: int = 16, timeout_s: float | None = None,
                  greedy_memo: dict | None = None) -> list[GameRecord]:
        """Play ``games`` ((play, players, record, game name) tuples) concurrently; returns records
        with rewards and turns (a game that raised or ran past ``timeout_s`` keeps its error and
        traceback, and no turns). ``greedy_memo``: a dict that keeps the greedy (temperature 0)
        answers of this run, and of earlier runs given the same dict, so that a request asked again
        is answered without the engine; valid only while no adapter changes (a replayer's branches)."""
        self.loop = asyncio.get_running_loop()
        self._memo = greedy_memo
        self._wake = asyncio.Event()
        coordinator = asyncio.create_task(self._coordinator()) if self.lockstep else None
        # a sync game is live before it has a thread: waiting for one, it would hold every lockstep
        # tick for its grace period, so sync games start only as threads are free
        sync = any(is_sync_play(g[0]) for g in games)
        gate = _StartGate(self, min(max_concurrent, sync_workers) if sync else max_concurrent)
        threads = asyncio.Semaphore(sync_workers)

        async def call(play, players, handle):  # what play returned, and the seed style's experiences
            if not is_sync_play(play):
                return await play(players, handle, self.tokenizer), None
            async with threads:
                return split_seed_return(await run_seed_play(play, players, handle, self.tokenizer))

        started: dict[str, float] = {}

        async def one(play, players, record, game):
            async with gate.slot(record.game_id):  # live from the moment its turn comes
                handle = GameHandle(self, record, game)
                started[record.game_id] = time.monotonic()
                try:
                    task = asyncio.ensure_future(call(play, players, handle))
                    done, _ = await asyncio.wait({task}, timeout=timeout_s)
                    if not done:  # not wait_for: a TimeoutError raised by play itself is the game's own error
                        task.cancel()  # a seed-style game's thread: its next model call raises GameCancelled
                        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it
                        raise TimeoutError(f"the game ran past game_timeout_s={timeout_s:g} s and was cancelled")
                    out, experiences = task.result()
                    record.rewards, record.extras = game_result(out, len(players))
                    record.experiences = experiences
                except Exception as exc:  # noqa: BLE001 - one broken game must not end the round
                    record.error = f"{type(exc).__name__}: {exc}"
                    record.traceback = traceback.format_exc()
                    record.turns = []
                finally:
                    started.pop(record.game_id, None)
                    self._live.discard(record.game_id)
                    if self._wake is not None:
                        self._wake.set()
                return record

        watchdog = asyncio.create_task(_watch(started, timeout_s))
        try:
            return list(await asyncio.gather(*(one(*g) for g in games)))
        finally:
            self._memo = None
            watchdog.cancel()
            if coordinator:
                coordinator.cancel()


def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """``fn(*args)`` on ``loop`` from the engine's thread. A run whose games all ended (timed out,
    or failed on an error) has closed its loop before the engine answers their requests: nobody
    waits for the answer then, and it is dropped instead of raising "Event loop is closed" in the
    engine's thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


async def _watch(started: dict[str, float], timeout_s: float | None) -> None:
    """Names the games running far longer than a game should (half of ``timeout_s``, or a minute
    without one), once each, so that a stuck game is seen before its timeout ends it."""
    after = timeout_s / 2 if timeout_s else 60.0
    warned: set[str] = set()
    while True:
        await asyncio.sleep(min(5.0, after / 2))
        now = time.monotonic()
        stuck = sorted(g for g, t0 in started.items() if now - t0 > after and g not in warned)
        if stuck:
            warned.update(stuck)
            log.warning("%d game(s) running for more than %.0f s, maybe stuck: %s (game_timeout_s=%s cancels them "
                        "and counts them as errors)", len(stuck), after, ", ".join(stuck[:10]), timeout_s)


class _StartGate:
    """Starts games in list order, at most ``limit`` at once. A waiting game is marked live in the
    same step as the game it replaces ends, so the lockstep coordinator waits for its first call:
    batch composition, and with it the floats, must not depend on thread timing."""

    def __init__(self, arena: "Arena", limit: int):
        self.arena, self.limit, self.running = arena, limit, 0
        self.waiting: collections.deque = collections.deque()

    @contextlib.asynccontextmanager
    async def slot(self, game_id: str):
        if self.running < self.limit and not self.waiting:
            self.running += 1
            self.arena._live.add(game_id)
        else:
            fut = asyncio.get_running_loop().create_future()
            self.waiting.append((game_id, fut))
            await fut  # the game that ended handed its slot over and marked this one live
        try:
            yield
        finally:
            while self.waiting and self.waiting[0][1].done():  # cancelled while waiting
                self.waiting.popleft()
            if self.waiting:
                nxt, fut = self.waiting.popleft()
                self.arena._live.add(nxt)
                fut.set_result(None)
            else:
                self.running -= 1
