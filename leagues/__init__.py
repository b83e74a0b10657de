"""League schedules (installed as ``autocurricula.leagues``): one module per schedule."""

from autocurricula.leagues.default import Recipe, choose, model_rate
from autocurricula.leagues.fictitious import FictitiousConfig, FictitiousPlayTrainer, FictitiousRules
from autocurricula.leagues.league import LeagueConfig, LeagueRules, LeagueTrainer, pfsp
from autocurricula.leagues.psro import PSROConfig, PSRORules, PSROTrainer
from autocurricula.leagues.round_robin import RoundRobinConfig, RoundRobinRules, RoundRobinTrainer
from autocurricula.leagues.selfplay import SelfPlayConfig, SelfPlayRules, SelfPlayTrainer

__all__ = ["Recipe", "choose", "model_rate", "FictitiousConfig", "FictitiousPlayTrainer", "FictitiousRules", "LeagueConfig", "LeagueRules",
           "LeagueTrainer", "PSROConfig", "PSRORules", "PSROTrainer", "RoundRobinConfig", "RoundRobinRules",
           "RoundRobinTrainer", "SelfPlayConfig", "SelfPlayRules", "SelfPlayTrainer", "pfsp"]
