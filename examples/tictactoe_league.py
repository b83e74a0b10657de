"""The main job: an AlphaStar-style league learns tic-tac-toe offline on the built-in tiny model.

    python examples/tictactoe_league.py            # about 15 minutes on a 2-core CPU

Builds (and caches) the tiny model and its supervised warm-up on random legal moves, trains a
league (main agent, main exploiter, league exploiter, plus scripted random and minimax players in
the pool), prints the leaderboard, and after every epoch evaluates the best player's greedy policy
against uniform random and perfect play. The last line is one JSON object with the figures.
"""

import argparse
import json

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import GRPOConfig, LeagueConfig, LeagueTrainer
from autocurricula.engine import Engine, LoraSpec
from autocurricula.games import tictactoe

from ttt_common import Evaluator, base_figures, warm_base

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--rounds", type=int, default=8)
parser.add_argument("--games-per-learner", type=int, default=64)
parser.add_argument("--output-dir", default="runs/tictactoe-league")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

base = warm_base(seed=args.seed)
engine = Engine(str(base), name=str(base))
start = base_figures(engine)
print("warm-up base:", json.dumps(start), flush=True)

config = LeagueConfig(
    epochs=args.epochs, rounds=args.rounds, games_per_learner=args.games_per_learner,
    main_agents=1, main_exploiters=1, league_exploiters=1, snapshot_min_rounds=4, snapshot_max_rounds=8,
    output_dir=args.output_dir, seed=args.seed, max_tokens=2, credit="rae",
    max_concurrent_games=128, bt_bootstrap=50, progress=False,
)
scripted = [{"id": "random", "role": "random", "policy": tictactoe.random_policy},
            {"id": "minimax", "role": "minimax", "policy": tictactoe.minimax_policy}]
trainer = LeagueTrainer(config, opponents=scripted)
evaluator = Evaluator()
trainer.train(engine, tictactoe.play,
              lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
              grpo_config=GRPOConfig(learning_rate=5e-4, beta=0.1, loss_type="grpo", temperature=1.0),
              callbacks=[evaluator])
print(trainer.leaderboard)
engine.close()
print(json.dumps(evaluator.summary(trainer, start)))
