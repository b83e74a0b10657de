"""A built-in league's own config from the config it is given: the base ``AutocurriculumConfig``
(or a league config whose rules the league's extend) becomes the league's config, its ``rules``
the league's defaults (or the given rules' values, the extra fields at their defaults); a config
with rules of another league is refused when the trainer is built, naming the class to use."""

from __future__ import annotations

import logging
from dataclasses import fields

from autocurricula.loop.config import AutocurriculumConfig

log = logging.getLogger(__name__)


def league_config(config: AutocurriculumConfig | None, config_class: type, trainer: str):
    """``config`` when it is None, a ``config_class``, or has its fields and rules of its
    ``rules_class``; a ``config_class`` with its values when ``config_class`` extends its class; else
    a TypeError."""
    if config is None or isinstance(config, config_class):
        return config
    rules_class = config_class.rules_class
    if isinstance(config, AutocurriculumConfig):
        missing = {f.name for f in fields(config_class)} - {f.name for f in fields(config)}
        if not missing and config.rules_class is not None and issubclass(config.rules_class, rules_class):
            return config  # a config of another class that carries every field and rule the league reads
        if issubclass(config_class, type(config)):
            values = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
            if config.rules_class is not None:  # the parent league's rules, extended by this league's
                values["rules"] = {f.name: getattr(config.rules, f.name) for f in fields(config.rules) if f.init}
            promoted = config_class(**values)
            if config.rules_class is None:
                log.info("%s got a %s: using %s with the default %s", trainer, type(config).__name__,
                         config_class.__name__, rules_class.__name__)
            else:
                log.info("%s got a %s: using %s, its %s values carried into %s", trainer, type(config).__name__,
                         config_class.__name__, config.rules_class.__name__, rules_class.__name__)
            return promoted
    raise TypeError(f"{trainer} needs a {config_class.__name__} (its rules: {rules_class.__name__}), got a "
                    f"{type(config).__name__}: build a {config_class.__name__}(rules={{...}}) with the same settings, "
                    "or pass the base AutocurriculumConfig to get the league's default rules")
