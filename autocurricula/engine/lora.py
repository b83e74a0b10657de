"""Multi-LoRA linear layers: many players' adapters in one forward pass.

Each adapted linear keeps stacked adapters ``lora_a: (slots, in, R)`` and ``lora_b: (slots, R, out)``
and applies, per batch row, the adapter of that row's slot (S-LoRA / Punica, arXiv 2311.03285 and
2310.18547). Differences from those papers: the gathered matmuls are ``mx.gather_mm`` rather than
custom kernels, and adapters of different ranks are zero-padded to the engine's maximum rank
(zero columns add exactly zero, so results equal the unpadded adapter up to float summation order).

Slot 0 is reserved for "no adapter" and stays zero. The adapter's scale is folded into the
stored ``lora_b`` so a row costs two gathered matmuls and one add.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn


@dataclass
class LoraContext:
    """Per-forward routing shared by every multi-LoRA layer of one model.

    ``slots`` is a ``(B,)`` uint32 array giving each batch row's slot, or ``None`` when no row
    uses an adapter (then the layers skip the LoRA path entirely).
    """

    slots: mx.array | None = None
    # rows grouped by slot in ascending order: gather_mm takes its segmented path (cheaper backward)
    sorted_slots: bool = False


def linear_dims(module: nn.Module) -> tuple[int, int]:
    """(input_dims, output_dims) of an ``nn.Linear`` or ``nn.QuantizedLinear``."""
    out_dims, in_dims = module.weight.shape
    if isinstance(module, nn.QuantizedLinear):
        in_dims = in_dims * 32 // module.bits
    return in_dims, out_dims


def is_linear(module) -> bool:
    return isinstance(module, (nn.Linear, nn.QuantizedLinear))


class MultiLoRALinear(nn.Module):
    """Wraps a (possibly quantized) linear with ``slots`` stacked LoRA adapters."""

    def __init__(self, base: nn.Module, slots: int, rank: int, ctx: LoraContext, dtype=mx.float32):
        super().__init__()
        self.base = base
        self.in_dims, self.out_dims = linear_dims(base)
        self.lora_a = mx.zeros((slots, self.in_dims, rank), dtype=dtype)
        self.lora_b = mx.zeros((slots, rank, self.out_dims), dtype=dtype)
        self._ctx = ctx

    @property
    def rank(self) -> int:
        return self.lora_a.shape[-1]

    @property
    def num_slots(self) -> int:
        return self.lora_a.shape[0]

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        slots = self._ctx.slots
        if slots is None:
            return y
        # x: (B, L, in); slots: (B,) -> per-row (L, in) @ (in, R) @ (R, out)
        if x.dtype != self.lora_a.dtype:
            x = x.astype(self.lora_a.dtype)
        srt = self._ctx.sorted_slots
        delta = mx.gather_mm(mx.gather_mm(x, self.lora_a, rhs_indices=slots, sorted_indices=srt), self.lora_b,
                             rhs_indices=slots, sorted_indices=srt)
        return y + (delta if delta.dtype == y.dtype else delta.astype(y.dtype))

    def resize(self, slots: int, rank: int) -> None:
        """Resize the stacks into new arrays, zero-padding new slots and rank columns; shrinking
        cuts columns, so callers shrink only to a rank every stored adapter fits in."""
        s0, r0 = self.num_slots, self.rank
        if slots == s0 and rank == r0:
            return
        a = mx.zeros((slots, self.in_dims, rank), dtype=self.lora_a.dtype)
        b = mx.zeros((slots, rank, self.out_dims), dtype=self.lora_b.dtype)
        s, r = min(s0, slots), min(r0, rank)
        a[:s, :, :r] = self.lora_a[:s, :, :r]
        b[:s, :r, :] = self.lora_b[:s, :r, :]
        self.lora_a, self.lora_b = a, b

    def write_slot(self, slot: int, a: mx.array | None, b: mx.array | None, scale: float) -> None:
        """Place one adapter (``a: (in, r)``, ``b: (r, out)``) in ``slot``; ``None`` zeroes the slot."""
        if a is None:
            self.lora_a[slot] = mx.zeros((self.in_dims, self.rank), dtype=self.lora_a.dtype)
            self.lora_b[slot] = mx.zeros((self.rank, self.out_dims), dtype=self.lora_b.dtype)
            return
        r = a.shape[1]
        pad = self.rank - r
        a = a.astype(self.lora_a.dtype)
        b = (b.astype(mx.float32) * scale).astype(self.lora_b.dtype)
        if pad:
            a = mx.concatenate([a, mx.zeros((self.in_dims, pad), dtype=a.dtype)], axis=1)
            b = mx.concatenate([b, mx.zeros((pad, self.out_dims), dtype=b.dtype)], axis=0)
        self.lora_a[slot] = a
        self.lora_b[slot] = b


@dataclass
class MultiLoRAModel:
    """Bookkeeping for the multi-LoRA layers installed in one model."""

    model: nn.Module
    slots: int
    rank: int
    ctx: LoraContext = field(default_factory=LoraContext)
    layers: dict[str, MultiLoRALinear] = field(default_factory=dict)

    def linear_paths(self) -> dict[str, nn.Module]:
        """Every (multi-LoRA or plain) linear in the model, by dotted module path."""
        out = {}
        for path, mod in self.model.named_modules():
            if isinstance(mod, MultiLoRALinear):
                out[path] = mod
            elif is_linear(mod) and not path.endswith(".base"):
                out[path] = mod
        return out

    def ensure(self, paths, rank: int) -> None:
        """Make ``paths`` multi-LoRA layers and the rank at least ``rank`` (zero-padding others)."""
        if rank > self.rank:
            self.rank = rank
            for layer in self.layers.values():
                layer.resize(self.slots, rank)
        missing = [p for p in paths if p not in self.layers]
        if not missing:
            return
        modules = dict(self.model.named_modules())
        for path in missing:
            base = modules.get(path)
            if base is None or not is_linear(base):
                raise KeyError(path)
            dtype = mx.float32 if isinstance(base, nn.QuantizedLinear) else base.weight.dtype
            if dtype not in (mx.float32, mx.float16, mx.bfloat16):
                dtype = mx.float32
            layer = MultiLoRALinear(base, self.slots, self.rank, self.ctx, dtype=dtype)
            parent_path, _, attr = path.rpartition(".")
            parent = modules[parent_path] if parent_path else self.model
            if isinstance(parent, list):
                parent[int(attr)] = layer
            else:
                setattr(parent, attr, layer)
            self.layers[path] = layer

    def fit_rank(self, rank: int) -> None:
        """Set the stacks' rank to exactly ``rank`` (grow or shrink). Shrinking replaces every
        stack by a smaller array and returns the freed buffers to the system."""
        if rank == self.rank:
            return
        shrink = rank < self.rank
        self.rank = rank
        for layer in self.layers.values():
            layer.resize(self.slots, rank)
        mx.eval([(layer.lora_a, layer.lora_b) for layer in self.layers.values()])
        if shrink:
            mx.clear_cache()

    @contextmanager
    def overridden(self, paths, rank: int) -> Iterator["StackOverride"]:
        """Make ``paths`` multi-LoRA layers at least ``rank`` wide, then lend the stacks out: inside,
        the caller may replace every layer's stacks (e.g. by differentiable per-player stacks) and
        route rows; on exit the serving stacks and an empty routing are put back."""
        self.ensure(paths, rank)
        saved = {p: (layer.lora_a, layer.lora_b) for p, layer in self.layers.items()}
        try:
            yield StackOverride(self)
        finally:
            for p, (a, b) in saved.items():
                self.layers[p].lora_a, self.layers[p].lora_b = a, b
            self.ctx.slots, self.ctx.sorted_slots = None, False

    def resize_slots(self, slots: int) -> None:
        self.slots = slots
        for layer in self.layers.values():
            layer.resize(slots, self.rank)


class StackOverride:
    """The multi-LoRA stacks lent to a training forward (see :meth:`MultiLoRAModel.overridden`)."""

    def __init__(self, lora: MultiLoRAModel):
        self._lora = lora

    @property
    def dims(self) -> dict[str, tuple[int, int]]:
        """``(input_dims, output_dims)`` of every multi-LoRA layer, by module path."""
        return {p: (layer.in_dims, layer.out_dims) for p, layer in self._lora.layers.items()}

    def set(self, stacks: dict[str, tuple[mx.array, mx.array]], entries: int) -> None:
        """Use ``stacks[path] = (A: (entries, in, r), B: (entries, r, out))`` (scale folded into B)
        in place of the serving stacks; layers not in ``stacks`` get all-zero entries."""
        for p, layer in self._lora.layers.items():
            if p in stacks:
                layer.lora_a, layer.lora_b = stacks[p]
            else:
                layer.lora_a = mx.zeros((entries, layer.in_dims, 1), layer.lora_a.dtype)
                layer.lora_b = mx.zeros((entries, 1, layer.out_dims), layer.lora_b.dtype)

    def route(self, entries: mx.array | None, sorted_entries: bool = False) -> None:
        """Row ``i`` of the next forward uses stack entry ``entries[i]`` (``(B,)`` uint32); None
        runs the base model. ``sorted_entries``: rows are grouped by ascending entry (a cheaper
        ``gather_mm`` backward)."""
        self._lora.ctx.slots, self._lora.ctx.sorted_slots = entries, sorted_entries
