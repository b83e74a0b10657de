"""The league loop's settings: :class:`AutocurriculumConfig` and its groups.

Top-level fields are the loop's own, named as in ``transformers.TrainingArguments`` where the
concept is shared (``output_dir``, ``seed``, ``logging_steps``, ``report_to``, ``push_to_hub``...).
Settings of one part of the system sit in a group, each with its defaults defined once:
``engine`` (:class:`~autocurricula.engine.EngineConfig`), ``arena`` (:class:`ArenaConfig`: how
games run), ``ratings`` (:class:`RatingConfig`) and ``credit`` (a method's name or a
:class:`~autocurricula.credit.Credit` object carrying its own settings). A league's config adds
one more group, ``rules``: the league's own settings, a dataclass that its ``rules_class`` names
(``LeagueConfig.rules`` is a ``LeagueRules``). A group may be given as a dict of its fields. The
update's settings are ``GRPOConfig`` (trl's names), passed to ``train``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, ClassVar

from autocurricula.credit import Credit
from autocurricula.engine import EngineConfig
from autocurricula.training.config import GRPOConfig, LoraSpec, coerce_grpo_config, coerce_lora_spec, help_field

__all__ = ["ArenaConfig", "AutocurriculumConfig", "EngineConfig", "GRPOConfig", "LoraSpec", "RatingConfig",
           "coerce_grpo_config", "coerce_lora_spec"]


def _positive_int(owner: str, name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {v!r}")


@dataclass
class ArenaConfig:
    """How a round's games run."""

    max_concurrent_games: int = help_field("games in flight at once (their calls share the engine's batches)", 64)
    lockstep: bool = help_field("batch the calls of all running games in a fixed order: full batches and "
                                "bit-identical reruns (async play); off = pure continuous batching", True)
    game_timeout_s: float | None = help_field("wall-clock limit of one game (its whole play call, waiting for "
                                              "batches included); a game past it is cancelled and counted as an "
                                              "error, and one running past half of it is named in the log. A sync "
                                              "play cannot be killed: its next model.generate raises and the round "
                                              "goes on without it. Also bounds how long SIGINT/SIGTERM wait. The "
                                              "default, 10 minutes, is far beyond any built-in game; None = no "
                                              "limit", 600.0)
    max_game_error_rate: float = help_field("stop training with the first traceback when more than this share of a "
                                            "round's games raise or time out; a round where every game fails always "
                                            "stops (nothing to learn from); 1.0 = stop only then", 0.5)

    def __post_init__(self):
        _positive_int("ArenaConfig", "max_concurrent_games", self.max_concurrent_games)
        if not (isinstance(self.max_game_error_rate, (int, float)) and 0 <= self.max_game_error_rate <= 1):
            raise ValueError(f"max_game_error_rate must be in [0, 1] (1.0 = stop only when every game of a round "
                             f"fails), got {self.max_game_error_rate!r}")
        t = self.game_timeout_s
        if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"game_timeout_s must be a positive number of seconds or None (no limit), got {t!r}")


@dataclass
class RatingConfig:
    """Elo, the payoff matrix and the Bradley-Terry intervals of the leaderboard."""

    elo_k: float = help_field("Elo K factor", 20.0)
    elo_scale: float = help_field("Elo scale", 400.0)
    elo_initial: float = help_field("Elo of a new player", 1000.0)
    payoff_decay: float = help_field("payoff-matrix decay per update (AlphaStar: 0.99)", 0.99)
    bt_bootstrap: int = help_field("bootstrap rounds of the Bradley-Terry confidence intervals (0 = off)", 100)
    meta_z: float = help_field("the meta-strategy (the leaderboard's mixtures, deployable_mixture) takes each "
                               "relative-payoff entry at mean - meta_z x its standard error (0 = the means)", 1.0)

    def __post_init__(self):
        if not self.meta_z >= 0:
            raise ValueError(f"RatingConfig.meta_z must be >= 0 (0 = solve on the means), got {self.meta_z!r}")
        if not isinstance(self.bt_bootstrap, int) or self.bt_bootstrap < 0:
            raise ValueError(f"RatingConfig.bt_bootstrap must be an integer >= 0 (0 = off), got {self.bt_bootstrap!r}")
        if not 0 < self.payoff_decay <= 1:
            raise ValueError(f"RatingConfig.payoff_decay must be in (0, 1], got {self.payoff_decay!r}")


GROUPS = {"engine": EngineConfig, "arena": ArenaConfig, "ratings": RatingConfig}


@dataclass
class AutocurriculumConfig:
    """The league loop's settings. ``epochs``, ``rounds`` and ``matches`` are the seed API's; the
    rest use ``transformers.TrainingArguments`` names where they overlap. A league's config sets
    ``rules_class`` and declares a ``rules`` field of that class, coerced like the other groups."""

    # the dataclass a league config's `rules` field takes; a subclass may only extend its parent's,
    # because the parent's trainer reads those fields
    rules_class: ClassVar[type | None] = None

    epochs: int = help_field("epochs; entry() adds players at the start of each", 4)
    rounds: int = help_field("rounds per epoch; each round plays match()'s games, then updates every learner once", 2)
    matches: int = help_field("games played per tuple that match() returns, per round", 1)
    output_dir: str = help_field("checkpoints, plots, match history and logs go here", "autocurricula-output")
    overwrite_output_dir: bool = help_field("start a fresh run in an output_dir that holds another run's "
                                            "checkpoints, metrics.jsonl or match_history.jsonl, deleting those "
                                            "files (as in transformers); without it such a run is refused unless "
                                            "it resumes", False)
    seed: int = help_field("seed of schedules, seats, sampling and adapter init", 42)
    max_tokens: int = help_field("default completion limit of model.generate in play (sampling temperature: "
                                 "grpo_config.temperature, which the update uses too)", 64)
    credit: Any = help_field("how game outcomes become per-turn advantages: a Credit object with its own settings "
                             "(autocurricula.credit: RAECredit, GRPOCredit, ValueCredit, QCredit, BranchCredit, "
                             "MirrorCredit, ConstantCredit) or the name of one with its defaults ('rae', 'grpo', "
                             "'value', 'q', 'branch', 'mirror', 'constant', or a name given to register_credit)", "rae")
    game_name: str | None = help_field("name of the game in turns and cards (default: play's module name)", None)
    max_staleness: int = help_field("rollouts overlapping updates: 0 = the serial loop (play a round, update, play "
                                    "the next); k >= 1 = round r+1 is played while round r's update runs, by the "
                                    "adapters from before that update (one update behind), and a turn sampled more "
                                    "than k adapter versions behind its player's current one is dropped from the "
                                    "update (rollout/stale_dropped). An update adds num_iterations versions, so k >= "
                                    "num_iterations keeps the overlapped turns. Overlaps in time only when games are "
                                    "played elsewhere (train(servers=...)); in-process the same schedule runs "
                                    "serially", 0)
    threads: int | None = help_field("CPU backend on Linux: threads of this process's BLAS matmuls during train() "
                                     "(None = OpenBLAS's default, every core). When `autocurricula serve` runs on "
                                     "the same machine, split the cores: e.g. serve --threads 1 and threads=1 on 2 "
                                     "cores, so a round overlapping an update (max_staleness >= 1) does not "
                                     "oversubscribe them", None)
    progress: bool = help_field("show progress bars", True)
    logging_steps: int = help_field("log metrics every this many rounds", 1)
    report_to: list[str] | str = help_field("'none', 'wandb', 'trackio' or a list of them", "none")
    run_name: str | None = help_field("run name for trackers", None)
    transcripts_per_pair: int = help_field("keep the text of the last N games of each pair of players in "
                                           "output_dir/transcripts.jsonl (for `autocurricula dashboard`); 0 = off", 4)
    save_strategy: str = help_field("'epoch' (a checkpoint after every epoch) or 'no'", "epoch")
    save_total_limit: int | None = help_field("keep at most this many checkpoints (oldest deleted); None = all", 2)
    push_to_hub: bool = help_field("push every player and the league card at the end of train()", False)
    hub_model_id: str | None = help_field("repo id for push_to_hub", None)
    hub_private_repo: bool = help_field("create the Hub repo as private", False)
    engine: EngineConfig | None = help_field("the in-process engine's capacity (an EngineConfig or a dict of its "
                                             "fields; None = EngineConfig's defaults). Refused together with an "
                                             "Engine object passed to train(), whose own config wins", None)
    arena: ArenaConfig = help_field("how games run (an ArenaConfig or a dict of its fields)", None)
    ratings: RatingConfig = help_field("Elo, payoff and Bradley-Terry settings (a RatingConfig or a dict)", None)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        rules, parent = cls.rules_class, super(cls, cls).rules_class
        if rules is not None and not (isinstance(rules, type) and is_dataclass(rules)):
            raise TypeError(f"{cls.__name__}.rules_class must be a dataclass of the league's settings, got {rules!r}")
        if parent is not None and not (rules is not None and issubclass(rules, parent)):
            raise TypeError(f"{cls.__name__}.rules_class must be {parent.__name__} or a subclass of it (the league's "
                            f"trainer reads its fields), got {rules!r}")

    @classmethod
    def _groups(cls) -> dict[str, type]:
        """The settings groups and the class of each: ``engine``, ``arena``, ``ratings``, and ``rules``
        when the config has a ``rules_class``."""
        return GROUPS if cls.rules_class is None else {**GROUPS, "rules": cls.rules_class}

    def __post_init__(self):
        if self.rules_class is not None and "rules" not in {f.name for f in fields(self)}:
            raise TypeError(f"{type(self).__name__} sets rules_class but has no rules field: declare rules: "
                            f"{self.rules_class.__name__} = help_field('...', None)")
        for name in ("epochs", "rounds", "matches", "logging_steps", "max_tokens"):
            _positive_int(type(self).__name__, name, getattr(self, name))
        if not isinstance(self.transcripts_per_pair, int) or self.transcripts_per_pair < 0:
            raise ValueError(f"transcripts_per_pair must be an integer >= 0 (0 = no transcripts), "
                             f"got {self.transcripts_per_pair!r}")
        if self.save_strategy not in ("epoch", "no"):
            raise ValueError(f"save_strategy must be 'epoch' or 'no', got {self.save_strategy!r}")
        if not (isinstance(self.credit, Credit) or (isinstance(self.credit, str) and self.credit)):
            raise ValueError(f"credit must be a method's name (e.g. 'rae') or a Credit object (e.g. "
                             f"autocurricula.credit.RAECredit()), got {self.credit!r}")
        for group, cls in self._groups().items():
            value = getattr(self, group)
            if isinstance(value, dict):
                unknown = set(value) - {f.name for f in fields(cls)}
                if unknown:
                    raise ValueError(f"{group}: unknown {cls.__name__} settings {sorted(unknown)}; known: "
                                     f"{sorted(f.name for f in fields(cls))}")
                setattr(self, group, cls(**value))
            elif value is None and group != "engine":
                setattr(self, group, cls())
            elif value is not None and not isinstance(value, cls):
                raise ValueError(f"{group} must be a {cls.__name__} or a dict of its fields, got {type(value).__name__}")
        targets = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        unknown = set(targets) - {"none", "wandb", "trackio"}
        if unknown:
            raise ValueError(f"report_to {sorted(unknown)} not supported; use 'none', 'wandb' or 'trackio'")
        self.report_to = [t for t in targets if t != "none"]
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0 = serial rounds, k >= 1 = play the next round "
                             f"while the update runs, dropping turns more than k versions old), "
                             f"got {self.max_staleness!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads < 1):
            raise ValueError(f"threads must be a positive integer (BLAS threads of this process) or None for every "
                             f"core, got {self.threads!r}")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub=True needs hub_model_id='owner/name'")

    @property
    def credit_name(self) -> str:
        """The credit method's name, whether ``credit`` is a name or an object."""
        return self.credit if isinstance(self.credit, str) else self.credit.name

    def engine_config(self, initial_rank: int) -> EngineConfig:
        """The in-process engine's config: ``engine`` (or the defaults), its stacks starting at the
        LoRA rank of the players."""
        return replace(self.engine or EngineConfig(), initial_rank=initial_rank)

