"""Prefix cache: KV rows of earlier prompts and completions, reused by prompts that start the same.

A radix tree over fixed-size token blocks, the block-hash layout of vLLM's automatic prefix caching
with SGLang's per-prefix sharing (RadixAttention, arXiv 2312.07104): a block is found by its
parent block and its own tokens, so a lookup walks a prompt block by block and stops at the first
miss. Blocks are keyed per adapter (player and version): any LoRA changes the hidden states that
later layers' keys and values are computed from, so KV rows of one adapter version are valid for
that version only. Memory is bounded; the least recently used block goes first, and since a lookup
or insert touches a path from its deepest block back to the root, that block is always a leaf.

Owned by the engine thread; holds one host (NumPy) array ``(layers, 2, kv_heads, block, head_dim)``
per block: copying finished rows' KV out of the batch cache as NumPy slices costs a fraction of
an MLX gather over tiny head dimensions, and a hit becomes one host-to-MLX copy at prefill.

Models with recurrent layers cannot rebuild their state from KV rows: a block may also hold the
recurrent layers' state after its last token, and a lookup for such a model
(``stateful=True``) ends at the deepest matching block that holds one.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

AdapterKey = tuple  # (player or None, version)


@dataclass(eq=False)
class Block:
    key: tuple  # (adapter key, parent block id, tokens)
    id: int
    kv: np.ndarray  # (layers, 2, kv_heads, block, head_dim) in host memory, its own buffer
    nbytes: int
    parent: "Block | None"
    children: set = field(default_factory=set)  # keys of child blocks
    state: Any = None  # recurrent layers' state after the block's last token: per layer, host arrays


class PrefixCache:
    def __init__(self, capacity_bytes: int, block: int = 16):
        if block <= 0:
            raise ValueError("prefix cache block size must be a positive number of tokens")
        self.capacity, self.block = int(capacity_bytes), int(block)
        self.blocks: OrderedDict[tuple, Block] = OrderedDict()  # LRU order: oldest first
        self.nbytes = 0
        self.evictions = 0
        self._ids = itertools.count(1)

    @property
    def tokens(self) -> int:
        return len(self.blocks) * self.block

    def lookup(self, adapter: AdapterKey, ids: list[int], limit: int, stateful: bool = False) -> list[Block]:
        """The longest chain of cached blocks that ``ids[:limit]`` starts with (touched as used);
        with ``stateful``, cut after the deepest of them that holds a recurrent state."""
        path, parent = [], 0
        for start in range(0, limit - self.block + 1, self.block):
            blk = self.blocks.get((adapter, parent, tuple(ids[start : start + self.block])))
            if blk is None:
                break
            path.append(blk)
            parent = blk.id
        while stateful and path and path[-1].state is None:
            path.pop()
        self._touch(path)
        return path

    def insert_many(self, entries: list[tuple], gather: Callable[[list[tuple[Any, int]]], list[np.ndarray]]) -> int:
        """Cache every whole block of each ``(adapter, ids, tag)`` or ``(adapter, ids, tag,
        states)`` entry. ``gather([(tag, start), ...])`` returns the KV rows of the blocks not
        cached yet: one host array per block, each with its own buffer (so evicting a block frees
        its memory). ``states`` maps a token count to the recurrent state after that many tokens
        of ``ids``; the block ending there keeps it (unless it holds one already). Returns the
        number of blocks added."""
        paths, new = [], []
        for adapter, ids, tag, *rest in entries:
            states = rest[0] if rest else {}
            path, parent = [], 0
            for start in range(0, len(ids) - self.block + 1, self.block):
                key = (adapter, parent, tuple(ids[start : start + self.block]))
                blk = self.blocks.get(key)
                if blk is None:  # registered now, so an identical prefix later in ``entries`` shares it
                    blk = self.blocks[key] = Block(key, next(self._ids), None, 0, path[-1] if path else None)
                    if path:
                        path[-1].children.add(key)
                    new.append((blk, tag, start))
                path.append(blk)
                parent = blk.id
                state = states.get(start + self.block)
                if state is not None and blk.state is None:
                    blk.state = state
                    size = sum(a.nbytes for layer in state for a in layer)
                    blk.nbytes += size
                    self.nbytes += size
            paths.append(path)
        if new:
            for (blk, _, _), kv in zip(new, gather([(tag, start) for _, tag, start in new])):
                blk.kv = kv
                blk.nbytes += kv.nbytes
                self.nbytes += kv.nbytes
        for path in paths:
            self._touch(path)
        self._evict()
        return len(new)

    def forget(self, player: Any) -> None:
        """Drop every block of ``player`` (its weights changed or it left)."""
        for key in [k for k in self.blocks if k[0][0] == player]:
            self._remove(key)

    def clear(self) -> None:
        self.blocks.clear()
        self.nbytes = 0

    def _touch(self, path: list[Block]) -> None:
        for blk in reversed(path):  # the root ends most recent: eviction takes leaves first
            self.blocks.move_to_end(blk.key)

    def _evict(self) -> None:
        while self.nbytes > self.capacity and self.blocks:
            self._remove(next(iter(self.blocks)))
            self.evictions += 1

    def _remove(self, key: tuple) -> None:
        blk = self.blocks.pop(key, None)
        if blk is None:
            return
        self.nbytes -= blk.nbytes
        for child in list(blk.children):  # unreachable without their parent
            self._remove(child)
        if blk.parent is not None:
            blk.parent.children.discard(key)
