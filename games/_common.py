"""Plumbing shared by the game modules: seeded randomness, invalid-move rewards, turn drivers, and
how a turn speaks to the model (:class:`PromptStyle`: plain or chat prompts, a reasoning format).

Not a game (the leading underscore keeps it out of game discovery).
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autocurricula.arena.game import ListsMoves
from autocurricula.records import Generation, call_scripted, is_scripted

DEFAULT_INVALID_PENALTY = (-1.5, 0.5)  # (offender, every other player), as in SPIRAL


def make_rng(seed: int | None = None, rng: Any = None) -> random.Random:
    """The game's own ``random.Random``: from ``rng`` (``random.Random`` is used as is, a NumPy
    Generator seeds a fresh one), else from ``seed``, else from ``os.urandom``."""
    if rng is not None:
        if isinstance(rng, random.Random):
            return rng
        if hasattr(rng, "integers"):  # numpy.random.Generator
            return random.Random(int(rng.integers(0, 2**63 - 1)))
        raise TypeError(f"rng must be a random.Random or a numpy Generator, got {type(rng).__name__}")
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return random.Random(seed)


def choice(rng: Any, seq: Sequence):
    """Uniform pick with a ``random.Random``, a NumPy Generator or None (module ``random``)."""
    seq = list(seq)
    if not seq:
        raise ValueError("choice from an empty sequence")
    if rng is None:
        rng = random
    if hasattr(rng, "integers"):
        return seq[int(rng.integers(len(seq)))]
    return seq[rng.randrange(len(seq))]


def uniform(rng: Any) -> float:
    """A float in [0, 1) from any of the generators ``choice`` accepts."""
    return (rng if rng is not None else random).random()


def check_penalty(invalid_penalty) -> tuple[float, float]:
    try:
        off, other = (float(x) for x in invalid_penalty)
    except (TypeError, ValueError):
        raise ValueError(f"invalid_penalty must be a pair (offender, others) of numbers, got {invalid_penalty!r}") \
            from None
    if not (math.isfinite(off) and math.isfinite(other)):
        raise ValueError(f"invalid_penalty must be finite, got {invalid_penalty!r}")
    return off, other


def invalid_rewards(n: int, offenders, penalty) -> list[float]:
    off, other = check_penalty(penalty)
    offenders = set(offenders)
    return [off if i in offenders else other for i in range(n)]


def check_players(players, n: int | None = 2, game: str = "this game") -> None:
    if n is not None and len(players) != n:
        raise ValueError(f"{game} takes {n} players, got {len(players)}")
    if n is None and len(players) < 2:
        raise ValueError(f"{game} takes at least 2 players, got {len(players)}")


async def say(model, player: dict, prompt, *, max_tokens: int, temperature: float | None = None,
              stop: Sequence[str] | None = None, **options):
    """One reply of ``player`` through the game's ``model`` handle (LLM or scripted alike), as the
    handle returns it (a :class:`~autocurricula.records.Generation` through the arena: its text, its
    prompt's and its sampled token ids). ``options``: more of ``generate``'s (``trainable=False``)."""
    kwargs: dict[str, Any] = {"max_tokens": int(max_tokens), **options}
    if temperature is not None:  # None: the arena's default temperature
        kwargs["temperature"] = float(temperature)
    if stop:
        kwargs["stop"] = list(stop)
    return await model.generate(player, prompt, **kwargs)


def text_of(reply) -> str:
    """The text of what ``generate`` returned (a Generation, or a plain string)."""
    text = getattr(reply, "text", reply)
    return text if isinstance(text, str) else str(text)


async def ask(model, player: dict, prompt, *, max_tokens: int, temperature: float | None = None,
              stop: Sequence[str] | None = None) -> str:
    """The text of one reply of ``player`` through the game's ``model`` handle (see :func:`say`)."""
    return text_of(await say(model, player, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop))


log = logging.getLogger(__name__)
_warned_templates: set[str] = set()


class Conversation:
    """One seat's growing conversation: each turn's prompt is the seat's previous prompt, its reply
    and the next message to it (``chat``: a system message, then user and assistant messages).

    Kept as token ids where it can be: when the reply came through the arena (a Generation with its
    ``prompt_ids`` and sampled ``token_ids``) and the game has the ``tokenizer`` ``play`` got, the next
    prompt is the last prompt's ids, the reply's sampled ids and the new message's, token for token.
    The reply is never decoded and encoded again, so the turns of a seat form one chain: the prefix
    cache serves all of the last turn, and a prefix-tree update reads each token once
    (docs/games.md, "Prompts that extend each other"). The message is joined as the chat template
    writes it: the template's text of the messages so far, then a placeholder reply and the
    message, minus the same without them. That holds only for a template that writes earlier
    messages the same way whatever follows them and opens an assistant message exactly as its
    generation prompt does; where a template does not (it re-renders history, or changes
    whitespace), and without token ids or a tokenizer (a test double, a seed-style game), the
    prompt is the text or the messages, as built here, and the arena encodes it afresh.

    An end-of-sequence token that closes the reply stays in the chain where the template writes
    that token next (ChatML's ``<|im_end|>``); elsewhere (plain text) it is left out."""

    _REPLY = "\x00autocurricula-reply\x00"  # stands in for the reply while the template writes the next message

    def __init__(self, instructions: str, first: str, chat: bool, tokenizer: Any = None):
        self.chat, self.tokenizer = chat, tokenizer
        self.text = f"{instructions}\n\n{first}"
        self.messages = [{"role": "system", "content": instructions}, {"role": "user", "content": first}]
        self.ids: list[int] | None = None  # the next prompt as token ids, once a reply brought them

    def prompt(self):
        """The next prompt: token ids where they are kept, else the text or (``chat``) the messages."""
        if self.ids is not None:
            return list(self.ids)
        return [dict(m) for m in self.messages] if self.chat else self.text

    def add(self, reply, message: str) -> None:
        """Append the seat's reply to its last prompt (what ``generate`` returned, or its text) and
        the next ``message`` to it."""
        text = text_of(reply).strip()
        before = self.messages
        self.text += f" {text}\n{message}"
        self.messages = before + [{"role": "assistant", "content": text}, {"role": "user", "content": message}]
        try:
            self.ids = self._extended(reply, before, message)
        except (AttributeError, TypeError, ValueError):  # a tokenizer without encode / decode: as before
            self.ids = None

    def _extended(self, reply, before: list[dict], message: str) -> list[int] | None:
        tok, prompt_ids = self.tokenizer, getattr(reply, "prompt_ids", None)
        if tok is None or not prompt_ids or (self.ids is not None and list(prompt_ids) != self.ids):
            return None
        written = [int(t) for t in (getattr(reply, "token_ids", None) or ())]
        if not written:  # a scripted player: its text
            written = list(tok.encode(text_of(reply), add_special_tokens=False))
        tail = self._tail(before, message, written)
        if tail is None:
            return None
        end = written[-1] if written and written[-1] in set(getattr(tok, "all_special_ids", ()) or ()) else None
        if end is not None:
            end_text = tok.decode([end])
            if end_text and tail.startswith(end_text):  # the template closes the reply with this very token
                tail = tail[len(end_text):]
            else:
                written = written[:-1]
        return [int(t) for t in prompt_ids] + written + list(tok.encode(tail, add_special_tokens=False))

    def _tail(self, before: list[dict], message: str, written: list[int]) -> str | None:
        """What follows the reply: the message on a line of its own, or the chat template's text
        between the reply and the next generation prompt (None where the template re-renders)."""
        if not self.chat:
            ended = self.tokenizer.decode(written, skip_special_tokens=True).endswith("\n")
            return message if ended else "\n" + message
        try:
            render = self.tokenizer.apply_chat_template
            now = render(before, add_generation_prompt=True, tokenize=False)
            then = [{"role": "assistant", "content": self._REPLY}, {"role": "user", "content": message}]
            later = render(before + then, add_generation_prompt=True, tokenize=False)
        except Exception:  # noqa: BLE001 - no template, or one that refuses these messages: as before
            return None
        if not (isinstance(now, str) and isinstance(later, str) and later.startswith(now + self._REPLY)):
            name = str(getattr(self.tokenizer, "name_or_path", "?"))
            if name not in _warned_templates:
                _warned_templates.add(name)
                log.warning("the chat template of %s writes earlier messages differently once more follow (or "
                            "opens an assistant message otherwise than its generation prompt): conversation "
                            "prompts go as messages, and their token ids do not extend each other", name)
            return None
        return later[len(now) + len(self._REPLY):]


class TurnGame:
    """A turn-based game state driven by replies: ``to_move`` (seat), ``prompt()`` for that seat,
    ``step(reply)`` (parses; an unparseable or illegal reply sets ``invalid_by`` and ends the game),
    ``outcome()`` (rewards of a game that ended normally)."""

    n_players = 2

    def __init__(self) -> None:
        self.done = False
        self.invalid_by: int | None = None
        self.to_move = 0

    def prompt(self) -> str:
        raise NotImplementedError

    def step(self, reply: str) -> None:
        raise NotImplementedError

    def outcome(self) -> list[float]:
        raise NotImplementedError

    def mark_invalid(self) -> None:
        self.invalid_by = self.to_move
        self.done = True

    def rewards(self, invalid_penalty=DEFAULT_INVALID_PENALTY) -> list[float]:
        if not self.done:
            raise RuntimeError("the game is not over")
        if self.invalid_by is not None:
            return invalid_rewards(self.n_players, [self.invalid_by], invalid_penalty)
        return [float(r) for r in self.outcome()]


ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
REASONING_INSTRUCTION = (f"Think it through first, then end your reply with your move inside answer tags, "
                         f"e.g. {ANSWER_OPEN}MOVE{ANSWER_CLOSE}. Only the answer counts.")
DIRECT_INSTRUCTION = "Reply with your move only."
# room for the answer tags on top of the move's own tokens (each tag is a few tokens in any BPE vocabulary)
ANSWER_TAG_TOKENS = 16
_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)(" + re.escape(ANSWER_CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class PromptStyle:
    """How a board game's turn speaks to the model.

    ``chat``: the game's rules go in a system message and the position in a user message, for the
    model's chat template (the arena applies it); else one plain-text prompt. ``reasoning``: the
    player may think first and must end with ``<answer>MOVE</answer>``; only the answer is parsed,
    a missing one (or a reply cut by the token budget) is an invalid move, and the whole reply,
    thinking included, is the turn's completion. ``thinking_tokens``: the token budget for the
    thinking, on top of the move's own ``max_tokens``. The default (neither) is the game's compact
    prompt as it is."""

    chat: bool = False
    reasoning: bool = False
    thinking_tokens: int = 256

    def __post_init__(self):
        if not isinstance(self.thinking_tokens, int) or self.thinking_tokens < 0:
            raise ValueError(f"thinking_tokens must be an int >= 0, got {self.thinking_tokens!r}")

    @property
    def plain(self) -> bool:
        return not (self.chat or self.reasoning)

    def prompt(self, rules: str, position: str):
        """The turn's prompt: ``position`` alone when plain, else with the rules and the reply format
        (chat messages with ``chat``)."""
        if self.plain:
            return position
        system = f"{rules}\n{REASONING_INSTRUCTION if self.reasoning else DIRECT_INSTRUCTION}"
        if self.chat:
            return [{"role": "system", "content": system}, {"role": "user", "content": position}]
        return f"{system}\n\n{position}"

    def max_tokens(self, max_tokens: int) -> int:
        """The reply's token budget: the move's, plus the thinking and the answer tags when reasoning."""
        return int(max_tokens) + (self.thinking_tokens + ANSWER_TAG_TOKENS if self.reasoning else 0)

    def stop(self, stop: Sequence[str] | None) -> list[str] | None:
        """Stop strings: the answer's closing tag ends a reasoning reply."""
        if not self.reasoning:
            return list(stop) if stop else None
        return [*(stop or ()), ANSWER_CLOSE]

    def answer(self, reply: str, finish_reason: str = "stop", scripted: bool = False) -> str | None:
        """The text the game parses: the whole reply, or with ``reasoning`` what the last
        ``<answer>`` holds (None when there is none, or when the budget cut the reply before its
        closing tag). A scripted player's reply without tags is its move as it is."""
        if not self.reasoning:
            return reply
        at = reply.rfind(ANSWER_OPEN)
        if at < 0:
            return reply if scripted else None
        m = _ANSWER_RE.match(reply, at)
        if not m.group(2) and finish_reason == "length":  # cut before the closing tag (the stop string)
            return None
        return m.group(1).strip()


PLAIN = PromptStyle()


def first_word(pattern: re.Pattern, text: str) -> str | None:
    """The first match of ``pattern``'s group 1 in ``text``, lower-cased (None without one): a
    game's first action word, which text appended later cannot change."""
    m = pattern.search(text)
    return None if m is None else m.group(1).lower()


def answer_moves(prompt: str, replies: list[str]) -> list[str]:
    """A game's legal ``replies`` as the prompt asks for them: inside answer tags when it asks for
    the reasoning format (so branch credit's forced moves parse as answers)."""
    if REASONING_INSTRUCTION in prompt:
        return [f"{ANSWER_OPEN}{r}{ANSWER_CLOSE}" for r in replies]
    return replies


async def drive(game: TurnGame, players, model, *, max_tokens: int, temperature: float | None = None,
                stop: Sequence[str] | None = None, style: PromptStyle = PLAIN, rules: str = "") -> TurnGame:
    """Play ``game`` out through ``model``; ``style`` and the game's ``rules`` shape each prompt."""
    if style.plain:
        while not game.done:
            reply = await ask(model, players[game.to_move], game.prompt(), max_tokens=max_tokens,
                              temperature=temperature, stop=stop)
            game.step(reply)
        return game
    kwargs: dict[str, Any] = {"max_tokens": style.max_tokens(max_tokens)}
    if temperature is not None:
        kwargs["temperature"] = float(temperature)
    if style.stop(stop):
        kwargs["stop"] = style.stop(stop)
    while not game.done:
        player = players[game.to_move]
        gen = await model.generate(player, style.prompt(rules, game.prompt()), **kwargs)
        text = gen if isinstance(gen, str) else gen.text
        finish = gen.finish_reason if isinstance(gen, Generation) else "stop"
        move = style.answer(text, finish, scripted=is_scripted(player))
        if move is None:
            game.mark_invalid()
        else:
            game.step(move)
    return game


class GameOptions:
    """A game module played with fixed options, as a Game object (``autocurricula.arena.game.Game``):
    ``GameOptions(tictactoe, chat=True, reasoning=True)`` keeps the module's name and ``moves``,
    which a ``functools.partial`` of its ``play`` loses. Each game module's ``with_options``
    builds one."""

    def __init__(self, module: ModuleType, **options):
        self.module, self.options = module, dict(options)
        self.NUM_PLAYERS, self.ZERO_SUM = module.NUM_PLAYERS, module.ZERO_SUM
        self.__module__ = module.__name__  # the game's name (autocurricula.arena.game.game_name)
        self.__name__ = module.__name__.rsplit(".", 1)[-1]

    async def play(self, players: list[dict], model, tokenizer=None, **options):
        return await self.module.play(players, model, tokenizer, **{**self.options, **options})

    def random_policy(self, prompt: str, rng: Any = None) -> str:
        return self.module.random_policy(prompt, rng)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"GameOptions({self.__name__}, {opts})"


class MovesGameOptions(GameOptions):
    """:class:`GameOptions` of a game that lists its legal replies (``moves``)."""

    def moves(self, prompt: str) -> list[str]:
        return self.module.moves(prompt)


def with_options(module: ModuleType, **options) -> GameOptions:
    """``module`` (a game module) played with ``options`` as a Game object."""
    return (MovesGameOptions if isinstance(module, ListsMoves) else GameOptions)(module, **options)


def drive_sync(game: TurnGame, policies: Sequence[Callable], rng: Any = None) -> TurnGame:
    """Play ``game`` out with scripted policies, without any model (fast evaluation and tests)."""
    while not game.done:
        game.step(call_scripted(policies[game.to_move], game.prompt(), rng))
    return game
