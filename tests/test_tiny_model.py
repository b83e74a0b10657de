"""The tiny model builder: loading through mlx-lm and transformers, parity, tokenizer, cache."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest

import autocurricula  # noqa: F401  (preloads BLAS before mlx is imported)
from autocurricula.engine.tiny import MARKER, build_tiny_model

MODEL_TYPES = ["llama", "qwen2"]
TEXTS = [
    "hello world",
    " X plays 5",
    "  two leading spaces, then digits 0123456789 and 3.14159!",
    "Line one\nline two\n\n\ttabbed\r\nwindows line",
    "Ünïcödé: café, naïve, 日本語, Ελληνικά, emoji 🎉🧩 and a ,b",
    "<|im_start|>user\nplay<|im_end|>\n",
    "",
]
MESSAGES = [
    {"role": "system", "content": "You play tic-tac-toe."},
    {"role": "user", "content": "Board: X . O\nYour move?"},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {mt: build_tiny_model(root / mt, model_type=mt) for mt in MODEL_TYPES}


@pytest.fixture(scope="module")
def mlx_loaded(models):
    import mlx_lm

    return {mt: mlx_lm.load(str(path)) for mt, path in models.items()}


def test_import_is_light():
    code = "import sys, autocurricula.engine.tiny; print(sorted({'mlx', 'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_folder_layout_and_config(models, model_type):
    path = models[model_type]
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "special_tokens_map.json", MARKER} <= names
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "temp dirs left"
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == model_type
    assert config["rope_theta"] == 10000.0  # top level, for mlx-lm
    assert config["tie_word_embeddings"] is False
    assert config["eos_token_id"] == 2
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [2, 0]

    from safetensors.numpy import load_file

    weights = load_file(str(path / "model.safetensors"))
    assert all(w.dtype == np.float32 for w in weights.values())
    assert weights["lm_head.weight"].shape == (1024, 256)
    assert ("model.layers.0.self_attn.q_proj.bias" in weights) == (model_type == "qwen2")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_mlx_load_and_generate(mlx_loaded, model_type):
    import mlx_lm

    model, tokenizer = mlx_loaded[model_type]
    assert model.args.rope_theta == 10000.0 and model.args.tie_word_embeddings is False
    assert len(tokenizer) == 1024 and tokenizer.eos_token_ids == {0, 2}
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=8)
    assert isinstance(text, str) and text


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_torch_and_mlx_logits_agree(models, mlx_loaded, model_type):
    torch = pytest.importorskip("torch")
    import mlx.core as mx
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models[model_type])
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    ids += tokenizer.encode(" X plays 5 and then O plays 7", add_special_tokens=False)
    hf = AutoModelForCausalLM.from_pretrained(models[model_type], dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    model, _ = mlx_loaded[model_type]
    got = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    diff = float(np.abs(ref - got).max())
    print(f"{model_type}: {len(ids)} tokens, max |torch - mlx| logit diff = {diff:.3g}")
    assert diff <= 1e-4
    # Not degenerate: clearly non-uniform, position-dependent next-token distributions.
    probs = np.exp(got - got.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    entropy = -(probs * np.log(probs)).sum(-1)
    assert entropy.max() < np.log(1024) - 0.5 and probs.max(-1).min() > 0.01
    assert len(set(got.argmax(-1).tolist())) > 1


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_tokenizers_agree(models, mlx_loaded, model_type):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(models[model_type])
    raw = Tokenizer.from_file(str(models[model_type] / "tokenizer.json"))
    _, wrapped = mlx_loaded[model_type]
    assert len(auto) == raw.get_vocab_size() == 1024
    for text in TEXTS + ["cafe\u0301 (decomposed)"]:
        ids = raw.encode(text).ids
        assert auto.encode(text, add_special_tokens=False) == ids, text
        assert auto(text)["input_ids"] == ids, text
        assert wrapped.encode(text) == ids, text
    for text in TEXTS:  # NFC text round-trips exactly
        ids = raw.encode(text).ids
        assert auto.decode(ids) == wrapped.decode(ids) == raw.decode(ids, skip_special_tokens=False) == text
    assert raw.encode("<|im_start|><|im_end|><|endoftext|>").ids == [1, 2, 0]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_chat_template(models, mlx_loaded, model_type):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(models[model_type])
    _, wrapped = mlx_loaded[model_type]
    text = auto.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou play tic-tac-toe.<|im_end|>\n"
        "<|im_start|>user\nBoard: X . O\nYour move?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert wrapped.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == text
    ids = wrapped.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert ids == auto.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    assert ids == auto.encode(text, add_special_tokens=False)
    suffix = auto.encode("<|im_start|>assistant\n")
    assert ids[:1] == [1] and ids[-len(suffix) :] == suffix


def _stream(detokenizer, ids):
    pieces = []
    for token in ids:
        detokenizer.add_token(token)
        pieces.append(detokenizer.last_segment)  # read after every token, as servers do
    detokenizer.finalize()
    pieces.append(detokenizer.last_segment)
    assert "".join(pieces) == detokenizer.text
    return detokenizer.text


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_streaming_detokenizer_matches_decode(mlx_loaded, model_type):
    _, tokenizer = mlx_loaded[model_type]
    for text in TEXTS + [" leading space", "\n\nnewlines first", "end with space "]:
        ids = tokenizer.encode(text)
        assert _stream(tokenizer.detokenizer, ids) == tokenizer.decode(ids) == text
    rng = random.Random(0)
    for _ in range(50):  # arbitrary ids, incl. split multi-byte characters and special tokens
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 48))]
        assert _stream(tokenizer.detokenizer, ids) == tokenizer.decode(ids)


SMALL = dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, vocab_size=512)


def test_deterministic_rebuild(tmp_path):
    path = build_tiny_model(tmp_path / "m", **SMALL)
    first = {f: (path / f).read_bytes() for f in ("model.safetensors", "tokenizer.json")}
    build_tiny_model(path, overwrite=True, **SMALL)
    assert {f: (path / f).read_bytes() for f in first} == first
    other = build_tiny_model(tmp_path / "other", seed=1, **SMALL)
    assert (other / "model.safetensors").read_bytes() != first["model.safetensors"]
    assert (other / "tokenizer.json").read_bytes() == first["tokenizer.json"]


def test_cache_and_overwrite(tmp_path):
    path = build_tiny_model(tmp_path / "m", **SMALL)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(str(path), **SMALL) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_model(path, overwrite=True, **SMALL)
    assert (path / "model.safetensors").stat().st_mtime_ns != stamp
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    build_tiny_model(path, **{**SMALL, "seed": 3})  # other arguments: rebuilt in place
    assert (path / "model.safetensors").stat().st_mtime_ns != stamp
    assert json.loads((path / MARKER).read_text())["seed"] == 3
    (path / MARKER).unlink()  # an incomplete or foreign folder is never reused or clobbered
    with pytest.raises(FileExistsError):
        build_tiny_model(path, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized(tmp_path, models, mlx_loaded, bits):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm

    path = build_tiny_model(tmp_path / f"q{bits}", quantize_bits=bits)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"]["bits"] == bits and config["rope_theta"] == 10000.0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (models["llama"] / name).read_bytes()
    model, tokenizer = mlx_lm.load(str(path))
    linears = [m for _, m in model.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    assert linears and all(isinstance(m, nn.QuantizedLinear) and m.bits == bits for m in linears)
    float_model, _ = mlx_loaded["llama"]
    ids = mx.array([tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)])
    q, f = np.array(model(ids)[0]), np.array(float_model(ids)[0])
    corr = np.corrcoef(q.ravel(), f.ravel())[0, 1]
    agree = (q.argmax(-1) == f.argmax(-1)).mean()
    in_top5 = (np.argsort(-q, -1)[:, :5] == f.argmax(-1)[:, None]).any(-1).mean()
    print(f"{bits}-bit vs float32 logits: corr {corr:.4f}, argmax agree {agree:.2f}, top-5 {in_top5:.2f}")
    # A random model has many near-tied candidates, so 4-bit noise flips plain argmax often.
    assert (corr > 0.9 and in_top5 >= 0.8) if bits == 4 else (corr > 0.999 and in_top5 >= 0.95)
    assert build_tiny_model(path, quantize_bits=bits) == path  # cached


def test_failed_build_leaves_old_model_and_no_debris(tmp_path, monkeypatch):
    import autocurricula.engine.tiny as tiny

    path = build_tiny_model(tmp_path / "m", **SMALL)
    before = (path / "model.safetensors").read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny, "_init_weights", killed)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_model(path, overwrite=True, **SMALL)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_model(tmp_path / "new", **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert (path / "model.safetensors").read_bytes() == before


def test_bad_shapes_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="divide by num_heads"):
        build_tiny_model(tmp_path / "a", **{**SMALL, "num_heads": 3})
    with pytest.raises(ValueError, match="must be even for RoPE"):  # mlx's rope would fail later, obscurely
        build_tiny_model(tmp_path / "b", **{**SMALL, "num_heads": 64})
    assert not any(tmp_path.iterdir())
