"""League schedules (installed as ``autocurricula.leagues``): one module per schedule."""

from autocurricula.leagues.fictitious import FictitiousConfig, FictitiousPlayTrainer
from autocurricula.leagues.league import LeagueConfig, LeagueTrainer, pfsp
from autocurricula.leagues.psro import PSROConfig, PSROTrainer
from autocurricula.leagues.round_robin import RoundRobinConfig, RoundRobinTrainer
from autocurricula.leagues.selfplay import SelfPlayConfig, SelfPlayTrainer

__all__ = ["FictitiousConfig", "FictitiousPlayTrainer", "LeagueConfig", "LeagueTrainer", "PSROConfig", "PSROTrainer", "RoundRobinConfig",
           "RoundRobinTrainer", "SelfPlayConfig", "SelfPlayTrainer", "pfsp"]
