"""Mirror credit: per-move targets one step of magnetic mirror descent (Sokota et al., arXiv
2206.05825) from the current policy. Defaults: docs/results.md, "Mirror-descent self-play"."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autocurricula.credit.branch import BranchCredit, mirror_distribution


@dataclass
class MirrorCredit(BranchCredit):
    """``credit="mirror"``: :class:`BranchCredit` with ``advantage="moves"``, each move turn's advantage
    its probability under ``pi^(1 - step) * softmax(Q / move_temperature)^step``
    (:func:`mirror_distribution`), so the update is the cross-entropy toward it. Small steps converge
    in self-play against the current policy, where jumping to the target each round can cycle.

    ``move_temperature`` is in the trainer's normalised units, where each seat's payoff range is
    [-1, 1] (:mod:`autocurricula.credit.scale`): 0.075 is the tau of 0.15 chips measured on Kuhn
    poker, whose payoffs span [-2, 2] (docs/results.md, "Mirror-descent self-play"). On a game in
    [-1, 1] it is half the 0.15 that the random matrix games were measured with; the exact analysis
    (``research/mirror_selfplay_ideal.py --tau 0.075 0.15 0.3 --step 0.045 --average-last 32``)
    leaves their mean iterate inside the goal at either (0.013 / 0.055 against 0.028 / 0.050), where
    0.15 on Kuhn's normalised scale (0.3 chips) would end at 0.070 chips, above its goal."""

    advantage: str = field(default="moves", init=False)  # the listed moves' targets: nothing else
    samples: int = 2
    move_temperature: float = 0.075  # normalised units (a seat's range is [-1, 1]): 0.15 Kuhn chips
    move_clip: float = math.inf
    pool_states: bool = True
    step: float = 0.045
    name = "mirror"

    def __post_init__(self):
        step = self.step
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= 1:
            raise ValueError(f"step must be a number in (0, 1] (1 = the target itself, no mirror step), got {step!r}")
        super().__post_init__()
        self.step = float(step)

    def move_targets(self, values: list[float], logprobs: list[float] | None,
                     state: tuple | None = None) -> list[float]:
        return mirror_distribution(values, logprobs, self.move_temperature, self.move_clip, self.step)
