"""PSRO on Leduc poker, scored as played, beside self-play and fictitious play on the same budget.

    python examples/psro_leduc.py                 # PSRO, self-play, fictitious play; seed 0
    python examples/psro_leduc.py --trainers psro --seed 3
    python examples/psro_leduc.py --smoke
    python examples/psro_leduc.py --trainers psro --credit pooled --restart-rounds 0 --responder-pairs --steps-per-generation 4
    python examples/psro_leduc.py --trainers selfplay --credit mirror --steps-per-generation 4

The base is the tiny model after a format warm-up (cached): ``leduc_poker.warmup_examples``, a
random mix of the legal words per information set, so the base must read its card, the board and
the history, but learns no strategy. Every trainer uses its defaults and the learning rate that
``examples/psro_matrix_games.py`` and ``examples/psro_kuhn.py`` use: nothing here is tuned to
Leduc. Each plays 128 games a round: PSRO's responder 64 against the meta-strategy and 64
evaluation games in its population; self-play 128 against itself and its past; fictitious play
128 against its past (``--games-per-round`` sets self-play's and fictitious play's).

After every epoch, each player of ``trainer.deployable_mixture()`` is read *as played*
(``autocurricula.eval.leduc.read_played``: the tree of its replies at each of the 288 information
sets, parsed as the game parses them; frozen players once) and the mixture's exploitability is
computed exactly (``played_exploitability``, chips per hand; 0 = Nash, 2.374 = uniform), each
invalid reply forfeiting as in the game (-9.5 to the offender, +9.5 to the other player). Beside
it: ``invalid_rate`` (the mixture's, averaged over the 288 sets) and ``invalid_per_hand`` (the
chance that a hand of the mixture against itself ends on an invalid reply). One JSON line per
epoch and trainer (the trainers' progress bars, with the time left, go to stderr); the last line
holds the final figures.

Time on 2 cores shared with other jobs, 3 epochs of 8 rounds: PSRO 3.5 minutes, self-play 9
(reading a player's 288 sets takes about a minute, more when its replies spread); the warm-up,
once and cached, took 30 minutes there (300 steps).
"""

import argparse
import json
import tempfile

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import FictitiousPlayTrainer, PSROTrainer, SelfPlayTrainer
from autocurricula.eval.leduc import (invalid_per_hand, invalid_rate, played_exploitability, played_mixture,
                                      read_played)
from autocurricula.eval.played import MixtureFigures
from autocurricula.games import leduc_poker

from psro_matrix_games import (LEARNING_RATE, add_credit_options, check_credit_options, credit_settings, grpo_settings,
                               run_settings)

TRAINERS = {"psro": PSROTrainer, "selfplay": SelfPlayTrainer, "fictitious": FictitiousPlayTrainer}


def played_figures(name: str, seed: int, threshold: float) -> MixtureFigures:
    """Per-epoch callback: the deployable mixture's played exploitability and invalid rates."""
    def read(engine, player, temperature):
        return read_played(engine, player, temperature=temperature, threshold=threshold)

    def score(mix) -> dict:
        return {"exploitability": played_exploitability(mix), "invalid_rate": invalid_rate(mix),
                "invalid_per_hand": invalid_per_hand(mix)}

    return MixtureFigures(read, played_mixture, score, name=name, seed=seed,
                          printer=lambda line: print(line, flush=True))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainers", default="psro,selfplay,fictitious")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--rounds", type=int, default=8, help="rounds per epoch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-seed", type=int, default=None, help="the warm base's seed (default: --seed); one base "
                   "for several --seed runs saves its warm-up")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--warmup-steps", type=int, default=300)
    p.add_argument("--threshold", type=float, default=1e-4, help="read_played: reply branches below this "
                   "probability are left unread and counted invalid (reported as 'unresolved')")
    add_credit_options(p)
    p.add_argument("--output", default=None, help="append the JSON lines to this file")
    p.add_argument("--smoke", action="store_true", help="a tiny budget and model, to check the machinery")
    args = check_credit_options(p, p.parse_args(argv))
    if args.smoke:
        args.epochs, args.rounds, args.hidden, args.layers, args.heads = 1, 2, 32, 1, 8
        args.warmup_steps, args.threshold = 60, 1e-2
    return args


def warm_base(args, seed: int):
    """The tiny base after the per-information-set random warm-up (both cached by their arguments)."""
    from autocurricula.training.warmup import sft_warmup
    from ttt_common import CACHE, tiny_base

    base = tiny_base(args.hidden, args.layers, args.heads, seed)
    return sft_warmup(base, CACHE / f"{base.name}-leduc-warm{args.warmup_steps}",
                      leduc_poker.warmup_examples(20000, seed), steps=args.warmup_steps, batch_size=64,
                      learning_rate=2e-3, seed=seed)


def main(argv=None):
    args = parse_args(argv)
    base_seed = args.seed if args.base_seed is None else args.base_seed
    base = warm_base(args, base_seed)
    final = {}
    for name in args.trainers.split(","):
        cls = TRAINERS[name]
        own = {} if name == "psro" else {"games_per_round": args.games_per_round}
        figures = played_figures(name, args.seed, args.threshold)
        with tempfile.TemporaryDirectory() as out:
            config = cls.config_class(epochs=args.epochs, rounds=args.rounds, seed=args.seed, output_dir=out,
                                      save_strategy="no", **credit_settings(name, args, own))  # the trainer's bars: rounds, epochs, time left
            trainer = cls(config)
            trainer.train(str(base), leduc_poker, grpo_config=grpo_settings(args, LEARNING_RATE), callbacks=[figures])
            trainer.engine.close()
        final[name] = figures.rows[-1]
        if args.output:
            with open(args.output, "a") as fh:
                fh.write("\n".join(json.dumps(r) for r in figures.rows) + "\n")
    print(json.dumps({"final": final, "seed": args.seed, "base_seed": base_seed, "epochs": args.epochs,
                      "rounds": args.rounds, **run_settings(args)}))


if __name__ == "__main__":
    main()
