"""Configuration by composition: every config dataclass stays small and documented (at most 25
top-level fields, inherited ones included, each with its help text), a league's own settings are
its config's ``rules`` group, and the command line's YAML reaches them under ``rules:``."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from autocurricula.loop.config import AutocurriculumConfig
from autocurricula.training.config import help_field
from test_layers import modules

ROOT = Path(__file__).resolve().parent.parent
MAX_FIELDS = 25
EXAMPLES = ("kuhn_league.py", "fictitious_gan.py")  # the examples that subclass a config
LEAGUES = {"SelfPlayConfig": "SelfPlayRules", "LeagueConfig": "LeagueRules", "FictitiousConfig": "FictitiousRules",
           "PSROConfig": "PSRORules", "RoundRobinConfig": "RoundRobinRules"}


def load_example(file: str):
    """An example script as a module, without running its command line."""
    name = f"config_shape_{Path(file).stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / file)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def is_config(obj) -> bool:
    return isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__name__.endswith(("Config", "Rules"))


@pytest.fixture(scope="module")
def config_classes(monkeypatch_module) -> dict[str, type]:
    """Every ``*Config`` / ``*Rules`` dataclass of the package (each module imported; one that needs
    an optional dependency that is not installed is skipped) and of the examples that subclass one."""
    found = {}
    for name in sorted(modules()):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "autocurricula":
                raise
            continue  # an optional dependency (ray, torch, vllm...) of this module is not installed
        for obj in vars(module).values():
            if is_config(obj) and obj.__module__.startswith("autocurricula"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    monkeypatch_module.syspath_prepend(str(ROOT / "examples"))
    for file in EXAMPLES:
        module = load_example(file)
        for obj in vars(module).values():
            if is_config(obj) and obj.__module__ == module.__name__:
                found[f"examples/{file}:{obj.__qualname__}"] = obj
    return found


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def problems(cls: type) -> list[str]:
    """What keeps ``cls`` from the shape every config has: too many fields, or one without help."""
    out = []
    names = [f.name for f in dataclasses.fields(cls)]
    if len(names) > MAX_FIELDS:
        out.append(f"{cls.__name__} has {len(names)} fields, more than {MAX_FIELDS}: move related ones into a nested "
                   f"dataclass field, as engine, arena, ratings and rules are")
    for f in dataclasses.fields(cls):
        text = f.metadata.get("help")
        if not (isinstance(text, str) and text.strip()):
            out.append(f"{cls.__name__}.{f.name} has no help text: declare it with help_field(help, default)")
    return out


def test_every_config_has_at_most_25_fields_each_with_help(config_classes):
    names = {cls.__name__ for cls in config_classes.values()}
    assert {"AutocurriculumConfig", "GRPOConfig", "EngineConfig", "ArenaConfig", "RatingConfig", *LEAGUES,
            *LEAGUES.values(), "KuhnLeagueConfig", "KuhnLeagueRules", "FictitiousGANConfig"} <= names
    assert [p for cls in config_classes.values() for p in problems(cls)] == []


def test_the_check_refuses_a_26th_field_and_a_field_without_help():
    from autocurricula.leagues import LeagueConfig

    assert len(dataclasses.fields(LeagueConfig)) == MAX_FIELDS
    bigger = dataclasses.make_dataclass("Bigger", [("extra", int, help_field("one too many", 0))],
                                        bases=(LeagueConfig,))
    assert [p for p in problems(bigger) if "more than 25" in p]
    bare = dataclasses.make_dataclass("BareRules", [("n", int, dataclasses.field(default=1))])
    assert problems(bare) == ["BareRules.n has no help text: declare it with help_field(help, default)"]


def test_each_league_takes_its_rules_as_an_instance_a_dict_or_nothing():
    import autocurricula
    import autocurricula.leagues as leagues

    for config_name, rules_name in LEAGUES.items():
        config_cls, rules_cls = getattr(leagues, config_name), getattr(leagues, rules_name)
        assert getattr(autocurricula, rules_name) is rules_cls  # exported lazily beside the configs
        assert config_cls.rules_class is rules_cls and config_cls().rules == rules_cls()
        own = rules_cls()
        assert config_cls(rules=own).rules is own
        first = dataclasses.fields(rules_cls)[0].name
        assert config_cls(rules={first: getattr(own, first)}).rules == own
        with pytest.raises(ValueError, match=rf"rules: unknown {rules_name} settings \['nope'\]; known: .*'{first}'"):
            config_cls(rules={"nope": 1})
        with pytest.raises(ValueError, match=f"rules must be a {rules_name} or a dict of its fields"):
            config_cls(rules=AutocurriculumConfig())
        with pytest.raises(TypeError):
            config_cls(**{first: getattr(own, first)})  # a league's setting is no top-level field
    with pytest.raises(ValueError, match=r"PSRORules\.responders >= 1"):
        leagues.PSROConfig(rules={"responders": 0})  # the rules check themselves, naming the fix
    with pytest.raises(ValueError, match=r"LeagueRules\.selfplay_share \+ pfsp_share must be <= 1"):
        leagues.LeagueRules(selfplay_share=0.8, pfsp_share=0.5)


def test_a_config_subclass_names_the_rules_it_takes():
    from autocurricula.leagues import LeagueConfig, LeagueRules, LeagueTrainer, SelfPlayRules

    @dataclasses.dataclass
    class MoreRules(LeagueRules):
        extra: int = help_field("a subclass's own setting", 3)

    @dataclasses.dataclass
    class MoreConfig(LeagueConfig):
        rules_class = MoreRules

    assert MoreConfig(rules={"extra": 5, "main_exploiters": 0}).rules == MoreRules(extra=5, main_exploiters=0)
    assert len(dataclasses.fields(MoreConfig)) == MAX_FIELDS

    class MoreLeague(LeagueTrainer):
        config_class = MoreConfig

    promoted = MoreLeague(LeagueConfig(seed=3, rules={"main_exploiters": 0})).config  # the parent's rules carried
    assert type(promoted) is MoreConfig and promoted.seed == 3
    assert promoted.rules == MoreRules(main_exploiters=0)
    with pytest.raises(TypeError, match="MixedConfig.rules_class must be LeagueRules or a subclass of it"):
        type("MixedConfig", (LeagueConfig,), {"rules_class": SelfPlayRules})
    with pytest.raises(TypeError, match="must be a dataclass"):
        type("NotRules", (LeagueConfig,), {"rules_class": dict})

    @dataclasses.dataclass
    class NoField(AutocurriculumConfig):
        rules_class = MoreRules

    with pytest.raises(TypeError, match="sets rules_class but has no rules field"):
        NoField()


def test_the_seed_api_and_a_saved_config_keep_their_shape():
    from autocurricula.leagues import LeagueConfig

    assert (AutocurriculumConfig(4, 2).epochs, AutocurriculumConfig(4, 2).rounds) == (4, 2)  # epochs, rounds

    @dataclasses.dataclass
    class MyConfig(AutocurriculumConfig):
        mine: int = help_field("a user's own setting", 1)

    assert MyConfig(3, mine=2).epochs == 3 and not hasattr(MyConfig(), "rules")
    # checkpoints' config.json and the Hub card are asdict(config): the rules nest under "rules"
    saved = dataclasses.asdict(LeagueConfig(rules={"main_exploiters": 0}))
    assert saved["rules"]["main_exploiters"] == 0 and "main_exploiters" not in saved


@pytest.fixture()
def cli_train(monkeypatch, tmp_path):
    """``autocurricula train --config`` on a YAML text; returns the config the trainer got."""
    from autocurricula import cli
    from autocurricula.loop.trainer import AutocurriculumTrainer

    seen = {}

    def train(self, model, play, **kw):
        seen["config"] = self.config
        raise KeyboardInterrupt  # stop before any model loads

    monkeypatch.setattr(AutocurriculumTrainer, "train", train)

    def run(text: str, league: str = "league"):
        path = tmp_path / "settings.yaml"
        path.write_text(text)
        with pytest.raises(KeyboardInterrupt):
            cli.main(["train", "--model", "m", "--game", "tictactoe", "--league", league, "--config", str(path)])
        return seen["config"]

    return run


def test_cli_yaml_puts_a_rules_mapping_in_the_leagues_rules(cli_train):
    from autocurricula.leagues import LeagueRules, SelfPlayRules

    config = cli_train("rounds: 3\nrules:\n  main_exploiters: 0\n  games_per_learner: 8\n")
    assert config.rounds == 3 and config.rules == LeagueRules(main_exploiters=0, games_per_learner=8)
    assert cli_train("rules:\n  past_share: 0.0\n", league="selfplay").rules == SelfPlayRules(past_share=0.0)
    with pytest.raises(SystemExit, match=r"rules: unknown LeagueRules settings \['nope'\]; known: \["):
        cli_train("rules:\n  nope: 1\n")
    with pytest.raises(SystemExit, match=r"unknown LeagueConfig settings \['main_exploiters'\].*"
                                         r"\['main_exploiters'\] are LeagueRules settings: put them under 'rules:'"):
        cli_train("main_exploiters: 0\n")
