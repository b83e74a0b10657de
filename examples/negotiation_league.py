"""Free-text negotiation in a league, with per-move credit from branch rollouts (no lookup table).

    python examples/negotiation_league.py          # 13 minutes on 2 cores shared with other jobs

(plus its warm-up the first time: 100 steps, 12 minutes under that load, cached afterwards).
docs/results.md has its figures.

The game is games/negotiation.py (split a pool of books, hats and balls; private values; 4 turns of
"I get a b c" or "accept"), scored with ``reward="share"``: a player's value of what it keeps over
its value of the whole pool, 0 with no deal. States never repeat (every deal draws a new pool and
values), so tabular credit has nothing to key on; ``credit="branch"`` replays each game to a move,
samples its continuations and uses their mean return as the state's value.

The learner starts from the tiny model after a supervised warm-up on random *valid* moves (format,
no strategy). It trains in a league: a main agent that plays the fixed scripted opponent
(``random_policy``: accepts a pending offer half of the time, else proposes a uniform split) in
``--anchor-share`` of its games, and self-play and PFSP over its snapshots in the rest.

Measure: the *deal value*, the learner's share of its own value in a game against the scripted
opponent (0 with no deal or an invalid reply), over ``--eval-games`` deals (half as first mover),
for the warm base and the trained main agent on the same deals and sampling seeds, at the training
temperature. ``ci95`` is the 95% interval of the mean paired difference (trained - base). After
every epoch a smaller evaluation (``--curve-games``) gives the curve. The last line is one JSON object.
"""

import argparse
import json
import math
import time

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import LeagueConfig, LeagueTrainer
from autocurricula.arena.arena import Arena, GameRecord
from autocurricula.eval.players import main_agent
from autocurricula.games import negotiation
from autocurricula.training.warmup import sft_warmup

from ttt_common import CACHE, HEADS, tiny_base

SCRIPTED = {"id": "scripted", "role": "scripted", "policy": negotiation.random_policy}
EVAL_SEED = 12345  # deals and sampling seeds of every evaluation (the same for base and trained)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--games-per-learner", type=int, default=64, help="main agent's games per round")
    parser.add_argument("--anchor-share", type=float, default=0.5, help="share of the main agent's games against "
                        "the scripted opponent; the league rules (self-play, PFSP over snapshots) pick the rest")
    parser.add_argument("--main-exploiters", type=int, default=0)
    parser.add_argument("--credit", default="branch", help="credit method ('branch' = per-move credit from branch "
                        "rollouts; 'rae' = one baseline per role; both need no table)")
    parser.add_argument("--branch-samples", type=int, default=4, help="branch games per branched state")
    parser.add_argument("--branch-turns", type=int, default=2, help="learner turns branched per game (0 = all)")
    parser.add_argument("--branch-advantage", default="return", choices=["return", "td"],
                        help="A = G - V(s) ('return') or V(s') - V(s) ('td': TDBranchCredit, credit_variants.py)")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--max-turns", type=int, default=4, help="turns per negotiation")
    parser.add_argument("--eval-games", type=int, default=600, help="deals of the final base/trained comparison")
    parser.add_argument("--curve-games", type=int, default=200, help="deals of the per-epoch evaluation")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--warmup-steps", type=int, default=100, help="supervised warm-up steps on random valid moves")
    parser.add_argument("--output-dir", default="runs/negotiation-league")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def warm_base(args):
    base = tiny_base(args.hidden, args.layers, args.heads, args.seed)
    examples = negotiation.warmup_examples(20000, args.seed, args.max_turns)
    return sft_warmup(base, CACHE / f"{base.name}-nego{args.max_turns}-warm{args.warmup_steps}", examples,
                      steps=args.warmup_steps, batch_size=64, learning_rate=1e-3, seed=args.seed)


def make_play(max_turns: int):
    async def play(players, model, tokenizer=None):
        return await negotiation.play(players, model, tokenizer, reward="share", max_turns=max_turns)

    return play


def deal_values(engine, adapter, games: int, max_turns: int, temperature: float = 1.0) -> list[float]:
    """The learner's deal value in each of ``games`` negotiations against the scripted opponent
    (seat alternating, deals and seeds fixed by EVAL_SEED): its reward clipped at 0 (an invalid
    reply's penalty counts as no deal)."""
    from autocurricula.arena.arena import run_async

    learner = {"id": f"eval-{adapter or 'base'}", "adapter": adapter, "frozen": True}
    arena = Arena(engine, seed=EVAL_SEED, temperature=temperature, max_tokens=10)
    play = make_play(max_turns)
    runs = []
    for i in range(games):
        seats = [learner, SCRIPTED] if i % 2 == 0 else [SCRIPTED, learner]
        runs.append((play, seats, GameRecord(f"eval{i}", seats), "negotiation"))
    records = run_async(arena.run(runs, max_concurrent=128))
    errors = [r.error for r in records if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} evaluation games failed, first: {errors[0]}")
    return [max(0.0, float(r.rewards[i % 2])) for i, r in enumerate(records)]


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% normal interval."""
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return m, 1.96 * sd / math.sqrt(n)


class DealValueCurve:
    """After every epoch: the main agent's mean deal value against the scripted opponent."""

    def __init__(self, games: int, max_turns: int, start: float):
        self.games, self.max_turns, self.start, self.rows = games, max_turns, start, []

    def __call__(self, trainer) -> dict:
        player = main_agent(trainer)
        m, h = mean_ci(deal_values(trainer.engine, player, self.games, self.max_turns))
        row = {"epoch": trainer.current_epoch, "minutes": round((time.time() - self.start) / 60, 2), "player": player,
               "deal_value": round(m, 4), "ci95_half_width": round(h, 4)}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        return {"eval/deal_value": m}


def main():
    args = parse_args()
    from autocurricula import GRPOConfig
    from autocurricula.credit import BranchCredit
    from autocurricula.engine import Engine, LoraSpec

    start = time.time()
    base = warm_base(args)
    engine = Engine(str(base), name=str(base))
    base_values = deal_values(engine, None, args.eval_games, args.max_turns)
    print("warm-up base:", json.dumps({"deal_value": round(mean_ci(base_values)[0], 4),
                                       "curve_games_deal_value": round(mean_ci(base_values[:args.curve_games])[0], 4)}),
          flush=True)
    credit = args.credit
    if args.credit == "branch" and args.branch_advantage == "td":
        from credit_variants import TDBranchCredit

        credit = TDBranchCredit(samples=args.branch_samples, turns_per_game=args.branch_turns)
    elif args.credit == "branch":
        credit = BranchCredit(samples=args.branch_samples, turns_per_game=args.branch_turns)
    config = LeagueConfig(epochs=args.epochs, rounds=args.rounds,
                          rules={"games_per_learner": args.games_per_learner, "exploiter_games": 16, "main_agents": 1,
                                 "main_exploiters": args.main_exploiters, "league_exploiters": 0,
                                 "anchor_share": args.anchor_share, "snapshot_min_rounds": max(4, args.rounds // 2),
                                 "snapshot_max_rounds": max(8, args.rounds)}, output_dir=args.output_dir,
                          overwrite_output_dir=True, seed=args.seed, max_tokens=10, game_name="negotiation",
                          credit=credit, arena={"max_concurrent_games": 128}, ratings={"bt_bootstrap": 0},
                          progress=False)
    trainer = LeagueTrainer(config, opponents=[dict(SCRIPTED)])
    curve = DealValueCurve(args.curve_games, args.max_turns, start)
    trainer.train(engine, make_play(args.max_turns), lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
                  grpo_config=GRPOConfig(learning_rate=args.learning_rate, beta=0.0, loss_type="grpo", temperature=1.0),
                  callbacks=[curve])
    player = main_agent(trainer)
    trained_values = deal_values(engine, player, args.eval_games, args.max_turns)
    print(trainer.leaderboard)
    engine.close()
    diff, half = mean_ci([t - b for t, b in zip(trained_values, base_values)])
    (mb, hb), (mt, ht) = mean_ci(base_values), mean_ci(trained_values)
    print(json.dumps({
        "deal_value_base": round(mb, 4), "deal_value_trained": round(mt, 4),
        "ci95": [round(diff - half, 4), round(diff + half, 4)],  # of the paired difference trained - base
        "ci95_base": [round(mb - hb, 4), round(mb + hb, 4)], "ci95_trained": [round(mt - ht, 4), round(mt + ht, 4)],
        "eval_games": args.eval_games, "credit": args.credit, "player": player, "epochs": args.epochs,
        "minutes": round((time.time() - start) / 60, 2), "curve": curve.rows}))


if __name__ == "__main__":
    main()
