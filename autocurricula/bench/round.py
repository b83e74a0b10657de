"""``autocurricula bench round``: whole league rounds, our way and the assemble-it-yourself way.

One round is the tic-tac-toe league example's round (``examples/tictactoe_league.py --anchors
random,minimax``, both scripted players): 64 games of its three learners (main agent, main exploiter, league exploiter) among themselves and against
the scripted random and minimax players, each game after 0-4 random opening moves, every model
turn 2 tokens sampled at temperature 1, then one GRPO step of every learner (LoRA r=8 on every
linear, the example's learning rate 2e-3 and loss "grpo"). Both sides play the same games through
the same :class:`~autocurricula.arena.arena.Arena` in lockstep (every tick is one batch of all the games'
pending turns), in this process:

- ``ours``: the in-process :class:`~autocurricula.engine.Engine` answers the ticks, then the fused
  :class:`~autocurricula.training.Updater` steps every learner in place (nothing to reload);
- ``vllm_torch_peft``: each tick is one vLLM ``LLM.generate`` with one ``LoRARequest`` per row
  (``round_vllm.py``, in vLLM's own virtual environment), then a torch + peft GRPO step of every
  learner with the same loss (``round_torch.py``) saves the new adapters with ``save_pretrained``,
  and vLLM loads them as new ``LoRARequest``s (new id and path) before the next round.

Same work on both sides: the same model folder and starting adapters (``export_peft``), the same
games (boards, seats, openings and scripted moves come from the round's seed), exactly 2 tokens per
turn (end-of-sequence ignored on both), temperature 1, the same advantages (a game's reward minus
the learner's mean reward of the round). The models at these shapes have random weights and never
learned the board, so a learner's move is not parsed from its reply: it is a legal move drawn from
the game's seed (:func:`scripted_board_game`). Every reply is still generated, recorded as a turn
and trained on, so both sides play the same boards and the same number of turns.

With ``--rollouts vllm`` a third side runs (it needs the same vLLM environment):

- ``ours_vllm_rollouts``: the ticks go to a vLLM OpenAI server (started here, ``vllm_server``)
  through :class:`~autocurricula.fleet.vllm.VLLMEngine`, then our fused Updater steps the learners
  in this process, and each changed learner is written as a peft folder and loaded into vLLM under
  its new version (``sync_from``). Its rounds also report the sampler/learner gap of their turns
  (``mismatch``: mean and max of ``|log p_learner - log p_vllm|`` per token, measured after the
  round, outside its time).

The sides alternate (A B, B A, ...) with an idle gap before each round, after one small warm-up
round each (an eighth of the games). Reported per side: rounds per hour (median, min, max), the
time split of a round (games, of which vLLM's own generate calls; update; reload), turns per
round, the cores the process tree kept busy and its CPU seconds, the threads of each side's
processes, and the machine's load. ``round_vs_vllm_torch_peft`` is the median of the paired
rounds' ratios of seconds, ``cpu_s_vs_vllm_torch_peft`` of CPU seconds. Without vLLM (not named
by ``--vllm-python`` / ``AUTOCURRICULA_VLLM_PYTHON``, or not importable) only our side runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.bench import peers_usage, round_torch, round_vllm, vllm_server
from autocurricula.bench.workloads import LEARNERS, schedule
from autocurricula.bench.peers import (PEER_ENV, SHAPES, Worker, by_path, linear_dims, model_folder,
                                       peer_python, side_usage, summary, vllm_binding)

GAMES = 64
MAX_TOKENS, TEMPERATURE, OPENINGS, RANK = 2, 1.0, (0, 4), 8
GRPO = {"learning_rate": 2e-3, "epsilon": 0.2, "epsilon_high": 0.2, "temperature": 1.0, "max_grad_norm": 1.0}
REPEATS = {"bench": 3, "qwen0.5b": 2, "tiny": 1}
GOAL = 2.0
GAP_S = 2.0
TIMEOUT_S = 1800.0


def _progress(msg: str) -> None:
    print(f"bench round: {msg}", file=sys.stderr, flush=True)  # stdout carries only the result


# ---------------------------------------------------------------- the round's games (both sides)
def roster() -> dict[str, dict]:
    """The round's players by id: the three learners and the scripted random and minimax players."""
    from autocurricula.games import tictactoe

    out = {n: {"id": n} for n in LEARNERS}
    out["random"] = {"id": "random", "role": "random", "policy": tictactoe.random_policy}
    out["minimax"] = {"id": "minimax", "role": "minimax", "policy": tictactoe.minimax_policy}
    return out


async def scripted_board_game(players: list[dict], model, tokenizer=None) -> list[float]:
    """Tic-tac-toe whose boards come from the game's seed: after 0-4 random opening moves each
    turn asks the player (a learner's reply is generated and recorded as its turn), then plays
    the scripted player's own move or, for a learner, a legal move drawn from the seed."""
    from autocurricula.games import tictactoe
    from autocurricula.records import is_scripted

    rng = random.Random(model.seed)
    game = tictactoe.TicTacToe(tictactoe.random_opening(rng.randint(*OPENINGS), rng))
    while not game.done:
        player = players[game.to_move]
        reply = await model.generate(player, game.prompt(), max_tokens=MAX_TOKENS)
        game.step(reply.text if is_scripted(player) else str(rng.choice(tictactoe.legal_moves(game.board))))
    return game.rewards()


def play_round(engine, seed: int, games: int) -> list:
    """The round's games through an :class:`~autocurricula.arena.arena.Arena` on ``engine`` (lockstep);
    their records, or an error naming the first game that failed."""
    from autocurricula.arena.arena import Arena, run_async
    from autocurricula.records import GameRecord

    who = roster()
    todo = [(scripted_board_game, [who[x], who[o]], GameRecord(f"r{seed}-g{i}", [who[x], who[o]]), "tictactoe")
            for i, (x, o) in enumerate(schedule(games))]
    arena = Arena(engine, seed=seed, temperature=TEMPERATURE, max_tokens=MAX_TOKENS)
    records = run_async(arena.run(todo, max_concurrent=128))
    failed = [r for r in records if r.error]
    if failed:
        raise RuntimeError(f"bench round: game {failed[0].game_id} failed: {failed[0].error}\n{failed[0].traceback}")
    return records


def credited_turns(records: list) -> list:
    """The round's turns with reward (their game's, for their seat) and advantage (reward minus the
    learner's mean reward over its turns of the round)."""
    turns = []
    for rec in records:
        for t in rec.turns:
            t.reward = rec.rewards[t.seat]
            turns.append(t)
    mean = {}
    for t in turns:
        mean.setdefault(t.player, []).append(t.reward)
    for t in turns:
        t.advantage = t.reward - sum(mean[t.player]) / len(mean[t.player])
    return turns


# ---------------------------------------------------------------- the arena's model on each side
class ExactTokens:
    """Our engine as the arena's model, every request ``ignore_eos``: exactly ``max_tokens`` tokens
    per turn, as the vLLM side generates them."""

    def __init__(self, engine):
        self.engine, self.tokenizer = engine, engine.tokenizer

    def encode(self, text: str) -> list[int]:
        return self.engine.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.engine.decode(ids)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self.engine.apply_chat_template(messages)

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        return self.engine.submit_many([(ids, adapter, dataclasses.replace(params, ignore_eos=True))
                                        for ids, adapter, params in requests])


class VllmRollouts:
    """The vLLM worker as the arena's model: each lockstep tick is one ``generate`` request (one
    ``LLM.generate``, one ``LoRARequest`` per row), answered on a thread of its own."""

    def __init__(self, worker: Worker, tokenizer, version: int = 0):
        self.worker, self.tokenizer, self.version = worker, tokenizer, version
        self.generate_s, self.ticks = 0.0, 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vllm-ticks")
        self._encode = functools.lru_cache(maxsize=4096)(lambda text: tuple(tokenizer.encode(text)))

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        futs = [Future() for _ in requests]
        self._pool.submit(self._tick, requests, futs)
        return futs

    def _tick(self, requests: list[tuple], futs: list[Future]) -> None:
        from autocurricula.engine import Completion

        try:
            out = self.worker.run(TIMEOUT_S, {"op": "generate", "prompts": [list(r[0]) for r in requests],
                                              "adapters": [r[1] for r in requests],
                                              "params": [[p.temperature, p.top_p, p.top_k, p.max_tokens]
                                                         for _, _, p in requests]})
            self.generate_s += out["seconds"]
            self.ticks += 1
            for i, ((ids, adapter, _), fut) in enumerate(zip(requests, futs)):
                toks = out["tokens"][i]
                fut.set_result(Completion(f"vllm-{self.ticks}-{i}", adapter, list(ids), toks, out["logprobs"][i],
                                          self.decode(toks), "length", self.version, [(0, len(toks), self.version)]))
        except BaseException as exc:  # noqa: BLE001 - every game of the tick gets the error
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# ---------------------------------------------------------------- the two sides
def _threads_of(pid: int) -> int | None:
    try:
        return peers_usage.parse_stat(Path(f"/proc/{pid}/stat").read_text())["threads"]
    except (OSError, ValueError, IndexError):
        return None


class Ours:
    """Engine + fused Updater in this process, the learners' adapters loaded from the peft folders."""

    name = "ours"

    def __init__(self, model: str, adapters: dict[str, str]):
        from autocurricula.engine import Engine
        from autocurricula.training import Updater
        from autocurricula.training.config import GRPOConfig

        self.engine = Engine(model)
        for n, path in adapters.items():
            self.engine.load_adapter(n, path)
        self.updater = Updater(self.engine, GRPOConfig(learning_rate=GRPO["learning_rate"], beta=0.0, loss_type="grpo",
                                                       temperature=GRPO["temperature"], epsilon=GRPO["epsilon"],
                                                       max_grad_norm=GRPO["max_grad_norm"]))

    def round(self, seed: int, games: int) -> dict:
        t0 = time.perf_counter()
        turns = credited_turns(play_round(ExactTokens(self.engine), seed, games))
        t1 = time.perf_counter()
        loss = self.updater.step(turns)["loss"]
        t2 = time.perf_counter()
        return {"seconds": t2 - t0, "games_s": t1 - t0, "generate_s": None, "update_s": t2 - t1, "reload_s": 0.0,
                "turns": len(turns), "tokens": sum(len(t.completion_ids) for t in turns), "loss": loss,
                "threads": _threads_of(os.getpid())}

    def close(self) -> None:
        self.engine.close()


class VllmTorchPeft:
    """vLLM rollouts, a torch + peft update and the adapters reloaded into vLLM; the games run here."""

    name = "vllm_torch_peft"

    def __init__(self, python: str, model: str, adapters: dict[str, str], work: Path, warmup: list[int],
                 torch_threads: int):
        from transformers import AutoTokenizer

        self.work = work
        spec = {"model": model, "learners": list(LEARNERS), "adapters": adapters, "rank": RANK, "seed": 0,
                "max_model_len": 64, "max_num_seqs": 128, "warmup": warmup, "grpo": dict(GRPO),
                "torch_device": "cpu", "mlx_gpu": False, "torch_threads": torch_threads}
        spec_path = work / "round-spec.json"
        spec_path.write_text(json.dumps(spec))
        self.workers: list[Worker] = []
        self.ready: dict[str, dict] = {}
        self.rollouts: VllmRollouts | None = None
        try:  # one after another: two warm-ups at once would fight over the cores
            for side, cmd, env in ((round_vllm.SIDE, by_path(python, round_vllm.__file__, round_vllm.SIDE, spec_path),
                                    {k: os.environ.get(k, v) for k, v in PEER_ENV.items()}),
                                   (round_torch.SIDE, by_path(sys.executable, round_torch.__file__, round_torch.SIDE,
                                                              spec_path), None)):
                t0 = time.perf_counter()
                self.workers.append(Worker(side, spec_path, work, cmd, env))
                self.ready[side] = self.workers[-1].answer(TIMEOUT_S)
                self.ready[side]["startup_s"] = round(time.perf_counter() - t0, 1)
                _progress(f"{side}: loaded and warmed up in {self.ready[side]['startup_s']} s")
        except BaseException:
            self.close()
            raise
        self.vllm, self.torch = self.workers
        self.rollouts = VllmRollouts(self.vllm, AutoTokenizer.from_pretrained(model))

    def round(self, seed: int, games: int) -> dict:
        r = self.rollouts
        gen0 = r.generate_s
        t0 = time.perf_counter()
        turns = credited_turns(play_round(r, seed, games))
        t1, idle0 = time.perf_counter(), peers_usage.tree_usage(self.vllm.proc.pid)
        rows = [{"player": t.player, "prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids,
                 "logprobs": t.logprobs, "advantage": t.advantage} for t in turns]
        up = self.torch.run(TIMEOUT_S, {"op": "update", "turns": rows, "out": str(self.work / f"adapters-{seed}")})
        t2, idle1 = time.perf_counter(), peers_usage.tree_usage(self.vllm.proc.pid)
        self.vllm.run(TIMEOUT_S, {"op": "load", "adapters": up["adapters"]})
        r.version += 1
        t3 = time.perf_counter()
        threads = [(peers_usage.tree_usage(w.proc.pid) or {}).get("threads") for w in self.workers]
        return {"seconds": t3 - t0, "games_s": t1 - t0, "generate_s": r.generate_s - gen0, "update_s": t2 - t1,
                "step_s": up["step_s"], "save_s": up["save_s"], "reload_s": t3 - t2, "turns": len(turns),
                "tokens": sum(len(t.completion_ids) for t in turns), "loss": up["loss"],
                "vllm_cores_during_update": peers_usage.cores_used(idle0, idle1, t2 - t1),
                "threads": None if None in threads else sum(threads)}

    def close(self) -> None:
        if self.rollouts is not None:
            self.rollouts.close()
        for w in self.workers:
            w.close()


class OursVllmRollouts:
    """Rollouts on a vLLM server through the fleet's VLLMEngine, our fused Updater in this process,
    the new adapters written as peft folders and loaded into vLLM by version."""

    name = "ours_vllm_rollouts"

    def __init__(self, python: str, model: str, adapters: dict[str, str], work: Path):
        from autocurricula.engine import Engine
        from autocurricula.fleet.vllm import VLLMEngine
        from autocurricula.publish.export import export_peft
        from autocurricula.training import Updater
        from autocurricula.training.config import GRPOConfig

        self.stack = contextlib.ExitStack()
        try:
            t0 = time.perf_counter()
            self.url, self.proc = self.stack.enter_context(vllm_server.vllm_server(
                python, model, work / "vllm-server.log", max_loras=2 * len(LEARNERS), max_lora_rank=RANK,
                max_model_len=64, max_num_seqs=128))
            self.engine = self.stack.enter_context(Engine(model))
            for n, path in adapters.items():
                self.engine.load_adapter(n, path)
            self.updater = Updater(self.engine, GRPOConfig(learning_rate=GRPO["learning_rate"], beta=0.0,
                                                           loss_type="grpo", temperature=GRPO["temperature"],
                                                           epsilon=GRPO["epsilon"], max_grad_norm=GRPO["max_grad_norm"]))
            self.rollout = self.stack.enter_context(VLLMEngine(
                [self.url], base=self.engine, adapter_dir=work / "vllm-adapters",
                write_adapter=functools.partial(export_peft, base_model_name_or_path=model)))
            self.rollout.sync_from(self.engine)
            self.startup_s = round(time.perf_counter() - t0, 1)
            _progress(f"{self.name}: vLLM server up and adapters loaded in {self.startup_s} s")
        except BaseException:
            self.stack.close()
            raise

    def round(self, seed: int, games: int) -> dict:
        t0 = time.perf_counter()
        turns = credited_turns(play_round(ExactTokens(self.rollout), seed, games))
        t1 = time.perf_counter()
        gaps = self._gaps(turns)  # before the update: the learners that sampled them
        t_gap = time.perf_counter() - t1
        t1 = time.perf_counter()
        loss = self.updater.step(turns)["loss"]
        t2 = time.perf_counter()
        self.rollout.sync_from(self.engine)
        t3 = time.perf_counter()
        threads = (peers_usage.tree_usage(self.proc.pid) or {}).get("threads")
        return {"seconds": (t3 - t0) - t_gap, "games_s": t1 - t0 - t_gap, "generate_s": None, "update_s": t2 - t1,
                "reload_s": t3 - t2, "turns": len(turns), "tokens": sum(len(t.completion_ids) for t in turns),
                "loss": loss, "mismatch_mean": float(sum(gaps) / max(1, len(gaps))),
                "mismatch_max": max(gaps, default=0.0),
                "threads": None if threads is None else threads + (_threads_of(os.getpid()) or 0)}

    def _gaps(self, turns: list) -> list[float]:
        """``|log p_learner - log p_vllm|`` of every sampled token (the learner's from our engine)."""
        out = []
        for name in LEARNERS:
            mine = [t for t in turns if t.player == name]
            pairs = [(t.prompt_ids, t.completion_ids[:k]) for t in mine for k in range(1, len(t.completion_ids) + 1)]
            sums = iter(self.engine.completion_logprobs(pairs, name, TEMPERATURE) if pairs else [])
            for t in mine:
                prev = 0.0
                for lp in t.logprobs:
                    total = next(sums)
                    out.append(abs((total - prev) - lp))
                    prev = total
        return out

    def close(self) -> None:
        self.stack.close()


# ---------------------------------------------------------------- runs, figures
def starting_adapters(model: Path, work: Path) -> dict[str, str]:
    """The learners' random starting adapters (r=8, every linear), exported as peft folders."""
    from autocurricula.engine.adapters import AdapterWeights, LoraSpec
    from autocurricula.publish.export import export_peft

    config = json.loads((model / "config.json").read_text())
    spec = LoraSpec(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear")
    return {n: str(export_peft(AdapterWeights.random(linear_dims(config), spec, seed=1 + i), work / "peft" / n,
                               str(model), num_model_layers=config["num_hidden_layers"]))
            for i, n in enumerate(LEARNERS)}


def _timed(side, seed: int, games: int) -> dict:
    """One round of ``side`` with the machine's load and the cores this process tree kept busy."""
    load, before, t0 = peers_usage.load_now(), peers_usage.tree_usage(os.getpid()), time.perf_counter()
    out = side.round(seed, games)
    wall, after = time.perf_counter() - t0, peers_usage.tree_usage(os.getpid())
    cores = peers_usage.cores_used(before, after, wall)
    out.update(load=load, cores=cores, cpu_s=None if cores is None else cores * wall)
    return out


def _side_figures(runs: list[dict]) -> dict:
    keys = ("seconds", "games_s", "generate_s", "update_s", "step_s", "save_s", "reload_s", "turns", "tokens",
            "vllm_cores_during_update", "cpu_s")
    return {"rounds_per_hour": summary([3600.0 / r["seconds"] for r in runs]),
            **{k: summary([r.get(k) for r in runs]) for k in keys}, **side_usage(runs)}


def run(shape: str = "bench", repeats: int | None = None, games: int = GAMES, warmup_games: int | None = None,
        vllm_python: str | None = None, gap: float = GAP_S, torch_threads: int | None = None,
        rollouts: str = "engine") -> dict:
    """Rounds of both sides at ``shape``, alternating, ``repeats`` each after one warm-up round of
    ``warmup_games`` (default an eighth of ``games``, at least 2; see the module docstring).
    ``vllm_python``: the python of vLLM's virtual environment (else ``$AUTOCURRICULA_VLLM_PYTHON``);
    without a working one ``result["vllm_torch_peft"]["skipped"]`` says why and only our side runs.
    ``torch_threads``: the torch + peft update's threads (default: every core, torch's own default).
    ``rollouts="vllm"``: also the side whose rollouts play on a vLLM server with our update
    (``result["ours_vllm_rollouts"]``, skipped as the vLLM side is)."""
    if rollouts not in ("engine", "vllm"):
        raise ValueError(f"rollouts must be 'engine' or 'vllm', got {rollouts!r}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    repeats = repeats or REPEATS[shape]
    warmup_games = warmup_games or max(2, games // 8)
    python, why = peer_python("vllm", vllm_python)
    if python is None:
        _progress(f"skipping the vLLM + torch + peft side: {why}")
    t_start = time.perf_counter()
    model = model_folder(shape)
    work = Path(tempfile.mkdtemp(prefix="ac-round-"))
    sides: list = []
    try:
        adapters = starting_adapters(model, work)
        sides.append(Ours(str(model), adapters))
        if python is not None:
            from autocurricula.games import tictactoe

            warmup = sides[0].engine.encode(tictactoe.render_prompt(tictactoe.EMPTY_BOARD, "X"))
            threads = torch_threads or os.cpu_count() or 1
            sides.append(VllmTorchPeft(python, str(model), adapters, work, warmup, threads))
            if rollouts == "vllm":
                sides.append(OursVllmRollouts(python, str(model), adapters, work))
        for s in sides:  # round 0: a small warm-up round (first shapes, first adapter loads)
            s.round(0, warmup_games)
            _progress(f"{s.name}: warm-up round done")
        runs: dict[str, list[dict]] = {s.name: [] for s in sides}
        for i in range(repeats):
            for s in (sides[::-1] if i % 2 else sides):
                time.sleep(gap)
                runs[s.name].append(_timed(s, i + 1, games))
                _progress(f"round {i + 1}/{repeats} {s.name}: {runs[s.name][-1]['seconds']:.2f} s")
        ready = sides[1].ready if len(sides) > 1 else {}
        vllm_startup = sides[2].startup_s if len(sides) > 2 else None
        binding = vllm_binding((work / f"{round_vllm.SIDE}.log").read_text(errors="replace")) if ready else None
    finally:
        for s in sides:
            s.close()
        shutil.rmtree(work, ignore_errors=True)

    config = json.loads((model / "config.json").read_text())
    result = {"shape": shape, "model": str(model), "model_type": config["model_type"],
              "hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
              "vocab_size": config["vocab_size"], "games": games, "learners": list(LEARNERS),
              "max_tokens": MAX_TOKENS, "temperature": TEMPERATURE, "lora_rank": RANK, "repeats": repeats,
              "warmup_games": warmup_games, "gap_s": gap, "cpu_count": os.cpu_count(),
              "ours": _side_figures(runs["ours"])}
    loads = [r["load"] for rs in runs.values() for r in rs]
    if python is None:
        result["vllm_torch_peft"] = {"skipped": why}
    else:
        theirs = runs["vllm_torch_peft"]
        result["vllm_torch_peft"] = {**_side_figures(theirs), "python": python,
                                     "version": ready[round_vllm.SIDE]["version"],
                                     "vllm_torch_threads": ready[round_vllm.SIDE]["torch_threads"],
                                     "update_torch_threads": ready[round_torch.SIDE]["torch_threads"],
                                     "env": ready[round_vllm.SIDE]["env"], "binding": binding,
                                     "startup_s": {k: v["startup_s"] for k, v in ready.items()}}
        result["round_vs_vllm_torch_peft"] = summary([b["seconds"] / a["seconds"]
                                                      for a, b in zip(runs["ours"], theirs)])
        result["cpu_s_vs_vllm_torch_peft"] = summary([None if None in (a["cpu_s"], b["cpu_s"])
                                                      else b["cpu_s"] / a["cpu_s"] for a, b in zip(runs["ours"], theirs)])
        result["goal"] = GOAL
    if rollouts == "vllm":
        if python is None:
            result["ours_vllm_rollouts"] = {"skipped": why}
        else:
            mine = runs["ours_vllm_rollouts"]
            result["ours_vllm_rollouts"] = {**_side_figures(mine), "startup_s": vllm_startup,  # unrounded: ~1e-6
                                            "mismatch": [{"mean": r["mismatch_mean"], "max": r["mismatch_max"]}
                                                         for r in mine]}
            result["round_vs_ours_vllm_rollouts"] = summary([b["seconds"] / a["seconds"]
                                                             for a, b in zip(runs["ours"], mine)])
    result["load"] = summary(loads)
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    return result


def _span(s: dict, fmt: str = ".3g") -> str:
    return "n/a" if s["median"] is None else f"{s['median']:{fmt}} ({s['min']:{fmt}} - {s['max']:{fmt}})"


def format_table(r: dict) -> str:
    lines = [f"bench round: shape {r['shape']} ({r['model_type']}, hidden {r['hidden_size']}, {r['num_layers']} layers, "
             f"vocab {r['vocab_size']}, fp32)  |  {r['games']} tic-tac-toe games of {len(r['learners'])} learners, "
             f"{r['max_tokens']} tokens per turn at temperature {r['temperature']:g}, then one GRPO step of every "
             f"learner, LoRA r={r['lora_rank']} all-linear  |  {r['repeats']} rounds per side, alternating, "
             f"{r['gap_s']:g} s idle before each, {r['cpu_count']} cores, {r['seconds']} s", ""]
    cols = ("rounds/h", "s/round", "games s", "generate s", "update s", "reload s", "turns", "cores", "CPU s",
            "threads")
    lines.append(f"{'':<18}" + "".join(f"{c:>22}" if i == 0 else f"{c:>11}" for i, c in enumerate(cols)))
    for name, label in (("ours", "ours"), ("vllm_torch_peft", "vllm+torch+peft"),
                        ("ours_vllm_rollouts", "vllm+ours")):
        if name not in r:
            continue
        s = r[name]
        if "skipped" in s:
            lines.append(f"{label:<18}skipped: {s['skipped']}")
            continue
        cells = [_span(s["rounds_per_hour"], ".0f")] + [
            "-" if s[k]["median"] is None else f"{s[k]['median']:.3g}"
            for k in ("seconds", "games_s", "generate_s", "update_s", "reload_s", "turns")]
        cells += ["-" if s[k]["median"] is None else f"{s[k]['median']:{f}}"
                  for k, f in (("cores", ".2f"), ("cpu_s", ".3g"))]
        cells.append(str(s["threads_max"]))
        lines.append(f"{label:<18}" + "".join(f"{c:>22}" if i == 0 else f"{c:>11}" for i, c in enumerate(cells)))
    if "round_vs_vllm_torch_peft" in r:
        ratio = r["round_vs_vllm_torch_peft"]
        ok = "ok" if (ratio["median"] or 0) >= r["goal"] else "below goal"
        lines += ["", f"round_vs_vllm_torch_peft: {_span(ratio)}   goal >= {r['goal']:g} ({ok})",
                  f"cpu_s_vs_vllm_torch_peft: {_span(r['cpu_s_vs_vllm_torch_peft'])}   (CPU seconds per round, theirs / "
                  f"ours: the work, less the share of a loaded machine each side got)"]
        t = r["vllm_torch_peft"]
        lines.append(f"  vLLM {t['version']}: OpenMP threads bound to cores {t['binding']['omp_cores']}, cores kept "
                     f"for its scheduler {t['binding']['reserved_cores']}, torch threads {t['vllm_torch_threads']}; "
                     f"torch + peft update: {t['update_torch_threads']} threads; settings "
                     f"{({k: v for k, v in t['env'].items() if v is not None})}")
        lines.append(f"  update = torch step {t['step_s']['median']:.3g} s + save_pretrained {t['save_s']['median']:.3g} s "
                     f"(+ turns sent to the worker), vLLM's idle processes meanwhile "
                     f"{_span(t['vllm_cores_during_update'], '.2f')} cores; reload = vLLM add_lora of the new adapters")
    if "round_vs_ours_vllm_rollouts" in r:
        t = r["ours_vllm_rollouts"]
        lines.append(f"round_vs_ours_vllm_rollouts: {_span(r['round_vs_ours_vllm_rollouts'])}   (vllm+ours: rollouts on "
                     f"a vLLM server through VLLMEngine, our update, adapters reloaded by version)")
        lines.append("  sampler/learner |log-ratio| per token, each round (mean / max): " +
                     ", ".join(f"{m['mean']:.2g} / {m['max']:.2g}" for m in t["mismatch"]))
    lines.append(f"load average (1 min) during the rounds: {_span(r['load'], '.2f')}")
    lines.append("cores: CPU seconds of this process tree (both sides' workers) per wall second of the side's round "
                 "(CPU s: per round); threads: ours, this process; vllm+torch+peft, the vLLM and torch workers' "
                 "process trees")
    return "\n".join(lines)


def main(args) -> None:
    r = run(shape=args.shape, repeats=args.repeats, games=args.games or GAMES, vllm_python=args.vllm_python,
            torch_threads=args.torch_threads, rollouts=args.rollouts)
    print(json.dumps(r) if args.json else format_table(r))
