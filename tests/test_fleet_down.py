"""A fleet whose only server dies fails fast (issue 68, item 8): requests wait ``down_timeout``
for a server to come back, not the 600 s request / game timeout; the round stops with the error
that names the dead server and the fix; the log says there is no other server, and no stray
"Event loop is closed" traceback comes from the engine's thread."""

import contextlib
import logging
import time

import pytest

import autocurricula  # noqa: F401
from autocurricula import SelfPlayConfig, SelfPlayTrainer
from autocurricula.engine import AdapterWeights, Engine, LoraSpec, SamplingParams
from autocurricula.fleet.client import UnavailableError
from autocurricula.fleet.remote import RemoteEngine
from autocurricula.loop.rounds import GameError
from autocurricula.serve.server import create_app
from autocurricula.views.callbacks import TrainerCallback

from helpers import running_server
from toy_games import digits


class StopServerAfterFirstUpdate(TrainerCallback):
    def __init__(self, stack):
        self.stack, self.stopped = stack, None

    def on_update(self, trainer, turns, result):
        if self.stopped is None:
            self.stack.close()  # the only server goes away for good
            self.stopped = time.monotonic()


def test_with_its_only_server_dead_a_request_fails_after_down_timeout_naming_it(tiny_model_path, caplog):
    serving, local = Engine(str(tiny_model_path)), Engine(str(tiny_model_path))
    try:
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(running_server(create_app(serving)))
            # the request timeout stays at its 600 s default: only down_timeout may end the wait
            with RemoteEngine([url], base=local, poll_s=0.1, down_timeout=2.0) as fleet:
                fleet.load_adapter("alice", AdapterWeights.random(local.linear_dims, LoraSpec(r=4), seed=0))
                assert fleet.generate("x o", "alice", max_tokens=1).adapter_version == 1
                with caplog.at_level(logging.WARNING):
                    stack.close()
                    t0 = time.monotonic()
                    with pytest.raises(UnavailableError) as exc:
                        fleet.submit("x o", "alice", SamplingParams(max_tokens=2)).result(60)
                    first = time.monotonic() - t0
                    t1 = time.monotonic()  # still down: the next request fails at once
                    with pytest.raises(UnavailableError):
                        fleet.submit("x o", "alice", SamplingParams(max_tokens=2)).result(60)
                    again = time.monotonic() - t1
                assert first < 15 and again < 1, (first, again)
                message = str(exc.value)
                assert f"server {url}" in message and "down_timeout" in message
                assert "autocurricula serve --model" in message and "resume_from_checkpoint" in message
                assert fleet.stats["failed"] == 2 and not fleet.health()["ok"]
                logged = [r.getMessage() for r in caplog.records]
                assert not any("go to the other" in m for m in logged), logged
                assert any("it is the only server" in m and "2 s (down_timeout)" in m for m in logged), logged
    finally:
        serving.close()
        local.close()


def test_the_round_stops_soon_after_the_only_server_dies_with_one_clear_error(tiny_model_path, tmp_path, caplog):
    serving = Engine(str(tiny_model_path))
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(running_server(create_app(serving)))
        remote = RemoteEngine([url], base=serving, poll_s=0.1, down_timeout=3.0)  # request timeout: 600 s
        t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=3, rules={"games_per_round": 4}, output_dir=str(tmp_path),
                                           progress=False, max_tokens=2, ratings={"bt_bootstrap": 0},
                                           arena={"game_timeout_s": 60.0}))  # bounds this test if it regresses
        stop = StopServerAfterFirstUpdate(stack)
        try:
            with caplog.at_level(logging.WARNING), pytest.raises(GameError) as exc:
                t.train(str(tiny_model_path), digits, servers=remote, callbacks=[stop])
            took = time.monotonic() - stop.stopped
        finally:
            remote.close()
            t.engine.close()
            serving.close()
    assert took < 20, f"the round stopped {took:.0f} s after its server died"
    message = str(exc.value)
    assert "no server or actor is reachable" in message and url in message and "start them again" in message
    assert "every server is down" in message  # the fleet's own error, naming the fix
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "Event loop is closed" not in logged and "exception calling callback" not in logged
    assert "go to the other servers" not in logged


def test_down_timeout_is_checked_and_defaults_to_30_s_for_servers():
    import inspect

    from autocurricula.fleet.fleet import Fleet

    assert inspect.signature(RemoteEngine).parameters["down_timeout"].default == 30.0
    assert inspect.signature(Fleet).parameters["down_timeout"].default == 30.0
    with pytest.raises(ValueError, match="down_timeout must be a positive number"):
        Fleet(lambda: [], name="x", tokenizer=None, down_timeout=0)


def test_an_answer_after_the_games_ended_raises_nothing_in_the_engines_thread(caplog):
    """The engine answers a lockstep tick after the run's loop closed (its games timed out): the
    answer is dropped, no "Event loop is closed" traceback from the engine's thread."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from autocurricula.arena.arena import Arena, run_async
    from autocurricula.records import GameRecord

    pending: list[Future] = []

    def submit_many(requests):
        futs = [Future() for _ in requests]
        pending.extend(futs)
        return futs

    engine = SimpleNamespace(tokenizer=None, submit_many=submit_many)

    async def play(players, model, tokenizer):
        await model.generate(players[0], [1, 2, 3])
        return [0.0, 0.0]

    players = [{"id": "a"}, {"id": "b"}]
    arena = Arena(engine, seed=0)
    with caplog.at_level(logging.ERROR):
        (record,) = run_async(arena.run([(play, players, GameRecord("g0", players), "g")], timeout_s=0.3))
        assert record.error.startswith("TimeoutError") and len(pending) == 1
        pending[0].set_exception(UnavailableError(None, "every server is down"))  # the loop is closed by now
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "exception calling callback" not in logged and "Event loop is closed" not in logged
