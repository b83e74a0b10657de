"""Multi-LoRA MLX inference: continuous batching across players, hot-swap, LRU slots."""

from autocurricula.engine.adapters import AdapterError, AdapterWeights, LoraSpec, load_folder
from autocurricula.engine.engine import (Completion, Engine, EngineConfig, EngineDeadError, TokenEvent,
                                         UnknownPlayerError)
from autocurricula.engine.protocol import EngineProtocol
from autocurricula.engine.sampling import SamplingParams

__all__ = ["AdapterError", "AdapterWeights", "Completion", "Engine", "EngineConfig", "EngineDeadError",
           "EngineProtocol", "LoraSpec", "SamplingParams", "TokenEvent", "UnknownPlayerError", "load_folder"]
