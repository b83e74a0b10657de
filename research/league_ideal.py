"""The league's roles with exact values and no model, on Kuhn poker: does a main agent that
steps toward its soft targets settle near an equilibrium when its opponents are the league's
blend rather than itself?

    python research/league_ideal.py                              # steps 1, 0.2, 0.1, 0.045; league and self-play
    python research/league_ideal.py --step 0.1 --rounds 400 --structure league

Every round each learner moves one mirror step of size ``step`` from its policy toward
``softmax(Q / tau)`` at every information set (``mirror_distribution``: for two moves,
``logit_new = (1 - step) logit + step (Q_bet - Q_pass) / tau``), with ``Q`` the exact values of its
moves against the blend of its opponents that round (one behaviour strategy by Kuhn's theorem,
``mixture_strategy``). ``step`` 1 is the soft targets' jump, ``step`` 0.045 mirror self-play's.
The roles follow ``LeagueConfig``'s defaults, with the expected opponents in place of sampled
games: the main agent plays itself in 0.35 of its games, its past players (the population's frozen
snapshots) in 0.5 by squared PFSP weights on its exact win probability, and the two exploiters in
the rest; the main exploiter answers the live main agent and is reset to the warm base at each of
its snapshots; the league exploiter answers the population by linear PFSP weights and is reset at
a snapshot with probability 0.25. Snapshots of all three come every ``--snapshot-rounds`` rounds.
``--structure selfplay`` gives the main agent only itself as opponent (the exploiters still run).
Everyone starts from the warm base's played strategy (seed 0). Per epoch of 8 rounds it records
the exploitability (chips per hand; 0 = Nash) of the live main agent, of the deployed mixture (the
Nash of the restricted game among the population and the live learners, exact payoffs, by LP),
of the uniform average of the main agent's snapshots, and of the uniform average of the main agent
after its last four epochs, with the mixture's weight on the live main agent and its support
(members above 0.01). One JSON line per setting: each figure after the last epoch and its range
over the last quarter of the epochs.

What the trained league has and this does not, one option each: ``--population frozen|main`` (the
mixture over the snapshots, or the main agent's only), ``--meta-games N`` (each entry estimated
from N hands and solved as the league solves it, at its lower confidence bound), ``--q-noise S``
(errors on the values; ``--exploiter-games`` sets the exploiters' games as a share of the main
agent's, an eighth by default, and so how much larger their errors are), ``--exploiter-step``
(exploiters that realise only part of each round's target), ``--anchor A`` (the
tic-tac-toe example's random player in a share A of the main agent's games) and ``--call-bias B``
(a fit that lands at B times the target's odds of call over fold, as a loss that divides each
move's row by its own token count does).

    python research/league_ideal.py --population frozen --meta-games 100 --step 1
    python research/league_ideal.py --call-bias 1.3333 --step 0.045
"""

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from autocurricula.credit import mirror_distribution  # noqa: E402
from autocurricula.eval.kuhn import INFOSETS, exploitability, mixture_strategy  # noqa: E402
from autocurricula.eval.meta import robust_mixture, zero_sum_nash  # noqa: E402
from anchor_bias_ideal import kuhn_values  # noqa: E402
from kuhn_psro_ideal import WARM_BASE, restricted_game  # noqa: E402

EDGE = 1 / (1 + math.exp(30))  # a logit of ±30 at most: every move keeps a finite log-probability, as a model's does
EPOCH = 8  # rounds per epoch, as the trained runs report them
SHARES = {"self": 0.35, "pfsp": 0.5}  # LeagueRules'; the rest goes to the exploiters
LEAGUE_RESET = 0.25  # LeagueRules.league_exploiter_reset_prob
EXPLOITER_GAMES = 1 / 8  # the trained runs' exploiters play an eighth of the main agent's games


def mirror_step(x: dict[str, float], q: dict[str, tuple[float, float]], tau: float, step: float,
                call_bias: float = 1.0) -> dict[str, float]:
    """One mirror step per set (``mirror_distribution`` over bet-or-call and its passive move). ``call_bias``:
    where the moves are call and fold, the fitted policy lands at the target's odds times this (a
    cross-entropy whose rows are divided by their token counts: "call" + end is 3 tokens, "fold" + end 4)."""
    out = {}
    for k, p in x.items():
        agg = mirror_distribution(list(q[k]), [math.log(p), math.log(1 - p)], tau, step=step)[0]
        odds = agg / (1 - agg) * (call_bias if k.endswith("bet") else 1.0) if agg < 1 else math.inf
        out[k] = min(1 - EDGE, max(EDGE, odds / (1 + odds) if math.isfinite(odds) else 1.0))
    return out


def blend(opponents: list[tuple[dict[str, float], float]]) -> dict[str, float]:
    """One behaviour strategy for drawing a player per hand by weight (zero weights dropped, the rest normalised)."""
    weights = [w for _, w in opponents if w > 0]
    return mixture_strategy([s for s, w in opponents if w > 0], [w / sum(weights) for w in weights])


def win_probability(a: dict[str, float], b: dict[str, float]) -> float:
    """``a``'s expected chips against ``b`` (both seats) mapped to [0, 1] over Kuhn's range of ±2 chips."""
    return min(1.0, max(0.0, 0.5 + restricted_game([a, b])[0, 1] / 4))


def pfsp(me: dict[str, float], pool: list[dict[str, float]], weighting: str) -> list[float]:
    """PFSP weights over ``pool`` by ``me``'s win probability p: squared (1 - p)^2 or linear (1 - p)."""
    power = 2 if weighting == "squared" else 1
    w = [(1 - win_probability(me, s)) ** power for s in pool]
    total = sum(w)
    return [v / total for v in w] if total > 0 else [1 / len(pool)] * len(pool)


HAND_SD = 1.3  # about the spread of one hand's relative chips in Kuhn poker


def deployed(population: list[dict[str, float]], games: int = 0,
             rng: np.random.Generator | None = None) -> tuple[dict[str, float], np.ndarray]:
    """The restricted game's Nash mixture among ``population`` and its weights: on the exact payoffs, or
    (``games`` > 0) on estimates from that many hands per pair, solved as the league solves them
    (``robust_mixture``: each entry at its mean less one standard error)."""
    game = restricted_game(population)
    if games:
        se = HAND_SD / math.sqrt(games)
        noise = np.triu(rng.normal(0.0, se, game.shape), 1)
        x = robust_mixture(game + noise - noise.T, np.full(game.shape, se), z=1.0)
    else:
        x, _, _ = zero_sum_nash(game)
    w = np.maximum(x, 0) / np.maximum(x, 0).sum()
    return mixture_strategy(population, [float(v) for v in w]), w


def noisy_values(me: dict[str, float], opponent: dict[str, float], sd: float,
                 rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """``me``'s exact move values against ``opponent``, plus Gaussian errors of ``sd`` chips when ``sd`` > 0."""
    return {k: tuple(v + sd * rng.standard_normal(2)) if sd else v for k, v in kuhn_values(me, opponent).items()}


def run(step: float, structure: str, rounds: int, tau: float, snapshot_rounds: int, seed: int,
        anchor: float = 0.0, population: str = "all", meta_games: int = 0, q_noise: float = 0.0,
        call_bias: float = 1.0, exploiter_games: float = EXPLOITER_GAMES, exploiter_step: float | None = None) -> dict:
    """One setting (the module docstring names each argument's flag): per figure, its value after the
    last epoch and its range over the last quarter of the epochs."""
    rng, noise = random.Random(seed), np.random.default_rng(seed)
    ex_step = step if exploiter_step is None else exploiter_step
    main, exploiter, league_exploiter = dict(WARM_BASE), dict(WARM_BASE), dict(WARM_BASE)
    snapshots: list[dict[str, float]] = []  # the population's frozen players
    main_snapshots: list[dict[str, float]] = []
    recent: list[dict[str, float]] = []
    curve = []
    for r in range(1, rounds + 1):
        if structure == "selfplay" or not snapshots:
            main_opp = blend([(main, 1.0)])
        else:
            w = pfsp(main, snapshots, "squared")
            rest = 1 - SHARES["self"] - SHARES["pfsp"]
            main_opp = blend([(main, SHARES["self"])] + [(s, SHARES["pfsp"] * v) for s, v in zip(snapshots, w)]
                             + [(exploiter, rest / 2), (league_exploiter, rest / 2)])
        if anchor:
            main_opp = blend([(dict.fromkeys(INFOSETS, 0.5), anchor), (main_opp, 1 - anchor)])
        league_opp = blend(list(zip(snapshots, pfsp(league_exploiter, snapshots, "linear")))) if snapshots else main
        exploiter_sd = q_noise / math.sqrt(exploiter_games)  # fewer games, noisier values
        main, exploiter, league_exploiter = (
            mirror_step(main, noisy_values(main, main_opp, q_noise, noise), tau, step, call_bias),
            mirror_step(exploiter, noisy_values(exploiter, main, exploiter_sd, noise), tau, ex_step, call_bias),
            mirror_step(league_exploiter, noisy_values(league_exploiter, league_opp, exploiter_sd, noise), tau,
                        ex_step, call_bias))
        if r % snapshot_rounds == 0:
            snapshots += [dict(main), dict(exploiter), dict(league_exploiter)]
            main_snapshots.append(dict(main))
            exploiter = dict(WARM_BASE)
            if rng.random() < LEAGUE_RESET:
                league_exploiter = dict(WARM_BASE)
        if r % EPOCH == 0:
            recent = [*recent, dict(main)][-4:]
            members = {"all": snapshots + [main, exploiter, league_exploiter], "frozen": snapshots,
                       "main": main_snapshots}[population]
            mixture, weights = deployed(members, meta_games, noise)
            curve.append({"main_agent": exploitability(main, backend="python"),
                          "mixture": exploitability(mixture, backend="python"),
                          "mixture_on_live_main": float(weights[-3]) if population == "all" else 0.0,
                          "mixture_support": float((weights > 0.01).sum()),
                          "snapshot_average": exploitability(blend([(s, 1.0) for s in main_snapshots]), backend="python")
                          if main_snapshots else None,
                          "last_epochs_average": exploitability(blend([(s, 1.0) for s in recent]), backend="python")})
    quarter = curve[-max(1, len(curve) // 4):]
    return {k: {"last": round(curve[-1][k], 4),
                "last_quarter": [round(min(c[k] for c in quarter), 4), round(max(c[k] for c in quarter), 4)]}
            for k in curve[-1]}


def main(argv=None):
    """Every ``--structure`` x ``--step`` setting, one JSON line each."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step", type=float, nargs="+", default=[1.0, 0.2, 0.1, 0.045])
    p.add_argument("--structure", nargs="+", choices=["league", "selfplay"], default=["league", "selfplay"])
    p.add_argument("--rounds", type=int, default=96, help="the trained runs' 12 epochs x 8 rounds")
    p.add_argument("--tau", type=float, default=0.15)
    p.add_argument("--snapshot-rounds", type=int, default=3, help="LeagueConfig snapshots every 2 - 4 rounds")
    p.add_argument("--seed", type=int, default=0, help="the league exploiter's resets")
    p.add_argument("--population", choices=["all", "frozen", "main"], default="all", help="the deployed "
                   "mixture's members: the snapshots and the live learners, the snapshots, or the main agent's")
    p.add_argument("--meta-games", type=int, default=0, help="hands per pair behind each meta-game entry "
                   "(0: exact payoffs)")
    p.add_argument("--q-noise", type=float, default=0.0, help="Gaussian errors (chips) on the main agent's "
                   "move values each round; the exploiters' are larger as they play fewer games (--exploiter-games)")
    p.add_argument("--exploiter-games", type=float, default=EXPLOITER_GAMES, help="with --q-noise: each "
                   "exploiter's games as a share of the main agent's; its values' errors grow as 1/sqrt(share)")
    p.add_argument("--exploiter-step", type=float, default=None, help="the exploiters' mirror step (default: "
                   "--step's), e.g. to model exploiters that realise only part of each round's target")
    p.add_argument("--call-bias", type=float, default=1.0, help="the fitted odds of call over fold, as a "
                   "multiple of the target's (4/3: each target row's loss divided by its own token count)")
    p.add_argument("--anchor", type=float, default=0.0, help="the main agent's share of games against uniform "
                   "random play (the tic-tac-toe example's anchor_share, 0.5)")
    args = p.parse_args(argv)
    if not all(0 < w <= 1 for w in args.step):
        p.error(f"--step takes mirror steps in (0, 1], got {args.step}")
    checks = {"--rounds": (args.rounds >= EPOCH, f"at least one epoch of {EPOCH} rounds"),
              "--tau": (args.tau > 0, "a temperature above 0"), "--snapshot-rounds": (args.snapshot_rounds >= 1, "1 or more"),
              "--meta-games": (args.meta_games >= 0, "0 (exact) or more hands"), "--q-noise": (args.q_noise >= 0, "0 or more"),
              "--call-bias": (args.call_bias > 0, "odds above 0 (1: none)"),
              "--exploiter-games": (args.exploiter_games > 0, "a share above 0"),
              "--exploiter-step": (args.exploiter_step is None or 0 < args.exploiter_step <= 1, "a step in (0, 1]"),
              "--anchor": (0 <= args.anchor < 1, "a share in [0, 1)")}
    for flag, (ok, what) in checks.items():
        if not ok:
            p.error(f"{flag} takes {what}, got {getattr(args, flag[2:].replace('-', '_'))}")
    for structure in args.structure:
        for step in args.step:
            row = run(step, structure, args.rounds, args.tau, args.snapshot_rounds, args.seed, args.anchor,
                      args.population, args.meta_games, args.q_noise, args.call_bias, args.exploiter_games,
                      args.exploiter_step)
            print(json.dumps({"structure": structure, "step": step, "rounds": args.rounds, "tau": args.tau,
                              "anchor": args.anchor, "population": args.population,
                              "meta_games": args.meta_games, "q_noise": args.q_noise,
                              "exploiter_games": args.exploiter_games, "exploiter_step": args.exploiter_step,
                              "call_bias": args.call_bias, **row}),
                  flush=True)


if __name__ == "__main__":
    main()
