"""AdamW per player, matching ``torch.optim.AdamW`` (decoupled weight decay, bias correction).

MLX's ``optim.Adam`` defaults to ``bias_correction=False``, unlike torch, so we keep our own: each
player has its own moments and step count, and only players present in a step are touched, so an
absent or frozen player's weights and moments stay bit-identical.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
from safetensors.numpy import load_file, save_file


@dataclass
class AdamWState:
    """One player's moments (host copies, ``path -> (m_a, v_a, m_b, v_b)``) and step count."""

    step: int = 0
    moments: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def save(self, folder: str | Path) -> None:
        """``optimizer.safetensors`` + ``optimizer.json`` (no pickle)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for path, (ma, va, mb, vb) in self.moments.items():
            tensors.update({f"{path}.m_a": ma, f"{path}.v_a": va, f"{path}.m_b": mb, f"{path}.v_b": vb})
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "optimizer.safetensors"))
        (folder / "optimizer.json").write_text(json.dumps({"step": self.step, "type": "adamw"}))

    @classmethod
    def load(cls, folder: str | Path) -> "AdamWState":
        folder = Path(folder)
        meta = json.loads((folder / "optimizer.json").read_text())
        flat = load_file(str(folder / "optimizer.safetensors"))
        moments = {}
        for key in flat:
            path, kind = key.rsplit(".", 1)
            if kind == "m_a":
                moments[path] = (flat[key], flat[f"{path}.v_a"], flat[f"{path}.m_b"], flat[f"{path}.v_b"])
        return cls(step=int(meta["step"]), moments=moments)


def adamw(p: mx.array, g: mx.array, m: mx.array, v: mx.array, lr, step, beta1: float, beta2: float,
          eps: float, weight_decay: float) -> tuple[mx.array, mx.array, mx.array]:
    """One torch-AdamW update of stacked parameters; ``lr`` and ``step`` hold one value per stack
    entry (axis 0). Scalar factors are computed in float64 on the host, as torch does in Python."""
    lr = np.asarray(lr, np.float64)
    t = np.asarray(step, np.float64)
    shape = (-1,) + (1,) * (p.ndim - 1)
    decay = mx.array((1 - lr * weight_decay).astype(np.float32)).reshape(shape)
    step_size = mx.array((lr / (1 - beta1**t)).astype(np.float32)).reshape(shape)
    bc2_sqrt = mx.array(np.sqrt(1 - beta2**t).astype(np.float32)).reshape(shape)
    p = p * decay
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * mx.square(g)
    denom = mx.sqrt(v) / bc2_sqrt + eps
    return p - step_size * (m / denom), m, v


def scheduled_lr(learning_rate: float, schedule: str, done: int, total: int, min_ratio: float = 0.0,
                 decay_ratio: float | None = None) -> float:
    """The learning rate after ``done`` of ``total`` updates under ``schedule`` ('constant', 'linear',
    'cosine' or 'warmup_stable_decay', as transformers' schedulers without warm-up), floored at
    ``min_ratio`` of it. 'warmup_stable_decay' stays at ``learning_rate`` until the last
    ``decay_ratio`` of the updates, then falls along a half cosine (transformers' default decay)."""
    if schedule == "constant" or total <= 0:
        return learning_rate
    frac = min(max(done / total, 0.0), 1.0)
    if schedule == "linear":
        left = 1.0 - frac
    elif schedule == "cosine":
        left = 0.5 * (1.0 + math.cos(math.pi * frac))
    elif schedule == "warmup_stable_decay":
        if decay_ratio is None or not 0 < decay_ratio <= 1:
            raise ValueError(f"'warmup_stable_decay' needs decay_ratio in (0, 1], got {decay_ratio!r}")
        start = total - decay_ratio * total
        progress = min(max((done - start) / (decay_ratio * total), 0.0), 1.0)
        left = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; use 'constant', 'linear', 'cosine' or "
                         f"'warmup_stable_decay'")
    return learning_rate * (min_ratio + (1.0 - min_ratio) * left)


def round_rates(grpo, peaks: dict[str, float], done: int, total: int) -> tuple[dict[str, float] | None, dict]:
    """Each learner's learning rate for the round after ``done`` of ``total`` rounds under the
    schedule of ``grpo`` (a GRPOConfig), from its peak rate; ``(None, {})`` when every rate is the
    constant ``grpo.learning_rate``. The second item is the logged ``train/learning_rate``."""
    if grpo.lr_scheduler_type == "constant" and all(v == grpo.learning_rate for v in peaks.values()):
        return None, {}
    factor = scheduled_lr(1.0, grpo.lr_scheduler_type, done, total, grpo.min_lr_ratio, grpo.lr_decay_ratio)
    return {pid: v * factor for pid, v in peaks.items()}, {"train/learning_rate": grpo.learning_rate * factor}

