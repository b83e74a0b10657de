"""League schedules (installed as ``autocurricula.leagues``): one module per schedule."""

from autocurricula.leagues.fictitious import FictitiousConfig, FictitiousPlayTrainer, FictitiousRules
from autocurricula.leagues.league import LeagueConfig, LeagueRules, LeagueTrainer, pfsp
from autocurricula.leagues.psro import PSROConfig, PSRORules, PSROTrainer
from autocurricula.leagues.round_robin import RoundRobinConfig, RoundRobinRules, RoundRobinTrainer
from autocurricula.leagues.selfplay import SelfPlayConfig, SelfPlayRules, SelfPlayTrainer

__all__ = ["FictitiousConfig", "FictitiousPlayTrainer", "FictitiousRules", "LeagueConfig", "LeagueRules",
           "LeagueTrainer", "PSROConfig", "PSRORules", "PSROTrainer", "RoundRobinConfig", "RoundRobinRules",
           "RoundRobinTrainer", "SelfPlayConfig", "SelfPlayRules", "SelfPlayTrainer", "pfsp"]
