"""transformers' module names against mlx-lm's, for the families that name their blocks differently.

mlx-lm names GPT-2's and GPT-NeoX's blocks ``model.h.N`` where transformers has
``transformer.h.N`` and ``gpt_neox.layers.N``; a peft adapter carries transformers' names. Every
other family has the same paths on both sides. The family is the base model's ``model_type``,
read from its ``config.json`` (:func:`base_model_type`).
"""

from __future__ import annotations

import json
from pathlib import Path

# model_type -> (mlx-lm's block prefix, transformers' block prefix), for the families they name differently
HF_BLOCKS = {"gpt2": ("model.h.", "transformer.h."), "gpt_neox": ("model.h.", "gpt_neox.layers.")}


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
