"""The seed README's fictitious-GAN autocurriculum, its classes verbatim: a custom league is a
subclass that overrides ``entry`` and ``match`` and reads ``self.players``.

Each epoch adds a new generator and a new discriminator; the latest of each plays every past
player of the other kind. The game here: the generator writes a short string; the discriminator
sees either it or a real sample and says "real" or "fake". Runs offline on the tiny model:
    python examples/fictitious_gan.py
"""

import random

from autocurricula import AutocurriculumConfig, AutocurriculumTrainer, build_tiny_model

REAL = ["X wins", "O wins", "draw", "X plays 5", "O plays 1"]


class FictitiousGANConfig(AutocurriculumConfig):
    def __init__(self, epoch: int = 4, rounds: int = 2):
        super().__init__(epoch, rounds)


class FictitiousGANTrainer(AutocurriculumTrainer):
    def __init__(self, ac_config = FictitiousGANConfig()):
        assert isinstance(ac_config, FictitiousGANConfig)
        super().__init__(ac_config)

    def entry(self):
        # We get one new G and one new D each epoch.
        return [
            {"role": "generator"},
            {"role": "discriminator"},
        ]

    def match(self):
        gs = [e for e in self.players if e["role"] == "generator"]
        # The "epoch" field gets automatically populated at entry.
        latest_g = sorted(gs, key=lambda x: x["epoch"])[-1]

        ds = [e for e in self.players if e["role"] == "discriminator"]
        latest_d = sorted(ds, key=lambda x: x["epoch"])[-1]

        # Every round, latest players play all compatible past players.
        return [(latest_g, d) for d in ds] + [(latest_d, g) for g in gs]


async def play(players, model, tokenizer):
    """Zero-sum: the discriminator wins (+1) when it labels the sample right, else the generator."""
    g = next(p for p in players if p["role"] == "generator")
    d = next(p for p in players if p["role"] == "discriminator")
    fake = (await model.generate(g, "Write a game result:", max_tokens=4)).text.strip()
    rng = random.Random(f"{players[0]['id']}|{players[1]['id']}|{fake}")
    shown_real = rng.random() < 0.5
    sample = rng.choice(REAL) if shown_real else fake
    verdict = (await model.generate(d, f"Is this real or fake? {sample}\nanswer:", max_tokens=3)).text.lower()
    r_d = 1.0 if ("real" in verdict) == shown_real else -1.0
    return [-r_d, r_d] if players[0] is g else [r_d, -r_d]


if __name__ == "__main__":
    base = build_tiny_model("/tmp/autocurricula-examples/tiny-llama")
    trainer = FictitiousGANTrainer()
    trainer.config.output_dir = "/tmp/autocurricula-examples/fictitious-gan"
    trainer.config.overwrite_output_dir = True  # a rerun replaces the previous one
    trainer.train(str(base), play)
    print(trainer.leaderboard)
    print([p["id"] for p in trainer.players])
