"""Tiny random causal LMs in Hugging Face format, built offline, for tests, CI and demos.

The folder that ``build_tiny_model`` writes loads through the same code paths as a Hub model:
``mlx_lm.load(str(path))``, ``AutoModelForCausalLM.from_pretrained(path)`` and
``AutoTokenizer.from_pretrained(path)``. Only numpy, safetensors, tokenizers and transformers
(for its config classes) are needed to build one; mlx-lm only for ``quantize_bits``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from autocurricula.engine.models import register
from autocurricula.files import atomic_write

MARKER = "autocurricula_tiny.json"
_ROPE_THETA = 10000.0
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's split pattern: single digits, words with one leading non-letter, newline runs.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_WORDS = (  # plus random syllable words and numbers: enough merges for vocabularies up to ~64k
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how said "
    "an each she which do their time if will way about many then them write would like so these "
    "her long make thing see him two has look more day could go come did number no most people my "
    "over know than call first who may down side been now find game player move plays wins loses "
    "draw board turn score round match league win lose yes again answer question think because "
    "user assistant system hello world rock paper scissors left right red blue green X O"
).split()
_SYLLABLES = "ka lo mi ra tu sen dor el ish an vor qu th ing er pla ce mo ve zi pe gu ny ox".split()


def build_tiny_model(
    path,
    *,
    model_type="llama",
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=None,
    intermediate_size=512,
    vocab_size=1024,
    max_position_embeddings=2048,
    seed=0,
    quantize_bits=None,
    overwrite=False,
) -> Path:
    """Write a small randomly initialised causal LM to ``path`` and return ``Path(path)``.

    ``model_type`` is ``"llama"`` or ``"qwen2"`` (which adds q/k/v biases). The folder holds
    ``config.json``, float32 ``model.safetensors``, a byte-level BPE ``tokenizer.json`` with
    exactly ``vocab_size`` entries (``<|endoftext|>`` = 0 is pad, ``<|im_start|>`` = 1,
    ``<|im_end|>`` = 2 is the chat eos), a ChatML ``chat_template`` in ``tokenizer_config.json``,
    ``generation_config.json`` (eos ``[<|im_end|>, <|endoftext|>]``) and a marker file.

    Weights come from ``numpy.random.default_rng(seed)``: equal arguments give byte-identical
    weights. With ``quantize_bits`` (4 or 8) the float model is converted with mlx-lm's
    ``convert`` (what ``mlx_lm.convert -q --q-group-size 64`` does) and ``path`` holds only the
    MLX-quantized model, which mlx-lm loads and transformers does not.

    A folder already holding a model built with the same arguments is returned as is, unless
    ``overwrite``. The model is built in a temporary folder next to ``path`` and renamed into
    place, with the marker written last, so an interrupted build never looks complete. A
    non-empty folder that is not a tiny model is only replaced with ``overwrite=True``.
    """
    path = Path(path)
    spec = {
        # Any edit of this file invalidates cached models (a rebuild takes about a second).
        "builder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16],
        "model_type": model_type,
        "hidden_size": int(hidden_size),
        "num_layers": int(num_layers),
        "num_heads": int(num_heads),
        "num_kv_heads": int(num_kv_heads or num_heads),
        "intermediate_size": int(intermediate_size),
        "vocab_size": int(vocab_size),
        "max_position_embeddings": int(max_position_embeddings),
        "seed": int(seed),
        "quantize_bits": int(quantize_bits) if quantize_bits else None,
    }
    _validate(spec)
    if not overwrite and _is_complete(path, spec):
        return path
    foreign = path.exists() and (not path.is_dir() or any(path.iterdir()))
    if foreign and not overwrite and _read_marker(path) is None:
        raise FileExistsError(f"{path} exists and is not a tiny model; pass overwrite=True")

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        out = tmp / "model"
        _write_hf_model(out, spec)
        if spec["quantize_bits"]:
            out = _quantize(out, tmp / "quantized", spec["quantize_bits"])
        _write_json(out / MARKER, spec)  # last: its presence means the folder is complete
        _move_into_place(out, path, spec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _validate(spec):
    if spec["model_type"] not in ("llama", "qwen2"):
        raise ValueError(f"model_type must be 'llama' or 'qwen2', not {spec['model_type']!r}")
    if spec["hidden_size"] % spec["num_heads"] or spec["num_heads"] % spec["num_kv_heads"]:
        raise ValueError("hidden_size must divide by num_heads, num_heads by num_kv_heads")
    if (spec["hidden_size"] // spec["num_heads"]) % 2:  # RoPE rotates pairs of dimensions
        raise ValueError(f"head size hidden_size / num_heads = {spec['hidden_size'] // spec['num_heads']} must be even "
                         "for RoPE; use fewer heads or a wider model")
    if spec["vocab_size"] < 256 + len(SPECIAL_TOKENS) + 16:
        raise ValueError("vocab_size must leave room for the 256 byte tokens and some merges")
    if spec["quantize_bits"] not in (None, 2, 3, 4, 5, 6, 8):
        raise ValueError(f"unsupported quantize_bits {spec['quantize_bits']}")
    if spec["quantize_bits"] and any(spec[k] % 64 for k in ("hidden_size", "intermediate_size")):
        raise ValueError("quantizing with group size 64 needs hidden/intermediate sizes % 64 == 0")


def _is_complete(path, spec):
    files = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    return _read_marker(path) == spec and all((path / f).is_file() for f in files)


def _read_marker(path):
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_json(file, obj):
    atomic_write(file, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _move_into_place(src, dst, spec):
    old = None
    if dst.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
        os.replace(dst, old / "model")
    try:
        os.rename(src, dst)
    except OSError:
        if not _is_complete(dst, spec):  # else a concurrent build of the same model won
            if old is not None and not dst.exists():
                os.replace(old / "model", dst)
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_hf_model(out, spec):
    out.mkdir()
    _write_tokenizer(out, spec["vocab_size"], spec["max_position_embeddings"])
    _write_configs(out, spec)
    save_file(_init_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})


def _corpus(n_lines):
    rng = random.Random(1234)  # fixed: the tokenizer depends on vocab_size only, not on seed
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(3, 12)):
            r = rng.random()
            if r < 0.6:
                words.append(rng.choice(_WORDS))
            elif r < 0.85:
                words.append("".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))))
            else:
                words.append(str(rng.randint(0, 999)))
        sep = rng.choice([". ", "! ", "? ", ", ", ": ", "\n", "\n\n"])
        lines.append(" ".join(words).capitalize() + sep)
    return ["".join(lines[i : i + 8]) for i in range(0, n_lines, 8)]


def _write_tokenizer(out, vocab_size, max_length):
    # tokenizers: only when a model is built (importing this module stays light)
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # transformers 5 loads model_type qwen2 with Qwen2Tokenizer whatever tokenizer_class says,
    # and that class rebuilds normalizer and pre-tokenizer itself. Using exactly its pipeline
    # (NFC, the split regex, ByteLevel without regex) keeps AutoTokenizer and tokenizer.json
    # in agreement. All 256 bytes are in the alphabet, so any text encodes (no unk token).
    tok.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    # A bare ByteLevel decoder makes mlx-lm pick its BPEStreamingDetokenizer, which drops the
    # leading space of the first token (" X" streams as "X"). Wrapped in a Sequence, mlx-lm uses
    # NaiveStreamingDetokenizer, which re-decodes with tokenizer.decode and so matches it exactly.
    tok.decoder = decoders.Sequence([decoders.ByteLevel()])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_corpus(max(2000, 3 * vocab_size)), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"the built-in corpus only yields {tok.get_vocab_size()} tokens")
    tok.save(str(out / "tokenizer.json"))
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    extra = {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    _write_json(out / "special_tokens_map.json", {**special, **extra})
    # Written by hand, not by save_pretrained: transformers 5 would record tokenizer_class
    # "TokenizersBackend", which transformers 4 does not know.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{"bos_token": None, "unk_token": None, **special, **extra},
        "add_bos_token": False,
        "add_eos_token": False,
        # Keeps " ," intact, so decode() is an exact inverse of encode().
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)


def _write_configs(out, spec):
    from transformers import AutoConfig, GenerationConfig  # transformers: only when a model is built

    eos, pad = SPECIAL_TOKENS.index("<|im_end|>"), SPECIAL_TOKENS.index("<|endoftext|>")
    AutoConfig.for_model(
        spec["model_type"], hidden_size=spec["hidden_size"], num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"], num_key_value_heads=spec["num_kv_heads"],
        intermediate_size=spec["intermediate_size"], vocab_size=spec["vocab_size"],
        max_position_embeddings=spec["max_position_embeddings"], rope_theta=_ROPE_THETA,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
        pad_token_id=pad, dtype="float32",
    ).save_pretrained(out)
    GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad).save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    # transformers 5 keeps rope_theta only inside rope_parameters; mlx-lm reads the top-level
    # key and silently falls back to its own default otherwise (1e6 for qwen2).
    config["rope_theta"] = _ROPE_THETA
    # mlx-lm's qwen2 defaults to tied embeddings, so never leave this implicit.
    config["tie_word_embeddings"] = False
    _write_json(out / "config.json", config)


def _init_weights(spec):
    rng = np.random.default_rng(spec["seed"])
    h, inter, vocab = spec["hidden_size"], spec["intermediate_size"], spec["vocab_size"]
    hd = h // spec["num_heads"]
    q_dim, kv_dim = spec["num_heads"] * hd, spec["num_kv_heads"] * hd

    def normal(shape, std):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def linear(n_out, n_in):
        # Fan-in scaling rather than HF's flat 0.02: at these widths 0.02 gives near-uniform
        # attention and next-token distributions, which hide RoPE/config mistakes in parity tests.
        return normal((n_out, n_in), n_in**-0.5)

    w = {"model.embed_tokens.weight": normal((vocab, h), 1.0)}
    for i in range(spec["num_layers"]):
        p = f"model.layers.{i}."
        for name, n_out in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            w[f"{p}self_attn.{name}_proj.weight"] = linear(n_out, h)
            if spec["model_type"] == "qwen2":
                w[f"{p}self_attn.{name}_proj.bias"] = normal((n_out,), 0.1)
        w[f"{p}self_attn.o_proj.weight"] = linear(h, q_dim)
        w[f"{p}mlp.gate_proj.weight"] = linear(inter, h)
        w[f"{p}mlp.up_proj.weight"] = linear(inter, h)
        w[f"{p}mlp.down_proj.weight"] = linear(h, inter)
        w[f"{p}input_layernorm.weight"] = np.ones(h, np.float32)
        w[f"{p}post_attention_layernorm.weight"] = np.ones(h, np.float32)
    w["model.norm.weight"] = np.ones(h, np.float32)
    # Logit std ~2 after the final norm: peaked but far from one-hot next-token distributions.
    w["lm_head.weight"] = normal((vocab, h), 2.0 * h**-0.5)
    return w


def _quantize(src, dst, bits):
    from mlx_lm.convert import convert  # mlx_lm (mlx, transformers): only when a quantized model is built

    register()  # families mlx-lm lacks (OPT) convert through their definitions here
    with contextlib.redirect_stdout(io.StringIO()):  # convert prints progress lines
        convert(str(src), str(dst), quantize=True, q_bits=bits, q_group_size=64, dtype="float32")
    # convert re-saves the tokenizer through transformers (see _write_tokenizer): keep ours.
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(src / name, dst / name)
    return dst


# Tiny random models of each model family, built with transformers from a config.
_FAMILY_SIZE = dict(hidden=64, layers=2, heads=4, inter=128, vocab=512, positions=512)
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3", "olmo2", "gemma2", "gemma3_text", "lfm2",
               "qwen3_5_text")
FAMILIES = {  # family -> (model_type, config overrides); see docs/models.md
    "opt": ("opt", {}),
    "gpt2": ("gpt2", {}),
    "gpt_neox": ("gpt_neox", {"rotary_pct": 0.25, "intermediate_size": 4 * 64}),  # mlx-lm's MLP is 4x wide
    "llama": ("llama", {}),
    "mistral": ("mistral", {"sliding_window": None}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "phi3": ("phi3", {}),
    "smollm3": ("smollm3", {}),
    "olmo2": ("olmo2", {}),
    "mistral_window": ("mistral", {"sliding_window": 64}),
    "phi3_window": ("phi3", {"sliding_window": 64}),
    "gemma2": ("gemma2", {"head_dim": 16, "sliding_window": 64}),
    "gemma3": ("gemma3_text", {"head_dim": 16, "sliding_window": 64}),
    # hybrids: one recurrent layer and one attention layer each
    "qwen3_5": ("qwen3_5_text", {"head_dim": 16, "layer_types": ["linear_attention", "full_attention"]}),
    "lfm2": ("lfm2", {"layer_types": ["conv", "full_attention"]}),
}


def build_family_model(path, family: str, *, seed: int = 0, quantize_bits: int | None = None,
                       overwrite: bool = False) -> Path:
    """Write a tiny random model of ``family`` (a key of :data:`FAMILIES`) to ``path``, built by
    transformers from a config (``AutoModelForCausalLM.from_config``) with the byte-level BPE
    tokenizer of :func:`build_tiny_model`; returns ``Path(path)``.

    Hidden size 64, 2 layers, 4 heads, vocabulary 512, 512 positions, float32. Weights are drawn
    from ``torch.manual_seed(seed)`` at fan-in scale (peaked next-token distributions, so greedy
    parity tests see real differences). ``quantize_bits`` converts the result with mlx-lm as
    :func:`build_tiny_model` does. A folder already holding the same model is reused.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    path = Path(path)
    spec = {"builder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16], "family": family,
            "seed": int(seed), "quantize_bits": int(quantize_bits) if quantize_bits else None}
    if not overwrite and _is_complete(path, spec):
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite and _read_marker(path) is None:
        raise FileExistsError(f"{path} exists and is not a tiny model; pass overwrite=True")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        out = tmp / "model"
        out.mkdir()
        _write_tokenizer(out, _FAMILY_SIZE["vocab"], _FAMILY_SIZE["positions"])
        _write_family_model(out, family, seed)
        if spec["quantize_bits"]:
            out = _quantize(out, tmp / "quantized", spec["quantize_bits"])
        _write_json(out / MARKER, spec)
        _move_into_place(out, path, spec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def family_config(family: str):
    """The transformers config of :func:`build_family_model`'s ``family`` model."""
    from transformers import AutoConfig  # transformers: only when a model is built, not on import

    model_type, extra = FAMILIES[family]
    s = _FAMILY_SIZE
    eos, pad = SPECIAL_TOKENS.index("<|im_end|>"), SPECIAL_TOKENS.index("<|endoftext|>")
    common = dict(vocab_size=s["vocab"], bos_token_id=None, eos_token_id=eos, pad_token_id=pad, dtype="float32")
    if model_type == "opt":
        sizes = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                     ffn_dim=s["inter"], word_embed_proj_dim=s["hidden"], max_position_embeddings=s["positions"])
    elif model_type == "gpt2":
        sizes = dict(n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"], n_positions=s["positions"])
    else:
        sizes = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                     intermediate_size=s["inter"], max_position_embeddings=s["positions"])
        if model_type in _LLAMA_LIKE:
            sizes["num_key_value_heads"] = s["heads"] // 2  # grouped-query attention, as the real ones
    return AutoConfig.for_model(model_type, **{**sizes, **common, **extra})


def _to_hub_gpt2_layout(file):
    # the Hub's GPT-2 checkpoints are saved from GPT2Model: no "transformer." prefix, no tied
    # lm_head copy; mlx-lm reads only that layout
    w = load_file(str(file))
    w = {k.removeprefix("transformer."): v for k, v in w.items() if k != "lm_head.weight"}
    save_file(w, str(file), metadata={"format": "pt"})


def _write_family_model(out, family, seed):
    # torch and transformers: only when a family model is built
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = family_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # fan-in scale rather than HF's flat 0.02 (see _init_weights); norms keep their ones
            if p.ndim == 2:
                p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    if config.model_type == "gpt2":
        _to_hub_gpt2_layout(out / "model.safetensors")
    eos, pad = config.eos_token_id, config.pad_token_id
    GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad).save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    # mlx-lm reads rope_theta at the top level only (see _write_configs)
    rope = saved.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in saved:
        saved["rope_theta"] = rope["rope_theta"]
    saved["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", False))
    # keys the Hub's GPT-2 and Pythia configs carry and mlx-lm requires, which transformers 5
    # no longer writes
    if saved["model_type"] == "gpt2":
        saved["n_ctx"] = saved["n_positions"]
    if saved["model_type"] == "lfm2":
        saved["block_dim"] = saved["hidden_size"]
    if saved["model_type"] == "gpt_neox":
        saved["rotary_emb_base"] = rope.get("rope_theta", _ROPE_THETA)
        saved["rotary_pct"] = rope.get("partial_rotary_factor", 1.0)
    _write_json(out / "config.json", saved)
