"""What a game is, declared: the :class:`Game` protocol that game modules and objects follow, and
the one place where the trainer and credit methods read a game's optional abilities."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """A game (or its ``play`` object) that carries state through checkpoints, e.g. an artifact store."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class Game(Protocol):
    """A game as a module or object: ``play(players, model, tokenizer)`` returns one reward per
    player; ``NUM_PLAYERS`` seats; ``ZERO_SUM`` whether rewards of a game sum to zero;
    ``random_policy(prompt, rng)`` a legal reply drawn at random. Optional: ``moves(prompt)``, the
    legal replies at a prompt (branch credit's ``advantage="moves"``), and ``state_dict`` /
    ``load_state_dict`` (see :class:`Stateful`). The conformance suite (tests/test_games.py) checks
    the built-in games against it."""

    NUM_PLAYERS: int
    ZERO_SUM: bool

    def play(self, players: list[dict], model: Any, tokenizer: Any) -> Any: ...

    def random_policy(self, prompt: str, rng: Any = None) -> str: ...


def game_name(play: Callable) -> str:
    """A game's name for turns, cards and baselines: its module's last part (``"game"`` when the
    callable has no module, e.g. a ``functools.partial``)."""
    module = getattr(play, "__module__", None) or "game"
    return module.rsplit(".", 1)[-1]


def game_moves(play: Callable) -> Callable[[str], list[str]] | None:
    """A game's ``moves(prompt) -> list[str]``, when it lists its legal replies; else None. A play
    function declares it as ``play.moves = moves`` (the built-in games do)."""
    moves = getattr(play, "moves", None)
    return moves if callable(moves) else None
