"""Self-play on the same budget as the league example, for comparison.

    python examples/tictactoe_selfplay.py

Same tiny base, warm-up, game, update settings and evaluation as examples/tictactoe_league.py;
one main player plays itself and its past snapshots (and the scripted random and minimax players,
which count as past opponents). Its games per round match the league's three learners' (256 + 2 x 32).

    python examples/tictactoe_selfplay.py --credit mirror --steps-per-generation 4 \
        --games-per-round 128 --epochs 12 --rounds 8

is instead the mirror self-play configuration of the poker and matrix-game examples, unchanged:
``credit="mirror"`` (``MirrorCredit``'s defaults), no past snapshots and no scripted players
(``past_share=0``), the average of the last third of the epochs' iterates deployed, the default
LoRA and GRPO settings at 0.3 times their 1e-2 rate, and their budget of 12 x 8 rounds of 128 games
(docs/results.md, "Mirror-descent self-play"). The per-epoch evaluation is the same.
"""

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import SelfPlayConfig, SelfPlayTrainer
from ttt_common import Evaluator, credit_method, finish, game, parse_args, scripted_players, start, update_settings

args = parse_args(__doc__, "--games-per-round", 320, "runs/tictactoe-selfplay")  # the league's 256 + 2 x 32

engine, figures = start(args)

mirror = args.credit == "mirror"
if mirror:  # the poker and matrix examples' mirror self-play: no past snapshots, the last third's iterates deployed
    from psro_matrix_games import LEARNING_RATE, grpo_settings
own = {"past_share": 0.0, "average_last": max(1, args.epochs // 3)} if mirror else {"past_share": 0.5}
config = SelfPlayConfig(epochs=args.epochs, rounds=args.rounds, games_per_round=args.games_per_round, **own,
                        output_dir=args.output_dir, overwrite_output_dir=not args.resume, seed=args.seed, max_tokens=2,
                        game_name="tictactoe",
                        credit=credit_method(args), arena={"max_concurrent_games": 128},
                        ratings={"bt_bootstrap": 50}, progress=True)
trainer = SelfPlayTrainer(config, opponents=None if mirror else scripted_players())
evaluator = Evaluator(args.eval_games)
# mirror: the poker and matrix examples' update settings (default LoRA and GRPO, their rate and steps)
lora, grpo = (None, grpo_settings(args, LEARNING_RATE)) if mirror else update_settings(args)
trainer.train(engine, game(args), lora_config=lora, grpo_config=grpo, callbacks=[evaluator],
              resume_from_checkpoint=args.resume)
finish(trainer, evaluator, engine, figures, args.credit)
