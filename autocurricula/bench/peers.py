"""``autocurricula bench peers``: our engine and update against what a user would otherwise run.

The workload is tic-tac-toe-style turns: 64 turns over 8 players, each a 20-token prompt (12
shared instruction tokens + 8 board tokens) and 4 sampled tokens (temperature 1, exactly 4 tokens),
LoRA r=8 on every linear. Every side gets the same model folder, prompts and adapters (our random
adapters exported with ``export_peft`` / ``export_mlx``). Every run (warm-up and each round) gets
new board tokens, as a new round of games would. Sides, each in its own worker process:

- ``engine``: :class:`~autocurricula.engine.Engine`, all turns submitted at once (multi-LoRA,
  continuous batching);
- ``peft_mixed``: transformers + peft, one ``generate(..., adapter_names=[...])`` over all turns;
- ``peft_set_adapter``: transformers + peft, ``set_adapter`` then one ``generate`` per player;
- ``mlx_lm_reload``: mlx-lm as its server switches adapters: ``mlx_lm.load(model, adapter_path=...)``
  per player, then one ``BatchGenerator`` over that player's turns (grouped by player, the
  generous order: one reload per player, not per turn);
- ``update``: one fused :class:`~autocurricula.training.Updater` GRPO step of the 8 players on the
  engine's sampled turns (advantages +-1, sampler logprobs perturbed so some ratios clip);
- ``torch_peft_update``: the same loss, rows and AdamW in torch + peft (``peers_torch.py``);
- optional, each in its own virtual environment named by a flag or an environment variable
  (:data:`PEERS`; skipped with the reason where not named or not importable): ``vllm``, vLLM
  offline with one ``LoRARequest`` per turn against ``engine`` (``peers_vllm.py``), and
  ``mlx_lm_lora_update``, mlx-lm-lora's GRPO step against ``update`` (``peers_mlx_lm_lora.py``).
  These phases alternate the two sides (A B, B A, ...) with :data:`PEER_GAP_S` of idle before
  each run, compare greedy tokens (vLLM) or the first step (mlx-lm-lora), and report each side's
  cores and threads (``peers_usage.py``) and the machine's load.

Workers load and warm up, then the parent runs the sides interleaved (A B C D A B C D ...) so
machine noise hits every side alike; ratios pair the runs of one round and report median, min and
max. The torch sides run on ``--torch-device`` (default ``auto``: the kind of device MLX runs on,
see :func:`peers_torch.resolve_device`). torch workers never import ``autocurricula`` (its BLAS
preload slows torch ~2x); the MLX sides (ours and mlx-lm) share the preloaded OpenBLAS. ``prefix_hit_rate`` is the share of prompt
tokens the engine served from a prefix cache (``engine.stats["prefix_hit_tokens"]`` when the
engine counts them; 0.0 and a note otherwise).

``--workload multiturn`` (:func:`run_multiturn`) plays growing two-seat conversations instead
(:mod:`peers_multiturn`): ``engine``, ``peft_mixed`` and ``vllm`` where it can run, greedy, turn
level by turn level, with each side's prefix-cache hit rate and its agreement with the engine.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import autocurricula  # noqa: F401  (fast BLAS before mlx, for the MLX workers)
from autocurricula.bench import peers_mlx_lm_lora, peers_multiturn, peers_torch, peers_usage, peers_vllm

ROLLOUT_SIDES = ("engine", "peft_mixed", "peft_set_adapter", "mlx_lm_reload")
UPDATE_SIDES = ("update", "torch_peft_update")
TORCH_SIDES = ("peft_mixed", "peft_set_adapter", "torch_peft_update")

# The Qwen2.5-0.5B shape keeps its real vocabulary (151,936 rows of embedding and LM head: the LM
# head and sampling over it are a real cost); the built-in tokenizer covers the first 32,768 ids.
SHAPES = {
    "bench": dict(model_type="llama", hidden_size=256, num_layers=4, num_heads=4, intermediate_size=512,
                  vocab_size=1024),
    "qwen0.5b": dict(model_type="qwen2", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                     intermediate_size=4864, vocab_size=32768, model_vocab=151936),
    "tiny": dict(model_type="llama", hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                 vocab_size=512),  # tests only
}
GOALS = {"engine_vs_peft_mixed": 2.0, "engine_vs_peft_set_adapter": None, "engine_vs_mlx_lm_reload": 5.0,
         "update_vs_torch_peft": 1.5}
# Per shape: (turns, players) and rounds per phase (rollouts, updates). At the 0.5B shape a torch +
# peft update step takes about 30 s on 2 cores, so the updates run 2 rounds after the compared
# first step: the whole run takes about 8 minutes on an idle 2-core machine.
WORKLOAD = {"bench": (64, 8), "qwen0.5b": (64, 8), "tiny": (16, 4)}
ROUNDS = {"bench": (3, 3), "qwen0.5b": (3, 2), "tiny": (1, 1)}
QUICK = (16, 4)  # --quick: turns, players; one round of each phase
# The real peers, optional: each runs in its own virtual environment, whose python is named by a
# flag or an environment variable, against one of our sides on the same work.
PEERS = {"vllm": {"module": peers_vllm, "flag": "--vllm-python", "env": "AUTOCURRICULA_VLLM_PYTHON",
                  "ours": "engine", "figure": "engine_vs_vllm"},
         "mlx_lm_lora": {"module": peers_mlx_lm_lora, "flag": "--mlx-lm-lora-python",
                         "env": "AUTOCURRICULA_MLX_LM_LORA_PYTHON", "ours": "update",
                         "figure": "update_vs_mlx_lm_lora"}}
PEER_ROUNDS = {"bench": {"vllm": 12, "mlx_lm_lora": 5}, "qwen0.5b": {"vllm": 3, "mlx_lm_lora": 2},
               "tiny": {"vllm": 1, "mlx_lm_lora": 1}}
PEER_GOALS = {"engine_vs_vllm": 2.0, "update_vs_mlx_lm_lora": 1.3}
PEER_GAP_S = 2.0  # idle before each run of the peer phases
PEER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB of KV cache; vLLM's CPU backend needs it set
# --workload multiturn, per shape: two-seat conversations over the players, ``turns`` turns each; a
# prompt opens with ``instruction`` shared tokens and ``context`` tokens of its own, and every later
# turn adds the previous completion (``new_tokens``, greedy) and a ``message`` (bench: 64 prompt
# tokens at turn 1, 224 at turn 6; the 0.5B shape plays fewer and shorter conversations, as a
# token there costs about 20x the bench shape's).
MULTITURN = {"bench": dict(conversations=16, turns=6, instruction=32, context=32, message=8, new_tokens=24),
             "qwen0.5b": dict(conversations=8, turns=4, instruction=32, context=32, message=8, new_tokens=16),
             "tiny": dict(conversations=4, turns=3, instruction=16, context=8, message=4, new_tokens=8)}
MULTITURN_QUICK = dict(conversations=4, turns=3, instruction=16, context=8, message=4, new_tokens=8)
MULTITURN_ROUNDS = {"bench": 6, "qwen0.5b": 2, "tiny": 1}
MULTITURN_SIDES = ("engine", "peft_mixed")  # then vLLM where it can run
# the engine's prefix cache for the multi-turn workload: the memory vLLM gets for its KV cache
MULTITURN_PREFIX_CACHE_MB = 1024.0
GRPO = {"learning_rate": 1e-4, "epsilon": 0.2, "epsilon_high": 0.2, "temperature": 1.0, "max_grad_norm": 1.0}
# relative agreement of the first step's loss and per-player gradient norms; on a GPU both sides run
# their float32 matmuls as TF32 (10-bit mantissa), which moves both by about 1e-3
LOSS_TOL = {"cpu": (1e-4, 1e-3), "gpu": (1e-3, 2e-2)}


# ---------------------------------------------------------------- inputs (parent; numpy only)
def model_folder(shape: str) -> Path:
    """The shape's random model folder (built once into ``~/.cache/autocurricula``)."""
    from autocurricula.engine.tiny import build_tiny_model

    s = dict(SHAPES[shape])
    model_vocab = s.pop("model_vocab", None)
    cache = Path.home() / ".cache" / "autocurricula"
    if shape == "bench":  # the same folder as `bench engine` / `bench train`
        return build_tiny_model(cache / "bench-h256-l4-a4-v1024", **s)
    base = build_tiny_model(cache / f"peers-{shape}", **s)
    return base if model_vocab is None else _widen_vocab(base, cache / f"peers-{shape}-v{model_vocab}", model_vocab)


def _widen_vocab(src: Path, dst: Path, vocab: int) -> Path:
    """``src`` with ``vocab`` rows of embedding and LM head (new rows random; the tokenizer keeps
    its ids, like Qwen's 151,936 rows over 151,665 tokens). Built in a temporary folder, renamed."""
    from safetensors.numpy import load_file, save_file

    marker = {"source": json.loads((src / "autocurricula_tiny.json").read_text()), "vocab": vocab}
    if (dst / "peers_model.json").is_file() and json.loads((dst / "peers_model.json").read_text()) == marker:
        return dst
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    try:
        for f in src.iterdir():
            if f.name != "model.safetensors":
                shutil.copyfile(f, tmp / f.name)
        w = load_file(str(src / "model.safetensors"))
        rng = np.random.default_rng(1)
        h = w["model.embed_tokens.weight"].shape[1]
        for key, std in (("model.embed_tokens.weight", 1.0), ("lm_head.weight", 2.0 * h**-0.5)):
            extra = rng.standard_normal((vocab - w[key].shape[0], h), dtype=np.float32) * np.float32(std)
            w[key] = np.concatenate([w[key], extra])
        save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((tmp / "config.json").read_text())
        config["vocab_size"] = vocab
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "peers_model.json").write_text(json.dumps(marker))  # last: the folder is complete
        os.chmod(tmp, 0o755)
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def linear_dims(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear of a llama/qwen2 block, by MLX module path (the engine's names)."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv, inter = config.get("num_key_value_heads") or heads, config["intermediate_size"]
    hd = config.get("head_dim") or h // heads
    dims = {}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        dims.update({p + "self_attn.q_proj": (h, heads * hd), p + "self_attn.k_proj": (h, kv * hd),
                     p + "self_attn.v_proj": (h, kv * hd), p + "self_attn.o_proj": (heads * hd, h),
                     p + "mlp.gate_proj": (h, inter), p + "mlp.up_proj": (h, inter), p + "mlp.down_proj": (inter, h)})
    return dims


def build_spec(work: Path, model: Path, turns: int, players: int, prompt_len: int = 20, shared: int = 12,
               new_tokens: int = 4, rank: int = 8, seed: int = 0, rounds: int = 1, torch_device: str = "auto") -> dict:
    """Prompts, turn order and adapters (peft and mlx-lm folders with the same weights) in ``work``.

    ``round_prompts[k]`` are the prompts of run ``k`` (0: the warm-up, then one set per round): every
    run gets new board tokens after the shared instruction, as a new round of games would, so no
    side serves a whole prompt it has seen in an earlier run."""
    import mlx.core as mx

    from autocurricula.engine.adapters import AdapterWeights, LoraSpec
    from autocurricula.publish.export import export_mlx, export_peft

    config = json.loads((model / "config.json").read_text())
    tok_vocab = json.loads((model / "autocurricula_tiny.json").read_text())["vocab_size"]
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, tok_vocab, shared).tolist()
    round_prompts = [[prefix + rng.integers(3, tok_vocab, prompt_len - shared).tolist() for _ in range(turns)]
                     for _ in range(rounds + 1)]
    names = [f"p{i}" for i in range(players)]
    spec_lora = LoraSpec(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    adapters = {}
    for i, n in enumerate(names):
        w = AdapterWeights.random(linear_dims(config), spec_lora, seed=seed + 1 + i)
        adapters[n] = {"peft": str(export_peft(w, work / "peft" / n, str(model),
                                               num_model_layers=config["num_hidden_layers"])),
                       "mlx": str(export_mlx(w, work / "mlx" / n, config["num_hidden_layers"]))}
    return {"model": str(model), "prompts": round_prompts[0], "round_prompts": round_prompts, "order": [names[i % players] for i in range(turns)],
            "player_names": names, "adapters": adapters, "new_tokens": new_tokens, "rank": rank,
            "grpo": dict(GRPO), "turns": str(work / "turns.json"), "torch_device": torch_device,
            "mlx_gpu": mx.default_device().type == mx.DeviceType.gpu}


def seat_pairs(conversations: int, names: list[str]) -> list[list[str]]:
    """The two players of each conversation: ``names[c]`` against the next player, then the one
    after next on a second lap, so one player meets several others."""
    n = len(names)
    return [[names[c % n], names[(c + 1 + c // n) % n]] for c in range(conversations)]


def build_multiturn_spec(work: Path, model: Path, conversations: int, players: int, turns: int, instruction: int,
                         context: int, message: int, new_tokens: int, rank: int = 8, seed: int = 0, rounds: int = 1,
                         torch_device: str = "auto", prefix_cache_mb: float = MULTITURN_PREFIX_CACHE_MB) -> dict:
    """:func:`build_spec` plus ``conversations[k]``, the conversations of run ``k`` (0: the warm-up;
    see :mod:`peers_multiturn`): each opens with the shared instruction and its own context, new
    every run, and every later turn adds a new seeded message of ``message`` tokens.

    ``prefix_cache_mb`` sizes the engine's prefix cache (by default the memory vLLM gets)."""
    spec = build_spec(work, model, conversations, players, prompt_len=instruction + context, shared=instruction,
                      new_tokens=new_tokens, rank=rank, seed=seed, rounds=rounds, torch_device=torch_device)
    tok_vocab = json.loads((model / "autocurricula_tiny.json").read_text())["vocab_size"]
    rng = np.random.default_rng([seed, 1])
    seats = seat_pairs(conversations, spec["player_names"])
    spec["conversations"] = [[{"players": pair, "opening": opening,
                               "messages": [rng.integers(3, tok_vocab, message).tolist() for _ in range(turns - 1)]}
                              for pair, opening in zip(seats, openings)] for openings in spec["round_prompts"]]
    spec.update(workload="multiturn", prefix_cache_mb=prefix_cache_mb,
                max_len=peers_multiturn.longest(spec["conversations"][0], new_tokens))
    return spec


def training_turns(rows: list[dict], order: list[str], seed: int = 0, noise: float = 0.2) -> list[dict]:
    """GRPO rows from the engine's sampled turns: advantage +-1, sampler logprobs plus N(0, noise)
    so the ratio is not 1 and the clip is exercised (the loss then depends on the model)."""
    rng = np.random.default_rng(seed)
    out = []
    for row, player in zip(rows, order):
        old = (np.asarray(row["logprobs"]) + rng.normal(0, noise, len(row["logprobs"]))).tolist()
        out.append({"player": player, "prompt_ids": row["prompt_ids"], "completion_ids": row["token_ids"],
                    "logprobs": old, "advantage": float(rng.choice([-1.0, 1.0]))})
    return out


# ---------------------------------------------------------------- MLX worker sides
def _engine(spec: dict):
    from autocurricula.engine import Engine, EngineConfig

    n = len(spec["player_names"])
    cache = {"prefix_cache_mb": spec["prefix_cache_mb"]} if "prefix_cache_mb" in spec else {}
    engine = Engine(spec["model"], config=EngineConfig(max_slots=n, max_batch=len(spec["prompts"]),
                                                       initial_rank=spec["rank"], **cache))
    for name in spec["player_names"]:
        engine.load_adapter(name, spec["adapters"][name]["peft"])
    return engine


def _hit_rate(before: dict, after: dict, prompt_tokens: int) -> float | None:
    """Share of this run's prompt tokens served from a prefix cache: from ``prefix_hit_tokens``
    (a counter) or ``prefix_hit_rate`` in ``engine.stats``; None when the engine has neither."""
    if "prefix_hit_tokens" in after:
        return (after["prefix_hit_tokens"] - before.get("prefix_hit_tokens", 0)) / max(1, prompt_tokens)
    return after.get("prefix_hit_rate")


def _together(engine, prompts, players, params) -> tuple[list, float]:
    """Every prompt's completion, all admitted in one batch, and the seconds from their release."""
    go = threading.Event()
    engine.call(go.wait, 600)  # hold the engine thread so all turns start in one batch
    futs = [engine.submit(p, o, params) for p, o in zip(prompts, players)]
    t0 = time.perf_counter()
    go.set()
    outs = [f.result() for f in futs]
    return outs, time.perf_counter() - t0


def setup_engine_multiturn(spec: dict):
    """The engine on the multi-turn workload: each turn level in one batch, greedy."""
    from autocurricula.engine import SamplingParams

    engine = _engine(spec)
    greedy = SamplingParams(max_tokens=spec["new_tokens"], temperature=0.0, ignore_eos=True)

    def generate(prompts, players):
        before = engine.stats["prefix_hit_tokens"]
        outs, _ = _together(engine, prompts, players, greedy)
        return [o.token_ids for o in outs], engine.stats["prefix_hit_tokens"] - before

    def run(r: int):
        return peers_multiturn.play(spec["conversations"][r], generate)

    run(0)  # warm-up
    return run, {}


def setup_engine(spec: dict):
    from autocurricula.engine import SamplingParams

    if spec.get("workload") == "multiturn":
        return setup_engine_multiturn(spec)
    engine = _engine(spec)
    sampled = SamplingParams(max_tokens=spec["new_tokens"], temperature=1.0, ignore_eos=True)

    def run(r: int, params=sampled, players=spec["order"]):
        prompts = spec["round_prompts"][r]
        before = dict(engine.stats)
        outs, dt = _together(engine, prompts, players, params)
        return {"seconds": dt, "tokens": sum(len(o.token_ids) for o in outs),
                "prefix_hit_rate": _hit_rate(before, engine.stats, sum(len(p) for p in prompts)),
                "rows": [{"prompt_ids": o.prompt_ids, "token_ids": o.token_ids, "logprobs": o.logprobs} for o in outs]}

    warm = run(0)  # warm-up; its sampled turns are the update sides' rows
    info = {"rows": warm["rows"]}
    if spec.get("greedy"):  # the warm-up turns' greedy tokens, with each turn's adapter and with none
        greedy = SamplingParams(max_tokens=spec["new_tokens"], temperature=0.0, ignore_eos=True)
        info["greedy"] = {"lora": [r["token_ids"] for r in run(0, greedy)["rows"]],
                          "base": [r["token_ids"] for r in run(0, greedy, [None] * len(spec["order"]))["rows"]]}
    return (lambda r: {k: v for k, v in run(r).items() if k != "rows"}), info


def setup_mlx_lm_reload(spec: dict):
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from autocurricula.engine.models import register

    register()  # mlx-lm finds the families autocurricula adds (OPT)

    sampler, n_new = make_sampler(temp=1.0), spec["new_tokens"]

    def run(r: int, players=spec["player_names"]):
        by_player = {n: [p for p, o in zip(spec["round_prompts"][r], spec["order"]) if o == n] for n in players}
        t0, tokens = time.perf_counter(), 0
        for n in players:
            model, _ = load(spec["model"], adapter_path=spec["adapters"][n]["mlx"])  # as mlx-lm's server does
            gen = BatchGenerator(model, max_tokens=n_new, sampler=sampler)  # no stop tokens: exactly n_new each
            gen.insert(by_player[n], [n_new] * len(by_player[n]))
            while responses := gen.next_generated():
                tokens += len(responses)
            gen.close()
            del model, gen  # one model in memory at a time, as a server holds one
        return {"seconds": time.perf_counter() - t0, "tokens": tokens}

    run(0, spec["player_names"][:1])  # warm-up
    return run, {}


def setup_update(spec: dict):
    from autocurricula.training.config import GRPOConfig
    from autocurricula.records import Turn
    from autocurricula.training import Updater

    engine = _engine(spec)
    g = spec["grpo"]
    up = Updater(engine, GRPOConfig(learning_rate=g["learning_rate"], loss_type="dapo", epsilon=g["epsilon"],
                                    epsilon_high=g["epsilon_high"], temperature=g["temperature"],
                                    max_grad_norm=g["max_grad_norm"]))
    turns = []
    for i, t in enumerate(json.loads(Path(spec["turns"]).read_text())):
        turn = Turn(t["player"], f"g{i}", "X", t["prompt_ids"], t["completion_ids"], t["logprobs"], reward=0.0)
        turn.advantage = t["advantage"]
        turns.append(turn)
    tokens = sum(len(t.completion_ids) for t in turns)

    def run(r: int):  # the same rows every round
        t0 = time.perf_counter()
        m = up.step(turns)
        return {"seconds": time.perf_counter() - t0, "tokens": tokens, "loss": m["loss"]}

    first = up.step(turns)  # the first step (also the warm-up) is compared with torch's
    norms = {k.split("/", 1)[1]: v for k, v in first.items() if k.startswith("grad_norm/")}
    return run, {"first_loss": first["loss"], "first_grad_norms": norms}


MLX_SETUPS = {"engine": setup_engine, "mlx_lm_reload": setup_mlx_lm_reload, "update": setup_update}


# ---------------------------------------------------------------- parent: workers, rounds, ratios
def by_path(python: str, script: str, side: str, spec_path: Path) -> list[str]:
    """The command that runs worker ``script`` by path under ``python``: the package's
    ``__init__`` (the BLAS preload) never runs, and the interpreter need not have the package."""
    return [python, "-c", "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')",
            script, side, str(spec_path)]


class Worker:
    """One side in its own process; ``run()`` sends one run command and waits for its answer.

    ``cmd``: the worker's command (default: this interpreter, by path for the torch sides);
    ``env``: variables set for it on top of this process's environment."""

    def __init__(self, side: str, spec_path: Path, log_dir: Path, cmd: list[str] | None = None,
                 env: dict | None = None):
        self.side = side
        self.log = log_dir / f"{side}.log"
        if cmd is None and side in TORCH_SIDES:
            cmd = by_path(sys.executable, peers_torch.__file__, side, spec_path)
        elif cmd is None:
            cmd = [sys.executable, "-m", "autocurricula.bench.peers", "--worker", side, str(spec_path)]
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", **(env or {}))
        self._err = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     cwd=str(log_dir), env=env)
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self._answers.put(json.loads(line))
            except ValueError:
                continue
        self._answers.put({"error": f"worker exited with code {self.proc.wait()}"})

    def answer(self, timeout: float) -> dict:
        try:
            msg = self._answers.get(timeout=timeout)
        except queue.Empty:
            msg = {"error": f"no answer within {timeout:.0f} s"}
        if "error" in msg:
            self.close()
            tail = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"bench peers: side {self.side} failed: {msg['error']}\n{msg.get('traceback', '')}"
                               f"--- {self.log} (tail) ---\n{tail}")
        return msg

    def run(self, timeout: float, round: int = 1) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": "run", "round": round}) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def _timed_run(w: Worker, timeout: float, round: int) -> dict:
    """One run of ``w``, with the machine's load and the cores its process tree kept busy."""
    load, before, t0 = peers_usage.load_now(), peers_usage.tree_usage(w.proc.pid), time.perf_counter()
    out = w.run(timeout, round)
    wall, after = time.perf_counter() - t0, peers_usage.tree_usage(w.proc.pid)
    out.update(load=load, cores=peers_usage.cores_used(before, after, wall), threads=(after or {}).get("threads"))
    return out


def _rounds(sides, spec_path, log_dir, reps, timeout, gap: float = 0.0, alternate: bool = False,
            commands: dict | None = None, env: dict | None = None) -> tuple[dict, dict]:
    """Start the sides one after another (warm-ups of 2-thread torch and MLX processes would fight
    over the cores), then run them interleaved ``reps`` times: A B C A B C ..., or with
    ``alternate`` A B, B A, A B ... so neither side always runs first. ``gap`` seconds of idle
    precede every run, so one side's spinning threads do not land in the next side's time.
    ``commands[side]``: that side's worker command (see :class:`Worker`)."""
    workers, ready, commands = [], {}, commands or {}
    try:
        for side in sides:
            t0 = time.perf_counter()
            workers.append(Worker(side, spec_path, log_dir, commands.get(side), env))
            ready[side] = workers[-1].answer(timeout)
            ready[side]["startup_s"] = round(time.perf_counter() - t0, 1)
            _progress(f"{side}: loaded and warmed up in {ready[side]['startup_s']} s")
        runs = {s: [] for s in sides}
        for i in range(reps):
            for w in (workers[::-1] if alternate and i % 2 else workers):
                time.sleep(gap)
                runs[w.side].append(_timed_run(w, timeout, i + 1))
                _progress(f"round {i + 1}/{reps} {w.side}: {runs[w.side][-1]['seconds']:.2f} s")
        return ready, runs
    finally:
        for w in workers:
            w.close()


def _progress(msg: str) -> None:
    print(f"bench peers: {msg}", file=sys.stderr, flush=True)  # stdout carries only the result


def summary(values) -> dict:
    """``{"median", "min", "max"}`` of finite values (None where there are none)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(vals), 4), "min": round(min(vals), 4), "max": round(max(vals), 4)}


def peer_python(name: str, named: str | None = None, environ=os.environ) -> tuple[str | None, str]:
    """``(python, "")`` when the peer ``name`` can run, else ``(None, why not)``.

    The python is ``named`` (the peer's flag) or the peer's environment variable; it must import
    the peer's package (a real import: a broken install is caught here, not mid-bench)."""
    peer = PEERS[name]
    python = named or environ.get(peer["env"])
    if not python:
        return None, f"not named (pass {peer['flag']} PYTHON or set {peer['env']}; see docs/benchmarks.md)"
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        return None, f"{python} is not an executable file (fix {peer['flag']} or {peer['env']})"
    module = peer["module"].IMPORT
    try:
        probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, **PEER_ENV))
    except subprocess.TimeoutExpired:
        return None, f"{python} took over 300 s to import {module}"
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"{python} cannot import {module}: {last} (install steps: docs/benchmarks.md)"
    return python, ""


def first_step_agreement(ours: dict, theirs: dict, tolerances: tuple[float, float]) -> dict:
    """Our first update step's loss and per-player gradient norms against a peer's."""
    diff = abs(ours["first_loss"] - theirs["first_loss"])
    norm_diff = max(abs(ours["first_grad_norms"][n] - theirs["first_grad_norms"][n]) /
                    max(1e-12, abs(theirs["first_grad_norms"][n])) for n in theirs["first_grad_norms"])
    loss_tol, norm_tol = tolerances
    return {"ours": ours["first_loss"], "theirs": theirs["first_loss"], "abs_diff": diff,
            "grad_norm_max_rel_diff": norm_diff, "tolerances": [loss_tol, norm_tol],
            "agree": diff <= loss_tol * max(1.0, abs(theirs["first_loss"])) and norm_diff <= norm_tol}


def greedy_agreement(ours: dict, theirs: dict) -> dict:
    """Rows whose greedy tokens are equal, per mode (``lora``: each turn's adapter, ``base``: none)."""
    return {mode: {"equal": sum(a == b for a, b in zip(ours[mode], theirs[mode])), "rows": len(ours[mode])}
            for mode in ours}


def vllm_binding(log: str) -> dict:
    """The cores vLLM's CPU backend bound its OpenMP threads to and those it kept for its
    scheduler, as its log states them (empty where it did not)."""
    cores = re.findall(r"local_rank=\d+, core ids=(\[[\d, ]*\])", log)
    reserved = re.findall(r"reserved_cpus=(\[[\d, ]*\])", log)
    return {"omp_cores": json.loads(cores[-1]) if cores else None,
            "reserved_cores": json.loads(reserved[-1]) if reserved else None}


def side_usage(runs: list[dict]) -> dict:
    return {"cores": summary([r.get("cores") for r in runs]),
            "threads_max": max((r["threads"] for r in runs if r.get("threads") is not None), default=None)}


def _peer_phase(name: str, python: str, spec: dict, work: Path, reps: int, timeout: float, gap: float) -> dict:
    """One peer against our side, alternating, with ``gap`` s of idle before each run."""
    peer = PEERS[name]
    side, ours = peer["module"].SIDE, peer["ours"]
    spec_path = work / f"spec-{name}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = by_path(python, peer["module"].__file__, side, spec_path)
    ready, runs = _rounds((ours, side), spec_path, work, reps, timeout, gap=gap, alternate=True,
                          commands={side: cmd}, env={k: os.environ.get(k, v) for k, v in PEER_ENV.items()})
    rate = {s: [r["tokens"] / r["seconds"] for r in runs[s]] for s in runs}
    out = {"python": python, "version": ready[side].get("version"), "rounds": reps, "gap_s": gap,
           peer["figure"]: summary([a / b for a, b in zip(rate[ours], rate[side])]),
           "tok_s": {s: summary(rate[s]) for s in rate}, "seconds": {s: summary([r["seconds"] for r in runs[s]])
                                                                     for s in runs},
           "usage": {s: side_usage(runs[s]) for s in runs}, "load": summary([r["load"] for s in runs for r in runs[s]]),
           "startup_s": {s: ready[s]["startup_s"] for s in ready}}
    if name == "vllm":
        out["greedy_agreement"] = greedy_agreement(ready[ours]["greedy"], ready[side]["greedy"])
        out["torch_threads"], out["env"] = ready[side]["torch_threads"], ready[side]["env"]
        out["binding"] = vllm_binding((work / f"{side}.log").read_text(errors="replace"))
    else:
        out["first_step"] = first_step_agreement(ready[ours], ready[side], LOSS_TOL["gpu" if spec["mlx_gpu"] else "cpu"])
        out["mlx_device"], out["blas"] = ready[side]["mlx_device"], ready[side]["blas"]
    return out


def run_peers(spec: dict, rows: list[dict], work: Path, pythons: dict, reps: dict, timeout: float,
              gap: float = PEER_GAP_S, names=tuple(PEERS)) -> dict:
    """Every real peer of ``names`` that can run against our side, each ``{"skipped": why}`` otherwise.

    ``rows``: the engine's sampled warm-up turns; the mlx-lm-lora phase trains on them with the
    sampler's own logprobs (its loss is on-policy only, so only then are the losses the same)."""
    from autocurricula.engine.blas import ACTIVE

    turns = work / "turns-on-policy.json"
    turns.write_text(json.dumps(training_turns(rows, spec["order"], noise=0.0)))
    peer_spec = dict(spec, greedy=True, turns=str(turns), blas=ACTIVE["library"])
    out = {}
    for name in names:
        python, why = peer_python(name, pythons.get(name))
        if python is None:
            _progress(f"skipping the {name} side: {why}")
            out[name] = {"skipped": why}
            continue
        out[name] = _peer_phase(name, python, peer_spec, work, reps[name], timeout, gap)
    return out


def workload(shape: str, quick: bool = False) -> dict:
    """Turns, players and interleaved rounds (rollouts, updates) the shape runs by default."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    turns, players = QUICK if quick else WORKLOAD[shape]
    return {"turns": turns, "players": players, "rounds": (1, 1) if quick else ROUNDS[shape]}


def _describe(shape: str, model: Path, spec: dict) -> dict:
    config = json.loads((model / "config.json").read_text())
    return {"shape": shape, "model": str(model), "model_type": config["model_type"],
            "hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
            "vocab_size": config["vocab_size"], "dtype": "float32", "turns": len(spec["order"]),
            "players": len(spec["player_names"]), "prompt_len": len(spec["prompts"][0]),
            "new_tokens": spec["new_tokens"], "lora_rank": spec["rank"], "lora_targets": "all-linear",
            "cpu_count": os.cpu_count(), "mlx_device": "gpu" if spec["mlx_gpu"] else "cpu"}


def _run_peers_only(shape, quick, turns, players, timeout, pythons, peer_reps) -> dict:
    w = workload(shape, quick)
    peer_reps = peer_reps or ({n: 1 for n in PEERS} if quick else PEER_ROUNDS[shape])
    t_start = time.perf_counter()
    model = model_folder(shape)
    work = Path(tempfile.mkdtemp(prefix="ac-peers-"))
    try:
        spec = build_spec(work, model, turns or w["turns"], players or w["players"], rounds=max(peer_reps.values()))
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(spec))
        ready, _ = _rounds(("engine",), spec_path, work, 0, timeout)  # its warm-up turns are the rows
        peers = run_peers(spec, ready["engine"]["rows"], work, pythons, peer_reps, timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**_describe(shape, model, spec), "quick": quick, "peers_only": True, "peers": peers,
            "seconds": round(time.perf_counter() - t_start, 1)}


def run(shape: str = "bench", quick: bool = False, reps: int | None = None, turns: int | None = None,
        players: int | None = None, timeout: float = 900.0, torch_device: str = "auto",
        pythons: dict | None = None, peer_reps: dict | None = None, peers_only: bool = False) -> dict:
    """Run every side at ``shape`` and return the figures (see the module docstring).

    ``pythons``: ``{"vllm": ..., "mlx_lm_lora": ...}``, the python of each real peer's virtual
    environment (else its environment variable; a peer named by neither is skipped, and
    ``result["peers"][name]["skipped"]`` says why); ``peer_reps``: rounds of each peer phase;
    ``peers_only``: only the real peers' phases (the engine still samples their rows)."""
    if peers_only:
        return _run_peers_only(shape, quick, turns, players, timeout, pythons or {}, peer_reps)
    w = workload(shape, quick)
    rollout_reps, update_reps = (reps, reps) if reps else w["rounds"]
    peer_reps = peer_reps or ({n: 1 for n in PEERS} if quick else PEER_ROUNDS[shape])
    turns, players = turns or w["turns"], players or w["players"]
    t_start = time.perf_counter()
    model = model_folder(shape)
    work = Path(tempfile.mkdtemp(prefix="ac-peers-"))
    try:
        spec = build_spec(work, model, turns, players, rounds=max(rollout_reps, *peer_reps.values()),
                          torch_device=torch_device)
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(spec))
        ready, runs = _rounds(ROLLOUT_SIDES, spec_path, work, rollout_reps, timeout)
        Path(spec["turns"]).write_text(json.dumps(training_turns(ready["engine"]["rows"], spec["order"])))
        up_ready, up_runs = _rounds(UPDATE_SIDES, spec_path, work, update_reps, timeout)
        runs.update(up_runs)
        leaked = [s for s in TORCH_SIDES if {**ready, **up_ready}[s]["autocurricula_imported"]]
        peers = run_peers(spec, ready["engine"]["rows"], work, pythons or {}, peer_reps, timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate = {s: [r["tokens"] / r["seconds"] for r in runs[s]] for s in runs}
    result = {**_describe(shape, model, spec), "repetitions": {"rollouts": rollout_reps, "updates": update_reps},
              "quick": quick, "torch_device": "/".join(sorted({{**ready, **up_ready}[s]["torch_device"]
                                                               for s in TORCH_SIDES}))}

    def paired(a, b):
        return summary([x / y for x, y in zip(rate[a], rate[b])])

    result["engine_vs_peft_mixed"] = paired("engine", "peft_mixed")
    result["engine_vs_peft_set_adapter"] = paired("engine", "peft_set_adapter")
    result["engine_vs_mlx_lm_reload"] = paired("engine", "mlx_lm_reload")
    result["update_vs_torch_peft"] = paired("update", "torch_peft_update")
    hits = [r.get("prefix_hit_rate") for r in runs["engine"]]
    if all(h is None for h in hits):
        result["prefix_hit_rate"] = {"median": 0.0, "min": 0.0, "max": 0.0}
        result["prefix_hit_rate_note"] = "the engine has no prefix cache (no prefix_hit_tokens in engine.stats)"
    else:
        result["prefix_hit_rate"] = summary(hits)
    result["tok_s"] = {s: summary(rate[s]) for s in rate}
    result["startup_s"] = {s: r["startup_s"] for s, r in {**ready, **up_ready}.items()}
    agreement = first_step_agreement(up_ready["update"], up_ready["torch_peft_update"],
                                     LOSS_TOL["gpu" if spec["mlx_gpu"] or result["torch_device"] != "cpu" else "cpu"])
    agreement["torch_peft"] = agreement.pop("theirs")
    result["update_loss"] = agreement
    result["torch_imported_autocurricula"] = leaked
    result["usage"] = {s: side_usage(runs[s]) for s in runs}
    result["load"] = summary([r["load"] for s in runs for r in runs[s]])
    result["peers"] = peers
    result["goals"] = {k: v for k, v in GOALS.items() if v is not None}
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    return result


UPDATE_WORKLOADS = {"tictactoe": 64, "negotiation": 32}  # bench train's round workloads: games a round


def run_update_workload(workload: str, shape: str = "bench", quick: bool = False, reps: int | None = None,
                        timeout: float = 900.0, torch_device: str = "auto", torch_threads: int | None = None) -> dict:
    """The update sides only, on one round of real games (``bench train``'s ``workload``, played on
    the shape's model): our default (tree-packed) update against torch + peft computing each row
    on its own, the same dapo loss and AdamW, interleaved; with the first step's agreement."""
    from autocurricula.bench.workloads import LEARNERS, play_round
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.training.trie import token_counts

    if workload not in UPDATE_WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(UPDATE_WORKLOADS)}, got {workload!r}")
    reps = reps or (1 if quick else ROUNDS[shape][1])
    t_start = time.perf_counter()
    model = model_folder(shape)
    work = Path(tempfile.mkdtemp(prefix="ac-peers-"))
    try:
        learners = LEARNERS
        spec = build_spec(work, model, len(learners), len(learners), rounds=1, torch_device=torch_device)
        spec["torch_threads"] = torch_threads
        engine = Engine(str(model), config=EngineConfig(max_slots=8, initial_rank=8))
        try:
            lora = LoraSpec(r=8, lora_alpha=16)
            dims = {p: engine.linear_dims[p] for p in lora.resolve(engine.linear_dims)}
            for i, n in enumerate(learners):
                engine.load_adapter(n, AdapterWeights.random(dims, lora, seed=i))
            turns = play_round(engine, workload, 8 if quick else UPDATE_WORKLOADS[workload], seed=0)
        finally:
            engine.close()
        name = dict(zip(learners, spec["player_names"]))
        rows = [{"prompt_ids": list(t.prompt_ids), "token_ids": list(t.completion_ids), "logprobs": list(t.logprobs)}
                for t in turns]
        order = [name[t.player] for t in turns]
        Path(spec["turns"]).write_text(json.dumps(training_turns(rows, order)))
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(spec))
        ready, runs = _rounds(UPDATE_SIDES, spec_path, work, reps, timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rate = {s: [r["tokens"] / r["seconds"] for r in runs[s]] for s in runs}
    counts = token_counts(order, [r["prompt_ids"] + r["token_ids"] for r in rows])
    agreement = first_step_agreement(ready["update"], ready["torch_peft_update"],
                                     LOSS_TOL["gpu" if spec["mlx_gpu"] or ready["torch_peft_update"]["torch_device"]
                                              != "cpu" else "cpu"])
    agreement["torch_peft"] = agreement.pop("theirs")
    return {**_describe(shape, model, spec), "workload": workload, "turns": len(turns), "repetitions": reps,
            "torch_threads": torch_threads or os.cpu_count(),
            "row_tokens": counts["row_tokens"], "tree_tokens": counts["tree_tokens"],
            "update_vs_torch_peft": summary([a / b for a, b in zip(rate["update"], rate["torch_peft_update"])]),
            "seconds_each": {s: summary([r["seconds"] for r in runs[s]]) for s in runs}, "update_loss": agreement,
            "usage": {s: side_usage(runs[s]) for s in runs}, "load": summary([r["load"] for s in runs for r in runs[s]]),
            "seconds": round(time.perf_counter() - t_start, 1)}


def format_update_workload(r: dict) -> str:
    s, a = r["update_vs_torch_peft"], r["update_loss"]
    return "\n".join([
        f"bench peers --workload {r['workload']} (shape {r['shape']}): one round's update, {r['turns']} turns, "
        f"{r['row_tokens']} row tokens ({r['tree_tokens']} in the learners' prefix tries)",
        f"cores {r['cpu_count']}, torch threads {r['torch_threads']}, load {r['load']}",
        f"update / torch + peft (tokens/s, {r['repetitions']} interleaved rounds): median {s['median']} "
        f"(min {s['min']}, max {s['max']})",
        f"seconds per step: {json.dumps(r['seconds_each'])}",
        f"first step: loss {a['ours']:.6g} (ours) vs {a['torch_peft']:.6g} (torch + peft), grad norms within "
        f"{a['grad_norm_max_rel_diff']:.2g}: {'agree' if a['agree'] else 'DISAGREE'}"])


def multiturn_workload(shape: str, quick: bool = False) -> dict:
    """The multi-turn workload's shape (see :data:`MULTITURN`) and its rounds."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    return {**(MULTITURN_QUICK if quick else MULTITURN[shape]), "rounds": 1 if quick else MULTITURN_ROUNDS[shape]}


def run_multiturn(shape: str = "bench", quick: bool = False, reps: int | None = None, players: int | None = None,
                  timeout: float = 900.0, torch_device: str = "auto", pythons: dict | None = None,
                  gap: float = PEER_GAP_S, sides=MULTITURN_SIDES) -> dict:
    """The multi-turn workload (:mod:`peers_multiturn`) on ``sides`` and vLLM where it can run,
    each in its own process, in alternating order (A B C, C B A, ...) with ``gap`` s of idle
    before each run. Ratios pair the runs of one round; greedy completions are compared with
    the engine's; ``prefix_hit_rate[side]`` is None for a side without a prefix cache."""
    w = multiturn_workload(shape, quick)
    default_reps = w.pop("rounds")
    reps = reps or default_reps
    t_start = time.perf_counter()
    model = model_folder(shape)
    work = Path(tempfile.mkdtemp(prefix="ac-peers-"))
    kv_gb = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", PEER_ENV["VLLM_CPU_KVCACHE_SPACE"]))
    try:
        spec = build_multiturn_spec(work, model, players=players or WORKLOAD[shape][1], rounds=reps,
                                    torch_device=torch_device, prefix_cache_mb=kv_gb * 1024, **w)
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(spec))
        sides, commands, skipped = list(sides), {}, {}
        python, why = peer_python("vllm", (pythons or {}).get("vllm"))
        if python is None:
            _progress(f"skipping the vllm side: {why}")
            skipped["vllm"] = why
        else:
            sides.append(peers_vllm.SIDE)
            commands[peers_vllm.SIDE] = by_path(python, peers_vllm.__file__, peers_vllm.SIDE, spec_path)
        ready, runs = _rounds(sides, spec_path, work, reps, timeout, gap=gap, alternate=True, commands=commands,
                              env={k: os.environ.get(k, v) for k, v in PEER_ENV.items()})
        log = work / f"{peers_vllm.SIDE}.log"
        binding = vllm_binding(log.read_text(errors="replace")) if peers_vllm.SIDE in ready else None
    finally:
        shutil.rmtree(work, ignore_errors=True)

    conv = spec["conversations"][0]
    result = {**_describe(shape, model, spec), "workload": "multiturn", "quick": quick, "rounds": reps,
              "conversations": len(conv), "turns": len(conv[0]["messages"]) + 1, "prompt_len": len(conv[0]["opening"]),
              "last_prompt_len": spec["max_len"] - spec["new_tokens"], "message_len": len(conv[0]["messages"][0]),
              "engine_prefix_cache_mb": spec["prefix_cache_mb"], "skipped": skipped, "gap_s": gap}
    rate = {s: [r["tokens"] / r["seconds"] for r in runs[s]] for s in runs}
    result["seconds"] = {s: summary([r["seconds"] for r in runs[s]]) for s in runs}
    result["tokens_per_round"] = {s: {"completion": runs[s][0]["tokens"],
                                      "prompt": sum(x["prompt_tokens"] for x in runs[s][0]["levels"])} for s in runs}
    result["tok_s"] = {s: summary(rate[s]) for s in rate}
    result["prefix_hit_rate"] = {s: {k: summary([peers_multiturn.hit_rates(r["levels"])[k] for r in runs[s]])
                                     for k in ("all", "first", "later")} for s in runs}
    result["ratios"] = {f"engine_vs_{s}": summary([a / b for a, b in zip(rate["engine"], rate[s])])
                        for s in runs if s != "engine"}
    result["agreement"] = {s: _sum_agreement([peers_multiturn.agreement(a["completions"], b["completions"])
                                              for a, b in zip(runs["engine"], runs[s])]) for s in runs if s != "engine"}
    result["usage"] = {s: side_usage(runs[s]) for s in runs}
    result["load"] = summary([r["load"] for s in runs for r in runs[s]])
    result["startup_s"] = {s: ready[s]["startup_s"] for s in ready}
    if peers_vllm.SIDE in ready:
        v = ready[peers_vllm.SIDE]
        result["vllm"] = {"version": v["version"], "block_size": v.get("block_size"), "binding": binding,
                          "torch_threads": v["torch_threads"], "env": v["env"]}
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    return result


def _sum_agreement(parts: list[dict]) -> dict:
    return {k: sum(p[k] for p in parts) for k in parts[0]} if parts else {}


def format_multiturn(r: dict) -> str:
    """The multi-turn workload's table: per side seconds per round, tokens, prefix hit rates."""
    lines = [f"shape {r['shape']} ({r['model_type']}, hidden {r['hidden_size']}, {r['num_layers']} layers, vocab "
             f"{r['vocab_size']}, fp32)  |  multi-turn: {r['conversations']} conversations over {r['players']} "
             f"players, {r['turns']} turns each (prompt {r['prompt_len']} -> {r['last_prompt_len']} tokens, "
             f"+{r['new_tokens']} greedy + {r['message_len']} message tokens a turn), LoRA r={r['lora_rank']} "
             f"all-linear  |  {r['rounds']} rounds, alternating, {r['gap_s']} s idle before each run, "
             f"{r['cpu_count']} cores, {r['wall_s']} s", ""]
    lines.append(f"{'side':<12}{'s/round':>24}{'tok/s':>22}{'prefix hit, all turns':>26}{'turns 2+':>24}"
                 f"{'cores':>8}{'threads':>9}")
    for s in r["seconds"]:
        h, u = r["prefix_hit_rate"][s], r["usage"][s]
        lines.append(f"{s:<12}{_span(r['seconds'][s], '.3f'):>24}{_span(r['tok_s'][s], '.0f'):>22}"
                     f"{_span(h['all'], '.2f'):>26}{_span(h['later'], '.2f'):>24}"
                     f"{_span(u['cores'], '.2f').split(' ')[0]:>8}{str(u['threads_max']):>9}")
    t = r["tokens_per_round"]["engine"]
    lines += ["", f"per round: {t['completion']} completion tokens, {t['prompt']} prompt tokens; prefix hit n/a: the side "
              "has no prefix cache across calls"]
    for key, s in r["ratios"].items():
        side = key.removeprefix("engine_vs_")
        a = r["agreement"][side]
        lines.append(f"{key:<24}{_span(s)}   greedy turns equal {a['equal']}/{a['rows']} "
                     f"(first turns {a['first_equal']}/{a['first_rows']})")
    for name, why in r["skipped"].items():
        lines.append(f"  {name}: skipped: {why}")
    if "vllm" in r:
        v = r["vllm"]
        lines.append(f"vLLM {v['version']}: KV block {v['block_size']} tokens, OpenMP cores {v['binding']['omp_cores']}, "
                     f"kept for its scheduler {v['binding']['reserved_cores']}; engine prefix cache "
                     f"{r['engine_prefix_cache_mb']:.0f} MB, block 16")
    if r.get("load", {}).get("median") is not None:
        lines.append(f"load average (1 min) during the runs: {_span(r['load'], '.2f')}")
    return "\n".join(lines)


def multiturn_problems(r: dict) -> list[str]:
    """Sides whose first turns (the same prompts on every side) got other greedy tokens than the engine's."""
    return [f"{s}: greedy tokens of first turns differ from the engine's" for s, a in r["agreement"].items()
            if a["first_equal"] != a["first_rows"]]


def format_table(r: dict) -> str:
    lines = [f"shape {r['shape']} ({r['model_type']}, hidden {r['hidden_size']}, {r['num_layers']} layers, vocab "
             f"{r['vocab_size']}, fp32)  |  {r['turns']} turns over {r['players']} players, prompt {r['prompt_len']} "
             f"+ {r['new_tokens']} sampled tokens, LoRA r={r['lora_rank']} all-linear  |  "
             + ("real peers only" if r.get("peers_only") else f"rounds {r['repetitions']}")
             + f", {r['cpu_count']} cores, MLX on {r['mlx_device']}"
             + ("" if r.get("peers_only") else f", torch on {r['torch_device']}") + f", {r['seconds']} s", ""]
    if not r.get("peers_only"):
        lines += _format_ours(r)
    lines += ["real peers (each side in its own process, alternating, idle before each run):"]
    lines += [line for name, p in r.get("peers", {}).items() for line in _format_peer(name, p)]
    return "\n".join(lines)


def _format_ours(r: dict) -> list[str]:
    lines = []
    lines.append(f"{'':<28}{'median':>9}{'min':>9}{'max':>9}")
    for key, goal in GOALS.items():
        s = r[key]
        verdict = "" if goal is None else f"   goal >= {goal} ({'ok' if (s['median'] or 0) >= goal else 'below goal'})"
        lines.append(f"{key:<28}{s['median']:>9.3g}{s['min']:>9.3g}{s['max']:>9.3g}{verdict}")
    p = r["prefix_hit_rate"]
    lines.append(f"{'prefix_hit_rate':<28}{p['median']:>9.3g}{p['min']:>9.3g}{p['max']:>9.3g}   "
                 f"{r.get('prefix_hit_rate_note', '')}")
    lines.append("")
    lines.append("tok/s (median): " + "  ".join(f"{s}: {v['median']:.0f}" for s, v in r["tok_s"].items()))
    u = r["update_loss"]
    lines.append(f"first-step loss: ours {u['ours']:.6f}, torch+peft {u['torch_peft']:.6f} (|diff| {u['abs_diff']:.1e}, "
                 f"grad norms within {u['grad_norm_max_rel_diff']:.1e})" + ("" if u["agree"] else "  DISAGREE"))
    if r.get("load", {}).get("median") is not None:
        lines.append(f"load average (1 min) during the runs: {_span(r['load'], '.2f')}")
    return lines + [""]


def _span(s: dict, fmt: str = ".3g") -> str:
    return "n/a" if s["median"] is None else f"{s['median']:{fmt}} ({s['min']:{fmt}} - {s['max']:{fmt}})"


def _format_peer(name: str, p: dict) -> list[str]:
    if "skipped" in p:
        return [f"  {name}: skipped: {p['skipped']}"]
    figure = PEERS[name]["figure"]
    goal = PEER_GOALS[figure]
    ok = "ok" if (p[figure]["median"] or 0) >= goal else "below goal"
    lines = [f"  {figure}: {_span(p[figure])}   goal >= {goal} ({ok})   [{name} {p['version']}, {p['rounds']} rounds, "
             f"{p['gap_s']} s idle before each run, load {_span(p['load'], '.2f')}]"]
    lines.append("    " + "; ".join(f"{s}: {_span(p['tok_s'][s], '.0f')} tok/s, {_span(u['cores'], '.2f')} cores busy, "
                                   f"up to {u['threads_max']} threads" for s, u in p["usage"].items()))
    if "greedy_agreement" in p:
        g = p["greedy_agreement"]
        lines.append(f"    greedy tokens equal on {g['lora']['equal']}/{g['lora']['rows']} rows with adapters, "
                     f"{g['base']['equal']}/{g['base']['rows']} without")
        b = p["binding"]
        lines.append(f"    vLLM OpenMP threads bound to cores {b['omp_cores']}, cores kept for its scheduler "
                     f"{b['reserved_cores']}; settings {({k: v for k, v in p['env'].items() if v is not None})}")
    if "first_step" in p:
        f = p["first_step"]
        lines.append(f"    first-step loss (on-policy rows): ours {f['ours']:.6f}, mlx-lm-lora {f['theirs']:.6f} "
                     f"(|diff| {f['abs_diff']:.1e}, grad norms within {f['grad_norm_max_rel_diff']:.1e})"
                     + ("" if f["agree"] else "  DISAGREE"))
        lines.append(f"    mlx-lm-lora on {p['mlx_device']} with BLAS {p['blas'] or 'bundled with MLX'}")
    return lines


def peer_problems(r: dict) -> list[str]:
    """What makes a peer's figures not comparable: greedy tokens or first steps that differ."""
    out = []
    for name, p in r.get("peers", {}).items():
        g = p.get("greedy_agreement", {})
        if any(m["equal"] != m["rows"] for m in g.values()):
            out.append(f"{name}: greedy tokens differ from the engine's on some rows")
        if "first_step" in p and not p["first_step"]["agree"]:
            out.append(f"{name}: its first step's loss or gradient norms differ from ours")
    return out


def main(args) -> None:
    pythons = {"vllm": getattr(args, "vllm_python", None), "mlx_lm_lora": getattr(args, "mlx_lm_lora_python", None)}
    if getattr(args, "workload", None) in UPDATE_WORKLOADS:
        r = run_update_workload(args.workload, shape=args.shape, quick=args.quick,
                                torch_device=getattr(args, "torch_device", "auto"),
                                torch_threads=getattr(args, "torch_threads", None))
        print(json.dumps(r) if args.json else format_update_workload(r))
        if not r["update_loss"]["agree"]:
            sys.exit("bench peers: the torch and MLX updates disagree; the figures are not comparable")
        return
    if getattr(args, "workload", "single") == "multiturn":
        r = run_multiturn(shape=args.shape, quick=args.quick, torch_device=getattr(args, "torch_device", "auto"),
                          pythons=pythons)
        print(json.dumps(r) if args.json else format_multiturn(r))
        if problems := multiturn_problems(r):
            sys.exit("bench peers: " + "; ".join(problems) + "; those figures are not comparable")
        return
    r = run(shape=args.shape, quick=args.quick, torch_device=getattr(args, "torch_device", "auto"), pythons=pythons,
            peers_only=getattr(args, "peers_only", False))
    print(json.dumps(r) if args.json else format_table(r))
    if not r.get("peers_only") and (not r["update_loss"]["agree"] or r["torch_imported_autocurricula"]):
        sys.exit("bench peers: the torch and MLX updates disagree, or a torch worker imported autocurricula; "
                 "the figures are not comparable")
    if problems := peer_problems(r):
        sys.exit("bench peers: " + "; ".join(problems) + "; those figures are not comparable")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        peers_torch.serve(sys.argv[2], sys.argv[3], MLX_SETUPS)
    else:
        sys.exit("usage: autocurricula bench peers [--shape bench|qwen0.5b] [--torch-device auto|cpu|cuda|mps] "
                 "[--workload single|multiturn|tictactoe|negotiation] [--vllm-python PYTHON] [--mlx-lm-lora-python PYTHON] [--peers-only] "
                 "[--json] [--quick]")
