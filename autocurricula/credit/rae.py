"""RAE (SPIRAL, arXiv 2506.24119): one EMA baseline per (game, role), ``A = R - b`` with ``b`` read
before ``b <- alpha * b + (1 - alpha) * R`` (alpha = 0.95, b0 = 0); updated once per episode, as
SPIRAL does per trajectory, all its turns sharing the advantage. Option: a baseline per player."""

from __future__ import annotations

from dataclasses import dataclass, field

from autocurricula.credit.base import Credit, episodes, rewards
from autocurricula.records import Turn


@dataclass
class RAE:
    """Role-conditioned advantage estimation with EMA baselines; ``state_dict`` is JSON-able."""

    alpha: float = 0.95
    per_player: bool = False
    baselines: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if not 0 <= self.alpha < 1:
            raise ValueError(f"RAE alpha must be in [0, 1), got {self.alpha}")

    def key(self, turn: Turn) -> str:
        parts = [turn.game, turn.role] + ([turn.player] if self.per_player else [])
        return "|".join(parts)

    def advantages(self, turns: list[Turn]) -> list[float]:
        """Advantages for ``turns`` and the baseline updates they imply, episode by episode."""
        r = rewards(turns)
        out = [0.0] * len(turns)
        for idx in episodes(turns):
            first = turns[idx[0]]
            k = self.key(first)
            b = self.baselines.get(k, 0.0)  # read before the update
            for i in idx:
                out[i] = r[i] - b
            self.baselines[k] = self.alpha * b + (1 - self.alpha) * r[idx[0]]
        return out

    def state_dict(self) -> dict:
        return {"alpha": self.alpha, "per_player": self.per_player, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict) -> None:
        self.alpha = float(state["alpha"])
        self.per_player = bool(state["per_player"])
        self.baselines = {str(k): float(v) for k, v in state["baselines"].items()}


@dataclass
class RAECredit(Credit):
    """``credit="rae"``: SPIRAL's role baselines (:class:`RAE`, in ``self.rae``): ``alpha`` the EMA
    factor, ``per_player`` one baseline per (game, role, player). Checkpointed as ``"rae"``."""

    alpha: float = 0.95
    per_player: bool = False
    name = "rae"

    def __post_init__(self):
        self.rae = RAE(self.alpha, self.per_player)

    def advantages(self, turns: list[Turn]) -> list[float]:
        return self.rae.advantages(turns)

    def state_dict(self) -> dict:
        return {"rae": self.rae.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rae"):
            self.rae.load_state_dict(state["rae"])
