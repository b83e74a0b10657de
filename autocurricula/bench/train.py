"""``autocurricula bench train``: the fused multi-player update, measured side by side.

- ``fused_vs_sequential``: tokens/s of one fused update of 8 players / 8 single-player updates of
  the same turns (same Updater, same engine);
- ``grpo_vs_sft``: tokens/s of our GRPO step / a plain mlx-lm LoRA SFT step (cross-entropy via
  ``mlx_lm.tuner``, ``optim.AdamW``) on the same rows of one player;
- ``fused_vs_sequential_small``: the same with 2 short turns per player;
- ``peak_memory_mb``: MLX peak memory of one update with 1, 8 and 64 players (same turns per player,
  ``max_tokens_per_microbatch=2048``): bounded by the token budget, not by the number of players.
Turns are synthetic (random token ids, random +-1 advantages) with the shape of a league's turns.
"""

from __future__ import annotations

import json
import time

import numpy as np

import autocurricula  # noqa: F401  (fast BLAS before mlx)
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
    from autocurricula.engine.tiny import build_tiny_model
    from autocurricula.training import Updater

    if model is None:
        from pathlib import Path

        model = str(build_tiny_model(Path.home() / ".cache" / "autocurricula" / "bench-h256-l4-a4-v1024",
                                     intermediate_size=512))
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


def main(args) -> None:
    r = run(model=args.model)
    print(json.dumps(r) if args.json else format_table(r))
