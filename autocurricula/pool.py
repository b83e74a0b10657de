"""The player pool: plain dicts in, adapters behind their ids.

A player is a dict (``{"role": "main_agent", ...}`` as ``entry`` returns it); the pool adds
``id``, ``epoch``, ``parent``, ``frozen`` and ``version`` and keeps the LoRA weights in the engine
under ``id``. New players inherit their parent's current weights (the original autocurricula
started every player from scratch); ``reset`` gives a player a fresh adapter equal to the base
model (B = 0, as peft initialises LoRA); ``snapshot`` adds a frozen copy.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from autocurricula.engine import AdapterWeights, LoraSpec

RESERVED = ("id", "epoch", "parent", "frozen", "version")


def fresh_adapter(dims: dict[str, tuple[int, int]], spec: LoraSpec, rng: np.random.Generator) -> AdapterWeights:
    """peft's default LoRA init: A ~ kaiming-uniform(a=sqrt(5)) i.e. U(-1/sqrt(in), 1/sqrt(in)),
    B = 0, so the new player behaves exactly like the base model."""
    mods = {}
    for path, (din, dout) in dims.items():
        bound = 1.0 / math.sqrt(din)
        a = rng.uniform(-bound, bound, (din, spec.r)).astype(np.float32)
        mods[path] = (a, np.zeros((spec.r, dout), np.float32))
    return AdapterWeights(mods, spec.scale)


class Pool:
    """Players of one league, in entry order."""

    def __init__(self, engine, spec: LoraSpec, rng: np.random.Generator):
        self.engine, self.spec, self.rng = engine, spec, rng
        self.players: list[dict] = []
        self._counts: dict[str, int] = {}
        self.dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}

    def __iter__(self):
        return iter(self.players)

    def __len__(self):
        return len(self.players)

    def get(self, player_id: str) -> dict:
        for p in self.players:
            if p["id"] == player_id:
                return p
        raise KeyError(f"no player {player_id!r} in the pool")

    def _new_id(self, role: str, epoch: int) -> str:
        base = "".join(c if c.isalnum() or c in "_-" else "_" for c in str(role)) or "player"
        taken = {p["id"] for p in self.players}
        k = self._counts.get(base, 0)
        while f"{base}-{k}" in taken:  # e.g. an opponent given the id "main-1"
            k += 1
        self._counts[base] = k + 1
        return f"{base}-{k}"

    def _default_parent(self, spec: dict) -> dict | None:
        # latest trainable player of the same role, else the latest trainable player, else none (base)
        same = [p for p in self.players if p.get("role") == spec.get("role") and not p["frozen"] and "policy" not in p]
        anyone = [p for p in self.players if not p["frozen"] and "policy" not in p]
        return (same or anyone or [None])[-1]

    def add(self, spec: dict, epoch: int, inherit: bool = True) -> dict:
        """Create a player from ``spec``: ``parent`` (an id) picks whose weights to copy, else the
        latest trainable player of the same role; ``"init": "base"`` starts from the base model."""
        if not isinstance(spec, dict):
            raise TypeError(f"entry() must return player dicts, got {type(spec).__name__}")
        player = dict(spec)
        player.setdefault("role", "player")
        player["id"] = spec.get("id") or self._new_id(player["role"], epoch)
        if any(p["id"] == player["id"] for p in self.players):
            raise ValueError(f"player id {player['id']!r} already exists")
        player["epoch"] = epoch
        player["frozen"] = bool(spec.get("frozen", False))
        if "policy" in player:  # scripted: no adapter, never trained
            if not callable(player["policy"]):
                raise TypeError(f"player {player['id']}: 'policy' must be a callable prompt -> reply")
            player["frozen"], player["parent"], player["version"] = True, None, None
            self.players.append(player)
            return player
        parent = None
        if spec.get("parent") is not None:
            parent = self.get(spec["parent"]) if isinstance(spec["parent"], str) else self.get(spec["parent"]["id"])
        elif inherit and spec.get("init") != "base":
            parent = self._default_parent(player)
        player["parent"] = parent["id"] if parent else None
        if parent is not None and "policy" not in parent:
            weights = self.engine.adapter_weights(parent.get("adapter", parent["id"]))
        else:
            weights = fresh_adapter(self.dims, self.spec, self.rng)
        player["version"] = self.engine.load_adapter(player["id"], weights)
        self.players.append(player)
        return player

    def snapshot(self, player: dict, epoch: int, **extra) -> dict:
        """A frozen copy of ``player``'s current weights joins the pool."""
        spec = {k: v for k, v in player.items() if k not in RESERVED}
        spec.update({"frozen": True, "parent": player["id"], "snapshot_of": player["id"], **extra})
        return self.add(spec, epoch)

    def reset(self, player: dict) -> None:
        """Back to the base model (fresh LoRA init); the caller drops its optimizer state."""
        player["version"] = self.engine.load_adapter(player["id"], fresh_adapter(self.dims, self.spec, self.rng))
        player["resets"] = player.get("resets", 0) + 1

    def refresh_versions(self) -> None:
        for p in self.players:
            if "policy" not in p:
                p["version"] = self.engine.adapter_info(p["id"])["version"]

    def registry(self) -> list[dict]:
        """JSON-able view (scripted players keep their place, without the callable)."""
        out = []
        for p in self.players:
            q = {k: v for k, v in p.items() if k != "policy" and _jsonable(v)}
            if "policy" in p:
                q["scripted"] = getattr(p["policy"], "__name__", "policy")
            out.append(q)
        return out

    def restore(self, registry: list[dict], policies: dict[str, Callable] | None = None,
                opponents: list[dict] | None = None) -> None:
        """Rebuild from :meth:`registry`; adapters are loaded by the caller. Scripted players get
        their callable from ``policies`` (by id), else from the ``opponents`` without an id that
        have the same role and policy name."""
        self.players, self._counts = [], {}
        spare = [o for o in opponents or [] if isinstance(o, dict) and "policy" in o and "id" not in o]
        for q in registry:
            p = dict(q)
            if "scripted" in p:
                name = p.pop("scripted")
                if policies and p["id"] in policies:
                    p["policy"] = policies[p["id"]]
                else:
                    match = next((o for o in spare if o.get("role", "player") == p.get("role")
                                  and getattr(o["policy"], "__name__", "policy") == name), None)
                    if match is None:
                        raise ValueError(f"scripted player {p['id']} ({name}) needs its policy callable again on "
                                         f"resume: pass it in opponents= as in the first run, or "
                                         f"train(..., policies={{{p['id']!r}: {name}}})")
                    spare.remove(match)
                    p["policy"] = match["policy"]
            base, _, k = p["id"].rpartition("-")
            if k.isdigit():
                self._counts[base] = max(self._counts.get(base, 0), int(k) + 1)
            self.players.append(p)


def _jsonable(v) -> bool:
    import json

    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
