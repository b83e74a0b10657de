"""RayEngine on a local Ray instance (``ray.init(num_cpus=2)`` on 127.0.0.1, listening on loopback
only; 2 rollout actors of the tiny model):
a league played through the actors, one actor killed mid-round with ``ray.kill``; the round
completes with no game lost or counted twice, the killed actor's requests retried elsewhere, and
the restarted actor re-checked and serving again. Skipped when Ray is not installed; the tests that
start Ray are slow (``pytest -m slow tests/test_ray.py``)."""

import json

import pytest

ray = pytest.importorskip("ray")

from autocurricula.fleet.cluster import RayEngine, RayUpdater  # noqa: E402
from autocurricula.engine import AdapterWeights, LoraSpec, SamplingParams  # noqa: E402
from autocurricula.engine.fingerprint import BaseModelMismatchError  # noqa: E402
from helpers import assert_same_adam_updates  # noqa: E402
from ray_loopback import LOOPBACK, loopback_addresses, sockets  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    # on 127.0.0.1, so that every Ray process listens on loopback only (ray_loopback.py says why)
    with loopback_addresses():
        ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        yield
        ray.shutdown()


@pytest.mark.slow  # starts a local Ray instance
def test_the_local_instance_listens_on_loopback_only(local_ray):
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    bound = sockets([me, *me.children(recursive=True)])
    assert {"gcs_server", "raylet"} <= {s["name"] for s in bound}, bound
    assert [s for s in bound if s["ip"] not in LOOPBACK] == [], bound
    assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"


@pytest.mark.slow  # a local Ray instance and 3 rounds of a league: about a minute on 2 cores
def test_a_killed_rollout_actor_loses_no_game_and_comes_back(local_ray, tiny_model_path, tmp_path):
    from autocurricula import SelfPlayConfig, SelfPlayTrainer
    from toy_games import digits

    # 2 rollout and 2 learner actors share the 2 CPUs of the local instance
    rollout = RayEngine(tiny_model_path, num_actors=2, poll_s=0.2, timeout=60, num_cpus=0.5, learners=2)
    killed = {}

    async def play(players, model, tokenizer):
        # the first game of round 1 kills the actor that serves the learner, while games are in flight
        if trainer.current_round == 1 and not killed:
            killed["index"] = rollout.placement("main-0")
            ray.kill(rollout.actors[killed["index"]].handle, no_restart=False)  # Ray restarts it
        return await digits(players, model, tokenizer)

    play.__module__ = digits.__module__
    out = tmp_path / "run"
    trainer = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=3, rules={"games_per_round": 6, "past_share": 0.5},
                                             output_dir=str(out), progress=False, max_tokens=4,
                                             ratings={"bt_bootstrap": 0}))
    try:
        trainer.train(str(tiny_model_path), play, servers=rollout)
        history = list(trainer.match_history)
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert "index" in killed
        # every game of every round once: none lost, none replayed as a second game
        assert len(history) == 3 * 6
        assert len({g["game_id"] for g in history}) == len(history)
        rated = [g for g in history if len(set(g["players"])) > 1]
        assert trainer.standings.elo.updates == len(rated)
        assert sum(trainer.standings.elo.games.values()) == 2 * len(rated)
        retried = [m.get("rollout/retried") for m in metrics if "rollout/games" in m]
        assert retried[0] == 0 and retried[1] > 0  # the killed actor's in-flight requests, sent elsewhere
        assert rollout.stats["failed"] == 0
        # the restarted actor is re-checked and takes work again: new players go to the actor with
        # the fewest players, so some land on it, each installed there before its first request
        assert rollout.wait_until_up(killed["index"], timeout=60)
        assert rollout.stats["resyncs"] >= 1
        w = AdapterWeights.random(trainer.engine.linear_dims, LoraSpec(r=4), seed=1)
        news = [f"newbie-{i}" for i in range(4)]
        for name in news:
            rollout.load_adapter(name, w, version=7)
        done = [rollout.submit("o", n, SamplingParams(max_tokens=2, temperature=0.0)) for n in news]
        assert [f.result(60).adapter_version for f in done] == [7] * 4
        assert killed["index"] in {rollout.placement(n) for n in news}
        # the learner's updates ran on the learner actors; their optimizer state is checkpointed
        assert isinstance(trainer.run.updater, RayUpdater) and trainer.run.updater.owner("main-0") is not None
        assert trainer.run.updater.optim["main-0"].step == trainer.run.updater.steps == 3
        assert (out / "checkpoint-0" / "optimizer" / "main-0" / "optimizer.json").is_file()
        # a request an actor refuses fails its future (a lockstep tick's too) and leaves the actor up
        for fut in (rollout.submit([5000], None, SamplingParams(max_tokens=2)),
                    rollout.submit_many([([5000], None, SamplingParams(max_tokens=2))])[0]):
            with pytest.raises(Exception, match="token ids"):
                fut.result(30)
        assert all(a["up"] for a in rollout.health()["actors"])
        # the trainer's players are on the actors at the trainer's versions
        assert {p["id"]: rollout.adapter_info(p["id"])["version"] for p in trainer.players} == \
            {p["id"]: p["version"] for p in trainer.players}
    finally:
        rollout.close()
        trainer.engine.close()


@pytest.mark.slow  # a local Ray instance and 2 learner actors
def test_learner_actors_give_the_fused_update_and_survive_a_killed_learner(local_ray, tiny_model_path):
    """Players shared out over 2 learner actors, updated in parallel: the same adapters and optimizer
    states as one fused in-process update of all of them (players are independent learners), also
    after a learner is killed mid-run (its players' step runs on the other one)."""
    import numpy as np

    from autocurricula.bench.train import _turns
    from autocurricula.loop.config import GRPOConfig
    from autocurricula.engine import Engine
    from autocurricula.training import Updater

    grpo = GRPOConfig(learning_rate=1e-3, num_iterations=2)
    names = ["p0", "p1", "p2"]
    local, remote = Engine(str(tiny_model_path)), Engine(str(tiny_model_path))
    up = None
    try:
        for eng in (local, remote):
            for i, n in enumerate(names):
                eng.load_adapter(n, AdapterWeights.random(eng.linear_dims, LoraSpec(r=4), seed=i))
        fused = Updater(local, grpo)
        up = RayUpdater(remote, grpo, tiny_model_path, num_learners=2, actor_options={"num_cpus": 0.5})
        for k in range(2):
            turns = _turns(names, 3, 12, 4, local.vocab_size, seed=k)
            want = fused.step(turns)
            got = up.step(turns)
            # disjoint sets of players on both learners; after the kill, all on the survivor
            assert {up.owner(n) for n in names} == ({0, 1} if k == 0 else {survivor})
            assert got["players"] == want["players"] == 3 and got["rows"] == want["rows"]
            # summed over the learners: each learner's players' own rows and tries (padding depends on the batching)
            assert got["row_tokens"] == want["row_tokens"] > 0 and got["tree_tokens"] == want["tree_tokens"] > 0
            assert got["padded_tokens"] >= got["row_tokens"] - got["rows"]
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
            for n in names:
                assert remote.adapter_info(n)["version"] == local.adapter_info(n)["version"] == 1 + 2 * (k + 1)
                assert up.optim[n].step == fused.optim[n].step
                for path, (a, b) in local.adapter_weights(n).modules.items():
                    a2, b2 = remote.adapter_weights(n).modules[path]
                    # learners batch other players together: equal up to Adam's amplified rounding
                    assert_same_adam_updates(a2, a, grpo.learning_rate, 2 * (k + 1), f"{n} {path} A")
                    assert_same_adam_updates(b2, b, grpo.learning_rate, 2 * (k + 1), f"{n} {path} B")
            if k == 0:  # the learner of p0 dies; the next step still updates every player once
                ray.kill(up.learners[up.owner("p0")], no_restart=True)
                survivor = 1 - up.owner("p0")
        assert up.stats["learner_retried"] == 1 and up.steps == 4
        with pytest.raises(TimeoutError, match="num_cpus"):  # a learner no node has room for
            RayUpdater(remote, grpo, tiny_model_path, num_learners=1, actor_options={"num_cpus": 64},
                       connect_timeout=3)
    finally:
        if up is not None:
            up.close()
        local.close()
        remote.close()


@pytest.mark.slow  # starts a local Ray instance
def test_actors_of_another_base_model_are_refused(local_ray, tiny_model_path):
    with pytest.raises(BaseModelMismatchError, match="not the trainer's"):
        RayEngine(tiny_model_path, num_actors=1, base={"kind": "files", "config": "other", "weights": "other"})


def test_bad_arguments_say_what_to_pass(tiny_model_path):
    with pytest.raises(ValueError, match="num_actors"):
        RayEngine(tiny_model_path, num_actors=0)
    with pytest.raises(ValueError, match="learners must be an integer >= 0"):
        RayEngine(tiny_model_path, learners=-1)
    with pytest.raises(ValueError, match="model folder or Hub id"):
        RayEngine(object())


def test_cli_train_plays_on_ray_actors(monkeypatch):
    """`autocurricula train --ray-actors N --ray-learners M` passes a RayEngine as servers and closes
    it after training; --server with it is refused."""
    from autocurricula import cli
    from autocurricula.fleet import cluster
    from autocurricula.loop.trainer import AutocurriculumTrainer

    seen = {}

    class FakeRay:
        def __init__(self, model, **kw):
            seen.update(model=model, **kw)

        def close(self):
            seen["closed"] = True

    def train(self, model, play, **kw):
        seen["servers"] = kw["servers"]
        raise KeyboardInterrupt  # stop before the CLI prints a leaderboard of a league that never ran

    monkeypatch.setattr(cluster, "RayEngine", FakeRay)
    monkeypatch.setattr(AutocurriculumTrainer, "train", train)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", "--model", "m", "--game", "tictactoe", "--ray-actors", "3", "--ray-learners", "2"])
    assert isinstance(seen["servers"], FakeRay) and seen["closed"]
    assert (seen["model"], seen["num_actors"], seen["learners"], seen["address"]) == ("m", 3, 2, "auto")
    with pytest.raises(SystemExit, match="not both"):
        cli.main(["train", "--model", "m", "--game", "tictactoe", "--ray-actors", "2", "--server", "http://x:1"])
