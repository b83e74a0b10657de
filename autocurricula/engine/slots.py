"""Which player's adapter lives in which device slot: versions, pins and LRU eviction.

Pure bookkeeping (no MLX), owned by the engine thread. Slot 0 is "no adapter". A slot is
pinned while a running row uses it; only unpinned slots are evicted (least recently used first),
so requests wait for a slot instead of failing when more players than slots are active.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from autocurricula.engine.adapters import AdapterWeights


@dataclass
class AdapterRecord:
    name: str
    weights: AdapterWeights  # authoritative host copy; the slot holds a device copy
    version: int = 1
    slot: int | None = None
    pins: int = 0
    last_used: int = 0
    loads: int = 0  # times copied into a slot (reloads after eviction count too)
    deleted: bool = False  # unloaded while rows still use it: dropped when the last one ends


@dataclass
class SlotTable:
    num_slots: int  # usable slots, excluding slot 0
    records: dict[str, AdapterRecord] = field(default_factory=dict)
    owner: dict[int, str] = field(default_factory=dict)
    evictions: int = 0
    last_version: dict[str, int] = field(default_factory=dict)  # survives unload, so versions never repeat
    _clock: itertools.count = field(default_factory=itertools.count)

    def touch(self, rec: AdapterRecord) -> None:
        rec.last_used = next(self._clock)

    def add(self, name: str, weights: AdapterWeights, version: int | None = None) -> AdapterRecord:
        """Add or replace; ``version`` (e.g. restoring a checkpoint) must exceed every earlier one."""
        rec = self.records.get(name)
        if version is not None and version <= self.last_version.get(name, 0):
            raise ValueError(f"version {version} of {name!r} is not newer than {self.last_version[name]}")
        version = version or self.last_version.get(name, 0) + 1
        if rec is None:
            rec = self.records[name] = AdapterRecord(name, weights, version=version)
        else:
            rec.weights, rec.version, rec.deleted = weights, version, False
        self.last_version[name] = version
        self.touch(rec)
        return rec

    def remove(self, name: str) -> AdapterRecord:
        rec = self.records.pop(name)
        if rec.slot is not None:
            self.owner.pop(rec.slot, None)
        return rec

    def acquire(self, name: str) -> tuple[AdapterRecord, bool] | None:
        """Give ``name`` a slot and pin it. Returns (record, needs_write) or None when every slot
        is pinned by running rows (the caller retries after rows finish)."""
        rec = self.records[name]
        if rec.slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            rec.slot = slot
            self.owner[slot] = name
            needs_write = True
        else:
            needs_write = False
        rec.pins += 1
        self.touch(rec)
        return rec, needs_write

    def release(self, name: str) -> None:
        rec = self.records.get(name)
        if rec is not None and rec.pins > 0:
            rec.pins -= 1

    def _free_slot(self) -> int | None:
        used = set(self.owner)
        for s in range(1, self.num_slots + 1):
            if s not in used:
                return s
        victims = [self.records[n] for n in self.owner.values() if self.records[n].pins == 0]
        if not victims:
            return None
        victim = min(victims, key=lambda r: r.last_used)
        slot = victim.slot
        victim.slot = None
        del self.owner[slot]
        self.evictions += 1
        return slot
