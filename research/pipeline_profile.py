"""Serial against pipelined rounds (max_staleness 0 / 1) of the tic-tac-toe league, in-process and
through one `autocurricula serve` subprocess on this machine, with where each phase's CPU goes.

    python research/pipeline_profile.py [--rounds 8] [--games-per-learner 256] [--exploiter-games 32]

Trains the league of `examples/tictactoe_league.py` (its warm base, roles, credit "q", LoRA r=8 on
all linears) for 2 epochs per setting and measures the second. The server runs its matmuls on half
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

    from autocurricula import GRPOConfig, LeagueConfig, LeagueTrainer
    from autocurricula import trainer as T
    from autocurricula.engine import LoraSpec
    from autocurricula.games import tictactoe

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
        r = args.rounds
        cfg = dict(epochs=2, rounds=r, games_per_learner=args.games_per_learner, exploiter_games=args.exploiter_games,
                   main_agents=1, main_exploiters=1, league_exploiters=1, anchor_share=0.5, scripted_in_pool=True,
                   snapshot_min_rounds=max(4, r // 2), snapshot_max_rounds=max(8, r), output_dir=str(out),
                   overwrite_output_dir=True, seed=0, max_tokens=2, game_name="tictactoe", credit="q",
                   q_target_coef=1.0, max_concurrent_games=128, bt_bootstrap=0, progress=False, save_strategy="no",
                   max_staleness=staleness, threads=threads)
        trainer = LeagueTrainer(LeagueConfig(**cfg), opponents=[
            {"id": "random", "role": "random", "policy": tictactoe.random_policy},
            {"id": "minimax", "role": "minimax", "policy": tictactoe.minimax_policy}])
        marks: list[float] = []
        trainer.train(model, tictactoe.play, lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
                      grpo_config=GRPOConfig(learning_rate=2e-3, beta=0.0, loss_type="grpo", temperature=1.0,
                                             num_iterations=1),
                      callbacks=[lambda t: marks.append(time.perf_counter())], servers=servers)
        trainer.engine.close()
        rows = [m for m in trainer.metrics_log if m.get("epoch") == 1 and "time/round_s" in m]
        mean = lambda k: round(sum(m.get(k, 0.0) for m in rows) / len(rows), 3)  # noqa: E731
        games = sum(int(m.get("rollout/games", 0)) for m in rows)
        wall = marks[1] - marks[0]
        return {"games_per_s": round(games / wall, 2), "epoch_s": round(wall, 2), "round_s": mean("time/round_s"),
                "update_s": mean("time/update_s"), "rollout_s": mean("time/rollout_s"),
                "rollout_wait_s": mean("time/rollout_wait_s"), "stale_dropped": sum(
                    int(m.get("rollout/stale_dropped", 0)) for m in rows)}

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
    print(json.dumps({"pipelined_vs_serial": round(results["server_1"]["games_per_s"] / results["server_0"]["games_per_s"], 2),
                      "pipelined_vs_serial_inprocess": round(
                          results["inprocess_1"]["games_per_s"] / results["inprocess_0"]["games_per_s"], 2),
                      "remote_vs_inprocess": round(results["server_0"]["games_per_s"] / results["inprocess_0"]["games_per_s"], 2),
                      "cores": cores, "server_threads": bench.SERVER_THREADS,
                      "serial_server_profile": {"games": profile.get("_rollout"), "update": profile.get("_update")}}))


if __name__ == "__main__":
    main()
