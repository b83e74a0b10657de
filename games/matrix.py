"""Two-player zero-sum matrix games, one word per player, both answering at once.

The row player picks a row, the column player a column; the row player wins ``payoff[i][j]`` and
the column player loses it. Each seat's prompt names its seat and its legal words, and each seat
has words of its own (rows answer red, blue, ...; columns up, down, ...)::

    matrix game. pick one of red blue green. you play the rows:
    matrix game. pick one of up down. you play the columns:

Separate words let a player tell its seats apart by what it may answer: with the same words in both
seats, a small model's players answered alike in both (on ``random_game(19)``, whose equilibrium
has rows and columns on different words, every trainer stopped at the best seat-blind policy,
exploitable by 0.105).

A reply is legal when, stripped, it is exactly one of the seat's words; anything else is an
invalid move, which forfeits the worst payoff of the offender's seat (the other player gets the
negation, so the game stays zero-sum; when both are invalid, both get 0).

``random_game(seed)`` draws one of a family of games (2 to 5 actions per seat, payoffs uniform in
[-1, 1]); ``autocurricula.eval.matrix`` gives each game's exact equilibrium and scores a policy as
the game plays it. The module itself plays ``BIASED_RPS``: rock-paper-scissors (rows red, blue,
green; columns up, down, yes) where the first move's win pays 2, whose equilibrium (1/4, 1/2, 1/4)
a win-rate matrix cannot see.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from autocurricula.games._common import ask, check_penalty, check_players, choice, invalid_rewards
from autocurricula.records import GameFacts

__all__ = ["BIASED_RPS", "COLUMN_WORDS", "FACTS", "NUM_PLAYERS", "SEATS", "WORDS", "ZERO_SUM", "MatrixGame", "moves", "play",
           "check_tokenizer", "random_game", "random_policy"]

WORDS = ("red", "blue", "green", "left", "right")  # the rows'; one token each in the tiny model's vocabulary
COLUMN_WORDS = ("up", "down", "yes", "no", "two")  # the columns'
SEATS = ("rows", "columns")


class MatrixGame:
    """One zero-sum matrix game as a :class:`~autocurricula.arena.game.Game` object: pass it (or
    ``game.play``) to ``trainer.train``. ``words`` names the actions (the first ``rows`` for the
    row player, the first ``columns`` for the column player).

    Its :attr:`facts` are inferred from the matrix: two players, zero-sum (the columns lose what the
    rows win), one simultaneous decision, no chance, each seat's payoff range read off the matrix.
    :meth:`check_tokenizer` (run when the game meets the model's tokenizer: the trainer calls it
    before the first round, and ``play`` on its first call with a tokenizer) refuses a word the
    tokenizer splits into more tokens than ``max_tokens``: such a word could never be answered."""

    NUM_PLAYERS = 2
    ZERO_SUM = True

    def __init__(self, payoff: Sequence[Sequence[float]], words: Sequence[str] = WORDS,
                 column_words: Sequence[str] = COLUMN_WORDS, *, name: str = "matrix", max_tokens: int = 1):
        rows = [tuple(float(v) for v in row) for row in payoff]
        if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("payoff must be a non-empty rectangular list of rows, e.g. [[1, -1], [-1, 1]]")
        for seat, arg, ws, k in (("rows", "words", words, len(rows)), ("columns", "column_words", column_words,
                                                                         len(rows[0]))):
            if k > len(ws) or len(set(ws)) != len(ws):
                raise ValueError(f"{k} {seat} need at least {k} distinct words, got {list(ws)}: pass "
                                 f"{arg}=[...] with {k} or more distinct one-word replies")
            if any(w != w.strip() or not w or " " in w for w in ws):
                raise ValueError(f"each word must be one word without spaces, got {list(ws)}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.payoff = tuple(rows)
        self.words = (tuple(words[:len(rows)]), tuple(column_words[:len(rows[0])]))
        self.name, self.max_tokens = name, int(max_tokens)
        flat = [v for r in rows for v in r]
        self.forfeit = (min(flat), -max(flat))  # the worst payoff of each seat
        self._checked: set[int] = set()  # ids of the tokenizers whose spelling of the words passed

    @property
    def facts(self) -> GameFacts:
        """Two players, zero-sum, one simultaneous decision, no chance; the rows' rewards span the
        matrix's, the columns' their negation."""
        lo, hi = min(min(r) for r in self.payoff), max(max(r) for r in self.payoff)
        return GameFacts(2, "zero_sum", "one_shot", "simultaneous", chance=False,
                         seat_ranges=((lo, hi), (-hi, -lo)))

    def check_tokenizer(self, tokenizer) -> None:
        """``ValueError`` naming each word that ``tokenizer`` spells with more tokens than
        ``max_tokens`` (as the game asks for it: after a space), and its tokens: a reply of
        ``max_tokens`` tokens could never be that word, so the seat would forfeit every game."""
        if tokenizer is None or id(tokenizer) in self._checked:
            return
        split = []
        for seat, words in enumerate(self.words):
            for w in words:
                ids = list(tokenizer.encode(" " + w, add_special_tokens=False))
                if len(ids) > self.max_tokens:
                    pieces = [tokenizer.decode([t]) for t in ids]
                    split.append(f"{w!r} ({SEATS[seat]}) is {len(ids)} tokens {pieces}")
        if split:
            raise ValueError(f"{self!r}: the model's tokenizer splits words of the game, so a reply of max_tokens="
                             f"{self.max_tokens} can never be them: {'; '.join(split)}. Pick words the tokenizer keeps "
                             f"whole (MatrixGame(payoff, words=[...], column_words=[...])), or raise max_tokens")
        self._checked.add(id(tokenizer))

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.payoff), len(self.payoff[0])

    def prompt(self, seat: int) -> str:
        # the seat comes last, next to the answer, where a small model reads it best
        return f"matrix game. pick one of {' '.join(self.words[seat])}. you play the {SEATS[seat]}:"

    def seat_of(self, prompt: str) -> int:
        for seat in (0, 1):
            if prompt == self.prompt(seat):
                return seat
        raise ValueError(f"not a prompt of this game: {prompt!r}")

    def moves(self, prompt: str) -> list[str]:
        """The legal replies at one of the game's prompts, written as the warm-up teaches them (the word
        after a space): per-move credit forces and scores exactly these tokens."""
        return [" " + w for w in self.words[self.seat_of(prompt)]]

    def action(self, seat: int, reply: str) -> int | None:
        """The index of a legal reply of ``seat``, None for an invalid one."""
        word = reply.strip()
        return self.words[seat].index(word) if word in self.words[seat] else None

    def rewards(self, row: int | None, col: int | None) -> list[float]:
        """Both players' rewards for the two actions (None = an invalid reply)."""
        if row is None and col is None:
            return [0.0, 0.0]
        if row is None:
            return [self.forfeit[0], -self.forfeit[0]]
        if col is None:
            return [-self.forfeit[1], self.forfeit[1]]
        v = self.payoff[row][col]
        return [v, -v]

    def random_policy(self, prompt: str, rng: Any = None) -> str:
        return choice(rng, self.moves(prompt))

    async def play(self, players: list[dict], model, tokenizer=None, *, invalid_penalty=None,
                   seed: int | None = None) -> list[float]:
        """One game: ``players[0]`` plays the rows, ``players[1]`` the columns. ``invalid_penalty``
        (offender, other) replaces the zero-sum forfeit of invalid replies; ``seed`` is accepted as
        every game accepts it, and unused: the game has no chance moves."""
        check_players(players, 2, "a matrix game")
        if tokenizer is not None and id(tokenizer) not in self._checked:
            self.check_tokenizer(tokenizer)
        if invalid_penalty is not None:
            check_penalty(invalid_penalty)
        replies = await asyncio.gather(*(ask(model, p, self.prompt(seat), max_tokens=self.max_tokens)
                                         for seat, p in enumerate(players)))
        actions = [self.action(0, replies[0]), self.action(1, replies[1])]
        if invalid_penalty is not None and None in actions:
            return invalid_rewards(2, [s for s, a in enumerate(actions) if a is None], invalid_penalty)
        return self.rewards(*actions)

    def warmup_examples(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` (prompt, reply) pairs, seats and legal words uniform: the format, and no strategy. The
        reply is the word after a space, as it follows the prompt's colon (one token in most vocabularies)."""
        rng = random.Random(seed)
        return [(self.prompt(s), " " + rng.choice(self.words[s])) for s in (rng.randrange(2) for _ in range(n))]

    def __repr__(self) -> str:
        return f"MatrixGame({self.name}, {self.shape[0]}x{self.shape[1]})"


def random_game(seed: int, *, sizes: Sequence[int] = (2, 3, 4, 5), words: Sequence[str] = WORDS,
                column_words: Sequence[str] = COLUMN_WORDS) -> MatrixGame:
    """A random zero-sum game: rows and columns each drawn from ``sizes``, payoffs uniform in
    [-1, 1] rounded to 2 decimals (so a game prints exactly), named ``random-<seed>``."""
    rng = random.Random(seed)
    m, n = rng.choice(list(sizes)), rng.choice(list(sizes))
    payoff = [[round(rng.uniform(-1.0, 1.0), 2) for _ in range(n)] for _ in range(m)]
    return MatrixGame(payoff, words, column_words, name=f"random-{seed}")


BIASED_RPS = MatrixGame([[0.0, -1.0, 2.0], [1.0, 0.0, -1.0], [-2.0, 1.0, 0.0]], name="biased-rps")
NUM_PLAYERS, ZERO_SUM = MatrixGame.NUM_PLAYERS, MatrixGame.ZERO_SUM
FACTS = BIASED_RPS.facts


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=None, seed: int | None = None) -> list[float]:
    """One game of ``BIASED_RPS`` (build a :class:`MatrixGame` for another matrix)."""
    return await BIASED_RPS.play(players, model, tokenizer, invalid_penalty=invalid_penalty, seed=seed)


def moves(prompt: str) -> list[str]:
    return BIASED_RPS.moves(prompt)


def random_policy(prompt: str, rng: Any = None) -> str:
    return BIASED_RPS.random_policy(prompt, rng)


def check_tokenizer(tokenizer) -> None:
    """:meth:`MatrixGame.check_tokenizer` of ``BIASED_RPS``."""
    BIASED_RPS.check_tokenizer(tokenizer)
