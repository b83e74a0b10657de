"""ArtifactStore: items a game produced and accepted (problems, prompts, attacks), with weights,
for later games to sample from -- curriculum learning, as the Legos / Self-Play Engine designs'
``ArtifactStore``. Pure Python; ``state_dict`` is JSON-able so a checkpoint can carry it."""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Any


class ArtifactStore:
    """Weighted items, at most ``capacity`` of them (the lowest weight leaves first; ties: the
    oldest). Adding an item already held moves its weight toward the new one by ``update``
    (1.0 replaces it) and counts the visit."""

    def __init__(self, capacity: int = 1000, update: float = 0.5):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if not 0 < update <= 1:
            raise ValueError(f"update must be in (0, 1], got {update}")
        self.capacity, self.update = int(capacity), float(update)
        self.items: dict[str, list] = {}  # item -> [weight, times added, insertion number]
        self._added = 0

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item) -> bool:
        return item in self.items

    def add(self, item: str, weight: float = 1.0) -> None:
        """Accept ``item`` with ``weight`` (finite, >= 0)."""
        weight = float(weight)
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"an artifact's weight must be finite and >= 0, got {weight}")
        item = str(item)
        if item in self.items:
            entry = self.items[item]
            entry[0] += self.update * (weight - entry[0])
            entry[1] += 1
            return
        self.items[item] = [weight, 1, self._added]
        self._added += 1
        if len(self.items) > self.capacity:
            drop = min(self.items, key=lambda k: (self.items[k][0], self.items[k][2]))
            del self.items[drop]

    def weight(self, item: str) -> float:
        return self.items[item][0]

    def sample(self, rng: Any, k: int | None = None):
        """One item (``k=None``) or ``k`` items, drawn with replacement in proportion to their weights
        (uniformly when all weights are 0). ``rng``: ``random.Random`` or a NumPy Generator."""
        if not self.items:
            raise ValueError("the artifact store is empty: add items before sampling")
        keys = sorted(self.items)  # sorted: the same draw on every run, whatever the insertion order
        weights = [self.items[key][0] for key in keys]
        if sum(weights) <= 0:
            weights = [1.0] * len(keys)
        cum = list(itertools.accumulate(weights))
        draws = []
        for _ in range(1 if k is None else k):
            u = (rng.random() if hasattr(rng, "random") else float(rng.uniform())) * cum[-1]
            draws.append(keys[min(bisect.bisect_right(cum, u), len(keys) - 1)])
        return draws[0] if k is None else draws

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "update": self.update, "added": self._added,
                "items": [[key, w, n, order] for key, (w, n, order) in self.items.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.update = int(state["capacity"]), float(state["update"])
        self._added = int(state["added"])
        self.items = {str(key): [float(w), int(n), int(order)] for key, w, n, order in state["items"]}

    def __repr__(self) -> str:
        return f"ArtifactStore({len(self)} items, capacity={self.capacity})"
