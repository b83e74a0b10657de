"""Leagues without train(): the players come from a list or a Pool the test holds, through the
public subclass API (``players``, ``reset_player``), so league rules are tested on their own. The
players are :class:`~autocurricula.records.Player` objects, as a run's pool makes them."""

import numpy as np


class RunParts:
    """Mixin before a league class: the run's parts that league rules read (``engine``, ``pool``,
    ``standings``, ``payoff``, ``elo``) as plain attributes a test sets one by one, with no run behind them."""

    engine = pool = standings = payoff = elo = None

    @property
    def players(self) -> list[dict]:
        return list(self.pool.players) if self.pool is not None else []


class ListedPlayers(RunParts):
    """Mixin before a league class: ``players`` is ``self.listed``, a list of ``Player`` objects the
    test sets (no engine, no pool)."""

    listed: list = []

    @property
    def players(self) -> list[dict]:
        return list(self.listed)


class PooledPlayers(RunParts):
    """Mixin before a league class: the players live in ``self.pool``, a :class:`Pool` over a
    :class:`FakeEngine`; ``reset_player`` resets them there."""

    @property
    def players(self) -> list[dict]:
        return list(self.pool.players)

    def reset_player(self, player: dict) -> None:
        self.pool.reset(player)


class FakeEngine:
    """Just enough engine for a Pool: adapters as NumPy arrays under their names."""

    linear_dims = {"layers.0.q_proj": (4, 4)}
    model_type = None

    def __init__(self):
        self.adapters, self.versions = {}, {}

    def load_adapter(self, name, weights, version=None):
        self.adapters[name] = weights
        self.versions[name] = self.versions.get(name, 0) + 1
        return self.versions[name]

    def adapter_weights(self, name):
        return self.adapters[name]

    def adapter_info(self, name):
        return {"version": self.versions[name]}


def fake_pool():
    """An empty Pool over a FakeEngine (LoRA r=2 on q_proj)."""
    from autocurricula.engine import LoraSpec
    from autocurricula.loop.pool import Pool

    return Pool(FakeEngine(), LoraSpec(r=2, lora_alpha=4, target_modules=["q_proj"]), np.random.default_rng(0))
