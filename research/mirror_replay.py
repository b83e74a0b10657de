"""Mirror self-play that also trains on the targets of its last rounds: does a replay of targets
help where states are many and rarely visited?

    python research/mirror_replay.py --game tictactoe --keep-rounds 4 --seed 0
    python research/mirror_replay.py --game kuhn --keep-rounds 4 --seed 0

The mirror self-play configuration (``examples/tictactoe_selfplay.py --credit mirror
--steps-per-generation 4 --games-per-round 128 --epochs 12 --rounds 8``, and ``examples/psro_kuhn.py
--trainers selfplay --credit mirror --steps-per-generation 4 --base-seed 0``) with one change: each
round's update also takes the move targets of the previous ``--keep-rounds - 1`` rounds
(``ReplayMirror``), as they were computed then. ``research/mirror_fit.py --exact`` finds that on
tic-tac-toe one round's update, from its few hundred states (most visited once), leaves the other
positions farther from their own targets by summed KL; a replay trains on several rounds' states
at once, and a state met in several rounds on consistent targets. The targets are one mirror step from the
policy of their round, so older ones are staler; at tic-tac-toe's small per-round moves they stay
close. Each epoch prints the example's figures (tic-tac-toe: the main player's greedy moves
against the exact best response; Kuhn: chips per hand as played), to set beside the
configuration's curves in research/results_history.md. The replay is not saved in checkpoints: run it unbroken.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import autocurricula  # noqa: E402,F401  (fast BLAS before mlx)
from autocurricula.credit import MirrorCredit  # noqa: E402


@dataclass
class ReplayMirror(MirrorCredit):
    """``MirrorCredit`` whose extra turns are this round's move targets and those of the
    ``keep_rounds - 1`` rounds before it (1: ``MirrorCredit`` itself). The GRPO loss weighs every
    turn alike, so this round's targets get about ``1 / keep_rounds`` of the update, which costs about
    ``keep_rounds`` times as much; an older target is a step from its own round's policy, so it also
    pulls back toward that policy."""

    keep_rounds: int = 4
    _kept: list = field(default_factory=list, init=False, repr=False)
    name = "mirror-replay"

    def __post_init__(self):
        if isinstance(self.keep_rounds, bool) or not isinstance(self.keep_rounds, int) or self.keep_rounds < 1:
            raise ValueError(f"keep_rounds must be an int >= 1 (1 = no replay), got {self.keep_rounds!r}")
        super().__post_init__()

    def extra_turns(self, turns):
        self._kept = (self._kept + [super().extra_turns(turns)])[-self.keep_rounds:]
        players = {t.player for t in turns}
        return [t for kept in self._kept for t in kept if t.player in players]


def tictactoe(args) -> None:
    from ttt_common import Evaluator, finish, game, parse_args, start
    from tictactoe_selfplay import settings

    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    ttt = parse_args(__doc__, "--games-per-round", 128, args.output_dir, mirror=True, argv=[
        "--credit", "mirror", "--steps-per-generation", "4", "--epochs", str(args.epochs), "--rounds", "8",
        "--seed", str(args.seed)])
    engine, figures = start(ttt)
    own, _, lora, grpo = settings(ttt)
    config = SelfPlayConfig(epochs=ttt.epochs, rounds=ttt.rounds, rules={"games_per_round": ttt.games_per_round, **own},
                            output_dir=ttt.output_dir, overwrite_output_dir=True, seed=ttt.seed, max_tokens=2,
                            game_name="tictactoe", credit=ReplayMirror(keep_rounds=args.keep_rounds),
                            arena={"max_concurrent_games": 128}, ratings={"bt_bootstrap": 50}, progress=True)
    trainer = SelfPlayTrainer(config)
    evaluator = Evaluator(ttt.eval_games)
    trainer.train(engine, game(ttt), lora_config=lora, grpo_config=grpo, callbacks=[evaluator])
    finish(trainer, evaluator, engine, figures, ttt)
    print(json.dumps({"keep_rounds": args.keep_rounds, "seed": args.seed}))


def kuhn(args) -> None:
    from kuhn_league import parse_args as kuhn_args
    from kuhn_league import warm_base
    from psro_kuhn import parse_args as psro_args
    from psro_kuhn import played_figures
    from psro_matrix_games import LEARNING_RATE, credit_settings, grpo_settings

    from autocurricula import SelfPlayConfig, SelfPlayTrainer
    from autocurricula.games import kuhn_poker

    run = psro_args(["--trainers", "selfplay", "--credit", "mirror", "--steps-per-generation", "4",
                     "--seed", str(args.seed), "--epochs", str(args.epochs)])
    base = warm_base(kuhn_args(["--seed", "0"]))  # the Kuhn figures' base (--base-seed 0)
    figures = played_figures("selfplay", args.seed)
    own = {**credit_settings("selfplay", run, {"games_per_round": run.games_per_round}),
           "credit": ReplayMirror(keep_rounds=args.keep_rounds)}
    with tempfile.TemporaryDirectory() as out:
        config = SelfPlayConfig(epochs=run.epochs, rounds=run.rounds, seed=run.seed, output_dir=out,
                                save_strategy="no", **own)
        trainer = SelfPlayTrainer(config)
        trainer.train(str(base), kuhn_poker, grpo_config=grpo_settings(run, LEARNING_RATE), callbacks=[figures])
        trainer.engine.close()
    print(json.dumps({"final": figures.rows[-1], "seed": args.seed, "keep_rounds": args.keep_rounds}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", choices=["tictactoe", "kuhn"], required=True)
    p.add_argument("--keep-rounds", type=int, default=4, help="rounds of targets each update trains on (1 = the "
                   "configuration)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--output-dir", default="runs/mirror-replay", help="tic-tac-toe: the run's folder")
    args = p.parse_args(argv)
    ReplayMirror(keep_rounds=args.keep_rounds)  # refuse a bad value before any warm-up
    (tictactoe if args.game == "tictactoe" else kuhn)(args)


if __name__ == "__main__":
    main()
