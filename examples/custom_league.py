"""A custom game and a custom league, top to bottom: rock-paper-scissors between two learners
and their frozen snapshots, on the built-in tiny model, offline.

    python examples/custom_league.py      # about a minute on a 2-core CPU

The game is an async ``play`` that returns one reward per player. The league is a subclass of
``AutocurriculumTrainer`` with ``entry`` (who joins each epoch) and ``match`` (who plays whom).
Rock-paper-scissors has no best move, only a best mixture (uniform), so a learner that settles
on one hand is beaten by the other; the printout shows each learner's hand frequencies.
"""

import collections

import autocurricula  # noqa: F401  (picks a fast BLAS before mlx loads)
from autocurricula import AutocurriculumConfig, AutocurriculumTrainer, build_tiny_model
from autocurricula.training.warmup import sft_warmup

PROMPT = "Rock, paper or scissors? Answer R, P or S:"
BEATS = {"R": "S", "P": "R", "S": "P"}


async def play(players, model, tokenizer):
    """Both players answer at once; an answer that is not R, P or S loses 1.5 (the other gets 0.5)."""
    hands = [(await model.generate(p, PROMPT, max_tokens=2)).text.strip()[:1] for p in players]
    a, b = hands
    if a not in BEATS or b not in BEATS:
        return [-1.5 if a not in BEATS else 0.5, -1.5 if b not in BEATS else 0.5]
    return [0.0, 0.0] if a == b else [1.0, -1.0] if BEATS[a] == b else [-1.0, 1.0]


class TwoPopulations(AutocurriculumTrainer):
    """Two learners; every epoch after the first, each adds a frozen snapshot of itself."""

    def learners(self):
        return [p for p in self.players if not p["frozen"]]

    def entry(self):
        if self.current_epoch == 0:
            return [{"role": "red"}, {"role": "blue"}]
        return [{"role": p["role"], "frozen": True, "parent": p["id"]} for p in self.learners()]

    def match(self):
        red, blue = self.learners()
        past = [p for p in self.players if p["frozen"]]
        games = [(red, blue), (blue, red)]  # the learners against each other, both seat orders
        for learner in (red, blue):  # and each against one past snapshot, drawn at random
            if past:
                games.append((learner, past[int(self.rng.integers(len(past)))]))
        return games


def hand_frequencies(trainer, player, n=200):
    """How often the player shows each hand, from ``n`` sampled answers."""
    counts = collections.Counter()
    for seed in range(n):
        counts[trainer.engine.generate(PROMPT, player["id"], max_tokens=2, seed=seed).text.strip()[:1]] += 1
    return {h: round(counts[h] / n, 2) for h in "RPS"}


if __name__ == "__main__":
    base = build_tiny_model("runs/custom-league/tiny", hidden_size=64, num_layers=2, num_heads=4,
                            intermediate_size=128)
    # One minute of supervised warm-up on uniformly random hands teaches the format, not a strategy.
    warm = sft_warmup(base, "runs/custom-league/warm", [(PROMPT, h) for h in "RPS" * 100], steps=60,
                      batch_size=32, learning_rate=3e-3)
    config = AutocurriculumConfig(epochs=4, rounds=4, matches=16, max_tokens=2, output_dir="runs/custom-league/run",
                                  overwrite_output_dir=True, progress=False, credit="rae")
    trainer = TwoPopulations(config)
    trainer.train(str(warm), play, grpo_config={"learning_rate": 1e-3, "beta": 0.0})
    print(trainer.leaderboard)
    for p in trainer.learners():
        print(p["id"], hand_frequencies(trainer, p))
    trainer.engine.close()
