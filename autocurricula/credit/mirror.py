"""Mirror credit: per-move targets one step of magnetic mirror descent from the current policy.

``MirrorCredit`` is :class:`~autocurricula.credit.BranchCredit` with ``advantage="moves"``: every
listed move of a learner's turn is valued by branch games, the values of one prompt's visits in a
round are pooled, and each move turn's advantage is its probability under the target
``pi_new ∝ pi^(1 - step) * softmax(Q / move_temperature)^step`` (:func:`mirror_distribution`), so
the update is the cross-entropy toward it. With self-play against the current policy only
(``SelfPlayConfig(rules={"past_share": 0})``), small steps converge toward ``softmax(Q / tau)`` play in
two-player zero-sum games, where jumping to that target every round can cycle. Its defaults are
those of the mirror self-play figures in docs/results.md ("Mirror-descent self-play"). A state
takes one step in each round it is met (catch-up steps and a table of averaged move values are
subclasses in ``examples/credit_variants.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autocurricula.credit.branch import BranchCredit, mirror_distribution


@dataclass
class MirrorCredit(BranchCredit):
    """``credit="mirror"``: :class:`BranchCredit` per-move values (``samples`` branch games per move,
    ``pool_states``) turned into cross-entropy targets one mirror-descent ``step`` from the policy
    (the moves' scored log-probabilities) toward ``softmax(Q / move_temperature)`` (``move_clip``
    bounds the centred logits; math.inf: no bound). Needs a game that lists its moves
    (``play.moves``); ``advantage`` is always "moves". Checkpointed as :class:`BranchCredit` is."""

    advantage: str = field(default="moves", init=False)  # the listed moves' targets: nothing else
    samples: int = 2
    move_temperature: float = 0.15
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
