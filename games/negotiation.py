"""Split-the-pool negotiation with hidden values, after Lewis et al. 2017 ("Deal or No Deal?",
arXiv 1706.05125) and Cao et al. 2018 (arXiv 1804.03980); SPIRAL's SimpleNegotiation plays a similar
role. Two players.

Rules: a pool holds 1-3 of each of three item types (book, hat, ball). Each player has private
values 0-5 per item type (never all zero over the pool), shown only in that player's prompt.
Players alternate, ``players[0]`` first, for at most ``max_turns`` turns (default 4). A turn is a
proposal "I get a b c" (counts of book, hat, ball the speaker keeps; the other player gets the
rest), which replaces any earlier one, or "accept", which takes the other player's pending
proposal and ends the game. No acceptance within ``max_turns`` turns: no deal, rewards 0 / 0.

Rewards with a deal: each player's normalised value ``share_i = values_i . items_i / values_i . pool``
in [0, 1]; ``reward="zero_sum"`` (default) gives ``share_0 - share_1`` and its negative (in [-1, 1]),
``reward="share"`` gives the shares themselves (general-sum).

A reply is parsed as the first of: the word "accept", or three digits (separated by spaces or
commas). "accept" with nothing to accept, counts beyond the pool, or neither is an invalid move: the
offender gets ``invalid_penalty[0]`` (default -1.5), the other player ``invalid_penalty[1]`` (+0.5).

Prompt (player 2, turn 2)::

    negotiation, turn 2 of 4. items: book hat ball
    pool: 2 1 3
    your values: 0 4 2
    offer to you: 1 0 2
    reply accept or I get a b c:
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, PromptStyle, TurnGame, check_penalty, check_players,
                                         choice, drive, drive_sync, make_rng, uniform)
from autocurricula.games._common import with_options as _with_options
from autocurricula.records import GameFacts

__all__ = ["FACTS", "ITEMS", "NUM_PLAYERS", "ZERO_SUM", "Negotiation", "deal", "parse_prompt", "parse_reply", "play",
           "play_out", "random_policy", "render_prompt", "shares", "warmup_examples", "with_options"]

NUM_PLAYERS = 2
ZERO_SUM = True  # with the default reward="zero_sum"
# hidden values, a random pool; share differences in [-1, 1]
FACTS = GameFacts(2, "zero_sum", "imperfect", "sequential", chance=True, payoff_range=(-1.0, 1.0))
ITEMS = ("book", "hat", "ball")
RULES = ("You are negotiating how to split a pool of books, hats and balls with another player. Each of you "
         "values the items privately; you see only your own values. On your turn, propose what you keep as "
         "\"I get a b c\" (counts of book, hat, ball; the other player gets the rest), or reply \"accept\" to "
         "take the offer made to you, which ends the game. No deal by the last turn: nobody gets anything.")
_REPLY_RE = re.compile(r"(accept)|(\d)[ ,]*(\d)[ ,]*(\d)", re.IGNORECASE)
_PROMPT_RE = re.compile(r"turn (\d+) of (\d+)\..*\npool: (\d+) (\d+) (\d+)\nyour values: (\d+) (\d+) (\d+)\n"
                        r"(?:offer to you: (\d+) (\d+) (\d+)|no offer yet)\n")

Split = tuple[int, int, int]


def deal(rng) -> tuple[Split, Split, Split]:
    """(pool counts, player 1's values, player 2's values)."""
    pool = tuple(1 + int(choice(rng, range(3))) for _ in ITEMS)

    def values() -> Split:
        while True:
            v = tuple(int(choice(rng, range(6))) for _ in ITEMS)
            if sum(a * b for a, b in zip(v, pool)) > 0:
                return v

    return pool, values(), values()


def shares(pool: Split, values: Sequence[Split], keeps: Sequence[Split]) -> list[float]:
    """Each player's value of what it keeps over its value of the whole pool."""
    return [sum(a * b for a, b in zip(v, k)) / sum(a * b for a, b in zip(v, pool)) for v, k in zip(values, keeps)]


def render_prompt(pool: Split, values: Split, offer: Split | None, turn: int, max_turns: int) -> str:
    """``offer``: what the pending proposal leaves to this player (None if there is none)."""
    offer_line = "no offer yet" if offer is None else "offer to you: " + " ".join(map(str, offer))
    last = " (last turn)" if turn == max_turns else ""
    return (f"negotiation, turn {turn} of {max_turns}{last}. items: {' '.join(ITEMS)}\n"
            f"pool: {' '.join(map(str, pool))}\nyour values: {' '.join(map(str, values))}\n{offer_line}\n"
            f"reply accept or I get a b c:")


def parse_prompt(prompt: str) -> dict:
    """The fields of a prompt made by ``render_prompt``."""
    found = _PROMPT_RE.findall(prompt.replace(" (last turn)", ""))
    if not found:
        raise ValueError("not a negotiation prompt")
    g = found[-1]
    offer = tuple(int(x) for x in g[8:11]) if g[8] else None
    return {"turn": int(g[0]), "max_turns": int(g[1]), "pool": tuple(int(x) for x in g[2:5]),
            "values": tuple(int(x) for x in g[5:8]), "offer": offer}


def parse_reply(text: str) -> str | Split | None:
    """"accept", a proposal (what the speaker keeps), or None; the first of them in ``text``."""
    m = _REPLY_RE.search(text)
    if m is None:
        return None
    if m.group(1):
        return "accept"
    return tuple(int(x) for x in m.group(2, 3, 4))


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player: accepts a pending offer half of the time, else proposes a uniform split."""
    f = parse_prompt(prompt)
    if f["offer"] is not None and uniform(rng) < 0.5:
        return "accept"
    return "I get " + " ".join(str(choice(rng, range(n + 1))) for n in f["pool"])


def warmup_examples(n: int, seed: int = 0, max_turns: int = 4) -> list[tuple[str, str]]:
    """(prompt, reply) pairs of random valid moves in random states: a proposal within the pool, or
    "accept" (a third of the time) when there is an offer. They teach the format, not strategy."""
    rng = make_rng(seed)
    out = []
    for _ in range(n):
        pool, values, _ = deal(rng)
        turn = 1 + int(choice(rng, range(max_turns)))
        offer = None if turn == 1 else tuple(int(choice(rng, range(k + 1))) for k in pool)
        prompt = render_prompt(pool, values, offer, turn, max_turns)
        if offer is not None and uniform(rng) < 1 / 3:
            reply = "accept"
        else:
            reply = "I get " + " ".join(str(choice(rng, range(k + 1))) for k in pool)
        out.append((prompt, reply))
    return out


class Negotiation(TurnGame):
    def __init__(self, pool: Split, values: Sequence[Split], max_turns: int = 4, reward: str = "zero_sum"):
        super().__init__()
        if reward not in ("zero_sum", "share"):
            raise ValueError(f"reward must be 'zero_sum' or 'share', got {reward!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.pool, self.values = tuple(int(n) for n in pool), [tuple(int(x) for x in v) for v in values]
        if len(self.pool) != len(ITEMS) or len(self.values) != 2 or any(len(v) != len(ITEMS) for v in self.values):
            raise ValueError("pool is three counts and values one triple per player")
        if not all(0 <= n <= 9 for n in self.pool):
            raise ValueError(f"pool counts must be in [0, 9] (replies name single digits), got {self.pool}")
        if any(x < 0 for v in self.values for x in v) or any(
                sum(a * b for a, b in zip(v, self.pool)) <= 0 for v in self.values):
            raise ValueError("values must be >= 0 and each player must value the pool above zero")
        self.max_turns, self.reward = max_turns, reward
        self.turn = 1
        self.proposal: tuple[int, Split] | None = None  # (proposer seat, what the proposer keeps)
        self.keeps: list[Split] | None = None  # set when a deal is made

    def _offer_to(self, seat: int) -> Split | None:
        if self.proposal is None or self.proposal[0] == seat:
            return None
        return tuple(n - k for n, k in zip(self.pool, self.proposal[1]))

    def prompt(self) -> str:
        return render_prompt(self.pool, self.values[self.to_move], self._offer_to(self.to_move), self.turn,
                             self.max_turns)

    def step(self, reply: str) -> None:
        move = parse_reply(reply)
        seat = self.to_move
        if move == "accept":
            offer = self._offer_to(seat)
            if offer is None:
                return self.mark_invalid()
            keeps = [None, None]
            keeps[seat], keeps[1 - seat] = offer, self.proposal[1]
            self.keeps = keeps
            self.done = True
            return
        if move is None or any(k > n for k, n in zip(move, self.pool)):
            return self.mark_invalid()
        self.proposal = (seat, move)
        if self.turn >= self.max_turns:
            self.done = True  # no one is left to accept it
        else:
            self.turn += 1
            self.to_move = 1 - seat

    def outcome(self) -> list[float]:
        if self.keeps is None:
            return [0.0, 0.0]
        s = shares(self.pool, self.values, self.keeps)
        return s if self.reward == "share" else [s[0] - s[1], s[1] - s[0]]


def play_out(policy1: Callable, policy2: Callable, rng: Any = None, *, max_turns: int = 4,
             reward: str = "zero_sum", invalid_penalty=DEFAULT_INVALID_PENALTY) -> list[float]:
    """One scripted negotiation without a model; returns the two rewards."""
    rng = make_rng(rng=rng)
    pool, v1, v2 = deal(rng)
    game = Negotiation(pool, (v1, v2), max_turns, reward)
    return drive_sync(game, [policy1, policy2], rng).rewards(invalid_penalty)


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=DEFAULT_INVALID_PENALTY,
               max_tokens: int = 10, temperature: float | None = None, max_turns: int = 4,
               reward: str = "zero_sum", seed: int | None = None, rng: Any = None,
               pool: Split | None = None, values: Sequence[Split] | None = None, stop=None, chat: bool = False,
               reasoning: bool = False, thinking_tokens: int = 256) -> list[float]:
    """One negotiation; ``players[0]`` proposes first. The pool and the private values come from
    ``rng``, else ``seed``, else the league's per-game seed (``model.seed``), unless ``pool`` and ``values`` (one triple per player) are given.
    ``max_tokens`` is 10 because " I get 1 0 2" is 10 tokens for the tiny test model's tokenizer.

    ``chat=True`` sends the rules as a system message and the position as a user message through
    the model's chat template; ``reasoning=True`` lets the player think (up to ``thinking_tokens``
    tokens) before ``<answer>MOVE</answer>``, of which only the answer is parsed (see
    :class:`~autocurricula.games._common.PromptStyle`)."""
    check_players(players, 2, "negotiation")
    check_penalty(invalid_penalty)
    style = PromptStyle(chat, reasoning, thinking_tokens)
    seed = seed if seed is not None else getattr(model, "seed", None)  # the league's per-game seed
    dealt_pool, v1, v2 = deal(make_rng(seed, rng))
    pool = tuple(pool) if pool is not None else dealt_pool
    values = [tuple(v) for v in values] if values is not None else [v1, v2]
    game = Negotiation(pool, values, max_turns, reward)
    await drive(game, players, model, max_tokens=max_tokens, temperature=temperature, stop=stop, style=style,
                rules=RULES)
    return game.rewards(invalid_penalty)


def with_options(**options):
    """Negotiation played with ``options`` of :func:`play` (e.g. ``chat=True, reasoning=True``), as a
    Game object that keeps the game's name (a ``functools.partial`` of ``play`` loses it)."""
    return _with_options(sys.modules[__name__], **options)
