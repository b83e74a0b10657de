"""The model-family conformance matrix: for each family, a tiny random model built by
transformers from a config, run through every check of ``autocurricula check-model``.

Default tier: llama, OPT (the seed's model), a 4-bit llama and one refused family; the slow
tier runs every family. docs/models.md shows the same table.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from autocurricula.check_model import CHECKS, check_model, format_table  # noqa: E402
from autocurricula.engine.models import UnsupportedModelError, refusal  # noqa: E402
from autocurricula.tiny import FAMILIES, build_family_model  # noqa: E402

SERVED = ["opt", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3", "olmo2"]
REFUSED = {"mistral_window": "sliding_window", "gemma2": "sliding-window", "gemma3": "sliding-window",
           "qwen3_5": "recurrent", "lfm2": "recurrent"}
DEFAULT = {"llama", "opt"}
# checks a family fails for a reason outside the engine: mlx-lm's GPT-NeoX MLP applies the tanh
# GELU where the config (and transformers) ask for the exact one, so even the base logits differ
# by ~1e-3; the exported adapter itself adds nothing to that (tests/test_export.py)
KNOWN_GAPS = {"gpt_neox": {"peft export"}}


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
    for r in results:
        if r.name in KNOWN_GAPS.get(family, ()):
            assert r.ok is False, table  # a gap that closes should leave this list
            continue
        assert r.ok is True, table


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


@pytest.mark.parametrize("family", [pytest.param(n, marks=() if n == "gemma3" else pytest.mark.slow)
                                    for n in REFUSED])
def test_family_is_refused_by_name(family, family_dir):
    from autocurricula.engine import Engine

    path = build_family_model(family_dir / family, family)
    with pytest.raises(UnsupportedModelError, match=REFUSED[family]) as err:
        Engine(str(path))
    model_type = FAMILIES[family][0]
    assert repr(model_type) in str(err.value) and "docs/models.md" in str(err.value)
    results = check_model(path)
    assert results[0].ok is False and "refused" in results[0].detail
    assert all(r.ok is None for r in results[1:])


def test_windows_covering_the_context_are_served():
    assert refusal({"model_type": "mistral", "sliding_window": None, "max_position_embeddings": 512}) is None
    assert refusal({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 4096}) is None
    assert refusal({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": False,
                    "max_position_embeddings": 512}) is None
    assert "sliding_window=64" in refusal({"model_type": "mistral", "sliding_window": 64,
                                           "max_position_embeddings": 512})


def test_opt_logits_match_transformers(family_dir):
    import mlx.core as mx
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from autocurricula.engine.models import load

    path = build_family_model(family_dir / "opt", "opt")
    model, _ = load(str(path))
    ids = [5, 77, 301, 12, 400, 44, 3, 250, 18, 140, 7, 99]
    ours = np.array(model(mx.array([ids]))[0])
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0].numpy()
    # float32 rounding through 2 layers, scaled by the logits' size
    assert np.abs(ours - theirs).max() <= 1e-5 * max(1.0, np.abs(theirs).max())


def test_seed_snippet_trains_an_opt_folder(family_dir, tmp_path):
    """The seed's ``SelfPlayTrainer().train("facebook/opt-125m", play)`` with an OPT folder (and a
    one-round config, for time)."""
    from toy_games import seed_style

    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    path = build_family_model(family_dir / "opt", "opt")
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, games_per_round=4, output_dir=str(tmp_path / "run"),
                                       progress=False))
    t.train(str(path), seed_style)
    assert t.engine.adapter_weights(t.players[0]["id"]).modules
    t.engine.close()
