"""transformers' module names against mlx-lm's, for the families that name their blocks differently.

mlx-lm names GPT-2's and GPT-NeoX's blocks ``model.h.N`` where transformers has
``transformer.h.N`` and ``gpt_neox.layers.N``; a peft adapter carries transformers' names. Every
other family has the same paths on both sides. The family is the base model's ``model_type``,
read from its ``config.json`` (:func:`base_model_type`).

Also by family: the default LoRA targets (:data:`LORA_TARGETS`, :func:`default_lora_targets`), and
the modules a peft export cannot name because peft would not place them where the engine does
(:func:`peft_conflicts`).
"""

from __future__ import annotations

import json
from pathlib import Path

# model_type -> (mlx-lm's block prefix, transformers' block prefix), for the families they name differently
HF_BLOCKS = {"gpt2": ("model.h.", "transformer.h."), "gpt_neox": ("model.h.", "gpt_neox.layers.")}
# families whose linears transformers builds as Conv1D (weight stored (in, out)): peft's fan_in_fan_out
CONV1D_FAMILIES = frozenset({"gpt2"})


def hf_module_path(path: str, model_type: str | None) -> str:
    """transformers' name of the MLX module ``path`` in a ``model_type`` model (the peft key's path)."""
    mlx, hf = HF_BLOCKS.get(model_type, ("", ""))
    return hf + path[len(mlx):] if mlx and path.startswith(mlx) else path


def mlx_module_path(path: str, model_type: str | None) -> str:
    """The MLX module path of transformers' module name ``path`` in a ``model_type`` model."""
    mlx, hf = HF_BLOCKS.get(model_type, ("", ""))
    return mlx + path[len(hf):] if hf and path.startswith(hf) else path


def has_hf_block_names(paths) -> bool:
    """Whether any of the module ``paths`` starts with a block prefix of :data:`HF_BLOCKS`' families
    as transformers names them (so the base model's family decides their MLX names)."""
    prefixes = tuple(hf for _, hf in HF_BLOCKS.values())
    return any(p.startswith(prefixes) for p in paths)


def base_config(base: str | Path) -> dict | None:
    """The base model's ``config.json``: from a local folder, else from the Hugging Face cache
    (no download); None when neither has it."""
    config = Path(base) / "config.json"
    if not config.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache  # huggingface_hub: optional (extra hub)
        except ImportError:
            return None
        try:
            cached = try_to_load_from_cache(str(base), "config.json")
        except ValueError:  # not a repo id
            return None
        if not isinstance(cached, str):
            return None
        config = Path(cached)
    cfg = json.loads(config.read_text())
    return cfg if isinstance(cfg, dict) else None


def base_model_type(base: str | Path | None) -> str | None:
    """The ``model_type`` in the base model's ``config.json`` (see :func:`base_config`), or None."""
    cfg = base_config(base) if base is not None else None
    model_type = cfg.get("model_type") if cfg else None
    return model_type if isinstance(model_type, str) else None


# ---------------------------------------------------------------------------------------------
# LoRA targets per family, and what peft can place
#
# model_type -> the default LoRA targets (module-name suffixes, as ``LoraSpec.target_modules``), the
# way peft keeps them (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`` in peft/utils/constants.py):
# peft's entries for the families both define, the attention projections by the family's own names for
# the families peft's table lacks, and "all-linear" where that is the family's convention. The leaf names
# are mlx-lm's, which are transformers' for these families. A family not listed takes ``q_proj`` and
# ``v_proj`` where it has them, else the linears of its attention modules (:data:`ATTENTION_MODULES`).
LORA_TARGETS: dict[str, list[str] | str] = {
    # peft's table (peft 0.21)
    "opt": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],  # fused q/k/v
    "gpt_bigcode": ["c_attn"],
    "gpt_neox": ["query_key_value"],  # fused q/k/v
    "llama": ["q_proj", "v_proj"],
    "llama4": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "mixtral": ["q_proj", "v_proj"],
    "stablelm": ["q_proj", "v_proj"],
    "phi": ["q_proj", "v_proj", "fc1", "fc2"],
    "gemma": ["q_proj", "v_proj"],
    "gemma2": ["q_proj", "v_proj"],
    "gemma3_text": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
    # not in peft's table
    "phi3": ["qkv_proj"],  # Phi-3 fuses q/k/v into one projection, as GPT-NeoX does
    # hybrids: attention projections exist only in their few attention blocks (one in four in Qwen3.5),
    # and the recipes of both families adapt every linear layer
    "lfm2": "all-linear",
    "qwen3_5_text": "all-linear",
}
# module names that hold a block's attention (the fallback default of a family LORA_TARGETS lacks)
ATTENTION_MODULES = ("self_attn", "attn", "attention")

# peft (0.21) with transformers 5 reads some targets of a fused-MoE family as the routed experts'
# stacked parameters (peft/utils/transformers_weight_conversion.py: _MODEL_TO_CONVERSION_PATTERN,
# _MOE_TARGET_MODULE_MAPPING): a target whose last name is one of PEFT_EXPERT_NAMES[pattern], short
# name or full path alike, adapts the experts there, never a dense MLP or a shared expert of that name.
# The router (``gate``) is converted to its weight, which is what the engine adapts.
PEFT_EXPERT_NAMES = {"mixtral": ("w1", "w2", "w3"), "qwen2_moe": ("gate_proj", "up_proj", "down_proj")}
PEFT_MOE_CONVERSION = {  # model_type -> its pattern in PEFT_EXPERT_NAMES
    "mixtral": "mixtral", "minimax": "mixtral", "minimax_m2": "mixtral",
    **{t: "qwen2_moe" for t in (
        "afmoe", "beam", "cohere2_moe", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe",
        "exaone_moe", "flex_olmo", "glm4_moe", "glm4_moe_lite", "glm4v_moe", "glm_moe_dsa", "hunyuan_v1_moe",
        "longcat_flash", "mellum", "olmoe", "qwen3_moe", "qwen3_next", "qwen3_omni_moe", "qwen3_omni_moe_text",
        "qwen3_omni_moe_thinker", "sarvam_mla", "solar_open")},
}
# model_type -> the MLX path suffix of its MoE router: a Linear in mlx-lm's definition, a router module
# of its own (not a torch Linear) in transformers 5, which peft cannot adapt, and no conversion above
PEFT_UNPLACEABLE = {
    "qwen2_moe": "mlp.gate",  # Qwen2MoeTopKRouter
    "gpt_oss": "mlp.router",  # GptOssTopKRouter
    "phimoe": "block_sparse_moe.gate",  # PhimoeTopKRouter (transformers names it block_sparse_moe.router)
    "mistral4": "mlp.gate",
    "kimi_linear": "mlp.gate",  # KimiLinearTopkRouter
}


def peft_conflicts(paths, model_type: str | None) -> dict[str, str]:
    """``{path: why}`` for the MLX module ``paths`` of a ``model_type`` model on which peft (with
    transformers 5) would not place a LoRA that a peft export names: a router transformers does
    not build as a Linear (:data:`PEFT_UNPLACEABLE`), or a name that peft reads as the fused
    routed experts of the family (:data:`PEFT_MOE_CONVERSION`)."""
    out = {}
    router = PEFT_UNPLACEABLE.get(model_type)
    pattern = PEFT_MOE_CONVERSION.get(model_type)
    experts = PEFT_EXPERT_NAMES.get(pattern, ())
    for p in paths:
        if router and (p == router or p.endswith("." + router)):
            out[p] = (f"the MoE router: transformers 5 builds {model_type}'s router as a module of its own, not a "
                      "torch Linear, and peft cannot adapt it")
        elif p.rsplit(".", 1)[-1] in experts:
            leaf = p.rsplit(".", 1)[-1]
            out[p] = (f"peft (with transformers 5) reads a target named {leaf!r} in a {model_type} adapter as the "
                      f"routed experts' fused {leaf} parameter, so it would adapt the experts, not this layer")
    return out


def default_lora_targets(model_type: str | None, paths) -> list[str] | str:
    """The family's default LoRA targets (:data:`LORA_TARGETS`) for a model whose adaptable module
    paths are ``paths``; for a family not listed, ``q_proj`` and ``v_proj`` where the model has
    them, else the last names of the linears inside its attention modules (``[]`` when it has none)."""
    if model_type in LORA_TARGETS:
        return LORA_TARGETS[model_type]
    leaves = {p.rsplit(".", 1)[-1] for p in paths}
    if {"q_proj", "v_proj"} & leaves:
        return sorted({"q_proj", "v_proj"} & leaves)
    attention = {p.rsplit(".", 1)[-1] for p in paths if set(p.split(".")[:-1]) & set(ATTENTION_MODULES)}
    return sorted(attention)
