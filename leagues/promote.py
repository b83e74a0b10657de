"""A built-in league's own config from the config it is given: the base ``AutocurriculumConfig``
becomes the league's config with the league's defaults for its own fields; a config that lacks
those fields otherwise is refused when the trainer is built, naming the class to use."""

from __future__ import annotations

import logging
from dataclasses import fields

from autocurricula.loop.config import AutocurriculumConfig

log = logging.getLogger(__name__)


def league_config(config: AutocurriculumConfig | None, config_class: type, trainer: str):
    """``config`` when it is None or has every field of ``config_class``; a ``config_class`` with
    its values and the league's defaults when ``config_class`` extends its class; else a TypeError."""
    if config is None or isinstance(config, config_class):
        return config
    own = {f.name for f in fields(config_class)} - {f.name for f in fields(config)}
    if not own:  # a config of another class that carries every field the league reads
        return config
    if isinstance(config, AutocurriculumConfig) and issubclass(config_class, type(config)):
        values = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
        promoted = config_class(**values)
        log.info("%s got a %s: using %s with its defaults for %s", trainer, type(config).__name__,
                 config_class.__name__, ", ".join(sorted(own)))
        return promoted
    raise TypeError(f"{trainer} needs a {config_class.__name__} (its own fields: {', '.join(sorted(own))}), got a "
                    f"{type(config).__name__}: build a {config_class.__name__}(...) with the same settings, or pass "
                    "the base AutocurriculumConfig to get the league's defaults")
