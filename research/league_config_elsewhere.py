"""The tic-tac-toe league's configuration on Kuhn poker and on the random matrix games: does the
default example's recipe carry to games it was not tuned on?

    python research/league_config_elsewhere.py --game kuhn --seed 0            # 13 - 15 minutes beside a run
    python research/league_config_elsewhere.py --game matrix --seed 0 --games 5  # about 2.5 minutes a game

The settings are ``examples/tictactoe_league.py``'s (its ``set_defaults`` and ``ttt_common``'s
update): credit ``QCredit(target_coef=1.0)`` (``--mirror-step W``: ``MirrorCredit(step=W)``, branch
values), 4 optimizer steps a round, rate 2e-3 with the last quarter of the rounds decayed to 0, β 0,
LoRA r = 8 on all linears, one main exploiter and one league exploiter, AlphaStar's shares. What
differs: the backup is ``"mean"`` (the minimax backup assumes no chance and no hidden cards); no
scripted players, so no anchor games, unless ``--random-anchor`` gives the pool the game's random
player (``random_policy``) with half of the main agent's games against it, as the example does;
snapshots come at ``LeagueConfig``'s cadence (every 2 - 4 rounds; the example's is at most two an
epoch, ``--snapshot-min-rounds 4 --snapshot-max-rounds 8`` at 8 rounds); the completion limit,
the arena's concurrency and the rating bootstrap are the library's defaults. The budget is the
families' rounds (``examples/psro_kuhn.py``, ``examples/psro_matrix_games.py``): 12 epochs × 8
rounds, 128 main-agent games a round and the example's one-eighth of that for each exploiter (16),
so 160 games a round over three learners. Each family's cached warm base (base seed 0 for Kuhn,
``--seed`` for the matrix games). The deployed policy is ``trainer.deployable_mixture()``,
scored as played, as in those examples: Kuhn after every epoch (chips per hand, with the live main
agent alone, the uniform average of its snapshots and that of its last four epochs beside it,
``MainAgentFigures``, and the exact Nash over every trained player, ``PopulationNash``, a diagnostic),
each matrix game after its last round (share of the payoff range). ``--loss-type`` swaps the example's
``"grpo"`` loss. JSON lines; the last is a summary. Progress
bars on stderr show the rate and the time left (rounds and epochs for Kuhn, games for the matrix).
"""

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # research/: soft_targets

import autocurricula  # noqa: E402,F401  (fast BLAS before mlx)
import numpy as np  # noqa: E402
from autocurricula import LeagueConfig, LeagueTrainer  # noqa: E402
from autocurricula.credit import MirrorCredit, QCredit  # noqa: E402
from autocurricula.eval.players import main_agent  # noqa: E402
from soft_targets import AnchorGames, ListedMoves, SoftQCredit, add_flags, check_flags  # noqa: E402
from ttt_common import parse_args as ttt_args  # noqa: E402
from ttt_common import update_settings  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

# tictactoe_league.py's defaults (its set_defaults), the backup aside: mean, for chance and hidden cards
TTT_LEAGUE_FLAGS = ["--credit", "q", "--q-backup", "mean", "--steps-per-generation", "4",
                    "--lr-schedule", "warmup_stable_decay"]
ANCHOR_SHARE = 0.5  # tictactoe_league.py's --anchor-share: the main agent's games against the random player


def credit(args, ttt):
    """The league's credit: the example's q targets on the value table, their soft form
    (``--soft-targets``), or branch values with mirror targets (``--mirror-step``)."""
    if args.mirror_step is not None:
        return MirrorCredit(step=args.mirror_step,
                            **({} if args.branch_samples is None else {"samples": args.branch_samples}))
    table = {"alpha": args.alpha} if args.alpha is not None else {}  # None: ValueCredit's
    table.update({"per_player": True} if args.per_player else {})
    if args.soft_targets is None:
        return QCredit(target_coef=ttt.q_targets, backup=ttt.q_backup, **table)
    return SoftQCredit(args.soft_targets, args.targets_only, args.anchor_off_table, args.off_target, args.round_step,
                       args.listed, target_coef=ttt.q_targets, backup=ttt.q_backup, **table)


def league(args, out: str, game, progress: bool = False) -> tuple[LeagueTrainer, dict]:
    """The trainer and its ``train`` keywords (``lora_config``, ``grpo_config``, ``callbacks``); ``progress``: its bars.
    With ``args.random_anchor`` the game's random player joins the pool as the example's anchor."""
    ttt = ttt_args(__doc__, "--games-per-learner", 256, out, argv=TTT_LEAGUE_FLAGS)
    lora, grpo = update_settings(ttt)
    if args.loss_type is not None:
        grpo = dataclasses.replace(grpo, loss_type=args.loss_type)
    shares = {} if args.selfplay_share is None else {"selfplay_share": args.selfplay_share,
                                                      "pfsp_share": min(0.5, 1 - args.selfplay_share)}
    snapshots = {"snapshot_min_rounds": args.snapshot_min_rounds, "snapshot_max_rounds": args.snapshot_max_rounds}
    config = LeagueConfig(epochs=args.epochs, rounds=args.rounds, seed=args.seed, output_dir=out, save_strategy="no",
                          progress=progress,
                          rules={"main_exploiters": 1, "league_exploiters": 1,
                                 "games_per_learner": args.games_per_round,
                                 "exploiter_games": args.exploiter_games or max(1, args.games_per_round // 8),
                                 **{k: v for k, v in snapshots.items() if v is not None},  # None: LeagueRules'
                                 **shares,
                                 "anchor_share": ANCHOR_SHARE if args.random_anchor else 0.0},
                          credit=credit(args, ttt),
                          **({"ratings": {"meta_z": args.meta_z}} if args.meta_z is not None else {}))
    anchors = [{"id": "random", "role": "random", "policy": game.random_policy}] if args.random_anchor else []
    callbacks = ([AnchorGames()] if args.anchor_off_table else []) + ([ListedMoves(game)] if args.listed else [])
    return LeagueTrainer(config, opponents=anchors), {"lora_config": lora, "grpo_config": grpo, "callbacks": callbacks}


def kuhn(args) -> dict:
    from autocurricula.games import kuhn_poker
    from kuhn_league import parse_args as kuhn_args
    from kuhn_league import warm_base
    from psro_kuhn import played_figures

    base = warm_base(kuhn_args(["--seed", "0"] + (["--smoke"] if args.smoke else [])))
    figures = played_figures("league_q", args.seed)  # prints a JSON line per epoch
    main, population = MainAgentFigures(figures), PopulationNash(figures)
    with tempfile.TemporaryDirectory() as out:
        trainer, keywords = league(args, out, kuhn_poker, progress=True)  # rounds and epochs, with the time left
        trainer.train(str(base), kuhn_poker, callbacks=[figures, main, population, *keywords.pop("callbacks")], **keywords)
        trainer.engine.close()
    return {"final": figures.rows[-1], "main_agent": main.rows[-1], "population_nash": population.rows[-1]}


class MainAgentFigures:
    """Per epoch, beside the deployed mixture: the live main agent alone (with its P(bet or call) per
    information set), the uniform average of its snapshots, and the uniform average of the live main
    agent after this and the last ``last`` - 1 epochs (as mirror self-play deploys its iterates), each
    scored as played (the mixture's reader and scorer, ``figures``)."""

    def __init__(self, figures, last: int = 4):
        self.figures, self.rows, self.cache, self.last, self.recent = figures, [], {}, last, []

    def __call__(self, trainer) -> dict:
        f, temperature = self.figures, trainer.run.grpo.temperature
        main = main_agent(trainer)
        snapshots = [p["id"] for p in trainer.players if p.get("snapshot_of") == main]
        for pid in snapshots:
            if pid not in self.cache:  # frozen: read once
                self.cache[pid] = f.read(trainer.engine, pid, temperature)[0]
        played = f.read(trainer.engine, main, temperature)[0]
        alone = f.score(f.mixture([played], [1.0]))
        row = {"epoch": trainer.current_epoch, "main_agent": {k: round(float(v), 4) for k, v in alone.items()},
               # P(bet or call) per information set: a set near 0 or 1 no longer samples its other move
               "main_agent_policy": {k: round(float(agg), 3) for k, (agg, _) in played.items()},
               "snapshots": len(snapshots)}
        if snapshots:
            avg = f.score(f.mixture([self.cache[s] for s in snapshots], [1.0 / len(snapshots)] * len(snapshots)))
            row["snapshot_average"] = {k: round(float(v), 4) for k, v in avg.items()}
        self.recent = [*self.recent, played][-self.last:]
        recent = f.score(f.mixture(self.recent, [1.0 / len(self.recent)] * len(self.recent)))
        row["last_epochs_average"] = {"epochs": len(self.recent), **{k: round(float(v), 4) for k, v in recent.items()}}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        return {}


class PopulationNash:
    """A diagnostic per epoch, not a deployable policy: the Nash mixture of every trained player (frozen
    ones read once, live learners each epoch, with ``figures``' reader) on their exact chip meta-game
    (``chip_payoffs`` of their legal replies renormalised: the game's values are known here, a league's
    are not), scored as played with the invalid replies; beside it, its weight on the live main agent
    and its support (weights above 0.01). Were the league's meta-solver exact, this is what it would deploy.
    Also the least exploitable mixture of the same players (``least_exploitable_mixture``, on their legal
    replies), scored as played: no meta-solver over this population could deploy better."""

    def __init__(self, figures):
        self.figures, self.cache, self.rows = figures, {}, []

    def __call__(self, trainer) -> dict:
        from autocurricula.eval.kuhn import INFOSETS, least_exploitable_mixture, meta_mixture
        from autocurricula.records import is_scripted

        f, temperature = self.figures, trainer.run.grpo.temperature
        players = [p for p in trainer.players if not is_scripted(p)]
        for p in players:
            if p["frozen"] and p["id"] not in self.cache:
                self.cache[p["id"]] = f.read(trainer.engine, p["id"], temperature)[0]
        played = [self.cache[p["id"]] if p["frozen"] else f.read(trainer.engine, p["id"], temperature)[0]
                  for p in players]
        legal = [{k: min(1.0, s[k][0] / max(1e-12, 1 - s[k][1])) for k in INFOSETS} for s in played]
        x = meta_mixture(legal, meta="chips")
        main = [p["id"] for p in players].index(main_agent(trainer))
        score = f.score(f.mixture(played, [float(v) for v in x]))
        best = least_exploitable_mixture(legal)[0]
        best_score = f.score(f.mixture(played, [float(v) for v in best]))
        row = {"epoch": trainer.current_epoch,
               "population_nash": {**{k: round(float(v), 4) for k, v in score.items()},
                                   "on_live_main": round(float(x[main]), 3), "support": int((x > 0.01).sum()),
                                   "players": len(players)},
               "least_exploitable": {**{k: round(float(v), 4) for k, v in best_score.items()},
                                     "on_live_main": round(float(best[main]), 3),
                                     "support": int((best > 0.01).sum())}}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        return {}


def replies(trainer, game, top: int = 8) -> list[dict]:
    """Per seat, the live main agent's probability of each word and of an invalid reply, and its
    ``top`` most likely next tokens (an invalid reply's mass, token by token)."""
    from autocurricula.eval.matrix import read_policy

    engine, main, temperature = trainer.engine, main_agent(trainer), trainer.run.grpo.temperature
    out = []
    for seat, probs in enumerate(read_policy(engine, main, game, temperature=temperature)):
        logits = np.asarray(engine.logits(engine.encode(game.prompt(seat)), main), dtype=np.float64)[-1] / temperature
        p = np.exp(logits - logits.max())
        p /= p.sum()
        out.append({"words": {w: round(float(x), 3) for w, x in zip(game.words[seat], probs)},
                    "invalid": round(float(probs[-1]), 3),
                    "top_tokens": [[engine.tokenizer.decode([int(t)]), round(float(p[t]), 3)]
                                   for t in [t for t in np.argsort(-p) if t < len(engine.tokenizer)][:top]]})
    return out


def matrix(args) -> dict:
    import psro_matrix_games
    from autocurricula.eval.matrix import figures, read_policy
    from autocurricula.games.matrix import random_game

    smoke = ["--smoke"] if args.smoke else []
    base = psro_matrix_games.warm_base(psro_matrix_games.parse_args(["--seed", str(args.seed), *smoke]))
    rows = []
    bar = tqdm(range(args.first_game, args.first_game + args.games), desc="matrix games", unit="game",
               file=sys.stderr)  # the rate and the time left
    for g in bar:
        game = random_game(g)
        with tempfile.TemporaryDirectory() as out:
            trainer, keywords = league(args, out, game)
            t0 = time.perf_counter()
            trainer.train(str(base), game, **keywords)
            weights = trainer.deployable_mixture()
            policies = {pid: read_policy(trainer.engine, pid, game, temperature=trainer.run.grpo.temperature)
                        for pid in weights}
            row = {"game": game.name, "shape": list(game.shape), "seed": args.seed,
                   **{k: round(v, 4) for k, v in figures(game, policies, weights).items()},
                   "players": len(trainer.players), "mixture": {k: round(v, 3) for k, v in weights.items()},
                   "seconds": round(time.perf_counter() - t0, 1)}
            if args.replies:
                row["main_agent_replies"] = replies(trainer, game)
            trainer.engine.close()
        rows.append(row)
        tqdm.write(json.dumps(row), file=sys.stdout)
    share = [r["exploitability_share"] for r in rows]
    return {"median": statistics.median(share), "worst": max(share),
            "invalid_rate_max": max(r["invalid_rate"] for r in rows)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", choices=["kuhn", "matrix"], required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--rounds", type=int, default=8, help="rounds per epoch")
    p.add_argument("--games-per-round", type=int, default=128, help="the main agent's (each exploiter: an eighth)")
    p.add_argument("--exploiter-games", type=int, default=None, metavar="N", help="each exploiter's games a round "
                   "(default: an eighth of --games-per-round, the example's share)")
    p.add_argument("--games", type=int, default=20, help="with --game matrix: random-F ... random-(F+N-1)")
    p.add_argument("--first-game", type=int, default=0)
    p.add_argument("--snapshot-min-rounds", type=int, default=None, help="default: LeagueRules' (2); the "
                   "example takes max(4, rounds // 2), at most two snapshots an epoch")
    p.add_argument("--snapshot-max-rounds", type=int, default=None, help="default: LeagueRules' (4); the "
                   "example takes max(8, rounds)")
    p.add_argument("--random-anchor", action="store_true", help="the game's random player in the pool, with "
                   "the example's share of the main agent's games against it (ANCHOR_SHARE)")
    p.add_argument("--soft-targets", type=float, default=None, metavar="TAU", help="target turns toward "
                   "softmax(Q / TAU) over the known moves instead of the best known move (SoftQCredit)")
    p.add_argument("--mirror-step", type=float, default=None, metavar="W", help="the credit is MirrorCredit "
                   "(branch values of every listed move, pooled per prompt; targets one mirror step W from the policy "
                   "toward softmax(Q / 0.15); 1: the target itself) in place of the value table's q targets")
    p.add_argument("--branch-samples", type=int, default=None, metavar="K", help="with --mirror-step: branch games "
                   "per listed move and visit (default MirrorCredit's 2)")
    p.add_argument("--meta-z", type=float, default=None, metavar="Z", help="the deployed mixture's meta-solver "
                   "takes each relative-payoff entry at mean - Z x its standard error (default RatingConfig's 1.0; "
                   "0: the means)")
    add_flags(p)  # --targets-only, --off-target, --round-step, --listed: with --soft-targets
    p.add_argument("--anchor-off-table", action="store_true", help="with --soft-targets and --random-anchor: "
                   "the games against the random player stay out of the value table (SoftQCredit.anchor_games)")
    p.add_argument("--alpha", type=float, default=None, help="the value table's running-mean floor (ValueCredit."
                   "alpha; default its 0.95: each (state, move) value averages about its last 20 outcomes)")
    p.add_argument("--per-player", action="store_true", help="a value table per learner (ValueCredit.per_player; "
                   "default one table that every learner's games update)")
    p.add_argument("--selfplay-share", type=float, default=None, help="the main agent's share of self-play (PFSP "
                   "over past players takes min(0.5, the rest), verification games what is left; default "
                   "LeagueRules' 0.35 and 0.5)")
    p.add_argument("--loss-type", choices=["grpo", "bnpo", "dr_grpo", "dapo"], default=None, help="GRPOConfig."
                   "loss_type (default the example's 'grpo': each sampled reply's tokens averaged, so its weight falls "
                   "with its length; the credit's target turns weigh alike)")
    p.add_argument("--replies", action="store_true", help="with --game matrix: each game's row also gives the live "
                   "main agent's word and invalid probabilities per seat and its most likely next tokens")
    p.add_argument("--smoke", action="store_true", help="a tiny budget and model, to check that it runs")
    args = p.parse_args(argv)
    if args.soft_targets is not None and not args.soft_targets > 0:
        p.error(f"--soft-targets takes a temperature above 0, got {args.soft_targets}")
    if args.selfplay_share is not None and not 0 <= args.selfplay_share <= 1:
        p.error(f"--selfplay-share takes a share in [0, 1], got {args.selfplay_share}")
    if args.alpha is not None and not 0 <= args.alpha < 1:
        p.error(f"--alpha takes a running-mean floor in [0, 1), got {args.alpha}")
    check_flags(p, args)
    if args.meta_z is not None and not args.meta_z >= 0:
        p.error(f"--meta-z takes a number of standard errors >= 0, got {args.meta_z}")
    if args.branch_samples is not None and args.mirror_step is None:
        p.error("--branch-samples sets --mirror-step's branch games per move: add --mirror-step W")
    if args.branch_samples is not None and args.branch_samples < 1:
        p.error(f"--branch-samples takes at least 1 branch game per move, got {args.branch_samples}")
    if args.mirror_step is not None:
        if not 0 < args.mirror_step <= 1:
            p.error(f"--mirror-step takes a step in (0, 1], got {args.mirror_step}")
        table_flags = {"--soft-targets": args.soft_targets is not None, "--alpha": args.alpha is not None,
                       "--per-player": args.per_player}
        if any(table_flags.values()):
            p.error(f"{', '.join(k for k, v in table_flags.items() if v)} set the value table's credit, which "
                    "--mirror-step replaces: drop one or the other")
    soft = {"--targets-only": args.targets_only, "--anchor-off-table": args.anchor_off_table,
            "--round-step": args.round_step is not None, "--listed": args.listed}
    if args.soft_targets is None and any(soft.values()):
        p.error(f"{', '.join(k for k, v in soft.items() if v)} change soft targets' credit: add --soft-targets TAU")
    if args.replies and args.game != "matrix":
        p.error("--replies reads the matrix games' one-word replies: use it with --game matrix")
    if args.anchor_off_table and not args.random_anchor:
        p.error("--anchor-off-table keeps the random player's games out of the table: add --random-anchor")
    if args.exploiter_games is not None and args.exploiter_games < 1:
        p.error(f"--exploiter-games takes 1 or more games a round, got {args.exploiter_games}")
    if args.smoke:
        args.epochs, args.rounds, args.games_per_round, args.games = 1, 2, 8, 1
    summary = kuhn(args) if args.game == "kuhn" else matrix(args)
    print(json.dumps({"summary": summary, "game": args.game, "seed": args.seed, "epochs": args.epochs,
                      "rounds": args.rounds, "games_per_round": args.games_per_round,
                      "exploiter_games": args.exploiter_games,
                      "random_anchor": args.random_anchor, "meta_z": args.meta_z, "mirror_step": args.mirror_step,
                      "branch_samples": args.branch_samples,
                      "soft_targets": args.soft_targets, "targets_only": args.targets_only,
                      "off_target": args.off_target, "round_step": args.round_step, "listed": args.listed,
                      "replies": args.replies, "anchor_off_table": args.anchor_off_table, "alpha": args.alpha,
                      "per_player": args.per_player, "selfplay_share": args.selfplay_share,
                      "loss_type": args.loss_type}))


if __name__ == "__main__":
    main()
