"""Tiny random models built from transformers' own config classes and saved by its own
``save_pretrained`` (transformers 5 style: the rotary settings only under ``rope_parameters``),
and the same folders rewritten as transformers 4 wrote them (top-level ``rope_theta`` and
``rope_scaling``, older key names). Used by tests/test_model_configs.py and tests/test_families.py.

Nothing here patches a config for the engine: what ``save_pretrained`` writes is what the engine
reads (unlike ``autocurricula.engine.tiny.build_family_model``, which adds the older keys).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

COMMON = dict(vocab_size=512, pad_token_id=0, bos_token_id=None, eos_token_id=2)
SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=256, **COMMON)
GQA = dict(SIZES, num_key_value_heads=2)
SHORT = [1.0 + 0.1 * i for i in range(8)]  # longrope factors over 16-dim heads (8 frequencies)
LONG = [1.0 + 0.5 * i for i in range(8)]
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}

# name -> (model_type, config class arguments). Head size 16 throughout; a 48-token prompt passes
# original_max_position_embeddings=32 (longrope's switch, yarn's pretraining length) and a dynamic
# model's max_position_embeddings=32.
CASES = {
    # every rope type, on Llama
    "llama-default-theta": ("llama", {**GQA, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    "llama-linear": ("llama", {**GQA, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}}),
    "llama-dynamic": ("llama", {**GQA, "max_position_embeddings": 32,
                                "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}),
    "llama-llama3": ("llama", {**GQA, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}),
    "llama-yarn": ("llama", {**GQA, "rope_parameters": {**YARN, "rope_theta": 1e4}}),
    "llama-yarn-options": ("llama", {**GQA, "rope_parameters": {**YARN, "rope_theta": 1e4, "beta_fast": 16,
                                                                "beta_slow": 2, "truncate": False,
                                                                "attention_factor": 1.2}}),
    "llama-yarn-mscale": ("llama", {**GQA, "rope_parameters": {**YARN, "rope_theta": 1e4, "mscale": 0.9,
                                                               "mscale_all_dim": 0.7}}),
    "mistral-llama3": ("mistral", {**GQA, "sliding_window": None, "rope_parameters": {**LLAMA3, "rope_theta": 1e6}}),
    # Phi-3 longrope (Phi-3.5-mini, Phi-3-mini-128k), and with a partial rotation (Phi-4-mini)
    "phi3-longrope": ("phi3", {**GQA, "original_max_position_embeddings": 32, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 1e4, "short_factor": SHORT, "long_factor": LONG}}),
    # the same with the check-model prompts (up to 132 tokens) within its short factors: 256 of 512
    # positions, so the attention factor (factor 2) applies too
    "phi3-longrope-4k": ("phi3", {**GQA, "max_position_embeddings": 512, "original_max_position_embeddings": 256,
                                  "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                                      "short_factor": SHORT, "long_factor": LONG}}),
    "phi3-longrope-partial": ("phi3", {**GQA, "original_max_position_embeddings": 32, "partial_rotary_factor": 0.75,
                                       "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                                           "partial_rotary_factor": 0.75, "short_factor": SHORT[:6],
                                                           "long_factor": LONG[:6]}}),
    # OLMo 2's theta, and a scaled type per family whose definition serves them
    "olmo2-theta": ("olmo2", {**GQA, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    "olmo2-llama3": ("olmo2", {**GQA, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}),
    "qwen2-yarn": ("qwen2", {**GQA, "rope_parameters": {**YARN, "rope_theta": 1e6}}),
    "qwen3-yarn": ("qwen3", {**GQA, "head_dim": 16, "rope_parameters": {**YARN, "rope_theta": 1e6}}),
    "smollm3-yarn": ("smollm3", {**GQA, "rope_parameters": {**YARN, "rope_theta": 1e6}}),
    "granite-llama3": ("granite", {**GQA, "rope_parameters": {**LLAMA3, "rope_theta": 1e4}}),
    "gpt_neox-yarn": ("gpt_neox", {**SIZES, "rope_parameters": {**YARN, "rope_theta": 1e4,
                                                               "partial_rotary_factor": 0.25}}),
    "stablelm-dynamic": ("stablelm", {**GQA, "max_position_embeddings": 32, "rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0, "partial_rotary_factor": 0.25}}),
    "glm4-linear": ("glm4", {**GQA, "head_dim": 16, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4,
                                                                       "factor": 2.0, "partial_rotary_factor": 0.5}}),
    "gemma3-linear": ("gemma3_text", {**GQA, "head_dim": 16, "sliding_window": 64,
                                      "layer_types": ["sliding_attention", "full_attention"],
                                      "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                                                "rope_theta": 1e4},
                                                          "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                             "rope_theta": 1e6}}}),
    # keys transformers 5 moved, which crashed at load: partial_rotary_factor inside rope_parameters
    # (StableLM, GLM-4), num_local_experts (Qwen3-MoE), GPT-2's n_ctx, LFM2's block_dim
    "stablelm": ("stablelm", GQA),
    "glm4": ("glm4", {**GQA, "head_dim": 16}),
    "qwen3_moe": ("qwen3_moe", {**GQA, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "mixtral": ("mixtral", {**GQA, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": ("qwen2_moe", {**GQA, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                                "num_experts": 4, "num_experts_per_tok": 2}),
    "deepseek_v3": ("deepseek_v3", {**SIZES, "num_key_value_heads": 4, "moe_intermediate_size": 32,
                                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                                    "first_k_dense_replace": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
                                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
                                    "topk_group": 1}),
    "opt": ("opt", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                        word_embed_proj_dim=64, max_position_embeddings=256, **COMMON)),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, **COMMON)),
    "lfm2": ("lfm2", {**GQA, "layer_types": ["conv", "full_attention"]}),
    "gpt_neox": ("gpt_neox", SIZES),
    "qwen3_5": ("qwen3_5_text", {**GQA, "head_dim": 16, "layer_types": ["linear_attention", "full_attention"]}),
    "gemma2": ("gemma2", {**GQA, "head_dim": 16, "sliding_window": 64}),
}
# the rope dicts transformers 4 wrote named their type "type" (Llama 3.1 and later: "rope_type")
_V4_TYPE_KEY = {"llama3": "rope_type"}


def config_of(case: str):
    """The transformers config object of ``case``."""
    from transformers import AutoConfig

    model_type, kwargs = CASES[case]
    return AutoConfig.for_model(model_type, **json.loads(json.dumps(kwargs)))  # a fresh copy of nested dicts


def to_v4(config: dict) -> dict:
    """A transformers 5 ``config.json`` content as transformers 4 wrote it: ``rope_theta``,
    ``partial_rotary_factor`` (GPT-NeoX: ``rotary_emb_base``, ``rotary_pct``) and ``rope_scaling``
    at the top level, Gemma 3's ``rope_local_base_freq``, and the older names of renamed keys."""
    config = json.loads(json.dumps(config))
    model_type = config["model_type"]
    rp = config.pop("rope_parameters", None)
    if model_type == "qwen3_moe" and "num_local_experts" in config:
        config["num_experts"] = config.pop("num_local_experts")
    if model_type == "gpt2":
        config["n_ctx"] = config["n_positions"]
    if model_type == "lfm2":  # the Hub's LFM2 configs (transformers 4.54) carry both widths' older names
        config["block_dim"], config["block_ff_dim"] = config["hidden_size"], config.pop("intermediate_size")
        config["tie_embedding"] = config.pop("tie_word_embeddings", True)
    if not rp:
        return config
    if "full_attention" in rp:  # Gemma 3
        full, sliding = dict(rp["full_attention"]), rp["sliding_attention"]
        config["rope_theta"], config["rope_local_base_freq"] = full.pop("rope_theta"), sliding["rope_theta"]
        kind = full.pop("rope_type")  # Gemma 3's configs name it "rope_type" (transformers 5 ignores "type" there)
        config["rope_scaling"] = None if kind == "default" else {"rope_type": kind, **full}
        return config
    rp = dict(rp)
    theta, partial, kind = rp.pop("rope_theta"), rp.pop("partial_rotary_factor", None), rp.pop("rope_type")
    if model_type == "gpt_neox":
        config["rotary_emb_base"], config["rotary_pct"] = theta, partial
    else:
        config["rope_theta"] = theta
        if partial is not None:
            config["partial_rotary_factor"] = partial
    if model_type == "phi3":  # Phi-3 keeps its pretraining length at the top level only
        rp.pop("original_max_position_embeddings", None)
    config["rope_scaling"] = None if kind == "default" else {_V4_TYPE_KEY.get(kind, "type"): kind, **rp}
    return config


def tokenizer_source(folder: Path) -> Path:
    """A folder holding the byte-level tokenizer of the tiny models (vocabulary 512)."""
    from autocurricula.engine.tiny import build_family_model

    return build_family_model(folder, "llama")


def build(path, case: str, tokenizer: Path, style: str = "5") -> Path:
    """Write ``case``'s tiny random model (float32, fan-in scaled weights, ``torch.manual_seed(0)``)
    to ``path`` with transformers' ``save_pretrained``; ``style="4"`` then rewrites its
    config.json as transformers 4 wrote it (:func:`to_v4`). GPT-2's weights are saved in the
    Hub's layout (mlx-lm reads only that, docs/models.md). Returns ``Path(path)``."""
    import torch
    from transformers import AutoModelForCausalLM

    from autocurricula.engine.tiny import _to_hub_gpt2_layout

    path = Path(path)
    if (path / "model.safetensors").is_file():
        return path
    tmp = path.with_name(path.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    config = config_of(case)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:  # fan-in scale: peaked next-token distributions (see engine/tiny.py)
                p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp)
    if config.model_type == "gpt2":
        _to_hub_gpt2_layout(tmp / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tokenizer / name, tmp / name)
    if style == "4":
        saved = json.loads((tmp / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps(to_v4(saved), indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
