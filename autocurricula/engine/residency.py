"""Device copies of the players' adapters: the slot table's decisions applied to the LoRA stacks.

Owned by the engine thread. :class:`~autocurricula.engine.slots.SlotTable` decides which player
lives in which slot (pure bookkeeping); this writes those decisions into the multi-LoRA stacks,
keeps the stacks as wide as the widest adapter held, and tells listeners (the prefix cache) when
a player's weights change or leave, since KV rows computed under old weights are then stale.
A player's host weights may be spilled to disk (:mod:`~autocurricula.engine.spill`); writing its
slot then reads them back.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from autocurricula.engine.adapters import AdapterWeights
from autocurricula.engine.slots import AdapterRecord, SlotTable
from autocurricula.engine.spill import SpilledWeights, discard, read_spill


class Residency:
    def __init__(self, slots: SlotTable, lora, initial_rank: int):
        self.slots, self.lora, self.initial_rank = slots, lora, initial_rank
        self.on_change: list[Callable[[str], None]] = []  # called with a player's name

    def install(self, name: str, weights: AdapterWeights, version: int | None = None) -> int:
        """Add or replace a player's weights; a resident player's slot is rewritten at once."""
        self.lora.ensure(list(weights.modules), weights.rank)
        old = self.slots.records.get(name)
        old = old.weights if old is not None else None
        rec = self.slots.add(name, weights, version)
        discard(old)  # a spilled copy of the replaced weights
        self.fit_rank()  # a hot swap may have replaced the widest adapter
        if rec.slot is not None:
            self.write(rec)
        self._changed(name)
        return rec.version

    def acquire(self, name: str) -> AdapterRecord | None:
        """Pin ``name`` in a slot, writing its weights there when it was not resident; None when
        every slot is pinned by running rows."""
        got = self.slots.acquire(name)
        if got is None:
            return None
        rec, needs_write = got
        if needs_write:
            try:
                self.write(rec)
            except Exception:  # e.g. a spilled copy that cannot be read back: give the slot back
                self.slots.owner.pop(rec.slot, None)
                rec.slot = None
                rec.pins -= 1
                raise
        return rec

    def release(self, name: str) -> None:
        self.slots.release(name)

    def drop(self, rec: AdapterRecord) -> None:
        """Forget a player entirely (its slot is zeroed and the stacks may narrow)."""
        slot = rec.slot
        self.slots.remove(rec.name)
        discard(rec.weights)
        if slot is not None:
            for layer in self.lora.layers.values():
                layer.write_slot(slot, None, None, 0.0)
        self.fit_rank()
        self._changed(rec.name)

    def fit_rank(self) -> None:
        # The stacks are as wide as the widest adapter still held (at least initial_rank), so a
        # high-rank adapter leaving gives its memory and its per-step cost back.
        want = max([self.initial_rank] + [r.weights.rank for r in self.slots.records.values()])
        if want < self.lora.rank:
            self.lora.fit_rank(want)

    def spill(self, name: str, weights: AdapterWeights, spilled: SpilledWeights, busy: Callable[[str], bool]) -> bool:
        """Put ``spilled`` (written from ``weights``) in place of a player's host weights, freeing
        them. Refused (False, the file removed) when the player is gone, its weights changed since,
        a running row pins it, or ``busy(name)`` (a queued request wants it)."""
        rec = self.slots.records.get(name)
        if rec is None or rec.deleted or rec.weights is not weights or rec.pins > 0 or busy(name):
            discard(spilled)
            return False
        rec.weights = spilled
        return True

    @staticmethod
    def host_weights(rec: AdapterRecord) -> AdapterWeights:
        """A record's weights, read back from disk (a transient copy) when they are spilled."""
        w = rec.weights
        return read_spill(w) if isinstance(w, SpilledWeights) else w

    def write(self, rec: AdapterRecord) -> None:
        """Copy a record's host weights into its slot of every stack."""
        w = self.host_weights(rec)
        for path, layer in self.lora.layers.items():
            pair = w.modules.get(path)
            if pair is None:
                layer.write_slot(rec.slot, None, None, 0.0)
            else:
                layer.write_slot(rec.slot, mx.array(pair[0]), mx.array(pair[1]), w.scale)
        mx.eval([(layer.lora_a, layer.lora_b) for layer in self.lora.layers.values()])
        rec.loads += 1

    def _changed(self, name: str) -> None:
        for fn in self.on_change:
            fn(name)
