"""Self-play on the same budget as the league example, for comparison.

    python examples/tictactoe_selfplay.py

Same tiny base, warm-up, game, update settings and evaluation as examples/tictactoe_league.py;
one main player plays itself and its past snapshots (and the scripted random and minimax players,
which count as past opponents). The number of games per round matches the league's three learners.
"""

import argparse

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import SelfPlayConfig, SelfPlayTrainer
from autocurricula.games import tictactoe

from ttt_common import Evaluator, finish, scripted_players, start, update_settings

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--rounds", type=int, default=8)
parser.add_argument("--games-per-round", type=int, default=192)
parser.add_argument("--output-dir", default="runs/tictactoe-selfplay")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--hidden", type=int, default=128, help="tiny model width (the package default is 256)")
parser.add_argument("--layers", type=int, default=2, help="tiny model depth (the package default is 4)")
args = parser.parse_args()

engine, figures = start(args.seed, hidden=args.hidden, layers=args.layers)

config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds, games_per_round=args.games_per_round, past_share=0.5,
                        output_dir=args.output_dir, seed=args.seed, max_tokens=2, credit="rae",
                        max_concurrent_games=128, bt_bootstrap=50, progress=False)
trainer = SelfPlayTrainer(config, opponents=scripted_players())
evaluator = Evaluator()
lora, grpo = update_settings()
trainer.train(engine, tictactoe.play, lora_config=lora, grpo_config=grpo, callbacks=[evaluator])
finish(trainer, evaluator, engine, figures)
