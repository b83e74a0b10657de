"""Engine settings side by side on the `bench peers` rollout workload, with where a round's time goes.

    python research/prefill_ab.py --settings prefix_block=16 prefix_block=4 [--rounds 12]

Each setting is one ``EngineConfig`` override (``key=value``; several joined by ``,``) on its own
engine in this process, with the same model folder, adapters and prompts as ``bench peers --shape
bench`` (64 turns over 8 players, 20-token prompts of 12 shared instruction tokens + 8 new board
tokens every round, 4 sampled tokens at temperature 1). After one warm-up round each, the settings
run interleaved, their order alternating every round (A B, B A, ...), so the machine's load hits
them alike. Prints one JSON line per round, then a summary: per setting the median round time, the
median, min and max of the paired ratio first setting / this one (above 1: this one is faster),
the prefix hit rate, and the share of the time spent in prefill, decode steps and prefix-cache
inserts. ``--long`` adds that many prompts of ``--long-len`` tokens to every round (a mixed-length
batch, for chunked prefill).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.bench.peers import build_spec, model_folder
from autocurricula.engine import Engine, EngineConfig, SamplingParams
from autocurricula.engine import runner, scheduler

SPENT: dict = defaultdict(float)  # (engine id, phase) -> seconds


def _timed(phase, fn):
    def wrapper(first, *args, **kwargs):
        eng = first if isinstance(first, Engine) else first.e
        t0 = time.perf_counter()
        try:
            return fn(first, *args, **kwargs)
        finally:
            SPENT[id(eng), phase] += time.perf_counter() - t0
    return wrapper


def profile() -> None:
    """Time prefill, decode steps and prefix-cache inserts per engine (the scheduler looks the
    runner's functions up at each call)."""
    runner.prefill = _timed("prefill", runner.prefill)
    runner.decode_step = _timed("decode", runner.decode_step)
    scheduler.Scheduler._cache_prefixes = _timed("cache_insert", scheduler.Scheduler._cache_prefixes)


def parse(setting: str) -> dict:
    out = {}
    for part in filter(None, setting.split(",")):
        key, value = part.split("=", 1)
        out[key] = None if value == "None" else json.loads(value) if value[0] in "0123456789-[{tf" else value
    return out


def run_round(engine, prompts, players, params) -> float:
    go = threading.Event()
    engine.call(go.wait, 600)  # hold the engine thread so all turns start in one batch
    futs = [engine.submit(p, o, params) for p, o in zip(prompts, players)]
    t0 = time.perf_counter()
    go.set()
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", required=True, help="EngineConfig overrides, e.g. prefix_block=4")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--shape", default="bench")
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--players", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=20)
    ap.add_argument("--shared", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--long", type=int, default=0, help="extra prompts per round of --long-len tokens")
    ap.add_argument("--long-len", type=int, default=200)
    args = ap.parse_args()
    profile()
    model = model_folder(args.shape)
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_spec(Path(tmp), model, args.turns, args.players, prompt_len=args.prompt_len,
                          shared=args.shared, new_tokens=args.new_tokens, rounds=args.rounds)
        rng = np.random.default_rng(7)
        rounds = [(list(ps) + [rng.integers(3, 500, args.long_len).tolist() for _ in range(args.long)],
                   spec["order"] + spec["order"][: args.long]) for ps in spec["round_prompts"]]
        params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=None)
        engines = []
        for s in args.settings:
            cfg = dict(max_slots=args.players, max_batch=args.turns + args.long, initial_rank=spec["rank"])
            eng = Engine(spec["model"], config=EngineConfig(**{**cfg, **parse(s)}))
            for name in spec["player_names"]:
                eng.load_adapter(name, spec["adapters"][name]["peft"])
            engines.append(eng)
        for eng in engines:  # warm-up: compiles, and fills the prefix cache as a first round would
            run_round(eng, *rounds[0], params)
        SPENT.clear()
        times = defaultdict(list)
        hits0 = [(e.stats["prefix_hit_tokens"], e.stats["prefix_query_tokens"]) for e in engines]
        for r in range(1, args.rounds + 1):
            order = list(range(len(engines)))[:: 1 if r % 2 else -1]
            for i in order:
                times[i].append(run_round(engines[i], *rounds[r], params))
            print(json.dumps({"round": r, **{args.settings[i]: round(times[i][-1], 4) for i in order}}), flush=True)
        summary = {"load_avg": Path("/proc/loadavg").read_text().split()[:3]}
        for i, (s, eng) in enumerate(zip(args.settings, engines)):
            total = sum(times[i])
            ratios = [a / b for a, b in zip(times[0], times[i])]
            hit = eng.stats["prefix_hit_tokens"] - hits0[i][0]
            query = eng.stats["prefix_query_tokens"] - hits0[i][1]
            summary[s] = {"median_s": round(statistics.median(times[i]), 4),
                          "ratio_first_over_this": {"median": round(statistics.median(ratios), 3),
                                                    "min": round(min(ratios), 3), "max": round(max(ratios), 3)},
                          "prefix_hit_rate": round(hit / max(1, query), 3),
                          **{f"{p}_share": round(SPENT[id(eng), p] / total, 3)
                             for p in ("prefill", "decode", "cache_insert")}}
            eng.close()
        for key, value in summary.items():
            print(json.dumps({key: value}))


if __name__ == "__main__":
    main()
