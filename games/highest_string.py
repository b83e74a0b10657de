"""Highest string: the toy game of the original autocurricula README; N >= 2 players.

Rules: every player answers the same prompt independently (the calls are issued together, so the
arena batches them) with a short string (``max_tokens`` default 3). Replies are compared after
stripping surrounding whitespace, lexicographically by Unicode code point (Python's ``str``
order). Rewards are pairwise: each player scores +1 per opponent it beats, -1 per opponent that
beats it and 0 per tie, divided by N - 1, so a reward lies in [-1, 1] and the rewards sum to 0
(two players: +1 / -1, tie 0 / 0).

Invalid move: a reply that is empty after stripping or holds a non-printable character (e.g. a
newline). If any reply is invalid, every offender gets ``invalid_penalty[0]`` (default -1.5) and
every other player ``invalid_penalty[1]`` (default +0.5).
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Callable, Sequence
from typing import Any

from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, ask, check_penalty, check_players,
                                         choice, invalid_rewards, make_rng)
from autocurricula.records import call_scripted
from autocurricula.records import GameFacts

__all__ = ["FACTS", "NUM_PLAYERS", "PROMPT", "ZERO_SUM", "is_valid", "pairwise_rewards", "play", "play_out", "random_policy",
           "rewards_for"]

NUM_PLAYERS = None  # any number >= 2
ZERO_SUM = True
FACTS = GameFacts(None, "zero_sum", "one_shot", "simultaneous", chance=False, payoff_range=(-1.0, 1.0))
PROMPT = "write a short string. the highest string in alphabetical order wins:"


def is_valid(reply: str) -> bool:
    s = reply.strip()
    return bool(s) and s.isprintable()


def pairwise_rewards(replies: Sequence[str]) -> list[float]:
    """Pairwise win/loss rewards of valid replies (see the module docstring)."""
    keys = [r.strip() for r in replies]
    n = len(keys)
    return [sum((a > b) - (a < b) for j, b in enumerate(keys) if j != i) / (n - 1) for i, a in enumerate(keys)]


def rewards_for(replies: Sequence[str], invalid_penalty=DEFAULT_INVALID_PENALTY) -> list[float]:
    bad = [i for i, r in enumerate(replies) if not is_valid(r)]
    if bad:
        return invalid_rewards(len(replies), bad, invalid_penalty)
    return pairwise_rewards(replies)


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player: 1-3 random lowercase letters."""
    return "".join(choice(rng, string.ascii_lowercase) for _ in range(1 + int(choice(rng, range(3)))))


def play_out(policies: Sequence[Callable], rng: Any = None, *, prompt: str = PROMPT,
             invalid_penalty=DEFAULT_INVALID_PENALTY) -> list[float]:
    """One scripted game without a model; returns one reward per policy."""
    rng = make_rng(rng=rng)
    return rewards_for([call_scripted(p, prompt, rng) for p in policies], invalid_penalty)


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=DEFAULT_INVALID_PENALTY,
               max_tokens: int = 3, temperature: float | None = None, prompt: str = PROMPT, stop=("\n",),
               seed: int | None = None, rng: Any = None) -> list[float]:
    """One round: every player replies to ``prompt``; pairwise rewards. (The game has no
    randomness of its own; ``seed`` and ``rng`` are accepted for a uniform interface.)"""
    check_players(players, None, "highest string")
    check_penalty(invalid_penalty)
    replies = await asyncio.gather(*(ask(model, p, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop)
                                     for p in players))
    return rewards_for(replies, invalid_penalty)
