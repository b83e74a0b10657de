"""Multi-LoRA MLX inference: continuous batching across players, hot-swap, LRU slots."""

from autocurricula.engine.adapters import AdapterError, AdapterWeights, LoraSpec, load_folder
from autocurricula.engine.engine import Completion, Engine, EngineConfig, TokenEvent
from autocurricula.engine.errors import EngineDeadError, UnknownPlayerError
from autocurricula.engine.protocol import RolloutEngine, TrainableEngine
from autocurricula.engine.sampling import SamplingParams

__all__ = ["AdapterError", "AdapterWeights", "Completion", "Engine", "EngineConfig", "EngineDeadError",
           "LoraSpec", "RolloutEngine", "SamplingParams", "TokenEvent", "TrainableEngine", "UnknownPlayerError",
           "load_folder"]


def __getattr__(name: str):
    if name == "EngineProtocol":
        from autocurricula.engine import protocol

        return protocol.__getattr__(name)  # warns, naming RolloutEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
