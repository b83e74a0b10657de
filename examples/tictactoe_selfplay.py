"""Self-play on the same budget as the league example, for comparison.

    python examples/tictactoe_selfplay.py

Same tiny base, warm-up, game, update settings and evaluation as examples/tictactoe_league.py;
one main player plays itself and its past snapshots (and the scripted random and minimax players,
which count as past opponents). Its games per round match the league's three learners' (256 + 2 x 32).

    python examples/tictactoe_selfplay.py --credit mirror --steps-per-generation 4 \\
        --games-per-round 128 --epochs 12 --rounds 8

runs the mirror self-play configuration of the poker and matrix-game examples on this game:
``credit="mirror"`` (``MirrorCredit``'s defaults), no past snapshots and no scripted players
(``past_share=0``), the average of the last third of the epochs' iterates as the deployable
mixture, the default LoRA and GRPO settings at 0.3 times their 1e-2 rate (the rate itself with
``--mirror-iterate table``), and their budget of
12 x 8 rounds of 128 games (docs/results.md, "Mirror-descent self-play"). The game keeps its
random openings, and the per-epoch evaluation is the league example's: the main player's greedy
moves against the exact best response.
"""

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import SelfPlayConfig, SelfPlayTrainer
from ttt_common import Evaluator, credit_method, finish, game, parse_args, scripted_players, start, update_settings


def settings(args) -> tuple[dict, list | None, object, object]:
    """The run's SelfPlayRules fields, its fixed opponents, and its LoRA and GRPO settings
    (``--credit mirror``: the poker and matrix examples', from examples/psro_matrix_games.py)."""
    if args.credit != "mirror":
        return {"past_share": 0.5}, scripted_players(), *update_settings(args)
    from psro_matrix_games import LEARNING_RATE, grpo_settings

    own = {"past_share": 0.0, "average_last": max(1, args.epochs // 3)}  # plays only its current policy
    return own, None, None, grpo_settings(args, LEARNING_RATE)


def main(argv=None):
    args = parse_args(__doc__, "--games-per-round", 320, "runs/tictactoe-selfplay", argv=argv,
                      mirror=True)  # the league's 256 + 2 x 32 games a round
    engine, figures = start(args)
    own, opponents, lora, grpo = settings(args)
    config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds,
                            rules={"games_per_round": args.games_per_round, **own}, output_dir=args.output_dir,
                            overwrite_output_dir=not args.resume, seed=args.seed, max_tokens=2, game_name="tictactoe",
                            credit=credit_method(args), arena={"max_concurrent_games": 128},
                            ratings={"bt_bootstrap": 50}, progress=True)
    trainer = SelfPlayTrainer(config, opponents=opponents)
    evaluator = Evaluator(args.eval_games)
    trainer.train(engine, game(args), lora_config=lora, grpo_config=grpo, callbacks=[evaluator],
                  resume_from_checkpoint=args.resume)
    finish(trainer, evaluator, engine, figures, args)


if __name__ == "__main__":
    main()
