"""One config reader (autocurricula/engine/models/config.py) and transformers' rotary embeddings
(autocurricula/engine/models/rope.py), checked against the installed transformers.

Every model here is built from transformers' own config class and saved by its own
``save_pretrained`` (tests/config_models.py), then also rewritten as transformers 4 wrote it:
both styles must read the same, load, and give transformers' logits within the tolerance of
tests/test_families.py (1e-5 times the largest logit), for prompts shorter and longer than the
lengths at which longrope, yarn and dynamic rotations change. Keys that change the model and
that the engine's definition does not read are refused by name, at load, in every entry point.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")

from config_models import CASES, build, config_of, to_v4, tokenizer_source  # noqa: E402

from autocurricula.engine.models import UnsupportedModelError, read_config  # noqa: E402
from autocurricula.engine.models.config import (  # noqa: E402
    FAMILIES, METADATA, ROPE_KEYS, WINDOW_KEYS, _LEGACY, _schema, _training_only, rope_parameters,
    transformers_reads)

PROMPTS = (20, 48)  # below and above original_max_position_embeddings=32 (longrope, yarn), a dynamic limit of 32


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    tokenizer = tokenizer_source(root / "tokenizer")
    return lambda case, style="5": build(root / f"{case}-v{style}", case, tokenizer, style)


def _saved_config(case: str, tmp_path, style: str) -> dict:
    config_of(case).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    return to_v4(saved) if style == "4" else saved


def _ids(n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(n).integers(3, 500, n)]


def _logits(model, ids):
    import mlx.core as mx

    return np.array(model(mx.array([ids]))[0])


def _reference(folder):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def _reference_logits(reference, ids):
    import torch

    with torch.no_grad():
        return reference(torch.tensor([ids])).logits[0].numpy()


# -- the rotation, frequency by frequency ------------------------------------------------------


@pytest.mark.parametrize("case", ["llama-linear", "llama-dynamic", "llama-llama3", "llama-yarn", "llama-yarn-options",
                                  "llama-yarn-mscale", "phi3-longrope", "phi3-longrope-partial"])
@pytest.mark.parametrize("seq_len", [None, 20, 48])
def test_inverse_frequencies_are_transformers(case, seq_len):
    """rope.inverse_frequencies against transformers' ROPE_INIT_FUNCTIONS, for the sequence
    lengths on both sides of where dynamic and longrope change their frequencies."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from autocurricula.engine.models.rope import inverse_frequencies

    config = config_of(case)
    params = rope_parameters(config.to_dict())
    dim = int(16 * params.get("partial_rotary_factor", 1.0))
    want, want_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](
        config, "cpu", seq_len=None if seq_len is None else torch.tensor(seq_len))
    got, scale = inverse_frequencies(params, dim, config.max_position_embeddings, seq_len)
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-7, atol=0)
    assert scale == pytest.approx(float(want_scale), rel=1e-7)


# -- the config reader -------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["5", "4"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_parameters_are_read_as_transformers_reads_them(case, style, tmp_path):
    """The canonical rope parameters of a config of either style are those transformers' own
    config class standardises it to."""
    from transformers import AutoConfig

    saved = _saved_config(case, tmp_path / "saved", style)
    (tmp_path / "saved" / "config.json").write_text(json.dumps(saved))
    theirs = getattr(AutoConfig.from_pretrained(tmp_path / "saved"), "rope_parameters", None)
    ours = rope_parameters(saved)
    if theirs is None or not theirs:
        assert ours is None
        return

    def clean(d):
        return {k: v for k, v in d.items() if k != "type" and v is not None}

    if "full_attention" in ours:
        assert {k: clean(v) for k, v in ours.items()} == {k: clean(theirs[k]) for k in ours}
    else:
        assert clean(ours) == clean(theirs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_styles_give_the_definition_the_same_arguments(case, tmp_path):
    """What the engine's definition is built from (its ModelArgs) is the same for the
    transformers 5 config and its transformers 4 rewrite."""
    from mlx_lm.utils import _get_classes

    v5 = _saved_config(case, tmp_path / "v5", "5")
    v4 = to_v4(v5)  # the same as v5 for OPT, which has no rotary settings or renamed keys
    _, args_class = _get_classes(v5)
    assert args_class.from_dict(read_config(v5)) == args_class.from_dict(read_config(v4))


def test_the_reader_is_pure():
    config = config_of("phi3-longrope").to_dict()
    before = json.dumps(config, sort_keys=True)
    first, second = read_config(config), read_config(config)
    assert json.dumps(config, sort_keys=True) == before and first == second and first is not config


# -- loaded models against transformers ---------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_in_both_styles(case, models):
    """The folder transformers 5 writes, and its transformers 4 rewrite, load in the engine and
    give transformers' logits on prompts of 20 and 48 tokens."""
    from autocurricula.engine.models import load

    for style in ("5", "4"):
        folder = models(case, style)
        model, _ = load(str(folder))
        reference = _reference(folder)
        for n in PROMPTS:
            ids = _ids(n)
            theirs = _reference_logits(reference, ids)
            gap = float(np.abs(_logits(model, ids) - theirs).max())
            assert gap <= 1e-5 * max(1.0, float(np.abs(theirs).max())), (case, style, n, gap)
            if style == "4":  # the rewrite is the same model to transformers
                np.testing.assert_allclose(theirs, _reference_logits(_reference(models(case, "5")), ids), atol=1e-5)


def test_mlx_lm_alone_reads_these_folders_wrong(models):
    """Why the reader exists: mlx-lm's own loader ignores rope_parameters (Llama 3's scaling, OLMo 2's
    theta, Phi-3's longrope). After register(), a Hub-style (rope_scaling) Phi-3 longrope folder
    is computed as transformers does by autocurricula's Phi-3 definition."""
    from mlx_lm import load as mlx_load

    from autocurricula.engine.models import register

    register()
    ids = _ids(20)
    for case in ("llama-llama3", "olmo2-theta", "phi3-longrope"):
        folder = models(case)
        gap = np.abs(_logits(mlx_load(str(folder))[0], ids) - _reference_logits(_reference(folder), ids)).max()
        assert gap > 0.1, case
    for n in PROMPTS:
        folder = models("phi3-longrope-partial", "4")
        theirs = _reference_logits(_reference(folder), _ids(n))
        assert np.abs(_logits(mlx_load(str(folder))[0], _ids(n)) - theirs).max() <= 1e-5 * np.abs(theirs).max()


# -- lengths where the rotation changes ---------------------------------------------------------


def test_longrope_switch_with_a_cache_and_the_engine_limit(models):
    """Within original_max_position_embeddings a cached sequence is rotated with the short factors,
    as in one forward pass; crossing it on top of such a cache raises (transformers recomputes the
    cache there); the engine stops its context at the boundary and refuses a longer one."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from autocurricula.engine import Engine, EngineConfig
    from autocurricula.engine.models import load

    folder = models("phi3-longrope")
    model, _ = load(str(folder))
    assert model.rope_context_limit == 32
    ids = _ids(30)
    cache = make_prompt_cache(model)
    model(mx.array([ids[:10]]), cache=cache)
    stepped = np.array(model(mx.array([ids[10:]]), cache=cache)[0])
    np.testing.assert_allclose(stepped, _logits(model, ids)[10:], atol=1e-4)
    with pytest.raises(ValueError, match="original_max_position_embeddings=32"):
        model(mx.array([_ids(10)]), cache=cache)  # positions 30..39: past 32 on a short-factor cache
    long_cache = make_prompt_cache(model)  # one pass from position 0 may pass it: all long factors
    np.testing.assert_allclose(np.array(model(mx.array([_ids(48)]), cache=long_cache)[0]), _logits(model, _ids(48)),
                               atol=1e-4)

    engine = Engine(str(folder))
    try:
        assert engine.max_context == 32
    finally:
        engine.close()
    with pytest.raises(ValueError, match="max_context=64"):
        Engine(str(folder), config=EngineConfig(max_context=64))


def test_dynamic_rope_limits_the_engine_context(models):
    from autocurricula.engine import Engine

    engine = Engine(str(models("llama-dynamic")))
    try:
        assert engine.max_context == 32
    finally:
        engine.close()


def test_longrope_engine_generates_transformers_tokens(models):
    """A batch of left-padded rows (one rotation offset per row) gives transformers' greedy tokens."""
    import torch

    from autocurricula.engine import Engine, SamplingParams

    folder = models("phi3-longrope")
    reference = _reference(folder)
    engine = Engine(str(folder))
    try:
        prompts = [_ids(n) for n in (5, 12, 20)]
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        futures = [engine.submit(p, None, params) for p in prompts]
        for prompt, future in zip(prompts, futures):
            with torch.no_grad():
                want = reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                          pad_token_id=0)[0, len(prompt):].tolist()
            assert future.result(timeout=120).token_ids == want
    finally:
        engine.close()


# -- refusals ----------------------------------------------------------------------------------


def _llama_config() -> dict:
    return config_of("llama-default-theta").to_dict()


@pytest.mark.parametrize("change, named", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),  # transformers reads it, the definition computes with SiLU
    ({"rope_traditional": True}, "rope_traditional=True"),  # the definition reads it, transformers does not
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"rope_parameters": {"rope_type": "ntk-by-parts", "rope_theta": 1e4, "factor": 2.0}}, "'ntk-by-parts'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "low_freq_factor"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}},
     "rope_parameters per layer kind"),
    ({"head_dim": 32}, None),  # read by the definition: not refused
], ids=["fixed-value", "engine-only", "partial-rotary", "unknown-rope-type", "missing-rope-key", "per-layer-rope",
        "read"])
def test_keys_the_definition_does_not_read_are_refused_by_name(change, named):
    config = {**_llama_config(), **change}
    if named is None:
        assert read_config(config)["head_dim"] == 32
        return
    with pytest.raises(UnsupportedModelError) as err:
        read_config(config)
    assert named in str(err.value) and "'llama'" in str(err.value) and "What to do" in str(err.value)


def test_scaled_rope_on_a_family_that_does_not_apply_it_is_refused():
    config = {**config_of("mixtral").to_dict(), "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6,
                                                                    "factor": 4.0}}
    with pytest.raises(UnsupportedModelError, match="rope_type 'yarn' is not applied by the engine's definition "
                                                    "of 'mixtral'"):
        read_config(config)


def test_a_family_outside_the_matrix_is_refused_by_key():
    """Starcoder 2: mlx-lm defines it, the matrix does not check it; transformers reads keys its
    definition does not (its activation, its biases), so it is refused naming them."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("starcoder2").to_dict()
    with pytest.raises(UnsupportedModelError) as err:
        read_config(config)
    assert "hidden_act=" in str(err.value) and "'starcoder2'" in str(err.value)
    assert "not in the conformance matrix" in str(err.value)


def test_keys_neither_reads_are_served():
    """A key transformers' class of the family does not take (left by another tool) is ignored by
    transformers too: served. The same key on a family transformers has no class for is refused."""
    assert read_config({**_llama_config(), "full_attn_mod": 1, "lm_head_bias": False})
    with pytest.raises(UnsupportedModelError, match="full_attn_mod"):
        from autocurricula.engine.models.config import normalize

        normalize({"model_type": "not_in_transformers", "full_attn_mod": 1}, {"model_type": None})


# configs as the Hub's checkpoints carry them (abridged: long lists cut, values kept), transformers 4 style
HUB = {
    "meta-llama/Llama-3.2-1B-Instruct": ({
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}, "llama3"),
    "mlx-community/Qwen2.5-0.5B-Instruct-4bit": ({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "quantization": {"group_size": 64, "bits": 4}, "quantization_config": {"group_size": 64, "bits": 4},
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936}, "default"),
    "microsoft/Phi-3.5-mini-instruct": ({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config"}, "bos_token_id": 1, "embd_pdrop": 0.0,
        "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "phi3",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": [1.08] * 48, "short_factor": [1.0] * 48, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.3", "use_cache": True, "vocab_size": 32064}, "longrope"),
    "microsoft/Phi-4-mini-instruct": ({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 199999,
        "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1, "hidden_act": "silu", "hidden_size": 3072,
        "initializer_range": 0.02, "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": False,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3", "num_attention_heads": 24,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "original_max_position_embeddings": 4096,
        "pad_token_id": 199999, "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": [1.0] * 48, "short_factor": [1.0] * 48, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 200064}, "longrope"),
    "google/gemma-3-1b-it": ({
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True,
        "vocab_size": 262144}, "default"),
    "EleutherAI/pythia-160m": ({
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12,
        "num_hidden_layers": 12, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
        "use_parallel_residual": True, "vocab_size": 50304}, "default"),
    "openai-community/gpt2": ({
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257}, None),
    "allenai/OLMo-2-0425-1B": ({
        "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 16,
        "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False, "torch_dtype": "float32",
        "transformers_version": "4.48.3", "use_cache": True, "vocab_size": 100352}, "default"),
    "LiquidAI/LFM2-350M": ({
        "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 1024,
        "block_ff_dim": 6656, "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0, "block_multiple_of": 256,
        "block_norm_eps": 1e-05, "block_out_init_scale": 1.0, "block_use_swiglu": True, "block_use_xavier_init": True,
        "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": False, "conv_dim": 1024, "conv_dim_out": 1024,
        "conv_use_xavier_init": True, "eos_token_id": 7, "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 6656, "layer_types": ["conv", "conv", "full_attention"] * 5 + ["conv"],
        "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-05, "num_attention_heads": 16,
        "num_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 8, "pad_token_id": 0,
        "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0",
        "use_cache": True, "use_pos_enc": True, "vocab_size": 65536}, "default"),
}


@pytest.mark.parametrize("repo", sorted(HUB))
def test_hub_configs_are_read(repo):
    config, rope_type = HUB[repo]
    read = read_config(config)
    if rope_type is None:
        assert rope_parameters(config) is None
    else:
        rp = read["rope_parameters"]
        assert rp.get("full_attention", rp)["rope_type"] == rope_type and read["rope_scaling"] is None
        assert read["rope_theta"] == config["rope_theta" if "rope_theta" in config else "rotary_emb_base"]


def test_train_refuses_a_config_key_it_does_not_understand(tiny_model_path, tmp_path):
    """``train`` stops at load, naming the key, before any game runs; so does check-model."""
    from autocurricula import AutocurriculumConfig, AutocurriculumTrainer
    from autocurricula.publish.check_model import check_model

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))

    class Duel(AutocurriculumTrainer):
        def entry(self):
            return [{"role": "learner"}] if self.current_epoch == 0 else []

        def match(self):
            return [tuple(self.players[:1])]

    async def play(players, model, tokenizer):  # never reached
        raise AssertionError("a game ran on a refused model")

    trainer = Duel(AutocurriculumConfig(epochs=1, rounds=1, output_dir=str(tmp_path / "run"), progress=False))
    with pytest.raises(UnsupportedModelError, match="hidden_act='gelu'"):
        trainer.train(str(folder), play)
    load_row = check_model(folder)[0]
    assert load_row.name == "load" and load_row.ok is False and "hidden_act='gelu'" in load_row.detail


# -- the audit: every key transformers reads for a matrix family is judged ----------------------


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_key_transformers_reads_is_judged(model_type):
    """For each family of FAMILIES, every parameter of the installed transformers' config class is
    metadata, read here (rotary, window, renamed, derived), fixed by the definition, or read by the
    definition; and no fixed key is one the definition reads (it would be refused wrongly)."""
    import dataclasses as dc

    from mlx_lm.utils import _get_classes

    from autocurricula.engine.models import register

    register()
    _, args_class = _get_classes({"model_type": model_type})
    fields = {f.name for f in dc.fields(args_class)}
    family, schema = FAMILIES[model_type], _schema(model_type)
    judged = set(METADATA) | ROPE_KEYS | WINDOW_KEYS | _LEGACY.get(model_type, set()) | set(family.fixed) \
        | set(family.derived) | fields | set(schema.attribute_map) | set(schema.attribute_map.values())
    unjudged = {k for k in schema.params if k not in judged and not _training_only(k)}
    assert not unjudged, f"{model_type}: transformers reads {sorted(unjudged)}, which config.py does not judge"
    assert not set(family.fixed) & fields, f"{model_type}: fixed keys the definition reads"
    assert transformers_reads(model_type) >= schema.params


def test_served_scaled_rope_families_are_checked_here():
    """Each family FAMILIES serves with scaled rotary embeddings has a case above that loads one."""
    checked = {CASES[c][0] for c in CASES if _rope_type(c) != "default"}
    served = {f for f, fam in FAMILIES.items() if fam.scaled_rope}
    assert served <= checked, sorted(served - checked)


def _rope_type(case: str) -> str:
    rp = CASES[case][1].get("rope_parameters") or {}
    rp = rp.get("full_attention", rp)
    return rp.get("rope_type", "default")


def test_scaled_rotations_are_swapped_in_after_loading(models):
    """A definition builds a plain rotation of the right size from what the reader gives it
    (rope_scaling None), and load puts transformers' scaled rotation in its place, in every layer."""
    from autocurricula.engine.models import load
    from autocurricula.engine.models.rope import RoPE

    model, _ = load(str(models("llama-llama3")))
    assert model.args.rope_scaling is None and model.args.rope_theta == 500000.0
    ropes = [layer.self_attn.rope for layer in model.model.layers]
    assert all(isinstance(r, RoPE) and r.rope_type == "llama3" and r.dims == 16 for r in ropes)
    assert not hasattr(model, "rope_context_limit")
