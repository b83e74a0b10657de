"""The multi-turn workload of ``autocurricula bench peers --workload multiturn``.

A round is a set of two-seat conversations (a debate's transcript, a negotiation's history):
turn ``k`` of a conversation is spoken by ``players[k % 2]`` and its prompt is turn ``k - 1``'s
prompt, that turn's completion and a new message (the next speaker's header). Turn ``k`` needs
turn ``k - 1``'s completion, so every side plays the round turn level by turn level: turn ``k`` of
all conversations in one batch, then turn ``k + 1``. Completions are greedy, so sides that agree
on their tokens see the same prompts and do the same work.

Pure Python with no ``autocurricula`` import: the vLLM worker, in vLLM's own virtual environment,
loads this file by path (as it loads ``peers_torch``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# generate(prompts, players) -> (completions, prompt tokens served from a prefix cache or None)
Generate = Callable[[list[list[int]], list[str]], tuple[list[list[int]], int | None]]


def play(conversations: list[dict], generate: Generate) -> dict:
    """Every conversation of one round, in turn levels; each side's own completions extend its prompts.

    ``conversations``: ``{"players": [a, b], "opening": ids, "messages": [ids per turn after the
    first]}``, all of one shape. Returns the round's wall ``seconds``, completion ``tokens``, per turn
    level ``prompt_tokens`` and ``hit_tokens`` (None where the side has no prefix cache) and the
    ``completions`` (per conversation, per turn)."""
    turns = len(conversations[0]["messages"]) + 1
    prompts = [list(c["opening"]) for c in conversations]
    completions: list[list[list[int]]] = [[] for _ in conversations]
    levels = []
    t0 = time.perf_counter()
    for k in range(turns):
        if k:
            prompts = [p + done[-1] + c["messages"][k - 1] for p, done, c in zip(prompts, completions, conversations)]
        outs, hits = generate(prompts, [c["players"][k % 2] for c in conversations])
        for done, out in zip(completions, outs):
            done.append(list(out))
        levels.append({"prompt_tokens": sum(len(p) for p in prompts), "hit_tokens": hits})
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": sum(len(t) for c in completions for t in c), "levels": levels,
            "completions": completions}


def longest(conversations: list[dict], new_tokens: int) -> int:
    """Tokens of the last turn's prompt and completion (every conversation has the same length)."""
    c = conversations[0]
    return len(c["opening"]) + sum(len(m) for m in c["messages"]) + (len(c["messages"]) + 1) * new_tokens


def hit_rates(levels: list[dict]) -> dict:
    """Share of prompt tokens served from a prefix cache: over all turns (``all``), over the first
    turn and over turns 2 and later; None where the side counts no hits."""
    def rate(ls):
        if not ls or any(x["hit_tokens"] is None for x in ls):
            return None
        return sum(x["hit_tokens"] for x in ls) / max(1, sum(x["prompt_tokens"] for x in ls))

    return {"all": rate(levels), "first": rate(levels[:1]), "later": rate(levels[1:])}


def agreement(ours: list[list[list[int]]], theirs: list[list[list[int]]]) -> dict:
    """Turns whose greedy completions are equal: all of them, and the first turns alone (whose
    prompts are the same on both sides by construction; a later turn also differs when an
    earlier completion of its conversation did)."""
    pairs = [(a, b) for ca, cb in zip(ours, theirs) for a, b in zip(ca, cb)]
    firsts = [(ca[0], cb[0]) for ca, cb in zip(ours, theirs)]
    return {"equal": sum(a == b for a, b in pairs), "rows": len(pairs),
            "first_equal": sum(a == b for a, b in firsts), "first_rows": len(firsts)}
