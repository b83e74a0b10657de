"""PSRO on Kuhn poker, scored as played, beside self-play on the same budget.

    python examples/psro_kuhn.py                 # PSRO then self-play, seed 0 (see the time below)
    python examples/psro_kuhn.py --trainers psro --seed 3
    python examples/psro_kuhn.py --smoke
    python examples/psro_kuhn.py --trainers psro --credit moves --restart-rounds 0   # per-move credit
    python examples/psro_kuhn.py --trainers psro --credit pooled --restart-rounds 0 --responder-pairs --steps-per-generation 4
    python examples/psro_kuhn.py --trainers selfplay --credit mirror --steps-per-generation 4   # mirror self-play

The base is the Kuhn example's tiny model after its format warm-up (``examples/kuhn_league.py``:
a random P(bet or call) per information set, cached). Both trainers use their defaults and the
learning rate that ``examples/psro_matrix_games.py`` uses on every matrix game: nothing here is
tuned to Kuhn poker. Both play 128 games a round: PSRO's responder 64 against the meta-strategy
and 64 evaluation games in its population; self-play 128 against itself and its past
(``--games-per-round`` sets self-play's).

After every epoch, each player of ``trainer.deployable_mixture()`` is read *as played*
(``autocurricula.eval.kuhn.read_played``: the tree of its replies at each information set, parsed
as the game parses them, invalid replies forfeiting as in the game) and the mixture's
exploitability is computed exactly (``played_exploitability``, chips per hand; 0 = Nash, 0.458 =
uniform). The invalid rate is the mixture's, averaged over the 12 information sets. One JSON line
per epoch and trainer (the trainer's progress bars, with the time left, go to stderr); the last
line holds the final figures.

Time on 2 idle cores: about 5 minutes per trainer (96 rounds), plus a 4-minute warm-up on the first run.
"""

import argparse
import json
import tempfile

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import PSROTrainer, SelfPlayTrainer
from autocurricula.eval.kuhn import INFOSETS, played_exploitability, played_mixture, read_played
from autocurricula.eval.played import MixtureFigures
from autocurricula.games import kuhn_poker

from kuhn_league import parse_args as kuhn_args
from kuhn_league import warm_base
from psro_matrix_games import (LEARNING_RATE, add_credit_options, check_credit_options, credit_settings, grpo_settings,
                               run_settings)

TRAINERS = {"psro": PSROTrainer, "selfplay": SelfPlayTrainer}


def played_figures(name: str, seed: int) -> MixtureFigures:
    """Per-epoch callback: the deployable mixture's played exploitability and invalid rate."""
    def read(engine, player, temperature):
        return read_played(engine, player, temperature=temperature)

    def score(mix):
        return {"exploitability": played_exploitability(mix),
                "invalid_rate": sum(mix[k][1] for k in INFOSETS) / len(INFOSETS)}

    return MixtureFigures(read, played_mixture, score, name=name, seed=seed,
                          printer=lambda line: print(line, flush=True))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainers", default="psro,selfplay")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--rounds", type=int, default=8, help="rounds per epoch")
    p.add_argument("--seed", type=int, default=0)
    add_credit_options(p)
    p.add_argument("--base-seed", type=int, default=None, help="the warm base's seed (default: --seed); one base "
                   "for several --seed runs saves its warm-up")
    p.add_argument("--output", default=None, help="append the JSON lines to this file")
    p.add_argument("--smoke", action="store_true", help="a tiny budget and model, to check the machinery")
    return check_credit_options(p, p.parse_args(argv))


def main(argv=None):
    args = parse_args(argv)
    base_seed = args.seed if args.base_seed is None else args.base_seed
    base_args = kuhn_args(["--seed", str(base_seed)] + (["--smoke"] if args.smoke else []))
    if args.smoke:
        args.epochs, args.rounds = 1, 2
    base = warm_base(base_args)
    final = {}
    for name in args.trainers.split(","):
        cls = TRAINERS[name]
        own = {"games_per_round": args.games_per_round} if name == "selfplay" else {}
        figures = played_figures(name, args.seed)
        with tempfile.TemporaryDirectory() as out:
            config = cls.config_class(epochs=args.epochs, rounds=args.rounds, seed=args.seed, output_dir=out,
                                      save_strategy="no", **credit_settings(name, args, own))  # the trainer's bars: rounds, epochs, time left
            trainer = cls(config)
            trainer.train(str(base), kuhn_poker, grpo_config=grpo_settings(args, LEARNING_RATE), callbacks=[figures])
            trainer.engine.close()
        final[name] = figures.rows[-1]
        if args.output:
            with open(args.output, "a") as fh:
                fh.write("\n".join(json.dumps(r) for r in figures.rows) + "\n")
    print(json.dumps({"final": final, "seed": args.seed, "base_seed": base_seed, "epochs": args.epochs, "rounds": args.rounds,
                      **run_settings(args)}))


if __name__ == "__main__":
    main()
