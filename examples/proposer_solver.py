"""Proposer/Solver: the solver's pass rate on the proposer's problems moves toward 0.5 and the
artifact store of accepted problems grows.

    python examples/proposer_solver.py

Two players of one tiny model: a proposer and a solver (frozen by default: the proposer learns the
frontier of a fixed solver; ``--solver-trainable`` trains it too, on its attempts and on problems
replayed from the store). A short supervised warm-up teaches the two formats only: as proposer, a
random ``a+b`` / ``a-b`` / ``a*b`` of digits; as solver, a number near the answer (right by
chance). The goldilocks reward ``1 - 2 |pass_rate - 0.5|`` then trains the proposer toward
problems the solver gets right half of the time. After every epoch the example prints the mean
pass rate, the mean distance |pass_rate - 0.5| (0.5 at worst, 0 when every problem sits at
50 %) and the store's size. Offline, a few minutes on 2 CPU cores.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import AutocurriculumTrainer, GRPOConfig, SelfPlayConfig, build_tiny_model
from autocurricula.engine import Engine, LoraSpec
from autocurricula.games import proposer_solver as ps
from autocurricula.training.warmup import sft_warmup

CACHE = Path(os.environ.get("AUTOCURRICULA_CACHE", Path.home() / ".cache" / "autocurricula"))

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--rounds", type=int, default=10)
parser.add_argument("--games-per-round", type=int, default=16)
parser.add_argument("--attempts", type=int, default=4, help="solver attempts per problem (Monte Carlo)")
parser.add_argument("--solver-trainable", action="store_true", help="also train the solver on its attempts at "
                    "the proposer's problems (by default only the store's replayed problems train it)")
parser.add_argument("--replay-attempts", type=int, default=2, help="solver attempts per game on a stored problem")
parser.add_argument("--warmup-steps", type=int, default=150)
parser.add_argument("--learning-rate", type=float, default=2e-3)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--heads", type=int, default=32)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--output-dir", default="runs/proposer-solver")
args = parser.parse_args()
t0 = time.time()

checker = ps.Arithmetic()
rng = random.Random(args.seed)
examples = []
for _ in range(3000):
    problem = f"{rng.randint(0, 9)}{rng.choice('+-*')}{rng.randint(0, 9)}"
    examples.append((checker.propose_prompt, problem))
    examples.append((checker.solve_prompt(problem), str(ps.safe_eval(problem) + rng.randint(-2, 2))))
seed_tag = f"-s{args.seed}" if args.seed else ""  # one cached base per seed
base = build_tiny_model(CACHE / f"tiny-h{args.hidden}-l{args.layers}-a{args.heads}{seed_tag}", hidden_size=args.hidden,
                        num_layers=args.layers, num_heads=args.heads, intermediate_size=2 * args.hidden, seed=args.seed)
warm = sft_warmup(base, CACHE / f"{base.name}-ps-warm{args.warmup_steps}", examples, steps=args.warmup_steps,
                  batch_size=64, learning_rate=1e-3, seed=args.seed)
engine = Engine(str(warm), name="tiny-ps")

game = ps.ProposerSolver(attempts=args.attempts, checker=checker, max_tokens=6,  # play, holding the store
                         solver_trainable=args.solver_trainable, replay_attempts=args.replay_attempts)


class Duo(AutocurriculumTrainer):
    """A proposer and a solver (frozen unless --solver-trainable), ``--games-per-round`` games a round."""

    config_class = SelfPlayConfig

    def entry(self):
        if self.current_epoch:
            return []
        return [{"role": "proposer"}, {"role": "solver", "frozen": not args.solver_trainable}]

    def match(self):
        return [tuple(self.players[:2])] * self.config.rules.games_per_round


rows, seen = [], [0]


def report(trainer):
    rates = game.pass_rates[seen[0]:]
    seen[0] = len(game.pass_rates)
    row = {"epoch": trainer.current_epoch, "games_scored": len(rates),
           "pass_rate": round(sum(rates) / max(1, len(rates)), 3),
           "distance_to_half": round(sum(abs(r - 0.5) for r in rates) / max(1, len(rates)), 3),
           "store_size": len(game.store), "minutes": round((time.time() - t0) / 60, 2)}
    rows.append(row)
    print(json.dumps(row), flush=True)
    return {"eval/pass_rate": row["pass_rate"], "eval/distance_to_half": row["distance_to_half"],
            "eval/store_size": row["store_size"]}


config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds,
                        rules={"games_per_round": args.games_per_round, "past_share": 0.0}, credit="grpo",
                        output_dir=args.output_dir, overwrite_output_dir=True, seed=args.seed, max_tokens=6,
                        ratings={"bt_bootstrap": 0}, progress=False)
trainer = Duo(config)  # checkpoints carry game.state_dict(): the store
trainer.train(engine, game, lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
              grpo_config=GRPOConfig(learning_rate=args.learning_rate, temperature=1.0, loss_type="grpo"),
              callbacks=[report])
engine.close()
top = sorted(game.store.items.items(), key=lambda kv: -kv[1][0])[:5]
print(json.dumps({"pass_rate_first_last": [rows[0]["pass_rate"], rows[-1]["pass_rate"]],
                  "distance_to_half_first_last": [rows[0]["distance_to_half"], rows[-1]["distance_to_half"]],
                  "store_size": len(game.store), "top_problems": [k for k, _ in top],
                  "minutes": round((time.time() - t0) / 60, 2)}))
