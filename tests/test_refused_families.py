"""Every family a user may bring that the conformance matrix does not check is refused by name at
load (issue 66), each with a test here.

The families: every ``model_type`` for which the installed transformers has a config class and
mlx-lm a definition (its own module, or another one through mlx-lm's ``MODEL_REMAPPING``), the
families of ``REFUSED``, and a few that transformers has and nothing defines for MLX (Falcon,
BLOOM, MPT, CodeGen), less the served families (``FAMILIES`` in
``autocurricula/engine/models/config.py``: the check-model matrix of tests/test_families.py and the
config table of tests/test_model_configs.py, each checked against transformers' logits).

Each folder holds the ``config.json`` that transformers' own config class of the family writes
(``save_pretrained``, tiny sizes) and no weights: the refusal comes before any weight is read.
``test_every_family_is_served_or_listed_here`` fails when a new transformers or mlx-lm brings a
family this file does not list.
"""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest

from transformers import AutoConfig

from autocurricula.engine.models import REFUSED, UnsupportedModelError, load, read_config, refusal
from autocurricula.engine.models.config import FAMILIES, _schema

# how each family is refused: the reason the message gives
RECURRENT = "recurrent (linear-attention / state-space) layers in a definition the conformance matrix does not check"
SLIDING = "sliding-window attention layers in a definition the conformance matrix does not check"
WRAPPER = "a multimodal wrapper the conformance matrix does not check"
UNCHECKED = "is not in the conformance matrix: mlx-lm has a definition of it"
RENAMED = "not in the conformance matrix"  # a name mlx-lm maps to another definition: by a key, or by name
UNDEFINED = "has no definition (neither mlx-lm nor autocurricula defines it"

FAMILY_REFUSALS = {
    # REFUSED, with the reason it names
    "gemma3": WRAPPER, "qwen3_5": WRAPPER, "cohere2": SLIDING,
    "qwen3_5_moe": RECURRENT, "qwen3_next": RECURRENT, "lfm2_moe": RECURRENT, "mamba": RECURRENT, "mamba2": RECURRENT,
    "falcon_h1": RECURRENT, "jamba": RECURRENT, "nemotron_h": RECURRENT, "granitemoehybrid": RECURRENT,
    "recurrent_gemma": RECURRENT, "rwkv7": RECURRENT,
    # layers their config declares (layer_types, a sliding window shorter than the context)
    "afmoe": SLIDING, "exaone4": SLIDING, "exaone_moe": SLIDING, "gemma4_text": SLIDING, "gpt_oss": SLIDING,
    "laguna": SLIDING, "mellum": SLIDING, "mimo_v2_flash": SLIDING, "olmo3": SLIDING,
    "bailing_hybrid": RECURRENT, "kimi_linear": RECURRENT, "minimax": RECURRENT, "olmo_hybrid": RECURRENT,
    # defined by mlx-lm, not checked against transformers: refused by name
    "apertus": UNCHECKED, "bitnet": UNCHECKED, "cohere": UNCHECKED, "dbrx": UNCHECKED, "deepseek_v2": UNCHECKED,
    "deepseek_v32": UNCHECKED, "dots1": UNCHECKED, "ernie4_5": UNCHECKED, "ernie4_5_moe": UNCHECKED,
    "exaone": UNCHECKED, "gemma": UNCHECKED, "gemma3n": UNCHECKED, "gemma4": UNCHECKED, "glm": UNCHECKED,
    "glm4_moe": UNCHECKED, "glm4_moe_lite": UNCHECKED, "glm_moe_dsa": UNCHECKED, "gpt_bigcode": UNCHECKED,
    "gptj": UNCHECKED, "granitemoe": UNCHECKED, "helium": UNCHECKED, "hunyuan_v1_dense": UNCHECKED,
    "internlm3": UNCHECKED, "kimi_k25": UNCHECKED, "llama4": UNCHECKED, "llama4_text": UNCHECKED,
    "longcat_flash": UNCHECKED, "minicpm3": UNCHECKED, "minimax_m3_vl": UNCHECKED, "ministral3": UNCHECKED,
    "mistral3": UNCHECKED, "mistral4": UNCHECKED, "muse_glimmer": UNCHECKED, "muse_spark": UNCHECKED,
    "nanochat": UNCHECKED, "nemotron": UNCHECKED, "olmo": UNCHECKED, "olmoe": UNCHECKED, "phi": UNCHECKED,
    "phimoe": UNCHECKED, "pixtral": UNCHECKED, "qwen2_vl": UNCHECKED, "qwen3_vl": UNCHECKED,
    "qwen3_vl_moe": UNCHECKED, "seed_oss": UNCHECKED, "solar_open": UNCHECKED, "starcoder2": UNCHECKED,
    "step3p5": UNCHECKED,
    # names mlx-lm maps to another definition (MODEL_REMAPPING): refused when the config is read
    "falcon_mamba": RENAMED, "gemma4_unified": RENAMED, "iquestcoder": RENAMED, "llava": RENAMED,
    "minimax_m2": RENAMED, "qwen2_5_vl": RENAMED,
    # transformers has them, neither mlx-lm nor autocurricula defines them
    "falcon": UNDEFINED, "bloom": UNDEFINED, "mpt": UNDEFINED, "codegen": UNDEFINED,
}
# sizes for every family whose config class takes them (a tiny model, as transformers would build it)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=512, n_embd=64, n_layer=2, n_head=4, head_dim=16)
OVERRIDES = {"mamba2": dict(num_heads=4, head_dim=32, n_groups=1)}  # hidden * expand == heads * head_dim
# no transformers config class: the config.json of the family's checkpoints, abridged
HAND_WRITTEN = {
    "rwkv7": {"model_type": "rwkv7", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512,
              "head_dim": 16, "intermediate_size": 128},
}


def _config(model_type: str):
    """transformers' config object of ``model_type`` at tiny sizes (the sizes its class takes)."""
    schema = _schema(model_type)
    kwargs = {k: v for k, v in TINY.items() if k in schema.params | set(schema.attribute_map)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(model_type, **kwargs | OVERRIDES.get(model_type, {}))


def _folder(model_type: str, root: pathlib.Path) -> pathlib.Path:
    """A model folder holding only the family's config.json, as ``save_pretrained`` writes it."""
    folder = root / model_type
    if model_type in HAND_WRITTEN:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(HAND_WRITTEN[model_type]))
    else:
        _config(model_type).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model_type", sorted(FAMILY_REFUSALS))
def test_family_outside_the_matrix_is_refused_at_load(model_type, tmp_path):
    """``engine.models.load`` (behind ``Engine(path)``, ``train``, ``serve`` and ``check-model``)
    refuses the folder with an UnsupportedModelError that names the family, the reason and where to
    look, before any weight is read (the folder has none)."""
    folder = _folder(model_type, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == model_type
    with pytest.raises(UnsupportedModelError) as err:
        load(str(folder))
    message = str(err.value)
    reason = FAMILY_REFUSALS[model_type]
    assert f"{model_type!r}" in message and reason in message, message
    assert "docs/models.md" in message, message  # what to do: a served family, listed there
    if reason not in (RENAMED, UNDEFINED):
        # refused from the config alone, before mlx-lm's definition is imported (OLMo's exits the process)
        why = refusal(config)
        assert why is not None and f"{model_type!r}" in why and reason in why
    else:  # the name reaches the definition lookup, which reads the config and refuses it
        assert refusal(config) is None
        with pytest.raises(UnsupportedModelError, match=f"'{model_type}'"):
            read_config(config)


def test_a_name_mlx_lm_maps_to_a_served_definition_is_refused_by_name():
    """xverse is llama to mlx-lm (MODEL_REMAPPING): a config whose every key the llama definition
    reads is still refused, by the family's own name, since the matrix has not checked it."""
    llama = {k: v for k, v in _config("llama").to_dict().items() if k != "hidden_act"}
    with pytest.raises(UnsupportedModelError) as err:
        read_config({**llama, "model_type": "xverse"})
    assert "'xverse' is not in the conformance matrix" in str(err.value) and "docs/models.md" in str(err.value)


def test_every_family_is_served_or_listed_here():
    """Each family transformers has a config class for and mlx-lm defines (directly or by
    MODEL_REMAPPING), and each of REFUSED, is served (FAMILIES) or has a test above."""
    import mlx_lm
    from mlx_lm.utils import MODEL_REMAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    modules = {p.stem for p in (pathlib.Path(mlx_lm.__file__).parent / "models").glob("*.py")}
    both = set(CONFIG_MAPPING_NAMES) & (modules | set(MODEL_REMAPPING))
    unlisted = sorted((both | set(REFUSED)) - set(FAMILIES) - set(FAMILY_REFUSALS))
    assert not unlisted, f"families with no refusal test: add them to FAMILY_REFUSALS: {unlisted}"
    assert not set(FAMILIES) & set(FAMILY_REFUSALS)


def test_families_only_mlx_lm_defines_are_refused_by_name():
    """mlx-lm's definitions of families transformers has no class for (their checkpoints carry
    their own code: InternLM2, OpenELM, MiniCPM, Phi-3-small, Qwen 1, ...) are refused by name too."""
    import mlx_lm
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    defined = [p.stem for p in sorted((pathlib.Path(mlx_lm.__file__).parent / "models").glob("*.py"))
               if p.stem.isidentifier() and "class ModelArgs" in p.read_text()]
    only_mlx = [t for t in defined if t not in CONFIG_MAPPING_NAMES and t not in FAMILIES]
    assert {"internlm2", "openelm", "minicpm", "phi3small", "qwen"} <= set(only_mlx)
    for model_type in only_mlx:
        why = refusal({"model_type": model_type})
        assert why is not None and f"{model_type!r}" in why, model_type


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_served_families_are_not_refused_by_name(model_type):
    assert refusal({"model_type": model_type}) is None


def test_check_model_cli_refuses_a_family_outside_the_matrix(tmp_path, capsys):
    """``autocurricula check-model`` on a Phi-2 folder: the load row names the family and the
    reason, the other checks are not run, the exit status is 1, no traceback."""
    from autocurricula.cli import main

    folder = _folder("phi", tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["check-model", str(folder)])
    assert info.value.code == 1
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("| load |"))
    assert row.startswith("| load | FAIL |") and "refused: " in row, row
    assert "'phi' is not in the conformance matrix" in row, row
    assert "docs/models.md" in row and "Traceback" not in out + err
    assert all("not run: the model is refused" in line for line in out.splitlines()
               if line.startswith("| ") and not line.startswith(("| load", "| check", "|---")))


def test_a_whole_checkpoint_of_a_family_that_loaded_before_is_refused(tmp_path):
    """Nemotron: every key of its config is one mlx-lm's definition reads, so the config reader
    alone served it unchecked. With its weights (written by transformers), ``Engine(path)`` refuses
    it by name."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from autocurricula.engine import Engine

    folder = _folder("nemotron", tmp_path)
    AutoModelForCausalLM.from_config(_config("nemotron"), dtype=torch.float32).save_pretrained(folder)
    assert list(folder.glob("model*.safetensors"))
    with pytest.raises(UnsupportedModelError, match="'nemotron' is not in the conformance matrix"):
        Engine(str(folder))
