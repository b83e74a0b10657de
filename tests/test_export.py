"""peft / mlx-lm export and import: numeric parity with transformers + peft, exact round trips."""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import autocurricula  # noqa: F401
from autocurricula.engine import AdapterError, AdapterWeights, Engine, EngineConfig, LoraSpec
from autocurricula.publish.export import export_mlx, export_peft, import_peft

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

IDS = [5, 77, 301, 12, 900, 44, 3, 250, 18, 640, 7, 99]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_base(tiny_model_path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32).eval()


def torch_logits(model):
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float().numpy()


@pytest.mark.parametrize("name,spec", [
    ("qv", LoraSpec(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])),
    ("all-linear", LoraSpec(r=4, lora_alpha=32, target_modules="all-linear")),
    ("rank16-rslora", LoraSpec(r=16, lora_alpha=8, target_modules=["k_proj", "o_proj", "up_proj"], use_rslora=True)),
])
def test_peft_logits_match_mlx(engine, hf_base, tiny_model_path, tmp_path, name, spec):
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    # b_std 0.05 moves the logits by up to ~10 (a wrong mapping shows as O(1) errors); much larger
    # perturbations amplify float32 rounding past 1e-4 through the 4 layers
    w = AdapterWeights.random(dims, spec, seed=3, b_std=0.05)
    folder = export_peft(w, tmp_path / name, str(tiny_model_path), use_rslora=spec.use_rslora, num_model_layers=4)
    engine.load_adapter(name, w)
    mlx_logits = engine.logits(IDS, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = peft.PeftModel.from_pretrained(hf_base, str(folder))
    relevant = [str(c.message) for c in caught if "peft" in str(c.filename) or "key" in str(c.message).lower()]
    assert not relevant, relevant
    try:
        diff = np.abs(torch_logits(model) - mlx_logits).max()
    finally:
        model.unload()  # give the shared base model back without LoRA layers
    assert diff <= 1e-4, diff
    assert np.abs(mlx_logits - engine.logits(IDS)).max() > 1.0  # the adapter really changes the logits


def test_exported_mlx_adapter_loads_in_mlx_lm(engine, tiny_model_path, tmp_path):
    spec = LoraSpec(r=8, lora_alpha=16)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    folder = export_mlx(AdapterWeights.random(dims, spec, seed=1), tmp_path / "mlx", num_model_layers=4)
    out = subprocess.run([sys.executable, "-m", "mlx_lm", "generate", "--model", str(tiny_model_path),
                          "--adapter-path", str(folder), "--prompt", "hello", "--max-tokens", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert import_peft(folder).rank == 8  # and it reads back


def test_export_mlx_finds_the_block_count_itself(engine, tiny_model_path, tmp_path):
    from autocurricula.publish.export import model_num_layers

    assert model_num_layers(tiny_model_path) == model_num_layers(engine.linear_dims) == 4
    spec = LoraSpec(r=4, lora_alpha=8)
    all_blocks = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    a = export_mlx(AdapterWeights.random(all_blocks, spec, seed=1), tmp_path / "all")  # covers the last block
    assert json.loads((a / "adapter_config.json").read_text())["num_layers"] == 4
    tail = {p: d for p, d in all_blocks.items() if ".layers.2." in p or ".layers.3." in p}
    b = export_mlx(AdapterWeights.random(tail, spec, seed=1), tmp_path / "tail", base_model=tiny_model_path)
    assert json.loads((b / "adapter_config.json").read_text())["num_layers"] == 2
    head = {p: d for p, d in all_blocks.items() if ".layers.0." in p or ".layers.1." in p}
    # blocks 0-1 of 4: mlx-lm's tail runs from block 0, blocks 2-3 get LoRA layers without tensors (zero lora_b)
    c = export_mlx(AdapterWeights.random(head, spec, seed=1), tmp_path / "head", base_model=tiny_model_path)
    assert json.loads((c / "adapter_config.json").read_text())["num_layers"] == 4


def test_peft_to_player_to_peft_round_trip_is_exact(hf_base, tiny_model_path, tmp_path):
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                          task_type="CAUSAL_LM")
    torch.manual_seed(0)
    made = peft.get_peft_model(hf_base, cfg)
    made.save_pretrained(str(tmp_path / "src"))
    made.unload()
    w = import_peft(tmp_path / "src")
    export_peft(w, tmp_path / "dst", str(tiny_model_path), num_model_layers=4)
    from safetensors.numpy import load_file

    a, b = load_file(str(tmp_path / "src" / "adapter_model.safetensors")), load_file(str(tmp_path / "dst" / "adapter_model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    ca, cb = (json.loads((tmp_path / d / "adapter_config.json").read_text()) for d in ("src", "dst"))
    assert (ca["r"], ca["lora_alpha"], sorted(ca["target_modules"])) == (cb["r"], cb["lora_alpha"], cb["target_modules"])


@pytest.mark.parametrize("kwargs,message", [
    (dict(use_dora=True), "DoRA"),
    (dict(target_modules=["embed_tokens"]), "lora_embedding"),
])
def test_rejected_imports_name_what_is_unsupported(hf_base, tmp_path, kwargs, message):
    cfg = peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM", **kwargs})
    made = peft.get_peft_model(hf_base, cfg)
    made.save_pretrained(str(tmp_path / "bad"))
    made.unload()
    with pytest.raises(AdapterError, match=message):
        import_peft(tmp_path / "bad")


def test_partial_layer_coverage_uses_full_paths(engine, tmp_path, tiny_model_path):
    w = AdapterWeights.random({"model.layers.3.self_attn.q_proj": (256, 256)}, LoraSpec(r=2), seed=0)
    for folder in (export_peft(w, tmp_path / "part", str(tiny_model_path), num_model_layers=4),
                   export_peft(w, tmp_path / "read", str(tiny_model_path))):  # block count from config.json
        cfg = json.loads((folder / "adapter_config.json").read_text())
        assert cfg["target_modules"] == ["model.layers.3.self_attn.q_proj"]
    assert cfg["lora_alpha"] == pytest.approx(w.scale * 2)


def test_trainer_export_writes_what_peft_and_mlx_lm_load(tiny_model_path, hf_base, tmp_path):
    from toy_games import digits

    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 4},
                                       output_dir=str(tmp_path / "run"), progress=False, ratings={"bt_bootstrap": 0},
                                       max_tokens=2))
    t.train(str(tiny_model_path), digits, lora_config=LoraSpec(r=4, lora_alpha=8, target_modules="all-linear"))
    pid = t.players[0]["id"]
    folder = t.export(pid, tmp_path / "peft")
    model = peft.PeftModel.from_pretrained(hf_base, str(folder))
    try:
        assert np.abs(torch_logits(model) - t.engine.logits(IDS, pid)).max() <= 1e-4
    finally:
        model.unload()
    mlx_folder = t.export(pid, tmp_path / "mlx", format="mlx")
    assert json.loads((mlx_folder / "adapter_config.json").read_text())["num_layers"] == 4
    with pytest.raises(ValueError, match="'peft' or 'mlx'"):
        t.export(pid, tmp_path / "x", format="gguf")
    t.engine.close()


@pytest.mark.parametrize("family,hf_block", [("gpt2", "transformer.h."), ("gpt_neox", "gpt_neox.layers.")])
def test_gpt2_and_neox_export_under_transformers_names_and_import_back(tmp_path_factory, tmp_path, family, hf_block):
    """mlx-lm names these blocks ``model.h.N``; the peft keys carry transformers' names, PeftModel
    gives the engine's logits, ``import_peft`` and ``engine.load_adapter(name, folder)`` map the
    names back, and mlx-lm's adapter folder counts the ``h.N`` blocks."""
    from safetensors.numpy import load_file

    from autocurricula.engine.module_names import hf_module_path, mlx_module_path
    from autocurricula.publish.export import model_num_layers
    from autocurricula.engine.tiny import build_family_model

    base = build_family_model(tmp_path_factory.mktemp("families") / family, family)
    eng = Engine(str(base), config=EngineConfig(max_slots=2))
    try:
        spec = LoraSpec(r=4, lora_alpha=8, target_modules="all-linear")
        dims = {p: eng.linear_dims[p] for p in spec.resolve(eng.linear_dims)}
        w = AdapterWeights.random(dims, spec, seed=1, b_std=0.05)
        assert model_num_layers(eng.linear_dims) == model_num_layers(base) == 2
        folder = export_peft(w, tmp_path / "peft", str(base))
        keys = load_file(str(folder / "adapter_model.safetensors"))
        assert keys and all(k.startswith("base_model.model." + hf_block) for k in keys)
        cfg = json.loads((folder / "adapter_config.json").read_text())
        # short names where they are unique in a block, else full paths (GPT-2 has attn.c_proj and mlp.c_proj)
        assert all("." not in t or t.startswith(hf_block) for t in cfg["target_modules"])
        back = import_peft(folder)
        assert sorted(back.modules) == sorted(w.modules)
        for p, (a, b) in w.modules.items():
            assert np.array_equal(back.modules[p][0], a) and np.array_equal(back.modules[p][1], b)
            assert mlx_module_path(hf_module_path(p, family), family) == p
        mlx = export_mlx(w, tmp_path / "mlx", base_model=base)
        assert json.loads((mlx / "adapter_config.json").read_text())["num_layers"] == 2
        eng.load_adapter("p", w)
        eng.load_adapter("from-folder", folder)
        ids = [i % 512 for i in IDS]  # the family models' vocabulary is 512
        ours = eng.logits(ids, "p")
        assert np.abs(ours - eng.logits(ids)).max() > 1e-3  # the adapter moves the logits
        assert np.array_equal(eng.logits(ids, "from-folder"), ours)
        model = peft.PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval(), str(folder))
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0].float().numpy()
        assert np.abs(theirs - ours).max() < 1e-4
    finally:
        eng.close()


