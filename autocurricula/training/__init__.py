"""Policy updates of many LoRA players in one fused MLX step (GRPO / Dr. GRPO / DAPO / GSPO losses)."""

from autocurricula.training.optim import AdamWState
from autocurricula.training.update import Updater

__all__ = ["AdamWState", "Updater"]
