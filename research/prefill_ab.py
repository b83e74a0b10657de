"""Engine settings side by side on the `bench peers` rollout workload, with where a round's time goes.

    python research/prefill_ab.py --settings prefix_block=16 prefix_block=4 [--rounds 12]
    python research/prefill_ab.py --settings src=/tmp/base prefix_block=4 --long 8 --long-len 300

Each setting is ``EngineConfig`` overrides (``key=value``; several joined by ``,``) and optionally
``src=DIR``, a source tree whose ``autocurricula`` to run (e.g. ``git archive`` of another commit
unpacked there). Each runs its own engine in its own worker process on the model folder, adapters
and prompts of ``bench peers --shape bench`` (64 turns over 8 players, 20-token prompts of 12
shared instruction tokens + 8 new board tokens every round, 4 sampled tokens at temperature 1).
``--long N`` adds N prompts of ``--long-len`` tokens to every round, spread among the turns (a
mixed-length batch). After one warm-up round each, the settings run interleaved, their order
alternating every round (A B, B A, ...), so the machine's load hits them alike.

Prints one JSON line per round, then per setting: the median round time (wall clock, and the
worker's process CPU time, steadier on a loaded machine), the median, min and max of the paired
ratios first setting / this one (above 1: this one is faster), the prefix hit rate, and the shares
of the wall time spent in prefill, decode steps and retiring finished rows (which copies their KV
into the prefix cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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

PHASES = ("prefill", "decode", "retire")
SPENT: dict = defaultdict(float)  # phase -> seconds, in a worker


def _timed(phase, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[phase] += time.perf_counter() - t0
    return wrapper


def profile() -> None:
    """Time prefill, decode steps and retiring finished rows, which copies their KV into the
    prefix cache (the scheduler looks the runner's functions up at each call)."""
    runner.prefill = _timed("prefill", runner.prefill)
    runner.decode_step = _timed("decode", runner.decode_step)
    scheduler.Scheduler.retire = _timed("retire", scheduler.Scheduler.retire)


def parse(setting: str) -> tuple[str | None, dict]:
    """``src=PATH,key=value,...`` -> (source tree or None, EngineConfig overrides)."""
    src, out = None, {}
    for part in filter(None, setting.split(",")):
        key, value = part.split("=", 1)
        if key == "src":
            src = value
        else:
            out[key] = None if value == "None" else json.loads(value) if value[0] in "0123456789-[{tf" else value
    return src, out


def run_round(engine, prompts, players, params) -> float:
    go = threading.Event()
    engine.call(go.wait, 600)  # hold the engine thread so all turns start in one batch
    futs = [engine.submit(p, o, params) for p, o in zip(prompts, players)]
    t0 = time.perf_counter()
    go.set()
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def worker(spec_path: str, setting: str) -> None:
    """One setting's engine: runs the round named by each line of stdin, answers one JSON line."""
    profile()
    spec = json.loads(Path(spec_path).read_text())
    cfg = dict(max_slots=len(spec["player_names"]), max_batch=len(spec["rounds"][0][0]), initial_rank=spec["rank"])
    engine = Engine(spec["model"], config=EngineConfig(**{**cfg, **parse(setting)[1]}))
    for name in spec["player_names"]:
        engine.load_adapter(name, spec["adapters"][name]["peft"])
    params = SamplingParams(max_tokens=spec["new_tokens"], temperature=1.0, ignore_eos=True)
    print(json.dumps({"ready": autocurricula.__file__}), flush=True)
    for line in sys.stdin:
        before, spent, cpu = dict(engine.stats), dict(SPENT), time.process_time()
        seconds = run_round(engine, *spec["rounds"][int(line)], params)
        print(json.dumps({"seconds": seconds, "cpu_s": time.process_time() - cpu, **{k: engine.stats[k] - before[k]
                                                 for k in ("prefix_hit_tokens", "prefix_query_tokens")},
                          **{p: SPENT[p] - spent.get(p, 0.0) for p in PHASES}}), flush=True)
    engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+",
                    help="per setting: EngineConfig overrides, e.g. prefix_block=4; src=DIR runs DIR's autocurricula")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--shape", default="bench")
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--players", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=20)
    ap.add_argument("--shared", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--long", type=int, default=0, help="extra prompts per round of --long-len tokens")
    ap.add_argument("--long-len", type=int, default=200)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    if not args.settings:
        ap.error("give --settings")
    model = model_folder(args.shape)
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_spec(Path(tmp), model, args.turns, args.players, prompt_len=args.prompt_len,
                          shared=args.shared, new_tokens=args.new_tokens, rounds=args.rounds)
        rng = np.random.default_rng(7)
        spec["rounds"] = []
        for ps in spec["round_prompts"]:  # the long prompts spread evenly among the turns
            prompts, players = list(ps), list(spec["order"])
            for k in range(args.long):
                at = (k + 1) * len(prompts) // (args.long + 1)
                prompts.insert(at, rng.integers(3, 500, args.long_len).tolist())
                players.insert(at, spec["player_names"][k % args.players])
            spec["rounds"].append((prompts, players))
        spec_path = Path(tmp) / "ab.json"
        spec_path.write_text(json.dumps(spec))
        procs = []
        for s in args.settings:
            src = parse(s)[0]
            env = dict(os.environ, PYTHONPATH=src) if src else None
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path), s],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                          cwd=src or None))
            print(json.dumps({s: json.loads(procs[-1].stdout.readline())["ready"]}), flush=True)

        def ask(i, r):
            procs[i].stdin.write(f"{r}\n")
            procs[i].stdin.flush()
            return json.loads(procs[i].stdout.readline())

        for i in range(len(procs)):  # warm-up: compiles, and fills the prefix cache as a first round would
            ask(i, 0)
        runs = defaultdict(list)
        for r in range(1, args.rounds + 1):
            order = list(range(len(procs)))[:: 1 if r % 2 else -1]
            for i in order:
                runs[i].append(ask(i, r))
            print(json.dumps({"round": r, **{args.settings[i]: round(runs[i][-1]["seconds"], 4) for i in order}}),
                  flush=True)
        for p in procs:
            p.stdin.close()
            p.wait()
        print(json.dumps({"load_avg": Path("/proc/loadavg").read_text().split()[:3]}))
        first = [r["seconds"] for r in runs[0]]
        for i, s in enumerate(args.settings):
            times = [r["seconds"] for r in runs[i]]
            ratios = [a / b for a, b in zip(first, times)]
            cpu_ratios = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[0], runs[i])]
            total = sum(times)
            print(json.dumps({s: {
                "median_s": round(statistics.median(times), 4),
                "ratio_first_over_this": {"median": round(statistics.median(ratios), 3),
                                          "min": round(min(ratios), 3), "max": round(max(ratios), 3)},
                "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs[i]), 4),
                "cpu_ratio_first_over_this": {"median": round(statistics.median(cpu_ratios), 3),
                                              "min": round(min(cpu_ratios), 3), "max": round(max(cpu_ratios), 3)},
                "prefix_hit_rate": round(sum(r["prefix_hit_tokens"] for r in runs[i])
                                         / max(1, sum(r["prefix_query_tokens"] for r in runs[i])), 3),
                **{f"{p}_share": round(sum(r[p] for r in runs[i]) / total, 3) for p in PHASES}}}))


if __name__ == "__main__":
    main()
