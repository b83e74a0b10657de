"""Serial against pipelined rounds (max_staleness 0 / 1) of the tic-tac-toe league, in-process and
through one `autocurricula serve` subprocess on this machine, with where each phase's CPU goes.

    python research/pipeline_profile.py [--rounds 8] [--games-per-learner 256] [--exploiter-games 32]

Trains the league of `examples/tictactoe_league.py --anchors random,minimax` (its warm base, roles,
credit "q", LoRA r=8 on all linears) for 2 epochs per setting and measures the second. The server runs its matmuls on half
the cores (`serve --threads`); pipelined, the trainer takes the other half (`threads`), serial it
keeps every core. For the serial server setting it also reads the CPU seconds of this process and of
the server's process during each round's games and update: "cores busy" near the core count means
the phase alone already fills the machine, so overlapping it with the other cannot gain much.
Prints one JSON line per setting, then one with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.bench import league as bench

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--games-per-learner", type=int, default=256)
    ap.add_argument("--exploiter-games", type=int, default=32)
    args = ap.parse_args()

    from autocurricula.loop import trainer as T
    model = str(bench.base_model())
    cores = os.cpu_count() or 2
    phases: dict[str, list[float]] = {}
    server_pid = [0]

    def timed(name):  # wall, this process's CPU and the server's CPU during one phase, epoch 1 only
        orig = getattr(T.AutocurriculumTrainer, name)

        def run(self, *a, **k):
            w, c, s = time.perf_counter(), time.process_time(), proc_cpu(server_pid[0]) if server_pid[0] else 0.0
            out = orig(self, *a, **k)
            if self.current_epoch == 1 and server_pid[0]:
                acc = phases.setdefault(name, [0.0, 0.0, 0.0, 0])
                acc[0] += time.perf_counter() - w
                acc[1] += time.process_time() - c
                acc[2] += proc_cpu(server_pid[0]) - s
                acc[3] += 1
            return out
        setattr(T.AutocurriculumTrainer, name, run)

    for name in ("_rollout", "_update"):
        timed(name)

    def league(out: Path, staleness: int, servers=None, threads=None) -> dict:
        return bench._league(model, out, max_staleness=staleness, quick=False, servers=servers, threads=threads,
                             rounds=args.rounds, games_per_learner=args.games_per_learner,
                             exploiter_games=args.exploiter_games)

    results = {}
    with tempfile.TemporaryDirectory(prefix="pipeline-profile-") as tmp:
        tmp = Path(tmp)
        for staleness in (0, 1):
            results[f"inprocess_{staleness}"] = league(tmp / f"in{staleness}", staleness)
            print(json.dumps({"setting": f"inprocess, max_staleness={staleness}", **results[f"inprocess_{staleness}"]}),
                  flush=True)
        servers = bench._Servers(model, 1, tmp)
        with servers as urls:
            for staleness in (0, 1):
                server_pid[0] = servers.procs[0].pid if staleness == 0 else 0
                threads = max(1, cores - bench.SERVER_THREADS) if staleness else None
                results[f"server_{staleness}"] = league(tmp / f"srv{staleness}", staleness, urls, threads)
                print(json.dumps({"setting": f"1 server, max_staleness={staleness}", **results[f"server_{staleness}"]}),
                      flush=True)
    profile = {name: {"wall_s": round(w / n, 3), "trainer_cpu_s": round(c / n, 3), "server_cpu_s": round(s / n, 3),
                      "cores_busy": round((c + s) / w, 2)} for name, (w, c, s, n) in phases.items()}
    ratio = lambda a, b: round(results[a]["games_per_s"] / results[b]["games_per_s"], 2)  # noqa: E731
    print(json.dumps({"pipelined_vs_serial": ratio("server_1", "server_0"),
                      "pipelined_vs_serial_inprocess": ratio("inprocess_1", "inprocess_0"),
                      "remote_vs_inprocess": ratio("server_0", "inprocess_0"), "cores": cores,
                      "server_threads": bench.SERVER_THREADS,
                      "serial_server_profile": {"games": profile.get("_rollout"), "update": profile.get("_update")}}))


if __name__ == "__main__":
    main()
