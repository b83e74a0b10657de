"""``autocurricula bench engine``: multi-LoRA continuous batching, measured side by side.

Every figure comes from the same process, model and prompts:
- ``tok_s``: generated tokens/s at batch sizes 1, 8, 32, 64 with no adapter;
- ``mixed_vs_base``: B rows over B distinct players / the same batch with no adapter;
- ``mixed_vs_reload``: 64 requests over 8 players through the engine / the same requests served as
  mlx-lm's server does (one adapter at a time, model reloaded from disk when the adapter changes);
- ``ceiling_fraction``: decode FLOP/s at B=64 / the best dense fp32 GEMM FLOP/s measured here;
- ``hot_swap_failed`` / ``hot_swap_delay_steps``: an adapter update every few steps during a B=64 run;
- ``prefix_hit_rate``: share of prompt tokens whose KV rows came from the engine's prefix cache
  (the runs repeat their prompts, so most of every prompt after the first run; run with
  ``EngineConfig(prefix_cache_mb=0)`` for prefill-bound figures).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.engine import blas as _blas
def gemm_ceiling(sizes=(512, 1024, 2048), seconds: float = 0.5) -> float:
    """Best dense fp32 matmul FLOP/s over a few square sizes (the machine's matmul ceiling)."""
    import mlx.core as mx

    best = 0.0
    for n in sizes:
        a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
        mx.eval(a, b, a @ b)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            mx.eval(a @ b)
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def model_config(model: str) -> dict:
    """The base model's ``config.json`` (a folder or Hub id), read as the engine's loader reads it."""
    from autocurricula.publish.check_model import resolve

    return json.loads((resolve(model) / "config.json").read_text())


def flops_per_token(config: dict, linear_dims: dict, context: int) -> float:
    """Multiply-adds x2 of every linear (incl. the LM head) plus attention over ``context`` tokens."""
    linear = sum(i * o for i, o in linear_dims.values())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    attn = 2 * 2 * context * heads * head_dim * config["num_hidden_layers"]
    return 2 * linear + attn


def _run(engine, jobs, params):
    from autocurricula.engine import SamplingParams

    go = threading.Event()
    engine.call(go.wait, 60)  # hold the thread so the whole batch starts together
    futs = [engine.submit(p, player, SamplingParams(**params)) for p, player in jobs]
    t0 = time.perf_counter()
    go.set()
    outs = [f.result() for f in futs]
    return outs, time.perf_counter() - t0


def _throughput(engine, prompts, players, new_tokens, repeats=2):
    params = dict(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    jobs = list(zip(prompts, players))
    _run(engine, jobs[: max(1, len(jobs) // 4)], dict(params, max_tokens=4))  # warm-up
    best = 0.0
    for _ in range(repeats):
        outs, dt = _run(engine, jobs, params)
        best = max(best, sum(len(o.token_ids) for o in outs) / dt)
    return best


def _decode_rate(engine, prompts, players, new_tokens):
    """Steady-state decode tokens/s: time of a long run minus a short run (removes prefill)."""
    params = dict(temperature=0.0, ignore_eos=True)
    jobs = list(zip(prompts, players))
    _run(engine, jobs, dict(params, max_tokens=2))
    _, short = _run(engine, jobs, dict(params, max_tokens=4))
    _, long = _run(engine, jobs, dict(params, max_tokens=4 + new_tokens))
    return len(jobs) * new_tokens / max(1e-9, long - short)


def _reload_baseline(model_path, folders, order, prompt, new_tokens):
    """mlx-lm's server behaviour: one adapter at a time, reload the model when it changes."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    from autocurricula.engine.models import register

    register()  # mlx-lm finds the families autocurricula adds (OPT)

    current, model, tok = None, None, None
    sampler = make_sampler(temp=0.0)
    t0 = time.perf_counter()
    produced = 0
    for player in order:
        if player != current:
            model, tok = load(str(model_path), adapter_path=str(folders[player]))
            current = player
        for _ in stream_generate(model, tok, prompt, max_tokens=new_tokens, sampler=sampler):
            produced += 1
    return produced / (time.perf_counter() - t0)


def _mlx_lm_decode_rate(model_path, prompts_ids, new_tokens):
    """Decode tokens/s of mlx-lm's own BatchGenerator on the same prompts (reference point)."""
    from mlx_lm import batch_generate

    from autocurricula.engine.models import load

    model, tok = load(str(model_path))

    def timed(n):
        t0 = time.perf_counter()
        out = batch_generate(model, tok, prompts_ids, max_tokens=n, return_token_ids=True)
        return sum(len(t) for t in out.token_ids), time.perf_counter() - t0

    timed(2)
    n_short, t_short = timed(4)
    n_long, t_long = timed(4 + new_tokens)
    return (n_long - n_short) / max(1e-9, t_long - t_short)


def run(model: str | None = None, hidden: int = 256, layers: int = 4, heads: int = 4, vocab: int = 1024,
        batch: int = 64, new_tokens: int = 48, rank: int = 8, targets=("q_proj", "v_proj"), quick: bool = False) -> dict:
    import mlx.core as mx

    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.engine.adapters import write_mlx_folder
    from autocurricula.engine.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="ac-bench-"))
    if model is None:
        cache = Path.home() / ".cache" / "autocurricula" / f"bench-h{hidden}-l{layers}-a{heads}-v{vocab}"
        model = str(build_tiny_model(cache, hidden_size=hidden, num_layers=layers, num_heads=heads,
                                     intermediate_size=2 * hidden, vocab_size=vocab))
    result: dict = {"model": model, "blas": _blas.describe(), "device": str(mx.default_device()),
                    "batch": batch, "new_tokens": new_tokens, "rank": rank, "targets": list(targets)}
    engine = Engine(model, config=EngineConfig(max_slots=batch, max_batch=batch, initial_rank=rank))
    spec = LoraSpec(r=rank, lora_alpha=2 * rank, target_modules=list(targets))
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    for i in range(batch):
        engine.load_adapter(f"p{i}", AdapterWeights.random(dims, spec, seed=i))
    prompt = "The players take turns placing X and O on a three by three board."
    prompts = [f"{prompt} Game {i}." for i in range(batch)]

    result["tok_s"] = {}
    for b in (1, 8, 32, 64):
        if b <= batch:
            result["tok_s"][str(b)] = round(_throughput(engine, prompts[:b], [None] * b, new_tokens), 1)

    # mixed vs base, interleaved twice to even out machine noise
    base_rates, mixed_rates = [], []
    for _ in range(1 if quick else 3):
        base_rates.append(_throughput(engine, prompts, [None] * batch, new_tokens))
        mixed_rates.append(_throughput(engine, prompts, [f"p{i}" for i in range(batch)], new_tokens))
    result["base_tok_s"], result["mixed_tok_s"] = round(max(base_rates), 1), round(max(mixed_rates), 1)
    result["mixed_vs_base"] = round(max(mixed_rates) / max(base_rates), 3)

    # decode FLOP/s at B=batch vs the GEMM ceiling
    decode = _decode_rate(engine, prompts, [None] * batch, new_tokens)
    context = len(engine.encode(prompts[0])) + new_tokens // 2 + 4
    ceiling = gemm_ceiling()
    config = model_config(model)
    per_token = flops_per_token(config, engine.linear_dims, context)
    result["decode_tok_s"] = round(decode, 1)
    result["decode_gflops"] = round(decode * per_token / 1e9, 2)
    result["gemm_ceiling_gflops"] = round(ceiling / 1e9, 2)
    result["ceiling_fraction"] = round(decode * per_token / ceiling, 3)
    mlx_lm_rate = _mlx_lm_decode_rate(model, [engine.encode(p) for p in prompts], new_tokens)
    result["mlx_lm_decode_tok_s"] = round(mlx_lm_rate, 1)
    result["mlx_lm_ceiling_fraction"] = round(mlx_lm_rate * per_token / ceiling, 3)

    # 64 requests over 8 players: engine vs one-adapter-at-a-time with reloads
    n_req, n_players, short = 64, 8, max(8, new_tokens // 2)
    order = [f"p{i % n_players}" for i in range(n_req)]
    engine_rate = _throughput(engine, [prompt] * n_req, order, short, repeats=1)
    folders = {p: write_mlx_folder(engine.adapter_weights(p), work / p, config["num_hidden_layers"])
               for p in sorted(set(order))}
    reload_order = order[: 16] if quick else order
    result["reload_tok_s"] = round(_reload_baseline(model, folders, reload_order, prompt, short), 1)
    result["engine_8_players_tok_s"] = round(engine_rate, 1)
    result["mixed_vs_reload"] = round(engine_rate / result["reload_tok_s"], 2)

    result.update(_hot_swap(engine, prompts, batch, new_tokens, dims, spec))
    # share of prompt tokens served from the prefix cache (these runs repeat their prompts)
    result["prefix_hit_rate"] = engine.stats.get("prefix_hit_rate", 0.0)
    engine.close()
    return result


def _hot_swap(engine, prompts, batch, new_tokens, dims, spec, every_steps=4):
    """Update player p0's adapter every few steps while a B=batch run decodes; count failures."""
    from autocurricula.engine import AdapterWeights, SamplingParams

    delays, stop = [], threading.Event()

    def applied(name, weights, asked_at):
        delays.append(engine.stats["steps"] - asked_at)
        return engine.install(name, weights, validate=False)

    def swapper():
        seed = 10_000
        while not stop.is_set():
            start = engine.stats["steps"]
            while engine.stats["steps"] < start + every_steps and not stop.is_set():
                time.sleep(0.0005)
            seed += 1
            engine.call(applied, "p0", AdapterWeights.random(dims, spec, seed=seed), engine.stats["steps"])

    players = [f"p{i % 8}" for i in range(batch)]
    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    futs = [engine.submit(p, pl, SamplingParams(max_tokens=new_tokens * 2, temperature=0.0, ignore_eos=True))
            for p, pl in zip(prompts, players)]
    failed, swapped = 0, 0
    for f in futs:
        try:
            c = f.result(300)
            swapped += c.swapped
            failed += c.finish_reason != "length"
        except Exception:  # noqa: BLE001 - the figure counts them
            failed += 1
    stop.set()
    thread.join()
    return {"hot_swaps": len(delays), "hot_swap_failed": failed, "hot_swap_rows_spanning_versions": swapped,
            "hot_swap_delay_steps": max(delays) if delays else None,
            "hot_swap_delay_steps_mean": round(sum(delays) / len(delays), 2) if delays else None}


GOALS = {"mixed_vs_base": 0.90, "mixed_vs_reload": 8.0, "ceiling_fraction": 0.5}


def format_table(r: dict) -> str:
    lines = [f"model {r['model']}  |  BLAS {r['blas']}  |  device {r['device']}",
             f"batch {r['batch']}, {r['new_tokens']} new tokens, LoRA r={r['rank']} on {','.join(r['targets'])}", ""]
    lines.append("tok/s (no adapter): " + "  ".join(f"B={b}: {v:.0f}" for b, v in r["tok_s"].items()))
    for key, goal in GOALS.items():
        ok = "ok" if r[key] >= goal else "below goal"
        lines.append(f"{key:<22} {r[key]:>8}   goal >= {goal}  ({ok})")
    lines.append(f"{'decode GFLOP/s':<22} {r['decode_gflops']:>8}   ceiling {r['gemm_ceiling_gflops']} GFLOP/s; "
                 f"mlx-lm BatchGenerator: {r['mlx_lm_ceiling_fraction']} of ceiling")
    lines.append(f"{'hot_swap_failed':<22} {r['hot_swap_failed']:>8}   over {r['hot_swaps']} swaps, "
                 f"delay <= {r['hot_swap_delay_steps']} step(s)")
    return "\n".join(lines)


def main(args) -> None:
    r = run(model=args.model, hidden=args.hidden, layers=args.layers, batch=args.batch,
            new_tokens=args.new_tokens, quick=args.quick)
    print(json.dumps(r) if args.json else format_table(r))
