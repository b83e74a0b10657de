"""Reruns with the same seed reproduce training exactly on CPU (lockstep, the default): the same
games, turns, logprobs, advantages, ratings, adapters and optimizer moments, bit for bit; so does
a run killed with SIGKILL and resumed from its last checkpoint."""

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest

from autocurricula.arena.arena import Arena, GameRecord

# ------------------------------------------------------------------ the lockstep tick, without a model


class TickEngine:
    """Just what Arena needs from an engine; records which calls each lockstep tick submits."""

    tokenizer = SimpleNamespace(pad_token_id=0)

    def __init__(self):
        self.ticks: list[list[int]] = []

    def submit_many(self, requests):
        self.ticks.append([ids[0] for ids, _player, _params in requests])  # one lockstep tick
        return [self._done(ids) for ids, _player, _params in requests]

    @staticmethod
    def _done(ids):
        fut: Future = Future()
        fut.set_result(SimpleNamespace(text="x", token_ids=[1], logprobs=[0.0], prompt_ids=list(ids),
                                       finish_reason="stop", adapter_version=1))
        return fut


def test_a_game_started_mid_round_joins_the_next_tick():
    # Two games at a time: A makes two calls, B and C one each. When B ends, C takes its place and
    # must be in the same tick as A's second call; a tick with A alone (C not yet registered when
    # the coordinator looked) makes batch composition, hence the floats, depend on timing.
    def game(tag, calls):
        async def play(players, model, tokenizer):
            for i in range(calls):
                await model.generate(players[0], [tag * 10 + i])
            return [0.0]
        return play

    engine = TickEngine()
    arena = Arena(engine, lockstep=True)
    games = [(game(t, n), [{"id": "p", "frozen": True}], GameRecord(f"g{t}", []), "g") for t, n in ((1, 2), (2, 1), (3, 1))]
    records = asyncio.run(arena.run(games, max_concurrent=2))
    assert [r.error for r in records] == [None] * 3
    assert engine.ticks == [[10, 20], [11, 30]]


def test_a_tick_that_goes_without_a_busy_game_warns(caplog):
    # The one case lockstep cannot make reproducible: a game busy on other work past the grace
    # (1 s) between two model calls. It must not pass silently.
    async def slow(players, model, tokenizer):
        await model.generate(players[0], [1])
        await asyncio.sleep(1.3)
        await model.generate(players[0], [2])
        return [0.0]

    async def quick(players, model, tokenizer):
        for i in range(2):
            await model.generate(players[0], [3 + i])
        return [0.0]

    engine = TickEngine()
    arena = Arena(engine, lockstep=True)
    games = [(fn, [{"id": "p", "frozen": True}], GameRecord(name, []), "g") for name, fn in (("a", slow), ("b", quick))]
    with caplog.at_level("WARNING", logger="autocurricula.arena.arena"):
        asyncio.run(arena.run(games, max_concurrent=2))
    assert engine.ticks == [[1, 3], [4], [2]]
    assert arena.split_ticks == 1 and "rerun may differ" in caplog.text


def test_sync_games_beyond_the_thread_pool_do_not_stall_the_ticks():
    # A sync game admitted before a thread is free for it could not queue a call, so every tick
    # waited the coordinator's 1 s grace for it and was then composed by timing.
    from autocurricula import set_player

    def sync_game(players, model, tokenizer):
        set_player(model, players[0])
        for _ in range(2):
            model.generate(input_ids=[[7]], max_new_tokens=1)
        return [0.0]

    engine = TickEngine()
    arena = Arena(engine, lockstep=True)
    games = [(sync_game, [{"id": "p", "frozen": True}], GameRecord(f"g{i}", []), "g") for i in range(6)]
    t0 = time.monotonic()
    records = asyncio.run(arena.run(games, max_concurrent=6, sync_workers=2))
    assert [r.error for r in records] == [None] * 6
    assert time.monotonic() - t0 < 3.0  # six ticks; each one that waits out the grace costs 1 s
    assert [len(t) for t in engine.ticks] == [2] * 6


# ------------------------------------------------------------------ whole runs, in separate processes

RUN = r"""
import asyncio, hashlib, json, random, sys
import numpy as np
from autocurricula import LeagueConfig, LeagueTrainer
from autocurricula.views.callbacks import TrainerCallback
from autocurricula.credit import QCredit
from autocurricula.games import kuhn_poker

out, model, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
steps = []

def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]

def of(modules):  # by module path: a checkpoint gives the modules back in file order
    return digest(*[x for path in sorted(modules) for x in modules[path]])

jitter = random.SystemRandom()

async def play(players, model, tokenizer):
    # games of different lengths (a finished game's successor starts while others are mid-game),
    # each awaiting something else for a random time now and then, as a game talking to an
    # environment server would: timing must not change which calls share a batch
    for _ in range(model.seed % 3):
        await asyncio.sleep(jitter.random() * 0.004)
        await model.generate(players[0], "warm up:", max_tokens=2)
    rewards = await kuhn_poker.play(players, model, tokenizer)
    await asyncio.sleep(jitter.random() * 0.004)
    return rewards

class Recorded(TrainerCallback):
    def on_update(self, t, turns, result):
        turns_of = [[x.player, x.game_id, list(x.prompt_ids), list(x.completion_ids), x.target,
                     digest(np.array(x.logprobs, np.float32)), repr(x.advantage)] for x in turns]
        weights = {p: of(t.engine.adapter_weights(p).modules) for p in t.engine.players()}
        steps.append({"epoch": t.current_epoch, "round": t.current_round,
                      "turns": hashlib.sha256(json.dumps(turns_of).encode()).hexdigest()[:16], "n": len(turns),
                      "weights": weights})
        with open(out + "/steps.jsonl", "a") as fh:
            fh.write(json.dumps(steps[-1]) + "\n")

cfg = LeagueConfig(game_name="kuhn_poker", epochs=3, rounds=2,
                   rules={"games_per_learner": 4, "main_exploiters": 1, "league_exploiters": 2,
                          "snapshot_min_rounds": 1, "snapshot_max_rounds": 2}, arena={"max_concurrent_games": 5},
                   credit=QCredit(target_coef=1.0), output_dir=out, seed=11, ratings={"bt_bootstrap": 0},
                   save_total_limit=None, progress=False)
t = LeagueTrainer(cfg)
t.train(model, play, resume_from_checkpoint=resume or None, callbacks=[Recorded()])
final = {"players": t.pool.registry(), "elo": t.standings.elo.ratings,
         "history": open(out + "/match_history.jsonl").read(),
         "weights": {p["id"]: of(t.engine.adapter_weights(p["id"]).modules) for p in t.players if "policy" not in p},
         "moments": {n: [s.step, of(s.moments)] for n, s in t.run.updater.optim.items()}}
open(out + "/final.json", "w").write(json.dumps(final))
"""


def league_run(model, out: Path, hash_seed: int, resume: bool = False, kill_after: str | None = None):
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed))
    cmd = [sys.executable, "-c", RUN, str(out), str(model), "1" if resume else "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_after is not None:
        deadline = time.time() + 300
        while time.time() < deadline and not (out / kill_after / "COMPLETE").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return steps, json.loads((out / "final.json").read_text())


def first_difference(a: list[dict], b: list[dict]) -> str | None:
    for x, y in zip(a, b):
        if x != y:
            part = "turns (games, tokens, logprobs or advantages)" if x["turns"] != y["turns"] else "adapters"
            return f"epoch {x['epoch']} round {x['round']}: {part} differ"
    return None if len(a) == len(b) else f"{len(a)} updates against {len(b)}"


@pytest.fixture(scope="module")
def straight(tiny_model_path, tmp_path_factory):
    return league_run(tiny_model_path, tmp_path_factory.mktemp("straight"), hash_seed=1)


def test_league_reruns_bit_for_bit(straight, tiny_model_path, tmp_path):
    # four learners plus snapshots, six updates, more games than run at once (games start mid-round),
    # a seeded deal per game, credit "q" with targets (hash-keyed tables); another hash seed
    steps, final = straight
    assert len(steps) == 6 and len(steps[-1]["weights"]) >= 5
    again_steps, again = league_run(tiny_model_path, tmp_path, hash_seed=2)
    assert first_difference(steps, again_steps) is None, first_difference(steps, again_steps)
    assert again == final


@pytest.mark.slow  # three more runs; tests/test_trainer.py has a cheaper SIGKILL/resume test in the default tier
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(straight, tiny_model_path, tmp_path):
    steps, final = straight
    league_run(tiny_model_path, tmp_path, hash_seed=3, kill_after="checkpoint-0")
    assert not (tmp_path / "final.json").exists()
    (tmp_path / "steps.jsonl").unlink()
    resumed_steps, resumed = league_run(tiny_model_path, tmp_path, hash_seed=3, resume=True)
    later = [s for s in steps if s["epoch"] >= 1]
    assert first_difference(later, resumed_steps) is None, first_difference(later, resumed_steps)
    assert resumed == final
