"""Which model families the engine serves, and the MLX definitions it adds to mlx-lm's.

``load`` is ``mlx_lm.load`` after two steps: the families defined here (OPT and Qwen3.5 text,
which mlx-lm lacks; GPT-NeoX, Llama/Mistral, Gemma 2, Gemma 3 text and Phi-3, whose mlx-lm
definitions depart from transformers' in the MLP or the sliding windows) are registered under
``mlx_lm.models``, so mlx-lm's own loader, converter and adapter loading use them; and a family
the engine does not serve is refused by name, with the reason, before any weight is read.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# model_type -> the MLX definition this package adds (mlx-lm has none)
ADDED = {"opt": "autocurricula.engine.models.opt", "qwen3_5_text": "autocurricula.engine.models.qwen3_5_text"}
# model_type -> the MLX definition used instead of mlx-lm's, whose logits depart from transformers'
REPLACED = {
    "gpt_neox": "autocurricula.engine.models.gpt_neox",
    "llama": "autocurricula.engine.models.llama",  # also Mistral's: its sliding window on every layer
    "gemma2": "autocurricula.engine.models.gemma2",  # sliding-window layers, soft-capped head
    "gemma3_text": "autocurricula.engine.models.gemma3_text",  # layer kinds from layer_types
    "phi3": "autocurricula.engine.models.phi3",  # its sliding window
}

# families whose sliding-window or recurrent layers the engine serves, each checked against
# transformers in tests/test_families.py (sliding layers: a full KV cache with a windowed mask;
# recurrent layers: one state per batch row, kept at block boundaries for the prefix cache)
WINDOWED = {"llama", "mistral", "gemma2", "gemma3_text", "phi3"}
RECURRENT = {"qwen3_5_text", "lfm2"}

# model_type -> why the batched engine refuses it
_SLIDING = ("sliding-window attention layers in a definition the conformance matrix does not check yet "
            f"(served with sliding windows: {', '.join(sorted(WINDOWED))})")
_RECURRENT = ("recurrent (linear-attention / state-space) layers in a definition the conformance matrix does not "
              f"check yet (served with recurrent layers: {', '.join(sorted(RECURRENT))})")
_WRAPPER = ("a multimodal wrapper the conformance matrix does not check yet; text-only checkpoints of the family "
            "({}) are served")
REFUSED = {
    "gemma3": _WRAPPER.format("gemma3_text, e.g. google/gemma-3-1b-it"),
    "cohere2": _SLIDING,
    "qwen3_5": _WRAPPER.format("qwen3_5_text, Qwen3_5ForCausalLM"),
    "qwen3_5_moe": _RECURRENT,
    "qwen3_next": _RECURRENT,
    "lfm2_moe": _RECURRENT,
    "mamba": _RECURRENT,
    "mamba2": _RECURRENT,
    "falcon_h1": _RECURRENT,
    "jamba": _RECURRENT,
    "nemotron_h": _RECURRENT,
    "granitemoehybrid": _RECURRENT,
    "recurrent_gemma": _RECURRENT,
    "rwkv7": _RECURRENT,
}
_RECURRENT_LAYERS = {"linear_attention", "conv", "mamba", "recurrent"}


class UnsupportedModelError(ValueError):
    """A model family the engine cannot serve; the message names the family and the reason."""


def register() -> None:
    """Make the families in :data:`ADDED` and :data:`REPLACED` importable as
    ``mlx_lm.models.<model_type>``, so that ``mlx_lm.load``, ``mlx_lm.convert`` and
    ``mlx_lm.load(adapter_path=...)`` load them with these definitions. A family in :data:`ADDED`
    that mlx-lm ships itself is left to mlx-lm."""
    for model_type, module in ADDED.items():
        name = f"mlx_lm.models.{model_type}"
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            _install(model_type, importlib.import_module(module))
    for model_type, module in REPLACED.items():
        ours = importlib.import_module(module)  # builds on mlx-lm's module, so it is imported first
        if sys.modules.get(f"mlx_lm.models.{model_type}") is not ours:
            _install(model_type, ours)


def _install(model_type: str, module) -> None:
    import mlx_lm.models  # mlx_lm imports transformers: only when a family is registered

    sys.modules[f"mlx_lm.models.{model_type}"] = module
    setattr(mlx_lm.models, model_type, module)


def refusal(config: dict) -> str | None:
    """Why the engine refuses a model with this ``config.json`` content, or None if it serves it."""
    model_type = config.get("model_type")
    text = config.get("text_config") or {}
    if model_type in REFUSED or text.get("model_type") in REFUSED:
        family = model_type if model_type in REFUSED else text["model_type"]
        return f"model family {family!r} has {REFUSED[family]}"
    types = set(config.get("layer_types") or ())
    if types & _RECURRENT_LAYERS and model_type not in RECURRENT:
        return f"model family {model_type!r} has {_RECURRENT}"
    if model_type in WINDOWED:
        return None
    window = config.get("sliding_window")
    if "sliding_attention" in types:
        return f"model family {model_type!r} has {_SLIDING}"
    if config.get("use_sliding_window", window is not None) and window \
            and window < int(config.get("max_position_embeddings") or 0):
        return (f"model family {model_type!r} is configured with sliding_window={window} (shorter than its "
                f"{config.get('max_position_embeddings')} positions): {_SLIDING}")
    return None


def check_supported(config: dict) -> None:
    """Raise :class:`UnsupportedModelError` naming the family and the reason when the engine
    cannot serve a model with this ``config.json`` content."""
    why = refusal(config)
    if why is not None:
        raise UnsupportedModelError(f"the autocurricula engine cannot serve this model: {why}. "
                                    "See docs/models.md for the families it serves.")


def load(path_or_hub_id: str):
    """``(model, tokenizer)`` as ``mlx_lm.load`` returns them, for every family the engine serves;
    :class:`UnsupportedModelError` for one it refuses."""
    # mlx_lm imports transformers: only when a model is loaded (refusal() and the tables need neither)
    from mlx_lm import load as mlx_load
    from mlx_lm.utils import _download, load_config

    register()
    folder = _download(str(path_or_hub_id))
    check_supported(load_config(Path(folder)))
    return mlx_load(str(folder))

