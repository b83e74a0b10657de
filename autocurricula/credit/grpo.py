"""GRPO and constant (``A = R``) credit: advantages from each turn's reward alone, no learnt state.

GRPO (Shao et al., arXiv 2402.03300, as trl implements it): ``A = R - mean`` within a group, divided
by ``std + 1e-4`` (Bessel-corrected) of the group ("group") or of all turns ("batch"); "none" only
centres. Unlike trl, a group is any set of turns with the same key, compared only within their
``level`` and ``parent`` (nested games), and a group of one gets A = 0, not NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autocurricula.credit.base import Credit, rewards
from autocurricula.records import Turn

SCALE_REWARDS = ("group", "batch", "none")


def _key(turn: Turn) -> tuple:
    # hierarchical: compare only within the same level and parent; the group key (or the role when
    # no group is given) splits further
    return (turn.level, turn.parent, turn.group if turn.group is not None else f"role:{turn.role}")


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def grpo_advantages(turns: list[Turn], scale_rewards: str = "group", eps: float = 1e-4) -> list[float]:
    """GRPO advantages, one per turn (see the module docstring)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    r = rewards(turns)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(turns):
        groups.setdefault(_key(t), []).append(i)
    batch_std = _std(r)
    out = [0.0] * len(turns)
    for idx in groups.values():
        if len(idx) < 2:
            continue  # nothing to compare with
        vals = [r[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = _std(vals) if scale_rewards == "group" else batch_std
        for i in idx:
            a = r[i] - mean
            out[i] = a / (std + eps) if scale_rewards != "none" else a
    return out


def constant_advantages(turns: list[Turn]) -> list[float]:
    """``A = R`` for every turn."""
    return rewards(turns)


@dataclass
class GRPOCredit(Credit):
    """``credit="grpo"`` (:func:`grpo_advantages`); ``scale_rewards=None`` takes the trainer's
    ``GRPOConfig.scale_rewards`` through :meth:`bind` ("group" when unbound)."""

    scale_rewards: str | None = None
    name = "grpo"

    def __post_init__(self):
        if self.scale_rewards is not None and self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"GRPOCredit scale_rewards must be None (the trainer's GRPO setting), 'group', "
                             f"'batch' or 'none', got {self.scale_rewards!r}")

    def bind(self, grpo_config, seed: int) -> None:
        if self.scale_rewards is None:
            self.scale_rewards = grpo_config.scale_rewards

    def advantages(self, turns: list[Turn]) -> list[float]:
        return grpo_advantages(turns, self.scale_rewards or "group")


@dataclass
class ConstantCredit(Credit):
    """``credit="constant"``: ``A = R`` (:func:`constant_advantages`); no state."""

    name = "constant"

    def advantages(self, turns: list[Turn]) -> list[float]:
        return constant_advantages(turns)
