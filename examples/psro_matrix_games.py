"""PSRO on random zero-sum matrix games, beside self-play and fictitious play on the same budget.

    python examples/psro_matrix_games.py                    # 20 games, seed 0 (see the time below)
    python examples/psro_matrix_games.py --games 4 --rounds 4 --smoke
    python examples/psro_matrix_games.py --trainers psro --credit moves --restart-rounds 0   # per-move credit
    python examples/psro_matrix_games.py --trainers psro --credit pooled --restart-rounds 0 --responder-pairs --steps-per-generation 4
    python examples/psro_matrix_games.py --trainers selfplay --credit mirror --steps-per-generation 4

Each game (``games.matrix.random_game``: 2 to 5 actions per seat, payoffs in [-1, 1]) is played
by the tiny model with one word per seat. The base model gets a supervised warm-up on the family's
prompts with uniform legal words (the format, no strategy; cached), and every trainer starts from
it with its *default* settings: nothing is tuned per game. Each trainer plays the same number of
games per round (128; ``--games-per-round`` changes self-play's and fictitious play's only) for the
same rounds:

* ``PSROTrainer``: one responder (64 games against the meta-strategy) and 64 evaluation games
  between population members;
* ``SelfPlayTrainer``: 128 games of the learner against itself and its past snapshots;
* ``FictitiousPlayTrainer``: 128 games of the learner against its past, by PFSP.

After the last round each trainer's ``deployable_mixture()`` is scored as played
(``autocurricula.eval.matrix``): every player's exact reply distribution at the sampling
temperature, invalid replies forfeiting, against exact best responses. The figure is the
exploitability as a share of the game's payoff range (0 = an equilibrium). One JSON line per game
and trainer, then a summary: median and worst over the games, and the invalid rate. A
progress bar on stderr counts the runs, with their rate and the time left.

Time on 2 idle cores: about 40 s per game and trainer (96 rounds), plus a one-time warm-up.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.credit import BranchCredit, MirrorCredit
from autocurricula import FictitiousPlayTrainer, PSROTrainer, SelfPlayTrainer
from autocurricula.eval.matrix import figures, read_policy
from autocurricula.games.matrix import random_game
from tqdm.auto import tqdm

TRAINERS = {"psro": PSROTrainer, "selfplay": SelfPlayTrainer, "fictitious": FictitiousPlayTrainer}
GAMES_PER_ROUND = 128
LEARNING_RATE = 1e-2  # every trainer's on every game: the tiny model's rate (GRPOConfig's 1e-4 is for real models)


def pooled_credit(samples: int | None = None):
    """Per-move targets valued per prompt (``pool_states``), sharp (tau 0.1, c 3), trained by
    cross-entropy so that the listed moves keep their mass (``examples/best_reply_credit.py``);
    ``samples`` branch games per move (default 2)."""
    from best_reply_credit import BestReplyCredit

    return BestReplyCredit(advantage="moves", samples=samples or 2, move_loss="cross_entropy", move_temperature=0.1,
                           move_clip=3.0, pool_states=True)


def mirror_credit(samples: int | None = None, catch_up: bool = False, iterate: str = "policy"):
    """Per-move targets valued per prompt, each round one step of magnetic mirror descent (a share
    0.045 of the way, in log-probabilities) toward softmax(Q / 0.15), by cross-entropy. With it,
    self-play plays only its current policy (``past_share=0``) and deploys the average of its last
    third of epochs' iterates (``average_last``), and every trainer learns at ``MIRROR_RATE_SHARE``
    of the shared rate (``grpo_settings``). ``samples``: branch games per move (default
    MirrorCredit's); ``catch_up``: a position met again after k rounds takes k steps; ``iterate``: steps
    from the model's policy or from a table of averaged values (both ``MirrorVariantCredit``,
    examples/credit_variants.py)."""
    # its defaults: samples=2, move_temperature=0.075 (of a seat's normalised range [-1, 1]), no bound, pooled, step=0.045
    own = {} if samples is None else {"samples": samples}
    if not catch_up and iterate == "policy":
        return MirrorCredit(**own)
    from credit_variants import MirrorVariantCredit

    return MirrorVariantCredit(catch_up=catch_up, iterate=iterate, **own)


CREDITS = {"rae": lambda samples: "rae", "moves": lambda samples: BranchCredit(advantage="moves", samples=samples or 2),
           "pooled": pooled_credit, "mirror": mirror_credit}  # each takes --branch-samples (None: its own)


def add_credit_options(p: argparse.ArgumentParser) -> None:
    """``--credit``, ``--restart-rounds``, ``--responder-pairs``, ``--steps-per-generation``,
    ``--num-iterations``, ``--branch-samples`` and ``--games-per-round``, shared with ``psro_kuhn.py``
    and ``psro_leduc.py``."""
    p.add_argument("--credit", choices=sorted(CREDITS), default="rae", help="every trainer's credit: the default "
                   "'rae', 'moves' (BranchCredit(advantage='moves', samples=2), per-move targets), 'pooled' "
                   "(per-move targets valued per prompt, tau 0.1, c 3, cross-entropy: pooled_credit) or 'mirror' "
                   "(mirror-descent steps toward pooled targets, tau 0.15; self-play then plays no past "
                   "snapshot and deploys its last third of epochs' iterates, equally weighted; every trainer's "
                   "learning rate is 0.3 times the shared one, or the shared one with --mirror-iterate table: mirror_credit)")
    p.add_argument("--restart-rounds", type=int, default=None, help="PSRO's restart_rounds (default: PSRORules')")
    p.add_argument("--responder-pairs", action="store_true", help="PSRO's responder_pairs: its responder's "
                   "games as duplicate pairs")
    p.add_argument("--steps-per-generation", type=int, default=1, help="every trainer's optimizer steps per pass "
                   "over the round's turns (GRPOConfig.steps_per_generation)")
    p.add_argument("--num-iterations", type=int, default=1, help="every trainer's passes over each round's turns "
                   "(GRPOConfig.num_iterations)")
    p.add_argument("--branch-samples", type=int, default=None, help="with --credit moves, pooled or mirror: branch "
                   "games per listed move and visit (default: the credit's own, 2)")
    p.add_argument("--games-per-round", type=int, default=GAMES_PER_ROUND, help="self-play's and fictitious play's "
                   "games a round (PSRO's responders have their own)")
    p.add_argument("--catch-up", action="store_true", help="with --credit mirror: a position met again after k rounds "
                   "takes the k mirror steps at once (MirrorVariantCredit(catch_up=True), credit_variants.py)")
    p.add_argument("--mirror-iterate", choices=["policy", "table"], default="policy", help="with --credit mirror: "
                   "where each step is taken from, the model's policy or a table of averaged move values "
                   "(MirrorVariantCredit(iterate=...), credit_variants.py)")


def check_credit_options(p: argparse.ArgumentParser, args) -> argparse.Namespace:
    """Refuses what ``add_credit_options`` cannot combine, naming the fix; returns ``args``."""
    if (args.catch_up or args.mirror_iterate != "policy") and args.credit != "mirror":
        p.error("--catch-up and --mirror-iterate change --credit mirror's steps: add --credit mirror, or leave "
                "them out")
    if args.branch_samples is not None and args.credit == "rae":
        p.error("--branch-samples sets the branch games of --credit moves, pooled or mirror: pick one of them, "
                "or leave it out")
    if (args.branch_samples is not None and args.branch_samples < 1) or min(args.games_per_round,
                                                                            args.num_iterations) < 1:
        p.error("--branch-samples, --games-per-round and --num-iterations must be at least 1")
    if args.games_per_round != GAMES_PER_ROUND and not {"selfplay", "fictitious"} & set(args.trainers.split(",")):
        p.error("--games-per-round sets self-play's and fictitious play's games (PSRO's responders have their "
                "own): add --trainers selfplay or fictitious, or leave it out")
    return args


def credit_settings(name: str, args, rules: dict | None = None) -> dict:
    """The trainer's config fields that ``--credit``, ``--restart-rounds`` and ``--responder-pairs`` set:
    ``credit`` and ``rules``, the league's own settings, with ``rules`` added (``--credit mirror`` also
    sets self-play's ``past_share`` to 0 and ``average_last`` to a third of the epochs: it deploys the
    average of the last third of the epochs' iterates)."""
    own = {"restart_rounds": args.restart_rounds} if name == "psro" and args.restart_rounds is not None else {}
    if name == "psro" and args.responder_pairs:
        own["responder_pairs"] = True
    if name == "selfplay" and args.credit == "mirror":
        own["past_share"] = 0.0  # mirror descent steps from the policy that played: no past snapshots
        own["average_last"] = max(1, args.epochs // 3)  # deploys the average of the last third's iterates
    credit = mirror_credit(args.branch_samples, args.catch_up, args.mirror_iterate) if args.credit == "mirror" \
        else CREDITS[args.credit](args.branch_samples)
    return {"credit": credit, "rules": {**own, **(rules or {})}}


def run_settings(args) -> dict:
    """What ``add_credit_options``'s flags chose, for the final JSON line (``branch_samples``: the
    credit's branch games per move, None for "rae"; ``games_per_round``: self-play's and fictitious
    play's)."""
    credit = CREDITS[args.credit](args.branch_samples)
    return {"credit": args.credit, "restart_rounds": args.restart_rounds, "responder_pairs": args.responder_pairs,
            "steps_per_generation": args.steps_per_generation, "num_iterations": args.num_iterations,
            "catch_up": args.catch_up, "mirror_iterate": args.mirror_iterate,
            "branch_samples": None if isinstance(credit, str) else credit.samples, "games_per_round": args.games_per_round}


# AdamW's step, not the small mirror target, sets how far an update moves the policy: steps taken from the
# policy need a lower rate; steps kept in a table (--mirror-iterate table) leave the model to follow its targets
MIRROR_RATE_SHARE = {"policy": 0.3, "table": 1.0}


def grpo_settings(args, learning_rate: float) -> dict:
    """Every trainer's GRPO settings: the shared learning rate (``MIRROR_RATE_SHARE`` of it with
    ``--credit mirror``, by ``--mirror-iterate``), ``--steps-per-generation`` and ``--num-iterations``."""
    rate = learning_rate * (MIRROR_RATE_SHARE[args.mirror_iterate] if args.credit == "mirror" else 1)
    return {"learning_rate": rate, "steps_per_generation": args.steps_per_generation,
            "num_iterations": args.num_iterations}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", type=int, default=20, help="random games random-0 ... random-(N-1)")
    p.add_argument("--first-game", type=int, default=0)
    p.add_argument("--trainers", default="psro,selfplay,fictitious")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--rounds", type=int, default=8, help="rounds per epoch")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--warmup-steps", type=int, default=150)
    p.add_argument("--learning-rate", type=float, default=LEARNING_RATE, help="every trainer's, on every game (the "
                   "tiny model's rate, as in the other examples; GRPOConfig's 1e-4 default is for real models)")
    p.add_argument("--seed", type=int, default=0)
    add_credit_options(p)
    p.add_argument("--output", default=None, help="append the JSON lines to this file")
    p.add_argument("--smoke", action="store_true", help="a tiny budget, to check that it runs")
    args = check_credit_options(p, p.parse_args(argv))
    if args.smoke:
        args.epochs, args.rounds, args.hidden, args.layers, args.warmup_steps = 1, 2, 32, 1, 20
    return args


def warm_base(args) -> Path:
    """The tiny base after the family's format warm-up (both cached by their arguments)."""
    from autocurricula.training.warmup import sft_warmup
    from ttt_common import CACHE, tiny_base

    base = tiny_base(args.hidden, args.layers, args.heads, args.seed)
    examples = [ex for g in range(64) for ex in random_game(10_000 + g).warmup_examples(200, seed=args.seed + g)]
    return sft_warmup(base, CACHE / f"{base.name}-matrix-warm{args.warmup_steps}", examples,
                      steps=args.warmup_steps, batch_size=64, learning_rate=2e-3, seed=args.seed)


def config_for(name: str, args, out: str):
    cls = TRAINERS[name].config_class
    own = {} if name == "psro" else {"games_per_round": args.games_per_round}
    return cls(epochs=args.epochs, rounds=args.rounds, seed=args.seed, output_dir=out, progress=False,
               save_strategy="no", **credit_settings(name, args, own))


def run_one(name: str, game, base: Path, args) -> dict:
    with tempfile.TemporaryDirectory() as out:
        trainer = TRAINERS[name](config_for(name, args, out))
        t0 = time.perf_counter()
        trainer.train(str(base), game, grpo_config=grpo_settings(args, args.learning_rate))
        seconds = time.perf_counter() - t0
        weights = trainer.deployable_mixture()
        temperature = trainer.run.grpo.temperature
        policies = {pid: read_policy(trainer.engine, pid, game, temperature=temperature) for pid in weights}
        row = {"game": game.name, "shape": list(game.shape), "trainer": name, "seed": args.seed,
               **{k: round(v, 4) for k, v in figures(game, policies, weights).items()},
               "players": len(trainer.players), "mixture": {k: round(v, 3) for k, v in weights.items()},
               "seconds": round(seconds, 1)}
        trainer.engine.close()
    return row


def summary(rows: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["trainer"] for r in rows):
        share = [r["exploitability_share"] for r in rows if r["trainer"] == name]
        invalid = [r["invalid_rate"] for r in rows if r["trainer"] == name]
        out[name] = {"games": len(share), "median": round(statistics.median(share), 4), "worst": round(max(share), 4),
                     "invalid_rate_max": round(max(invalid), 4)}
    return out


def main(argv=None):
    args = parse_args(argv)
    base = warm_base(args)
    rows = []
    runs = [(g, name) for g in range(args.first_game, args.first_game + args.games) for name in args.trainers.split(",")]
    bar = tqdm(runs, desc="games x trainers", unit="run", file=sys.stderr)  # rate and time left on stderr
    for g, name in bar:
        game = random_game(g)
        bar.set_postfix_str(f"{game.name} {name}")
        row = run_one(name, game, base, args)
        rows.append(row)
        tqdm.write(json.dumps(row), file=sys.stdout)
        if args.output:
            with open(args.output, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    print(json.dumps({"summary": summary(rows), "epochs": args.epochs, "rounds": args.rounds,
                      "seed": args.seed, **run_settings(args)}))


if __name__ == "__main__":
    main()
