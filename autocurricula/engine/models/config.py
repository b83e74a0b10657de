"""One reader for every ``config.json`` a user may bring, written by transformers 4 or 5.

transformers 5 writes the rotary settings only under ``rope_parameters`` (type, theta, factors,
``partial_rotary_factor``) and renames a few keys (Qwen3-MoE's ``num_local_experts``); mlx-lm's
definitions read the older top-level keys (``rope_theta``, ``rope_scaling``) and fall back to
their own defaults without a word. :func:`normalize` maps a config of either style onto what the
family's definition reads, and refuses by name, with what to do, every key that changes the
model's function and that the definition does not read.

How a key is judged (``normalize``, in this order):

1. **Metadata** (:data:`METADATA`, dropouts): bookkeeping, token ids, generation defaults and
   training-only settings, which no forward pass at inference reads.
2. **Read here**: the rotary keys (:func:`rope_parameters` turns them into the canonical
   ``rope_parameters`` transformers 5 computes with, and the keys each definition reads), the
   sliding-window keys (judged by ``refusal`` in ``__init__``) and renamed keys.
3. **Fixed by the definition** (:data:`FAMILIES`): a key transformers reads and the engine's
   definition does not, because it computes with one value (Llama's ``hidden_act``: SiLU). Served
   at that value, refused at any other.
4. **Read by the definition** (a field of its ``ModelArgs``). For a family of the conformance
   matrix, a field transformers does not read (``rope_traditional``) must keep its default:
   transformers computes as if it did.
5. **Read by neither**: a key the installed transformers' config class of the family does not
   take (nor reads by another name) is ignored by transformers too, so ignoring it agrees with the
   reference. Without a transformers class for the family, nothing falls here.
6. Anything else is refused: :class:`UnsupportedModelError` naming the key, its value, the
   family and what to do.

The families of the conformance matrix (``tests/test_families.py``) are listed in
:data:`FAMILIES`, each audited against the installed transformers' config class
(``tests/test_model_configs.py`` checks that every key that class takes is judged).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from autocurricula.engine.models.errors import UnsupportedModelError

log = logging.getLogger(__name__)

__all__ = ["FAMILIES", "METADATA", "ROPE_TYPES", "Family", "NotEnoughMemoryError", "WeightsMismatchError",
           "available_memory", "check_against_weights", "check_memory", "estimate_memory", "normalize",
           "rope_parameters", "transformers_reads", "weight_shapes"]

# the rope types the engine computes as transformers does (rope.py), as transformers names them
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# what each type needs in its parameters beyond rope_theta and rope_type (transformers' validation)
REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor", "original_max_position_embeddings"),
            "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}

# keys no forward pass at inference reads: the config's bookkeeping, token ids, generation
# defaults of old configs, and training-only settings (also every *_dropout / *_pdrop key)
METADATA = frozenset({
    "_name_or_path", "architectures", "auto_map", "transformers_version", "model_type", "dtype", "torch_dtype",
    "use_cache", "initializer_range", "init_std", "initializer_factor", "id2label", "label2id", "num_labels",
    "problem_type", "return_dict", "use_return_dict", "output_attentions", "output_hidden_states",
    "output_router_logits", "router_aux_loss_coef", "router_z_loss_coef", "router_jitter_noise",
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "tie_encoder_decoder", "bos_token_id",
    "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "tokenizer_class", "prefix",
    "task_specific_params", "finetuning_task", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "gradient_checkpointing", "quantization", "quantization_config", "keys_to_ignore_at_inference", "dropout",
    "layerdrop", "pretraining_tp", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "max_new_tokens",
})
# rotary keys, read by rope_parameters() (family-specific legacy names in Family.legacy_rope)
ROPE_KEYS = frozenset({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
                       "original_max_position_embeddings", "max_position_embeddings"})
# sliding-window and layer-layout keys: refusal() in __init__ judges them before any weight is read
WINDOW_KEYS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
                         "sliding_window_pattern", "_sliding_window_pattern"})
# keys transformers' modeling code reads with getattr(config, ...) though no config class declares them
_GETATTR_KEYS = frozenset({"head_dim", "sliding_window"})
# keys transformers still reads from older configs, beyond the rotary ones (kwargs of __post_init__)
_LEGACY = {"gemma3_text": {"sliding_window_pattern", "rope_local_base_freq"},
           "lfm2": {"tie_embedding", "block_ff_dim"}, "qwen3_5_text": {"full_attention_interval"},
           "gpt_neox": {"rotary_emb_base", "rotary_pct"}}
# transformers' partial_rotary_factor default, where a config class sets one (StableLM, GLM-4 and
# Qwen3.5 in __post_init__; GPT-NeoX's rotary_pct; Phi-3's 1.0)
_PARTIAL_DEFAULT = {"stablelm": 0.25, "glm4": 0.5, "qwen3_5_text": 0.25, "gpt_neox": 0.25, "phi3": 1.0}
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")


def _head_dim(c: dict) -> tuple:
    """A head size the definition derives (hidden size / heads): absent, None or that value."""
    heads = c.get("num_attention_heads") or c.get("n_head")
    hidden = c.get("hidden_size") or c.get("n_embd")
    return (None, hidden // heads) if heads and hidden else (None,)


def _gpt2_inner(c: dict) -> tuple:
    return (None, 4 * c["n_embd"]) if c.get("n_embd") else (None,)


@dataclass(frozen=True)
class Family:
    """How the engine's definition of one family reads a config, beyond its ``ModelArgs`` fields.

    ``fixed``: keys transformers reads and the definition does not, with the values (or a function
    of the config giving them) the definition computes with. ``derived``: keys the definition needs
    and transformers 5 no longer writes, computed from the ones it does. ``scaled_rope``: whether
    rope types beyond ``default`` are served (each is checked against transformers in
    tests/test_model_configs.py). ``partial_rotary``: whether the definition applies
    ``partial_rotary_factor``. ``own_rope``: the definition builds transformers' rotation itself
    (no module is swapped after loading).
    """

    fixed: Mapping[str, Any] = field(default_factory=dict)
    derived: Mapping[str, Callable[[dict], Any]] = field(default_factory=dict)
    scaled_rope: bool = True
    partial_rotary: bool = False
    own_rope: bool = False


_LLAMA = Family(fixed={"hidden_act": ("silu",)})
FAMILIES: dict[str, Family] = {
    "opt": Family(scaled_rope=False),
    "gpt2": Family(fixed={"activation_function": _TANH_GELU, "n_inner": _gpt2_inner, "scale_attn_weights": (True,),
                          "scale_attn_by_inverse_layer_idx": (False,), "add_cross_attention": (False,),
                          "tie_word_embeddings": (True,), "head_dim": _head_dim},
                   derived={"n_ctx": lambda c: c.get("n_ctx") or c["n_positions"]}, scaled_rope=False),
    "gpt_neox": Family(fixed={"tie_word_embeddings": (False,), "head_dim": _head_dim}, partial_rotary=True),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": Family(fixed={"hidden_act": ("silu",), "head_dim": _head_dim}),
    "qwen3": Family(fixed={"hidden_act": ("silu",), "attention_bias": (False,)}),
    "phi3": Family(fixed={"hidden_act": ("silu",), "head_dim": _head_dim}, partial_rotary=True),
    "smollm3": _LLAMA,
    "olmo2": _LLAMA,
    "gemma2": Family(fixed={"hidden_activation": _TANH_GELU, "attention_bias": (False,),
                            "tie_word_embeddings": (True,), "use_bidirectional_attention": (False, None)},
                     scaled_rope=False),
    "gemma3_text": Family(fixed={"hidden_activation": _TANH_GELU, "attention_bias": (False,),
                                 "attn_logit_softcapping": (None,), "final_logit_softcapping": (None,),
                                 "tie_word_embeddings": (True,), "use_bidirectional_attention": (False, None)},
                          own_rope=True),
    "qwen3_5_text": Family(fixed={"hidden_act": ("silu",)}, scaled_rope=False, partial_rotary=True),
    "lfm2": Family(fixed={"tie_word_embeddings": (True,), "tie_embedding": (True,), "head_dim": _head_dim},
                   derived={"block_dim": lambda c: c["hidden_size"],  # transformers: the hidden size
                            # transformers: block_ff_dim (older configs) wins over intermediate_size
                            "block_ff_dim": lambda c: c.get("block_ff_dim") or c.get("intermediate_size"),
                            "intermediate_size": lambda c: c.get("block_ff_dim") or c.get("intermediate_size")},
                   scaled_rope=False),
    "stablelm": Family(fixed={"hidden_act": ("silu",), "tie_word_embeddings": (False,), "head_dim": _head_dim},
                       partial_rotary=True),
    "glm4": Family(fixed={"hidden_act": ("silu",), "tie_word_embeddings": (False,)}, partial_rotary=True),
    "qwen3_moe": Family(fixed={"hidden_act": ("silu",), "attention_bias": (False,)},
                        derived={"head_dim": lambda c: c.get("head_dim") or _head_dim(c)[-1]}, scaled_rope=False),
    "mixtral": Family(fixed={"hidden_act": ("silu",), "head_dim": _head_dim}, scaled_rope=False),
    "granite": _LLAMA,
    # MoE families: every layer routed, as the definitions build them
    "qwen2_moe": Family(fixed={"hidden_act": ("silu",), "decoder_sparse_step": (1,), "mlp_only_layers": ([],),
                               "norm_topk_prob": (False,), "qkv_bias": (True,), "head_dim": _head_dim},
                        scaled_rope=False),
    # DeepSeek-V3's checkpoints scale their rotation with yarn and an mscale on the attention, which
    # its definition applies in its own way: only its default rotation is checked, and served
    "deepseek_v3": Family(fixed={"hidden_act": ("silu",), "tie_word_embeddings": (False,), "rope_interleave": (True,),
                                 "head_dim": lambda c: (None, c.get("qk_rope_head_dim"))},
                          scaled_rope=False),
}


@dataclass(frozen=True)
class _Schema:
    """What the installed transformers' config class of a family takes."""

    params: frozenset
    attribute_map: Mapping[str, str]
    default_theta: Any
    has_rope: bool
    max_position_embeddings: int | None
    original_max_position_embeddings: int | None


@functools.lru_cache(maxsize=None)
def _schema(model_type: str) -> _Schema | None:
    try:
        # transformers: its config classes are the reference for which keys a family reads
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
    except (ImportError, KeyError):
        return None
    params = {p for p, v in inspect.signature(cls.__init__).parameters.items()
              if p != "self" and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
    if dataclasses.is_dataclass(cls):
        params |= {f.name for f in dataclasses.fields(cls)}
    orig = getattr(cls, "original_max_position_embeddings", None) if "original_max_position_embeddings" in params \
        else None
    return _Schema(frozenset(params), dict(getattr(cls, "attribute_map", {}) or {}),
                   getattr(cls, "default_theta", 10_000.0), "rope_parameters" in params,
                   getattr(cls, "max_position_embeddings", None) if isinstance(
                       getattr(cls, "max_position_embeddings", None), int) else None,
                   orig if isinstance(orig, int) else None)


def transformers_reads(model_type: str) -> frozenset | None:
    """Every config key the installed transformers reads for this family: its config class's
    parameters, their other names, the legacy keys it still converts and the keys its modeling
    code reads with ``getattr``; None when transformers has no such family."""
    schema = _schema(model_type)
    if schema is None:
        return None
    return (schema.params | set(schema.attribute_map) | ROPE_KEYS | _GETATTR_KEYS | _LEGACY.get(model_type, set())
            | {"rope_scaling", "rope_theta", "partial_rotary_factor"})


def _training_only(key: str) -> bool:
    return key.endswith(("_dropout", "_pdrop")) or key.startswith("summary_") or key == "reorder_and_upcast_attn"


# -- rotary settings ---------------------------------------------------------------------------


def _standardize(rp: dict, config: dict, schema: _Schema | None, phi3_orig: bool) -> dict:
    """transformers' ``standardize_rope_params`` on one (flat) rope dict."""
    rp.setdefault("rope_type", rp.get("type", "default"))
    rp.pop("type", None)
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        if phi3_orig:  # Phi-3 keeps the pretraining length at the top level, and it wins
            rp["original_max_position_embeddings"] = config.get(
                "original_max_position_embeddings", schema.original_max_position_embeddings)
        else:
            rp.setdefault("original_max_position_embeddings",
                          config.get("max_position_embeddings", schema.max_position_embeddings if schema else None))
    return rp


def rope_parameters(config: dict) -> dict | None:
    """The rotary settings a config means, as transformers 5 reads them from either style: one
    canonical dict (``rope_type``, ``rope_theta``, the type's factors, ``partial_rotary_factor``
    where the family has one, ``original_max_position_embeddings`` for the types that need it), or
    for Gemma 3 one per layer kind (``{"sliding_attention": {...}, "full_attention": {...}}``).
    None for a family without rotary embeddings (OPT, GPT-2)."""
    model_type = config.get("model_type")
    schema = _schema(model_type)
    if schema is not None and not schema.has_rope:
        return None
    if schema is None and not any(k in config for k in ("rope_parameters", "rope_scaling", "rope_theta")):
        return None
    default_theta = schema.default_theta if schema else 10_000.0
    if model_type == "gemma3_text":
        return _gemma3_rope(config, schema)
    scaling = config.get("rope_scaling")
    rp = dict(scaling or config.get("rope_parameters") or {})
    if nested(rp):  # one dict per layer kind, in another family: each standardized as transformers does
        for kind, params in rp.items():
            if isinstance(params, dict):
                rp[kind] = _standardize({"rope_theta": config.get("rope_theta", default_theta), **params}, config,
                                        schema, phi3_orig=False)
        return rp
    if model_type == "gpt_neox":  # its own legacy names, and no top-level rope_theta
        rp.setdefault("rope_theta", config.get("rotary_emb_base", default_theta))
        rp.setdefault("partial_rotary_factor", config.get("rotary_pct", _PARTIAL_DEFAULT["gpt_neox"]))
    else:
        rp.setdefault("rope_theta", config.get("rope_theta", default_theta))
        partial = config.get("partial_rotary_factor", _PARTIAL_DEFAULT.get(model_type))
        if partial is not None:
            rp.setdefault("partial_rotary_factor", partial)
    if model_type == "phi3" and rp.get("rope_type", rp.get("type")) in ("su", "yarn"):
        rp["rope_type"] = "longrope"  # Phi-3's older names for it
    return _standardize(rp, config, schema, phi3_orig=schema is not None and
                        schema.original_max_position_embeddings is not None)


def nested(rp: dict | None) -> bool:
    """Whether rope parameters hold one dict per layer kind (Gemma 3's ``full_attention`` and
    ``sliding_attention``) rather than one for every layer."""
    return bool(rp) and any(isinstance(v, dict) for v in rp.values())


def _gemma3_rope(config: dict, schema: _Schema) -> dict:
    theta = schema.default_theta if isinstance(schema.default_theta, dict) else {"global": 1e6, "local": 1e4}
    given = config.get("rope_parameters")
    rp = {k: dict(v) for k, v in given.items()} if isinstance(given, dict) and given else \
        {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}}
    if config.get("rope_scaling") is not None:
        rp.setdefault("full_attention", {"rope_type": "default"}).update(config["rope_scaling"])
    rp.setdefault("full_attention", {"rope_type": "default"}).setdefault(
        "rope_theta", config.get("rope_theta", theta["global"]))
    rp.setdefault("sliding_attention", {"rope_type": "default"}).setdefault(
        "rope_theta", config.get("rope_local_base_freq", theta["local"]))
    for kind in ("full_attention", "sliding_attention"):
        _standardize(rp[kind], config, schema, phi3_orig=False)
    return rp


def _rope_problems(model_type: str, rp: dict, family: Family | None, fields: Mapping[str, Any]) -> list[str]:
    problems = []
    if nested(rp) and not (family and family.own_rope):
        return [f"rope_parameters per layer kind ({', '.join(sorted(rp))}): the engine's definition of "
                f"{model_type!r} reads one rotation for every layer"]
    for where, params in (rp.items() if nested(rp) else [("rope_parameters", rp)]):
        if not isinstance(params, dict):
            continue
        kind = params["rope_type"]
        if kind != "default":
            served = [f for f, fam in FAMILIES.items() if fam.scaled_rope]
            if kind not in ROPE_TYPES:
                problems.append(f"{where}: rope_type {kind!r} is not computed by the engine (it computes "
                                f"{', '.join(ROPE_TYPES)})")
            elif family is None or not family.scaled_rope:
                problems.append(f"{where}: rope_type {kind!r} is not applied by the engine's definition of "
                                f"{model_type!r} (scaled rotary embeddings are served for {', '.join(served)})")
            else:
                missing = [k for k in REQUIRED[kind] if params.get(k) is None]
                if missing:
                    problems.append(f"{where}: rope_type {kind!r} needs {', '.join(missing)}, as transformers does")
        partial = params.get("partial_rotary_factor")
        applies = (family.partial_rotary if family else "partial_rotary_factor" in fields)
        if partial is not None and float(partial) != 1.0 and not applies:
            problems.append(f"{where}: partial_rotary_factor={partial} is not applied by the engine's definition of "
                            f"{model_type!r}, which rotates the whole head")
    return problems


def _rope_keys(model_type: str, rp: dict) -> dict:
    """The rotary keys each definition reads, from the canonical parameters. ``rope_scaling`` is
    None: scaled types are computed by the modules ``load`` swaps in (rope.swap_ropes), and the
    definitions build plain rotations of the right size for them to replace."""
    if nested(rp):  # Gemma 3: its definition reads rope_parameters itself (other families are refused)
        return {"rope_parameters": rp, "rope_theta": rp["full_attention"]["rope_theta"],
                "rope_local_base_freq": rp["sliding_attention"]["rope_theta"], "rope_scaling": None}
    out = {"rope_parameters": rp, "rope_theta": rp["rope_theta"], "rope_scaling": None}
    if "partial_rotary_factor" in rp:
        out["partial_rotary_factor"] = rp["partial_rotary_factor"]
    if model_type == "gpt_neox":
        out["rotary_emb_base"], out["rotary_pct"] = rp["rope_theta"], rp.get("partial_rotary_factor", 1.0)
    return out


# -- the reader --------------------------------------------------------------------------------


def _accepted(spec, config: dict) -> tuple:
    return tuple(spec(config)) if callable(spec) else tuple(spec)


def normalize(config: dict, fields: Mapping[str, Any]) -> dict:
    """The config the engine's definition of this family reads, from ``config`` (the content of a
    ``config.json``, transformers 4 or 5 style): a new dict with every key of ``config`` and the
    keys the definition reads set as transformers means them (the canonical ``rope_parameters``
    and ``rope_theta``, ``partial_rotary_factor``, ... and renamed or derived keys). ``fields``
    maps the names the definition's ``ModelArgs`` take to their defaults
    (``dataclasses.MISSING`` for required ones).

    Raises :class:`UnsupportedModelError` naming every key that changes the model's function and
    that the definition does not read (see the module's docstring for how keys are judged).
    """
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type)
    schema = _schema(model_type)
    reads = transformers_reads(model_type)
    out = dict(config)
    consumed = set(ROPE_KEYS | WINDOW_KEYS | _LEGACY.get(model_type, set()))
    # one name for a key transformers 5 stores under another (Qwen3-MoE: num_local_experts)
    for alias, stored in (schema.attribute_map if schema else {}).items():
        for want, have in ((alias, stored), (stored, alias)):
            if want in fields and want not in config and have in config:
                out[want] = config[have]
                consumed.add(have)
    for key, derive in (family.derived if family else {}).items():
        out[key] = derive(config)
        consumed.add(key)
    problems = []
    rp = rope_parameters(config)
    if rp is not None:
        problems += _rope_problems(model_type, rp, family, fields)
        out.update(_rope_keys(model_type, rp))
    for key, value in config.items():
        if key in METADATA or _training_only(key) or key in consumed:
            continue
        if family is not None and key in family.fixed:
            accepted = _accepted(family.fixed[key], config)
            if value not in accepted:
                shown = " or ".join(repr(v) for v in accepted if v is not None)
                problems.append(f"{key}={value!r}: transformers reads it, and the engine's definition of "
                                f"{model_type!r} computes with {key}={shown} only")
            continue
        if key in fields:
            default = fields[key]
            if family is not None and reads is not None and key not in reads \
                    and default is not dataclasses.MISSING and value != default:
                problems.append(f"{key}={value!r}: the engine's definition of {model_type!r} reads it and "
                                f"transformers does not (it computes as if {key}={default!r}); remove it from "
                                "config.json")
            continue
        if reads is not None and key not in reads:
            continue  # transformers ignores it as well
        whose = f"transformers' {model_type!r} reads it" if reads is not None else \
            "transformers has no such family to say it is harmless"
        fix = ("its definition is not in the conformance matrix, so what it does not read is unknown" if family is None
               else "served, the model would compute another function than transformers'")
        problems.append(f"{key}={_short(value)}: {whose}, and the engine's definition of {model_type!r} does not "
                        f"({fix})")
    if problems:
        raise UnsupportedModelError(
            f"the autocurricula engine cannot serve this model: its config.json has settings the engine would not "
            f"apply, for model family {model_type!r}: " + "; ".join(problems) + ". What to do: use a checkpoint "
            "without them, or of a family and settings the engine serves (docs/models.md, 'Config formats and RoPE "
            "types'); a key left from another tool that transformers ignores may be removed from config.json")
    return out


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- the config against its weights --------------------------------------------------------------
#
# mlx-lm builds every layer and module the config names before it compares them with the weights,
# so a config.json claiming 100,000 layers next to 4 layers of weights costs gigabytes before any
# error. ``check_against_weights`` compares the sizes the weights' headers show with the config
# first, reading no tensor data.

# the safetensors library's own bound on a header (its MAX_HEADER_SIZE)
MAX_WEIGHT_HEADER_BYTES = 100_000_000
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")  # transformers' names for the block count
# sizes every served family keeps as a dimension of some tensor (rows of a projection, a norm's
# length, the expert axis): none can exceed the largest dimension the weights have
SIZE_KEYS = ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "ffn_dim", "word_embed_proj_dim",
             "vocab_size", "num_attention_heads", "n_head", "num_key_value_heads", "head_dim",
             "num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
             "shared_expert_intermediate_size", "block_dim", "block_ff_dim", "kv_lora_rank", "q_lora_rank")
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")  # model.layers.3.* (GPT-2: h.3.*)
_EMBEDDING = re.compile(r"(?:^|\.)(?:embed_tokens|wte|embed_in|word_embeddings|tok_embeddings)\.weight$")
_SAME_CHECKPOINT = ("Take config.json and the *.safetensors from the same checkpoint (download it again, or write "
                    "both with `save_pretrained`)")


class WeightsMismatchError(UnsupportedModelError):
    """A ``config.json`` whose sizes do not match its weights' headers (or a weights file whose
    header cannot be read), refused before the model is built. ``cause`` names the keys and what
    the weights hold, ``fix`` what to do; the message is both."""

    def __init__(self, cause: str, fix: str):
        self.cause, self.fix = cause, fix
        super().__init__(f"the autocurricula engine cannot serve this model: {cause}. {fix}")


def weight_shapes(folder: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor: (file name, shape)}`` from the headers of the folder's ``model*.safetensors``
    (the files ``mlx_lm.load`` reads), without reading any tensor data. A header that is not a
    safetensors header (or is over :data:`MAX_WEIGHT_HEADER_BYTES`) is a :class:`WeightsMismatchError`."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in sorted(Path(folder).glob("model*.safetensors")):
        with open(file, "rb") as fh:
            prefix = fh.read(8)
            n = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
            problem = "it is shorter than 8 bytes" if len(prefix) < 8 else \
                f"its header length ({n} bytes) is 0 or over {MAX_WEIGHT_HEADER_BYTES}" \
                if not 0 < n <= MAX_WEIGHT_HEADER_BYTES else None
            raw = fh.read(n) if problem is None else b""
        if problem is None and len(raw) < n:
            problem = f"it ends inside its {n}-byte header"
        if problem is None:
            try:
                header = json.loads(raw)
                for key, info in header.items():
                    if key == "__metadata__":
                        continue
                    shape = info["shape"]
                    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                              and d >= 0 for d in shape):
                        raise ValueError(key)
                    out[key] = (file.name, tuple(shape))
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                problem = "its header is not the JSON a safetensors file holds"
        if problem is not None:
            raise WeightsMismatchError(f"its weights file {file.name} cannot be read: {problem}",
                                       "Write the weights with the safetensors library (`save_pretrained`, or "
                                       "`mlx_lm.convert`)")
    return out


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _embedding_width(key: str, width: int, shapes: Mapping, config: dict) -> int | None:
    """The embedding's width before quantization: mlx-lm packs a quantized one into uint32 words
    (``.scales`` beside it); None when its bits are not known."""
    base = key[: -len(".weight")]
    if f"{base}.scales" not in shapes:
        return width
    quant = config.get("quantization") or config.get("quantization_config") or {}
    quant = quant if isinstance(quant, dict) else {}
    if isinstance(quant.get(base), dict):  # mlx-lm's per-module settings
        quant = quant[base]
    bits = quant.get("bits")
    return width * 32 // bits if _int(bits) and bits > 0 else None


def check_against_weights(config: dict, shapes: Mapping[str, tuple[str, tuple[int, ...]]]) -> None:
    """Refuse, by key, a config whose sizes the weights (``shapes``, from :func:`weight_shapes`)
    contradict, before anything is built: a block count above the blocks the weights hold, a
    hidden size or vocabulary other than the embedding's, or a size (:data:`SIZE_KEYS`) larger
    than every dimension of every tensor. Weights with no tensors are left to the loader."""
    if not shapes:
        return
    problems = []
    blocks = {int(m.group(1)) for key in shapes if (m := _LAYER_INDEX.search(key))}
    held = max(blocks) + 1 if blocks else 0
    for key in LAYER_KEYS:
        value = config.get(key)
        if _int(value) and value > held:
            where = f"{held} blocks (0 to {held - 1})" if held else "no block (no tensor named like model.layers.0.*)"
            problems.append(f"{key}={value}, but its weights hold {where}")
    embedding = next(((k, s) for k, (_, s) in shapes.items() if _EMBEDDING.search(k) and len(s) == 2), None)
    if embedding is not None:
        key, (rows, width) = embedding
        file = shapes[key][0]
        if _int(config.get("vocab_size")) and config["vocab_size"] != rows:
            problems.append(f"vocab_size={config['vocab_size']}, but the embedding {key} in {file} has {rows} rows")
        width = _embedding_width(key, width, shapes, config)
        hidden_key = next((k for k in ("word_embed_proj_dim", "hidden_size", "n_embd", "d_model")
                           if _int(config.get(k))), None)  # OPT embeds at word_embed_proj_dim
        if width is not None and hidden_key is not None and config[hidden_key] != width:
            problems.append(f"{hidden_key}={config[hidden_key]}, but the embedding {key} in {file} is {width} wide")
    largest = max((d for _, s in shapes.values() for d in s), default=0)
    for key in SIZE_KEYS:
        value = config.get(key)
        if _int(value) and value > largest and not any(p.startswith(f"{key}=") for p in problems):
            problems.append(f"{key}={value} is larger than every dimension of every weight (the largest is "
                            f"{largest}), so no tensor of the checkpoint can hold it")
    if problems:
        raise WeightsMismatchError("its config.json does not match its weights: " + "; ".join(problems),
                                   _SAME_CHECKPOINT)


# -- the memory a checkpoint implies -------------------------------------------------------------


class NotEnoughMemoryError(UnsupportedModelError):
    """The weights a checkpoint's headers describe need more memory than the machine has
    available; refused before the model is built."""


def estimate_memory(config: dict, folder: str | Path) -> int:
    """Bytes the loaded weights will hold at least: the data the headers of the folder's
    ``model*.safetensors`` describe (dtypes and shapes, through their ``data_offsets``), reading
    no tensor data. A lower bound: a CPU engine that converts half-precision or quantized weights
    to float32 holds more, and the KV cache grows with the requests. ``config`` is taken for
    what later estimates may add (its sizes are checked by :func:`check_against_weights`)."""
    total = 0
    for file in sorted(Path(folder).glob("model*.safetensors")):
        with open(file, "rb") as fh:
            prefix = fh.read(8)
            n = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
            if not 0 < n <= MAX_WEIGHT_HEADER_BYTES:
                continue  # weight_shapes has refused it already
            try:
                header = json.loads(fh.read(n))
                total += max((int(info["data_offsets"][1]) for key, info in header.items()
                              if key != "__metadata__"), default=0)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
                continue
    return total


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation: psutil's figure when installed, else Linux's
    ``MemAvailable`` (page cache that can be given back included), else free pages from
    ``sysconf``; None where none can be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # not installed, or no figure on this system
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(config: dict, folder: str | Path) -> None:
    """Refuse (:class:`NotEnoughMemoryError`) a checkpoint whose weights (:func:`estimate_memory`)
    need more than :func:`available_memory`, before anything is built. Skipped, with a debug
    log, where the available figure cannot be read."""
    need = estimate_memory(config, folder)
    have = available_memory()
    if have is None:
        log.debug("available memory unknown on this system: the %d bytes the weights of %s need are not checked",
                  need, folder)
        return
    if need > have:
        raise NotEnoughMemoryError(
            f"the autocurricula engine cannot load the model in {Path(folder).name}: its weights need an "
            f"estimated {need / 2**20:.0f} MiB (from their safetensors headers) and this machine has "
            f"{have / 2**20:.0f} MiB available. What to do: use a smaller model, quantized weights (e.g. "
            "`mlx_lm.convert -q`), or free memory; fewer rows at once (--max-batch, EngineConfig.max_context) "
            "leave more room, since the KV cache comes on top")
