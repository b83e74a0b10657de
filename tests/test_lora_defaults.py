"""Per-family LoRA defaults and exports that work wherever training works (issue 66, items 3 and 4).

Models are tiny random ones that transformers builds from its own config classes and writes with
``save_pretrained``; peft and mlx-lm load the exported adapters, and their logits are compared with
the engine's.
"""

import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import autocurricula  # noqa: F401  (BLAS before mlx)
from autocurricula.engine import AdapterError, AdapterWeights, Engine, EngineConfig, LoraSpec
from autocurricula.engine.adapters import write_mlx_folder
from autocurricula.engine.module_names import (LORA_TARGETS, PEFT_EXPERT_NAMES, PEFT_MOE_CONVERSION, default_lora_targets,
                                              peft_conflicts)
from autocurricula.publish.export import export_mlx, export_peft
from autocurricula.training.config import coerce_lora_spec

sys.path.insert(0, str(Path(__file__).parent))  # toy_games

IDS = [5, 77, 301, 12, 90, 44, 3, 250, 18, 64, 7, 99]


# ------------------------------------------------------------------ the defaults, without a model

def blocks(n, *names):
    return {f"model.layers.{i}.{m}": (64, 64) for i in range(n) for m in names}


GPT2 = {f"model.h.{i}.{m}": (64, 64) for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
NEOX = {**{f"model.h.{i}.{m}": (64, 64) for i in range(2) for m in ("attention.query_key_value", "attention.dense",
                                                                     "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")},
        "model.embed_out": (64, 512)}
PHI3 = {**blocks(2, "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"), "lm_head": (64, 512)}


def test_no_target_modules_means_the_family_default():
    assert LoraSpec().target_modules is None
    assert coerce_lora_spec(None).target_modules is None
    assert coerce_lora_spec({"r": 4, "lora_alpha": 8}).target_modules is None
    assert LoraSpec().resolve(GPT2, model_type="gpt2") == ["model.h.0.attn.c_attn", "model.h.1.attn.c_attn"]
    assert LoraSpec().resolve(NEOX, model_type="gpt_neox") == [f"model.h.{i}.attention.query_key_value" for i in (0, 1)]
    assert LoraSpec().resolve(PHI3, model_type="phi3") == [f"model.layers.{i}.self_attn.qkv_proj" for i in (0, 1)]
    llama = blocks(2, "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj")
    assert LoraSpec().resolve(llama, model_type="llama") == [p for p in llama if p.endswith(("q_proj", "v_proj"))]
    # a hybrid: every linear, as the family's recipes do
    lfm2 = blocks(2, "conv.in_proj", "self_attn.q_proj", "feed_forward.w1")
    assert LoraSpec().resolve(lfm2, model_type="lfm2") == list(lfm2)


def test_explicit_targets_win_over_the_family_default():
    assert LoraSpec(target_modules=["c_fc"]).resolve(GPT2, model_type="gpt2") == ["model.h.0.mlp.c_fc", "model.h.1.mlp.c_fc"]
    assert LoraSpec(target_modules="all-linear").resolve(PHI3, model_type="phi3") == [p for p in PHI3 if p != "lm_head"]
    peft = pytest.importorskip("peft")
    spec = coerce_lora_spec(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["dense"]))
    assert spec.resolve(NEOX, model_type="gpt_neox") == ["model.h.0.attention.dense", "model.h.1.attention.dense"]
    assert coerce_lora_spec(peft.LoraConfig(r=4, lora_alpha=8)).target_modules is None  # peft's own "family default"


def test_unknown_family_falls_back_to_its_attention_and_refuses_by_name_when_none():
    mla = blocks(2, "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.o_proj",
                 "mlp.down_proj")
    assert default_lora_targets("deepseek_v3", mla) == ["kv_a_proj_with_mqa", "o_proj", "q_a_proj", "q_b_proj"]
    assert default_lora_targets("olmo2", blocks(1, "self_attn.q_proj", "self_attn.v_proj")) == ["q_proj", "v_proj"]
    with pytest.raises(AdapterError, match=r"family's default target_modules \[\] match no linear layer of the model of "
                                           r"mystery.*'w_in'.*all-linear"):
        LoraSpec().resolve(blocks(1, "mixer.w_in"), model_type="mystery")


def test_defaults_are_peft_s_where_peft_has_the_family():
    constants = pytest.importorskip("peft.utils.constants")
    theirs = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    shared = set(LORA_TARGETS) & set(theirs)
    assert {"gpt2", "gpt_neox", "llama", "opt", "qwen2"} <= shared
    assert {t: LORA_TARGETS[t] for t in shared} == {t: theirs[t] for t in shared}
    assert not {"phi3", "lfm2", "qwen3_5_text"} & set(theirs)  # ours: peft's table lacks these


def test_peft_moe_table_mirrors_installed_peft():
    """The families whose expert names peft re-reads, as peft and transformers installed decide them."""
    pytest.importorskip("torch")
    conv = pytest.importorskip("peft.utils.transformers_weight_conversion")
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    theirs = {t: p for t, p in conv._MODEL_TO_CONVERSION_PATTERN.items()
              if p in conv._MOE_TARGET_MODULE_MAPPING and t[0].islower() and get_checkpoint_conversion_mapping(t)}
    assert theirs == PEFT_MOE_CONVERSION
    for pattern, names in PEFT_EXPERT_NAMES.items():
        mapping = conv._MOE_TARGET_MODULE_MAPPING[pattern]
        assert set(names) == set(mapping) - {"gate"} and mapping["gate"] == "gate.weight"


QWEN2_MOE = blocks(2, "self_attn.q_proj", "self_attn.v_proj", "mlp.gate", "mlp.shared_expert.down_proj",
                   "mlp.shared_expert_gate")
DEEPSEEK = {**blocks(1, "self_attn.q_a_proj", "mlp.down_proj", "mlp.gate_proj"),
            "model.layers.1.self_attn.q_a_proj": (64, 64), "model.layers.1.mlp.shared_experts.down_proj": (64, 64)}


def test_what_peft_cannot_place_is_refused_at_resolve_by_name_with_the_fix():
    with pytest.raises(AdapterError, match=r"model\.layers\.0\.mlp\.gate.*MoE router.*target_modules=\['q_proj'\]"):
        LoraSpec(target_modules=["q_proj", "gate"]).resolve(QWEN2_MOE, model_type="qwen2_moe")
    with pytest.raises(AdapterError, match=r"mlp\.shared_experts\.down_proj.*routed experts' fused down_proj"):
        LoraSpec(target_modules=["q_a_proj", "down_proj"]).resolve(DEEPSEEK, model_type="deepseek_v3")
    # "all-linear" leaves them out; names that merely end the same way stay (shared_expert_gate is a Linear)
    assert "model.layers.0.mlp.shared_expert_gate" in LoraSpec(target_modules="all-linear").resolve(QWEN2_MOE,
                                                                                                     model_type="qwen2_moe")
    assert not peft_conflicts(LoraSpec(target_modules="all-linear").resolve(QWEN2_MOE, model_type="qwen2_moe"), "qwen2_moe")
    assert LoraSpec(target_modules="all-linear").resolve(DEEPSEEK, model_type="deepseek_v3") == \
        ["model.layers.0.self_attn.q_a_proj", "model.layers.1.self_attn.q_a_proj"]
    # without the family, nothing is known to conflict (e.g. a Llama's gate_proj is a plain Linear)
    assert peft_conflicts(DEEPSEEK, "llama") == {}
    assert len(LoraSpec(target_modules=["down_proj"]).resolve(DEEPSEEK)) == 2


def test_export_peft_refuses_what_peft_would_misplace(tmp_path):
    spec = LoraSpec(r=2, lora_alpha=4)
    w = AdapterWeights.random({"model.layers.0.mlp.gate": (64, 4), "model.layers.0.self_attn.q_proj": (64, 64)}, spec)
    with pytest.raises(AdapterError, match=r"model\.layers\.0\.mlp\.gate.*format='mlx'"):
        export_peft(w, tmp_path / "x", "base", model_type="qwen2_moe")
    assert not (tmp_path / "x").exists()


def test_mlx_folder_spans_from_the_first_adapted_block_and_names_outside_modules_in_full(tmp_path):
    spec = LoraSpec(r=2, lora_alpha=4)
    w = AdapterWeights.random({"model.layers.1.self_attn.q_proj": (64, 64), "model.layers.3.self_attn.q_proj": (64, 64),
                               "model.layers.3.mlp.w1": (64, 64), "model.decoder.project_out": (64, 32)}, spec)
    cfg = json.loads((write_mlx_folder(w, tmp_path / "a", 4) / "adapter_config.json").read_text())
    assert cfg["num_layers"] == 3
    assert cfg["lora_parameters"]["keys"] == ["mlp.w1", "model.decoder.project_out", "self_attn.q_proj"]
    with pytest.raises(AdapterError, match="block 3, but the model has 2 blocks"):
        write_mlx_folder(w, tmp_path / "b", 2)


# ------------------------------------------------------------------ real models

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def save_model(config, out: Path) -> Path:
    """``AutoModelForCausalLM.from_config(config)`` with fan-in random weights, written by
    ``save_pretrained``, with the tiny models' tokenizer (vocabulary 512)."""
    from autocurricula.engine.tiny import _write_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    _write_tokenizer(out, 512, 512)
    saved = json.loads((out / "config.json").read_text())
    rope = saved.get("rope_parameters") or {}
    for key in ("rope_theta", "partial_rotary_factor"):  # where mlx-lm reads them (transformers 5 nests them)
        if key in rope and key not in saved:
            saved[key] = rope[key]
    if saved["model_type"] == "lfm2":
        saved["block_dim"] = saved["hidden_size"]
    (out / "config.json").write_text(json.dumps(saved, indent=1))
    return out


SMALL = dict(vocab_size=512, max_position_embeddings=512, eos_token_id=2, pad_token_id=0, bos_token_id=None,
             hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "stablelm": dict(num_key_value_heads=2, intermediate_size=128),
    "opt350": dict(model_type="opt", ffn_dim=128, word_embed_proj_dim=32, do_layer_norm_before=False),
    "qwen2_moe": dict(num_key_value_heads=2, intermediate_size=128, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1),
    # attention in blocks 1 and 3 of 4: adapters on the attention alone leave gaps between blocks
    "lfm2": dict(num_hidden_layers=4, num_key_value_heads=2, intermediate_size=128,
                 layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "qwen3_5_text": dict(num_hidden_layers=4, num_key_value_heads=2, intermediate_size=128, head_dim=16,
                         full_attention_interval=2,
                         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-models")
    built = {}

    def get(name):
        if name not in built:
            if name in CONFIGS:
                extra = dict(CONFIGS[name])
                model_type = extra.pop("model_type", name)
                built[name] = save_model(transformers.AutoConfig.for_model(model_type, **{**SMALL, **extra}), root / name)
            else:
                from autocurricula.engine.tiny import build_family_model

                built[name] = build_family_model(root / name, name)
        return built[name]

    return get


def hf_logits(base, folder=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    if folder is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = peft.PeftModel.from_pretrained(model, str(folder))
        said = [str(c.message) for c in caught if "peft" in str(c.filename)]
        assert not said, said  # e.g. GPT-2's Conv1D without fan_in_fan_out
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float().numpy()


def mlx_lm_logits(base, folder):
    import mlx.core as mx
    from mlx_lm import load

    from autocurricula.engine.models import register

    register()
    model, _ = load(str(base), adapter_path=str(folder))
    return np.array(model(mx.array([IDS]))[0].astype(mx.float32))


def random_adapter(engine, spec, model_type=None, seed=1):
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims, model_type=model_type)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=0.05)


def one_round(base, lora_config=None):
    """The README's default trainer (LeagueTrainer) for one round of a short game, no lora_config."""
    from toy_games import digits

    from autocurricula import LeagueConfig, LeagueTrainer

    trainer = LeagueTrainer(LeagueConfig(epochs=1, rounds=1, matches=4, max_tokens=2, progress=False,
                                         output_dir=tempfile.mkdtemp(prefix="lora-defaults-"),
                                         ratings={"bt_bootstrap": 0}))
    trainer.train(str(base), digits, lora_config=lora_config)
    return trainer


@pytest.mark.parametrize("family,target", [("gpt2", "attn.c_attn"), ("gpt_neox", "attention.query_key_value"),
                                           ("phi3", "self_attn.qkv_proj")])
def test_readme_default_trains_gpt2_neox_phi3_and_exports_to_peft(models, tmp_path, family, target):
    base = models(family)
    trainer = one_round(base)  # no lora_config: the family's default targets
    engine = trainer.engine
    try:
        learners = [p for p in trainer.players if not p.frozen]
        weights = engine.adapter_weights(learners[0].id)
        assert sorted(weights.modules) and all(p.endswith("." + target) for p in weights.modules)
        assert len(weights.modules) == 2  # one per block
        assert trainer.run.updater.steps >= 1
        moved = [p.id for p in learners if any(np.abs(b).max() > 0 for _, b in engine.adapter_weights(p.id).modules.values())]
        assert moved, "the update left every learner's lora_B at zero"
        ids = IDS
        # the trained player's peft export, and a random one over the same modules that moves the logits
        assert np.abs(hf_logits(base, trainer.export(moved[0], tmp_path / "trained")) - engine.logits(ids, moved[0])).max() < 1e-4
        w = AdapterWeights.random({p: engine.linear_dims[p] for p in weights.modules}, LoraSpec(r=8), seed=2, b_std=0.05)
        engine.load_adapter("random", w)
        ours = engine.logits(ids, "random")
        assert np.abs(ours - engine.logits(ids)).max() > 1e-2
        assert np.abs(hf_logits(base, export_peft(w, tmp_path / "random", str(base))) - ours).max() < 1e-4
        mlx = trainer.export(moved[0], tmp_path / "mlx", format="mlx")
        assert np.abs(mlx_lm_logits(base, mlx) - engine.logits(ids, moved[0])).max() < 1e-3
    finally:
        engine.close()


def test_stablelm_update_runs(models):
    """StableLM's mlx-lm body takes ``cache`` as a required argument; the update calls it without a cache."""
    trainer = one_round(models("stablelm"))
    try:
        assert trainer.run.updater.steps >= 1
        assert any(np.abs(b).max() > 0 for p in trainer.players if not p.frozen
                   for _, b in trainer.engine.adapter_weights(p.id).modules.values())
    finally:
        trainer.engine.close()


@pytest.mark.parametrize("name,targets", [("lfm2", None), ("lfm2", ["q_proj", "v_proj"]),
                                          ("qwen3_5_text", None), ("qwen3_5_text", ["q_proj", "v_proj"]),
                                          ("opt350", "all-linear")])
def test_mlx_export_loads_in_mlx_lm_for_hybrids_and_outside_modules(models, tmp_path, name, targets):
    """Attention-only adapters of a hybrid sit in blocks 1 and 3 of 4; OPT-350m's project_in and
    project_out lie outside the blocks. mlx_lm.load(adapter_path=) gives the engine's logits."""
    base = models(name)
    engine = Engine(str(base), config=EngineConfig(max_slots=2))
    try:
        w = random_adapter(engine, LoraSpec(r=4, lora_alpha=8, target_modules=targets), engine.model_type)
        if name == "opt350":
            assert {"model.decoder.project_in", "model.decoder.project_out"} <= set(w.modules)
        elif targets is not None:
            assert {int(p.split(".")[2]) for p in w.modules} == {1, 3}
        engine.load_adapter("p", w)
        ours = engine.logits(IDS, "p")
        folder = export_mlx(w, tmp_path / "mlx", base_model=base)
        theirs = mlx_lm_logits(base, folder)
        assert np.abs(theirs - engine.logits(IDS)).max() > 1e-2  # the adapter is applied
        assert np.abs(theirs - ours).max() <= 1e-3 * max(1.0, float(np.abs(theirs).max()))
        if name == "opt350":  # and peft places the outside modules too
            assert np.abs(hf_logits(base, export_peft(w, tmp_path / "peft", str(base))) - ours).max() < 1e-4
    finally:
        engine.close()


@pytest.mark.parametrize("name,refused,where", [("qwen2_moe", ["q_proj", "gate"], "mlp.gate"),
                                                ("deepseek_v3", ["q_a_proj", "down_proj"], "down_proj")])
def test_moe_targets_peft_cannot_place_are_refused_before_training_and_all_linear_exports(models, tmp_path, name,
                                                                                         refused, where):
    """Qwen2-MoE's router is no Linear in transformers 5; DeepSeek-V3's dense and shared-expert
    ``down_proj`` would become the fused routed experts in peft. Named, they are refused when the
    trainer resolves the LoRA spec (no round is played); ``all-linear`` leaves them out, and its
    peft export gives the engine's logits."""
    from mlx_lm import load
    from toy_games import digits

    from autocurricula import LeagueConfig, LeagueTrainer

    base = models(name)
    # mlx-lm's own loader: the engine's loader refuses families outside the conformance matrix (at
    # load, by name), and these rules are about the LoRA targets of a model that loads
    engine = Engine(*load(str(base)), config=EngineConfig(max_slots=8), name=str(base))
    try:
        assert engine.model_type == name
        trainer = LeagueTrainer(LeagueConfig(epochs=1, rounds=1, matches=4, max_tokens=2, progress=False,
                                             output_dir=str(tmp_path / "run"), ratings={"bt_bootstrap": 0}))
        with pytest.raises(AdapterError, match=rf"{name}.*{where}.*Leave them out"):
            trainer.train(engine, digits, lora_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=refused))
        assert trainer.step == 0 and not trainer.metrics_log and not engine.players()
        spec = LoraSpec(r=4, lora_alpha=8, target_modules="all-linear")
        everything = spec.resolve(engine.linear_dims)  # without the family: what the issue exported
        assert peft_conflicts(everything, name)
        w = random_adapter(engine, spec, name)
        assert not peft_conflicts(w.modules, name) and len(w.modules) < len(everything)
        engine.load_adapter("p", w)
        ours = engine.logits(IDS, "p")
        assert np.abs(ours - engine.logits(IDS)).max() > 1e-2
        assert np.abs(hf_logits(base, export_peft(w, tmp_path / "peft", str(base))) - ours).max() < 1e-4
        with pytest.raises(AdapterError, match=where):  # the whole set, exported anyway: refused by name
            export_peft(random_adapter(engine, LoraSpec(r=4, lora_alpha=8, target_modules="all-linear")),
                        tmp_path / "bad", str(base))
    finally:
        engine.close()
