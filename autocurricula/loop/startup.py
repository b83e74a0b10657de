"""What ``train`` sets up before the first round: the engine the updates run on, where games are
played, and the warnings about settings that will not do what they say."""

from __future__ import annotations

import functools
import logging

from autocurricula.engine import Engine, RolloutEngine
from autocurricula.publish.hub import check_model_source

log = logging.getLogger(__name__)


def load_engine(model, cfg, lora_spec) -> tuple[Engine, str]:
    """``(engine, model name)`` from an Engine, an ``mlx_lm.load`` pair, a Hub id or a folder."""
    if isinstance(model, Engine):
        if cfg.engine is not None:
            raise ValueError("config.engine is set, but train() got an Engine object, whose own EngineConfig wins: "
                             "leave config.engine at None, or pass the model's path or Hub id instead")
        return model, model.name
    if isinstance(model, tuple) and len(model) == 2:  # (model, tokenizer) from mlx_lm.load
        name = type(model[0]).__module__.rsplit(".", 1)[-1]  # mlx_lm.models.llama -> "llama"
        return Engine(model[0], model[1], config=cfg.engine_config(lora_spec.r), name=name), name
    name = check_model_source(model, fetch=True)  # an id that cannot be fetched fails here, named
    return Engine(name, config=cfg.engine_config(lora_spec.r)), name


def open_rollout(servers, engine: Engine, api_key: str | None) -> tuple[RolloutEngine, bool]:
    """Where games are played, and whether that is elsewhere than ``engine``: ``engine`` itself, a
    RolloutEngine given as is (e.g. a RayEngine), the vLLM servers at ``vllm+http://`` URLs
    (adapters written as peft folders to a temporary folder they read), or our servers at the
    given URLs (their base model is checked against ``engine``'s)."""
    if servers is None or servers is engine or (not isinstance(servers, RolloutEngine) and not servers):
        return engine, False
    if isinstance(servers, RolloutEngine):
        return servers, True
    from autocurricula.fleet.vllm import VLLMEngine, vllm_urls  # httpx clients: only when servers are named

    urls = vllm_urls(servers)
    if urls is not None:
        from autocurricula.publish.export import export_peft

        return VLLMEngine(urls, base=engine, api_key=api_key,
                          write_adapter=functools.partial(export_peft, base_model_name_or_path=engine.name)), True
    from autocurricula.fleet.remote import RemoteEngine

    return RemoteEngine(servers, base=engine, api_key=api_key), True


def explain_schedule(grpo, total_rounds: int) -> None:
    if grpo.lr_scheduler_type != "constant":
        log.info("learning rate: %s schedule from %g to %g x that over %d rounds%s", grpo.lr_scheduler_type,
                 grpo.learning_rate, grpo.min_lr_ratio, total_rounds,
                 f" (decay over the last {grpo.lr_decay_ratio:g})" if grpo.lr_decay_ratio else "")
    if grpo.lr_decay_ratio and grpo.lr_decay_ratio * total_rounds < 2:
        log.warning("lr_decay_ratio=%g of %d rounds leaves fewer than 2 rounds to decay over, so the rate "
                    "barely falls: raise lr_decay_ratio or the rounds", grpo.lr_decay_ratio, total_rounds)


def explain_pipeline(max_staleness: int, num_iterations: int, in_process: bool, replays: bool, credit: str) -> None:
    if not max_staleness:
        return
    if in_process:
        log.warning("max_staleness=%d with the in-process engine: its one thread runs both the games and the "
                    "updates, so round r+1 is played before round r's update instead of during it (the same "
                    "games as through servers, no overlap in time); pass servers=[...] (a running "
                    "`autocurricula serve`) to overlap them", max_staleness)
    elif replays:
        log.warning("max_staleness=%d with credit %r: its replays share the arena with the games, so the "
                    "rounds run one after another (same schedule, no overlap in time)", max_staleness, credit)
    if max_staleness < num_iterations:
        log.warning("max_staleness=%d < num_iterations=%d: an update adds %d adapter versions, so every turn "
                    "played during an update is dropped; set max_staleness >= num_iterations",
                    max_staleness, num_iterations, num_iterations)
