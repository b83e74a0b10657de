"""Where a player's requests go among several workers (servers or Ray actors), and the
tokenizer-side methods that every remote engine shares.

:func:`pick_worker` is the placement policy of :class:`~autocurricula.remote.RemoteEngine` and
:class:`~autocurricula.cluster.RayEngine`: sticky per player (its adapter stays resident), a new
player goes to the worker with the fewest players, ties broken by requests in flight.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence


def pick_worker(up: Sequence[Any], placement: dict[str, Any], player: str | None,
                key: Callable[[Any], Hashable] = id) -> Any | None:
    """The worker of ``up`` (workers that take work, each with an ``inflight`` count) for
    ``player``. Records a new player's choice in ``placement``; ``None`` when ``up`` is empty."""
    if not up:
        return None
    if player is None:  # the base model: any worker, the least busy
        return min(up, key=lambda w: w.inflight)
    cur = placement.get(player)
    if cur is not None and cur in up:
        return cur
    counts = {key(w): 0 for w in up}
    for w in placement.values():
        if key(w) in counts:
            counts[key(w)] += 1
    chosen = min(up, key=lambda w: (counts[key(w)], w.inflight))
    placement[player] = chosen
    return chosen


class TokenizerFront:
    """Text and chat-template helpers over ``self.tokenizer``, and the player list over
    ``self._adapters``: what an engine made of remote workers answers locally."""

    tokenizer: Any
    _adapters: dict

    def players(self) -> list[str]:
        return sorted(self._adapters)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
