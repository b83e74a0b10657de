"""Shared set-up of the tic-tac-toe examples: tiny base, supervised warm-up, per-epoch evaluation."""

import json
from pathlib import Path

from autocurricula.eval.tictactoe import EpochEvaluator as Evaluator  # noqa: F401  (the examples import it here)
from autocurricula.eval.tictactoe import greedy_table
from autocurricula.games import tictactoe
from autocurricula.loop.bases import CACHE, TINY_HEADS as HEADS, tiny_base  # noqa: F401  (the examples import them here)
from autocurricula.training.warmup import sft_warmup


def warm_base(hidden: int = 128, layers: int = 2, heads: int = HEADS, steps: int = 400, seed: int = 0,
              progress: bool = False) -> Path:
    """``tiny_base`` after a supervised warm-up on random *legal* moves: it learns the prompt format
    and legality, not strategy. Both steps are cached by their arguments (``progress``: a bar)."""
    base = tiny_base(hidden, layers, heads, seed)
    return sft_warmup(base, CACHE / f"{base.name}-ttt-warm{steps}", tictactoe.warmup_examples(20000, seed),
                      steps=steps, batch_size=64, learning_rate=1e-3, seed=seed, progress=progress)


def base_figures(engine, games: int = 2000) -> dict:
    figures = tictactoe.evaluate_table(greedy_table(engine, None), games=games)
    return {k: round(v, 3) for k, v in figures.items()}


MIRROR_FIXED = ("learning_rate", "lr_schedule", "lr_decay_ratio", "beta")  # set by --credit mirror


def parse_args(doc: str, games_flag: str, games_default: int, output_dir: str, extra=None, argv=None,
               mirror: bool = False):
    """Command line shared by both examples (same defaults = same budget); ``extra(parser)`` adds
    an example's own flags; ``mirror``: whether ``--credit mirror`` (a self-play configuration) is
    allowed. ``argv``: the arguments (default: the command line's)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(games_flag, type=int, default=games_default)
    parser.add_argument("--output-dir", default=output_dir)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=128, help="tiny model width (the package default is 256)")
    parser.add_argument("--layers", type=int, default=2, help="tiny model depth (the package default is 4)")
    parser.add_argument("--heads", type=int, default=HEADS, help="attention heads (head size = hidden / heads); 32 "
                        "learns the board several times faster per step than 4 (research/README.md)")
    parser.add_argument("--credit", default="q", choices=["rae", "value", "q", "branch", "grpo", "constant", "mirror"],
                        help="credit assignment. Tabular (keyed by the exact prompt, for small board games): "
                        "'value' = per-move credit from a per-position value table, 'q' = from a (position, "
                        "move) table as well. No table: 'branch' = per-move credit from branch rollouts "
                        "(VinePPO-style), 'rae' = one baseline per role; 'mirror' (tictactoe_selfplay.py only) = "
                        "the mirror self-play configuration of the poker and matrix examples")
    parser.add_argument("--branch-samples", type=int, default=None, help="with --credit branch: branch games per "
                        "branched position (V(s) = their mean return; default 4); with --credit mirror: per listed "
                        "move and visit (default MirrorCredit's, 2)")
    parser.add_argument("--catch-up", action="store_true", help="with --credit mirror: a position met again after "
                        "k rounds takes the k mirror steps at once (MirrorVariantCredit(catch_up=True), "
                        "credit_variants.py)")
    parser.add_argument("--mirror-iterate", choices=["policy", "table"], default="policy", help="with --credit "
                        "mirror: where each step is taken from, the model's policy or a table of averaged move values "
                        "(MirrorVariantCredit(iterate=...), credit_variants.py)")
    parser.add_argument("--branch-turns", type=int, default=0, help="with --credit branch: learner turns branched "
                        "per game (0 = all)")
    parser.add_argument("--branch-advantage", default="return", choices=["return", "td", "moves"],
                        help="with --credit branch: A = G - V(s) ('return'), V(s') - V(s) ('td': TDBranchCredit, "
                        "credit_variants.py), or 'moves': "
                        "every free cell branched --branch-samples times, the policy regressed toward "
                        "softmax(Q / tau), bounded")
    parser.add_argument("--move-temperature", type=float, default=0.25, help="tau of --branch-advantage moves")
    parser.add_argument("--move-clip", type=float, default=2.0, help="bound on the centred target logit of moves")
    parser.add_argument("--move-loss", default="residual", choices=["residual", "cross_entropy"],
                        help="with --branch-advantage moves: the move turns' loss (BestReplyCredit.move_loss)")
    parser.add_argument("--branch-replies", action="store_true", help="with --branch-advantage moves: each move's "
                        "value is taken after the opponent's best reply, every reply played out (a one-ply search)")
    parser.add_argument("--branch-temperature", type=float, default=None, help="with --credit branch: sampling "
                        "temperature of the branch continuations (default: the games' 1.0; 0 = greedy)")
    parser.add_argument("--q-targets", type=float, default=1.0, help="with --credit q: also train every visited "
                        "position toward its best known move, advantage COEF x (score - V) "
                        "(QCredit.target_coef; 0 = off)")
    parser.add_argument("--q-backup", default="mean", choices=["mean", "minimax"], help="with --credit q: a "
                        "move's value is the mean of its results ('mean') or its worst known result, backed up "
                        "over the positions played ('minimax'; QCredit.backup)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--lr-schedule", default="constant",
                        choices=["constant", "linear", "cosine", "warmup_stable_decay"],
                        help="GRPOConfig.lr_scheduler_type over the run's epochs x rounds")
    parser.add_argument("--lr-decay-ratio", type=float, default=None, help="with --lr-schedule warmup_stable_decay: "
                        "the last share of the rounds over which the rate falls to 0 (constant before; default 0.25)")
    parser.add_argument("--warmup-steps", type=int, default=400, help="supervised warm-up steps on random legal moves")
    parser.add_argument("--eval-games", type=int, default=2000, help="evaluation games per opponent and epoch")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient to the base model")
    parser.add_argument("--num-iterations", type=int, default=1, help="passes over each round's turns")
    parser.add_argument("--steps-per-generation", type=int, default=1, help="optimizer steps per pass: the "
                        "round's turns split into this many slices")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its latest "
                        "checkpoint, up to --epochs (the same flags otherwise; the curve lists the epochs run now)")
    parser.add_argument("--openings", default="0-4", help="every training game starts after lo-hi random moves "
                        "(drawn per game), e.g. 0-4: positions a league alone rarely reaches")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if min(args.num_iterations, args.steps_per_generation) < 1:
        parser.error("--num-iterations and --steps-per-generation must be at least 1")
    if args.branch_samples is not None and (args.credit not in ("branch", "mirror") or args.branch_samples < 1):
        parser.error("--branch-samples (at least 1) sets the branch games of --credit branch or mirror: pick one "
                     "of them, or leave it out")
    if (args.catch_up or args.mirror_iterate != "policy") and args.credit != "mirror":
        parser.error("--catch-up and --mirror-iterate change --credit mirror's steps: add --credit mirror, or leave "
                     "them out")
    if args.credit == "mirror":
        if not mirror:
            parser.error("--credit mirror is a self-play configuration (no past or scripted players): run "
                         "examples/tictactoe_selfplay.py --credit mirror")
        fixed = [f"--{d.replace('_', '-')}" for d in MIRROR_FIXED if getattr(args, d) != parser.get_default(d)]
        if fixed:
            parser.error(f"{', '.join(fixed)}: --credit mirror sets the update (0.3 x 1e-2, or 1e-2 with --mirror-iterate "
                         "table; constant, no KL, as in the poker and matrix examples); leave them out, or pick "
                         "another --credit")
    try:
        args.openings = tuple(int(x) for x in args.openings.split("-"))
        assert len(args.openings) == 2
    except (ValueError, AssertionError):
        parser.error(f"--openings takes lo-hi, e.g. 0-4, got {args.openings!r}")
    if args.credit != "q":
        args.q_targets = 0.0  # the targets come from the (position, move) table of credit q
    if args.lr_schedule == "warmup_stable_decay" and args.lr_decay_ratio is None:
        args.lr_decay_ratio = 0.25
    return args


def credit_method(args):
    """The credit object of ``--credit`` and its options (the best-reply variant of branch credit
    when ``--branch-replies``, ``--branch-temperature`` or ``--move-loss cross_entropy`` asks for it)."""
    from autocurricula.credit import BranchCredit, ConstantCredit, GRPOCredit, QCredit, RAECredit, ValueCredit

    if args.credit == "mirror":
        from psro_matrix_games import mirror_credit

        # the poker and matrix examples' --credit mirror (and its --branch-samples)
        return mirror_credit(args.branch_samples, args.catch_up, args.mirror_iterate)
    if args.credit != "branch":
        simple = {"rae": RAECredit, "value": ValueCredit, "grpo": GRPOCredit, "constant": ConstantCredit}
        return QCredit(target_coef=args.q_targets, backup=args.q_backup) if args.credit == "q" \
            else simple[args.credit]()
    branch = dict(samples=4 if args.branch_samples is None else args.branch_samples, turns_per_game=args.branch_turns,
                  advantage=args.branch_advantage,
                  move_temperature=args.move_temperature, move_clip=args.move_clip)
    if args.branch_advantage == "td":
        from credit_variants import TDBranchCredit

        if args.branch_replies or args.move_loss != "residual":
            raise ValueError("--branch-replies and --move-loss shape the listed moves' values and targets: they need "
                             "--branch-advantage moves")
        del branch["advantage"]
        return TDBranchCredit(**branch, continuation_temperature=args.branch_temperature)
    if args.branch_replies or args.branch_temperature is not None or args.move_loss != "residual":
        from best_reply_credit import BestReplyCredit

        return BestReplyCredit(**branch, continuation_temperature=args.branch_temperature,
                               replies=args.branch_replies, move_loss=args.move_loss)
    return BranchCredit(**branch)


def game(args):
    """The tic-tac-toe ``play`` of the training games (with ``--openings``, after random moves)."""
    if args.openings == (0, 0):
        return tictactoe.play

    return OpeningGame(args.openings)


class OpeningGame:
    """Tic-tac-toe whose games start after random opening moves: a Game object (its moves are
    tic-tac-toe's, so branch credit's advantage="moves" can branch them)."""

    NUM_PLAYERS, ZERO_SUM = tictactoe.NUM_PLAYERS, tictactoe.ZERO_SUM
    random_policy = staticmethod(tictactoe.random_policy)
    moves = staticmethod(tictactoe.moves)

    def __init__(self, openings):
        self.openings = openings

    async def play(self, players, model, tokenizer=None):
        return await tictactoe.play(players, model, tokenizer, opening_moves=self.openings)


def start(args):
    """The warm base in an engine, and its figures before any league training; says where the run
    goes and times the steps before the first round."""
    import time

    from autocurricula.engine import Engine

    t0 = time.perf_counter()
    base = warm_base(hidden=args.hidden, layers=args.layers, heads=args.heads, steps=args.warmup_steps, seed=args.seed,
                     progress=True)
    print(f"base model: {base} (the warmed tiny model, cached); the run goes to {args.output_dir}", flush=True)
    engine = Engine(str(base), name=str(base))
    print(f"evaluating the warm base: {args.eval_games} greedy games each against uniform random and minimax "
          "(the same evaluation follows every epoch) ...", flush=True)
    t1 = time.perf_counter()
    figures = base_figures(engine, args.eval_games)
    print(f"warm-up {t1 - t0:.0f} s, evaluation {time.perf_counter() - t1:.0f} s", flush=True)
    print("warm-up base:", json.dumps(figures), flush=True)
    return engine, figures


def scripted_players() -> list[dict]:
    return [{"id": "random", "role": "random", "policy": tictactoe.random_policy},
            {"id": "minimax", "role": "minimax", "policy": tictactoe.minimax_policy}]


def update_settings(args):
    """LoRA and GRPO settings shared by both examples, so they compare on the same budget."""
    from autocurricula import GRPOConfig
    from autocurricula.engine import LoraSpec

    return (LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
            GRPOConfig(learning_rate=args.learning_rate, lr_scheduler_type=args.lr_schedule,
                       lr_decay_ratio=args.lr_decay_ratio, beta=args.beta, loss_type="grpo", temperature=1.0,
                       num_iterations=args.num_iterations, steps_per_generation=args.steps_per_generation))


def finish(trainer, evaluator, engine, figures, args) -> None:
    """Prints the leaderboard, then the final JSON line: the last epoch's figures (with the exact best
    response's verdict as X and as O), the run's credit and update settings, the scripted players and the
    per-epoch curve."""
    print(trainer.leaderboard)
    engine.close()
    summary = evaluator.summary(trainer, figures)
    from autocurricula.credit import BranchCredit

    credit = trainer.credit  # the credit the run trained with (a caller may pass its own object)
    summary.update(credit=args.credit, credit_class=type(credit).__name__,
                   branch_samples=credit.samples if isinstance(credit, BranchCredit) else None,
                   num_iterations=args.num_iterations, steps_per_generation=args.steps_per_generation,
                   scripted=[p["id"] for p in trainer.opponents])  # the pool's scripted players
    summary["curve"] = [{k: row[k] for k in ("epoch", "minutes", "optimal_move_rate", "loses_to_best_response_as_x",
                                             "loses_to_best_response_as_o", "value_losing_share")}
                        for row in evaluator.rows]
    print(json.dumps(summary))
