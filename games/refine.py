"""Refine: a generator drafts, a critic critiques, the generator revises, ``rounds`` times; a judge
scores the final text.

Players: ``[generator, critic]``. A task comes from ``tasks`` (a built-in list of short writing
tasks by default), drawn from the game's seed. The critic is trained with the generator
(``critic_trainable=True``) or kept fixed (``False``: its calls are never turns, whoever sits in
the seat). The judge is ``judge=None`` (the base model), a player id or a player dict; it is never
trained. It answers with a score from 0 to 10.

Each seat's prompts are one growing conversation (:class:`~autocurricula.games._common.Conversation`):
a turn's prompt is that seat's previous prompt, its reply and the new message (with ``chat``, a
message list that grows the same way). Through the arena the prompts are token ids that extend each
other token for token, the reply as it was sampled. The writer sees its whole revision history, and
the engine's prefix cache serves the earlier part of every prompt from KV rows it already holds
(see docs/engine.md, "Prefix caching").

Rewards (cooperative): both players get the judge's score of the final text divided by 10, in
[0, 1]; 0 for both when the judge gives no number. An empty draft or revision makes the generator
the offender of ``invalid_penalty``; an empty critique makes the critic the offender. Not zero-sum.
"""

from __future__ import annotations

from typing import Any

from autocurricula.arena.arena import GameResult
from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, Conversation, check_penalty, check_players, choice,
                                         invalid_rewards, make_rng, say, text_of)
from autocurricula.games._tasks import prompt, score
from autocurricula.records import GameFacts

__all__ = ["FACTS", "NUM_PLAYERS", "TASKS", "ZERO_SUM", "play", "random_policy"]

NUM_PLAYERS = 2
ZERO_SUM = False
# cooperative: both get the judge's score / 10; a random task
FACTS = GameFacts(2, "identical", "perfect", "sequential", chance=True, payoff_range=(0.0, 1.0))
TASKS = ["Write one sentence about the sea.", "Describe a cat in one sentence.", "Write a one-line slogan for a bakery.",
         "Explain rain to a child in one sentence.", "Write a one-sentence thank-you note to a teacher."]
WRITER = "You are a careful writer. Reply with the text only."
CRITIC = "You are a critic. Name the single most important improvement to the text, in one sentence."
JUDGE = "You are a strict judge of writing. Score the text from 0 (bad) to 10 (excellent). Reply with the number."


def random_policy(prompt_text: Any, rng: Any = None) -> str:
    """Scripted player for both seats: a canned text or critique."""
    return choice(rng, ["The waves roll in under a grey sky.", "Make it shorter.", "Use a concrete image.",
                        "A small cat naps in the warm sun.", "Fresh bread, every morning."])


async def play(players: list[dict], model, tokenizer=None, *, tasks=None, rounds: int = 1, judge=None,
               critic_trainable: bool = True, chat: bool = False, max_tokens: int = 40,
               temperature: float | None = None, invalid_penalty=DEFAULT_INVALID_PENALTY, seed: int | None = None,
               rng: Any = None) -> GameResult:
    """Draft, then ``rounds`` of critique and revision, then the judge's score; see the module docstring."""
    check_players(players, 2, "refine")
    penalty = check_penalty(invalid_penalty)
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    rng = make_rng(seed if seed is not None else getattr(model, "seed", None), rng)
    task = choice(rng, tasks or TASKS)
    generator, critic = players
    opts = dict(max_tokens=max_tokens, temperature=temperature, stop=("\n",))
    writer = Conversation(WRITER, f"Task: {task}\nText:", chat, tokenizer)
    draft = await say(model, generator, writer.prompt(), **opts)
    text = text_of(draft)
    history, reviewer, critique = [], None, None
    for _ in range(rounds):
        if not text.strip():
            return GameResult(invalid_rewards(2, [0], penalty), {"task": task, "history": history})
        history.append(text.strip())
        if reviewer is None:
            reviewer = Conversation(CRITIC, f"Task: {task}\nText: {text.strip()}\nImprovement:", chat, tokenizer)
        else:
            reviewer.add(critique, f"Text: {text.strip()}\nImprovement:")
        # a fixed critic (critic_trainable=False): its calls never become turns
        critique = await say(model, critic, reviewer.prompt(), **opts,
                             **({} if critic_trainable else {"trainable": False}))
        note = text_of(critique)
        if not note.strip():
            return GameResult(invalid_rewards(2, [1], penalty), {"task": task, "history": history})
        writer.add(draft, f"Critique: {note.strip()}\nRevised text:")
        draft = await say(model, generator, writer.prompt(), **opts)
        text = text_of(draft)
    if not text.strip():
        return GameResult(invalid_rewards(2, [0], penalty), {"task": task, "history": history})
    history.append(text.strip())
    reply = await model.judge(prompt(JUDGE, f"Task: {task}\nText: {text.strip()}\nScore:", chat), player=judge,
                              max_tokens=3, temperature=0.0)
    value = score(getattr(reply, "text", str(reply)))
    reward = 0.0 if value is None else value / 10
    return GameResult([reward, reward], {"task": task, "history": history, "score": value})
