"""The placement policy of :class:`~autocurricula.fleet.fleet.Fleet`: sticky per player (its adapter
stays resident); a new player goes to the worker with the fewest players, then fewest requests in flight.
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
