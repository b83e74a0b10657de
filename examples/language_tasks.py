"""Debate, red/blue and refine in short self-play leagues on the tiny model, with the base model as
judge: they run end to end; the figure is each seat's mean reward per epoch (red/blue: seat 1 is the
defender, whose mean reward is 2 x its accuracy - 1; refine: both seats get the judge's score / 10).

    python examples/language_tasks.py

A random tiny model writes noise and its judge answers at random, so no trend is expected here:
the example shows the plumbing (nested sub-debates, judge calls that are never trained, fixed or
trained critics), not learning. A real run needs an instruction-tuned model (e.g.
``mlx-community/Qwen2.5-0.5B-Instruct-4bit`` or larger) with ``chat=True``, a judge that is
stronger than or frozen apart from the debaters, and many more games. Offline, about a minute or
two on 2 CPU cores.
"""

import argparse
import functools
import json
import os
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import SelfPlayConfig, SelfPlayTrainer, build_tiny_model
from autocurricula.engine import Engine
from autocurricula.games import debate, red_blue, refine

CACHE = Path(os.environ.get("AUTOCURRICULA_CACHE", Path.home() / ".cache" / "autocurricula"))

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--games-per-round", type=int, default=8)
parser.add_argument("--max-tokens", type=int, default=12)
parser.add_argument("--output-dir", default="runs/language-tasks")
args = parser.parse_args()
t0 = time.time()
engine = Engine(str(build_tiny_model(CACHE / "tiny-h128-l2-a32", hidden_size=128, num_layers=2, num_heads=32,
                                     intermediate_size=256)), name="tiny")

summary = {}
for name, mod, options in [("debate", debate, {}), ("red_blue", red_blue, {}),
                           ("refine", refine, {"critic_trainable": False})]:
    play = functools.partial(mod.play, max_tokens=args.max_tokens, **options)
    play.__module__ = mod.__name__
    config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds,
                            rules={"games_per_round": args.games_per_round, "past_share": 0.0}, credit="grpo",
                            output_dir=f"{args.output_dir}/{name}", overwrite_output_dir=True,
                            max_tokens=args.max_tokens, ratings={"bt_bootstrap": 0}, progress=False)
    trainer = SelfPlayTrainer(config)
    trainer.train(engine, play)
    per_epoch = {}  # seat -> epoch -> rewards (mirror self-play: the learner sits in both seats)
    for row in trainer.match_history:
        for seat, reward in enumerate(row["rewards"]):
            per_epoch.setdefault(seat, {}).setdefault(row["epoch"], []).append(reward)
    summary[name] = {f"seat{seat}_reward_by_epoch": [round(sum(v) / len(v), 3) for _, v in sorted(by.items())]
                     for seat, by in per_epoch.items()}
    summary[name].update(errors=sum(r.get("rollout/errors", 0) for r in trainer.metrics_log),
                         turns=sum(r.get("rollout/turns", 0) for r in trainer.metrics_log))
    print(json.dumps({name: summary[name]}), flush=True)
engine.close()
print(json.dumps({**summary, "minutes": round((time.time() - t0) / 60, 2)}))
