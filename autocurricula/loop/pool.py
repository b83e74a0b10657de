"""The player pool: spec dicts in, :class:`~autocurricula.records.Player` objects out, adapters
behind their ids.

A spec is a dict (``{"role": "main_agent", ...}`` as ``entry`` returns it) whose keys are the
fields of a :class:`Player` (or of the trainer's ``player_class``); the pool makes each into a
player once, refusing a key that no field declares, adds ``id``, ``epoch``, ``parent``, ``frozen``
and ``version`` and keeps the LoRA weights in the engine under ``id``. New players inherit their
parent's current weights (the original autocurricula started every player from scratch); ``reset``
gives a player a fresh adapter equal to the base model (B = 0, as peft initialises LoRA). A
snapshot is one more spec, :func:`snapshot_spec`: a frozen copy of its parent's weights at the
moment it joins.

A scripted player carries a ``"policy"`` callable instead of an adapter (:func:`is_scripted`); it
is called as ``policy(prompt)`` or ``policy(prompt, rng)`` (:func:`call_scripted`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Callable

import numpy as np

from autocurricula.records import Player, call_scripted, is_scripted, takes_rng

__all__ = ["Player", "Pool", "call_scripted", "fresh_adapter", "is_scripted", "snapshot_spec", "takes_rng"]

if TYPE_CHECKING:
    from autocurricula.engine import AdapterWeights, LoraSpec

RESERVED = ("id", "epoch", "parent", "frozen", "version")
_REFERENCES = ("parent", "snapshot_of")  # spec fields that name another player


def snapshot_spec(player: Mapping, **extra) -> dict:
    """The spec of a frozen copy of ``player`` (its weights when the spec joins the pool), as ``entry``
    or ``on_round_end`` return it: ``{..., "frozen": True, "parent": id, "snapshot_of": id}``, with
    the player's other set fields (role, info, a ``player_class``'s own). ``player`` may also be a
    spec earlier in the same list (a player entering now): the pool links the two when it adds them
    in order."""
    spec = {k: v for k, v in player.items() if k not in RESERVED}
    ref = player["id"] if "id" in player else player
    spec.update({"frozen": True, "parent": ref, "snapshot_of": ref, **extra})
    return spec


def fresh_adapter(dims: dict[str, tuple[int, int]], spec: LoraSpec, rng: np.random.Generator) -> AdapterWeights:
    """peft's default LoRA init: A ~ kaiming-uniform(a=sqrt(5)) i.e. U(-1/sqrt(in), 1/sqrt(in)),
    B = 0, so the new player behaves exactly like the base model."""
    from autocurricula.engine import AdapterWeights  # MLX only when adapters are made

    mods = {}
    for path, (din, dout) in dims.items():
        bound = 1.0 / math.sqrt(din)
        a = rng.uniform(-bound, bound, (din, spec.r)).astype(np.float32)
        mods[path] = (a, np.zeros((spec.r, dout), np.float32))
    return AdapterWeights(mods, spec.scale)


class Pool:
    """Players of one league, in entry order, each a ``player_class`` (:class:`Player` or a subclass
    that declares more fields)."""

    def __init__(self, engine, spec: LoraSpec, rng: np.random.Generator, player_class: type[Player] = Player):
        self.engine, self.spec, self.rng = engine, spec, rng
        self.player_class = Player.check_class(player_class)
        self.players: list[Player] = []
        self._counts: dict[str, int] = {}
        # the family's default targets, and what a peft export cannot name, by the model's model_type
        targets = spec.resolve(engine.linear_dims, model_type=engine.model_type)
        self.dims = {p: engine.linear_dims[p] for p in targets}

    def __iter__(self):
        return iter(self.players)

    def __len__(self):
        return len(self.players)

    def get(self, player_id: str) -> Player:
        for p in self.players:
            if p.id == player_id:
                return p
        raise KeyError(f"no player {player_id!r} in the pool")

    def _new_id(self, role: str, epoch: int) -> str:
        base = "".join(c if c.isalnum() or c in "_-" else "_" for c in str(role)) or "player"
        taken = {p.id for p in self.players}
        k = self._counts.get(base, 0)
        while f"{base}-{k}" in taken:  # e.g. an opponent given the id "main-1"
            k += 1
        self._counts[base] = k + 1
        return f"{base}-{k}"

    def _default_parent(self, role) -> Player | None:
        # the latest trainable player of the same role, else none: a new role starts from the base
        # model (a discriminator must not start as a copy of the generator)
        same = [p for p in self.players if p.role == role and not p.frozen and not is_scripted(p)]
        return same[-1] if same else None

    def add(self, spec: Mapping, epoch: int, inherit: bool = True) -> Player:
        """Create a player from ``spec``: ``parent`` (an id) picks whose weights to copy, else the
        latest trainable player of the same role; ``"init": "base"`` starts from the base model. A
        key of ``spec`` that no field of ``player_class`` declares is refused, naming the known ones."""
        if not isinstance(spec, Mapping):
            raise TypeError(f"entry() must return player dicts, got {type(spec).__name__}")
        self.player_class.check_spec(spec)  # an unknown key is refused before anything else
        make = self.player_class.from_spec
        role = spec.get("role", "player")
        pid = spec.get("id") or self._new_id(role, epoch)
        if any(p.id == pid for p in self.players):
            raise ValueError(f"player id {pid!r} already exists")
        if is_scripted(spec):  # no adapter, never trained
            if not callable(spec["policy"]):
                raise TypeError(f"player {pid}: 'policy' must be a callable prompt -> reply")
            player = make(spec, id=pid, role=role, epoch=epoch, frozen=True, parent=None, version=None)
            self.players.append(player)
            return player
        parent = None
        if spec.get("parent") is not None:
            parent = self.get(spec["parent"]) if isinstance(spec["parent"], str) else self.get(spec["parent"]["id"])
        elif inherit and spec.get("init") != "base":
            parent = self._default_parent(role)
        player = make(spec, id=pid, role=role, epoch=epoch, frozen=bool(spec.get("frozen", False)),
                      parent=parent.id if parent else None, version=None)
        if parent is not None and not is_scripted(parent):
            weights = self.engine.adapter_weights(parent.adapter if parent.adapter is not None else parent.id)
        else:
            weights = fresh_adapter(self.dims, self.spec, self.rng)
        player.version = self.engine.load_adapter(player.id, weights)
        self.players.append(player)
        return player

    def add_all(self, specs: Iterable[Mapping], epoch: int) -> list[Player]:
        """Add ``specs`` in order; a ``parent`` or ``snapshot_of`` that is an earlier spec of the same
        list (see :func:`snapshot_spec`) becomes that new player's id. A generator (such as
        ``on_round_end``) gets each new player back as the value of its ``yield``. Returns the new
        players."""
        added: dict[int, Player] = {}  # id(spec) -> the player made from it
        out = []
        generator = specs if isinstance(specs, Generator) else None
        specs = iter(specs)
        try:
            spec = next(specs)
            while True:
                resolved = spec
                if isinstance(spec, Mapping):
                    links = {k: spec[k] for k in _REFERENCES if isinstance(spec.get(k), Mapping)}
                    resolved = {**spec, **{k: added[id(v)].id if id(v) in added else _ref_id(k, v)
                                           for k, v in links.items()}}
                added[id(spec)] = player = self.add(resolved, epoch)
                out.append(player)
                spec = generator.send(player) if generator is not None else next(specs)
        except StopIteration:
            pass
        return out

    def reset(self, player: Player) -> None:
        """Back to the base model (fresh LoRA init); the caller drops its optimizer state."""
        player.version = self.engine.load_adapter(player.id, fresh_adapter(self.dims, self.spec, self.rng))
        player.resets += 1

    def refresh_versions(self) -> None:
        for p in self.players:
            if not is_scripted(p):
                p.version = self.engine.adapter_info(p.id)["version"]

    def registry(self) -> list[dict]:
        """JSON-able view: each player's set fields (scripted players keep their place, without the
        callable); the format of a checkpoint's ``players.json``."""
        out = []
        for p in self.players:
            q = {k: v for k, v in p.items() if k != "policy" and _jsonable(v)}
            if is_scripted(p):
                q["scripted"] = getattr(p.policy, "__name__", "policy")
            out.append(q)
        return out

    def restore(self, registry: list[dict], policies: dict[str, Callable] | None = None,
                opponents: list[Mapping] | None = None) -> None:
        """Rebuild from :meth:`registry`; adapters are loaded by the caller. Scripted players get
        their callable from ``policies`` (by id), else from the ``opponents`` without an id that
        have the same role and policy name. A key that no field of ``player_class`` declares is
        refused, as in a spec."""
        self.players, self._counts = [], {}
        spare = [o for o in opponents or [] if isinstance(o, Mapping) and is_scripted(o) and "id" not in o]
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
            self.players.append(self.player_class.from_spec(p))


def _ref_id(field: str, player: Mapping) -> str:
    if "id" not in player:
        raise ValueError(f"a spec's {field!r} names a player dict without an id that is not an earlier spec of the "
                         f"same list: pass the player's id, or put its spec before this one")
    return player["id"]


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
