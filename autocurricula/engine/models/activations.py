"""transformers' activation names (a config's ``hidden_act`` / ``activation_function``) as MLX functions."""

from __future__ import annotations

import mlx.nn as nn

# "gelu" is the exact (erf) GELU; "gelu_new", "gelu_fast" and "gelu_pytorch_tanh" are its tanh
# approximation; "quick_gelu" is x * sigmoid(1.702 x)
ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": nn.gelu,
    "gelu_new": nn.gelu_approx,
    "gelu_fast": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "quick_gelu": nn.gelu_fast_approx,
    "silu": nn.silu,
}


def activation(name: str, family: str):
    """The MLX function of transformers' activation ``name``; a ``ValueError`` naming the known
    ones for any other."""
    if name not in ACTIVATIONS:
        raise ValueError(f"{family} activation {name!r} is not supported; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]
