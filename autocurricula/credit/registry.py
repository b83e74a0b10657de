"""Credit methods by name: the registry the trainer's ``credit`` option reads, :func:`make_credit`
(a name or a :class:`Credit` to the bound object a trainer uses) and :func:`credit_from_fields`
(the object that the flat config fields ``credit="branch", branch_samples=2, ...`` stand for)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import warnings
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

# flat config field -> the keyword of every built-in method that takes it
_FIELD_KEYWORDS = {"rae_alpha": "alpha", "rae_per_player": "per_player", "value_lambda": "lam",
                   "value_max_states": "max_states", "q_target_coef": "target_coef",
                   "q_target_min_visits": "target_min_visits", "branch_samples": "samples",
                   "branch_turns_per_game": "turns_per_game", "branch_advantage": "advantage",
                   "branch_move_temperature": "move_temperature", "branch_move_clip": "move_clip"}
# fields of the best-reply research credit (examples/best_reply_credit.py), with their neutral values
_RESEARCH_FIELDS = {"branch_temperature": ("continuation_temperature", None),
                    "branch_move_loss": ("move_loss", "residual"), "branch_replies": ("replies", False)}
LEGACY_CREDIT_FIELDS: tuple[str, ...] = (*_FIELD_KEYWORDS, *_RESEARCH_FIELDS)


def _takes_config(factory: Callable) -> bool:
    """Whether ``factory`` is called as ``factory(config, grpo_config)`` rather than ``factory()``."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: called with no arguments
        return False
    for args in ((), (None, None)):
        try:
            signature.bind(*args)
            return bool(args)
        except TypeError:
            continue
    raise TypeError(f"credit factory {factory!r} must take no arguments (a Credit subclass with defaults is one)")


def register_credit(name: str, factory: Callable[[], Credit]) -> None:
    """Make the trainer's ``credit=name`` build ``factory()`` (a :class:`Credit` subclass is a fine
    factory). The name is looked up when training starts, so it may be registered after its config
    is built. A factory taking ``(config, grpo_config)`` still works, with a DeprecationWarning."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a credit method needs a non-empty string name, got {name!r}")
    if not callable(factory):
        raise TypeError(f"register_credit({name!r}, factory): factory() -> Credit must be callable")
    if _takes_config(factory):
        warnings.warn(f"register_credit({name!r}, factory): a factory(config, grpo_config) is deprecated; register "
                      f"a zero-argument factory (a Credit subclass whose constructor holds its settings; the "
                      f"trainer's GRPO settings and seed arrive through Credit.bind)", DeprecationWarning, stacklevel=2)
    CREDIT_METHODS[name] = factory


def make_credit(spec: str | Credit, grpo_config, seed: int, *, config=None) -> Credit:
    """The credit object a trainer uses: ``spec`` is a registered name (built with its defaults) or a
    :class:`Credit` (deep-copied, so two trainers never share what it learns); then bound to the GRPO
    settings and the run's seed. ``config`` (the trainer's config) is passed to a factory registered
    in the ``factory(config, grpo_config)`` form."""
    if isinstance(spec, Credit):
        credit = copy.deepcopy(spec)
    elif isinstance(spec, str):
        factory = CREDIT_METHODS.get(spec)
        if factory is None:
            raise ValueError(f"unknown credit method {spec!r}; use one of {sorted(CREDIT_METHODS)}, a Credit object, "
                             f"or register_credit(name, factory) first")
        if _takes_config(factory):
            if config is None:
                raise ValueError(f"credit factory {spec!r} takes (config, grpo_config): pass make_credit(..., "
                                 f"config=...) or register a zero-argument factory")
            credit = factory(config, grpo_config)
        else:
            credit = factory()
        if not isinstance(credit, Credit):
            raise TypeError(f"credit factory {spec!r} returned {type(credit).__name__}, not a Credit")
    else:
        raise TypeError(f"credit must be a method name or a Credit object, got {type(spec).__name__}")
    credit.bind(grpo_config, seed)
    return credit


def _takers(field: str) -> list[str]:
    keyword = _FIELD_KEYWORDS[field]
    return [n for n, cls in BUILTIN_CREDIT.items() if keyword in {f.name for f in dataclasses.fields(cls) if f.init}]


def _default(field: str, name: str | None = None):
    """The default of ``field``: ``name``'s own where that method takes it (``"mirror"`` has other
    branch defaults than ``"branch"``), else the first built-in method's that does."""
    if field in _RESEARCH_FIELDS:
        return _RESEARCH_FIELDS[field][1]
    takers = _takers(field)
    cls = BUILTIN_CREDIT[name if name in takers else takers[0]]
    return next(f.default for f in dataclasses.fields(cls) if f.name == _FIELD_KEYWORDS[field])


def credit_from_fields(name: str, fields: dict) -> Credit | str:
    """The credit that ``credit=name`` with the flat config ``fields`` (names in
    :data:`LEGACY_CREDIT_FIELDS`) stands for, e.g. ``credit_from_fields("branch", {"branch_samples": 2})
    == BranchCredit(samples=2)``. Fields at their defaults are ignored; any other field that ``name``
    does not take is an error. A name that is not built in (a method of your own) is returned as it
    is, for :func:`make_credit` to look up when training starts; it takes no fields."""
    unknown = sorted(set(fields) - set(LEGACY_CREDIT_FIELDS))
    if unknown:
        raise ValueError(f"unknown credit fields {unknown}; the flat credit fields are {list(LEGACY_CREDIT_FIELDS)}")
    given = {f: v for f, v in fields.items() if not _same(v, _default(f, name))}
    research = [f for f in given if f in _RESEARCH_FIELDS]
    if research:
        keywords = ", ".join(f"{_RESEARCH_FIELDS[f][0]}={given[f]!r}" for f in research)
        raise ValueError(f"{', '.join(research)} belong to the best-reply research credit, not to the core: pass "
                         f"credit=BestReplyCredit({keywords}, ...) from examples/best_reply_credit.py")
    for f in given:
        takers = _takers(f)
        if name not in takers:
            if f == "q_target_coef":
                raise ValueError(f"q_target_coef needs credit='q' (the (state, move) table), got credit={name!r}")
            raise ValueError(f"{f} is a setting of credit {' or '.join(map(repr, takers))}, not of {name!r}: set "
                             f"credit to one of those, or leave {f}={_default(f)!r}")
    if name not in BUILTIN_CREDIT:
        return name
    try:
        return BUILTIN_CREDIT[name](**{_FIELD_KEYWORDS[f]: v for f, v in given.items()})
    except ValueError as e:
        raise ValueError(f"{e} (from {', '.join(f'{f}={v!r}' for f, v in given.items())})") from None


def _same(value, default) -> bool:
    if default is None:
        return value is None
    return isinstance(value, bool) == isinstance(default, bool) and value == default  # True is not 1
