"""Credit methods by name, as the trainer's ``credit`` option reads them, and :func:`make_credit`."""

from __future__ import annotations

import copy
import inspect
from typing import Callable

from autocurricula.credit.base import Credit
from autocurricula.credit.branch import BranchCredit
from autocurricula.credit.grpo import ConstantCredit, GRPOCredit
from autocurricula.credit.mirror import MirrorCredit
from autocurricula.credit.rae import RAECredit
from autocurricula.credit.values import QCredit, ValueCredit

BUILTIN_CREDIT: dict[str, type[Credit]] = {"rae": RAECredit, "value": ValueCredit, "q": QCredit,
                                           "grpo": GRPOCredit, "constant": ConstantCredit, "branch": BranchCredit,
                                           "mirror": MirrorCredit}
CREDIT_METHODS: dict[str, Callable] = dict(BUILTIN_CREDIT)  # name -> factory() -> Credit


def register_credit(name: str, factory: Callable[[], Credit]) -> None:
    """Make the trainer's ``credit=name`` build ``factory()`` (e.g. a :class:`Credit` subclass); looked
    up when training starts. Raises ``ValueError`` / ``TypeError`` for a bad name or factory."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a credit method needs a non-empty string name, got {name!r}")
    if not callable(factory):
        raise TypeError(f"register_credit({name!r}, factory): factory() -> Credit must be callable")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise TypeError(f"credit factory {factory!r} must take no arguments (a Credit subclass whose constructor "
                        f"has defaults is one; the trainer's GRPO settings and seed arrive through Credit.bind)") from None
    except ValueError:  # a builtin without a signature
        pass
    CREDIT_METHODS[name] = factory


def make_credit(spec: str | Credit, grpo_config, seed: int) -> Credit:
    """``spec`` (a registered name, or a :class:`Credit`, deep-copied so trainers never share what it
    learns) built and bound to the GRPO settings and seed. ``ValueError`` for an unknown name."""
    if isinstance(spec, Credit):
        credit = copy.deepcopy(spec)
    elif isinstance(spec, str):
        factory = CREDIT_METHODS.get(spec)
        if factory is None:
            raise ValueError(f"unknown credit method {spec!r}; use one of {sorted(CREDIT_METHODS)}, a Credit object, "
                             f"or register_credit(name, factory) first")
        credit = factory()
        if not isinstance(credit, Credit):
            raise TypeError(f"credit factory {spec!r} returned {type(credit).__name__}, not a Credit")
    else:
        raise TypeError(f"credit must be a method name or a Credit object, got {type(spec).__name__}")
    credit.bind(grpo_config, seed)
    return credit
