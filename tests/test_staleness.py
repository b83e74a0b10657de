"""Rollouts overlapping updates (``max_staleness``): round r+1's games play while round r updates,
by the adapters from before that update; turns too many versions behind are dropped and counted;
the ratio against the sampler's logprobs corrects the rest; checkpoints drain the pipeline.

The overlap in time needs the games elsewhere: a real `autocurricula serve` process on loopback."""

import asyncio
import json
import logging
import time
from dataclasses import replace

import pytest

from autocurricula import SelfPlayConfig, SelfPlayTrainer
from autocurricula.loop.config import AutocurriculumConfig, GRPOConfig
from autocurricula.views.callbacks import TrainerCallback
from autocurricula.records import Turn
from autocurricula.engine import AdapterWeights, Engine, LoraSpec
from autocurricula.loop.rounds import drop_stale
from autocurricula.training import Updater
from test_remote import KEY, start_all
from toy_games import digits

GAMES = 6  # per round


def test_max_staleness_is_checked():
    assert AutocurriculumConfig().max_staleness == 0
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="max_staleness must be an integer >= 0"):
            AutocurriculumConfig(max_staleness=bad)


def test_drop_stale_keeps_turns_within_k_versions():
    def turn(player, version, target=False):
        return Turn(player, "g", "r", [1], [2], [-0.5], version=version, target=target)

    turns = [turn("a", 5), turn("a", 4), turn("a", 3), turn("a", 2), turn("b", 1), turn("a", None),
             turn("a", 1, target=True), turn("frozen", 1)]
    kept, dropped, worst = drop_stale(turns, {"a": 5, "b": 1}, 2)
    assert [t.version for t in kept] == [5, 4, 3, 1, None, 1, 1] and [t.player for t in kept][-1] == "frozen"
    assert (dropped, worst) == (1, 3)
    assert drop_stale(turns, {"a": 5, "b": 1}, 3)[1] == 0


def test_cli_train_takes_max_staleness(monkeypatch):
    from autocurricula import cli
    from autocurricula.loop.trainer import AutocurriculumTrainer

    seen = {}

    def train(self, model, play, **kw):
        seen["k"] = self.config.max_staleness
        raise KeyboardInterrupt  # stop before the CLI prints a leaderboard

    monkeypatch.setattr(AutocurriculumTrainer, "train", train)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", "--model", "m", "--game", "tictactoe", "--league", "selfplay", "--max-staleness", "2"])
    assert seen["k"] == 2


def test_stale_turns_are_corrected_by_the_ratio_against_the_sampler(tiny_model_path):
    """Turns from an older adapter keep the sampler's logprobs as the ratio's denominator: against
    the moved-on policy they clip, while turns of the current adapter (or the same turns marked as
    not sampled, whose ratio is taken against the current logprobs) do not."""
    engine = Engine(str(tiny_model_path))
    try:
        spec = LoraSpec(r=4, lora_alpha=8)
        dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}

        def sample(version):
            out = []
            for i in range(8):
                c = engine.generate(f"game {i}: say a digit", "p", max_tokens=6, seed=i)
                out.append(Turn("p", f"g{i}", "r", c.prompt_ids, c.token_ids, c.logprobs, version=c.adapter_version,
                                reward=1.0, advantage=1.0 if i % 2 else -1.0))
            assert {t.version for t in out} == {version}
            return out

        engine.load_adapter("p", AdapterWeights.random(dims, spec, seed=0, b_std=0.5))
        stale = sample(1)
        engine.load_adapter("p", AdapterWeights.random(dims, spec, seed=1, b_std=0.5))  # the policy moved on
        fresh = sample(2)
        cfg = GRPOConfig(epsilon=1e-3, learning_rate=0.0)  # lr 0: every step measures the same policy
        clip = {name: Updater(engine, cfg).step(turns)["clip_ratio"]
                for name, turns in (("stale", stale), ("fresh", fresh),
                                    ("targets", [replace(t, target=True) for t in stale]))}
        assert clip["stale"] > 0.2, clip
        assert clip["fresh"] < 0.05 and clip["targets"] == 0.0, clip
    finally:
        engine.close()


# ---------------------------------------------------------------------------------- league runs
GAME_STARTS: list[float] = []
GAME_ENDS: list[float] = []


async def timed_digits(players, model, tokenizer):
    GAME_STARTS.append(time.monotonic())
    rewards = await digits(players, model, tokenizer)
    await asyncio.sleep(0.2)  # a game longer than the bookkeeping between a round's end and its update
    GAME_ENDS.append(time.monotonic())
    return rewards


class Timed(SelfPlayTrainer):
    """Requests a stop at ``stop_after`` (epoch, round), as SIGTERM does."""

    stop_after = None

    def on_round_end(self, records):
        if (self.current_epoch, self.current_round) == self.stop_after:
            self.request_stop("SIGTERM")
        yield from super().on_round_end(records)


class Timing(TrainerCallback):
    """Records when each round's update stage starts (its games are rated) and when its update
    ends; ``pause`` makes the update slow enough that an overlap (or its absence) shows however the
    CPU is shared."""

    def __init__(self, trainer, pause: float):
        self.trainer, self.pause = trainer, pause

    def on_games(self, trainer, records):
        self.trainer.update_starts.append(time.monotonic())

    def on_update(self, trainer, turns, result):
        time.sleep(self.pause)
        self.trainer.update_ends.append(time.monotonic())


def league(tiny_model_path, out, *, epochs=2, rounds=3, resume=False, pause=0.0, stop_after=None, grpo=None,
           servers=None, **overrides):
    GAME_STARTS.clear()
    GAME_ENDS.clear()
    t = Timed(SelfPlayConfig(epochs=epochs, rounds=rounds, rules={"games_per_round": GAMES, "past_share": 0.5},
                             output_dir=str(out), progress=False, ratings={"bt_bootstrap": 0}, max_tokens=4,
                             game_name="digits", overwrite_output_dir=not resume, save_total_limit=None, **overrides))
    t.update_starts, t.update_ends, t.stop_after, t.served = [], [], stop_after, []

    def served(t):  # after each epoch, before its checkpoint: what the servers hold
        if t.run.plays_elsewhere:
            t.served.append({p["id"]: (p["version"], t.run.rollout.adapter_info(p["id"])) for p in t.players})

    t.train(str(tiny_model_path), timed_digits, resume_from_checkpoint=resume or None, grpo_config=grpo,
            callbacks=[served, Timing(t, pause)], servers=servers, api_key=KEY if servers else None)
    t.engine.close()
    t.game_starts, t.game_ends = sorted(GAME_STARTS), sorted(GAME_ENDS)
    t.history = [(g["game_id"], g["players"], g["rewards"], g["versions"]) for g in t.match_history]
    t.rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return t


def first_starts(t):
    """The first game start of each round, in order (rounds play one after another)."""
    return [t.game_starts[i] for i in range(0, len(t.game_starts), GAMES)]


def last_ends(t):
    """The last game end of each round, in order."""
    return [t.game_ends[i] for i in range(GAMES - 1, len(t.game_ends), GAMES)]


def test_in_process_runs_the_pipelined_schedule_serially(tiny_model_path, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="autocurricula.loop.trainer"):
        t = league(tiny_model_path, tmp_path / "k1", epochs=1, max_staleness=1, pause=0.2)
    assert "in-process engine" in caplog.text and "no overlap in time" in caplog.text
    # round r+1 is played by the adapters from before round r's update: round 1 by version 1 too
    assert [v for gid, _, _, v in t.history if gid.endswith("-m0-0")] == [[1, 1], [1, 1], [2, 2]]
    starts, ends = first_starts(t), last_ends(t)
    assert starts[1] < t.update_ends[0] and starts[2] < t.update_ends[1]  # played before the update,
    assert ends[1] < t.update_starts[0] and ends[2] < t.update_starts[1]  # not during it
    assert [r["rollout/staleness_max"] for r in t.rows] == [0, 1, 1]
    assert all(r["rollout/stale_dropped"] == 0 for r in t.rows)


def test_turns_more_than_k_versions_behind_are_dropped_and_counted(tiny_model_path, tmp_path, caplog):
    """num_iterations=2: an update adds two versions, so the turns of the round played during it
    are two behind: dropped with max_staleness=1 (and said at the start), kept with 2."""
    grpo = GRPOConfig(num_iterations=2)
    with caplog.at_level(logging.WARNING, logger="autocurricula.loop.trainer"):
        k1 = league(tiny_model_path, tmp_path / "k1", epochs=1, max_staleness=1, grpo=grpo)
    assert "max_staleness=1 < num_iterations=2" in caplog.text
    k2 = league(tiny_model_path, tmp_path / "k2", epochs=1, max_staleness=2, grpo=grpo)
    turns = [r["rollout/turns"] for r in k1.rows]
    assert turns[1] > 0
    assert [r["rollout/stale_dropped"] for r in k1.rows] == [0, turns[1], 0]
    assert [r["rollout/staleness_max"] for r in k1.rows] == [0, 2, 0]
    assert "train/loss" not in k1.rows[1] and "train/loss" in k1.rows[2]  # round 1: nothing left to train on
    assert [r["rollout/stale_dropped"] for r in k2.rows] == [0, 0, 0]
    assert [r["rollout/staleness_max"] for r in k2.rows] == [0, 2, 2]
    assert [p["version"] for p in k1.players] == [5] and [p["version"] for p in k2.players] == [7]


def test_k1_resumes_exactly_and_a_stop_drains_the_round_in_flight(tiny_model_path, tmp_path):
    straight = league(tiny_model_path, tmp_path / "straight", max_staleness=1)
    first = league(tiny_model_path, tmp_path / "split", epochs=1, max_staleness=1)
    resumed = league(tiny_model_path, tmp_path / "split", resume=True, max_staleness=1)
    assert first.history == straight.history[:len(first.history)] and resumed.history == straight.history
    assert [(r["step"], r.get("train/loss")) for r in resumed.rows] == [(r["step"], r.get("train/loss"))
                                                                         for r in straight.rows]
    assert resumed.standings.elo.ratings == straight.standings.elo.ratings
    # a stop after round 0's update: round 1, already being played, is finished, rated and updated
    # before the checkpoint, and round 2 never starts
    stopped = league(tiny_model_path, tmp_path / "stop", max_staleness=1, stop_after=(0, 0))
    state = json.loads((tmp_path / "stop" / "checkpoint-0" / "state.json").read_text())
    assert (state["epoch"], state["round"], state["step"]) == (0, 1, 2)
    assert [g[0] for g in stopped.history] == [g[0] for g in straight.history[:2 * GAMES]]
    assert len(stopped.game_starts) == 2 * GAMES and len(stopped.update_ends) == 2
    registry = json.loads((tmp_path / "stop" / "checkpoint-0" / "players.json").read_text())
    assert [p["version"] for p in registry] == [3]  # both rounds' updates are in it
    rest = league(tiny_model_path, tmp_path / "stop", resume=True, max_staleness=1)
    ids = [g[0] for g in rest.history]
    assert len(ids) == len(set(ids)) == len(straight.history)  # no game lost or played twice


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    (srv,) = start_all(tiny_model_path, tmp_path_factory.mktemp("serve-logs"), 1)
    yield srv
    srv.kill()


def test_through_a_server_the_next_round_plays_during_the_update(tiny_model_path, tmp_path, server):
    """With the server in its own process, round r+1's first game starts before round r's update
    ends; the games are those of the in-process pipelined schedule (same seeds, lockstep); after
    the drain at the end of each epoch the server holds the trainer's versions. max_staleness=0
    through the same server stays serial."""
    pause = 0.5
    serial = league(tiny_model_path, tmp_path / "serial", epochs=1, pause=pause, servers=[server.url])
    piped = league(tiny_model_path, tmp_path / "piped", pause=pause, max_staleness=1, servers=[server.url])
    local = league(tiny_model_path, tmp_path / "local", max_staleness=1)
    s, p, p_end = first_starts(serial), first_starts(piped), last_ends(piped)
    assert all(s[r + 1] > serial.update_ends[r] for r in range(2)), (s, serial.update_ends)
    for r in (0, 1, 3, 4):  # round r+1 plays during round r's update, within an epoch...
        assert p[r + 1] < piped.update_ends[r] and piped.update_starts[r] < p_end[r + 1], (r, p, p_end, piped.update_starts,
                                                                                        piped.update_ends)
    assert p[3] > piped.update_ends[2]  # ...and the epoch's end drains
    assert sum(r["time/rollout_wait_s"] for r in piped.rows) < sum(r["time/rollout_s"] for r in piped.rows)
    assert "rollout/stale_dropped" not in serial.rows[0]
    assert all(r["rollout/stale_dropped"] == 0 and r["rollout/retried"] == 0 for r in piped.rows)
    assert piped.history == local.history
    assert piped.players[0]["version"] == 7  # six updates after version 1
    for epoch in piped.served:  # drained: the server holds every player's current version at the checkpoint
        for pid, (version, info) in epoch.items():
            assert info["version"] == version and info["servers"] == [server.url], (pid, version, info)
