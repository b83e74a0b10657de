"""Qwen3.5 text-only checkpoints (``model_type: qwen3_5_text``, transformers'
``Qwen3_5ForCausalLM``): mlx-lm's Qwen3.5 language model, which mlx-lm ships only inside its
multimodal ``qwen3_5`` wrapper. Hybrid: gated delta-net (linear attention) layers, each with a
recurrent state, and full attention layers.

mlx-lm places the full layers by ``full_attention_interval`` (every fourth by default);
transformers 5 writes ``layer_types`` instead, so the interval is read from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mlx_lm.models import qwen3_5 as mlx_qwen3_5

__all__ = ["Model", "ModelArgs"]


@dataclass
class ModelArgs(mlx_qwen3_5.TextModelArgs):
    layer_types: Optional[list] = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is not None:
            self.full_attention_interval = full_attention_interval(self.layer_types)


def full_attention_interval(types: list[str]) -> int:
    """The ``k`` with layer ``i`` full attention exactly when ``(i + 1) % k == 0``."""
    for k in range(1, len(types) + 2):
        if all((t == "full_attention") == ((i + 1) % k == 0) for i, t in enumerate(types)):
            return k
    raise ValueError(f"layer_types {types} do not place a full attention layer every k-th layer, the only "
                     "layout mlx-lm's Qwen3.5 builds")


class Model(mlx_qwen3_5.TextModel):
    """mlx-lm's Qwen3.5 language model as a top-level model."""
