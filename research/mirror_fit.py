"""How far one round's update moves the policy toward that round's mirror-descent targets, per game.

    python research/mirror_fit.py --game tictactoe --variants 1x1,8x1,1x3
    python research/mirror_fit.py --game kuhn --variants 1x1,8x1,1x3
    python research/mirror_fit.py --game matrix --variants 1x1,8x1,1x3

One round of the mirror self-play configuration (``SelfPlayTrainer`` with ``credit="mirror"``,
``past_share=0``, four optimizer steps a pass, 0.3 x 1e-2; as ``examples/psro_kuhn.py --trainers
selfplay --credit mirror --steps-per-generation 4``) from the game's warm base, once per variant
``PASSESxRATE`` (``GRPOConfig.num_iterations`` and a multiple of the configuration's rate;
``--steps-per-generation`` and ``--once-per-state`` change every variant of a run). Every variant
plays the same games (same seed, same base), so it gets the same targets; the script checks
that. For each state with move targets (a prompt, with its listed moves), in log-probabilities
over the listed moves, centred:

* ``d_target = log a - log p_before``, where ``a`` is the credit's target (one mirror step);
* ``d_update = log p_after - log p_before``, what the round's update did;
* the state's **reach** ``<d_update, d_target> / <d_target, d_target>``: 1 = the update lands on
  the target (as the exact learner of ``research/mirror_selfplay_ideal.py`` does), 0.1 = a tenth
  of the step, above 1 = past it; and its **miss** ``|d_update - reach d_target| / |d_target|``,
  the part of the update off the target's direction.

It prints, per variant, the median reach over states, the reach averaged with each state's visits
as weights, the median by visit count (1, 2 - 4, 5 and more), the median miss, and the share of
the distance KL(a || p) closed over all states. The policy before the round is the base model's:
a player's LoRA starts at zero.

``--exact`` (tic-tac-toe) also measures the round against the exact targets: one mirror step from
the base policy with the moves' exact values under it (self-play, every position enumerated), at
the visited states and at every other position with a choice, and the cosine between each visited
state's sampled and exact values (``exact_rows``); ``--train-on exact`` trains the round on the
exact targets at the same turns. ``--lora all:R`` trains a rank-R adapter on every linear in place
of the configuration's rank 8 on q and v.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import autocurricula  # noqa: E402,F401  (fast BLAS before mlx)
from autocurricula import SelfPlayConfig, SelfPlayTrainer  # noqa: E402
from autocurricula.credit import MirrorCredit  # noqa: E402
from autocurricula.engine import LoraSpec  # noqa: E402

from psro_matrix_games import LEARNING_RATE, MIRROR_RATE_SHARE  # noqa: E402

CONFIG_RATE = LEARNING_RATE * MIRROR_RATE_SHARE["policy"]  # the mirror configuration's rate (3e-3)


class RecordingMirror(MirrorCredit):
    """``MirrorCredit`` that keeps the target turns it hands to the update (``recorded``); with
    ``once_per_state`` it hands on one set of targets per state and round, whatever its visits;
    with ``train_on`` ((prompt ids, move ids) -> probability) the update trains on those targets
    at the same turns in place of the sampled ones."""

    def __init__(self, *, once_per_state: bool = False, train_on: dict | None = None, **options):
        super().__init__(**options)
        self.once_per_state, self.recorded, self.train_on = once_per_state, [], train_on

    def extra_turns(self, turns):
        out = super().extra_turns(turns)
        self.recorded.extend(out)  # the sampled targets, whatever the update trains on
        if self.train_on is not None:  # --train-on exact: the same turns, the exact targets
            out = [replace(t, advantage=self.train_on[(tuple(t.prompt_ids), tuple(t.completion_ids))]) for t in out]
        if self.once_per_state:
            seen, kept = set(), []
            for t in out:
                key = (t.player, tuple(t.prompt_ids), tuple(t.completion_ids))
                if key not in seen:
                    seen.add(key)
                    kept.append(t)
            out = kept
        return out


def parse_variants(text: str) -> list[tuple[int, float]]:
    """``"1x1,8x1,1x3"`` -> [(1, 1.0), (8, 1.0), (1, 3.0)]: passes x multiple of the configuration's rate."""
    out = []
    for part in text.split(","):
        passes, _, rate = part.strip().partition("x")
        try:
            out.append((int(passes), float(rate)))
        except ValueError:
            raise SystemExit(f"--variants: {part!r} is not PASSESxRATE (e.g. 8x1 = eight passes at the "
                             "configuration's rate)") from None
        if out[-1][0] < 1 or not out[-1][1] > 0:
            raise SystemExit(f"--variants: {part!r}: passes must be at least 1 and the rate multiple above 0")
    return out


def move_ids(move, tok) -> tuple:
    """A listed move's completion ids: its tokens and end of sequence, as ``listed_moves`` forces it."""
    return tuple(tok.encode(str(move), add_special_tokens=False)) + (tok.eos_token_id,)


def exact_target(values: list[float], log_policy, credit) -> list[float]:
    """The credit's target at one state from exact move values: one mirror step from ``log_policy``."""
    from autocurricula.credit import mirror_distribution

    return mirror_distribution(values, list(log_policy), credit.move_temperature, credit.move_clip, credit.step)


def direction(targets, before) -> np.ndarray:
    """The centred step ``log a - log p_before`` from a state's log-probabilities to its targets."""
    lb = np.asarray(before, np.float64)
    d = np.log(np.maximum(np.asarray(targets, np.float64) / np.sum(targets), 1e-300)) - (lb - np.logaddexp.reduce(lb))
    return d - d.mean()


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    return float(x @ y) / (nx * ny) if nx > 0 and ny > 0 else math.nan


def state_figures(targets: list[float], before: list[float], after: list[float]) -> tuple[float, float, float, float]:
    """One state's (reach, miss, KL(a || p_before), KL(a || p_after)) from its target probabilities
    and the listed moves' log-probabilities before and after the update (renormalised over them)."""
    a = np.asarray(targets, np.float64)
    a = a / a.sum()
    lb = np.asarray(before, np.float64)
    la = np.asarray(after, np.float64)
    lb, la = lb - np.logaddexp.reduce(lb), la - np.logaddexp.reduce(la)
    d_t, d_u = direction(a, lb), la - lb
    d_u = d_u - d_u.mean()
    norm = float(d_t @ d_t)
    reach = float(d_u @ d_t) / norm if norm > 0 else math.nan
    miss = float(np.linalg.norm(d_u - reach * d_t)) / math.sqrt(norm) if norm > 0 else math.nan
    kl = lambda lp: float(np.sum(np.where(a > 0, a * (np.log(np.maximum(a, 1e-300)) - lp), 0.0)))  # noqa: E731
    return reach, miss, kl(lb), kl(la)


def summary(states: list[tuple[int, float, float, float, float]]) -> dict:
    """Figures over states given as (visits, reach, miss, kl_before, kl_after)."""
    live = [s for s in states if not math.isnan(s[1])]
    med = lambda xs: round(statistics.median(xs), 4) if xs else None  # noqa: E731
    buckets = {"1": [s[1] for s in live if s[0] == 1], "2-4": [s[1] for s in live if 2 <= s[0] <= 4],
               "5+": [s[1] for s in live if s[0] >= 5]}
    weight = sum(s[0] for s in live)
    return {"states": len(live), "reach_median": med([s[1] for s in live]),
            "reach_visit_weighted": round(sum(s[0] * s[1] for s in live) / weight, 4) if weight else None,
            "reach_median_by_visits": {k: med(v) for k, v in buckets.items()},
            "states_by_visits": {k: len(v) for k, v in buckets.items()},
            "miss_median": med([s[2] for s in live]),
            "kl_closed": round(1 - sum(s[4] for s in live) / max(1e-12, sum(s[3] for s in live)), 4) if live else None}


def setup(args):
    """(base path, play, trainer extras) of ``--game``: the examples' warm bases and games."""
    if args.game == "tictactoe":
        from ttt_common import OpeningGame, warm_base

        return warm_base(seed=args.base_seed, progress=True), OpeningGame((0, 4)), {"max_tokens": 2}
    if args.game == "kuhn":
        from kuhn_league import parse_args as kuhn_args
        from kuhn_league import warm_base

        from autocurricula.games import kuhn_poker

        return warm_base(kuhn_args(["--seed", str(args.base_seed)])), kuhn_poker, {}
    from psro_matrix_games import parse_args as matrix_args
    from psro_matrix_games import warm_base

    from autocurricula.games.matrix import random_game

    return warm_base(matrix_args(["--seed", str(args.base_seed)])), random_game(args.matrix_game), {}


def lora_spec(text: str) -> LoraSpec:
    """``--lora``: ``qv`` (rank 8 on q and v, the default targets of Llama-like models) or
    ``all:R`` (rank R on every linear, alpha 2R, as the tic-tac-toe league example's rank 8)."""
    if text == "qv":
        return LoraSpec(target_modules=["q_proj", "v_proj"])
    kind, _, rank = text.partition(":")
    if kind != "all" or not rank.isdigit() or int(rank) <= 0:
        raise SystemExit(f"--lora {text!r}: use 'qv' or 'all:R' with a positive rank R, e.g. all:8")
    return LoraSpec(r=int(rank), lora_alpha=2.0 * int(rank), target_modules="all-linear")


def one_round(base: Path, play, extras: dict, args, passes: int, rate: float) -> tuple[dict, float, dict | None]:
    """Trains one round of one variant; returns ({(player, prompt): (visits, {move: target}, before,
    after)}, seconds, :func:`exact_figures` with ``args.exact``, else None)."""
    credit = RecordingMirror(samples=args.branch_samples, once_per_state=args.once_per_state,
                             train_on=exact_targets(base) if args.train_on == "exact" else None)
    with tempfile.TemporaryDirectory() as out:
        config = SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": args.games_per_round, "past_share": 0.0},
                                seed=args.seed, output_dir=out, save_strategy="no", progress=False, credit=credit,
                                **extras)
        trainer = SelfPlayTrainer(config)
        t0 = time.perf_counter()
        grpo = {"learning_rate": CONFIG_RATE * rate, "steps_per_generation": args.steps_per_generation,
                "num_iterations": passes}
        trainer.train(str(base), play, grpo_config=grpo, lora_config=lora_spec(args.lora))
        seconds = time.perf_counter() - t0
        moves: dict[tuple, dict[tuple, float]] = {}
        count: Counter = Counter()
        for t in trainer.credit.recorded:  # the trainer's own (deep) copy of the credit
            key = (t.player, tuple(t.prompt_ids))
            moves.setdefault(key, {})[tuple(t.completion_ids)] = float(t.advantage)
            count[key] += 1
        temperature = trainer.run.grpo.temperature
        result = {}
        for player in sorted({k[0] for k in moves}):
            keys = [k for k in moves if k[0] == player]
            pairs = [(list(k[1]), list(m)) for k in keys for m in moves[k]]
            before = trainer.engine.completion_logprobs(pairs, None, temperature)  # LoRA starts at zero
            after = trainer.engine.completion_logprobs(pairs, player, temperature)
            i = 0
            for k in keys:
                n = len(moves[k])
                result[k] = (count[k] // n, moves[k], before[i:i + n], after[i:i + n])
                i += n
        exact = exact_figures(trainer, result) if args.exact else None
        trainer.engine.close()
    return result, seconds, exact


def exact_targets(base: Path) -> dict:
    """``--train-on exact``: the configuration's targets with exact values at every tic-tac-toe
    position, one mirror step from the base policy (at the rate's temperature 1), keyed by (prompt
    ids, the move's ids with end of sequence) as the credit's target turns are."""
    from mirror_selfplay_ideal import engine_policy, exact_move_values

    from autocurricula.engine import Engine
    from autocurricula.games.tictactoe import legal_moves, reachable_positions

    print("--train-on exact: scoring the base at all 4,520 positions for the exact targets (about a minute) ...",
          file=sys.stderr, flush=True)
    engine, credit = Engine(str(base), name=str(base)), MirrorCredit()
    try:
        policy, prompts = engine_policy(engine, None, 1.0)
        positions = dict(reachable_positions())
        q = exact_move_values(policy, positions, positions)
        return {(prompt, move_ids(m, engine.tokenizer)): p for prompt, board in prompts.items()
                for m, p in zip(legal_moves(board), exact_target(q[board], np.log(policy[board]), credit))}
    finally:
        engine.close()


def exact_figures(trainer, states: dict) -> dict:
    """``--exact`` (tic-tac-toe): :func:`exact_rows` of the round, with the base policy and the
    player's read off the model at every reachable position and the moves' exact values under the
    base policy in self-play (what the sampled branch games estimate, up to the base's replies that
    are no legal move: the policy here is renormalised over the legal moves)."""
    from mirror_selfplay_ideal import engine_policy, exact_move_values

    from autocurricula.games.tictactoe import legal_moves, reachable_positions

    engine, temperature, tok = trainer.engine, trainer.run.grpo.temperature, trainer.engine.tokenizer
    (player,) = {k[0] for k in states}  # self-play with past_share=0: one learner
    print("--exact: scoring the base and the player at all 4,520 positions (about 2 minutes) ...", file=sys.stderr,
          flush=True)
    base, prompts = engine_policy(engine, None, temperature)
    after, _ = engine_policy(engine, player, temperature)
    positions = dict(reachable_positions())
    visited = {prompts[prompt]: (visits, in_move_order(targets, legal_moves(prompts[prompt]), tok))
               for (_, prompt), (visits, targets, *_) in states.items()}
    return exact_rows(base, after, exact_move_values(base, positions, positions), visited, trainer.credit)


def in_move_order(targets: dict, moves: list, tok) -> list[float]:
    """A state's targets (completion ids -> probability) in ``moves``' order: each move is listed as
    its tokens and end of sequence, as ``listed_moves`` forces it (the credit lists every legal move)."""
    return [targets[move_ids(m, tok)] for m in moves]


def exact_rows(base: dict, after: dict, q: dict, visited: dict, credit) -> dict:
    """The round against the exact targets ``mirror_distribution(q, log base)`` (the credit's
    ``move_temperature``, ``move_clip`` and ``step``), over the ``visited`` boards (board -> (visits,
    sampled targets in ``legal_moves`` order)) and every other board of ``base`` with a choice:
    median reach, miss, KL closed, the median **alignment** cos(update's step, exact step) (free of
    the steps' lengths, which reach divides by) and the exact step's median length; at the visited
    boards also the alignment with the sampled step, that step's median length, and the median
    cosine between the sampled and the exact centred logits ``y`` (``softmax(y)`` is the target's
    fixed point, ``Q / tau`` when nothing is clipped: 1 = the sampled values rank and space the moves as
    the exact ones do; the policy's own share of the step is taken out of both)."""
    w = credit.step
    rows: dict[str, list] = {"visited": [], "unvisited": []}
    extra: dict[str, list] = {"alignment": [], "step": [], "sampled_alignment": [], "sampled_step": [],
                              "value_cosine": [], "unvisited_alignment": [], "unvisited_step": []}
    for board, p in base.items():
        if len(p) < 2:
            continue
        lb, la = np.log(p), np.log(after[board])
        exact = exact_target(q[board], lb, credit)
        d_e, d_u = direction(exact, lb), la - lb - np.mean(la - lb)
        part = "visited" if board in visited else "unvisited"
        rows[part].append((visited[board][0] if part == "visited" else 0, *state_figures(exact, list(lb), list(la))))
        prefix = "" if part == "visited" else "unvisited_"
        extra[prefix + "alignment"].append(cosine(d_u, d_e))
        extra[prefix + "step"].append(float(np.linalg.norm(d_e)))
        if part == "visited":
            sampled = visited[board][1]
            d_s = direction(sampled, lb)
            extra["sampled_alignment"].append(cosine(d_u, d_s))
            extra["sampled_step"].append(float(np.linalg.norm(d_s)))
            logits = lambda a: (np.log(np.maximum(np.asarray(a, np.float64), 1e-300)) - (1 - w) * lb) / w  # noqa: E731
            y_s, y_e = logits(sampled), logits(exact)
            extra["value_cosine"].append(cosine(y_s - y_s.mean(), y_e - y_e.mean()))
    med = lambda xs: round(statistics.median([x for x in xs if not math.isnan(x)]), 4) \
        if any(not math.isnan(x) for x in xs) else None  # noqa: E731
    keep = ("states", "reach_median", "miss_median", "kl_closed")
    out = {name: {k: summary(r)[k] for k in keep} for name, r in rows.items()}
    out["visited"].update(alignment_median=med(extra["alignment"]), exact_step_median=med(extra["step"]),
                          sampled_alignment_median=med(extra["sampled_alignment"]),
                          sampled_step_median=med(extra["sampled_step"]),
                          value_cosine_median=med(extra["value_cosine"]))
    out["unvisited"].update(alignment_median=med(extra["unvisited_alignment"]),
                            exact_step_median=med(extra["unvisited_step"]))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", choices=["tictactoe", "kuhn", "matrix"], required=True)
    p.add_argument("--variants", default="1x1,8x1,1x3", help="PASSESxRATE,...: passes over the round's turns "
                   "and a multiple of the configuration's rate (3e-3)")
    p.add_argument("--games-per-round", type=int, default=128)
    p.add_argument("--steps-per-generation", type=int, default=4, help="optimizer steps per pass (the "
                   "configuration's 4)")
    p.add_argument("--branch-samples", type=int, default=2)
    p.add_argument("--matrix-game", type=int, default=0, help="with --game matrix: random_game(N)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-seed", type=int, default=None, help="the warm base's seed (default: --seed), as in "
                   "the examples (the Kuhn figures use --base-seed 0)")
    p.add_argument("--once-per-state", action="store_true", help="train on one set of targets per state and "
                   "round (each state weighted once, as the exact learner steps every visited state once), "
                   "not one per visit")
    p.add_argument("--lora", default="qv", help="the players' adapter: 'qv' (the configuration's: rank 8 on "
                   "q_proj and v_proj) or 'all:R' (rank R on every linear)")
    p.add_argument("--exact", action="store_true", help="with --game tictactoe: also measure the round "
                   "against the exact targets (exact values under the base policy) at the visited states and at "
                   "every other position, and how well the sampled targets point at them (about 2 min more)")
    p.add_argument("--train-on", choices=["sampled", "exact"], default="sampled", help="with --game tictactoe: "
                   "'exact' trains the round on the exact targets at the same turns in place of the sampled ones "
                   "(the figures stay measured against both)")
    args = p.parse_args(argv)
    if (args.exact or args.train_on == "exact") and args.game != "tictactoe":
        p.error("--exact and --train-on exact need --game tictactoe (the exact values come from enumerating its "
                "positions)")
    lora_spec(args.lora)  # refuse a bad value before the warm base is built
    args.base_seed = args.seed if args.base_seed is None else args.base_seed
    variants = parse_variants(args.variants)
    base, play, extras = setup(args)
    reference, t0 = None, time.perf_counter()
    for i, (passes, rate) in enumerate(variants):
        left = "" if i == 0 else f", about {(time.perf_counter() - t0) / i * (len(variants) - i) / 60:.0f} min left"
        print(f"{args.game}: variant {i + 1}/{len(variants)}, one round with {passes} pass(es) at {rate} x "
              f"{CONFIG_RATE:g}{left} ...", file=sys.stderr, flush=True)
        states, seconds, exact = one_round(base, play, extras, args, passes, rate)
        targets = {k: v[1] for k, v in states.items()}
        same = reference is None or (targets.keys() == reference.keys() and all(
            targets[k].keys() == reference[k].keys() and all(abs(targets[k][m] - reference[k][m]) < 1e-6
                                                             for m in targets[k]) for k in targets))
        if reference is None:
            reference = targets
        rows = [(v[0], *state_figures(list(v[1].values()), v[2], v[3])) for v in states.values()]
        print(json.dumps({"game": args.game, "seed": args.seed, "base_seed": args.base_seed,
                          "matrix_game": args.matrix_game if args.game == "matrix" else None,
                          "games_per_round": args.games_per_round, "branch_samples": args.branch_samples,
                          "passes": passes, "rate": CONFIG_RATE * rate,
                          "steps_per_generation": args.steps_per_generation,
                          "once_per_state": args.once_per_state, "lora": args.lora, "train_on": args.train_on,
                          "same_targets_as_first": same, "seconds": round(seconds, 1), **summary(rows),
                          **({"exact": exact} if exact is not None else {})}), flush=True)


if __name__ == "__main__":
    main()
