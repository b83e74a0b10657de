"""Which model families the engine serves, and the MLX definitions it adds to mlx-lm's.

``load`` is ``mlx_lm.load`` after four steps: the families defined here (OPT and Qwen3.5 text,
which mlx-lm lacks; GPT-NeoX, Llama/Mistral, Gemma 2, Gemma 3 text and Phi-3, whose mlx-lm
definitions depart from transformers' in the MLP or the sliding windows) are registered under
``mlx_lm.models``, so mlx-lm's own loader, converter and adapter loading use them; a family
the engine does not serve is refused by name, with the reason, before any weight is read; and
the config, written by transformers 4 or 5, is read as transformers reads it (``config.normalize``:
the rotary settings under ``rope_parameters``, renamed keys), refusing by name every key that
changes the model and that the family's definition does not read; and its sizes (block count,
hidden size, vocabulary) are compared with the weights' headers, so a config that names more than
its weights hold is refused by name before anything is built. After loading, scaled rotary
embeddings (``llama3``, ``linear``, ``dynamic``, ``yarn``, ``longrope``) are computed as
transformers computes them (``rope``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from autocurricula.engine.models.config import (FAMILIES, NotEnoughMemoryError, WeightsMismatchError,
                                                check_against_weights, check_memory, nested, normalize, weight_shapes)
from autocurricula.engine.models.errors import UnsupportedModelError

__all__ = ["ADDED", "REPLACED", "REFUSED", "NotEnoughMemoryError", "UnsupportedModelError", "WeightsMismatchError",
           "check_supported", "load", "read_config", "refusal", "register"]

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
    """Why the engine refuses a model with this ``config.json`` content, or None if it serves it
    (or if neither mlx-lm nor this package defines its family: the loader names that). Every family
    mlx-lm defines and :data:`~autocurricula.engine.models.config.FAMILIES` does not list is refused
    by name: :data:`REFUSED` says why for some; the others are outside the conformance matrix."""
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
    if isinstance(model_type, str) and model_type not in FAMILIES and _mlx_lm_defines(model_type):
        return _unchecked(model_type)
    return None


def _unchecked(model_type: str) -> str:
    return (f"model family {model_type!r} is not in the conformance matrix: mlx-lm has a definition of it, and the "
            "engine has not checked that definition against transformers (served, it could compute another "
            f"function without a word); use a checkpoint of a served family ({', '.join(sorted(FAMILIES))})")


def _mlx_lm_defines(model_type: str) -> bool:
    """Whether mlx-lm ships a definition ``mlx_lm/models/<model_type>.py``, looked up without
    importing mlx_lm (importing some definitions exits the process: OLMo's without ai2-olmo). A
    family no one defines is left to the loader, which names it."""
    import importlib.util

    spec = importlib.util.find_spec("mlx_lm") if model_type.isidentifier() else None
    where = (spec.submodule_search_locations or []) if spec is not None else []
    return any((Path(folder) / "models" / f"{model_type}.py").is_file() for folder in where)


def check_supported(config: dict) -> None:
    """Raise :class:`UnsupportedModelError` naming the family and the reason when the engine
    cannot serve a model with this ``config.json`` content."""
    why = refusal(config)
    if why is not None:
        raise UnsupportedModelError(f"the autocurricula engine cannot serve this model: {why}. "
                                    "See docs/models.md for the families it serves.")


def read_config(config: dict) -> dict:
    """The config the engine's definition of this family reads (:func:`config.normalize` with the
    fields of the ``ModelArgs`` mlx-lm builds for it); :class:`UnsupportedModelError` naming every
    key that changes the model and that the definition does not read, and naming a family outside
    :data:`~autocurricula.engine.models.config.FAMILIES`, or one neither mlx-lm nor this package
    defines."""
    import dataclasses

    from mlx_lm.utils import _get_classes  # mlx_lm imports transformers: only when a model is read

    register()
    try:
        _, args_class = _get_classes(config)
    except ValueError as exc:  # mlx-lm's "Model type falcon not supported."
        raise UnsupportedModelError(f"the autocurricula engine cannot serve this model: model family "
                                    f"{config.get('model_type')!r} has no definition (neither mlx-lm nor autocurricula "
                                    f"defines it: {exc}); use a checkpoint of a served family "
                                    f"({', '.join(sorted(FAMILIES))}). See docs/models.md.") from exc
    fields = {f.name: f.default for f in dataclasses.fields(args_class)}
    read = normalize(config, fields)
    if config.get("model_type") not in FAMILIES:  # e.g. a type mlx-lm renames (kimi_k2: deepseek_v3's definition)
        raise UnsupportedModelError(f"the autocurricula engine cannot serve this model: "
                                    f"{_unchecked(str(config.get('model_type')))}. See docs/models.md for the "
                                    "families it serves.")
    return read


def load(path_or_hub_id: str, adapter_path: str | None = None):
    """``(model, tokenizer)`` as ``mlx_lm.load`` returns them, for every family the engine serves,
    with the config read as transformers reads it (:func:`read_config`) and the rotary embeddings
    computed as transformers computes them; :class:`UnsupportedModelError` for a family or a
    config the engine refuses. ``adapter_path``: an mlx-lm adapter folder to apply, as
    ``mlx_lm.load(..., adapter_path=...)`` does.

    A model whose rotation is only computed as transformers does it up to some length (longrope:
    ``original_max_position_embeddings``; dynamic: ``max_position_embeddings``) gets that length
    as ``model.rope_context_limit``, which the engine takes as its context limit."""
    # mlx_lm imports transformers: only when a model is loaded (refusal() and the tables need neither)
    from mlx_lm import load as mlx_load
    from mlx_lm.utils import _download, load_config

    from autocurricula.engine.models.rope import context_limit, swap_ropes  # mlx: only when a model is loaded

    register()
    folder = _download(str(path_or_hub_id))
    config = load_config(Path(folder))
    check_supported(config)
    # mlx-lm builds every block the config names before it compares them with the weights
    check_against_weights(config, weight_shapes(folder))
    check_memory(config, folder)  # the weights' bytes, from their headers, against what the machine has
    if config.get("model_file"):  # a custom definition: mlx-lm's loader refuses it by name
        return mlx_load(str(folder), adapter_path=adapter_path)
    read = read_config(config)
    model, tokenizer = mlx_load(str(folder), model_config=read, adapter_path=adapter_path)
    rope = read.get("rope_parameters")
    family = FAMILIES.get(config.get("model_type"))
    if rope and not nested(rope) and rope.get("rope_type", "default") != "default" \
            and not (family and family.own_rope):
        if not swap_ropes(model, rope, read.get("max_position_embeddings")):
            raise UnsupportedModelError(f"the autocurricula engine cannot serve this model: rope_type "
                                        f"{rope['rope_type']!r} is set, and the definition of "
                                        f"{config.get('model_type')!r} has no rotary module to apply it to")
    limits = [context_limit(p, read.get("max_position_embeddings"))
              for p in ((rope or {}).values() if nested(rope) else [rope]) if isinstance(p, dict) or p is None]
    limits = [n for n in limits if n]
    if limits:
        model.rope_context_limit = min(limits)
    return model, tokenizer
