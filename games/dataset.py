"""Dataset RL: one player answers prompts of a ``datasets.Dataset``; a reward function scores them.

Each game takes one row (drawn from the game's seed, or ``row=``) and asks the player for
``num_generations`` completions of its prompt. Each completion is a nested game of its own
(``model.play``) whose reward is that completion's score, and the completions of one prompt are
siblings: they form one GRPO group, as trl's ``GRPOTrainer`` groups ``num_generations`` completions
of a prompt.

Rewards: ``reward_fn`` scores a completion, with trl's reward-function signature: either
``reward_fn(completion, **columns)`` -> float, or trl's batched ``reward_fn(completions, prompts=...,
**columns)`` -> list of floats (chosen by the name of its first parameter). ``columns`` are the
row's other columns (e.g. ``answer``). The default, :func:`exact_answer`, gives 1.0 when the first
integer in the completion equals the row's ``answer`` and 0.0 otherwise. A completion that is empty
after stripping gets ``invalid_penalty[0]`` instead. The game's own reward (one player) is the mean
over the completions. Not zero-sum.

The prompt column holds plain text or a list of chat messages (trl's conversational format); both
go to ``model.generate`` as they are, so a chat template applies where the model has one.
:func:`arithmetic_dataset` builds a small arithmetic dataset locally (no download).
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from typing import Any

from autocurricula.games._common import DEFAULT_INVALID_PENALTY, ask, check_penalty, check_players, make_rng
from autocurricula.records import GameFacts

__all__ = ["FACTS", "NUM_PLAYERS", "ZERO_SUM", "arithmetic_dataset", "exact_answer", "first_int", "play", "random_policy",
           "score_completions"]

NUM_PLAYERS = 1
ZERO_SUM = False
# one player; its reward function decides the range (the default scores 0 or 1)
FACTS = GameFacts(1, "general_sum", "perfect", "sequential", chance=True)
INT = re.compile(r"-?\d+")


def first_int(text: str) -> int | None:
    m = INT.search(text)
    return int(m.group()) if m else None


def exact_answer(completion: str, answer=None, **_columns) -> float:
    """1.0 when the completion's first integer equals ``answer``, else 0.0."""
    got = first_int(completion if isinstance(completion, str) else str(completion))
    return float(got is not None and answer is not None and str(got) == str(answer).strip())


def arithmetic_dataset(n: int = 512, seed: int = 0, *, max_operand: int = 9, ops: str = "+-"):
    """``n`` rows ``{"prompt": "3+4=", "answer": "7"}`` built locally (a ``datasets.Dataset`` when
    ``datasets`` is installed, else a list of dicts, which the game accepts too)."""
    rng = make_rng(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(a + b if op == "+" else a - b if op == "-" else a * b)})
    try:
        from datasets import Dataset
    except ImportError:
        return rows
    return Dataset.from_list(rows)


def score_completions(reward_fn: Callable, completions: list[str], prompt, columns: dict) -> list[float]:
    """Scores of ``completions`` of one row, for either reward-function signature (module docstring)."""
    params = list(inspect.signature(reward_fn).parameters)
    if params and params[0] == "completions":  # trl's batched form: one list per column
        out = reward_fn(completions, prompts=[prompt] * len(completions),
                        **{k: [v] * len(completions) for k, v in columns.items()})
    else:
        out = [reward_fn(c, **columns) for c in completions]
    scores = [float(x) for x in out]
    if len(scores) != len(completions):
        raise ValueError(f"reward_fn returned {len(scores)} scores for {len(completions)} completions")
    return scores


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player: a random small integer."""
    rng = make_rng(rng=rng)
    return str(rng.randint(-9, 18))


async def _one(players, model, tokenizer=None, *, prompt, score: Callable[[str], float], max_tokens: int,
               temperature, stop, invalid_penalty):
    text = await ask(model, players[0], prompt, max_tokens=max_tokens, temperature=temperature, stop=stop)
    return [invalid_penalty[0] if not text.strip() else score(text)]


async def play(players: list[dict], model, tokenizer=None, *, dataset=None, reward_fn: Callable = exact_answer,
               prompt_column: str = "prompt", num_generations: int = 4, row: int | None = None,
               max_tokens: int = 6, temperature: float | None = None, stop=("\n",),
               invalid_penalty=DEFAULT_INVALID_PENALTY, seed: int | None = None, rng: Any = None) -> list[float]:
    """One prompt, ``num_generations`` completions (siblings in one GRPO group); returns the
    player's mean reward. ``dataset``: rows with ``prompt_column`` (default: the local arithmetic
    set); ``row``: a fixed row index (default: drawn from ``seed``)."""
    check_players(players, 1, "dataset RL")
    penalty = check_penalty(invalid_penalty)
    if num_generations < 1:
        raise ValueError(f"num_generations must be at least 1, got {num_generations}")
    data = dataset if dataset is not None else _default_dataset()
    if len(data) == 0:
        raise ValueError("the dataset is empty; give rows with a prompt column")
    rng = make_rng(seed if seed is not None else getattr(model, "seed", None), rng)
    index = rng.randrange(len(data)) if row is None else int(row)
    item = dict(data[index])
    if prompt_column not in item:
        raise ValueError(f"the dataset has no column {prompt_column!r} (columns: {sorted(item)}); set prompt_column")
    prompt = item.pop(prompt_column)

    def score(text: str) -> float:
        return score_completions(reward_fn, [text], prompt, item)[0]

    results = await asyncio.gather(*(  # issued together: the engine batches them
        model.play(_one, players, group=f"row:{index}", name="completion", prompt=prompt, score=score,
                   max_tokens=max_tokens, temperature=temperature, stop=stop, invalid_penalty=penalty)
        for _ in range(num_generations)))
    return [sum(r[0] for r in results) / len(results)]


_DEFAULT: list = []


def _default_dataset():
    if not _DEFAULT:
        _DEFAULT.append(arithmetic_dataset())
    return _DEFAULT[0]
