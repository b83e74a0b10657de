"""Kuhn poker (H. W. Kuhn, "A simplified two-person poker", 1950), one hand; SPIRAL trains on it.

Rules: a deck of three cards J < Q < K; each player antes 1 chip and gets one card (the third is
unseen). ``players[0]`` acts first: "check" or "bet" (1 chip). After a check, ``players[1]`` checks
(showdown for the pot of 2) or bets, and then ``players[0]`` calls (showdown for 4) or folds. After a
bet, ``players[1]`` calls (showdown for 4) or folds. At a showdown the higher card takes the pot; a
fold gives the pot to the other player. Rewards are the chips won or lost (+-1 or +-2, zero-sum).

A reply's action is the first of the words check / bet / call / fold in it (case-insensitive); no
such word, or a word that is not legal at that point, is an invalid move: the offender gets
``invalid_penalty[0]`` (default -1.5), the other player ``invalid_penalty[1]`` (default +0.5).

Prompt::

    kuhn poker, cards J<Q<K, ante 1.
    you are player 2, your card: Q
    history: check bet
    your action (call/fold):

Known equilibrium (Kuhn 1950): ``equilibrium_strategy(alpha)`` for alpha in [0, 1/3]; player 1's
expected value is -1/18 per hand (``exact_value``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, PromptStyle, TurnGame, answer_moves, check_penalty,
                                         check_players, choice, drive, drive_sync, first_word, make_rng, uniform)
from autocurricula.games._common import with_options as _with_options
from autocurricula.records import GameFacts

__all__ = ["FACTS", "ACTIONS", "CARDS", "NUM_PLAYERS", "ZERO_SUM", "KuhnPoker", "deal", "equilibrium_strategy",
           "exact_value", "is_terminal", "legal_actions", "moves", "parse_action", "parse_prompt", "payoff", "play",
           "play_out", "random_policy", "render_prompt", "strategy_policy", "warmup_examples", "warmup_strategy",
           "with_options"]

NUM_PLAYERS = 2
ZERO_SUM = True
FACTS = GameFacts(2, "zero_sum", "imperfect", "sequential", chance=True, payoff_range=(-2.0, 2.0))  # chips
CARDS = "JQK"
ACTIONS = ("check", "bet", "call", "fold")
TERMINAL = {("check", "check"), ("bet", "call"), ("bet", "fold"), ("check", "bet", "call"), ("check", "bet", "fold")}
_ACTION_RE = re.compile(r"\b(check|bet|call|fold)", re.IGNORECASE)
RULES = ("You are playing Kuhn poker: a deck of three cards J < Q < K, each player antes 1 chip and holds one "
         "card. Players check or bet 1 chip; facing a bet, call or fold. At a showdown the higher card takes the "
         "pot. Your move is one of the actions the prompt lists.")
_PROMPT_RE = re.compile(r"you are player ([12]), your card: ([JQK])\nhistory: ([a-z ]*)\n")


def legal_actions(history: Sequence[str]) -> tuple[str, ...]:
    h = tuple(history)
    if h in TERMINAL:
        return ()
    if h in ((), ("check",)):
        return ("check", "bet")
    if h in (("bet",), ("check", "bet")):
        return ("call", "fold")
    raise ValueError(f"not a Kuhn poker history: {h!r}")


def is_terminal(history: Sequence[str]) -> bool:
    return tuple(history) in TERMINAL


def payoff(cards: Sequence[str], history: Sequence[str]) -> tuple[float, float]:
    """Chips won by (player 1, player 2) at a terminal history; ``cards`` as e.g. "KQ"."""
    h = tuple(history)
    if h not in TERMINAL:
        raise ValueError(f"history {h!r} is not terminal")
    if h[-1] == "fold":
        folder = (len(h) - 1) % 2
        won = 1.0 if folder == 1 else -1.0  # the folder loses its ante only
    else:
        stake = 2.0 if h[-1] == "call" else 1.0
        won = stake if CARDS.index(cards[0]) > CARDS.index(cards[1]) else -stake
    return won, -won


def deal(rng) -> str:
    """Two distinct cards, player 1's first, e.g. "QJ"."""
    first = choice(rng, CARDS)
    return first + choice(rng, [c for c in CARDS if c != first])


def render_prompt(card: str, history: Sequence[str], seat: int) -> str:
    legal = legal_actions(history)
    return (f"kuhn poker, cards J<Q<K, ante 1.\nyou are player {seat + 1}, your card: {card}\n"
            f"history: {' '.join(history) or 'none'}\nyour action ({'/'.join(legal)}):")


def parse_prompt(prompt: str) -> tuple[str, tuple[str, ...], int]:
    """(card, history, seat) back from a prompt made by ``render_prompt``."""
    found = _PROMPT_RE.findall(prompt)
    if not found:
        raise ValueError("not a Kuhn poker prompt")
    seat, card, hist = found[-1]
    history = tuple(w for w in hist.split() if w != "none")
    return card, history, int(seat) - 1


def moves(prompt: str) -> list[str]:
    """The legal replies at a prompt made by ``render_prompt`` (the Game protocol's ``moves``:
    branch credit's ``advantage="moves"`` branches each of them), in answer tags when the prompt
    asks for the reasoning format."""
    return answer_moves(prompt, list(legal_actions(parse_prompt(prompt)[1])))


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
    _, history, _ = parse_prompt(prompt)
    return choice(rng, legal_actions(history))


def infoset(card: str, history: Sequence[str]) -> str:
    """Key of an information set, e.g. "Q:check bet" (the card and the public history)."""
    return f"{card}:{' '.join(history)}"


def equilibrium_strategy(alpha: float = 1 / 3) -> dict[str, float]:
    """Kuhn's equilibrium family: information set -> probability of the aggressive action (bet or
    call). Player 1 bluffs J with alpha, bets K with 3 alpha, calls with Q with alpha + 1/3;
    player 2 bets J after a check with 1/3, calls with Q with 1/3, always bets/calls with K."""
    if not 0 <= alpha <= 1 / 3 + 1e-12:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    return {
        "J:": alpha, "Q:": 0.0, "K:": 3 * alpha,  # player 1 opens
        "J:check bet": 0.0, "Q:check bet": alpha + 1 / 3, "K:check bet": 1.0,  # player 1 facing a bet
        "J:check": 1 / 3, "Q:check": 0.0, "K:check": 1.0,  # player 2 after a check
        "J:bet": 0.0, "Q:bet": 1 / 3, "K:bet": 1.0,  # player 2 facing a bet
    }


def _aggressive(history: Sequence[str]) -> str:
    return "bet" if "bet" in legal_actions(history) else "call"


def _passive(history: Sequence[str]) -> str:
    return "check" if "check" in legal_actions(history) else "fold"


def exact_value(strategy1: dict[str, float], strategy2: dict[str, float]) -> float:
    """Player 1's expected chips per hand over the six deals, both playing behaviour strategies
    (information set -> probability of betting/calling)."""
    def value(cards: str, history: tuple[str, ...]) -> float:
        if is_terminal(history):
            return payoff(cards, history)[0]
        seat = len(history) % 2
        p = (strategy1, strategy2)[seat][infoset(cards[seat], history)]
        return (p * value(cards, history + (_aggressive(history),))
                + (1 - p) * value(cards, history + (_passive(history),)))

    deals = [a + b for a in CARDS for b in CARDS if a != b]
    return sum(value(d, ()) for d in deals) / len(deals)


def strategy_policy(strategy: dict[str, float]) -> Callable[[str, Any], str]:
    """Scripted player sampling a behaviour strategy (as ``equilibrium_strategy`` returns)."""
    def policy(prompt: str, rng: Any = None) -> str:
        card, history, _ = parse_prompt(prompt)
        p = strategy[infoset(card, history)]
        return _aggressive(history) if uniform(rng) < p else _passive(history)

    return policy


def warmup_strategy(seed: int = 0, spread: tuple[float, float] = (0.2, 0.8)) -> dict[str, float]:
    """A random strategy per information set: P(bet or call) drawn uniformly from ``spread`` for each
    of the 12 sets (``"Q:check bet"``), the targets of ``warmup_examples(n, seed, spread)``."""
    if not 0.0 <= spread[0] <= spread[1] <= 1.0:
        raise ValueError(f"spread must be (low, high) with 0 <= low <= high <= 1, got {spread!r}")
    rng = make_rng(seed)
    keys = [(c, h) for h in ((), ("check",), ("bet",), ("check", "bet")) for c in CARDS]
    return {infoset(c, h): spread[0] + (spread[1] - spread[0]) * uniform(rng) for c, h in keys}


def warmup_examples(n: int, seed: int = 0, spread: tuple[float, float] = (0.2, 0.8)) -> list[tuple[str, str]]:
    """(prompt, action) pairs for a supervised warm-up that teaches the format but no strategy, with the
    private card in the targets: every example samples its information set's action from
    ``warmup_strategy(seed, spread)``, a different random mix per set, so a base that matches the
    targets must read its card and the history (targets that ignore the card teach it not to)."""
    strategy = warmup_strategy(seed, spread)
    rng = make_rng(seed + 1)
    keys = [(c, h) for h in ((), ("check",), ("bet",), ("check", "bet")) for c in CARDS]
    out = []
    for _ in range(n):
        card, history = keys[rng.randrange(len(keys))]
        p = strategy[infoset(card, history)]
        out.append((render_prompt(card, history, len(history) % 2), _aggressive(history) if uniform(rng) < p
                    else _passive(history)))
    return out


class KuhnPoker(TurnGame):
    def __init__(self, cards: str):
        super().__init__()
        if len(cards) != 2 or cards[0] == cards[1] or set(cards) - set(CARDS):
            raise ValueError(f"cards must be two distinct of J, Q, K (player 1's first), got {cards!r}")
        self.cards = cards
        self.history: tuple[str, ...] = ()

    def prompt(self) -> str:
        return render_prompt(self.cards[self.to_move], self.history, self.to_move)

    def step(self, reply: str) -> None:
        action = parse_action(reply, legal_actions(self.history))
        if action is None:
            return self.mark_invalid()
        self.history += (action,)
        if is_terminal(self.history):
            self.done = True
        else:
            self.to_move = 1 - self.to_move

    def outcome(self) -> list[float]:
        return list(payoff(self.cards, self.history))


def play_out(policy1: Callable, policy2: Callable, rng: Any = None, *, cards: str | None = None,
             invalid_penalty=DEFAULT_INVALID_PENALTY) -> list[float]:
    """One scripted hand without a model; returns the two rewards."""
    rng = make_rng(rng=rng)
    game = KuhnPoker(cards or deal(rng))
    return drive_sync(game, [policy1, policy2], rng).rewards(invalid_penalty)


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=DEFAULT_INVALID_PENALTY,
               max_tokens: int = 3, temperature: float | None = None, seed: int | None = None, rng: Any = None,
               cards: str | None = None, stop=None, chat: bool = False, reasoning: bool = False,
               thinking_tokens: int = 256) -> list[float]:
    """One hand; ``players[0]`` acts first. Cards are dealt from ``rng``, else ``seed``, else the
    league's per-game seed (``model.seed``), unless ``cards`` (e.g. "KJ": player 1 holds K) fixes
    them. Returns the chips won by each player.

    ``chat=True`` sends the rules as a system message and the position as a user message through
    the model's chat template; ``reasoning=True`` lets the player think (up to ``thinking_tokens``
    tokens) before ``<answer>MOVE</answer>``, of which only the answer is parsed (see
    :class:`~autocurricula.games._common.PromptStyle`)."""
    check_players(players, 2, "Kuhn poker")
    check_penalty(invalid_penalty)
    style = PromptStyle(chat, reasoning, thinking_tokens)
    seed = seed if seed is not None else getattr(model, "seed", None)  # the league's per-game seed
    game = KuhnPoker(cards or deal(make_rng(seed, rng)))
    await drive(game, players, model, max_tokens=max_tokens, temperature=temperature, stop=stop, style=style,
                rules=RULES)
    return game.rewards(invalid_penalty)


def with_options(**options):
    """Kuhn poker played with ``options`` of :func:`play` (e.g. ``chat=True, reasoning=True``), as a
    Game object that keeps the game's name and ``moves`` (a ``functools.partial`` of ``play`` loses them)."""
    return _with_options(sys.modules[__name__], **options)

