"""One Kuhn poker learner against the fixed uniform-random player: does its credit separate the cards?

    python research/kuhn_fixed_opponent.py --branch-advantage return   # credit on the sampled move
    python research/kuhn_fixed_opponent.py --branch-advantage moves    # every legal move played out

The best response to uniform random depends on the card: holding the jack facing a bet, calling
always loses 2 chips where folding loses 1, and the king always wins the call. Starts from the same
cached warm base as ``examples/kuhn_league.py`` and prints, every ``--every`` rounds, one JSON line
with the learner's P(bet or call) per information set (read off its token probabilities), its
value against uniform random (the best response gets 0.458) and its exploitability.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import autocurricula  # noqa: F401,E402  (fast BLAS before mlx)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--games", type=int, default=64)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--branch-advantage", default="moves", choices=["moves", "return"])
    parser.add_argument("--branch-samples", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--move-temperature", type=float, default=0.25)
    parser.add_argument("--move-clip", type=float, default=2.0, help="inf: unbounded targets")
    parser.add_argument("--output-dir", default="runs/kuhn-fixed-opponent")
    args = parser.parse_args(argv)

    from kuhn_league import parse_args as example_args
    from kuhn_league import warm_base

    from autocurricula import GRPOConfig, LeagueConfig, LeagueTrainer
    from autocurricula.credit import BranchCredit
    from autocurricula.engine import Engine, LoraSpec
    from autocurricula.eval.kuhn import INFOSETS, exploitability, read_strategy
    from autocurricula.eval.players import main_agent
    from autocurricula.games import kuhn_poker

    base = warm_base(example_args([]))
    engine = Engine(str(base), name=str(base))
    uniform = dict.fromkeys(INFOSETS, 0.5)
    config = LeagueConfig(rules={"main_agents": 1, "main_exploiters": 0, "league_exploiters": 0,
                                 "games_per_learner": args.games, "anchor_share": 1.0}, epochs=1, rounds=args.rounds, output_dir=args.output_dir,
                          overwrite_output_dir=True, seed=0, max_tokens=3,
                          credit=BranchCredit(samples=args.branch_samples, advantage=args.branch_advantage,
                                              move_temperature=args.move_temperature, move_clip=args.move_clip),
                          game_name="kuhn_poker", arena={"max_concurrent_games": 128},
                          ratings={"bt_bootstrap": 0}, progress=False, save_total_limit=1)
    trainer = LeagueTrainer(config, opponents=[{"id": "random", "role": "random", "policy": kuhn_poker.random_policy}])
    start, rounds = time.time(), [0]
    round_end = trainer.on_round_end

    def on_round_end(records):
        out = round_end(records)
        rounds[0] += 1
        if rounds[0] % args.every == 0:
            s = read_strategy(engine, main_agent(trainer))
            value = (kuhn_poker.exact_value(s, uniform) - kuhn_poker.exact_value(uniform, s)) / 2
            print(json.dumps({"round": rounds[0], "minutes": round((time.time() - start) / 60, 2),
                              "value_vs_uniform": round(value, 4), "exploitability": round(exploitability(s), 4),
                              "strategy": {k: round(v, 2) for k, v in s.items()}}), flush=True)
        return out

    trainer.on_round_end = on_round_end
    trainer.train(engine, kuhn_poker.play, lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
                  grpo_config=GRPOConfig(learning_rate=args.learning_rate, loss_type="grpo", temperature=1.0))
    engine.close()


if __name__ == "__main__":
    main()
