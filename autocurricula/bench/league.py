"""``autocurricula bench league``: games/s and round time of the tic-tac-toe league, side by side.

One run trains the same league (the tic-tac-toe example's settings with the minimax player beside
the random one: main agent, main exploiter, league exploiter, credit "q", LoRA r=8 on all linears; fewer
games per round so it fits a few minutes) once per way of playing its games, and all of them
``repeats`` times, interleaved (A B C ... A B C ...: 3 by default, 1 with ``--quick``), so that a
change in the machine's load reaches every setting alike:

- ``inprocess``: the in-process engine, serial rounds (``max_staleness=0``);
- ``inprocess_pipelined``: the same with ``max_staleness=1`` (round r+1 played during r's update);
- ``server1``: one ``autocurricula serve`` subprocess on 127.0.0.1, serial; every server runs its
  matmuls on half the cores (``--threads``), leaving the rest to the trainer on the same machine;
- ``server1_pipelined``: the same server, ``max_staleness=1``, the trainer's matmuls on the other
  cores (``threads``; the serial settings keep every core, which serves them as well or better);
- ``server2``: two servers, serial;
- ``ray2``: a local Ray instance with 2 rollout actors (:class:`~autocurricula.fleet.cluster.RayEngine`),
  serial; left out (``null``) when Ray is not installed.

Each setting runs 2 epochs; the first warms up (model load, compilation, first uploads), the
second is measured: ``games_per_s`` = games of epoch 1 / its wall time, ``round_s`` = that time /
rounds, ``turns_per_s`` = the turns played in it / that time (games get longer or shorter as the
players learn, and each setting's players learn a little differently). Each figure is the median over the repeats; each ratio is
the median of the repeats' own ratios, with its min and max in ``spread``. Ratios:
``remote_vs_inprocess`` (server1 / inprocess), ``two_servers_vs_one``,
``pipelined_vs_serial`` (server1_pipelined / server1: the overlap with the server in its own
process), ``pipelined_vs_serial_inprocess``, ``ray_vs_inprocess``. ``retried`` and
``stale_dropped`` sum ``rollout/retried`` and ``rollout/stale_dropped`` over all settings.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)

SETTINGS = ("inprocess", "inprocess_pipelined", "server1", "server1_pipelined", "server2", "ray2")
# A server on the trainer's machine leaves it cores (`serve --threads`), serial and pipelined alike:
# with every core's BLAS threads it ran serial rounds no faster and took the update's cores.
SERVER_THREADS = max(1, (os.cpu_count() or 2) // 2)
CACHE = Path(os.environ.get("AUTOCURRICULA_CACHE", Path.home() / ".cache" / "autocurricula"))


def base_model(quick: bool = False) -> Path:
    """The tic-tac-toe examples' base: tiny llama (hidden 128, 2 layers, 32 heads) after the
    supervised warm-up on legal moves (the example's cache, so a run of the example reuses it).
    ``quick``: the tiny model without warm-up (its games mostly end at an illegal first move)."""
    from autocurricula.games import tictactoe
    from autocurricula.engine.tiny import build_tiny_model

    base = build_tiny_model(CACHE / "tiny-h128-l2-a32", hidden_size=128, num_layers=2, num_heads=32,
                            intermediate_size=256, seed=0)
    if quick:
        return base
    from autocurricula.training.warmup import sft_warmup

    return sft_warmup(base, CACHE / f"{base.name}-ttt-warm400", tictactoe.warmup_examples(20000, 0), steps=400,
                      batch_size=64, learning_rate=1e-3, seed=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Servers:
    """``n`` ``autocurricula serve`` subprocesses on free 127.0.0.1 ports, killed on exit."""

    def __init__(self, model: str, n: int, log_dir: Path):
        self.procs, self.urls, self.logs = [], [], []
        for _ in range(n):
            port = _free_port()
            log = log_dir / f"serve-{port}.log"
            with open(log, "wb") as out:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "autocurricula.cli", "serve", "--model", model, "--host", "127.0.0.1",
                     "--port", str(port), "--threads", str(SERVER_THREADS)], stdout=out, stderr=subprocess.STDOUT))
            self.urls.append(f"http://127.0.0.1:{port}")
            self.logs.append(log)

    def __enter__(self):
        import httpx

        deadline = time.monotonic() + 120
        for proc, url, log in zip(self.procs, self.urls, self.logs):
            while True:
                if proc.poll() is not None:
                    self.__exit__()
                    raise RuntimeError(f"autocurricula serve exited early:\n{log.read_text()[-2000:]}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"autocurricula serve did not come up in 120 s:\n{log.read_text()[-2000:]}")
                time.sleep(0.1)
        return self.urls

    def __exit__(self, *exc):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _league(model: str, out: Path, *, max_staleness: int, quick: bool, servers=None, seed: int = 0,
            threads: int | None = None, rounds: int | None = None, games_per_learner: int | None = None,
            exploiter_games: int | None = None) -> dict:
    """Train the bench league for 2 epochs; the figures of the second. ``rounds``, ``games_per_learner``
    and ``exploiter_games`` override the bench's sizes (``research/pipeline_profile.py`` runs the
    example's)."""
    from autocurricula import GRPOConfig, LeagueConfig, LeagueTrainer
    from autocurricula.credit import QCredit
    from autocurricula.engine import LoraSpec
    from autocurricula.games import tictactoe

    # the pipeline fills and drains once per epoch; the example runs 30 rounds
    rounds = rounds or (2 if quick else 8)
    cfg = dict(epochs=2, rounds=rounds,
               rules={"games_per_learner": games_per_learner or (8 if quick else 64),
                      "exploiter_games": exploiter_games or (4 if quick else 16), "main_agents": 1,
                      "main_exploiters": 1, "league_exploiters": 1, "anchor_share": 0.5,
                      "snapshot_min_rounds": max(4, rounds // 2), "snapshot_max_rounds": max(8, rounds)},
               output_dir=str(out), overwrite_output_dir=True, seed=seed, max_tokens=2, game_name="tictactoe",
               credit=QCredit(target_coef=1.0), arena={"max_concurrent_games": 128}, ratings={"bt_bootstrap": 0},
               progress=False, save_strategy="no")
    if max_staleness:
        cfg["max_staleness"] = max_staleness  # AutocurriculumConfig.max_staleness (rollouts overlapping updates)
    if threads:
        cfg["threads"] = threads
    trainer = LeagueTrainer(LeagueConfig(**cfg), opponents=[
        {"id": "random", "role": "random", "policy": tictactoe.random_policy},
        {"id": "minimax", "role": "minimax", "policy": tictactoe.minimax_policy}])
    marks: list[float] = []
    trainer.train(model, tictactoe.play, lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
                  grpo_config=GRPOConfig(learning_rate=2e-3, beta=0.0, loss_type="grpo", temperature=1.0,
                                         num_iterations=1),
                  callbacks=[lambda t: marks.append(time.perf_counter())], servers=servers)
    trainer.engine.close()
    games = sum(1 for line in (out / "match_history.jsonl").read_text().splitlines()
                if json.loads(line)["epoch"] == 1)
    wall = marks[1] - marks[0]
    rows = [m for m in trainer.metrics_log if m.get("epoch") == 1]
    turns = sum(int(m.get("rollout/turns", 0)) for m in rows)  # games' lengths differ as the players learn
    return {"games": games, "seconds": round(wall, 3), "games_per_s": round(games / wall, 2),
            "turns": turns, "turns_per_s": round(turns / wall, 2),
            "round_s": round(wall / rounds, 3),
            "retried": sum(int(m.get("rollout/retried", 0)) for m in trainer.metrics_log),
            "stale_dropped": sum(int(m.get("rollout/stale_dropped", 0)) for m in trainer.metrics_log),
            **{f"{k}_s": round(sum(m.get(f"time/{k}_s", 0.0) for m in rows) / max(1, len(rows)), 3)
               for k in ("update", "rollout", "rollout_wait")}}


def ratio(a, b):
    """``a / b`` to two decimals; None when either setting did not run (or ``b`` is 0)."""
    return round(a / b, 2) if a is not None and b else None


def _one(model: str, name: str, tmp: Path, quick: bool) -> dict | None:
    """One 2-epoch league of setting ``name``; its second epoch's figures."""
    staleness = 1 if name.endswith("_pipelined") else 0
    out = tmp / name
    if name.startswith("inprocess"):
        return _league(model, out, max_staleness=staleness, quick=quick)
    if name.startswith("server"):
        n = int(name[len("server")])
        with _Servers(model, n, tmp) as urls:
            # overlapped, the trainer's update runs beside the server: it keeps the other cores
            threads = max(1, (os.cpu_count() or 2) - SERVER_THREADS) if staleness else None
            return _league(model, out, max_staleness=staleness, quick=quick, servers=urls, threads=threads)
    if name == "ray2":
        return _ray_league(model, out, quick)
    raise ValueError(f"unknown setting {name!r}; choose from {SETTINGS}")


RATIOS = {"remote_vs_inprocess": ("server1", "inprocess"), "two_servers_vs_one": ("server2", "server1"),
          "pipelined_vs_serial": ("server1_pipelined", "server1"),
          "pipelined_vs_serial_inprocess": ("inprocess_pipelined", "inprocess"),
          "ray_vs_inprocess": ("ray2", "inprocess")}


def median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 3)


def run(model: str | None = None, quick: bool = False, settings: tuple[str, ...] = SETTINGS,
        repeats: int = 3) -> dict:
    """Every setting ``repeats`` times, interleaved (A B C ... A B C ...), so that a change of the
    machine's load reaches every setting alike; each figure is the median over the repeats, each
    ratio the median of the repeats' own ratios, with its min and max beside it."""
    import mlx.core as mx

    from autocurricula.engine import blas as _blas
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    model = str(model or base_model(quick))
    runs: dict[str, list[dict | None]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory(prefix="bench-league-") as tmp:
        for r in range(repeats):
            for name in settings:
                (Path(tmp) / str(r)).mkdir(exist_ok=True)
                runs[name].append(_one(model, name, Path(tmp) / str(r), quick))

    def median_of(key: str) -> dict:
        return {k: median([v[key] for v in vs if v]) for k, vs in runs.items()}

    gps = median_of("games_per_s")
    result = {"model": model, "blas": _blas.describe(), "device": str(mx.default_device()), "quick": quick,
              "cpus": os.cpu_count(), "server_threads": SERVER_THREADS, "repeats": repeats, "games_per_s": gps,
              "round_s": median_of("round_s"), "turns_per_s": median_of("turns_per_s"),
              "update_s": median_of("update_s"), "spread": {}}
    for key, (a, b) in RATIOS.items():
        each = [ratio(x["games_per_s"] if x else None, y["games_per_s"] if y else None)
                for x, y in zip(runs.get(a, []), runs.get(b, []))]
        each = [v for v in each if v is not None]
        result[key] = median(each)
        if each:
            result["spread"][key] = [min(each), max(each)]
    result.update({"retried": sum(v["retried"] for vs in runs.values() for v in vs if v),
                   "stale_dropped": sum(v["stale_dropped"] for vs in runs.values() for v in vs if v),
                   "settings": {k: [v for v in vs] for k, vs in runs.items()}})
    return result


def _ray_league(model: str, out: Path, quick: bool) -> dict | None:
    try:
        import ray
    except ImportError:
        return None
    from autocurricula.fleet.cluster import RayEngine

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with RayEngine(model, num_actors=2) as rollout:
            return _league(model, out, max_staleness=0, quick=quick, servers=rollout)
    finally:
        if started:
            ray.shutdown()


GOALS = {"pipelined_vs_serial": 1.5}


def format_table(r: dict) -> str:
    lines = [f"model {r['model']}  |  BLAS {r['blas']}  |  device {r['device']}  |  {r['cpus']} CPUs", "",
             f"{'setting':<22} {'games/s':>8} {'turns/s':>8} {'round s':>8} {'update s':>9}"]
    for name in r["games_per_s"]:
        g, rs, us = r["games_per_s"][name], r["round_s"][name], r["update_s"][name]
        ts = r.get("turns_per_s", {}).get(name)
        lines.append(f"{name:<22} {'-' if g is None else g:>8} {'-' if ts is None else ts:>8} "
                     f"{'-' if rs is None else rs:>8} {'-' if us is None else us:>9}"
                     + ("   (ray not installed)" if g is None else ""))
    lines.append("")
    for key in ("remote_vs_inprocess", "two_servers_vs_one", "pipelined_vs_serial", "pipelined_vs_serial_inprocess",
                "ray_vs_inprocess"):
        goal = GOALS.get(key)
        v = r[key]
        note = "" if goal is None or v is None else f"   goal >= {goal} ({'ok' if v >= goal else 'below goal'})"
        spread = r.get("spread", {}).get(key)
        note = (f"   ({spread[0]}-{spread[1]} over {r.get('repeats', 1)})" if spread else "") + note
        lines.append(f"{key:<30} {'-' if v is None else v:>6}{note}")
    lines.append(f"{'retried':<30} {r['retried']:>6}")
    lines.append(f"{'stale_dropped':<30} {r['stale_dropped']:>6}")
    return "\n".join(lines)


def finite(r: dict) -> bool:
    """Every figure a finite number (``None`` only where Ray is absent)."""
    nums = [*r["games_per_s"].values(), *r["round_s"].values(), *r.get("turns_per_s", {}).values(),
            r["remote_vs_inprocess"], r["two_servers_vs_one"],
            r["pipelined_vs_serial"], r["ray_vs_inprocess"], r["retried"], r["stale_dropped"]]
    return all(v is None or (isinstance(v, (int, float)) and math.isfinite(v)) for v in nums)


def main(args) -> None:
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    r = run(model=args.model, quick=args.quick, repeats=repeats)
    print(json.dumps(r) if args.json else format_table(r))
