"""A hostile ``config.json`` cannot exhaust memory (issue 68 item 6): its sizes are compared with
the weights' safetensors headers before mlx-lm builds anything, and a config that names more
blocks than its weights hold, another hidden size or vocabulary than the embedding's, or a size
larger than every dimension of every tensor is refused by name.

Each load runs with mlx-lm's model builder replaced by one that fails the test, so a config that
got through to the builder fails at once instead of allocating gigabytes (bounded time and memory
before the fix as after)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from autocurricula.engine.models import WeightsMismatchError, load
from autocurricula.engine.models.config import MAX_WEIGHT_HEADER_BYTES, check_against_weights, weight_shapes


def _copy(src, dst, **config):
    """A copy of the tiny model whose config.json has ``config`` merged in."""
    shutil.copytree(src, dst)
    path = dst / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return dst


@pytest.fixture()
def no_build(monkeypatch):
    """mlx-lm's model builder fails the test: the config must be refused before it runs."""
    import mlx_lm.utils

    def built(*args, **kwargs):
        raise AssertionError("mlx-lm built the model before the config was compared with its weights")

    monkeypatch.setattr(mlx_lm.utils, "load_model", built)


@pytest.mark.parametrize("change, named", [
    ({"num_hidden_layers": 100_000}, r"num_hidden_layers=100000, but its weights hold 4 blocks \(0 to 3\)"),
    ({"num_hidden_layers": 5}, r"num_hidden_layers=5, but its weights hold 4 blocks"),
    ({"hidden_size": 4096}, r"hidden_size=4096, but the embedding model\.embed_tokens\.weight in model\.safetensors "
                            r"is 256 wide"),
    ({"vocab_size": 10_000_000}, r"vocab_size=10000000, but the embedding .* has 1024 rows"),
    ({"intermediate_size": 10**12}, r"intermediate_size=1000000000000 is larger than every dimension of every "
                                    r"weight \(the largest is 1024\)"),
    ({"num_attention_heads": 10**9, "num_key_value_heads": 10**9}, r"num_attention_heads=1000000000 .*"
                                                                   r"num_key_value_heads=1000000000 is larger"),
])
def test_a_config_its_weights_contradict_is_refused_by_name_before_anything_is_built(
        tiny_model_path, tmp_path, no_build, change, named):
    folder = _copy(tiny_model_path, tmp_path / "hostile", **change)
    start = time.monotonic()
    with pytest.raises(WeightsMismatchError, match=named) as info:
        load(str(folder))
    assert time.monotonic() - start < 10
    assert "does not match its weights" in str(info.value) and "same checkpoint" in str(info.value)


def test_check_model_and_the_engine_refuse_it_too(tiny_model_path, tmp_path, no_build):
    from autocurricula.engine import Engine
    from autocurricula.publish.check_model import check_model

    folder = _copy(tiny_model_path, tmp_path / "hostile", num_hidden_layers=100_000)
    rows = check_model(str(folder))
    assert rows[0].ok is False and "num_hidden_layers=100000" in rows[0].detail, rows[0].detail
    assert all(r.ok is None for r in rows[1:])
    with pytest.raises(WeightsMismatchError, match="num_hidden_layers=100000"):
        Engine(str(folder))


def test_the_checkpoints_that_load_pass_the_check(tiny_model_path, tiny_quantized_path):
    """Quantized embeddings are unpacked (uint32 words of `bits` each) before they are compared."""
    for folder in (tiny_model_path, tiny_quantized_path):
        config = json.loads((folder / "config.json").read_text())
        check_against_weights(config, weight_shapes(folder))
    q = json.loads((tiny_quantized_path / "config.json").read_text())
    with pytest.raises(WeightsMismatchError, match="hidden_size=512, but the embedding .* is 256 wide"):
        check_against_weights({**q, "hidden_size": 512}, weight_shapes(tiny_quantized_path))


def test_an_unreadable_weights_header_is_refused_by_file(tiny_model_path, tmp_path, no_build):
    folder = _copy(tiny_model_path, tmp_path / "bad-header")
    weights = folder / "model.safetensors"
    weights.write_bytes((MAX_WEIGHT_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}")
    with pytest.raises(WeightsMismatchError, match=r"weights file model\.safetensors cannot be read: its header length"):
        load(str(folder))
    weights.write_bytes((20).to_bytes(8, "little") + b"[1, 2, 3]" + b" " * 11)
    with pytest.raises(WeightsMismatchError, match="not the JSON a safetensors file holds"):
        load(str(folder))
