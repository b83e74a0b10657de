"""``autocurricula bench learn``: the default configuration (``autocurricula.train``) on games nobody
tuned it to, scored exactly as played.

The suite:

- ``matrix``: 20 random zero-sum matrix games, 2-5 rows x 2-5 columns, payoffs uniform in [-1, 1]
  times a scale drawn log-uniformly in [0.1, 100] plus an offset drawn uniformly in [-scale, scale]
  (``learn-0`` ... ``learn-19``, the same games for every seed);
- ``kuhn``, ``leduc``, ``goofspiel``, ``liars_dice``: OpenSpiel's ``kuhn_poker``, ``leduc_poker``,
  ``goofspiel(num_cards=4)`` and ``liars_dice(dice_sides=3)`` through ``autocurricula.games.openspiel``
  (needs ``pip install "autocurricula[openspiel]"``).

Each seed builds its own tiny base (``tiny_base(seed=...)``), and every game gets the default's
format warm-up from it (the matrix games one warm-up on all of their examples, as the matrix
example's family warm-up). On each game the default runs at the chosen budget, and beside it plain
self-play (``SelfPlayTrainer`` with its defaults and the framework's credit, the model's own rate)
on the same warm base, the same games a round and the same rounds. The deployed policy of each
(``deployable_mixture()``) is read off the engine at every prompt of the game, invalid replies
forfeiting as in play, and scored by an exact best response: the exploitability as played, in the
game's units and as a share of its payoff range. Uniform play's exploitability is the yardstick.

Budgets: ``--budget full`` is the default's own (12 epochs x 8 rounds of 128 games, a 200-step
warm-up, the examples' tiny llama: hidden 128, 2 layers, 32 heads); ``short`` is 2 x 4 rounds of
32 games with a 100-step warm-up; ``smoke`` is 1 round of 4 games on a smaller model with a
10-step warm-up (under 2 minutes for a couple of games: it checks the machinery, its figures mean
nothing). ``--epochs``, ``--rounds``, ``--games-per-round`` and ``--warmup-steps`` override the budget's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["BUDGETS", "Budget", "SUITE", "main", "matrix_suite", "run", "suite_games"]


@dataclass(frozen=True)
class Budget:
    epochs: int
    rounds: int
    games_per_round: int
    warmup_steps: int
    hidden: int = 128
    layers: int = 2
    heads: int = 32


BUDGETS = {"full": Budget(12, 8, 128, 200), "short": Budget(2, 4, 32, 100),
           "smoke": Budget(1, 1, 4, 10, hidden=32, layers=1, heads=4)}
OPENSPIEL = {"kuhn": "kuhn_poker", "leduc": "leduc_poker", "goofspiel": "goofspiel(num_cards=4)",
             "liars_dice": "liars_dice(dice_sides=3)"}
SUITE = ("matrix", *OPENSPIEL)
MATRIX_GAMES = 20


def matrix_suite(n: int = MATRIX_GAMES, payoff_scale: float = 1.0):
    """The suite's ``n`` random zero-sum matrix games (module docstring), every payoff times
    ``payoff_scale``; each with its ``scale`` and ``offset`` as attributes."""
    from autocurricula.games.matrix import MatrixGame

    out = []
    for i in range(n):
        rng = random.Random(f"learn-{i}")
        m, k = rng.randint(2, 5), rng.randint(2, 5)
        scale = 10 ** rng.uniform(-1.0, 2.0)
        offset = rng.uniform(-scale, scale)
        payoff = [[payoff_scale * (scale * rng.uniform(-1.0, 1.0) + offset) for _ in range(k)] for _ in range(m)]
        game = MatrixGame(payoff, name=f"learn-{i}")
        game.scale, game.offset = scale * payoff_scale, offset * payoff_scale
        out.append(game)
    return out


def suite_games(names: str | None, matrix_games: int = MATRIX_GAMES, payoff_scale: float = 1.0) -> list[tuple[str, object]]:
    """``(kind, game)`` of the suite's games that ``names`` picks (comma-separated: ``matrix``,
    ``matrix:N`` for the first N matrix games, ``kuhn``, ``leduc``, ``goofspiel``, ``liars_dice``,
    or any OpenSpiel game string such as ``tiny_bridge_2p``; ``kuhn_builtin``: the package's own
    Kuhn poker, its prompts and its warm-up examples); None: the whole suite."""
    picks = [p.strip() for p in (names or ",".join(SUITE)).split(",") if p.strip()]
    out = []
    for pick in picks:
        if pick == "matrix" or pick.startswith("matrix:"):
            n = int(pick.split(":", 1)[1]) if ":" in pick else matrix_games
            out += [("matrix", g) for g in matrix_suite(n, payoff_scale)]
            continue
        if pick == "kuhn_builtin":
            if payoff_scale != 1.0:
                raise ValueError("--payoff-scale applies to the matrix and OpenSpiel games; leave kuhn_builtin out")
            from autocurricula.games import kuhn_poker

            out.append(("kuhn_builtin", kuhn_poker))
            continue
        from autocurricula.games import AffineGame, openspiel

        game = openspiel.load(OPENSPIEL.get(pick, pick))
        if payoff_scale != 1.0:  # plays in the scaled units; scored on the game itself, figures scaled back
            game = AffineGame(game, payoff_scale, 0.0, name=game.name)
        out.append(("openspiel", game))
    return out


BUILTIN_KUHN = "kuhn_poker (built-in)"


def _name(kind: str, game) -> str:
    return BUILTIN_KUHN if kind == "kuhn_builtin" else game.name


def _os(game):
    """The OpenSpielGame behind a suite game, and the factor from its units to the game's as played."""
    from autocurricula.games import AffineGame

    return (game.game, game.scale) if isinstance(game, AffineGame) else (game, 1.0)


def _policies_matrix(trainer, game) -> dict:
    from autocurricula.eval.matrix import read_policy

    t = trainer.run.grpo.temperature
    return {pid: read_policy(trainer.engine, pid, game, temperature=t) for pid in trainer.deployable_mixture()}


def _figures(kind: str, trainer, game) -> dict:
    weights = trainer.deployable_mixture()
    if kind == "kuhn_builtin":
        from autocurricula.eval.kuhn import INFOSETS, played_exploitability, played_mixture, read_played

        t = trainer.run.grpo.temperature
        mix = played_mixture([read_played(trainer.engine, pid, temperature=t)[0] for pid in weights],
                             list(weights.values()))
        expl = played_exploitability(mix)
        out = {"exploitability": expl, "exploitability_share": expl / 4.0,
               "invalid_rate": sum(mix[k][1] for k in INFOSETS) / len(INFOSETS)}
    elif kind == "matrix":
        from autocurricula.eval.matrix import figures

        out = figures(game, _policies_matrix(trainer, game), weights)
    else:
        from autocurricula.eval import openspiel as ev

        os_game, factor = _os(game)
        t = trainer.run.grpo.temperature
        policies = {pid: ev.read_policy(trainer.engine, pid, os_game, temperature=t) for pid in weights}
        out = ev.figures(os_game, policies, weights)
        out["exploitability"] *= factor  # the units the game was played in
    return {k: round(float(v), 5) for k, v in out.items() if k != "value"} | {"players": len(weights)}


def uniform_figures(kind: str, game) -> dict:
    """Uniform legal play's exploitability (no invalid replies)."""
    import numpy as np

    if kind == "kuhn_builtin":
        from autocurricula.eval.kuhn import exploitability, uniform_strategy

        expl = exploitability(uniform_strategy())
        return {"exploitability": round(expl, 5), "exploitability_share": round(expl / 4.0, 5)}

    if kind == "matrix":
        from autocurricula.eval.matrix import exploitability_as_played

        m, n = game.shape
        pol = [np.r_[np.full(m, 1 / m), 0.0], np.r_[np.full(n, 1 / n), 0.0]]
        expl = exploitability_as_played(game, [pol], [1.0])
        return {"exploitability": round(expl, 5), "exploitability_share": round(expl / float(np.ptp(game.payoff)), 5)}
    from autocurricula.eval import openspiel as ev

    os_game, factor = _os(game)
    expl = ev.exploitability(os_game, ev.uniform_policy(os_game))
    lo, hi = os_game.facts.payoff_range
    return {"exploitability": round(expl * factor, 5), "exploitability_share": round(expl / (hi - lo), 5)}


def _train(which: str, kind: str, game, warm: Path, seed: int, budget: Budget, out: str):
    from autocurricula.leagues.default import choose, model_rate, train
    from autocurricula.leagues.selfplay import SelfPlayConfig, SelfPlayTrainer

    if which == "default":
        recipe = choose(game)
        rules = {"games_per_round": budget.games_per_round} if recipe.trainer is SelfPlayTrainer else \
            {"games_per_learner": budget.games_per_round, "exploiter_games": max(2, budget.games_per_round // 8)}
        return train(str(warm), game, epochs=budget.epochs, rounds=budget.rounds, seed=seed, output_dir=out,
                     warmup=False, progress=False, save_strategy="no", rules=rules,
                     printer=lambda line: print(line, file=sys.stderr, flush=True))
    config = SelfPlayConfig(epochs=budget.epochs, rounds=budget.rounds, seed=seed, output_dir=out, progress=False,
                            save_strategy="no", rules={"games_per_round": budget.games_per_round})
    trainer = SelfPlayTrainer(config)
    trainer.train(str(warm), game, grpo_config={"learning_rate": model_rate(warm)})
    return trainer


class MatrixFamily:
    """The suite's matrix games as one family for the format warm-up: their examples, pooled (one
    warm-up per seed teaches every game's words, as the matrix example's family warm-up does)."""

    def __init__(self, games):
        self.games, self.name = list(games), f"learn-matrix-{len(games)}"

    def warmup_examples(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        per = -(-n // len(self.games))
        pairs = [ex for i, g in enumerate(self.games) for ex in g.warmup_examples(per, seed * 1000 + i)]
        random.Random(seed).shuffle(pairs)
        return pairs[:n]


def warm_base(kind: str, game, base: Path, seed: int, budget: Budget, family=None) -> Path:
    """``base`` after the default's format warm-up on ``game`` (on its whole ``family`` for a matrix game)."""
    from autocurricula.leagues.default import choose
    from autocurricula.loop.bases import format_warmup

    if not budget.warmup_steps:
        return base
    recipe = choose(game)
    return format_warmup(base, family if family is not None else game, steps=budget.warmup_steps,
                         learning_rate=recipe.warmup_rate, seed=seed)


def run_game(kind: str, game, base: Path, seed: int, budget: Budget, selfplay: bool = True, family=None) -> dict:
    """One game of the suite on one seed: the default's and plain self-play's deployed policies, and
    uniform play, each scored as played."""
    from autocurricula.leagues.default import choose

    t0 = time.perf_counter()
    recipe = choose(game)
    warm = warm_base(kind, game, base, seed, budget, family)
    from autocurricula.arena.game import game_facts

    row = {"seed": seed, "game": _name(kind, game), "kind": kind, "range": [round(x, 5) for x in game_facts(game).payoff_range],
           "default_recipe": recipe.name}
    if kind == "matrix":
        row.update(shape=list(game.shape), scale=round(game.scale, 5), offset=round(game.offset, 5))
    row["uniform"] = uniform_figures(kind, game)
    for which in ("default", "selfplay") if selfplay else ("default",):
        with tempfile.TemporaryDirectory() as out:
            t1 = time.perf_counter()
            trainer = _train(which, kind, game, warm, seed, budget, out)
            try:
                row[which] = {**_figures(kind, trainer, game), "seconds": round(time.perf_counter() - t1, 1)}
            finally:
                trainer.engine.close()
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def line(row: dict) -> str:
    """One row as a line of text."""
    what = f"{row['game']}" + (f" {row['shape'][0]}x{row['shape'][1]} x{row['scale']:.3g} {row['offset']:+.3g}"
                              if row["kind"] == "matrix" else "")
    d, u = row["default"], row["uniform"]
    text = (f"seed {row['seed']}  {what:<34} default {d['exploitability_share']:.4f} of range "
            f"({d['exploitability']:.4g} units), invalid {d['invalid_rate']:.4f} | uniform {u['exploitability_share']:.4f}"
            f" ({u['exploitability']:.4g})")
    if "selfplay" in row:
        s = row["selfplay"]
        text += f" | self-play {s['exploitability_share']:.4f} ({s['exploitability']:.4g}), invalid {s['invalid_rate']:.4f}"
    return text + f"  [{row['seconds']:.0f} s]"


def summary(rows: list[dict]) -> dict:
    """Per seed: the matrix games' median and worst share of the range (goal 0.03 / 0.08), and each
    other game's figures against its goal (Kuhn: 0.05 chips, invalid 1%; the rest: a quarter of
    uniform play's exploitability and below self-play's)."""
    out = {}
    for seed in sorted({r["seed"] for r in rows}):
        mine = [r for r in rows if r["seed"] == seed]
        entry = {}
        shares = [r["default"]["exploitability_share"] for r in mine if r["kind"] == "matrix"]
        if shares:
            entry["matrix"] = {"games": len(shares), "median": round(statistics.median(shares), 4),
                               "worst": round(max(shares), 4),
                               "met": statistics.median(shares) <= 0.03 and max(shares) <= 0.08}
            plain = [r["selfplay"]["exploitability_share"] for r in mine if r["kind"] == "matrix" and "selfplay" in r]
            if plain:
                entry["matrix"]["selfplay_median"] = round(statistics.median(plain), 4)
                entry["matrix"]["selfplay_worst"] = round(max(plain), 4)
        for r in mine:
            if r["kind"] == "matrix":
                continue
            d, u = r["default"], r["uniform"]
            e = {"exploitability": d["exploitability"], "invalid_rate": d["invalid_rate"],
                 "of_uniform": round(d["exploitability"] / u["exploitability"], 4) if u["exploitability"] else None}
            if "selfplay" in r:
                e["selfplay"] = r["selfplay"]["exploitability"]
            if r["game"] in ("kuhn_poker", BUILTIN_KUHN):
                e["met"] = d["exploitability"] <= 0.05 and d["invalid_rate"] <= 0.01
            else:
                e["met"] = (d["exploitability"] <= 0.25 * u["exploitability"]
                            and ("selfplay" not in r or d["exploitability"] < r["selfplay"]["exploitability"]))
            entry[r["game"]] = e
        out[str(seed)] = entry
    return out


def parse_budget(args) -> Budget:
    budget = BUDGETS[args.budget]
    own = {k: getattr(args, a) for k, a in (("epochs", "epochs"), ("rounds", "rounds"),
                                           ("games_per_round", "games_per_round"),
                                           ("warmup_steps", "warmup_steps")) if getattr(args, a, None) is not None}
    return replace(budget, **own)


def run(games: str | None, seeds: list[int], budget: Budget, *, matrix_games: int = MATRIX_GAMES,
        payoff_scale: float = 1.0, selfplay: bool = True, model: str | None = None, output: str | None = None,
        printer=print) -> dict:
    """The benchmark: every picked game on every seed (each seed its own tiny base, unless ``model``)."""
    from tqdm.auto import tqdm

    from autocurricula.loop.bases import tiny_base

    picked = suite_games(games, matrix_games, payoff_scale)
    family = MatrixFamily([g for kind, g in picked if kind == "matrix"]) if any(k == "matrix" for k, _ in picked) \
        else None
    rows, t0 = [], time.perf_counter()
    runs = [(seed, kind, game) for seed in seeds for kind, game in picked]
    bar = tqdm(runs, desc="bench learn", unit="game", file=sys.stderr)
    bases: dict[int, Path] = {}
    for seed, kind, game in bar:
        bar.set_postfix_str(f"seed {seed} {_name(kind, game)}")
        if seed not in bases:
            bases[seed] = Path(model) if model else tiny_base(budget.hidden, budget.layers, budget.heads, seed)
        row = run_game(kind, game, bases[seed], seed, budget, selfplay, family if kind == "matrix" else None)
        rows.append(row)
        tqdm.write(line(row), file=sys.stdout)
        if output:
            with open(output, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    result = {"budget": budget.__dict__, "seeds": seeds, "payoff_scale": payoff_scale,
              "minutes": round((time.perf_counter() - t0) / 60, 1), "summary": summary(rows), "rows": rows}
    return result


def main(args: argparse.Namespace) -> None:
    budget = parse_budget(args)
    result = run(args.games, list(args.seeds), budget, matrix_games=args.matrix_games,
                 payoff_scale=args.payoff_scale, selfplay=not args.no_selfplay, model=args.model,
                 output=args.output)
    if args.json:
        print(json.dumps(result))
        return
    for seed, entry in result["summary"].items():
        for game, figures in entry.items():
            print(f"seed {seed}  {game}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    print(f"{len(result['rows'])} runs in {result['minutes']} min; budget {json.dumps(result['budget'])}")


def check(args: argparse.Namespace) -> str | None:
    """Why these ``bench learn`` arguments cannot run, or None."""
    if args.payoff_scale is not None and not (math.isfinite(args.payoff_scale) and args.payoff_scale > 0):
        return f"argument --payoff-scale: must be a number > 0, not {args.payoff_scale}"
    if args.games is not None:
        try:
            for pick in args.games.split(","):
                pick = pick.strip()
                if pick.startswith("matrix:") and int(pick.split(":", 1)[1]) < 1:
                    raise ValueError(pick)
        except ValueError:
            return f"argument --games: {args.games!r}: matrix:N needs a whole number N >= 1"
    return None
