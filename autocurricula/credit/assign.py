"""One call that sets the advantages of a list of turns by method name (deprecated: the Credit
objects, e.g. ``RAECredit().assign(turns)``, do the same and keep their state themselves)."""

from __future__ import annotations

import warnings
from typing import Iterable

from autocurricula.credit.grpo import constant_advantages, grpo_advantages
from autocurricula.credit.rae import RAE
from autocurricula.credit.values import StateValues
from autocurricula.records import Turn


def assign_credit(turns: Iterable[Turn], method: str = "grpo", *, scale_rewards: str = "group",
                  rae: RAE | None = None, values: StateValues | None = None) -> list[Turn]:
    """Deprecated: use a Credit object's ``assign`` (``GRPOCredit(scale_rewards).assign(turns)``,
    ``RAECredit().assign(turns)``, ``ValueCredit()``, ``QCredit()``, ``ConstantCredit()``)."""
    warnings.warn("assign_credit is deprecated: use the Credit objects of autocurricula.credit, e.g. "
                  "GRPOCredit().assign(turns) or RAECredit().assign(turns)", DeprecationWarning, stacklevel=2)
    turns = list(turns)
    if method == "grpo":
        adv = grpo_advantages(turns, scale_rewards)
    elif method == "rae":
        if rae is None:
            raise ValueError("method='rae' needs the RAE state (rae=RAE()) so baselines persist across calls")
        adv = rae.advantages(turns)
    elif method in ("value", "q"):
        if values is None or values.actions != (method == "q"):
            table = "StateValues(actions=True)" if method == "q" else "StateValues()"
            raise ValueError(f"method={method!r} needs its value table (values={table}) so it persists across calls")
        adv = values.advantages(turns)
    elif method == "constant":
        adv = constant_advantages(turns)
    else:
        raise ValueError(f"unknown credit method {method!r}; use 'grpo', 'rae', 'value', 'q' or 'constant'")
    for t, a in zip(turns, adv):
        t.advantage = float(a)
    return turns
