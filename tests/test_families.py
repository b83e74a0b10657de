"""The model-family conformance matrix: for each family, a tiny random model built by
transformers from a config, run through every check of ``autocurricula check-model``.

Default tier: llama, OPT (the seed's model), Gemma 3 (sliding-window layers), LFM2 (recurrent
hybrid), a 4-bit llama and one refused family; the slow tier runs every family. docs/models.md shows the same table.
Folders saved by transformers 5 itself, and rewritten as transformers 4 wrote them
(tests/config_models.py), run the same checks: Phi-3 longrope in the default tier, Llama 3, OLMo 2
and StableLM in the slow one.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from autocurricula.publish.check_model import CHECKS, check_model, format_table  # noqa: E402
from autocurricula.engine.models import UnsupportedModelError, refusal  # noqa: E402
from autocurricula.engine.models.tree import FALLBACK  # noqa: E402
from autocurricula.engine.tiny import FAMILIES, build_family_model  # noqa: E402

SERVED = ["opt", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3", "olmo2",
          "mistral_window", "phi3_window", "gemma2", "gemma3", "qwen3_5", "lfm2"]
DEFAULT = {"llama", "opt", "gemma3", "lfm2"}  # plain, the seed's, sliding-window, recurrent hybrid


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def _params(names):
    return [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in names]


@pytest.mark.parametrize("family", _params(SERVED))
def test_family_passes_every_check(family, family_dir):
    results = check_model(build_family_model(family_dir / family, family))
    table = format_table(family, results)
    assert [r.name for r in results] == list(CHECKS), table
    tree = results[CHECKS.index("tree update")]
    if FAMILIES[family][0] in FALLBACK:  # updated per row, said by name (tests/test_tree_update.py)
        assert tree.ok is None and FAMILIES[family][0] in tree.detail, table
        results = [r for r in results if r is not tree]
    assert all(r.ok is True for r in results), table


# folders exactly as transformers 5's save_pretrained writes them (rotary settings only under
# rope_parameters), and rewritten as transformers 4 wrote them (tests/config_models.py): Phi-3
# longrope (Phi-3.5-mini, Phi-4-mini), Llama 3's llama3 scaling, OLMo 2's theta, StableLM's partial
# rotation inside rope_parameters
SAVED = ["phi3-longrope-4k", "llama-llama3", "olmo2-theta", "stablelm"]


@pytest.mark.parametrize("style", ["5", "4"])
@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == "phi3-longrope-4k" else pytest.mark.slow)
                                  for c in SAVED])
def test_folder_saved_by_transformers_passes_every_check(case, style, family_dir):
    from config_models import build, tokenizer_source

    path = build(family_dir / f"saved-{case}-v{style}", case, tokenizer_source(family_dir / "llama"), style)
    results = check_model(path)
    table = format_table(f"{case} (transformers {style} config)", results)
    assert all(r.ok is True for r in results), table


def test_quantized_copy_generates_and_trains(family_dir):
    path = build_family_model(family_dir / "llama-4bit", "llama", quantize_bits=4)
    results = {r.name: r for r in check_model(path)}
    table = format_table("llama-4bit", list(results.values()))
    for name in ("load", "generate", "multi-lora", "prefix cache", "update", "mlx export"):
        assert results[name].ok is True, table
    assert results["peft export"].ok is None, table  # no float weights for transformers to load


@pytest.mark.slow
def test_quantized_opt_generates_and_trains(family_dir):
    path = build_family_model(family_dir / "opt-4bit", "opt", quantize_bits=4)
    results = {r.name: r for r in check_model(path)}
    assert results["generate"].ok and results["update"].ok, format_table("opt-4bit", list(results.values()))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral_window", "phi3_window", "gemma2", "gemma3", "qwen3_5", "lfm2"])
def test_quantized_window_and_recurrent_families(family, family_dir):
    path = build_family_model(family_dir / f"{family}-4bit", family, quantize_bits=4)
    results = {r.name: r for r in check_model(path)}
    table = format_table(f"{family}-4bit", list(results.values()))
    for name in ("load", "generate", "multi-lora", "prefix cache", "update", "mlx export"):
        assert results[name].ok is True, table


def test_family_is_refused_by_name(family_dir, tmp_path):
    """A family with recurrent layers the matrix does not check (Qwen3-Next) is refused before
    any weight is read, with the reason and where to look."""
    import json
    import shutil

    from autocurricula.engine import Engine

    path = tmp_path / "qwen3_next"
    shutil.copytree(build_family_model(family_dir / "lfm2", "lfm2"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_next"}))
    with pytest.raises(UnsupportedModelError, match="recurrent") as err:
        Engine(str(path))
    assert "'qwen3_next'" in str(err.value) and "docs/models.md" in str(err.value)
    results = check_model(path)
    assert results[0].ok is False and "refused" in results[0].detail
    assert all(r.ok is None for r in results[1:])


def test_windows_covering_the_context_are_served():
    assert refusal({"model_type": "mistral", "sliding_window": None, "max_position_embeddings": 512}) is None
    assert refusal({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 4096}) is None
    assert refusal({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": False,
                    "max_position_embeddings": 512}) is None
    # a definition that masks its windows serves any window; one that does not is refused
    assert refusal({"model_type": "mistral", "sliding_window": 64, "max_position_embeddings": 512}) is None
    assert "sliding_window=64" in refusal({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True,
                                           "max_position_embeddings": 512})


def _logits_gap(model, reference) -> tuple[float, float]:
    """The largest difference between an MLX model's and a transformers model's logits on one
    prompt, and the largest transformers logit."""
    import mlx.core as mx
    import numpy as np
    import torch

    ids = [5, 77, 301, 12, 400, 44, 3, 250, 18, 140, 7, 99]
    ours = np.array(model(mx.array([ids]))[0])
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0].numpy()
    return float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())


@pytest.mark.parametrize("family", ["opt", "gpt_neox"])
def test_added_definitions_match_transformers_logits(family, family_dir):
    """The MLX definitions in autocurricula/engine/models/ (OPT, GPT-NeoX) on random float32 weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from autocurricula.engine.models import load

    path = build_family_model(family_dir / family, family)
    model, _ = load(str(path))
    gap, scale = _logits_gap(model, AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval())
    # float32 rounding through 2 layers, scaled by the logits' size; mlx-lm's own GPT-NeoX, with
    # the tanh GELU for the config's exact one, is ~8e-4 away
    assert gap <= 1e-5 * max(1.0, scale)


@pytest.mark.parametrize("options", [
    {},  # transformers' defaults: a 4x MLP, biases, exact GELU, rotary settings under rope_parameters
    {"intermediate_size": 96, "attention_bias": False, "hidden_act": "gelu_new", "use_parallel_residual": False},
], ids=["defaults", "narrow-mlp-no-bias-tanh-gelu-sequential"])
def test_gpt_neox_reads_the_config_as_transformers_does(options, tmp_path):
    import torch
    from mlx_lm.utils import load_model
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from autocurricula.engine.models import register

    config = GPTNeoXConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=128, **{"intermediate_size": 256, **options})
    torch.manual_seed(0)
    reference = GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():  # fan-in scale, so the logits are far from uniform
        for name, p in reference.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    reference.save_pretrained(tmp_path)  # as transformers writes it: no rotary_emb_base or rotary_pct
    register()
    model, _ = load_model(tmp_path)
    gap, scale = _logits_gap(model, reference)
    assert gap <= 1e-5 * max(1.0, scale)


def test_seed_snippet_trains_an_opt_folder(family_dir, tmp_path):
    """The seed's ``SelfPlayTrainer().train("facebook/opt-125m", play)`` with an OPT folder (and a
    one-round config, for time)."""
    from toy_games import seed_style

    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    path = build_family_model(family_dir / "opt", "opt")
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 4},
                                       output_dir=str(tmp_path / "run"), progress=False))
    t.train(str(path), seed_style)
    assert t.engine.adapter_weights(t.players[0]["id"]).modules
    t.engine.close()
