"""Adapter formats: peft / mlx-lm folders, safetensors parsing, validation errors, mlx-lm parity."""

import json

import numpy as np
import pytest
from safetensors.numpy import save

import autocurricula  # noqa: F401
from autocurricula.engine import AdapterError, AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
from helpers import write_peft
from autocurricula.engine.adapters import (check_name, from_safetensors_bytes, load_folder, read_safetensors,
                                           to_safetensors_bytes, write_mlx_folder)

DIMS = {f"model.layers.{i}.self_attn.{m}": (256, 256) for i in range(4) for m in ("q_proj", "v_proj")}



def test_peft_and_mlx_folders_load_to_the_same_weights(tmp_path):
    w = AdapterWeights.random(DIMS, LoraSpec(r=4, lora_alpha=8), seed=0)
    peft = load_folder(write_peft(tmp_path / "peft", w, alpha=8, r=4))
    mlx = load_folder(write_mlx_folder(w, tmp_path / "mlx", num_model_layers=4))
    for got in (peft, mlx):
        assert got.scale == pytest.approx(2.0) and got.rank == 4
        for p, (a, b) in w.modules.items():
            np.testing.assert_array_equal(got.modules[p][0], a)
            np.testing.assert_array_equal(got.modules[p][1], b)
    rs = load_folder(write_peft(tmp_path / "rs", w, alpha=8, r=4, use_rslora=True))
    assert rs.scale == pytest.approx(8 / 2)  # rsLoRA: alpha / sqrt(r)


@pytest.mark.parametrize("family,hf_block", [("gpt2", "transformer.h."), ("gpt_neox", "gpt_neox.layers.")])
def test_a_peft_folder_with_transformers_block_names_loads_with_mlx_names(tmp_path, family, hf_block):
    """GPT-2 / GPT-NeoX peft keys carry transformers' block names; the family comes from the
    adapter's base model's config.json, or from ``model_type=``."""
    mlx_dims = {f"model.h.{i}.attn.c_attn": (64, 192) for i in range(2)}
    w = AdapterWeights.random(mlx_dims, LoraSpec(r=4, lora_alpha=8), seed=0)
    hf = AdapterWeights({p.replace("model.h.", hf_block): ab for p, ab in w.modules.items()}, w.scale)
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": family}))
    for got in (load_folder(write_peft(tmp_path / "by-base", hf, alpha=8, r=4, base_model_name_or_path=str(base))),
                load_folder(write_peft(tmp_path / "by-arg", hf, alpha=8, r=4), model_type=family)):
        assert sorted(got.modules) == sorted(w.modules)
        for p, (a, b) in w.modules.items():
            np.testing.assert_array_equal(got.modules[p][0], a)
            np.testing.assert_array_equal(got.modules[p][1], b)
    # no family known: the names stay (other families, e.g. GPT-BigCode, use "transformer.h." in MLX too)
    assert sorted(load_folder(tmp_path / "by-arg").modules) == sorted(hf.modules)
    (base / "config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="model_type="):
        load_folder(tmp_path / "by-base")


@pytest.mark.parametrize("extra, message", [({"use_dora": True}, "DoRA"),
                                            ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                                            ({"peft_type": "IA3"}, "IA3"),
                                            ({"rank_pattern": {"q_proj": 16}}, "rank_pattern"),
                                            ({"bias": "all"}, "bias")])
def test_unsupported_peft_variants_are_named(tmp_path, extra, message):
    w = AdapterWeights.random(DIMS, LoraSpec(r=4), seed=0)
    with pytest.raises(AdapterError, match=message):
        load_folder(write_peft(tmp_path, w, alpha=8, r=4, **extra))


def test_safetensors_reader_handles_bf16_and_rejects_garbage():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    bf16 = (a.view(np.uint32) >> 16).astype(np.uint16)  # exact for small integers
    hdr = json.dumps({"x": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}).encode()
    raw = len(hdr).to_bytes(8, "little") + hdr + bf16.tobytes()  # numpy cannot write bf16 itself
    np.testing.assert_array_equal(read_safetensors(raw)["x"], a)
    np.testing.assert_array_equal(read_safetensors(save({"x": a}))["x"], a)
    for bad in (b"", b"not safetensors at all", (10**9).to_bytes(8, "little") + b"{}"):
        with pytest.raises(AdapterError, match="safetensors"):
            read_safetensors(bad)


def test_uploaded_bytes_round_trip_with_scale():
    w = AdapterWeights.random(DIMS, LoraSpec(r=8, lora_alpha=32), seed=3)
    back = from_safetensors_bytes(to_safetensors_bytes(w))
    assert back.scale == pytest.approx(4.0)
    for p in w.modules:
        np.testing.assert_array_equal(back.modules[p][0], w.modules[p][0])


def test_validation_names_the_bad_module():
    w = AdapterWeights.random({"model.layers.0.self_attn.q_proj": (256, 128)}, LoraSpec(r=4), seed=0)
    with pytest.raises(AdapterError, match="q_proj.*do not fit"):
        w.validate(DIMS)
    w = AdapterWeights.random({"model.layers.9.mlp.nope": (256, 256)}, LoraSpec(r=4), seed=0)
    with pytest.raises(AdapterError, match="not a linear layer"):
        w.validate(DIMS)


@pytest.mark.parametrize("name", ["../x", "a/b", "a\\b", "", ".hidden", "x" * 200, "a..b"])
def test_bad_names_rejected(name):
    with pytest.raises(AdapterError, match="invalid adapter name"):
        check_name(name)


def test_engine_matches_mlx_lm_with_the_same_adapter(tiny_model_path, tmp_path):
    """mlx-lm's own LoRA path (mlx_lm.load(adapter_path=...)) and our multi-LoRA engine agree."""
    import mlx.core as mx
    from mlx_lm import load

    spec = LoraSpec(r=8, lora_alpha=16)
    w = AdapterWeights.random(DIMS, spec, seed=5, b_std=0.3)
    folder = write_mlx_folder(w, tmp_path / "ad", num_model_layers=4)
    with Engine(str(tiny_model_path), config=EngineConfig(max_slots=2)) as engine:
        engine.load_adapter("p", str(folder))
        prompt = engine.encode("parity check")
        ours = engine.generate(prompt, "p", SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))

        def reference():
            model, _ = load(str(tiny_model_path), adapter_path=str(folder))
            ids = list(prompt)
            lps = []
            for _ in range(6):
                logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
                lp = logits - mx.logsumexp(logits)
                tok = int(mx.argmax(logits).item())
                lps.append(float(lp[tok].item()))
                ids.append(tok)
            return ids[len(prompt):], lps

        ref_tokens, ref_lps = engine.call(reference).result()  # MLX work stays on the engine thread
    assert ours.token_ids == ref_tokens
    np.testing.assert_allclose(ours.logprobs, ref_lps, atol=1e-4)
