"""The main job: an AlphaStar-style league learns tic-tac-toe offline on the built-in tiny model.

    python examples/tictactoe_league.py            # about 38 minutes on 2 idle CPU cores (docs/results.md)

Builds (and caches) the tiny model and its supervised warm-up on random legal moves, trains a
league (main agent, main exploiter, league exploiter, plus the game's scripted random player in
the pool), prints the leaderboard, and after every epoch evaluates the best player's greedy policy
against uniform random and perfect play. The last line is one JSON object with the figures.

Defaults (docs/results.md has their figures): credit "q" with q targets and the minimax backup (a move is
valued by its worst known outcome over the positions played, ``QCredit(backup="minimax")``), 12 epochs
of 30 rounds with 4 optimizer steps a round and the rate decayed to 0 over the last quarter, half of the
main agent's games against the random player (anchor_share) and the rest by AlphaStar's rules, 32
games per exploiter. No solver is needed: every game declares a random player (``random_policy``);
``--anchors random,minimax`` adds the minimax player as a second anchor.

    python examples/tictactoe_league.py --pure --credit branch   # a pure league, no lookup table

``--pure`` leaves the scripted player out of the pool (every game is self-play, PFSP over snapshots or
against exploiters); ``--credit branch`` gives each move its advantage from branch rollouts instead of
the tabular "q"/"value" credit. The pure league's strongest recipe in docs/results.md (about 80 minutes
on 2 cores) values every free cell after the opponent's best reply, with greedy play after it
(``BestReplyCredit`` of examples/best_reply_credit.py):

    python examples/tictactoe_league.py --pure --credit branch --branch-advantage moves \
        --branch-samples 1 --branch-turns 0 --branch-temperature 0 --branch-replies \
        --move-loss cross_entropy --games-per-learner 64 --exploiter-games 16 --steps-per-generation 4 \
        --epochs 16 --rounds 20 --lr-schedule warmup_stable_decay --lr-decay-ratio 0.25

The final JSON line holds ``loses_to_best_response_as_x/o``, ``credit`` and the per-epoch ``curve``;
``--resume`` continues a run from its latest checkpoint (the rate's decay spans the
``--epochs`` given: a run extended past its end climbs back to the full rate first).
"""

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import LeagueConfig, LeagueTrainer
from ttt_common import Evaluator, credit_method, finish, game, parse_args, scripted_players, start, update_settings


def league_flags(parser):
    parser.add_argument("--main-exploiters", type=int, default=1, help="main exploiters (0 = none: the main "
                        "agent's games then go to self-play, PFSP over the pool and the league exploiters)")
    parser.add_argument("--league-exploiters", type=int, default=1)
    parser.add_argument("--selfplay-share", type=float, default=0.35, help="main agent: share of self-play games")
    parser.add_argument("--pfsp-share", type=float, default=0.5, help="main agent: share of PFSP games over the "
                        "pool (snapshots and the scripted players)")
    parser.add_argument("--pfsp-weighting", default="squared", help="main agent's PFSP weighting")
    parser.add_argument("--exploiter-games", type=int, default=32, help="games per exploiter and round")
    parser.add_argument("--anchor-share", type=float, default=0.5, help="main agent: share of games against the "
                        "scripted players, --anchors (not in AlphaStar)")
    parser.add_argument("--pure", action="store_true", help="a pure league: no scripted player in the pool (no "
                        "opponents, anchor_share=0); every game is self-play, PFSP over snapshots or against "
                        "exploiters")
    parser.add_argument("--anchors", default="random", choices=["random", "random,minimax"],
                        help="the scripted players in the pool: the random player, which every game declares "
                        "(random_policy), or the minimax player beside it, which needs a solved game; --resume "
                        "takes the pool the run began with")
    # this example's defaults on top of the shared command line (docs/results.md)
    parser.set_defaults(q_backup="minimax", steps_per_generation=4, epochs=12, lr_schedule="warmup_stable_decay")


def parse(argv=None):
    """The example's command line (``argv``: default the process's)."""
    return parse_args(__doc__, "--games-per-learner", 256, "runs/tictactoe-league", extra=league_flags, argv=argv)


def main(argv=None, credit=None, callbacks=()) -> None:
    """The example; ``credit``: a credit object in place of ``--credit``'s, ``callbacks``: more
    trainer callbacks (research/ compares other credits)."""
    args = parse(argv)
    engine, figures = start(args)
    config = LeagueConfig(epochs=args.epochs, rounds=args.rounds,
                          rules={"games_per_learner": args.games_per_learner, "exploiter_games": args.exploiter_games,
                                 "main_agents": 1, "main_exploiters": args.main_exploiters,
                                 "league_exploiters": args.league_exploiters,
                                 "anchor_share": 0.0 if args.pure else args.anchor_share,
                                 "selfplay_share": args.selfplay_share, "pfsp_share": args.pfsp_share,
                                 "main_pfsp_weighting": args.pfsp_weighting,
                                 "snapshot_min_rounds": max(4, args.rounds // 2),
                                 "snapshot_max_rounds": max(8, args.rounds)}, output_dir=args.output_dir,
                          overwrite_output_dir=not args.resume, seed=args.seed, max_tokens=2, game_name="tictactoe",
                          credit=credit if credit is not None else credit_method(args),
                          arena={"max_concurrent_games": 128}, ratings={"bt_bootstrap": 50}, progress=True)
    anchors = [] if args.pure else args.anchors.split(",")
    trainer = LeagueTrainer(config, opponents=[p for p in scripted_players() if p["id"] in anchors])
    evaluator = Evaluator(args.eval_games)
    lora, grpo = update_settings(args)
    trainer.train(engine, game(args), lora_config=lora, grpo_config=grpo, callbacks=[evaluator, *callbacks],
                  resume_from_checkpoint=args.resume)
    finish(trainer, evaluator, engine, figures, args)


if __name__ == "__main__":
    main()
