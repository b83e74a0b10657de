"""The records every layer shares: what a game hands back (:class:`Generation`), what it logs
(:class:`Call`), what it produced (:class:`GameRecord`) and what a learner trains on
(:class:`Turn`), the match entry whose games share a deal (:class:`Deal`), a league's
:class:`Player` and the test of a scripted one, and :func:`help_field`, the field every config
declares. Plain data, no MLX and no engine."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Callable, NamedTuple


def help_field(text: str, default=MISSING, *, default_factory=MISSING):
    """A dataclass field with its help text (shown by ``autocurricula train --help``); a mutable
    default comes from ``default_factory``."""
    return field(default=default, default_factory=default_factory, metadata={"help": text})


@dataclass
class Turn:
    """One generation a trainable player made in a game, plus (once the game ends) its reward."""

    player: str
    game_id: str
    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # the sampler's, one per completion token
    version: int | None = None  # adapter version that produced it
    game: str = "game"  # the game's name (RAE baselines are per game and role)
    reward: float | None = None
    group: str | None = None  # GRPO group key, e.g. same prompt / same game seed
    level: int = 0  # nesting depth of the (sub-)game that produced the turn
    parent: str | None = None  # id of the enclosing game for nested games
    truncated: bool = False  # cut by max_tokens (no eos) or unparseable
    seat: int = -1  # the player's position in the game (its reward is rewards[seat])
    advantage: float | None = None
    target: bool = False  # not sampled (a critic's pick): the update uses the current logprobs as old ones

    def __post_init__(self):
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"turn of {self.player}: {len(self.logprobs)} logprobs for "
                             f"{len(self.completion_ids)} completion tokens; they must match one to one")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    """One completion handed back to a game."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int]
    finish_reason: str
    adapter_version: int | None
    player_id: str

    def __str__(self) -> str:
        return self.text


class Call(NamedTuple):
    """One logged model call of a game (``GameRecord.calls``), what a replay forces or branches from."""

    key: tuple  # (level, node, call index): the call's place in its (sub-)game
    player: str  # the id of the player (or judge) asked
    prompt_ids: list[int]
    generation: Any  # the answer, a Generation
    turn: Turn | None  # the turn it made (None: not trained, or forced by a replay)
    seat: int  # the asked player's seat in its (sub-)game; -1 for a judge or any trainable=False call


@dataclass
class GameRecord:
    """What one game produced."""

    game_id: str
    players: list  # each seat's Player, a copy with its seat (or the plain dicts a game or a test passes)
    rewards: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    experiences: Any = None
    error: str | None = None
    traceback: str | None = None  # the full traceback of ``error``
    extras: dict = field(default_factory=dict)  # a GameResult's extras
    calls: list | None = None  # a list: every model call is logged as a Call, a replay's forced ones included
    replay: Any = None  # an autocurricula.arena.replay plan: recorded answers for some calls, branch seeds for the rest
    deal: str | None = None  # games of one deal draw the same chance (model.seed comes from it, not the game id)


class Deal(tuple):
    """A match entry (a tuple of players) whose games share their chance draws with the other
    entries of the same ``key`` in the round: the same deal of the cards, the same random opening.
    Two entries with the seats swapped are a duplicate pair, in which the luck of the deal cancels."""

    key: str

    def __new__(cls, players, key: str):
        entry = super().__new__(cls, players)
        entry.key = str(key)
        return entry

    def __getnewargs__(self):  # pickles (and copies) with its key
        return tuple(self), self.key

    def __repr__(self) -> str:  # tuple operations (+, slicing) give plain tuples, without the key
        return f"Deal({tuple(self)!r}, key={self.key!r})"


class PlayerKeyError(KeyError):
    """A read or write of a key that no field of the player's class declares (a misspelt key)."""

    def __str__(self) -> str:  # the message, not KeyError's quoted repr of it
        return str(self.args[0]) if self.args else ""


_SET_UNLESS = {"snapshot_of": None, "init": None, "resets": 0, "policy": None, "adapter": None, "seat_role": None,
               "seat": None, "info": {}}  # optional fields: in the mapping only when they hold something else


@dataclass(eq=False, kw_only=True, repr=False)
class Player(Mapping):
    """One player of a league, as the pool makes it from a spec dict (``{"role": "main_agent"}``).

    The fields are the keys a player may have; the pool sets ``id``, ``epoch``, ``frozen``,
    ``parent`` and ``version``. A player reads as a mapping of its fields as well as by attribute:
    ``p["role"]``, ``p.get("snapshot_of")``, ``"policy" in p``, ``dict(p)`` and ``{**p}`` work as on the
    player dicts of the seed API, and ``p.role`` too. A key that no field declares raises
    :class:`PlayerKeyError` (a ``KeyError``) naming the known ones, ``get`` and ``in`` included, so
    a misspelt key fails instead of reading None. The optional fields (``snapshot_of``, ``init``,
    ``resets``, ``policy``, ``adapter``, ``seat_role``, ``seat``, ``info``) are in the mapping (``in``, ``get``,
    iteration) once they hold something other than their default, as the keys a dict did not have;
    read directly they give the default.

    Custom fields: free-form ones go under ``info`` (``{"role": "generator", "info": {"skill": 3}}``,
    then ``p.info["skill"]``); declared ones on a dataclass subclass, ``@dataclass class
    MyPlayer(Player): skill: int = 0``, set as the trainer's ``player_class``. Equality is identity
    and a player hashes by identity (a subclass's too), so it may key a dict; two players with the
    same fields are different players."""

    id: str
    role: str = "player"
    epoch: int = 0  # the epoch it joined
    frozen: bool = False  # never trained (snapshots, scripted players)
    parent: str | None = None  # the id of the player whose adapter it started from; None: the base model
    version: int | None = None  # its adapter's version (None: scripted)
    snapshot_of: str | None = None  # a frozen snapshot: the id of the player it copies
    init: str | None = None  # "base": start from the base model, not the latest player of the same role
    resets: int = 0  # times reset to the base model
    policy: Callable | None = None  # a scripted player's ``policy(prompt[, rng]) -> reply``: no adapter
    adapter: str | None = None  # the adapter that serves it when not the one under its id
    seat_role: str | None = None  # the role its turns train under (default "seat<i>")
    seat: int | None = None  # in a game: its seat (a game gets a copy of each player, with its seat)
    info: dict = field(default_factory=dict)  # free-form fields of your own

    def __init_subclass__(cls, **kwargs):
        # before @dataclass sees the subclass: it keeps these, so a subclass's players compare and hash
        # by identity and print as the dict they read as, whatever eq= and repr= its decorator says
        super().__init_subclass__(**kwargs)
        for name, method in (("__eq__", object.__eq__), ("__hash__", object.__hash__), ("__repr__", Player.__repr__)):
            if name not in cls.__dict__:
                setattr(cls, name, method)

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"a player's id must be a non-empty string, got {self.id!r}")

    # -- the declared keys ----------------------------------------------------------------------
    @classmethod
    def known_keys(cls) -> tuple[str, ...]:
        """The field names of this class, in declaration order."""
        known = cls.__dict__.get("_known")
        if known is None:
            known = tuple(f.name for f in fields(cls))
            type.__setattr__(cls, "_known", known)
        return known

    @classmethod
    def _unknown(cls, key, what: str) -> str:
        return (f"{what} {key!r} is not a field of {cls.__name__}; its fields are {', '.join(cls.known_keys())}. "
                f"Put a field of your own under 'info' ({{'info': {{{key!r}: ...}}}}), or declare it on a "
                f"{cls.__name__} subclass (a dataclass) set as the trainer's player_class")

    @classmethod
    def check_spec(cls, spec: Mapping) -> None:
        """Refuse a spec (a dict as ``entry`` returns it) with a key that no field of this class
        declares: a ``ValueError`` naming the key, the known ones and where a field of your own goes."""
        unknown = [k for k in spec if k not in cls.known_keys()]
        if unknown:
            raise ValueError(cls._unknown(unknown[0], "player spec key") + f" (spec: {dict(spec)!r})")

    @classmethod
    def from_spec(cls, spec: Mapping, **values) -> "Player":
        """A player of this class from a spec and ``values`` that override the spec's
        (:meth:`check_spec` first)."""
        cls.check_spec(spec)
        given = {**spec, **values}
        if isinstance(given.get("info"), Mapping):
            given["info"] = dict(given["info"])  # a copy: a snapshot does not share its parent's
        return cls(**given)

    @staticmethod
    def check_class(cls: type) -> type:
        """``cls`` if it can be a trainer's ``player_class``: a dataclass subclass of :class:`Player`
        (its fields declared) whose players compare and hash by identity; else a ``TypeError``."""
        if not (isinstance(cls, type) and issubclass(cls, Player)):
            raise TypeError(f"player_class must be Player or a subclass of it, got {cls!r}")
        if cls.__dict__.get("__annotations__") and "__dataclass_fields__" not in cls.__dict__:
            raise TypeError(f"{cls.__name__}'s fields are not declared: decorate it with @dataclass")
        if cls.__hash__ is not object.__hash__ or cls.__eq__ is not object.__eq__:
            raise TypeError(f"{cls.__name__} defines __eq__ or __hash__: a player is equal only to itself and "
                            f"hashes by identity (two players may hold the same fields), which the trainer relies on")
        return cls

    def _check(self, key) -> None:
        if key not in type(self).known_keys():
            raise PlayerKeyError(type(self)._unknown(key, "key"))

    def is_set(self, key: str) -> bool:
        """Whether field ``key`` is in the mapping: always, except an optional field at its default."""
        self._check(key)
        if key not in _SET_UNLESS:
            return True
        value, default = getattr(self, key), _SET_UNLESS[key]
        return value is not None if default is None else value != default

    # -- the mapping of its fields --------------------------------------------------------------
    def __getitem__(self, key):
        self._check(key)
        return getattr(self, key)

    def __setitem__(self, key, value) -> None:
        self._check(key)
        setattr(self, key, value)

    def __iter__(self):
        return (k for k in type(self).known_keys() if self.is_set(k))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key) -> bool:
        return self.is_set(key)

    def get(self, key, default=None):
        """The field's value when it is set (:meth:`is_set`), else ``default``; an undeclared key raises."""
        return getattr(self, key) if self.is_set(key) else default

    def __setattr__(self, name: str, value) -> None:
        if not name.startswith("_") and name not in type(self).known_keys():
            raise AttributeError(type(self)._unknown(name, "attribute"))
        object.__setattr__(self, name, value)

    __eq__ = object.__eq__  # identity: Mapping would compare the fields
    __hash__ = object.__hash__

    def to_dict(self) -> dict:
        """The set fields as a plain dict (what ``dict(player)`` gives)."""
        return dict(self)

    def __repr__(self) -> str:  # the dict it reads as: Player({'id': 'main-0', 'role': 'main', ...})
        return f"{type(self).__name__}({dict(self)!r})"


def is_scripted(player: Mapping) -> bool:
    """A scripted player: a Python ``policy`` callable, no adapter, never trained."""
    return "policy" in player


_TAKES_RNG: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def takes_rng(policy: Callable) -> bool:
    """Whether a scripted policy is ``fn(prompt, rng)`` rather than ``fn(prompt)``. Cached: a signature
    costs more than a minimax move; weak keys, so per-game lambdas are not kept alive."""
    try:
        known = _TAKES_RNG.get(policy)
    except TypeError:  # not hashable or not weak-referenceable: no caching
        known = None
    if known is None:
        try:
            known = len(inspect.signature(policy).parameters) >= 2
        except (TypeError, ValueError):
            known = False
        try:
            _TAKES_RNG[policy] = known
        except TypeError:
            pass
    return known


def call_scripted(policy: Callable, prompt: str, rng: Any = None) -> str:
    """The reply of a scripted policy: ``policy(prompt, rng)`` when it takes an rng, else ``policy(prompt)``."""
    return str(policy(prompt, rng) if takes_rng(policy) else policy(prompt))


UTILITIES = ("zero_sum", "constant_sum", "general_sum", "identical")
INFORMATION = ("perfect", "imperfect", "one_shot")
DYNAMICS = ("sequential", "simultaneous")


def _span(value, what: str) -> tuple[float, float]:
    import math

    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a pair (lowest, highest) of numbers, got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{what} must be finite with lowest <= highest, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class GameFacts:
    """What a game declares about itself, as OpenSpiel's ``GameType`` and ``GameInfo`` do: the
    facts a league and a credit method may read (``autocurricula.arena.game.game_facts`` finds a
    game's). None means unknown.

    - ``num_players``: seats (None: any number from 2).
    - ``utility``: ``"zero_sum"``, ``"constant_sum"`` (strictly competitive too: an affine copy of a
      zero-sum game), ``"general_sum"`` or ``"identical"`` (a common payoff).
    - ``information``: ``"perfect"`` (every player sees the whole state), ``"imperfect"`` (hidden
      cards, hidden moves) or ``"one_shot"`` (one simultaneous decision, as a matrix game).
    - ``dynamics``: ``"sequential"`` (one player moves at a time) or ``"simultaneous"``.
    - ``chance``: whether the game has chance moves (a deal, a die, a random opening).
    - ``payoff_range``: ``(lowest, highest)`` reward any player can get from legal play (OpenSpiel's
      ``min_utility`` / ``max_utility``); a forfeit for an invalid reply may lie outside it.
    - ``seat_ranges``: one ``(lowest, highest)`` per seat, where the seats' rewards differ (a matrix
      game's rows win what its columns lose); default: ``payoff_range`` for every seat.

    The credit methods normalise rewards by a seat's range (``autocurricula.credit.RewardScale``),
    so that a game's units never change how it trains; the default configuration
    (``autocurricula.train``) is chosen from ``information``, ``dynamics``, ``chance`` and ``utility``.
    """

    num_players: int | None = 2
    utility: str | None = None
    information: str | None = None
    dynamics: str | None = None
    chance: bool | None = None
    payoff_range: tuple[float, float] | None = None
    seat_ranges: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self):
        n = self.num_players
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"num_players must be a positive integer or None (any number from 2), got {n!r}")
        for name, allowed in (("utility", UTILITIES), ("information", INFORMATION), ("dynamics", DYNAMICS)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"GameFacts.{name} must be one of {allowed} or None (unknown), got {value!r}")
        if self.chance is not None and not isinstance(self.chance, bool):
            raise ValueError(f"GameFacts.chance must be True, False or None (unknown), got {self.chance!r}")
        if self.payoff_range is not None:
            object.__setattr__(self, "payoff_range", _span(self.payoff_range, "payoff_range"))
        if self.seat_ranges is not None:
            seats = tuple(_span(r, f"seat_ranges[{i}]") for i, r in enumerate(self.seat_ranges))
            if n is not None and len(seats) != n:
                raise ValueError(f"seat_ranges needs one range per seat ({n}), got {len(seats)}")
            object.__setattr__(self, "seat_ranges", seats)
            if self.payoff_range is None:
                object.__setattr__(self, "payoff_range", (min(r[0] for r in seats), max(r[1] for r in seats)))

    @property
    def zero_sum(self) -> bool:
        """Strictly competitive: zero-sum or constant-sum (what the game protocol's ``ZERO_SUM`` says)."""
        return self.utility in ("zero_sum", "constant_sum")

    def seat_range(self, seat: int) -> tuple[float, float] | None:
        """The declared reward range of ``seat`` (its own, else ``payoff_range``), None when undeclared."""
        if self.seat_ranges is not None and 0 <= seat < len(self.seat_ranges):
            return self.seat_ranges[seat]
        return self.payoff_range

    def affine(self, scale: float, offset: float = 0.0) -> "GameFacts":
        """The facts of the same game with every reward mapped ``r -> scale * r + offset`` (``scale``
        > 0): the ranges move with it, and a zero-sum game becomes constant-sum unless ``offset`` is 0."""
        import math

        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0 (an affine change keeps the order of outcomes), "
                             f"got {scale!r}")
        if not (isinstance(offset, (int, float)) and math.isfinite(offset)):
            raise ValueError(f"offset must be a finite number, got {offset!r}")

        def move(r):
            return None if r is None else (scale * r[0] + offset, scale * r[1] + offset)

        utility = self.utility
        if utility == "zero_sum" and offset != 0:
            utility = "constant_sum"
        seats = None if self.seat_ranges is None else tuple(move(r) for r in self.seat_ranges)
        return GameFacts(self.num_players, utility, self.information, self.dynamics, self.chance,
                         move(self.payoff_range), seats)

    def describe(self) -> str:
        """One line: ``2 players, zero-sum, imperfect information, sequential, chance, payoffs in [-2, 2]``."""
        def say(value, text):
            return text if value is not None else None

        parts = [(f"{self.num_players} player" + ("s" if self.num_players != 1 else "")) if self.num_players
                 else "any number of players",
                 self.utility.replace("_", "-") if self.utility else "utility unknown",
                 f"{self.information.replace('_', '-')} information" if self.information else "information unknown",
                 self.dynamics or "dynamics unknown",
                 say(self.chance, "chance" if self.chance else "no chance") or "chance unknown",
                 f"payoffs in [{self.payoff_range[0]:g}, {self.payoff_range[1]:g}]" if self.payoff_range
                 else "payoff range unknown"]
        return ", ".join(parts)
