"""Is a PSRO run on a matrix game limited by its best responses or by its estimates?

    python research/psro_restricted_game.py --game 17 --seed 2

Runs ``examples/psro_matrix_games.py``'s PSRO on one game of the random family, then reads every
population member's exact policy off the engine and prints, as shares of the payoff range:

- the deployed mixture's exploitability (the example's figure);
- the exploitability of the exact Nash mixture of the *true* restricted game (the members' exact
  expected payoffs against each other, not the sampled estimates): if it is low and the deployed
  figure high, the estimates (or their counts) are what is missing; if both are high, the best
  responses are;
- per member, its fewest games against another member, its true and deployed weights, and its
  exact mean relative reward against the deployed mixture (no member above 0: the mixture is an
  equilibrium of the true restricted game).

One JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from autocurricula.eval.matrix import extended_payoff, figures, read_policy  # noqa: E402
from autocurricula.eval.meta import zero_sum_nash  # noqa: E402
from autocurricula.games.matrix import random_game  # noqa: E402


def true_restricted_game(game, policies: list) -> np.ndarray:
    """Member i's exact mean relative reward against j, averaged over the two seats."""
    a = extended_payoff(game)
    k = len(policies)
    m = np.zeros((k, k))
    for i, (ri, ci) in enumerate(policies):
        for j, (rj, cj) in enumerate(policies):
            m[i, j] = 0.5 * (ri @ a @ cj) - 0.5 * (rj @ a @ ci)
    return m


def main(argv=None) -> None:
    import psro_matrix_games as pm

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", type=int, default=17, help="random_game(GAME)")
    p.add_argument("--seed", type=int, default=0)
    args, rest = p.parse_known_args(argv)
    run_args = pm.parse_args(["--seed", str(args.seed), *rest])
    game = random_game(args.game)
    base = pm.warm_base(run_args)
    with tempfile.TemporaryDirectory() as out:
        config = pm.config_for("psro", run_args, out)
        config.progress = True  # a minute or more: the epochs bar shows the ETA
        trainer = pm.TRAINERS["psro"](config)
        try:
            trainer.train(str(base), game, grpo_config={"learning_rate": run_args.learning_rate})
            t = trainer.run.grpo.temperature
            deployed = trainer.deployable_mixture()
            ids = [m["id"] for m in trainer.population()]
            pols = {pid: read_policy(trainer.engine, pid, game, temperature=t) for pid in ids}
            true = true_restricted_game(game, [pols[pid] for pid in ids])
            x = zero_sum_nash(true)[0]
            gains = true @ np.array([deployed.get(pid, 0.0) for pid in ids])  # each member's against the mixture
            exact = {pid: float(w) for pid, w in zip(ids, x)}
            _, _, games = trainer.standings.relative.matrices(ids)
        finally:
            trainer.engine.close()
    members = []
    for i, pid in enumerate(ids):
        played = np.delete(games[i], i)
        members.append({"id": pid, "fewest_games": int(played.min()) if len(played) else 0,
                        "true_nash_weight": round(exact[pid], 3), "deployed_weight": round(deployed.get(pid, 0.0), 3),
                        "gain_vs_deployed": round(float(gains[i]), 3)})
    print(json.dumps({"game": game.name, "seed": args.seed,
                      "deployed": round(figures(game, pols, deployed)["exploitability_share"], 4),
                      "true_restricted_nash": round(figures(game, pols, exact)["exploitability_share"], 4),
                      "members": members}))

if __name__ == "__main__":
    main()
