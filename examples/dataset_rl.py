"""Dataset RL on local arithmetic: held-out accuracy before and after GRPO.

    python examples/dataset_rl.py

Problems are ``a+b=`` with a, b in 0..19 (400 of them, built locally); 80 are held out. The tiny
random model first gets a short supervised warm-up on the *format*: every prompt answered by a
number near the sum (within +-2, right only by chance), so that its replies parse. Then one learner
trains with GRPO on ``autocurricula.games.dataset`` over the other 320: ``--generations``
completions per prompt form one group, and a completion's reward is 1 if it is exactly right.
The figures, before and after: on the held-out problems, greedy exact match and the probability of
a right answer (16 samples each at temperature 1); greedy exact match on the training problems.
Offline, under 2 minutes on 2 CPU cores.
"""

import argparse
import functools
import json
import os
import random
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import AutocurriculumTrainer, GRPOConfig, SelfPlayConfig, build_tiny_model
from autocurricula.engine import Engine, LoraSpec, SamplingParams
from autocurricula.games import dataset
from autocurricula.training.warmup import sft_warmup

CACHE = Path(os.environ.get("AUTOCURRICULA_CACHE", Path.home() / ".cache" / "autocurricula"))

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--rounds", type=int, default=200)
parser.add_argument("--prompts", type=int, default=16, help="prompts (games) per round")
parser.add_argument("--generations", type=int, default=8, help="completions per prompt: one GRPO group")
parser.add_argument("--max-operand", type=int, default=19, help="problems are a+b with a, b in 0..this")
parser.add_argument("--held-out", type=int, default=80, help="problems kept out of training, for the figure")
parser.add_argument("--warmup-steps", type=int, default=300)
parser.add_argument("--warmup-spread", type=int, default=2, help="warm-up answers are the sum +- up to this")
parser.add_argument("--warmup-on", default="all", choices=["all", "train"], help="prompts of the format "
                    "warm-up: all (held-out ones too; their answers are only near the sum) or the training ones")
parser.add_argument("--learning-rate", type=float, default=5e-4)
parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient to the warm base")
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--heads", type=int, default=32)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--output-dir", default="runs/dataset-rl")
args = parser.parse_args()
t0 = time.time()

# every a+b with a, b in 0..9; a fixed share held out
problems = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(args.max_operand + 1)
            for b in range(args.max_operand + 1)]
random.Random(args.seed).shuffle(problems)
held_out, train = problems[:args.held_out], problems[args.held_out:]

# format warm-up: answers near the sum (right only by chance), so replies are numbers
rng = random.Random(args.seed)
examples = [(p["prompt"], str(max(0, int(p["answer"]) + rng.randint(-args.warmup_spread, args.warmup_spread))))
            for p in (problems if args.warmup_on == "all" else train) for _ in range(20)]
seed_tag = f"-s{args.seed}" if args.seed else ""  # one cached base per seed
base = build_tiny_model(CACHE / f"tiny-h{args.hidden}-l{args.layers}-a{args.heads}{seed_tag}", hidden_size=args.hidden,
                        num_layers=args.layers, num_heads=args.heads, intermediate_size=2 * args.hidden, seed=args.seed)
warm = sft_warmup(base, CACHE / f"{base.name}-sum{args.max_operand}-warm{args.warmup_steps}-s{args.warmup_spread}-{args.warmup_on}", examples,
                  steps=args.warmup_steps, batch_size=64, learning_rate=1e-3, seed=args.seed)
engine = Engine(str(warm), name="tiny-sum")


def accuracy(player, rows, samples=0):
    """Exact-match accuracy on ``rows`` (``player=None``: the warm base): greedy, or with ``samples``
    the mean over that many samples at temperature 1 (the probability of a right answer)."""
    params = [SamplingParams(max_tokens=4, temperature=1.0 if samples else 0.0, stop=["\n"], seed=args.seed + i)
              for i in range(max(1, samples))]
    futures = [(engine.submit(engine.encode(p["prompt"]), player, sp), p) for p in rows for sp in params]
    return round(sum(dataset.exact_answer(f.result().text, p["answer"]) for f, p in futures) / len(futures), 3)


def figures(player):
    return {"held_out_greedy": accuracy(player, held_out), "held_out_sampled": accuracy(player, held_out, 16),
            "train_greedy": accuracy(player, train)}


class Solo(AutocurriculumTrainer):
    """One learner on its own: ``--prompts`` one-player games a round."""

    config_class = SelfPlayConfig

    def match(self):
        return [(self.players[0],)] * self.config.rules.games_per_round


before = figures(None)
print(json.dumps({"before": before}), flush=True)
config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds, rules={"games_per_round": args.prompts}, credit="grpo",
                        output_dir=args.output_dir, overwrite_output_dir=True, seed=args.seed, max_tokens=4,
                        ratings={"bt_bootstrap": 0}, progress=False, logging_steps=10)
trainer = Solo(config)
play = functools.partial(dataset.play, dataset=train, num_generations=args.generations, max_tokens=4)
play.__module__ = dataset.__name__
trainer.train(engine, play, lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
              grpo_config=GRPOConfig(learning_rate=args.learning_rate, temperature=1.0, loss_type="grpo",
                                     beta=args.beta))
train_reward = [round(r["rollout/reward_mean"], 3) for r in trainer.metrics_log if "rollout/reward_mean" in r]
after = figures(trainer.players[0]["id"])
engine.close()
print(json.dumps({"before": before, "after": after, "held_out": len(held_out), "rounds": args.rounds * args.epochs,
                  "train_reward_first_last": [train_reward[0], train_reward[-1]] if train_reward else None,
                  "minutes": round((time.time() - t0) / 60, 2)}))
