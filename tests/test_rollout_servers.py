"""Games that fail because of where they run, not because of the game."""

import contextlib

import pytest

import autocurricula  # noqa: F401
from autocurricula import SelfPlayConfig, SelfPlayTrainer
from autocurricula.views.callbacks import TrainerCallback
from autocurricula.engine import Engine
from autocurricula.fleet.remote import RemoteEngine
from autocurricula.loop.rounds import GameError
from autocurricula.serve.server import create_app

from helpers import running_server
from toy_games import digits


class StopServerAfterFirstUpdate(TrainerCallback):
    def __init__(self, stack):
        self.stack = stack

    def on_update(self, trainer, turns, result):
        self.stack.close()  # the only server goes away for good


def test_every_server_down_is_named_as_such_not_as_a_broken_game(tiny_model_path, tmp_path):
    serving = Engine(str(tiny_model_path))
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(running_server(create_app(serving)))
        remote = RemoteEngine([url], base=serving, timeout=2.0, poll_s=0.1)
        t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                           progress=False, max_tokens=2, ratings={"bt_bootstrap": 0}))
        try:
            with pytest.raises(GameError, match="no server or actor is reachable.*start them again"):
                t.train(str(tiny_model_path), digits, servers=remote, callbacks=[StopServerAfterFirstUpdate(stack)])
        finally:
            remote.close()
            t.engine.close()
            serving.close()


@pytest.mark.parametrize("staleness", [0, 1])
def test_after_training_the_server_holds_every_player_at_its_version(tiny_model_path, tmp_path, staleness):
    """Snapshots made in the last round never play, yet the server holds them: it can serve the whole
    league afterwards, whatever max_staleness."""
    from autocurricula import LeagueConfig, LeagueTrainer

    serving = Engine(str(tiny_model_path))
    try:
        with running_server(create_app(serving)) as url:
            t = LeagueTrainer(LeagueConfig(epochs=2, rounds=2,
                                           rules={"games_per_learner": 2, "snapshot_min_rounds": 1,
                                                  "snapshot_max_rounds": 1}, output_dir=str(tmp_path), progress=False,
                                           max_tokens=2, max_staleness=staleness, ratings={"bt_bootstrap": 0}))
            t.train(str(tiny_model_path), digits, servers=[url])
            t.engine.close()
        mine = {p["id"]: p["version"] for p in t.players if "policy" not in p}
        assert {n: serving.adapter_info(n)["version"] for n in serving.players()} == mine
    finally:
        serving.close()
