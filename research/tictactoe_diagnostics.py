"""Diagnostics of tic-tac-toe learning on the tiny model: what limits it and what the model can learn.

    python research/tictactoe_diagnostics.py static                  # the board-blind rule's figures
    python research/tictactoe_diagnostics.py agree ADAPTER_FOLDER    # how often a player follows it
    python research/tictactoe_diagnostics.py supervised --steps 1600 # full fine-tune on minimax's moves
    python research/tictactoe_diagnostics.py supervised --lora --steps 800   # the same through our Updater
    python research/tictactoe_diagnostics.py targets [ADAPTER_FOLDER] # how right greedy branch values are
    python research/tictactoe_diagnostics.py regression --steps 600  # branch "moves" credit with exact values
    python research/tictactoe_diagnostics.py memo --games 64         # branch time with and without the greedy memo
    python research/tictactoe_diagnostics.py bandit --epochs 40      # RL with a perfect per-move reward
    python research/tictactoe_diagnostics.py scripted --minimax-share 0.5 --openings 0-6 --epochs 40
    python research/tictactoe_diagnostics.py scripted --credit q --openings 0-4 --learning-rate 2e-3 --epochs 50
    python research/tictactoe_diagnostics.py cost --heads-list 4,8,16,32   # time per step by head count
    python research/tictactoe_diagnostics.py opponents runs/tictactoe-league   # whom the main agent met

Every mode starts from the same cached warm base as the examples and prints JSON lines.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import AutocurriculumConfig, AutocurriculumTrainer, GRPOConfig
from autocurricula.credit import QCredit
from autocurricula.records import Turn
from autocurricula.engine import Engine, LoraSpec
from autocurricula.eval.tictactoe import greedy_table
from autocurricula.games import tictactoe as T
from autocurricula.loop.pool import is_scripted

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the examples' warm base
from ttt_common import CACHE, HEADS, tiny_base, warm_base  # noqa: E402

ORDER = (5, 1, 3, 7, 9, 2, 4, 6, 8)  # center, corners, edges


def lora_spec(args) -> LoraSpec:
    return LoraSpec(r=args.rank, lora_alpha=args.alpha or 2 * args.rank, target_modules="all-linear")


def static_table() -> dict:
    """The board-blind rule: the first free cell in ``ORDER``."""
    return {(b, m): next(c for c in ORDER if b[c - 1] == ".") for b, m in T.reachable_positions()}


def figures(table, games) -> dict:
    return {k: round(v, 3) for k, v in T.evaluate_table(table, games=games).items()}


def minimax_examples(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, move) at uniformly drawn positions, the move uniform among the optimal ones."""
    rng, positions = random.Random(seed), T.reachable_positions()
    out = []
    for _ in range(n):
        b, m = positions[rng.randrange(len(positions))]
        out.append((T.render_prompt(b, m), str(rng.choice(sorted(T.optimal_moves(b, m))))))
    return out


def supervised(args, base):
    if not args.lora:  # every weight, as the warm-up does
        from autocurricula.training.warmup import sft_warmup

        t = time.time()
        out = sft_warmup(base, CACHE / f"{base.name}-minimax-sft{args.steps}-lr{args.learning_rate}",
                         minimax_examples(20000), steps=args.steps, learning_rate=args.learning_rate)
        engine = Engine(str(out))
        print(json.dumps({"steps": args.steps, "minutes": round((time.time() - t) / 60, 2),
                          **figures(greedy_table(engine, None), args.eval_games)}))
        engine.close()
        return
    # LoRA through our Updater: advantage-1 turns with the current logprobs make the GRPO loss a
    # supervised one, so this checks the update path against plain supervised learning
    from autocurricula.loop.pool import fresh_adapter
    from autocurricula.training import Updater

    engine = Engine(str(base))
    lora = lora_spec(args)
    dims = {p: engine.linear_dims[p] for p in lora.resolve(engine.linear_dims)}
    engine.load_adapter("p", fresh_adapter(dims, lora, np.random.default_rng(0)))
    updater = Updater(engine, GRPOConfig(learning_rate=args.learning_rate, beta=0.0, loss_type="grpo"))
    examples, eos, t = minimax_examples(20000), engine.tokenizer.eos_token_id, time.time()
    rng = random.Random(0)
    for step in range(args.steps + 1):
        if step % args.eval_every == 0:
            print(json.dumps({"step": step, "minutes": round((time.time() - t) / 60, 2),
                              **figures(greedy_table(engine, "p"), args.eval_games)}), flush=True)
        if step == args.steps:
            break
        turns = []
        for i in range(64):
            prompt, move = examples[rng.randrange(len(examples))]
            p, c = engine.encode(prompt), engine.encode(move) + [eos]
            logits = engine.logits(p + c, "p")[len(p) - 1:len(p) - 1 + len(c)].astype(np.float64)
            top = logits.max(-1, keepdims=True)
            logp = logits[np.arange(len(c)), c] - (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
            turns.append(Turn("p", f"s{step}-{i}", "X", p, c, logp.tolist(), reward=1.0, advantage=1.0))
        updater.step(turns)
    engine.close()


def target_quality(table: dict, tau: float = 0.25, clip: float = 2.0) -> dict:
    """How right the targets of ``BranchCredit(advantage="moves")`` with greedy continuations are, given the
    greedy policy ``table`` that plays the continuations (both sides): at every reachable position,
    each move's value is the outcome of greedy play after it ("greedy"), or after the opponent's best
    reply to it and greedy play on ("best_reply", ``BestReplyCredit(replies=True)``). Reported: the share of
    positions whose best-valued moves are all optimal, and the mean target probability
    (``move_distribution``) on optimal moves."""
    from functools import lru_cache

    from autocurricula.credit import move_distribution

    sign = {"X": 1, "O": -1}

    @lru_cache(None)
    def greedy_outcome(board: str) -> int:  # for X, greedy play from board (an illegal move loses)
        w = T.winner(board)
        if w:
            return 0 if w == "draw" else sign[w]
        mark = T.to_move(board)
        move = table[(board, mark)]
        if move is None or board[move - 1] != ".":
            return -sign[mark]
        return greedy_outcome(T.apply_move(board, move, mark))

    def after_reply(board, mark, move):
        b = T.apply_move(board, move, mark)
        if T.winner(b):
            return sign[mark] * greedy_outcome(b)
        return min(sign[mark] * greedy_outcome(T.apply_move(b, r, T.to_move(b))) for r in T.legal_moves(b))

    rules = {"greedy": lambda b, m, mv: sign[m] * greedy_outcome(T.apply_move(b, mv, m)), "best_reply": after_reply}
    out, positions = {}, T.reachable_positions()
    for name, value in rules.items():
        top_right = mass = 0.0
        for b, m in positions:
            moves = T.legal_moves(b)
            q = [value(b, m, mv) for mv in moves]
            best, optimal = max(q), T.optimal_moves(b, m)
            top_right += all(mv in optimal for mv, v in zip(moves, q) if v == best)
            mass += sum(p for mv, p in zip(moves, move_distribution(q, tau, clip)) if mv in optimal)
        out[name] = {"top_moves_optimal": round(top_right / len(positions), 3),
                     "target_mass_on_optimal": round(mass / len(positions), 3)}
    return out


def memo(args, base):
    """Branch credit's cost with and without the replayer's greedy memo, side by side: ``--games``
    self-play games of the warm base, then one round of best-reply branch credit (every turn, every
    cell, every reply, greedy on) timed ``--repeats`` times each way, alternating. The values must
    come out the same."""
    from autocurricula.arena.arena import Arena, GameRecord
    from autocurricula.arena.replay import Replayer
    from best_reply_credit import BestReplyCredit
    from autocurricula.arena.arena import run_async

    engine = Engine(str(base))
    arena = Arena(engine, seed=args.seed, max_tokens=2)
    seats = [{"id": "base", "adapter": None, "seat": 0}, {"id": "base", "adapter": None, "seat": 1}]
    games = [(T.play, seats, GameRecord(f"g{i}", seats, calls=[]), "tictactoe") for i in range(args.games)]
    records = run_async(arena.run(games, 128))
    for r in records:
        for t in r.turns:
            t.reward = r.rewards[t.seat]
    times, targets = {"memo": [], "no_memo": []}, {}
    for rep in range(args.repeats):
        for name in ("no_memo", "memo") if rep % 2 else ("memo", "no_memo"):
            credit = BestReplyCredit(samples=1, advantage="moves", continuation_temperature=0.0, replies=True,
                                     move_loss="cross_entropy")
            replayer = Replayer(arena, T.play, "tictactoe", max_concurrent=128)
            if name == "no_memo":
                replayer.greedy_memo = None
            t0 = time.perf_counter()
            credit.see_round(records, replayer)
            times[name].append(time.perf_counter() - t0)
            targets[name] = [round(t.advantage, 9) for t in credit.extra_turns([t for r in records for t in r.turns])]
            games_played = credit.metrics()["credit/branch_games"]
    engine.close()
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(json.dumps({"branch_games": games_played, "seconds": {k: round(v, 2) for k, v in med.items()},
                      "speedup": round(med["no_memo"] / med["memo"], 2),
                      "same_targets": targets["memo"] == targets["no_memo"]}))


def regression(args, base):
    """The ``BranchCredit(advantage="moves")`` regression with exact values: each step draws ``--states``
    positions uniformly and regresses the policy toward the bounded softmax of the moves' perfect-play
    values (``--move-temperature``, ``--move-clip``), as branch credit does with values from branches.
    The best case of that credit: how many updates of how many states reach which optimal-move rate."""
    from autocurricula.credit import move_advantages, move_distribution
    from autocurricula.loop.pool import fresh_adapter
    from autocurricula.training import Updater

    engine = Engine(str(base))
    lora = lora_spec(args)
    dims = {p: engine.linear_dims[p] for p in lora.resolve(engine.linear_dims)}
    engine.load_adapter("p", fresh_adapter(dims, lora, np.random.default_rng(0)))
    updater = Updater(engine, GRPOConfig(learning_rate=args.learning_rate, beta=0.0, loss_type="grpo",
                                         num_iterations=args.num_iterations))
    rng, positions, eos, t = random.Random(args.seed), T.reachable_positions(), engine.tokenizer.eos_token_id, time.time()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0:
            table = greedy_table(engine, "p")
            from autocurricula.eval.tictactoe import adversarial_figures

            adv = adversarial_figures(table)
            print(json.dumps({"step": step, "minutes": round((time.time() - t) / 60, 2), **figures(table, args.eval_games),
                              "loses_as_x": adv["loses_to_best_response_as_x"],
                              "loses_as_o": adv["loses_to_best_response_as_o"],
                              "value_losing_share": round(adv["value_losing_share"], 4)}), flush=True)
        if step == args.steps:
            break
        turns, pairs, rows = [], [], []
        for i in range(args.states):
            b, m = positions[rng.randrange(len(positions))]
            prompt = engine.encode(T.render_prompt(b, m))
            values = T.minimax_values(b, m)
            moves = sorted(values)
            rows.append((i, prompt, moves, [float(values[mv]) for mv in moves]))
            pairs += [(prompt, engine.encode(str(mv)) + [eos]) for mv in moves]
        logps = iter(engine.completion_logprobs(pairs, "p"))
        for i, prompt, moves, q in rows:
            lp = [next(logps) for _ in moves]
            adv = (move_advantages(q, lp, args.move_temperature, args.move_clip) if args.move_loss == "residual"
                   else move_distribution(q, args.move_temperature, args.move_clip))
            for mv, a in zip(moves, adv):
                c = engine.encode(str(mv)) + [eos]
                turns.append(Turn("p", f"s{step}-{i}", "X", prompt, c, [0.0] * len(c), reward=0.0, advantage=a,
                                  target=True))
        updater.step(turns)
    engine.close()


class _Probe(AutocurriculumTrainer):
    """One learner (``role="main"``) in ``n`` games per round; ``spec(i, main, scripted)`` seats game i."""

    def __init__(self, config, spec, opponents, n):
        super().__init__(config, opponents)
        self.spec, self.n = spec, n

    def entry(self):
        return [{"role": "main"}] + [dict(o) for o in self.opponents] if self.current_epoch == 0 else []

    def match(self):
        main = next(p for p in self.players if p["role"] == "main")
        others = {p["id"]: p for p in self.players if is_scripted(p)}
        return [self.spec(i, main, others) for i in range(self.n)]


def probe(args, base, play, spec, opponents, n, credit):
    start = time.time()

    def evaluate(trainer):
        if trainer.current_epoch % args.eval_every == args.eval_every - 1 or trainer.current_epoch == args.epochs - 1:
            player = next(p for p in trainer.players if p["role"] == "main")
            print(json.dumps({"epoch": trainer.current_epoch, "updates": trainer.step,
                              "minutes": round((time.time() - start) / 60, 2),
                              **figures(greedy_table(trainer.engine, player["id"]), args.eval_games)}), flush=True)

    config = AutocurriculumConfig(epochs=args.epochs, rounds=args.rounds, output_dir=args.output_dir,
                                  overwrite_output_dir=True, progress=False,
                                  ratings={"bt_bootstrap": 0}, max_tokens=2, save_strategy="no",
                                  credit=QCredit(target_coef=args.q_targets, target_min_visits=args.q_target_min_visits)
                                  if credit == "q" else credit, arena={"max_concurrent_games": 256},
                                  engine={"max_batch": 128}, seed=args.seed)
    trainer = _Probe(config, spec, opponents, n)
    grpo = GRPOConfig(learning_rate=args.learning_rate, beta=args.beta, loss_type="grpo",
                      temperature=args.temperature, entropy_coef=args.entropy_coef,
                      num_iterations=args.num_iterations)
    trainer.train(str(base), play, lora_config=lora_spec(args), grpo_config=grpo, callbacks=[evaluate])
    trainer.engine.close()


def bandit(args, base):
    """Each game is one uniformly drawn position; +1 for an optimal move, -1 otherwise (-1.5 illegal).
    ``--group G`` asks G moves per position and uses GRPO credit within each group."""
    rng, positions, state = random.Random(args.seed), T.reachable_positions(), {"k": 0, "pos": None}

    async def play(players, model, tokenizer=None):
        k = state["k"]
        state["k"] += 1
        if k % args.group == 0:
            state["pos"] = positions[rng.randrange(len(positions))]
        board, mark = state["pos"]
        out = await model.generate(players[0], T.render_prompt(board, mark), group=f"q{k // args.group}")
        move = T.parse_move(out.text)
        if move is None or board[move - 1] != ".":
            return [-1.5]
        return [1.0 if move in T.optimal_moves(board, mark) else -1.0]

    play.__module__ = "tictactoe_bandit"
    probe(args, base, play, lambda i, main, others: (main,), [], args.games,
          "grpo" if args.group > 1 else "rae")


def scripted(args, base):
    """One learner against minimax (share ``--minimax-share``) and uniform random, half the games as X,
    after ``--openings lo-hi`` random moves."""
    openings = tuple(int(x) for x in args.openings.split("-"))
    rng = random.Random(args.seed)

    async def play(players, model, tokenizer=None):
        return await T.play(players, model, tokenizer, opening_moves=openings, rng=rng)

    play.__module__ = "tictactoe"

    def spec(i, main, others):
        opponent = others["minimax"] if i < args.minimax_share * args.games else others["random"]
        return (main, opponent) if i % 2 == 0 else (opponent, main)

    opponents = [{"id": "minimax", "role": "minimax", "policy": T.minimax_policy},
                 {"id": "random", "role": "random", "policy": T.random_policy}]
    probe(args, base, play, spec, opponents, args.games, args.credit)


def opponents(run_dir: str, player: str = "main_agent-0") -> dict:
    """Whom ``player`` met in a run's ``match_history.jsonl``: share of its games per opponent kind
    (the id without its counter; ``self`` = a game against itself)."""
    from collections import Counter
    from pathlib import Path

    counts = Counter()
    for line in (Path(run_dir) / "match_history.jsonl").read_text().splitlines():
        ids = json.loads(line)["players"]
        if player in ids:
            others = [i for i in ids if i != player]
            counts[others[0].rsplit("-", 1)[0] if others else "self"] += 1
    total = sum(counts.values())
    return {"player": player, "games": total, "share": {k: round(v / total, 3) for k, v in counts.most_common()}}


def cost(args):
    """Forward + backward time of one batch of 64 prompts for each head count, timed round-robin in
    one process so the ratios compare like with like (weights do not matter, so no warm-up)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm import load

    heads = [int(h) for h in args.heads_list.split(",")]
    models = {h: load(str(tiny_base(args.hidden, args.layers, h, args.seed))) for h in heads}
    positions = random.Random(args.seed).sample(T.reachable_positions(), 64)
    ids = mx.array([models[heads[0]][1].encode(T.render_prompt(b, m)) for b, m in positions])
    steps = {h: nn.value_and_grad(m, lambda m: m(ids).astype(mx.float32).mean()) for h, (m, _) in models.items()}
    times = {h: [] for h in heads}
    for rep in range(6):
        for h in heads:
            t = time.perf_counter()
            mx.eval(steps[h](models[h][0]))
            if rep:  # the first round compiles and warms caches
                times[h].append(time.perf_counter() - t)
    ms = {h: 1e3 * float(np.median(times[h])) for h in heads}
    for h in heads:
        print(json.dumps({"heads": h, "ms_per_step": round(ms[h], 1), "ratio": round(ms[h] / ms[heads[0]], 2)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["static", "agree", "targets", "memo", "supervised", "regression", "bandit",
                                         "scripted", "cost", "opponents"])
    parser.add_argument("adapter", nargs="?", help="agree, targets: a player's adapter folder (peft format; targets "
                        "without one: the warm base); opponents: a run folder")
    parser.add_argument("--steps", type=int, default=400, help="supervised: optimizer steps of 64 examples")
    parser.add_argument("--lora", action="store_true", help="supervised: LoRA (--rank, --alpha) through the Updater")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (supervised --lora, bandit, scripted)")
    parser.add_argument("--alpha", type=float, default=None, help="LoRA alpha (default 2 x rank)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="updates per epoch")
    parser.add_argument("--games", type=int, default=256, help="games per update")
    parser.add_argument("--states", type=int, default=64, help="regression: positions per update")
    parser.add_argument("--repeats", type=int, default=4, help="memo: timed rounds each way")
    parser.add_argument("--move-temperature", type=float, default=0.25, help="regression: tau")
    parser.add_argument("--move-clip", type=float, default=2.0, help="regression: bound c")
    parser.add_argument("--move-loss", default="residual", choices=["residual", "cross_entropy"],
                        help="regression: the moves' loss")
    parser.add_argument("--group", type=int, default=1, help="bandit: moves asked per position (GRPO groups)")
    parser.add_argument("--minimax-share", type=float, default=0.5)
    parser.add_argument("--openings", default="0-0", help="scripted: random opening moves, lo-hi")
    parser.add_argument("--credit", default="value", choices=["rae", "value", "q", "grpo", "constant"])
    parser.add_argument("--q-targets", type=float, default=0.0, help="with --credit q: QCredit.target_coef, also train "
                        "every visited position toward its best known move (0 = off)")
    parser.add_argument("--q-target-min-visits", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=None, help="default 1e-3 (supervised) or 5e-4")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--num-iterations", type=int, default=1, help="optimizer steps per batch of turns")
    parser.add_argument("--eval-every", type=int, default=5, help="epochs (or supervised steps) between evaluations")
    parser.add_argument("--eval-games", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--heads-list", default="4,8,16,32", help="cost: head counts to time side by side")
    parser.add_argument("--warmup-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/tictactoe-diagnostics")
    args = parser.parse_args()
    if args.learning_rate is None:
        args.learning_rate = 1e-3 if args.mode == "supervised" and not args.lora else 5e-4

    if args.mode == "cost":
        cost(args)
        return
    if args.mode == "opponents":
        if not args.adapter:
            parser.error("opponents needs a run folder, e.g. runs/tictactoe-league")
        print(json.dumps(opponents(args.adapter)))
        return
    if args.mode == "static":
        print(json.dumps({"rule": "first free of center, corners, edges", **figures(static_table(), args.eval_games)}))
        return
    base = warm_base(hidden=args.hidden, layers=args.layers, heads=args.heads, steps=args.warmup_steps, seed=args.seed)
    if args.mode == "targets":
        from autocurricula.engine.adapters import load_folder

        engine = Engine(str(base))
        if args.adapter:
            engine.load_adapter("a", load_folder(args.adapter))
        table = greedy_table(engine, "a" if args.adapter else None)
        engine.close()
        optimal = sum(mv in T.optimal_moves(b, m) for (b, m), mv in table.items()) / len(table)
        print(json.dumps({"adapter": args.adapter or "warm base", "policy_optimal": round(optimal, 3),
                          **target_quality(table, args.move_temperature, args.move_clip)}))
        return
    if args.mode == "agree":
        from autocurricula.engine.adapters import load_folder

        if not args.adapter:
            parser.error("agree needs an adapter folder, e.g. runs/tictactoe-league/checkpoint-11/adapters/main_agent-0")
        engine = Engine(str(base))
        engine.load_adapter("a", load_folder(args.adapter))
        rule, player, warm = static_table(), greedy_table(engine, "a"), greedy_table(engine, None)
        engine.close()
        share = {name: round(sum(t[k] == rule[k] for k in rule) / len(rule), 3)
                 for name, t in (("player", player), ("warm_base", warm))}
        print(json.dumps({"agrees_with_rule": share}))
        return
    {"supervised": supervised, "regression": regression, "memo": memo, "bandit": bandit,
     "scripted": scripted}[args.mode](args, base)


if __name__ == "__main__":
    main()
