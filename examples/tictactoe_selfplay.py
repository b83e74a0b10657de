"""Self-play on the same budget as the league example, for comparison.

    python examples/tictactoe_selfplay.py

Same tiny base, warm-up, game, update settings and evaluation as examples/tictactoe_league.py;
one main player plays itself and its past snapshots (and the scripted random and minimax players,
which count as past opponents). The number of games per round matches the league's three learners.
"""

import argparse
import json

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import GRPOConfig, SelfPlayConfig, SelfPlayTrainer
from autocurricula.engine import Engine, LoraSpec
from autocurricula.games import tictactoe

from ttt_common import Evaluator, base_figures, warm_base

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--rounds", type=int, default=8)
parser.add_argument("--games-per-round", type=int, default=192)
parser.add_argument("--output-dir", default="runs/tictactoe-selfplay")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

base = warm_base(seed=args.seed)
engine = Engine(str(base), name=str(base))
start = base_figures(engine)
print("warm-up base:", json.dumps(start), flush=True)

config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds, games_per_round=args.games_per_round, past_share=0.5,
                        output_dir=args.output_dir, seed=args.seed, max_tokens=2, credit="rae",
                        max_concurrent_games=128, bt_bootstrap=50, progress=False)
scripted = [{"id": "random", "role": "random", "policy": tictactoe.random_policy},
            {"id": "minimax", "role": "minimax", "policy": tictactoe.minimax_policy}]
trainer = SelfPlayTrainer(config, opponents=scripted)
evaluator = Evaluator()
trainer.train(engine, tictactoe.play,
              lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
              grpo_config=GRPOConfig(learning_rate=5e-4, beta=0.1, loss_type="grpo", temperature=1.0),
              callbacks=[evaluator])
print(trainer.leaderboard)
engine.close()
print(json.dumps(evaluator.summary(trainer, start)))
