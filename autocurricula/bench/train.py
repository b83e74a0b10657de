"""``autocurricula bench train``: the fused multi-player update, measured side by side.

- ``fused_vs_sequential``: tokens/s of one fused update of 8 players / 8 single-player updates of
  the same turns (same Updater, same engine);
- ``grpo_vs_sft``: tokens/s of our GRPO step / a plain mlx-lm LoRA SFT step (cross-entropy via
  ``mlx_lm.tuner``, ``optim.AdamW``) on the same rows of one player;
- ``fused_vs_sequential_small``: the same with 2 short turns per player;
- ``peak_memory_mb``: MLX peak memory of one update with 1, 8 and 64 players (same turns per player,
  ``max_tokens_per_microbatch=2048``): bounded by the token budget, not by the number of players.
Turns are synthetic (random token ids, random +-1 advantages) with the shape of a league's turns.

``--workload tictactoe|kuhn|negotiation|dataset`` (:func:`run_workload`) measures instead the
tree-packed update on one round of real games: the tokens of the round's rows each on its own
(``row_tokens``) against the nodes of each learner's prefix trie (``tree_tokens``), and the round's
update run tree-packed and per row side by side (seconds, peak memory, tokens computed, estimated
GFLOP/s against the machine's GEMM ceiling), per round and as median, min and max over
``--repeats`` rounds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

import numpy as np

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.bench.engine import gemm_ceiling, model_config
from autocurricula.bench.workloads import LEARNERS, WORKLOADS, play_round
from autocurricula.engine import blas as _blas
def _turns(names, per_player, prompt_len, completion_len, vocab, seed=0):
    from autocurricula.records import Turn

    rng = np.random.default_rng(seed)
    out = []
    for n in names:
        for j in range(per_player):
            t = Turn(n, f"g{j}", "X", rng.integers(3, vocab, prompt_len).tolist(),
                     rng.integers(3, vocab, completion_len).tolist(), [-3.0] * completion_len, reward=0.0)
            t.advantage = float(rng.choice([-1.0, 1.0]))
            out.append(t)
    return out


def _best(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _sft_rate(model_path, turns, rank, repeats):
    """A plain mlx-lm LoRA SFT step on the same rows (mlx-lm's own LoRA layers and loss)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm.tuner.trainer import default_loss
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from autocurricula.engine.models import load

    model, _ = load(str(model_path))
    model.freeze()
    linear_to_lora_layers(model, len(model.layers), {"rank": rank, "scale": 2.0, "dropout": 0.0,
                                                      "keys": ["self_attn.q_proj", "self_attn.v_proj"]})
    width = max(len(t.prompt_ids) + len(t.completion_ids) for t in turns)
    batch = np.zeros((len(turns), width), np.int32)
    lengths = np.zeros((len(turns), 2), np.int32)
    for i, t in enumerate(turns):
        ids = t.prompt_ids + t.completion_ids
        batch[i, : len(ids)] = ids
        lengths[i] = (len(t.prompt_ids), len(ids) - 1)
    batch, lengths = mx.array(batch), mx.array(lengths)
    opt = optim.AdamW(learning_rate=1e-4, bias_correction=True)
    step = nn.value_and_grad(model, default_loss)

    def once():
        (loss, _), grads = step(model, batch, lengths)
        opt.update(model, grads)
        mx.eval(loss, model.trainable_parameters(), opt.state)

    once()
    tokens = sum(len(t.completion_ids) for t in turns)
    return tokens / _best(once, repeats)


def run(model: str | None = None, players: int = 8, per_player: int = 16, prompt_len: int = 48,
        completion_len: int = 8, rank: int = 8, repeats: int = 3) -> dict:
    import mlx.core as mx

    from autocurricula.training.config import GRPOConfig
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.training import Updater

    if model is None:
        model = _bench_model()
    engine = Engine(model, config=EngineConfig(max_slots=64, initial_rank=rank))
    spec = LoraSpec(r=rank, lora_alpha=2 * rank)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    names = [f"p{i}" for i in range(64)]
    for i, n in enumerate(names):
        engine.load_adapter(n, AdapterWeights.random(dims, spec, seed=i))
    vocab = engine.vocab_size
    up = Updater(engine, GRPOConfig(learning_rate=1e-5))
    turns = _turns(names[:players], per_player, prompt_len, completion_len, vocab)
    tokens = sum(len(t.completion_ids) for t in turns)
    up.step(turns)  # warm-up
    fused = _best(lambda: up.step(turns), repeats)
    by_player = [[t for t in turns if t.player == n] for n in names[:players]]
    sequential = _best(lambda: [up.step(ts) for ts in by_player], repeats)
    result = {"model": model, "blas": _blas.describe(), "device": str(mx.default_device()), "players": players,
              "turns_per_player": per_player, "prompt_len": prompt_len, "completion_len": completion_len,
              "fused_tok_s": round(tokens / fused, 1), "sequential_tok_s": round(tokens / sequential, 1),
              "fused_vs_sequential": round(sequential / fused, 2)}

    # league-sized per-player work (2 short turns each): fixed per-step costs dominate here
    small = _turns(names[:players], 2, 32, 4, vocab, seed=1)
    small_by = [[t for t in small if t.player == n] for n in names[:players]]
    up.step(small)
    small_fused = _best(lambda: up.step(small), repeats)
    small_seq = _best(lambda: [up.step(ts) for ts in small_by], repeats)
    result["fused_vs_sequential_small"] = round(small_seq / small_fused, 2)

    one = by_player[0]
    grpo = len(one) * completion_len / _best(lambda: up.step(one), repeats)
    sft = engine.call(_sft_rate, model, one, rank, repeats).result()  # MLX work on the engine thread
    result.update(grpo_tok_s=round(grpo, 1), sft_tok_s=round(sft, 1), grpo_vs_sft=round(grpo / sft, 2))

    memory = {}
    capped = Updater(engine, GRPOConfig(learning_rate=1e-5, max_tokens_per_microbatch=2048))
    for n_players in (1, 8, 64):
        ts = _turns(names[:n_players], per_player, prompt_len, completion_len, vocab, seed=n_players)
        engine.call(mx.reset_peak_memory).result()
        capped.step(ts)
        memory[str(n_players)] = round(engine.call(mx.get_peak_memory).result() / 2**20, 1)
    result["peak_memory_mb"] = memory
    engine.close()
    return result


GOALS = {"fused_vs_sequential": 3.0, "grpo_vs_sft": 0.8}


def format_table(r: dict) -> str:
    lines = [f"model {r['model']}  |  BLAS {r['blas']}  |  device {r['device']}",
             f"{r['players']} players x {r['turns_per_player']} turns, prompt {r['prompt_len']} + completion "
             f"{r['completion_len']} tokens", ""]
    lines.append(f"fused {r['fused_tok_s']:.0f} tok/s, sequential {r['sequential_tok_s']:.0f} tok/s, "
                 f"GRPO (1 player) {r['grpo_tok_s']:.0f} tok/s, mlx-lm LoRA SFT {r['sft_tok_s']:.0f} tok/s")
    lines.append(f"{'fused_vs_sequential_small':<26} {r['fused_vs_sequential_small']:>4}   (2 turns of 4 tokens per player)")
    for key, goal in GOALS.items():
        lines.append(f"{key:<22} {r[key]:>8}   goal >= {goal}  ({'ok' if r[key] >= goal else 'below goal'})")
    lines.append("peak memory (MB) by players: " + ", ".join(f"{k}: {v}" for k, v in r["peak_memory_mb"].items()))
    return "\n".join(lines)


REPEATS_WORKLOAD = 3


def round_tokens(turns, budget: int) -> dict:
    """What one round's turns cost an update: ``row_tokens`` (each row on its own), ``tree_tokens``
    (each learner's prefix trie) and ``padded_tokens`` (the update's micro-batches, ``budget``
    padded tokens each), with ``turns`` and ``learners``."""
    from autocurricula.training.trie import token_counts
    from autocurricula.training.update import Row, microbatches

    players = sorted({t.player for t in turns})
    rows = [Row(players.index(t.player), list(t.prompt_ids) + list(t.completion_ids), len(t.prompt_ids),
                len(t.completion_ids), 0.0, [], 1.0) for t in turns]
    counts = token_counts([r.player for r in rows], [r.ids for r in rows])
    padded = sum(len(mb) * (max(len(r.ids) for r in mb) - 1) for mb in microbatches(rows, budget))
    return {**counts, "padded_tokens": padded, "turns": len(turns), "learners": len(players)}


def _spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def run_workload(workload: str, model: str | None = None, games: int | None = None,
                 repeats: int = REPEATS_WORKLOAD, rank: int = 8, update: bool = True) -> dict:
    """``repeats`` rounds of ``workload`` (seeds 0, 1, ...) on the bench model (or ``model``), each
    round's tokens per row and in the learners' tries (:func:`round_tokens`) and, with ``update``,
    the round's update run tree-packed and per row side by side (:func:`update_side_by_side`):
    per round and as median, min and max, the tokens computed, the time and the peak memory of tree
    over rows, and the tree update's estimated GFLOP/s over the machine's GEMM GFLOP/s."""
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.training.config import GRPOConfig

    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    games = WORKLOADS[workload][2] if games is None else games
    for flag, value in (("games", games), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--{flag} must be a whole number of at least 1, got {value!r}")
    model = model or _bench_model()
    engine = Engine(model, config=EngineConfig(max_slots=8, initial_rank=rank))
    try:
        spec = LoraSpec(r=rank, lora_alpha=2 * rank)
        dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
        for i, n in enumerate(LEARNERS):
            engine.load_adapter(n, AdapterWeights.random(dims, spec, seed=i))
        budget = GRPOConfig().max_tokens_per_microbatch
        rounds = []
        for seed in range(repeats):
            t0 = time.perf_counter()
            turns = play_round(engine, workload, games, seed)
            played = round(time.perf_counter() - t0, 2)
            rounds.append({**round_tokens(turns, budget), "games": games, "seconds": played,
                           **(update_side_by_side(engine, turns, seed) if update else {})})
        ceiling = gemm_ceiling(sizes=(1024,), seconds=0.3) if update else None
    finally:
        engine.close()
    for r in rounds:
        r["tree_ratio"] = round(r["tree_tokens"] / max(1, r["row_tokens"]), 4)
        r["padded_ratio"] = round(r["padded_tokens"] / max(1, r["row_tokens"]), 4)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    out = {"workload": workload, "what": WORKLOADS[workload][3], "model": model, "games": games, "repeats": repeats,
           "rounds": rounds, "tree_ratio": _spread([r["tree_ratio"] for r in rounds]),
           "cores": os.cpu_count(), "load_average": [round(x, 2) for x in load] if load else None}
    if update:
        flops = [update_flops(model_config(model), r) for r in rounds]
        for r, f in zip(rounds, flops):
            r["tree_gflops"] = round(f["tree"] / r["tree_s"] / 1e9, 2)
        out.update({"time_ratio": _spread([r["tree_s"] / r["rows_s"] for r in rounds]),
                    "memory_ratio": _spread([r["tree_peak_mb"] / r["rows_peak_mb"] for r in rounds]),
                    "computed_ratio": _spread([r["tree_computed"] / r["row_tokens"] for r in rounds]),
                    "gemm_gflops": round(ceiling / 1e9, 1),
                    "ceiling_fraction": _spread([r["tree_gflops"] * 1e9 / ceiling for r in rounds])})
    return out


def update_side_by_side(engine, turns, seed: int, repeats: int = 3) -> dict:
    """One round's update, tree-packed and per row, interleaved (tree, rows, rows, tree, ...) on
    the same turns after one warm-up step of each: the best of ``repeats`` seconds of each, MLX's
    peak memory of each, the tokens each computed.
    Advantages are +-1 (seeded) so that no row is skipped; the rate is 0, so the weights stay."""
    import mlx.core as mx

    from autocurricula.training import Updater
    from autocurricula.training.config import GRPOConfig

    rng = np.random.default_rng(seed)
    turns = [dataclasses.replace(t, advantage=float(rng.choice([-1.0, 1.0]))) for t in turns]
    updaters = {k: Updater(engine, GRPOConfig(learning_rate=0.0, packing=k)) for k in ("tree", "rows")}
    best, peak, computed = {k: float("inf") for k in updaters}, {k: 0.0 for k in updaters}, {}
    for k in updaters:  # warm-up: first-call allocations and kernel set-up
        updaters[k].step(turns)
    order = [k for i in range(repeats) for k in (("tree", "rows") if i % 2 == 0 else ("rows", "tree"))]
    for k in order:
        engine.call(mx.reset_peak_memory).result()
        t0 = time.perf_counter()
        m = updaters[k].step(turns)
        best[k] = min(best[k], time.perf_counter() - t0)
        peak[k] = max(peak[k], engine.call(mx.get_peak_memory).result() / 2**20)
        computed[k] = m["computed_tokens"]
    return {"tree_s": round(best["tree"], 3), "rows_s": round(best["rows"], 3), "tree_peak_mb": round(peak["tree"], 1),
            "rows_peak_mb": round(peak["rows"], 1), "tree_computed": computed["tree"], "rows_computed": computed["rows"],
            "completion_tokens": sum(len(t.completion_ids) for t in turns)}


def update_flops(config: dict, r: dict) -> dict:
    """Estimated model FLOPs of a round's update (frozen base: forward plus the backward's activation
    gradients, about twice the forward; the LM head only where a completion token is read)."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    layers, inter = config["num_hidden_layers"], config.get("intermediate_size", 4 * hidden)
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    body = 2 * layers * (hidden * head_dim * (heads * 2 + kv * 2) + 3 * hidden * inter)
    attn = 2 * 2 * layers * heads * head_dim * (r["row_tokens"] / max(1, r["turns"])) / 2  # mean depth ~ half a row
    head = 2 * hidden * vocab
    return {k: 2 * (r[f"{k}_computed"] * (body + attn) + r["completion_tokens"] * head) for k in ("tree", "rows")}


def format_workload(r: dict) -> str:
    timed = "time_ratio" in r
    lines = [f"bench train --workload {r['workload']}: {r['what']}",
             f"model {r['model']}  |  {r['games']} games a round, {r['repeats']} rounds  |  cores {r['cores']}, "
             f"load average {r['load_average']}", "",
             f"{'round':>5} {'games':>6} {'turns':>6} {'row tokens':>11} {'tree tokens':>12} {'tree/row':>9} "
             f"{'padded/row':>11}" + (f" {'tree s':>7} {'rows s':>7} {'tree MB':>8} {'rows MB':>8} {'GFLOP/s':>8}"
                                      if timed else "")]
    for i, x in enumerate(r["rounds"]):
        line = (f"{i:>5} {x['games']:>6} {x['turns']:>6} {x['row_tokens']:>11} {x['tree_tokens']:>12} "
                f"{x['tree_ratio']:>9.3f} {x['padded_ratio']:>11.3f}")
        if timed:
            line += (f" {x['tree_s']:>7.3f} {x['rows_s']:>7.3f} {x['tree_peak_mb']:>8.1f} {x['rows_peak_mb']:>8.1f} "
                     f"{x['tree_gflops']:>8.2f}")
        lines.append(line)

    def spread(name, s):
        return f"{name}: median {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f})"

    lines += ["", spread("tree_tokens / row_tokens", r["tree_ratio"])]
    if timed:
        lines += [spread("update tokens computed, tree / per-row rows", r["computed_ratio"]),
                  spread("update seconds, tree / per row", r["time_ratio"]),
                  spread("update peak memory, tree / per row", r["memory_ratio"]),
                  spread(f"tree update GFLOP/s / GEMM ceiling {r['gemm_gflops']} GFLOP/s", r["ceiling_fraction"])]
    return "\n".join(lines)


def _bench_model() -> str:
    from pathlib import Path

    from autocurricula.engine.tiny import build_tiny_model

    return str(build_tiny_model(Path.home() / ".cache" / "autocurricula" / "bench-h256-l4-a4-v1024",
                                intermediate_size=512))


def main(args) -> None:
    workload = getattr(args, "workload", None)
    if workload is not None:
        r = run_workload(workload, model=args.model, games=args.games,
                         repeats=args.repeats if args.repeats is not None else (1 if args.quick else REPEATS_WORKLOAD))
        print(json.dumps(r) if args.json else format_workload(r))
        return
    r = run(model=args.model)
    print(json.dumps(r) if args.json else format_table(r))
