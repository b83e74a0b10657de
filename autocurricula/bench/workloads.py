"""The round workloads the benches play: tic-tac-toe league pairings, Kuhn poker, negotiation as
chat, and a dataset GRPO round, on the bench model with legal moves read in place of its own.

``bench round`` plays :func:`schedule`'s pairings; ``bench train --workload`` and ``bench peers
--workload`` play one round of :data:`WORKLOADS` (:func:`play_round`) and measure its update.
"""

from __future__ import annotations

import dataclasses
import random

LEARNERS = ("main", "main_exploiter", "league_exploiter")
# one round's 64 games as (X, O) before seats alternate, the example's roles with both anchors: the main agent against
# the scripted players, itself and the exploiters; the exploiters against the main agent; the
# league exploiter also against the scripted players
PAIRINGS = ((("main", "random"), 8), (("main", "minimax"), 8), (("main", "main"), 8),
            (("main", "main_exploiter"), 4), (("main", "league_exploiter"), 4), (("main_exploiter", "main"), 16),
            (("league_exploiter", "main"), 8), (("league_exploiter", "random"), 4),
            (("league_exploiter", "minimax"), 4))

def schedule(games: int) -> list[tuple[str, str]]:
    """The (X, O) player ids of a round's ``games`` games: :data:`PAIRINGS` in a fixed shuffled
    order (so a smaller round keeps a mix), seats swapped every other game."""
    pairs = [p for p, n in PAIRINGS for _ in range(n)]
    random.Random(0).shuffle(pairs)
    return [(pairs[i % len(pairs)] if i % 2 == 0 else pairs[i % len(pairs)][::-1]) for i in range(games)]


# per workload: the game and its options, games per round by default, and what it stands for
WORKLOADS = {
    "tictactoe": ("tictactoe", {"opening_moves": (0, 4)}, 64,
                  "the tic-tac-toe league round (bench round's pairings, 0-4 opening moves, plain prompts)"),
    "kuhn": ("kuhn_poker", {}, 64, "a Kuhn poker round (the same pairings, plain prompts)"),
    "negotiation": ("negotiation", {"chat": True}, 32, "a negotiation round played as chat (the same pairings)"),
    "dataset": ("dataset", {"num_generations": 8}, 16,
                "a dataset GRPO round: one learner, G = 8 completions of each arithmetic prompt"),
}


class LegalMoves:
    """The game handle a workload's games get: a learner's reply is sampled by the bench model and
    recorded as its turn as usual, then the game reads a legal move (its random policy's) in its
    place. The untrained bench model's own moves are nearly all invalid and would end every game at
    its first turn, leaving no round to measure; this keeps the games' length and the model's tokens."""

    def __init__(self, handle, module):
        self._handle, self._module = handle, module
        self._rng = random.Random(handle.seed)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    async def generate(self, player, prompt, **sampling):
        from autocurricula.records import is_scripted

        gen = await self._handle.generate(player, prompt, **sampling)
        if is_scripted(player) or not sampling.get("trainable", True):
            return gen
        shown = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt) \
            if prompt and isinstance(prompt[0], dict) else self._handle.arena.engine.decode(gen.prompt_ids)
        return dataclasses.replace(gen, text=self._module.random_policy(shown, self._rng))


def workload_games(workload: str, games: int, seed: int):
    """The arena's games of one round of ``workload``: (play, players, record, name) tuples."""
    import functools
    import importlib

    from autocurricula.records import GameRecord

    name, options, _, _ = WORKLOADS[workload]
    module = importlib.import_module(f"autocurricula.games.{name}")
    if workload == "dataset":
        from autocurricula.games.dataset import arithmetic_dataset

        play = functools.partial(module.play, dataset=arithmetic_dataset(512, seed=0), **options)
        return [(play, [{"id": "main"}], GameRecord(f"r{seed}-g{i}", [{"id": "main"}]), name) for i in range(games)]

    async def play(players, model, tokenizer=None):
        return await module.play(players, LegalMoves(model, module), tokenizer, **options)

    anchors = {"random": module.random_policy,
               "minimax": getattr(module, "minimax_policy", module.random_policy)}  # tic-tac-toe has one
    who = {n: {"id": n} for n in LEARNERS} | {n: {"id": n, "role": n, "policy": p} for n, p in anchors.items()}
    return [(play, [who[a], who[b]], GameRecord(f"r{seed}-g{i}", [who[a], who[b]]), name)
            for i, (a, b) in enumerate(schedule(games))]


def play_round(engine, workload: str, games: int, seed: int) -> list:
    """The turns of one round of ``workload`` (``games`` games, seeded) played on ``engine``, whose
    players must include :data:`LEARNERS`."""
    from autocurricula.arena.arena import Arena, run_async

    records = run_async(Arena(engine, seed=seed, temperature=1.0).run(workload_games(workload, games, seed),
                                                                      max_concurrent=128))
    failed = [r for r in records if r.error]
    if failed:
        raise RuntimeError(f"bench: game {failed[0].game_id} of {workload} failed: {failed[0].error}\n"
                           f"{failed[0].traceback}")
    return [t for r in records for t in r.turns]
