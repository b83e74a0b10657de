"""Leduc hold'em (Southey et al., "Bayes' bluff", 2005), one hand, with OpenSpiel's ``leduc_poker`` rules.

Rules: a deck of six cards, two each of J < Q < K. Each player antes 1 chip and gets one private
card; a third card, the board, is dealt face up after the first betting round. Two betting rounds,
``players[0]`` first in each. With no bet to face a player checks or bets; facing a bet it folds,
calls or raises (a bet or raise adds 2 chips in round 1 and 4 in round 2, at most two a round:
a bet and one raise). A round ends at check check or at a call. A fold gives the pot to the other
player; at the showdown a card that pairs the board wins, else the higher card, and equal cards
split. Rewards are the chips won or lost (zero-sum, at most 13 a hand).

A reply's action is the first of the words check / bet / call / raise / fold in it
(case-insensitive); no such word, or a word that is not legal at that point, is an invalid move
that ends the hand: the offender gets ``invalid_penalty[0]``, the other player
``invalid_penalty[1]``. The default ``INVALID_PENALTY`` (-9.5, +9.5) costs 0.5 more than the
largest fold (9 chips), as Kuhn poker's -1.5 does over its fold of 1 chip, so an invalid reply
never pays better than folding. It stays zero-sum: a forfeit that paid the other player less than
the pot (Kuhn's +0.5) would let a losing player cap its loss by answering nonsense, and invalid
replies would lower the exploitability measured as played.

Prompt::

    leduc poker, cards JJQQKK, ante 1, bets 2 then 4.
    you are player 1, your card: Q, board: K
    round 1: bet call
    round 2: check bet
    your action (fold/call/raise):

An information set is ``infoset(card, board, rounds)``, e.g. ``"QK:bet call|check bet"`` (round 1
before the bar); suits never matter, so cards are shown by rank.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autocurricula.games._common import (PromptStyle, TurnGame, answer_moves, check_penalty, check_players, choice,
                                         drive, drive_sync, first_word, make_rng, uniform)
from autocurricula.games._common import with_options as _with_options
from autocurricula.records import GameFacts

__all__ = ["FACTS", "ACTIONS", "DECK", "INVALID_PENALTY", "LeducPoker", "NUM_PLAYERS", "RANKS", "ZERO_SUM", "board_odds",
           "contributions", "deal", "deal_odds", "first_action", "information_sets", "infoset", "is_terminal",
           "legal_actions", "moves", "parse_action", "parse_infoset", "parse_prompt", "payoff", "play", "play_out",
           "random_policy", "render_prompt", "round_over", "strategy_policy", "to_move", "warmup_examples",
           "warmup_strategy", "with_options"]

NUM_PLAYERS = 2
ZERO_SUM = True
# chips: at most the ante and two raises in each round (1 + 2 + 2 + 4 + 4) change hands
FACTS = GameFacts(2, "zero_sum", "imperfect", "sequential", chance=True, payoff_range=(-13.0, 13.0))
RANKS = "JQK"
DECK = "JJQQKK"
ACTIONS = ("check", "bet", "call", "raise", "fold")
RAISE_SIZES = (2, 4)  # per round
MAX_RAISES = 2  # per round, the bet included
INVALID_PENALTY = (-9.5, 9.5)  # 0.5 worse than the largest fold (9 chips), zero-sum
_ACTION_RE = re.compile(r"\b(check|bet|call|raise|fold)", re.IGNORECASE)
RULES = ("You are playing Leduc hold'em: six cards, two each of J < Q < K. Each player antes 1 chip and holds one "
         "card; a board card is shown after the first of two betting rounds. Check or bet; facing a bet, fold, call "
         "or raise (2 chips in round 1, 4 in round 2, at most two bets a round). A card pairing the board wins, "
         "else the higher card. Your move is one of the actions the prompt lists.")
_PROMPT_RE = re.compile(r"you are player ([12]), your card: ([JQK]), board: ([JQK?])\nround 1: ([a-z ]*)\n"
                        r"(?:round 2: ([a-z ]*)\n)?your action")

Rounds = tuple[tuple[str, ...], ...]


def round_over(words: Sequence[str]) -> bool:
    """Whether a betting round's words end it (check check, a call, or a fold)."""
    w = tuple(words)
    return w == ("check", "check") or (bool(w) and w[-1] in ("call", "fold"))


def _round_actions(words: tuple[str, ...]) -> tuple[str, ...]:
    """The legal words after ``words`` of a round that is not over."""
    raises = sum(w in ("bet", "raise") for w in words)
    if raises == 0:
        return ("check", "bet")
    return ("fold", "call", "raise") if raises < MAX_RAISES else ("fold", "call")


def _check_rounds(rounds: Sequence[Sequence[str]]) -> Rounds:
    r = tuple(tuple(x) for x in rounds)
    if not 1 <= len(r) <= 2 or (len(r) == 2 and (not round_over(r[0]) or r[0][-1] == "fold")):
        raise ValueError(f"not a Leduc poker history: {r!r} (one or two rounds of words, the first one over "
                         f"without a fold)")
    for words in r:
        for i, w in enumerate(words):
            if round_over(words[:i]) or w not in _round_actions(words[:i]):
                raise ValueError(f"not a Leduc poker history: {r!r} ({w!r} cannot follow {words[:i]!r} in a round)")
    return r


def legal_actions(rounds: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The legal words of the player to move, given each round's words so far (``[["bet", "call"], []]``)."""
    r = _check_rounds(rounds)
    if is_terminal(r):
        return ()
    if round_over(r[-1]):
        raise ValueError(f"round 1 of {r!r} is over: give round 2's words, e.g. {r + ((),)!r}")
    return _round_actions(r[-1])


def is_terminal(rounds: Sequence[Sequence[str]]) -> bool:
    """A fold, or the second round over (the showdown)."""
    r = tuple(tuple(x) for x in rounds)
    return (bool(r[-1]) and r[-1][-1] == "fold") or (len(r) == 2 and round_over(r[1]))


def to_move(rounds: Sequence[Sequence[str]]) -> int:
    """The seat to act: player 1 opens each round, then they alternate."""
    return len(tuple(rounds)[-1]) % 2


def contributions(rounds: Sequence[Sequence[str]]) -> tuple[int, int]:
    """Chips each player has put in the pot, the ante included."""
    put = [1, 1]
    for size, words in zip(RAISE_SIZES, rounds):
        for i, w in enumerate(words):
            seat = i % 2
            if w == "call":
                put[seat] = put[1 - seat]
            elif w in ("bet", "raise"):
                put[seat] = put[1 - seat] + size
    return put[0], put[1]


def _rank(card: str) -> int:
    return RANKS.index(card)


def payoff(cards: str, rounds: Sequence[Sequence[str]]) -> tuple[float, float]:
    """Chips won by (player 1, player 2) at a terminal history; ``cards`` as "QKJ" (player 1's,
    player 2's, the board)."""
    r = tuple(tuple(x) for x in rounds)
    if not is_terminal(r):
        raise ValueError(f"history {r!r} is not terminal")
    put = contributions(r)
    if r[-1][-1] == "fold":
        folder = (len(r[-1]) - 1) % 2
        won = float(put[folder]) if folder == 1 else -float(put[folder])
        return won, -won
    strength = [(c == cards[2], _rank(c)) for c in cards[:2]]  # a pair beats any high card
    won = 0.0 if strength[0] == strength[1] else float(put[1]) if strength[0] > strength[1] else -float(put[0])
    return won, -won


def deal(rng) -> str:
    """Three distinct cards of the deck: player 1's, player 2's and the board, e.g. "QKJ"."""
    deck = list(DECK)
    return "".join(deck.pop(deck.index(choice(rng, deck))) for _ in range(3))


def deal_odds(card: str) -> dict[str, float]:
    """P(the other player's card) given one's own: the same rank 1/5, each other rank 2/5."""
    return {c: (DECK.count(c) - (c == card)) / (len(DECK) - 1) for c in RANKS}


def board_odds(cards: str) -> dict[str, float]:
    """P(the board) given both private cards (``"QK"``), from the four cards left."""
    left = len(DECK) - 2
    return {c: (DECK.count(c) - cards.count(c)) / left for c in RANKS if DECK.count(c) > cards.count(c)}


def infoset(card: str, board: str | None, rounds: Sequence[Sequence[str]]) -> str:
    """Key of an information set: the private card, the board once shown, then the rounds' words,
    e.g. ``"Q:bet raise"`` (round 1) or ``"QK:bet call|check"`` (round 2)."""
    r = tuple(tuple(x) for x in rounds)
    return f"{card}{board or ''}:" + "|".join(" ".join(words) for words in r)


def parse_infoset(key: str) -> tuple[str, str | None, Rounds]:
    """``(card, board, rounds)`` back from an ``infoset`` key."""
    cards, _, hist = key.partition(":")
    rounds = tuple(tuple(part.split()) for part in hist.split("|"))
    return cards[0], (cards[1] if len(cards) > 1 else None), rounds


def render_prompt(card: str, board: str | None, rounds: Sequence[Sequence[str]], seat: int) -> str:
    r = _check_rounds(rounds)
    lines = [f"leduc poker, cards {DECK}, ante 1, bets 2 then 4.",
             f"you are player {seat + 1}, your card: {card}, board: {board or '?'}"]
    lines += [f"round {i + 1}: {' '.join(words) or 'none'}" for i, words in enumerate(r)]
    return "\n".join(lines) + f"\nyour action ({'/'.join(legal_actions(r))}):"


def parse_prompt(prompt: str) -> tuple[str, str | None, Rounds, int]:
    """(card, board, rounds, seat) back from a prompt made by ``render_prompt``."""
    found = _PROMPT_RE.findall(prompt)
    if not found:
        raise ValueError("not a Leduc poker prompt")
    seat, card, board, r1, r2 = found[-1]
    words = [tuple(w for w in r1.split() if w != "none")]
    if "round 2: " in prompt:
        words.append(tuple(w for w in r2.split() if w != "none"))
    return card, (None if board == "?" else board), tuple(words), int(seat) - 1


def moves(prompt: str) -> list[str]:
    """The legal replies at a prompt made by ``render_prompt`` (the Game protocol's ``moves``), in
    answer tags when the prompt asks for the reasoning format."""
    return answer_moves(prompt, list(legal_actions(parse_prompt(prompt)[2])))


def first_action(text: str) -> str | None:
    """The first action word in ``text``, legal or not (None when there is none). Text appended
    later cannot change it."""
    return first_word(_ACTION_RE, text)


def parse_action(text: str, legal: Sequence[str] = ACTIONS) -> str | None:
    """The first action word in ``text`` if it is legal, else None."""
    action = first_action(text)
    return action if action in legal else None


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player: a uniformly random legal action."""
    return choice(rng, legal_actions(parse_prompt(prompt)[2]))


def _sample(probs: Mapping[str, float], legal: Sequence[str], rng: Any) -> str:
    x, acc = uniform(rng), 0.0
    for a in legal:
        acc += float(probs.get(a, 0.0))
        if x < acc:
            return a
    return legal[-1]


def strategy_policy(strategy: Mapping[str, Mapping[str, float]]) -> Callable[[str, Any], str]:
    """Scripted player sampling a behaviour strategy: information set -> {legal word: probability}."""
    def policy(prompt: str, rng: Any = None) -> str:
        card, board, rounds, _ = parse_prompt(prompt)
        return _sample(strategy[infoset(card, board, rounds)], legal_actions(rounds), rng)

    return policy


def information_sets() -> list[tuple[str, str | None, Rounds]]:
    """Every information set as ``(card, board, rounds)``, round 1's then round 2's (288: 18 + 270)."""
    def histories(prefix: Rounds) -> list[Rounds]:
        out, stack = [], [prefix + ((),)]
        while stack:
            r = stack.pop()
            out.append(r)
            stack += [r[:-1] + (r[-1] + (a,),) for a in reversed(legal_actions(r))
                      if not round_over(r[-1] + (a,))]
        return out

    first = histories(())
    ends = [r[:-1] + (r[-1] + (a,),) for r in first for a in legal_actions(r)
            if round_over(r[-1] + (a,)) and a != "fold"]
    keys = [(c, None, r) for r in first for c in RANKS]
    keys += [(c, b, r) for e in ends for r in histories(e) for c in RANKS for b in RANKS]
    return keys


def warmup_strategy(seed: int = 0, spread: float = 0.9) -> dict[str, dict[str, float]]:
    """A random strategy per information set, the targets of ``warmup_examples``: legal words
    weighted by ``1 + spread * u`` with ``u`` uniform in [-1, 1], one draw per word and set."""
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"spread must be in [0, 1), got {spread!r}")
    rng = make_rng(seed)
    out = {}
    for card, board, rounds in information_sets():
        w = {a: 1.0 + spread * (2 * uniform(rng) - 1) for a in legal_actions(rounds)}
        total = sum(w.values())
        out[infoset(card, board, rounds)] = {a: x / total for a, x in w.items()}
    return out


def warmup_examples(n: int, seed: int = 0, spread: float = 0.9) -> list[tuple[str, str]]:
    """(prompt, action) pairs for a supervised warm-up that teaches the format but no strategy: each
    example draws an information set uniformly and its action from ``warmup_strategy(seed,
    spread)``, a different random mix per set, so a base that matches the targets reads its card,
    the board and the history."""
    strategy = warmup_strategy(seed, spread)
    keys = information_sets()
    rng = make_rng(seed + 1)
    out = []
    for _ in range(n):
        card, board, rounds = keys[rng.randrange(len(keys))]
        action = _sample(strategy[infoset(card, board, rounds)], legal_actions(rounds), rng)
        out.append((render_prompt(card, board, rounds, to_move(rounds)), action))
    return out


class LeducPoker(TurnGame):
    def __init__(self, cards: str):
        super().__init__()
        if len(cards) != 3 or set(cards) - set(RANKS) or any(cards.count(c) > DECK.count(c) for c in cards):
            raise ValueError(f"cards must be three of J J Q Q K K (player 1's, player 2's, the board), got {cards!r}")
        self.cards = cards
        self.rounds: Rounds = ((),)

    @property
    def board(self) -> str | None:
        return self.cards[2] if len(self.rounds) == 2 else None

    def prompt(self) -> str:
        return render_prompt(self.cards[self.to_move], self.board, self.rounds, self.to_move)

    def step(self, reply: str) -> None:
        action = parse_action(reply, legal_actions(self.rounds))
        if action is None:
            return self.mark_invalid()
        self.rounds = self.rounds[:-1] + (self.rounds[-1] + (action,),)
        if is_terminal(self.rounds):
            self.done = True
            return
        if round_over(self.rounds[-1]):
            self.rounds += ((),)
        self.to_move = to_move(self.rounds)

    def outcome(self) -> list[float]:
        return list(payoff(self.cards, self.rounds))


def play_out(policy1: Callable, policy2: Callable, rng: Any = None, *, cards: str | None = None,
             invalid_penalty=INVALID_PENALTY) -> list[float]:
    """One scripted hand without a model; returns the two rewards."""
    rng = make_rng(rng=rng)
    game = LeducPoker(cards or deal(rng))
    return drive_sync(game, [policy1, policy2], rng).rewards(invalid_penalty)


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=INVALID_PENALTY,
               max_tokens: int = 3, temperature: float | None = None, seed: int | None = None, rng: Any = None,
               cards: str | None = None, stop=None, chat: bool = False, reasoning: bool = False,
               thinking_tokens: int = 256) -> list[float]:
    """One hand; ``players[0]`` opens each round. Cards are dealt from ``rng``, else ``seed``, else
    the league's per-game seed (``model.seed``), unless ``cards`` (e.g. "QKJ": player 1 holds Q,
    player 2 K, the board is J) fixes them. Returns the chips won by each player.

    ``chat`` and ``reasoning`` as in :func:`autocurricula.games.kuhn_poker.play`."""
    check_players(players, 2, "Leduc poker")
    check_penalty(invalid_penalty)
    style = PromptStyle(chat, reasoning, thinking_tokens)
    seed = seed if seed is not None else getattr(model, "seed", None)  # the league's per-game seed
    game = LeducPoker(cards or deal(make_rng(seed, rng)))
    await drive(game, players, model, max_tokens=max_tokens, temperature=temperature, stop=stop, style=style,
                rules=RULES)
    return game.rewards(invalid_penalty)


def with_options(**options):
    """Leduc poker played with ``options`` of :func:`play` (e.g. ``chat=True, reasoning=True``), as a
    Game object that keeps the game's name and ``moves``."""
    return _with_options(sys.modules[__name__], **options)
