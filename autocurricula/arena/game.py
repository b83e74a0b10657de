"""What a game is, declared: the :class:`Game` protocol that game modules and objects follow, what
its ``play`` must return (:func:`check_rewards`), and the one place where the trainer and credit
methods read a game's optional abilities and facts (:func:`game_moves`, :func:`game_facts`,
:func:`check_tokenizer`, :func:`as_play`)."""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from autocurricula.records import GameFacts


@runtime_checkable
class Stateful(Protocol):
    """A game (or its ``play`` object) that carries state through checkpoints, e.g. an artifact store."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class Game(Protocol):
    """A game as a module or object: ``play(players, model, tokenizer)`` returns one reward per
    player; ``NUM_PLAYERS`` seats (None: any number from 2); ``ZERO_SUM``; ``random_policy(prompt,
    rng)`` a random legal reply. Optional: ``moves(prompt)`` (:class:`ListsMoves`) and
    ``state_dict`` / ``load_state_dict`` (:class:`Stateful`). :func:`as_play` gives the callable."""

    NUM_PLAYERS: int | None
    ZERO_SUM: bool

    def play(self, players: list[dict], model: Any, tokenizer: Any) -> Any: ...

    def random_policy(self, prompt: str, rng: Any = None) -> str: ...


@runtime_checkable
class ListsMoves(Protocol):
    """A game that lists its legal replies at a prompt (branch credit's ``advantage="moves"``)."""

    def moves(self, prompt: str) -> list[str]: ...


def _owner(game):
    """The Game module or object behind ``game`` (a Game itself, the play of a Game object, or the
    ``play`` function of a Game module), or None for a bare play callable."""
    if isinstance(game, GamePlay):
        return game.game
    if isinstance(game, (ModuleType, Game)):
        return game
    if inspect.ismethod(game) and isinstance(game.__self__, Game) and game.__self__.play == game:
        return game.__self__
    home = sys.modules.get(getattr(game, "__module__", None) or "")
    if home is not None and isinstance(home, Game) and home.play is game:
        return home
    return None


def game_facts(game) -> GameFacts:
    """What ``game`` declares about itself (:class:`~autocurricula.records.GameFacts`): its ``FACTS``
    (a module) or ``facts`` (an object), else what is safe to infer: the seats from ``NUM_PLAYERS``
    and zero-sum or general-sum from ``ZERO_SUM``, everything else unknown. A bare play callable
    declares nothing but that it has some number of players. ``game`` as :func:`game_moves` takes it."""
    owner = _owner(game)
    if owner is None:
        return GameFacts(num_players=None)
    declared = getattr(owner, "FACTS", None)
    if declared is None:
        declared = getattr(owner, "facts", None)
    if callable(declared) and not isinstance(declared, GameFacts):
        declared = declared()
    if declared is not None:
        if not isinstance(declared, GameFacts):
            raise TypeError(f"{_label(owner)} declares facts of type {type(declared).__name__}; declare an "
                            f"autocurricula.records.GameFacts")
        return declared
    n = getattr(owner, "NUM_PLAYERS", None)
    zero = getattr(owner, "ZERO_SUM", None)
    return GameFacts(num_players=n if isinstance(n, int) else None,
                     utility=None if zero is None else ("zero_sum" if zero else "general_sum"))


def check_tokenizer(game, tokenizer) -> None:
    """Let ``game`` check its words against the model's ``tokenizer`` before training (its
    ``check_tokenizer(tokenizer)``, when it has one: a matrix game refuses a word the tokenizer
    splits). ``ValueError`` names the problem; a game without the method passes."""
    owner = _owner(game)
    check = getattr(owner, "check_tokenizer", None) if owner is not None else None
    if callable(check):
        check(tokenizer)


def _label(owner) -> str:
    return owner.__name__ if isinstance(owner, ModuleType) else type(owner).__name__


def game_name(play: Callable) -> str:
    """A game's name for turns, cards and baselines: its module's last part (``"game"`` when the
    callable has no module, e.g. a ``functools.partial``)."""
    module = getattr(play, "__module__", None) or "game"
    return module.rsplit(".", 1)[-1]


def game_moves(game) -> Callable[[str], list[str]] | None:
    """A game's ``moves(prompt) -> list[str]`` when it lists its legal replies, else None. ``game``
    is a :class:`Game` module or object, or a play callable: the play of a Game object (see
    :func:`as_play`) or the ``play`` of a Game module (e.g. ``tictactoe.play``) reaches its game's."""
    if isinstance(game, GamePlay):
        return game_moves(game.game)
    if isinstance(game, (ModuleType, Game)):
        return game.moves if isinstance(game, ListsMoves) else None
    if inspect.ismethod(game) and isinstance(game.__self__, Game) and game.__self__.play == game:
        return game_moves(game.__self__)
    home = sys.modules.get(getattr(game, "__module__", None) or "")
    if home is not None and isinstance(home, Game) and home.play is game:
        return game_moves(home)
    return None


class GamePlay:
    """The play callable of a :class:`Game` object (:func:`as_play`): calls ``game.play`` and
    carries its name."""

    def __init__(self, game):
        self.game = game
        self.__name__ = getattr(game, "__name__", type(game).__name__)
        self.__module__ = getattr(game, "__module__", None) or type(game).__module__

    def __call__(self, players: list[dict], model: Any, tokenizer: Any, **options):
        return self.game.play(players, model, tokenizer, **options)


class AsyncGamePlay(GamePlay):
    """:class:`GamePlay` of a game whose ``play`` is a coroutine function."""

    async def __call__(self, players: list[dict], model: Any, tokenizer: Any, **options):
        return await self.game.play(players, model, tokenizer, **options)


class _CarriesState:
    """The play of a :class:`Stateful` game carries its state through checkpoints; only such a
    play is Stateful itself (a credit method that replays games refuses stateful games)."""

    def state_dict(self) -> dict:
        return self.game.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.game.load_state_dict(state)


class StatefulGamePlay(_CarriesState, GamePlay):
    """:class:`GamePlay` of a :class:`Stateful` game."""


class StatefulAsyncGamePlay(_CarriesState, AsyncGamePlay):
    """:class:`AsyncGamePlay` of a :class:`Stateful` game."""


def as_play(game) -> Callable:
    """The play callable of ``game``: a :class:`Game` module's ``play`` (its ``moves`` stay reachable
    through :func:`game_moves`), a :class:`GamePlay` for a Game object (its ``moves`` and
    ``state_dict`` stay reachable through :func:`game_moves` and :class:`Stateful`), or ``game``
    itself when it is a play callable already."""
    if isinstance(game, ModuleType):
        if not isinstance(game, Game):
            missing = [n for n in ("play", "NUM_PLAYERS", "ZERO_SUM", "random_policy") if not hasattr(game, n)]
            raise TypeError(f"module {game.__name__} is not a Game: it lacks {', '.join(missing)}; "
                            f"define them at module level (see autocurricula.arena.game.Game)")
        return game.play
    if isinstance(game, Game):
        is_async, stateful = inspect.iscoroutinefunction(game.play), isinstance(game, Stateful)
        return ((StatefulAsyncGamePlay if stateful else AsyncGamePlay) if is_async
                else (StatefulGamePlay if stateful else GamePlay))(game)
    if callable(game):
        return game
    raise TypeError(f"a game is a play function or a Game module or object, got {type(game).__name__}")


def check_rewards(out, n_players: int, *, returned=None) -> list[float]:
    """One finite float per player from what a game's ``play`` returned (a list, tuple or 1-D array
    of numbers); ``returned``: the value to show in the error when ``out`` was taken out of it."""
    rewards = out
    if isinstance(rewards, np.ndarray) and rewards.ndim == 1:
        rewards = rewards.tolist()
    if not isinstance(rewards, (list, tuple)) or not all(_is_number(r) for r in rewards):
        raise TypeError(f"play must return one number per player (e.g. [1.0, -1.0]) or a GameResult; a synchronous "
                        f"play may also return the seed style ([rewards], [experiences]); it returned "
                        f"{_describe(out if returned is None else returned)}")
    rewards = [float(r) for r in rewards]
    if len(rewards) != n_players:
        raise ValueError(f"play returned {len(rewards)} rewards for {n_players} players; return one per player")
    if not all(np.isfinite(rewards)):
        raise ValueError(f"play returned non-finite rewards {rewards}; give finite numbers (e.g. a penalty of -1.5)")
    if any(abs(r) > FLOAT32_MAX for r in rewards):
        raise ValueError(f"play returned rewards {rewards}, outside float32's range (|r| <= {FLOAT32_MAX:.3g}): the "
                         f"update computes in float32, where they overflow. Scale them down (e.g. to [-1, 1])")
    return rewards


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating, np.bool_))  # bool is an int (seed style)


def _describe(out) -> str:
    text = repr(out)
    return f"{type(out).__name__} {text[:80] + '...' if len(text) > 80 else text}"
