"""The records every layer shares: what a game hands back (:class:`Generation`), what it logs
(:class:`Call`), what it produced (:class:`GameRecord`) and what a learner trains on
(:class:`Turn`), the match entry whose games share a deal (:class:`Deal`), the test of a scripted
player, and :func:`help_field`, the field every config declares. Plain data, no MLX and no engine."""

from __future__ import annotations

import inspect
import weakref
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any, Callable, NamedTuple


def help_field(text: str, default=MISSING, *, default_factory=MISSING):
    """A dataclass field with its help text (shown by ``autocurricula train --help``); a mutable
    default comes from ``default_factory``."""
    return field(default=default, default_factory=default_factory, metadata={"help": text})


@dataclass
class Turn:
    """One generation a trainable player made in a game, plus (once the game ends) its reward."""

    player: str
    game_id: str
    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # the sampler's, one per completion token
    version: int | None = None  # adapter version that produced it
    game: str = "game"  # the game's name (RAE baselines are per game and role)
    reward: float | None = None
    group: str | None = None  # GRPO group key, e.g. same prompt / same game seed
    level: int = 0  # nesting depth of the (sub-)game that produced the turn
    parent: str | None = None  # id of the enclosing game for nested games
    truncated: bool = False  # cut by max_tokens (no eos) or unparseable
    seat: int = -1  # the player's position in the game (its reward is rewards[seat])
    advantage: float | None = None
    target: bool = False  # not sampled (a critic's pick): the update uses the current logprobs as old ones

    def __post_init__(self):
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"turn of {self.player}: {len(self.logprobs)} logprobs for "
                             f"{len(self.completion_ids)} completion tokens; they must match one to one")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    """One completion handed back to a game."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int]
    finish_reason: str
    adapter_version: int | None
    player_id: str

    def __str__(self) -> str:
        return self.text


class Call(NamedTuple):
    """One logged model call of a game (``GameRecord.calls``), what a replay forces or branches from."""

    key: tuple  # (level, node, call index): the call's place in its (sub-)game
    player: str  # the id of the player (or judge) asked
    prompt_ids: list[int]
    generation: Any  # the answer, a Generation
    turn: Turn | None  # the turn it made (None: not trained, or forced by a replay)
    seat: int  # the asked player's seat in its (sub-)game; -1 for a judge or any trainable=False call


@dataclass
class GameRecord:
    """What one game produced."""

    game_id: str
    players: list[dict]
    rewards: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    experiences: Any = None
    error: str | None = None
    traceback: str | None = None  # the full traceback of ``error``
    extras: dict = field(default_factory=dict)  # a GameResult's extras
    calls: list | None = None  # a list: every model call is logged as a Call, a replay's forced ones included
    replay: Any = None  # an autocurricula.arena.replay plan: recorded answers for some calls, branch seeds for the rest
    deal: str | None = None  # games of one deal draw the same chance (model.seed comes from it, not the game id)


class Deal(tuple):
    """A match entry (a tuple of players) whose games share their chance draws with the other
    entries of the same ``key`` in the round: the same deal of the cards, the same random opening.
    Two entries with the seats swapped are a duplicate pair, in which the luck of the deal cancels."""

    key: str

    def __new__(cls, players, key: str):
        entry = super().__new__(cls, players)
        entry.key = str(key)
        return entry

    def __getnewargs__(self):  # pickles (and copies) with its key
        return tuple(self), self.key

    def __repr__(self) -> str:  # tuple operations (+, slicing) give plain tuples, without the key
        return f"Deal({tuple(self)!r}, key={self.key!r})"


def is_scripted(player: dict) -> bool:
    """A scripted player: a Python ``policy`` callable, no adapter, never trained."""
    return "policy" in player


_TAKES_RNG: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def takes_rng(policy: Callable) -> bool:
    """Whether a scripted policy is ``fn(prompt, rng)`` rather than ``fn(prompt)``. Cached: a signature
    costs more than a minimax move; weak keys, so per-game lambdas are not kept alive."""
    try:
        known = _TAKES_RNG.get(policy)
    except TypeError:  # not hashable or not weak-referenceable: no caching
        known = None
    if known is None:
        try:
            known = len(inspect.signature(policy).parameters) >= 2
        except (TypeError, ValueError):
            known = False
        try:
            _TAKES_RNG[policy] = known
        except TypeError:
            pass
    return known


def call_scripted(policy: Callable, prompt: str, rng: Any = None) -> str:
    """The reply of a scripted policy: ``policy(prompt, rng)`` when it takes an rng, else ``policy(prompt)``."""
    return str(policy(prompt, rng) if takes_rng(policy) else policy(prompt))
