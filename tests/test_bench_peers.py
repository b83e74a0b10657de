"""``autocurricula bench peers``: every key present and finite, the torch and MLX losses agree,
and torch workers never import autocurricula (its BLAS preload slows torch)."""

import json
import math
import subprocess
import sys

import pytest

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
def test_quick_run_prints_every_key(tmp_path):
    """The whole benchmark at the tiny shape: one round of every side, each in its own process."""
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
