"""The trainer against failing games, hung games, signals, reused output folders, damaged
checkpoints and careless inputs (issue: Hardening, trainer items)."""

import asyncio
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import autocurricula  # noqa: F401
from autocurricula import LeagueConfig, LeagueTrainer, SelfPlayConfig, SelfPlayTrainer
from autocurricula.arena.seed_compat import normalise_rewards
from autocurricula.loop.checkpoint import CheckpointError, list_checkpoints, resume_checkpoint, verify_checkpoint
from autocurricula.loop.config import coerce_lora_spec
from autocurricula.publish.hub import HubAccessError, ModelNotFoundError, check_model_source, hub_base_model, model_card
from autocurricula.loop.trainer import GameError

from toy_games import digits, first_digit_policy, seed_style

FAST = dict(progress=False, ratings={"bt_bootstrap": 0}, max_tokens=4)
TESTS = str(Path(__file__).parent)
RELEASE = threading.Event()  # lets a hung sync game's thread go on (and fail) at the end of a test


# ---------------------------------------------------------------- games (importable from a subprocess)
def exploding(players, model, tokenizer):
    raise ValueError("the board exploded")


async def returns_dict(players, model, tokenizer):
    await model.generate(players[0], "Say a digit:", max_tokens=2)
    return {"x": 1.0, "o": -1.0}


async def fails_first(players, model, tokenizer):
    if "-m0-" in model.record.game_id:
        raise KeyError("only the first game")
    return await digits(players, model, tokenizer)


def _hanging() -> None:
    if os.environ.get("HANG_MARK"):  # tells a test that the hung game has started
        Path(os.environ["HANG_MARK"]).touch()


async def hang_first(players, model, tokenizer):
    """The first game of every round never ends."""
    if "-m0-" in model.record.game_id:
        _hanging()
        await asyncio.sleep(3600)
    return await digits(players, model, tokenizer)


def sync_hang_first(players, model, tokenizer):
    """Seed style; the first game of every round blocks its thread (until RELEASE), then calls generate."""
    if "-m0-" in model.record.game_id:
        _hanging()
        RELEASE.wait(3600)
    return seed_style(players, model, tokenizer)


def minimax_like(prompt):
    return "1"


# ---------------------------------------------------------------- 9, 10: failing games
def test_play_that_always_raises_stops_with_its_traceback(tiny_model_path, tmp_path, caplog):
    t = SelfPlayTrainer(SelfPlayConfig(epochs=3, rounds=2, rules={"games_per_round": 4}, output_dir=str(tmp_path),
                                       **FAST))
    with caplog.at_level(logging.ERROR, logger="autocurricula.loop.trainer"), pytest.raises(GameError) as info:
        t.train(str(tiny_model_path), exploding)
    t.engine.close()
    msg = str(info.value)
    assert "4 of 4 games" in msg and "test_trainer_hardening" in msg and "epoch 0, round 0" in msg
    assert "Traceback" in msg and "the board exploded" in msg and "max_game_error_rate" in msg
    logged = [r for r in caplog.records if "the board exploded" in r.getMessage()]
    assert len(logged) == 1 and "Traceback" in logged[0].getMessage()  # once per distinct error, in full
    assert not list_checkpoints(tmp_path)  # nothing "trained"


def test_wrong_return_type_says_what_play_must_return(tiny_model_path, tmp_path):
    for bad, shown in [({"a": 1}, "dict {'a': 1}"), ("ab", "str 'ab'"), (3.0, "float 3.0"), (None, "NoneType None"),
                       (["x", "y"], "list ['x', 'y']")]:
        with pytest.raises(TypeError, match="play must return one number per player") as info:
            normalise_rewards(bad, 2)
        assert shown in str(info.value)
    assert normalise_rewards(([[True, False]], [["e1"], ["e2"]]), 2) == ([1.0, 0.0], [["e1"], ["e2"]])
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                       **FAST))
    with pytest.raises(GameError, match=r"(?s)play must return one number per player.*it returned dict"):
        t.train(str(tiny_model_path), returns_dict)
    t.engine.close()


def test_some_failing_games_are_tolerated_up_to_the_rate(tiny_model_path, tmp_path):
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 4}, output_dir=str(tmp_path / "a"),
                                       **FAST))
    t.train(str(tiny_model_path), fails_first)  # 1 of 4 fails: under the default 0.5
    t.engine.close()
    assert [row["rollout/errors"] for row in t.metrics_log] == [1, 1] and len(t.match_history) == 6
    strict = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 4},
                                            output_dir=str(tmp_path / "b"), arena={"max_game_error_rate": 0.2}, **FAST))
    with pytest.raises(GameError, match="1 of 4 games"):
        strict.train(str(tiny_model_path), fails_first)
    strict.engine.close()
    with pytest.raises(ValueError, match="max_game_error_rate"):
        SelfPlayConfig(arena={"max_game_error_rate": 1.5})


# ---------------------------------------------------------------- 11: timeouts and signals
@pytest.mark.parametrize("game", [hang_first, sync_hang_first])
def test_hung_game_times_out_and_counts_as_an_error(tiny_model_path, tmp_path, game):
    RELEASE.clear()
    # lockstep off: in lockstep a hung game also slows the others' batches by up to a second a
    # call (they wait for it), which needs a longer timeout; the SIGINT test below runs that case
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 4}, output_dir=str(tmp_path),
                                       arena={"game_timeout_s": 1.5, "lockstep": False}, **FAST))
    t0 = time.monotonic()
    t.train(str(tiny_model_path), game)
    elapsed = time.monotonic() - t0
    RELEASE.set()  # the sync thread wakes up; its generate call raises instead of reaching the engine
    t.engine.close()
    assert [row["rollout/errors"] for row in t.metrics_log] == [1, 1]
    assert len(t.match_history) == 6 and elapsed < 60
    with pytest.raises(ValueError, match="game_timeout_s"):
        SelfPlayConfig(arena={"game_timeout_s": 0})


def test_timed_out_sync_game_cannot_generate_again():
    """A seed-style game past its timeout gets GameCancelled from its next model call, in its thread."""
    import asyncio
    import threading

    from autocurricula.arena.arena import Arena, GameCancelled, GameRecord

    class Engine:  # answers every request at once; a game that never calls it needs nothing else
        tokenizer = None

    waiting, seen = threading.Event(), {}

    def stalls(players, model, tokenizer):
        waiting.wait(10)  # past the timeout, on something other than the model
        try:
            model.generate(players[0], "again?")
        except GameCancelled as exc:
            seen["error"] = str(exc)
        return [0.0]

    async def main():
        arena = Arena(Engine(), lockstep=False)
        players = [{"id": "p", "frozen": True}]
        (rec,) = await arena.run([(stalls, players, GameRecord("g", players), "g")], timeout_s=0.2)
        waiting.set()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        return rec

    rec = asyncio.run(main())
    assert rec.error.startswith("TimeoutError") and "game_timeout_s" in rec.error
    assert "game_timeout_s" in seen["error"]


SIGNAL_RUN = """
import sys
sys.path.insert(0, {tests!r})
from autocurricula import SelfPlayTrainer, SelfPlayConfig
from test_trainer_hardening import {game}
cfg = SelfPlayConfig(epochs=50, rounds=3, rules={{"games_per_round": 4}}, output_dir={out!r}, progress=False,
                     ratings={{"bt_bootstrap": 0}}, max_tokens=4, save_strategy="no",
                     arena={{"game_timeout_s": {timeout}, "lockstep": {lockstep}}})
t = SelfPlayTrainer(cfg)
t.train({model!r}, {game})
print("stopped at", t.current_epoch, t.current_round, flush=True)
"""


# lockstep: the others' calls wait up to 1 s each for the hung game, so its timeout leaves them room
@pytest.mark.parametrize("sig,game,lockstep,timeout", [(signal.SIGINT, "hang_first", True, 8.0),
                                                       (signal.SIGTERM, "sync_hang_first", False, 2.0)])
def test_signal_saves_and_exits_within_the_game_timeout(tiny_model_path, tmp_path, sig, game, lockstep, timeout):
    code = SIGNAL_RUN.format(tests=TESTS, out=str(tmp_path), model=str(tiny_model_path), game=game, timeout=timeout,
                             lockstep=lockstep)
    mark = tmp_path / "hanging"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "HANG_MARK": str(mark)})
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():  # the first round's hung game has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=timeout + 60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    assert took < timeout + 20, took  # the hung game's timeout, one update, a save; never the hung game itself
    cps = list_checkpoints(tmp_path)
    assert len(cps) == 1 and b"stopped at 0" in out
    verify_checkpoint(cps[0])
    assert signal.Signals(sig).name in err.decode()


# ---------------------------------------------------------------- 12: reused output_dir
def test_fresh_run_refuses_a_used_output_dir(tiny_model_path, tmp_path):
    cfg = dict(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path), **FAST)
    t = SelfPlayTrainer(SelfPlayConfig(**cfg))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    first_rows = len((tmp_path / "metrics.jsonl").read_text().splitlines())
    again = SelfPlayTrainer(SelfPlayConfig(**cfg))
    with pytest.raises(FileExistsError, match=r"(?s)already holds a run.*overwrite_output_dir=True.*"
                                              r"resume_from_checkpoint=True"):
        again.train(str(tiny_model_path), digits)
    assert again.run is None  # refused before loading anything
    (tmp_path / "checkpoint-7").mkdir()  # another run's checkpoint: deleted with the rest
    (tmp_path / "notes.txt").write_text("mine")  # not a run file: kept
    over = SelfPlayTrainer(SelfPlayConfig(**cfg, overwrite_output_dir=True))
    over.train(str(tiny_model_path), digits)
    over.engine.close()
    assert [c.name for c in list_checkpoints(tmp_path)] == ["checkpoint-0"] and not (tmp_path / "checkpoint-7").exists()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == first_rows
    assert len(over.match_history) == 2 and (tmp_path / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- 13: resume edge cases
def test_resume_without_a_checkpoint_starts_clean(tiny_model_path, tmp_path):
    # what a run killed during its first epoch leaves: games and metrics, a half-written checkpoint
    (tmp_path / "match_history.jsonl").write_text('{"game_id": "e0-r0-m0-0", "players": ["main-0", "main-0"]}\n' * 24)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "epoch": 0}\n')
    (tmp_path / ".checkpoint-0.abc123.tmp" / "adapters").mkdir(parents=True)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 3}, output_dir=str(tmp_path),
                                       **FAST))
    t.train(str(tiny_model_path), digits, resume_from_checkpoint=True)
    t.engine.close()
    assert len(t.match_history) == 6  # this run's games only
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert not list(tmp_path.glob(".checkpoint-*.tmp"))


def test_resume_cuts_metrics_and_history_back_to_the_checkpoint(tiny_model_path, tmp_path):
    cfg = dict(rounds=2, rules={"games_per_round": 3}, output_dir=str(tmp_path), save_total_limit=None, **FAST)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, **cfg))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    # the run went on past checkpoint-0 and was killed: a round of metrics and games after it
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 3, "epoch": 1}\n{"step": 4, "ep')
    with (tmp_path / "match_history.jsonl").open("a") as fh:
        fh.write('{"game_id": "e1-r0-m0-0", "players": ["main-0", "main-1"]}\n')
    again = SelfPlayTrainer(SelfPlayConfig(epochs=2, **cfg))
    again.train(str(tiny_model_path), digits, resume_from_checkpoint=True)
    again.engine.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    ids = [row["game_id"] for row in again.match_history]
    assert len(ids) == len(set(ids)) == 12


def test_damaged_checkpoint_is_skipped_for_the_previous_one(tiny_model_path, tmp_path, caplog):
    cfg = dict(rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path), save_total_limit=None, **FAST)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=2, **cfg))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    cp0, cp1 = list_checkpoints(tmp_path)
    manifest = json.loads((cp1 / "manifest.json").read_text())["files"]
    assert {"players.json", "state.json", "adapters/main-0/adapter_model.safetensors"} <= set(manifest)
    assert all(len(v["sha256"]) == 64 for v in manifest.values())
    assert resume_checkpoint(tmp_path, True) == cp1
    pristine = tmp_path.parent / "pristine"
    shutil.copytree(cp1, pristine)
    for name in ["adapters/main-0/adapter_model.safetensors", "optimizer/main-0/optimizer.safetensors", "state.json",
                 "players.json"]:
        f = cp1 / name
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncated by a full disk or a kill
        with caplog.at_level(logging.WARNING, logger="autocurricula.loop.checkpoint"):
            caplog.clear()
            assert resume_checkpoint(tmp_path, True) == cp0, name
        assert any(str(cp1) in r.getMessage() and name in r.getMessage() for r in caplog.records), name
        with pytest.raises(CheckpointError, match=str(cp1)):
            resume_checkpoint(tmp_path, str(cp1))  # an explicit path is never swapped for another
        shutil.copyfile(pristine / name, f)
    (cp1 / "state.json").write_text("{}")
    again = SelfPlayTrainer(SelfPlayConfig(epochs=3, **cfg))
    again.train(str(tiny_model_path), digits, resume_from_checkpoint=True)  # from checkpoint-0: epochs 1 and 2
    again.engine.close()
    assert [c.name for c in list_checkpoints(tmp_path)] == ["checkpoint-0", "checkpoint-1", "checkpoint-2"]
    assert json.loads((tmp_path / "checkpoint-1" / "state.json").read_text())["epoch"] == 1
    assert [row["epoch"] for row in again.metrics_log] == [1, 2]
    for cp in list_checkpoints(tmp_path):
        (cp / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="every checkpoint"):
        resume_checkpoint(tmp_path, True)


def test_checkpoint_that_fails_to_load_is_named(tiny_model_path, tmp_path):
    cfg = dict(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path), **FAST)
    t = SelfPlayTrainer(SelfPlayConfig(**cfg))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    cp = list_checkpoints(tmp_path)[-1]
    state = cp / "state.json"
    state.write_text("{}")  # broken inside, yet it verifies: its manifest entry is rewritten too
    manifest = json.loads((cp / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"size": state.stat().st_size,
                                       "sha256": hashlib.sha256(state.read_bytes()).hexdigest()}
    (cp / "manifest.json").write_text(json.dumps(manifest))
    again = SelfPlayTrainer(SelfPlayConfig(**cfg))
    with pytest.raises(CheckpointError, match=f"checkpoint {cp} could not be loaded"):
        again.train(str(tiny_model_path), digits, resume_from_checkpoint=True)
    again.engine.close()


def test_a_checkpoint_without_its_manifest_is_refused_for_the_previous_one(tiny_model_path, tmp_path):
    cfg = dict(rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path), save_total_limit=None, **FAST)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=2, **cfg))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    cp0, cp1 = list_checkpoints(tmp_path)
    (cp1 / "manifest.json").unlink()
    (cp1 / "state.json").write_text(json.dumps({**json.loads((cp1 / "state.json").read_text()), "step": 100}))
    assert resume_checkpoint(tmp_path, True) == cp0  # an edited, unverifiable checkpoint is not resumed
    with pytest.raises(CheckpointError, match="no manifest.json"):
        resume_checkpoint(tmp_path, str(cp1))


# ---------------------------------------------------------------- 14: the league's opponents on resume
@pytest.mark.parametrize("with_id", [True, False])
def test_league_resumes_with_its_scripted_opponents(tiny_model_path, tmp_path, with_id):
    scripted = {"role": "minimax", "policy": first_digit_policy, **({"id": "minimax"} if with_id else {})}
    cfg = dict(rounds=1, rules={"games_per_learner": 2, "main_exploiters": 0, "league_exploiters": 0},
               output_dir=str(tmp_path), **FAST)
    t = LeagueTrainer(LeagueConfig(epochs=1, **cfg), opponents=[scripted])
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    again = LeagueTrainer(LeagueConfig(epochs=2, **cfg), opponents=[scripted])
    again.train(str(tiny_model_path), digits, resume_from_checkpoint=True)
    again.engine.close()
    bot = next(p for p in again.players if p["role"] == "minimax")
    assert bot["policy"] is first_digit_policy and again.current_epoch == 1
    stranger = LeagueTrainer(LeagueConfig(epochs=3, **cfg))  # no opponents and no policies: says what to pass
    with pytest.raises(CheckpointError, match=r"(?s)needs its policy callable again.*opponents=.*policies="):
        stranger.train(str(tiny_model_path), digits, resume_from_checkpoint=True)
    stranger.engine.close()


# ---------------------------------------------------------------- 15: small ones
def test_opponent_with_a_taken_looking_id_does_not_clash(tiny_model_path, tmp_path):
    bot = {"id": "main-1", "role": "bot", "policy": minimax_like}
    t = SelfPlayTrainer(SelfPlayConfig(epochs=3, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                       **FAST),
                        opponents=[bot])
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    ids = [p["id"] for p in t.players]
    assert len(ids) == len(set(ids)) and ids[:2] == ["main-0", "main-1"] and "main-2" in ids


def test_non_lora_peft_configs_are_rejected_by_name():
    peft = pytest.importorskip("peft")
    for cfg in (peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
                peft.IA3Config(task_type="CAUSAL_LM")):
        with pytest.raises(ValueError, match=f"{type(cfg).__name__}.*only LoRA"):
            coerce_lora_spec(cfg)
    with pytest.raises(ValueError, match="IA3"):
        coerce_lora_spec({"peft_type": "IA3"})
    assert coerce_lora_spec(peft.LoraConfig(r=4)).r == 4 and coerce_lora_spec({"peft_type": "LORA", "r": 2}).r == 2


def test_missing_model_folder_is_named(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ModelNotFoundError, match="no such folder, and not a Hub id"):
        check_model_source(missing)
    for text in ("./models/x", "~/nope/model", "a/b/c"):
        with pytest.raises(ModelNotFoundError):
            check_model_source(text)
    assert check_model_source("mlx-community/Qwen2.5-0.5B-Instruct-4bit") == "mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    assert check_model_source(tmp_path) == str(tmp_path)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, output_dir=str(tmp_path / "out"), **FAST))
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        t.train(missing, digits)
    for cmd in (["serve", "--model", missing, "--port", "0"], ["train", "--model", missing, "--epochs", "1",
                                                              "--output-dir", str(tmp_path / "cli")]):
        out = subprocess.run([sys.executable, "-m", "autocurricula.cli", *cmd], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode != 0 and "no such folder, and not a Hub id" in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and "HFValidationError" not in out.stderr


def test_cli_finds_a_game_module_in_the_current_directory(tmp_path):
    (tmp_path / "mygame.py").write_text("async def play(players, model, tokenizer):\n    return [0.0, 0.0]\n")
    script = Path(sys.executable).parent / "autocurricula"  # the console script (python -m puts the cwd first)
    if not script.exists():
        pytest.skip("the autocurricula console script is not installed next to this python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(script), "train", "--model", str(tmp_path / "missing"), "--game", "mygame:play"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    # the game imported; what stops the run is the (deliberately) missing model
    assert "--game" not in out.stderr and "no such folder" in out.stderr, out.stderr[-2000:]


def test_hub_cards_name_the_hub_base_model_or_none(tmp_path):
    assert hub_base_model("mlx-community/Qwen2.5-0.5B-Instruct-4bit") == "mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    local = tmp_path / "my-model"
    local.mkdir()
    assert hub_base_model(str(local)) is None
    (local / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    assert hub_base_model(str(local)) == "Qwen/Qwen2.5-0.5B"
    cached = tmp_path / "hub" / "models--mlx-community--tiny-llama" / "snapshots" / ("0" * 40)
    cached.mkdir(parents=True)
    assert hub_base_model(str(cached)) == "mlx-community/tiny-llama"
    card = model_card("main-0", None)
    meta = card.split("---")[1]
    assert "base_model" not in meta and "not on the Hugging Face Hub" in card
    assert "base_model: Qwen/Qwen2.5-0.5B" in model_card("main-0", "Qwen/Qwen2.5-0.5B")


@pytest.fixture()
def hub_rejects_token():
    """huggingface_hub's HTTP client answers 401 to every request (a bad token), offline."""
    pytest.importorskip("huggingface_hub")
    from helpers import hub_transport

    calls = []

    def respond(request, httpx):
        calls.append(request.url.path)
        return httpx.Response(401, json={"error": "Invalid credentials in Authorization header"})

    with hub_transport(respond):
        yield calls


def test_push_to_hub_checks_the_login_before_training(tmp_path, hub_rejects_token, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_bad")
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, output_dir=str(tmp_path), push_to_hub=True, hub_model_id="me/league",
                                       **FAST))
    with pytest.raises(HubAccessError, match=r"(?s)did not accept the login.*`hf auth login`.*push_to_hub=False"):
        t.train(str(tmp_path / "never-loaded"), digits)
    assert any("whoami" in path for path in hub_rejects_token) and t.run is None
    assert not list(tmp_path.iterdir())  # nothing trained, nothing lost


class StopsMidEpoch(SelfPlayTrainer):
    """Behaves as if SIGTERM arrived during epoch 1, round 0 (what the signal handler sets)."""

    def on_round_end(self, records):
        super().on_round_end(records)
        if self.current_epoch == 1 and self.current_round == 0:
            self.request_stop("SIGTERM")


def test_stop_mid_epoch_then_resume_continues_that_epoch(tiny_model_path, tmp_path):
    import numpy as np

    cfg = dict(epochs=2, rounds=3, rules={"games_per_round": 4}, save_total_limit=None, seed=3, **FAST)
    straight = SelfPlayTrainer(SelfPlayConfig(output_dir=str(tmp_path / "a"), **cfg))
    straight.train(str(tiny_model_path), digits)
    stopped = StopsMidEpoch(SelfPlayConfig(output_dir=str(tmp_path / "b"), **cfg))
    stopped.train(str(tiny_model_path), digits)
    stopped.engine.close()
    state = json.loads((tmp_path / "b" / "checkpoint-1" / "state.json").read_text())
    assert (state["epoch"], state["round"], state["step"]) == (1, 0, 4)
    resumed = SelfPlayTrainer(SelfPlayConfig(output_dir=str(tmp_path / "b"), **cfg))
    resumed.train(str(tiny_model_path), digits, resume_from_checkpoint=True)  # rounds 1 and 2 of epoch 1, no entry()
    assert [(r["epoch"], r["step"]) for r in resumed.metrics_log] == [(1, 5), (1, 6)]
    assert resumed.pool.registry() == straight.pool.registry()
    for p in straight.players:
        a, b = straight.engine.adapter_weights(p["id"]).modules, resumed.engine.adapter_weights(p["id"]).modules
        assert all(np.allclose(a[k][0], b[k][0], atol=1e-6) and np.allclose(a[k][1], b[k][1], atol=1e-6) for k in a)
    straight.engine.close()
    resumed.engine.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_overwrite_deletes_every_run_file(tmp_path):
    from autocurricula.loop.checkpoint import RUN_FILES, prepare_output_dir

    for name in RUN_FILES:
        (tmp_path / name).write_text("old run\n")
    (tmp_path / "notes.txt").write_text("mine")
    prepare_output_dir(tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert "transcripts.jsonl" in RUN_FILES


def test_a_game_that_hangs_is_named_by_the_watchdog_then_cancelled(caplog):
    from autocurricula.arena.arena import Arena
    from autocurricula.records import GameRecord

    class Idle:  # no model calls at all: the game only waits
        tokenizer = None

    async def hangs(players, model, tokenizer=None):
        await asyncio.sleep(3600)

    async def quick(players, model, tokenizer=None):
        return [0.0, 0.0]

    players = [{"id": "a"}, {"id": "b"}]
    games = [(hangs, players, GameRecord("stuck-1", players), "g"), (quick, players, GameRecord("fine", players), "g")]
    with caplog.at_level(logging.WARNING, logger="autocurricula.arena.arena"):
        t0 = time.monotonic()
        records = asyncio.run(Arena(Idle(), lockstep=False).run(games, timeout_s=2.0))
    assert time.monotonic() - t0 < 10
    assert "game_timeout_s=2" in records[0].error and records[1].error is None
    assert any("stuck-1" in r.getMessage() and "fine" not in r.getMessage() for r in caplog.records)


def test_games_have_a_finite_timeout_by_default():
    from autocurricula.loop.config import ArenaConfig

    assert ArenaConfig().game_timeout_s == 600.0


def test_learners_without_any_signal_are_named_once(tiny_model_path, tmp_path, caplog):
    async def always_a_draw(players, model, tokenizer=None):
        for p in players:
            await model.generate(p, "Name a digit:", max_tokens=2)
        return [0.0, 0.0]

    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=4, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                       credit="grpo", **FAST))
    with caplog.at_level(logging.WARNING, logger="autocurricula.loop.trainer"):
        t.train(str(tiny_model_path), always_a_draw)
    t.engine.close()
    named = [r.getMessage() for r in caplog.records if "no non-zero advantage" in r.getMessage()]
    assert len(named) == 1 and "main-0" in named[0] and "judge" in named[0]
    assert [row["credit/silent_learners"] for row in t.metrics_log] == [1, 1, 1, 1]
