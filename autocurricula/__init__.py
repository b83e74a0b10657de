"""autocurricula: league training of LoRA players of one base model, in MLX.

The engine (``autocurricula.engine``) serves many LoRA players in one continuously batched
decode loop; ``autocurricula.serve.server`` exposes it over an OpenAI-compatible HTTP API.
"""

import importlib

from autocurricula.engine import blas as _blas

_blas.preload()  # must run before anything imports mlx.core

__version__ = "0.2.0"

_LAZY = {
    "AutocurriculumTrainer": "autocurricula.loop.trainer",
    "AutocurriculumConfig": "autocurricula.loop.config",
    "GRPOConfig": "autocurricula.loop.config",
    "SelfPlayTrainer": "autocurricula.leagues",
    "SelfPlayConfig": "autocurricula.leagues",
    "SelfPlayRules": "autocurricula.leagues",
    "LeagueTrainer": "autocurricula.leagues",
    "LeagueConfig": "autocurricula.leagues",
    "LeagueRules": "autocurricula.leagues",
    "FictitiousPlayTrainer": "autocurricula.leagues",
    "FictitiousConfig": "autocurricula.leagues",
    "FictitiousRules": "autocurricula.leagues",
    "PSROTrainer": "autocurricula.leagues",
    "PSROConfig": "autocurricula.leagues",
    "PSRORules": "autocurricula.leagues",
    "RoundRobinTrainer": "autocurricula.leagues",
    "RoundRobinConfig": "autocurricula.leagues",
    "RoundRobinRules": "autocurricula.leagues",
    "set_player": "autocurricula.arena.seed_compat",
    "build_tiny_model": "autocurricula.engine.tiny",
    "Engine": "autocurricula.engine",
    "EngineConfig": "autocurricula.engine",
    "SamplingParams": "autocurricula.engine",
    "LoraSpec": "autocurricula.engine",
    "GameResult": "autocurricula.arena.arena",
    "ArtifactStore": "autocurricula.arena.artifacts",
    "snapshot_spec": "autocurricula.loop.pool",
    "Player": "autocurricula.records",
    "Credit": "autocurricula.credit",
    "GameFacts": "autocurricula.records",
    "train": "autocurricula.leagues.default",
    "choose": "autocurricula.leagues.default",
    "format_warmup": "autocurricula.loop.bases",
    "tiny_base": "autocurricula.loop.bases",
    "register_credit": "autocurricula.credit",
    "load_mixture": "autocurricula.publish.mixture",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    # Lazy so that `import autocurricula` stays cheap (no mlx/torch import until needed).
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autocurricula' has no attribute {name!r}")
