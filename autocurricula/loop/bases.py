"""Base models to train from: the examples' tiny model, and a format warm-up on a game's legal moves.

A random tiny model does not know that a matrix game's prompt wants one of its words, or a poker
prompt one action; reinforcement learning from there mostly learns the penalty for unparseable
replies. :func:`format_warmup` fully fine-tunes a base on ``(prompt, reply)`` pairs of the game
itself: its own ``warmup_examples(n, seed)`` where it has them (tic-tac-toe, Kuhn and Leduc poker,
matrix games), otherwise the prompts that random play reaches, each answered with a uniformly
drawn legal move (``moves(prompt)``) or the game's random player. That teaches the format and
legality, not strategy. Both the tiny base (:func:`tiny_base`) and the warmed model are cached by
their arguments under :data:`CACHE` (``$AUTOCURRICULA_CACHE``, default ``~/.cache/autocurricula``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
from pathlib import Path
from types import SimpleNamespace

from autocurricula.arena.game import as_play, game_moves
from autocurricula.records import call_scripted

__all__ = ["CACHE", "cache_dir", "format_warmup", "is_tiny", "tiny_base", "warmup_examples"]

def cache_dir() -> Path:
    """Where the tiny bases and warm-ups are cached: ``$AUTOCURRICULA_CACHE`` (read now), default
    ``~/.cache/autocurricula``."""
    return Path(os.environ.get("AUTOCURRICULA_CACHE", Path.home() / ".cache" / "autocurricula"))


CACHE = cache_dir()  # as the process started (the examples' folders)
TINY_HEADS = 32  # many small heads read a board far faster per step than 4 (research/README.md)


def tiny_base(hidden: int = 128, layers: int = 2, heads: int = TINY_HEADS, seed: int = 0,
              cache: str | Path | None = None) -> Path:
    """The examples' tiny llama (random weights, no download; intermediate size twice the hidden),
    cached by its arguments, one folder per seed: ``tiny-h128-l2-a32`` (seed 0), ``...-s1``."""
    from autocurricula.engine.tiny import build_tiny_model

    name = f"tiny-h{hidden}-l{layers}-a{heads}" + (f"-s{seed}" if seed else "")
    return build_tiny_model(Path(cache or cache_dir()) / name, hidden_size=hidden, num_layers=layers, num_heads=heads,
                            intermediate_size=2 * hidden, seed=seed)


def is_tiny(model) -> bool:
    """Whether ``model`` is a folder holding one of the built-in tiny models (or a warm-up of one)."""
    from autocurricula.engine.tiny import MARKER

    try:
        return (Path(str(model)) / MARKER).is_file()
    except (OSError, TypeError, ValueError):
        return False


class _RandomPlay:
    """The ``model`` handle of a game played by scripted players only: each reply is a uniformly drawn
    legal move where the game lists them, else the game's random player; every (prompt, reply) is kept."""

    def __init__(self, game, seed: int):
        self.rng = random.Random(seed)
        self.seed = seed
        self.moves = game_moves(game)
        self.random_policy = getattr(game, "random_policy", None)
        self.seen: list[tuple[str, str]] = []

    def reply(self, prompt) -> str:
        if isinstance(prompt, str) and self.moves is not None:
            legal = self.moves(prompt)
            if legal:
                return self.rng.choice(legal)
        return call_scripted(self.random_policy, prompt, self.rng)

    async def generate(self, player, prompt, **sampling):
        text = self.reply(prompt)
        if isinstance(prompt, str):
            self.seen.append((prompt, text))
        return SimpleNamespace(text=text, token_ids=[], logprobs=[], finish_reason="stop")

    async def judge(self, prompt, *, player=None, **sampling):
        return SimpleNamespace(text="", token_ids=[], logprobs=[], finish_reason="stop")

    async def play(self, sub_play, players, *, group=None, trainable=True, name=None, **kwargs):
        from autocurricula.arena.arena import GameResult, game_result

        rewards, extras = game_result(await sub_play(players, self, None, **kwargs), len(players))
        return GameResult(rewards, extras)


def warmup_examples(game, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (prompt, reply) pairs of ``game``: its own ``warmup_examples(n, seed)`` when it has them,
    else the prompts of random games (each seat a random player; at most 400 games' worth), each
    answered by a uniformly drawn legal move, or the game's random player where it lists none."""
    own = getattr(game, "warmup_examples", None)
    if callable(own):
        return list(own(n, seed))
    if getattr(game, "random_policy", None) is None and game_moves(game) is None:
        raise ValueError(f"{game!r} has neither warmup_examples, moves nor random_policy: give sft_warmup your own "
                         "(prompt, reply) pairs")
    play = as_play(game)
    n_players = getattr(game, "NUM_PLAYERS", None) or 2
    pool: list[tuple[str, str]] = []
    for g in range(400):
        handle = _RandomPlay(game, seed * 100_003 + g)
        players = [{"id": f"random-{s}", "policy": handle.reply, "seat": s} for s in range(n_players)]
        out = play(players, handle, None, seed=handle.seed) if _takes_seed(play) else play(players, handle, None)
        if asyncio.iscoroutine(out):
            asyncio.run(out)
        pool += handle.seen
        if len(pool) >= n:
            break
    if not pool:
        raise ValueError(f"random play of {game!r} asked for nothing: no examples to warm up on")
    rng = random.Random(seed)
    return [pool[i] for i in (rng.randrange(len(pool)) for _ in range(n))] if len(pool) > n else pool


def _takes_seed(play) -> bool:
    import inspect

    try:
        params = inspect.signature(play).parameters
    except (TypeError, ValueError):
        return False
    return "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def format_warmup(base: str | Path, game, *, steps: int = 200, learning_rate: float = 2e-3, examples: int = 20_000,
                  batch_size: int = 64, seed: int = 0, out: str | Path | None = None, progress: bool = False) -> Path:
    """``base`` after a supervised warm-up of ``steps`` full fine-tuning steps on ``examples``
    (prompt, reply) pairs of ``game`` (:func:`warmup_examples`): the format and its legal moves, no
    strategy. Cached (``out``, default a folder under :data:`CACHE` named by the base, the game and
    a digest of the examples); returns the folder, which loads as any model does."""
    from autocurricula.training.warmup import sft_warmup  # mlx

    pairs = warmup_examples(game, examples, seed)
    digest = hashlib.sha256(json.dumps(pairs[:2000]).encode()).hexdigest()[:10]
    name = getattr(game, "name", None) or getattr(game, "__name__", type(game).__name__)
    label = "".join(c if c.isalnum() or c in "-_." else "-" for c in str(name).rsplit(".", 1)[-1])[:40]
    target = Path(out) if out is not None else cache_dir() / f"{Path(str(base)).name}-{label}-warm{steps}-{digest}"
    return sft_warmup(base, target, pairs, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                      seed=seed, progress=progress)
