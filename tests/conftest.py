import os

import pytest

# A process-wide OpenBLAS preload slows torch down; the engine tests want it, the torch parity
# tests do not care about speed. Keep whatever the environment says.
os.environ.setdefault("AUTOCURRICULA_BLAS", "auto")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """The built-in tiny llama model (hidden 256, 4 layers, vocab 1024), built once per session."""
    from autocurricula.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_quantized_path(tmp_path_factory):
    """The same tiny model converted with mlx-lm to 4-bit (as `mlx_lm.convert -q` does)."""
    from autocurricula.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-4bit", quantize_bits=4)
