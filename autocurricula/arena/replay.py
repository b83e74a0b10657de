"""Replaying recorded games: to a chosen model call with the earlier answers forced, then on.

A game run with ``GameRecord(..., calls=[])`` logs every model call it makes, in order. A replay runs
``play`` again under the recorded game's id, so every seed is the recorded one; the first
``position`` calls get their recorded answers back (checked: same player, same prompt) and the rest
are sampled again. A *branch* samples them with seeds of its own (``salt``): K branches are K
independent continuations of one state, as branch credit (:mod:`autocurricula.credit.branch`)
needs; :meth:`Replayer.branch_moves` first forces a chosen move.

A game qualifies when its prompts and rewards depend only on ``model.seed`` and earlier answers (the
built-in games do). Randomness from elsewhere (global RNGs, the clock), state outside the game
(files, servers, a play object that learns across games such as ``ProposerSolver``) or
timing-dependent prompts break it: :class:`ReplayDiverged` catches changed calls,
:meth:`Replayer.check` changed rewards.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from autocurricula.arena.arena import Arena, derive_seed, run_async
from autocurricula.records import GameRecord, Generation


class ReplayDiverged(RuntimeError):
    """A replayed game asked for something other than what the recorded game asked at that call."""


@dataclass
class ReplayPlan:
    """What a replay answers from the record (``GameRecord.replay``; the arena consults it on every call)."""

    node: str  # the recorded game's id: the replay's call seeds follow from it, and model.seed unless it has a deal
    answers: dict = field(default_factory=dict)  # call key -> (player id, prompt ids, Generation)
    salt: str | None = None  # None: calls not forced keep the recorded game's seeds
    used: int = 0  # forced calls answered so far
    temperature: float | None = None  # players' calls not forced are sampled at this (None: as the game asks)

    def forced(self, key: tuple, player: dict, ids: list[int]):
        """The recorded :class:`~autocurricula.arena.arena.Generation` of call ``key``, or None to sample it."""
        entry = self.answers.get(key)
        if entry is None:
            return None
        pid, prompt_ids, gen = entry
        if player.get("id") != pid or list(ids) != prompt_ids:
            what = "player" if player.get("id") != pid else "prompt"
            raise ReplayDiverged(
                f"replay of game {self.node}: call {key} asked a different {what} than the recorded game "
                f"({player.get('id')!r} vs {pid!r}); the game is not replayable: its prompts must depend only on "
                f"model.seed and earlier answers (no module random, os.urandom, clock or outside state)")
        self.used += 1
        return dataclasses.replace(gen, token_ids=list(gen.token_ids), logprobs=list(gen.logprobs))

    def seed(self, key: tuple, seed: int) -> int:
        """The seed of a call that is sampled: the recorded one, mixed with the branch's salt."""
        return seed if self.salt is None else derive_seed(seed, self.salt)

    def sampling_temperature(self, temperature: float | None) -> float | None:
        """The temperature of a player's call that is sampled: the plan's when it sets one."""
        return temperature if self.temperature is None else self.temperature


def plan(record: GameRecord, position: int, salt: str | None = None, answer: Generation | None = None, *,
         temperature: float | None = None) -> ReplayPlan:
    """A plan that forces the first ``position`` calls of ``record`` (``len(record.calls)``: all),
    and with ``answer`` call ``position`` too: it gets ``answer`` instead of being sampled. With
    ``temperature``, the players' calls it samples use it (0: greedy continuations); judge calls
    (``trainable=False``) keep their own."""
    if record.calls is None:
        raise ValueError(f"game {record.game_id} was not logged: run it with GameRecord(..., calls=[]) to replay it")
    if not 0 <= position <= len(record.calls):
        raise ValueError(f"position must be in [0, {len(record.calls)}] (the calls of game {record.game_id}), "
                         f"got {position}")
    answers = {c.key: (c.player, list(c.prompt_ids), c.generation) for c in record.calls[:position]}
    if answer is not None:
        if position >= len(record.calls):
            raise ValueError(f"game {record.game_id} has no call {position} to answer (it made {len(record.calls)})")
        c = record.calls[position]
        answers[c.key] = (c.player, list(c.prompt_ids), answer)
    # a logged branch is replayed as its own game was: under the recorded game's node, hence its seeds
    return ReplayPlan(getattr(record.replay, "node", None) or record.game_id, answers, salt, temperature=temperature)


def turn_positions(record: GameRecord) -> dict[int, int]:
    """``{id(turn): position of its call}`` for the turns a logged game recorded."""
    return {id(c.turn): i for i, c in enumerate(record.calls or []) if c.turn is not None}


class Replayer:
    """Runs replays and branches of recorded games through ``arena`` (all of a call at once).
    Greedy answers (temperature 0) are kept for the replayer's life and reused when the same player
    is asked the same prompt again: make a new replayer after the players' adapters change."""

    def __init__(self, arena: Arena, play: Callable, game: str = "game", *, max_concurrent: int = 64,
                 timeout_s: float | None = None, scorer=None, rewards: Callable[[list], list] | None = None):
        if callable(getattr(play, "state_dict", None)):
            raise ValueError(f"{getattr(play, '__name__', type(play).__name__)} carries state across games "
                             f"(state_dict): replays would see and change it, so its games cannot be replayed; "
                             f"use a credit method that does not replay games (credit='rae' or 'grpo')")
        self.arena, self.play, self.game = arena, play, game
        # scores completions under the players' adapters (Engine.completion_logprobs): the trainer's
        # in-process engine, which holds every adapter also when the games play on servers
        self.scorer = scorer if scorer is not None else arena.engine
        self.max_concurrent, self.timeout_s = max_concurrent, timeout_s
        # maps each finished replay's rewards (one per seat), e.g. to their seat's range as the
        # trainer hands them to credit (autocurricula.credit.scale); None: the game's own
        self.rewards = rewards
        self.games_run = 0
        # greedy answers of this replayer's runs: the adapters do not change while one round's
        # branches are played, so a greedy call asked again (a transposition) needs no engine;
        # None turns the memo off
        self.greedy_memo: dict | None = {}

    def run(self, requests: list[tuple], temperature: float | None = None, log: bool = False) -> list[GameRecord]:
        """Replay each ``(record, position, salt)`` or ``(record, position, salt, answer)`` (see
        :func:`plan`, which also takes ``temperature``); one ``Arena.run`` for all. ``log``: the
        replays log their calls (forced ones included), so they can be branched in turn.
        A replay that asked for something else, or stopped before its forced calls were used, has
        ``error`` set to a ``ReplayDiverged`` message."""

        games = []
        for n, (record, position, salt, *answer) in enumerate(requests):
            replay = plan(record, position, salt, *answer, temperature=temperature)
            rec = GameRecord(f"{record.game_id}#{salt if salt is not None else 'replay'}#{n}", record.players,
                             replay=replay, calls=[] if log else None, deal=record.deal)
            games.append((self.play, record.players, rec, self.game))
        if not games:
            return []
        out = run_async(self.arena.run(games, self.max_concurrent, timeout_s=self.timeout_s,
                                       greedy_memo=self.greedy_memo))
        self.games_run += len(out)
        for rec in out:
            if rec.error is None and rec.replay.used < len(rec.replay.answers):
                rec.error = (f"ReplayDiverged: replay of game {rec.replay.node} used {rec.replay.used} of its "
                             f"{len(rec.replay.answers)} recorded answers (the game made other calls)")
            if rec.error is None and self.rewards is not None and rec.rewards:
                rec.rewards = self.rewards(list(rec.rewards))
        return out

    def replay(self, record: GameRecord) -> GameRecord:
        """``record`` played again with every answer forced (no engine call)."""
        return self.run([(record, len(record.calls or []), None)])[0]

    def check(self, record: GameRecord) -> None:
        """Raise :class:`ReplayDiverged` unless replaying ``record`` with every answer forced gives
        back its rewards: the test that a game qualifies for branch rollouts."""
        again = self.replay(record)
        if again.error is not None:
            raise ReplayDiverged(again.error)
        if again.rewards != record.rewards:
            raise ReplayDiverged(
                f"replaying game {record.game_id} with every answer forced gave rewards {again.rewards}, not "
                f"{record.rewards}: the game draws randomness that is not from model.seed (module random, "
                f"os.urandom, the clock) or reads outside state, so it cannot be replayed")

    def branch(self, requests: list[tuple[GameRecord, int]], samples: int, tag: str = "b",
               temperature: float | None = None) -> list[list[GameRecord]]:
        """For each ``(record, position)``: ``samples`` branch games that force the calls before
        ``position`` and sample the rest with seeds of their own (at ``temperature`` when given);
        all run in one ``Arena.run``."""
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        flat = [(record, position, f"{tag}{position}.{k}") for record, position in requests for k in range(samples)]
        out = self.run(flat, temperature)
        return [out[i * samples:(i + 1) * samples] for i in range(len(requests))]

    def branch_moves(self, requests: list[tuple[GameRecord, int, list[Generation]]], samples: int,
                     tag: str = "m", temperature: float | None = None, log: bool = False) -> list[list[list[GameRecord]]]:
        """For each ``(record, position, answers)``: for each answer, ``samples`` branch games that
        force the calls before ``position``, answer call ``position`` with it, and sample the rest
        with seeds of their own (at ``temperature`` when given; the returns estimate Q(s, move));
        all run in one ``Arena.run``."""
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        flat = [(record, position, f"{tag}{position}.{j}.{k}", answer) for record, position, answers in requests
                for j, answer in enumerate(answers) for k in range(samples)]
        out, i, grouped = self.run(flat, temperature, log), 0, []
        for _, _, answers in requests:
            grouped.append([out[i + j * samples:i + (j + 1) * samples] for j in range(len(answers))])
            i += len(answers) * samples
        return grouped
