"""``autocurricula bench peers``: every key present and finite, the torch and MLX losses agree,
torch workers never import autocurricula (its BLAS preload slows torch), and the real peers
(vLLM, mlx-lm-lora) are skipped with a reason where their virtual environments are not named."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _needs_torch():
    pytest.importorskip("torch")
    pytest.importorskip("peft")

KEYS = ("engine_vs_peft_mixed", "engine_vs_peft_set_adapter", "engine_vs_mlx_lm_reload", "update_vs_torch_peft",
        "prefix_hit_rate")


def _spec(tmp_path, players=2, turns=4):
    from autocurricula.bench.peers import build_spec, model_folder

    return build_spec(tmp_path, model_folder("tiny"), turns=turns, players=players)


def test_update_loss_matches_torch_peft(tmp_path):
    """Our fused Updater step and the torch + peft step give the same first loss and gradient norms
    on the same rows of 2 players (a different loss or different weights would not)."""
    _needs_torch()
    import numpy as np

    from autocurricula.bench import peers, peers_torch

    spec = _spec(tmp_path)
    rng = np.random.default_rng(3)
    rows = [{"prompt_ids": p, "token_ids": rng.integers(3, 500, 4).tolist(),
             "logprobs": rng.normal(-6, 0.5, 4).tolist()} for p in spec["prompts"]]
    turns = peers.training_turns(rows, spec["order"])
    (tmp_path / "turns.json").write_text(json.dumps(turns))
    _, ours = peers.setup_update(spec)
    _, theirs = peers_torch.setup_torch_peft_update(spec)
    assert math.isfinite(ours["first_loss"]) and ours["first_loss"] != 0
    assert ours["first_loss"] == pytest.approx(theirs["first_loss"], rel=1e-4, abs=1e-6)
    assert set(ours["first_grad_norms"]) == {"p0", "p1"}
    for n, v in theirs["first_grad_norms"].items():
        assert ours["first_grad_norms"][n] == pytest.approx(v, rel=1e-3)


def test_turns_keep_rows_and_perturb_logprobs():
    from autocurricula.bench.peers import training_turns

    rows = [{"prompt_ids": [5] * 20, "token_ids": [7, 8, 9, 10], "logprobs": [-1.0] * 4}] * 4
    turns = training_turns(rows, ["p0", "p1", "p0", "p1"])
    assert [t["player"] for t in turns] == ["p0", "p1", "p0", "p1"]
    assert all(t["advantage"] in (-1.0, 1.0) for t in turns)
    assert all(t["logprobs"] != [-1.0] * 4 and len(t["logprobs"]) == 4 for t in turns)


def test_summary_and_cli_choices():
    from autocurricula.bench.peers import summary
    from autocurricula.cli import build_parser

    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert summary([None, float("nan")]) == {"median": None, "min": None, "max": None}
    args = build_parser().parse_args(["bench", "peers", "--shape", "qwen0.5b", "--json", "--quick"])
    assert (args.what, args.shape, args.json, args.quick) == ("peers", "qwen0.5b", True, True)


@pytest.mark.slow
def test_quick_run_prints_every_key(tmp_path, no_peer_env):
    """The whole benchmark at the tiny shape: one round of every side, each in its own process;
    the real peers, not named, are skipped."""
    _needs_torch()
    from autocurricula.bench.peers import run

    r = run(shape="tiny", quick=True, timeout=300)
    for key in KEYS:
        assert set(r[key]) == {"median", "min", "max"}, key
        assert all(math.isfinite(v) for v in r[key].values()), (key, r[key])
    assert all(r[k]["median"] > 0 for k in KEYS if k != "prefix_hit_rate")
    for side in ("engine", "peft_mixed", "peft_set_adapter", "mlx_lm_reload", "update", "torch_peft_update"):
        assert r["tok_s"][side]["median"] > 0
    assert r["update_loss"]["agree"], r["update_loss"]
    assert r["torch_imported_autocurricula"] == []
    assert all("not named" in p["skipped"] for p in r["peers"].values())
    assert r["load"]["median"] is None or r["load"]["median"] >= 0
    from autocurricula.bench.peers import format_table

    table = format_table(r)
    assert "engine_vs_peft_mixed" in table and "vllm: skipped: not named" in table


def test_every_round_gets_new_boards(tmp_path):
    """Each run's prompts share the 12-token instruction but no whole prompt repeats across runs
    (repeated prompts would let the engine's prefix cache serve what a new round must compute)."""
    from autocurricula.bench.peers import build_spec, model_folder

    spec = build_spec(tmp_path, model_folder("tiny"), turns=8, players=2, rounds=3)
    sets = spec["round_prompts"]
    assert len(sets) == 4 and spec["prompts"] == sets[0]
    assert all(len(p) == 20 and p[:12] == sets[0][0][:12] for s in sets for p in s)
    seen = [tuple(p) for s in sets for p in s]
    assert len(set(seen)) == len(seen)


def test_workload_per_shape():
    """Both shapes run the same 64 turns over 8 players; the 0.5B shape 2 update rounds instead of 3
    (to fit about 10 minutes on 2 cores); --quick 16 turns over 4 players, one round."""
    from autocurricula.bench.peers import workload

    assert workload("bench") == {"turns": 64, "players": 8, "rounds": (3, 3)}
    assert workload("qwen0.5b") == {"turns": 64, "players": 8, "rounds": (3, 2)}
    assert workload("qwen0.5b", quick=True) == {"turns": 16, "players": 4, "rounds": (1, 1)}
    with pytest.raises(ValueError, match="choose one of"):
        workload("qwen7b")


def test_torch_worker_does_not_import_autocurricula(tmp_path):
    """A torch worker started as the benchmark starts it reports no autocurricula module loaded."""
    _needs_torch()
    from autocurricula.bench import peers

    spec = _spec(tmp_path, players=1, turns=2)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    w = peers.Worker("peft_set_adapter", path, tmp_path)
    try:
        ready = w.answer(240)
        assert ready["autocurricula_imported"] is False
        out = w.run(240)
        assert out["tokens"] == 2 * spec["new_tokens"] and out["seconds"] > 0
    finally:
        w.close()
    assert w.proc.returncode == 0


def test_prefix_hit_rate_reads_engine_stats():
    """The figure lights up once the engine counts prefix-cache hits; without them it is None."""
    from autocurricula.bench.peers import _hit_rate

    assert _hit_rate({"prefix_hit_tokens": 4}, {"prefix_hit_tokens": 14}, 20) == 0.5
    assert _hit_rate({}, {"prefix_hit_rate": 0.25}, 20) == 0.25
    assert _hit_rate({"prefill_tokens": 5}, {"prefill_tokens": 25}, 20) is None


def test_torch_device_follows_mlx():
    """--torch-device auto puts torch on the kind of device MLX runs on; a named GPU must exist."""
    from autocurricula.bench.peers_torch import resolve_device
    from autocurricula.cli import build_parser

    assert resolve_device("auto", mlx_gpu=False, cuda=True, mps=False) == "cpu"  # MLX's CPU backend
    assert resolve_device("auto", mlx_gpu=True, cuda=True, mps=False) == "cuda"
    assert resolve_device("auto", mlx_gpu=True, cuda=False, mps=True) == "mps"
    assert resolve_device("auto", mlx_gpu=True, cuda=False, mps=False) == "cpu"
    assert resolve_device("cpu", mlx_gpu=True, cuda=True, mps=False) == "cpu"
    assert resolve_device("cuda", mlx_gpu=False, cuda=True, mps=False) == "cuda"
    with pytest.raises(RuntimeError, match="no such device"):
        resolve_device("cuda", mlx_gpu=True, cuda=False, mps=False)
    with pytest.raises(ValueError, match="choose one of"):
        resolve_device("xpu", mlx_gpu=False, cuda=False, mps=False)
    assert build_parser().parse_args(["bench", "peers"]).torch_device == "auto"
    assert build_parser().parse_args(["bench", "peers", "--torch-device", "cuda"]).torch_device == "cuda"


# ---------------------------------------------------------------- the real peers (optional sides)
PEER_ENV = ("AUTOCURRICULA_VLLM_PYTHON", "AUTOCURRICULA_MLX_LM_LORA_PYTHON")


@pytest.fixture
def no_peer_env(monkeypatch):
    for k in PEER_ENV:
        monkeypatch.delenv(k, raising=False)


def test_peer_not_named_is_skipped_with_the_way_to_name_it(no_peer_env):
    from autocurricula.bench.peers import peer_python

    python, why = peer_python("vllm")
    assert python is None and "--vllm-python" in why and "AUTOCURRICULA_VLLM_PYTHON" in why
    python, why = peer_python("mlx_lm_lora")
    assert python is None and "--mlx-lm-lora-python" in why and "AUTOCURRICULA_MLX_LM_LORA_PYTHON" in why


def test_peer_that_cannot_run_is_skipped_with_why(tmp_path, monkeypatch):
    """A named python that is missing, or that cannot import the peer, is skipped with the reason
    (the flag wins over the environment variable)."""
    from autocurricula.bench import peers, peers_vllm

    python, why = peers.peer_python("vllm", str(tmp_path / "nope" / "python"))
    assert python is None and "not an executable file" in why
    monkeypatch.setattr(peers_vllm, "IMPORT", "autocurricula_no_such_module")
    monkeypatch.setenv("AUTOCURRICULA_VLLM_PYTHON", str(tmp_path / "also-missing"))
    python, why = peers.peer_python("vllm", sys.executable)
    assert python is None and "cannot import autocurricula_no_such_module" in why
    assert "ModuleNotFoundError" in why
    monkeypatch.setattr(peers_vllm, "IMPORT", "json")
    assert peers.peer_python("vllm", sys.executable) == (sys.executable, "")
    assert peers.peer_python("vllm", None, environ={"AUTOCURRICULA_VLLM_PYTHON": sys.executable}) == (sys.executable, "")


def test_run_peers_skips_every_unnamed_peer_and_prints_why(tmp_path, no_peer_env, capsys):
    """With no peer named nothing starts: each peer's entry says why, the table prints it and the
    bench's exit check finds nothing wrong."""
    from autocurricula.bench import peers

    spec = {"order": ["p0", "p1"], "player_names": ["p0", "p1"]}
    rows = [{"prompt_ids": [5] * 20, "token_ids": [7, 8, 9, 10], "logprobs": [-1.0] * 4}] * 2
    out = peers.run_peers(spec, rows, tmp_path, {}, {"vllm": 1, "mlx_lm_lora": 1}, timeout=10)
    assert set(out) == {"vllm", "mlx_lm_lora"} and all("not named" in p["skipped"] for p in out.values())
    assert "skipping the vllm side: not named" in capsys.readouterr().err
    on_policy = json.loads((tmp_path / "turns-on-policy.json").read_text())
    assert [t["logprobs"] for t in on_policy] == [[-1.0] * 4] * 2  # the sampler's own logprobs
    lines = "\n".join(line for n, p in out.items() for line in peers._format_peer(n, p))
    assert "vllm: skipped: not named" in lines and "mlx_lm_lora: skipped: not named" in lines
    assert peers.peer_problems({"peers": out}) == []


def test_peer_figures_and_checks():
    from autocurricula.bench import peers

    g = peers.greedy_agreement({"lora": [[1, 2], [3, 4]], "base": [[5, 6], [7, 8]]},
                               {"lora": [[1, 2], [3, 5]], "base": [[5, 6], [7, 8]]})
    assert g == {"lora": {"equal": 1, "rows": 2}, "base": {"equal": 2, "rows": 2}}
    assert peers.peer_problems({"peers": {"vllm": {"greedy_agreement": g}}}) == [
        "vllm: greedy tokens differ from the engine's on some rows"]
    same = {"first_loss": -1.0, "first_grad_norms": {"p0": 2.0}}
    near = {"first_loss": -1.0 + 1e-7, "first_grad_norms": {"p0": 2.0 * (1 + 1e-5)}}
    assert peers.first_step_agreement(same, near, (1e-4, 1e-3))["agree"]
    far = {"first_loss": -1.0, "first_grad_norms": {"p0": 2.2}}
    assert not peers.first_step_agreement(same, far, (1e-4, 1e-3))["agree"]
    log = ("INFO [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]\n"
           "INFO [ompmultiprocessing.py:185] \treserved_cpus=[1]\n")
    assert peers.vllm_binding(log) == {"omp_cores": [0], "reserved_cores": [1]}
    assert peers.vllm_binding("") == {"omp_cores": None, "reserved_cores": None}


def test_peer_phase_alternates_sides_with_idle_before_each_run(tmp_path, monkeypatch):
    """A B, B A, A B ...: neither side always runs first; each run is measured for load and cores."""
    from autocurricula.bench import peers

    calls = []

    class FakeWorker:
        def __init__(self, side, spec_path, log_dir, cmd=None, env=None):
            self.side, self.cmd, self.env = side, cmd, env
            self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

        def answer(self, timeout):
            return {"ready": True}

        def run(self, timeout, round=1):
            calls.append((self.side, round))
            return {"seconds": 0.1, "tokens": 4}

        def close(self):
            self.proc.kill()
            self.proc.wait()

    monkeypatch.setattr(peers, "Worker", FakeWorker)
    sleeps = []
    monkeypatch.setattr(peers.time, "sleep", sleeps.append)
    ready, runs = peers._rounds(("engine", "vllm"), tmp_path / "spec.json", tmp_path, 3, 10, gap=2.0,
                                alternate=True, commands={"vllm": ["peer-python"]})
    assert calls == [("engine", 1), ("vllm", 1), ("vllm", 2), ("engine", 2), ("engine", 3), ("vllm", 3)]
    assert sleeps == [2.0] * 6
    for r in runs["engine"] + runs["vllm"]:
        assert {"load", "cores", "threads"} <= set(r)
    if sys.platform.startswith("linux"):
        assert runs["vllm"][0]["threads"] >= 1 and runs["vllm"][0]["cores"] >= 0


def test_process_tree_usage():
    """CPU seconds and threads of a process and its children, from /proc; None off Linux."""
    from autocurricula.bench import peers_usage

    line = "123 (a (b) c) S 7 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 5 0 1 1 1"
    assert peers_usage.parse_stat(line) == {"ppid": 7, "cpu_s": 300 / peers_usage._TICK, "threads": 5}
    assert peers_usage.cores_used({"cpu_s": 1.0}, {"cpu_s": 2.5}, 1.5) == 1.0
    assert peers_usage.cores_used(None, {"cpu_s": 1.0}, 1.0) is None
    assert peers_usage.tree_usage(os.getpid(), Path("/nonexistent-proc")) is None
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        u = peers_usage.tree_usage(os.getpid())
        assert u["processes"] >= 2 and u["threads"] >= 2 and u["cpu_s"] > 0
    finally:
        child.kill()
        child.wait()
    assert peers_usage.load_now() is None or peers_usage.load_now() >= 0


def test_cli_names_peer_pythons():
    from autocurricula.cli import build_parser

    args = build_parser().parse_args(["bench", "peers", "--vllm-python", "/v/bin/python",
                                      "--mlx-lm-lora-python", "/m/bin/python"])
    assert (args.vllm_python, args.mlx_lm_lora_python) == ("/v/bin/python", "/m/bin/python")
    assert args.peers_only is False
    args = build_parser().parse_args(["bench", "peers", "--peers-only"])
    assert (args.vllm_python, args.mlx_lm_lora_python, args.peers_only) == (None, None, True)


def test_peers_only_runs_no_side_of_ours_but_the_engine_warm_up(tmp_path, no_peer_env, monkeypatch):
    """--peers-only starts one engine worker (its warm-up turns are the peers' rows) and no other
    side; with no peer named the table says both were skipped."""
    from autocurricula.bench import peers

    started = []

    def fake_rounds(sides, spec_path, log_dir, reps, timeout, **kw):
        started.append((tuple(sides), reps))
        spec = json.loads(Path(spec_path).read_text())
        rows = [{"prompt_ids": p, "token_ids": [7, 8, 9, 10], "logprobs": [-1.0] * 4} for p in spec["prompts"]]
        return {"engine": {"rows": rows}}, {}

    monkeypatch.setattr(peers, "_rounds", fake_rounds)
    r = peers.run(shape="tiny", quick=True, peers_only=True)
    assert started == [(("engine",), 0)]
    assert r["peers_only"] and "engine_vs_peft_mixed" not in r
    table = peers.format_table(r)
    assert "real peers only" in table and "vllm: skipped: not named" in table


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vllm", "mlx_lm_lora"])
def test_real_peer_agrees_with_ours(tmp_path, name):
    """With the peer's virtual environment named (``AUTOCURRICULA_VLLM_PYTHON`` /
    ``AUTOCURRICULA_MLX_LM_LORA_PYTHON``), its phase runs on 8 turns of the bench model (vLLM's CPU
    attention has no kernel for the tiny shape's head size of 16): vLLM's greedy tokens equal the
    engine's, mlx-lm-lora's first step equals ours. Skipped where it is not installed."""
    from autocurricula.bench import peers

    python, why = peers.peer_python(name)
    if python is None:
        pytest.skip(f"{name}: {why}")
    spec = peers.build_spec(tmp_path, peers.model_folder("bench"), turns=8, players=2, rounds=1)
    _, info = peers.setup_engine(spec)
    out = peers.run_peers(spec, info["rows"], tmp_path, {name: python}, {"vllm": 1, "mlx_lm_lora": 1},
                          timeout=600, gap=0.5, names=(name,))
    p = out[name]
    assert p[peers.PEERS[name]["figure"]]["median"] > 0
    if name == "vllm":
        assert all(m["equal"] == m["rows"] == 8 for m in p["greedy_agreement"].values()), p["greedy_agreement"]
    else:
        assert p["first_step"]["agree"], p["first_step"]


# ---------------------------------------------------------------- the multi-turn workload
def _multiturn_spec(tmp_path, rounds=1, **kw):
    from autocurricula.bench import peers

    shape = {**peers.MULTITURN["tiny"], **kw}
    return peers.build_multiturn_spec(tmp_path, peers.model_folder("tiny"), players=4, rounds=rounds, **shape)


def test_multiturn_prompts_extend_the_previous_turn_in_dependency_order():
    """Turn k's prompt is turn k-1's prompt, that turn's completion and a new message; the seats
    alternate; turn k of every conversation is asked only after turn k-1 of all of them."""
    from autocurricula.bench.peers_multiturn import agreement, hit_rates, longest, play

    convs = [{"players": ["a", "b"], "opening": [1, 2], "messages": [[3], [4]]},
             {"players": ["c", "a"], "opening": [5, 6], "messages": [[7], [8]]}]
    calls = []

    def generate(prompts, players):
        calls.append(([list(p) for p in prompts], players))
        return [[100 + len(calls), 200 + i] for i in range(len(prompts))], len(calls)

    r = play(convs, generate)
    assert [c[1] for c in calls] == [["a", "c"], ["b", "a"], ["a", "c"]]
    assert calls[0][0] == [[1, 2], [5, 6]]
    assert calls[1][0] == [[1, 2, 101, 200, 3], [5, 6, 101, 201, 7]]
    assert calls[2][0] == [[1, 2, 101, 200, 3, 102, 200, 4], [5, 6, 101, 201, 7, 102, 201, 8]]
    assert r["tokens"] == 12 and r["completions"][1] == [[101, 201], [102, 201], [103, 201]]
    assert [x["prompt_tokens"] for x in r["levels"]] == [4, 10, 16]
    assert longest(convs, 2) == 2 + 2 + 3 * 2
    assert hit_rates(r["levels"]) == {"all": 6 / 30, "first": 1 / 4, "later": 5 / 26}
    assert hit_rates([{"prompt_tokens": 4, "hit_tokens": None}])["all"] is None
    other = [[c[0], [0]] + c[2:] for c in r["completions"]]
    other[0][0] = [9]
    assert agreement(r["completions"], other) == {"equal": 3, "rows": 6, "first_equal": 1, "first_rows": 2}


def test_multiturn_spec_is_seeded_and_new_every_round(tmp_path):
    from autocurricula.bench import peers

    spec = _multiturn_spec(tmp_path / "a", rounds=2)
    again = _multiturn_spec(tmp_path / "b", rounds=2)
    assert spec["conversations"] == again["conversations"] and spec["workload"] == "multiturn"
    runs = spec["conversations"]
    assert len(runs) == 3 and all(len(r) == 4 for r in runs)
    openings = [tuple(c["opening"]) for r in runs for c in r]
    assert len(set(openings)) == len(openings) and len({o[:16] for o in openings}) == 1  # shared instruction
    assert all(len(c["messages"]) == 2 and len(c["messages"][0]) == 4 for r in runs for c in r)
    assert spec["max_len"] == 24 + 2 * 4 + 3 * 8
    assert peers.seat_pairs(4, ["p0", "p1"]) == [["p0", "p1"], ["p1", "p0"], ["p0", "p0"], ["p1", "p1"]]
    assert peers.seat_pairs(3, ["p0", "p1", "p2", "p3"]) == [["p0", "p1"], ["p1", "p2"], ["p2", "p3"]]


def test_multiturn_engine_reuses_earlier_turns_and_gives_the_uncached_tokens(tmp_path):
    """On the engine side the prompts grow, turns 2 and later are partly served from the prefix
    cache, and the greedy completions equal those of a fresh engine without a prefix cache."""
    from autocurricula.bench import peers
    from autocurricula.bench.peers_multiturn import agreement, hit_rates

    spec = _multiturn_spec(tmp_path)
    run, _ = peers.setup_engine(spec)
    r = run(1)
    lengths = [x["prompt_tokens"] for x in r["levels"]]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert r["tokens"] == 4 * 3 * 8
    assert hit_rates(r["levels"])["later"] > 0
    cold, _ = peers.setup_engine(dict(spec, prefix_cache_mb=0))
    c = cold(1)
    assert hit_rates(c["levels"])["all"] == 0
    a = agreement(r["completions"], c["completions"])
    assert a["equal"] == a["rows"] == 12, a


def test_multiturn_peft_mixed_agrees_with_the_engine(tmp_path):
    """peft's mixed-adapter greedy generate on the same conversations gives the engine's tokens
    and counts no prefix hits."""
    _needs_torch()
    from autocurricula.bench import peers, peers_torch
    from autocurricula.bench.peers_multiturn import agreement

    spec = _multiturn_spec(tmp_path)
    ours, _ = peers.setup_engine(spec)
    theirs, info = peers_torch.setup_peft_mixed(spec)
    a, b = ours(1), theirs(1)
    assert info["torch_device"] == "cpu" and b["tokens"] == a["tokens"]
    assert all(x["hit_tokens"] is None for x in b["levels"])
    assert agreement(a["completions"], b["completions"])["first_equal"] == 4


def test_multiturn_run_reports_each_side(tmp_path, no_peer_env, monkeypatch):
    """The parent's figures from the sides' runs: seconds, tokens, hit rates, paired ratios,
    greedy agreement; a side without a prefix cache shows n/a; vLLM not named is skipped."""
    from autocurricula.bench import peers

    def fake_rounds(sides, spec_path, log_dir, reps, timeout, **kw):
        assert kw["alternate"] and tuple(sides) == ("engine", "peft_mixed")
        spec = json.loads(Path(spec_path).read_text())
        assert spec["workload"] == "multiturn" and spec["prefix_cache_mb"] == 1024
        comp = [[[7] * 8] * 3] * 4
        levels = {"engine": [{"prompt_tokens": 96, "hit_tokens": 64}, {"prompt_tokens": 144, "hit_tokens": 72}],
                  "peft_mixed": [{"prompt_tokens": 96, "hit_tokens": None}, {"prompt_tokens": 144, "hit_tokens": None}]}
        runs = {s: [{"seconds": sec, "tokens": 96, "levels": levels[s], "completions": comp, "load": 1.0, "cores": 1.0,
                     "threads": 3} for sec in (1.0, 2.0)] for s in sides}
        runs["peft_mixed"][0]["seconds"] = 4.0
        return {s: {"startup_s": 1.0} for s in sides}, runs

    monkeypatch.setattr(peers, "_rounds", fake_rounds)
    r = peers.run_multiturn("tiny", reps=2)
    assert r["ratios"]["engine_vs_peft_mixed"] == {"median": 2.5, "min": 1.0, "max": 4.0}
    assert r["prefix_hit_rate"]["engine"]["later"]["median"] == 0.5
    assert r["prefix_hit_rate"]["peft_mixed"]["all"]["median"] is None
    assert r["agreement"]["peft_mixed"] == {"equal": 24, "rows": 24, "first_equal": 8, "first_rows": 8}
    assert r["tokens_per_round"]["engine"] == {"completion": 96, "prompt": 240}
    assert peers.multiturn_problems(r) == []
    table = peers.format_multiturn(r)
    assert "engine_vs_peft_mixed" in table and "n/a" in table and "vllm: skipped: not named" in table
    r["agreement"]["peft_mixed"]["first_equal"] = 7
    assert peers.multiturn_problems(r) == ["peft_mixed: greedy tokens of first turns differ from the engine's"]


def test_cli_workload_flag():
    from autocurricula.cli import build_parser

    assert build_parser().parse_args(["bench", "peers"]).workload is None  # the bench's own default: single
    assert build_parser().parse_args(["bench", "peers", "--workload", "multiturn"]).workload == "multiturn"


@pytest.mark.slow
def test_multiturn_vllm_agrees_with_the_engine(tmp_path):
    """With ``AUTOCURRICULA_VLLM_PYTHON`` named, vLLM plays 4 conversations of 3 turns on the bench
    model: its greedy tokens equal the engine's on every turn and it reports its prefix hits."""
    from autocurricula.bench import peers

    python, why = peers.peer_python("vllm")
    if python is None:
        pytest.skip(f"vllm: {why}")
    r = peers.run_multiturn("bench", quick=True, pythons={"vllm": python}, gap=0.5, sides=("engine",))
    a = r["agreement"]["vllm"]
    assert a["equal"] == a["rows"] == 12, a
    assert r["ratios"]["engine_vs_vllm"]["median"] > 0
    assert r["prefix_hit_rate"]["vllm"]["all"]["median"] is not None
    assert r["prefix_hit_rate"]["engine"]["later"]["median"] > 0
