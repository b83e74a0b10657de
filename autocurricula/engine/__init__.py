"""Multi-LoRA MLX inference: continuous batching across players, hot-swap, LRU slots.

Names resolve lazily so that ``autocurricula.engine.blas`` and ``autocurricula.engine.tiny`` can
be imported before mlx (OpenBLAS must be preloaded first).
"""

import importlib

_LAZY = {
    "AdapterError": "autocurricula.engine.adapters", "AdapterWeights": "autocurricula.engine.adapters", "LoraSpec": "autocurricula.engine.adapters", "load_folder": "autocurricula.engine.adapters",
    "Completion": "autocurricula.engine.engine", "Engine": "autocurricula.engine.engine", "EngineConfig": "autocurricula.engine.engine", "TokenEvent": "autocurricula.engine.engine",
    "EngineDeadError": "autocurricula.engine.errors", "UnknownPlayerError": "autocurricula.engine.errors",
    "RolloutEngine": "autocurricula.engine.protocol", "TrainableEngine": "autocurricula.engine.protocol",
    "SamplingParams": "autocurricula.engine.sampling",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
