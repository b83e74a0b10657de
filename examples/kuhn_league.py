"""Kuhn poker toward Nash through the league's mixture, next to self-play on the same budget.

    python examples/kuhn_league.py              # league, then self-play (see the time below)
    python examples/kuhn_league.py --mode league
    python examples/kuhn_league.py --smoke      # a tiny budget, to check that it runs

Builds (and caches) the tiny model and a supervised warm-up that teaches the format but no
strategy, with the private card in the targets (a random P(bet or call) per information set,
``kuhn_poker.warmup_examples``). Then a pure league with no scripted players: a main agent under
AlphaStar's rules (self-play, PFSP over snapshots; 32 games a round) and a league exploiter that
trains against the league's Nash mixture of frozen players and is never reset (PSRO-style best
responses, warm-started; 128 games a round, lr 1e-2 against the main agent's 5e-3); a snapshot
of each every 2 rounds. Then, on the same number of games per round, mirror self-play. After
every epoch every model player's strategy is read off its token probabilities at the 12
information sets and scored by exact exploitability (0 = Nash, 0.458 = uniform, 0.333 = always
bet/call):

* ``exploitability_latest``: the main agent;
* ``exploitability_mixture``: the league's Nash mixture over its players (snapshots included), as
  one policy (``mixture_strategy``: per-state action probabilities weighted by mixture and reach);
  ``--meta chips`` (default) solves the exact chip game between the players' strategies, ``league``
  the league's win-rate matrix; both figures are printed;
* ``exploitability_selfplay``: the self-play player.

Credit is ``BranchCredit(advantage="moves")`` (no lookup table): at each learner turn both
legal moves are played out in K branches each, and the policy is regressed toward a bounded
softmax of their values (docs/training.md). Time on 2 cores shared with one or two other jobs:
league 17 and self-play 17 minutes (less on idle cores), plus a warm-up of about 4 minutes on the
first run (cached afterwards). Figures: docs/results.md; what limits them: research/results_history.md.

Writes ``exploitability.png`` (per epoch) and ``exploitability.json`` in ``--output-dir``; the last
line is one JSON object with the figures.
"""

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import LeagueConfig, LeagueRules, LeagueTrainer
from autocurricula.games import kuhn_poker
from autocurricula.leagues.league import EXPLOITER_ROLES
from autocurricula.training.config import help_field

CURVES = ("mixture", "latest", "selfplay")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="both", choices=["both", "league", "selfplay"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per epoch (one update of every learner each)")
    parser.add_argument("--games", type=int, default=32, help="main agent's games per round")
    parser.add_argument("--exploiter-games", type=int, default=128, help="games per exploiter and round (most of "
                        "the budget: the mixture is only as good as the exploiter's best responses)")
    parser.add_argument("--main-exploiters", type=int, default=0)
    parser.add_argument("--league-exploiters", type=int, default=1)
    parser.add_argument("--exploiters-vs", default="nash", choices=["nash", "league"],
                        help="nash: both exploiters play the league's Nash mixture of frozen players (PSRO-style "
                        "best responses); league: AlphaStar's rules (the main agent; PFSP over the past)")
    parser.add_argument("--league-exploiter-reset", type=float, default=0.0,
                        help="probability that the league exploiter restarts from the base at a snapshot")
    parser.add_argument("--snapshot-rounds", type=int, default=2, help="a snapshot of each learner every N rounds")
    parser.add_argument("--credit", default="branch", choices=["branch", "rae", "grpo", "q", "value"],
                        help="credit assignment; 'branch' (default) replays each game to a learner's turn and "
                        "plays K continuations (per-move credit, no lookup table)")
    parser.add_argument("--branch-samples", type=int, default=2, help="credit branch: K continuations per turn "
                        "(per legal move with --branch-advantage moves)")
    parser.add_argument("--branch-advantage", default="moves", choices=["moves", "return", "td"],
                        help="credit branch: 'moves' (default) branches both legal moves and regresses the policy "
                        "toward softmax(Q / tau), bounded; 'return' is A = G - V(s) on the sampled move; 'td' "
                        "is V(s') - V(s) (TDBranchCredit, credit_variants.py)")
    parser.add_argument("--move-temperature", type=float, default=0.15, help="tau of --branch-advantage moves")
    parser.add_argument("--move-clip", type=float, default=6.0, help="bound on the centred target logit of moves")
    parser.add_argument("--move-loss", default="residual", choices=["residual", "cross_entropy"],
                        help="the moves' loss (BestReplyCredit.move_loss, examples/best_reply_credit.py)")
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--exploiter-learning-rate", type=float, default=1e-2,
                        help="the exploiters' learning rate (KuhnLeagueRules.exploiter_learning_rate): higher than "
                        "the main agent's, so that each exploiter snapshot is nearer a best response")
    parser.add_argument("--lr-schedule", default="constant", choices=["constant", "linear", "cosine"],
                        help="learning-rate schedule over the run's rounds (GRPOConfig.lr_scheduler_type)")
    parser.add_argument("--min-lr-ratio", type=float, default=0.0, help="floor of --lr-schedule, x learning rate")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient to the warm base")
    parser.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus per completion token")
    parser.add_argument("--meta", default="chips", choices=["chips", "league"],
                        help="meta-game of exploitability_mixture: exact chips between the players' strategies, "
                        "or the league's win-rate matrix")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--warmup-lr", type=float, default=2e-3)
    parser.add_argument("--warmup-spread", type=float, default=0.9, help="the warm-up's P(bet or call) per "
                        "information set is drawn from 0.5 +- spread/2: wide, so that matching it needs the card")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/kuhn-league")
    parser.add_argument("--smoke", action="store_true", help="a tiny budget and model, to check the machinery")
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.rounds, args.games, args.exploiter_games = 1, 1, 8, 4
        args.hidden, args.layers, args.heads, args.warmup_steps, args.branch_samples = 32, 1, 8, 30, 2
    return args


def warm_base(args) -> Path:
    """The tiny base after the per-information-set random warm-up (both cached by their arguments)."""
    from autocurricula.training.warmup import sft_warmup
    from ttt_common import CACHE, tiny_base

    base = tiny_base(args.hidden, args.layers, args.heads, args.seed)
    spread = (0.5 - args.warmup_spread / 2, 0.5 + args.warmup_spread / 2)
    return sft_warmup(base, CACHE / f"{base.name}-kuhn-warm{args.warmup_steps}-s{args.warmup_spread}",
                      kuhn_poker.warmup_examples(20000, args.seed, spread), steps=args.warmup_steps, batch_size=64,
                      learning_rate=args.warmup_lr, seed=args.seed)


class Curve:
    """Per-epoch callback: the exploitabilities of one run, printed as JSON rows."""

    def __init__(self, name: str, meta: str, start: float):
        from autocurricula.eval.kuhn import LeagueStrategies

        self.name, self.start, self.rows = name, start, []
        self.league = LeagueStrategies(meta=meta)

    def __call__(self, trainer) -> dict:
        figures = self.league.figures(trainer)
        strategy = self.league.strategies(trainer)[figures["latest"]]
        figures["strategy_latest"] = {k: round(v, 2) for k, v in strategy.items()}  # P(bet or call) per set
        row = {"run": self.name, "epoch": trainer.current_epoch, "minutes": round((time.time() - self.start) / 60, 2),
               **{k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        return {f"eval/{k}": v for k, v in figures.items() if k.startswith("exploitability")}


def settings(args):
    from autocurricula import GRPOConfig
    from autocurricula.engine import LoraSpec

    return (LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
            GRPOConfig(learning_rate=args.learning_rate, lr_scheduler_type=args.lr_schedule,
                       min_lr_ratio=args.min_lr_ratio, beta=args.beta, entropy_coef=args.entropy_coef,
                       loss_type="grpo", temperature=1.0))


def credit_of(args):
    """``--credit``: branch credit with the ``--branch-*`` and ``--move-*`` options, or another method by name."""
    if args.credit != "branch":
        return args.credit
    from autocurricula.credit import BranchCredit

    branch = dict(samples=args.branch_samples, advantage=args.branch_advantage, move_temperature=args.move_temperature,
                  move_clip=args.move_clip)
    if args.branch_advantage == "td":
        from credit_variants import TDBranchCredit

        if args.move_loss != "residual":
            raise ValueError("--move-loss shapes the listed moves' targets: it needs --branch-advantage moves")
        return TDBranchCredit(samples=args.branch_samples)
    if args.move_loss == "residual":
        return BranchCredit(**branch)
    from best_reply_credit import BestReplyCredit

    return BestReplyCredit(**branch, move_loss=args.move_loss)


def common(args, output_dir: str) -> dict:
    return dict(epochs=args.epochs, rounds=args.rounds, output_dir=output_dir, overwrite_output_dir=True,
                seed=args.seed, max_tokens=2, credit=credit_of(args),
                game_name="kuhn_poker", arena={"max_concurrent_games": 128}, ratings={"bt_bootstrap": 0},
                progress=False, save_total_limit=1)


@dataclass
class KuhnLeagueRules(LeagueRules):
    """``LeagueRules`` plus the exploiters' own learning rate."""

    exploiter_learning_rate: float | None = help_field("peak learning rate of the main and league exploiters (None = "
                                                       "GRPOConfig.learning_rate); GRPOConfig's schedule scales it "
                                                       "alike. Higher lets an exploiter reach a best response sooner",
                                                       None)

    def __post_init__(self):
        if self.exploiter_learning_rate is not None and not self.exploiter_learning_rate > 0:
            raise ValueError(f"KuhnLeagueRules.exploiter_learning_rate must be > 0 (None = "
                             f"GRPOConfig.learning_rate), got {self.exploiter_learning_rate}")
        super().__post_init__()


@dataclass
class KuhnLeagueConfig(LeagueConfig):
    """``LeagueConfig`` whose rules carry the exploiters' own learning rate."""

    rules_class: ClassVar[type] = KuhnLeagueRules


class KuhnLeague(LeagueTrainer):
    """AlphaStar's league whose exploiters learn at ``exploiter_learning_rate``, through the trainer's
    ``learning_rate_of`` hook."""

    config_class = KuhnLeagueConfig

    def learning_rate_of(self, player_id: str) -> float:
        rate = self.config.rules.exploiter_learning_rate
        if rate is not None and any(p["id"] == player_id and p.get("role") in EXPLOITER_ROLES for p in self.players):
            return rate
        return super().learning_rate_of(player_id)


class MixtureLeague(KuhnLeague):
    """A league whose exploiters train against the league's Nash mixture over its frozen players
    (the exact chip game of their ``strategies``, a ``LeagueStrategies``): each snapshot of an
    exploiter is then an approximate best response to the current mixture, as in PSRO (Lanctot
    et al. 2017)."""

    def __init__(self, config: KuhnLeagueConfig, strategies):
        super().__init__(config)
        self.strategies = strategies
        self.mixture = None  # (ids, weights), solved once per round when an exploiter first needs it

    def match(self):
        self.mixture = None
        return super().match()

    def nash_opponent(self) -> dict:
        """A frozen player drawn from the league's Nash mixture of the chip game."""
        import numpy as np

        from autocurricula.eval.kuhn import meta_mixture

        if self.mixture is None:
            frozen = self.strategies.strategies(self, frozen_only=True)
            ids = list(frozen)
            self.mixture = (ids, meta_mixture([frozen[i] for i in ids], meta="chips"))
        ids, weights = self.mixture
        pid = ids[int(self.rng.choice(len(ids), p=np.asarray(weights) / np.sum(weights)))]
        return next(p for p in self.players if p["id"] == pid)

    def main_exploiter_opponent(self, player: dict) -> dict:
        return self.nash_opponent()

    def league_exploiter_opponent(self, player: dict) -> dict:
        return self.nash_opponent()


def run_league(args, engine, start: float) -> tuple:
    config = KuhnLeagueConfig(rules={"main_agents": 1, "main_exploiters": args.main_exploiters,
                                     "league_exploiters": args.league_exploiters, "games_per_learner": args.games,
                                     "exploiter_games": args.exploiter_games, "anchor_share": 0.0,
                                     "league_exploiter_reset_prob": args.league_exploiter_reset,
                                     "exploiter_learning_rate": args.exploiter_learning_rate,
                                     "snapshot_min_rounds": args.snapshot_rounds,
                                     "snapshot_max_rounds": args.snapshot_rounds},
                              **common(args, str(Path(args.output_dir) / "league")))
    curve = Curve("league", args.meta, start)
    trainer = MixtureLeague(config, curve.league) if args.exploiters_vs == "nash" else KuhnLeague(config)
    lora, grpo = settings(args)
    trainer.train(engine, kuhn_poker.play, lora_config=lora, grpo_config=grpo, callbacks=[curve])
    print(trainer.leaderboard, flush=True)
    return trainer, curve


def run_selfplay(args, engine, start: float) -> tuple:
    from autocurricula.leagues.selfplay import SelfPlayConfig, SelfPlayTrainer

    games = args.games + args.exploiter_games * (args.main_exploiters + args.league_exploiters)  # the league's games
    config = SelfPlayConfig(rules={"games_per_round": games, "past_share": 0.0},
                            **common(args, str(Path(args.output_dir) / "selfplay")))
    trainer = SelfPlayTrainer(config)
    curve = Curve("selfplay", args.meta, start)
    lora, grpo = settings(args)
    trainer.train(engine, kuhn_poker.play, lora_config=lora, grpo_config=grpo, callbacks=[curve])
    return trainer, curve


def plot(path: Path, series: dict[str, list[float]], references: dict[str, float]) -> None:
    """Exploitability per epoch, one line per curve, with the reference policies dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, ys in series.items():
        if ys:
            ax.plot(range(len(ys)), ys, marker="o", label=name)
    for name, y in references.items():
        ax.axhline(y, linestyle="--", linewidth=0.8, color="grey")
        ax.annotate(name, (0, y), textcoords="offset points", xytext=(2, 2), fontsize=7, color="grey")
    ax.axhline(0.05, linestyle=":", color="green", linewidth=1.0)
    ax.set_xlabel("epoch")
    ax.set_ylabel("exploitability (chips per hand)")
    ax.set_ylim(0, max(0.55, *(max(ys) for ys in series.values() if ys)))
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def main(argv=None) -> dict:
    from autocurricula.engine import Engine
    from autocurricula.eval.kuhn import exploitability, read_strategy, uniform_strategy

    args = parse_args(argv)
    start = time.time()
    base = warm_base(args)
    engine = Engine(str(base), name=str(base))
    base_figure = exploitability(read_strategy(engine, None))
    print("warm-up base:", json.dumps({"exploitability": round(base_figure, 4),
                                       "minutes": round((time.time() - start) / 60, 2)}), flush=True)
    league = selfplay = None
    if args.mode in ("both", "league"):
        league = run_league(args, engine, start)[1]
    if args.mode in ("both", "selfplay"):
        selfplay = run_selfplay(args, engine, start)[1]
    engine.close()

    series = {"mixture": [r["exploitability_mixture"] for r in league.rows] if league else [],
              "latest": [r["exploitability_latest"] for r in league.rows] if league else [],
              "selfplay": [r["exploitability_latest"] for r in selfplay.rows] if selfplay else []}
    last = {k: (v[-1] if v else None) for k, v in series.items()}
    summary = {"exploitability_mixture": last["mixture"], "exploitability_latest": last["latest"],
               "exploitability_selfplay": last["selfplay"],
               "exploitability_mixture_league": league.rows[-1]["exploitability_mixture_league"] if league else None,
               "exploitability_mixture_chips": league.rows[-1]["exploitability_mixture_chips"] if league else None,
               "mixture": league.rows[-1]["mixture"] if league else None,
               "per_epoch": series, "exploitability_base": round(base_figure, 4),
               "references": {"nash": 0.0, "uniform": round(exploitability(uniform_strategy()), 4),
                              "always_bet_call": round(exploitability(dict.fromkeys(uniform_strategy(), 1.0)), 4)},
               "credit": args.credit, "meta": args.meta, "epochs": args.epochs, "rounds": args.rounds,
               "minutes": round((time.time() - start) / 60, 2)}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot(out / "exploitability.png", series, {"uniform": summary["references"]["uniform"],
                                              "always bet/call": summary["references"]["always_bet_call"]})
    (out / "exploitability.json").write_text(json.dumps({"summary": summary, "rows": (league.rows if league else [])
                                                         + (selfplay.rows if selfplay else [])}, indent=1))
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
