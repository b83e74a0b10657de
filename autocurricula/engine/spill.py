"""Adapters spilled to disk: a player's host weights written to a folder and freed, then read back
(checked against the hash taken when they were written) whenever a slot needs them again.

A server holding more players than its memory cap keeps the least recently used ones here
(vLLM's ``--max-cpu-loras`` evicts them instead; here they stay loaded, at the cost of a read).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

from autocurricula.files import atomic_write
from autocurricula.engine.adapters import AdapterError, AdapterWeights, from_safetensors_bytes, to_safetensors_bytes


@dataclass(frozen=True)
class SpilledWeights:
    """Stands in for a player's :class:`AdapterWeights` while they are on disk: the facts the engine
    reads without the tensors (rank, scale, module paths, size), and the file with its hash."""

    path: Path
    sha256: str
    scale: float
    rank: int
    modules: tuple[str, ...]
    nbytes: int


def host_bytes(weights: AdapterWeights | SpilledWeights) -> int:
    """Bytes the weights hold in memory (0 once spilled)."""
    if isinstance(weights, SpilledWeights):
        return 0
    return sum(a.nbytes + b.nbytes for a, b in weights.modules.values())


def write_spill(weights: AdapterWeights, folder: str | Path, name: str) -> SpilledWeights:
    """Write ``weights`` (float32, exact) to a new file in ``folder``, atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = to_safetensors_bytes(weights)
    path = folder / f"{name}.{uuid.uuid4().hex[:12]}.safetensors"  # a name may be spilled again before it is read
    atomic_write(path, data, mode=0o600)  # the host's own scratch copy
    return SpilledWeights(path, hashlib.sha256(data).hexdigest(), weights.scale, weights.rank,
                          tuple(weights.modules), host_bytes(weights))


def read_spill(spilled: SpilledWeights) -> AdapterWeights:
    """The weights back from disk, refused when the file is gone or no longer what was written."""
    try:
        data = spilled.path.read_bytes()
    except OSError as exc:
        raise AdapterError(f"the spilled copy of an adapter at {spilled.path} cannot be read ({exc}); upload the "
                           "adapter again, and leave the server's spill folder alone while it runs") from None
    if hashlib.sha256(data).hexdigest() != spilled.sha256:
        raise AdapterError(f"the spilled copy of an adapter at {spilled.path} changed on disk since it was written; "
                           "upload the adapter again, and leave the server's spill folder alone while it runs")
    return from_safetensors_bytes(data, max_rank=None)


def discard(weights: AdapterWeights | SpilledWeights) -> None:
    """Remove the file of spilled weights (nothing for weights in memory)."""
    if isinstance(weights, SpilledWeights):
        weights.path.unlink(missing_ok=True)
