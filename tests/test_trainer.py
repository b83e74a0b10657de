"""The league loop end to end on the tiny model: turns, updates, snapshots, checkpoints, resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import autocurricula  # noqa: F401
from autocurricula import AutocurriculumConfig, AutocurriculumTrainer, GRPOConfig, LeagueConfig, LeagueTrainer, SelfPlayConfig, SelfPlayTrainer
from autocurricula.views.callbacks import TrainerCallback
from autocurricula.loop.checkpoint import latest_checkpoint, list_checkpoints
from autocurricula.credit import QCredit, ValueCredit

from toy_games import digits, first_digit_policy, seed_style

FAST = dict(progress=False, ratings={"bt_bootstrap": 10}, max_tokens=4)


def weights_of(trainer, pid):
    return {k: (a.copy(), b.copy()) for k, (a, b) in trainer.engine.adapter_weights(pid).modules.items()}


def same(w1, w2):
    return all(np.array_equal(w1[k][0], w2[k][0]) and np.array_equal(w1[k][1], w2[k][1]) for k in w1)


class Capture(SelfPlayTrainer):
    """Self-play that records what reaches the update, through the public ``on_update`` hook."""

    def train(self, *args, callbacks=None, **kwargs):
        spy = Seen()
        self.seen = spy.seen
        return super().train(*args, callbacks=[*(callbacks or []), spy], **kwargs)


class Seen(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_update(self, trainer, turns, result):
        self.seen.append(list(turns))


def test_async_play_records_trainable_calls_only(tiny_model_path, tmp_path):
    t = Capture(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 6}, output_dir=str(tmp_path), **FAST))
    t.train(str(tiny_model_path), digits)
    turns = t.seen[0]
    assert len(turns) == 6 * 2  # two trainable calls per game; the judge call is not a turn
    assert all("judge" not in t.engine.decode(x.prompt_ids) for x in turns)
    assert {x.seat for x in turns} == {0, 1} and all(x.advantage is not None for x in turns)
    assert t.players[0]["version"] > 1  # updated and live in the engine
    t.engine.close()


def test_seed_style_sync_play_trains(tiny_model_path, tmp_path):
    t = Capture(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 4}, output_dir=str(tmp_path), **FAST))
    t.train(str(tiny_model_path), seed_style)
    assert len(t.seen) == 2 and all(len(ts) == 8 for ts in t.seen)
    assert t.players[0]["version"] == 3
    history = t.match_history
    assert len(history) == 8 and set(history.column_names) >= {"players", "roles", "rewards", "epoch", "versions"}
    t.engine.close()


def test_league_trains_learners_not_frozen_and_scripted_rank(tiny_model_path, tmp_path):
    scripted = {"id": "random-digit", "role": "random", "policy": first_digit_policy}
    t = LeagueTrainer(LeagueConfig(epochs=2, rounds=2,
                                   rules={"games_per_learner": 4, "snapshot_min_rounds": 1, "snapshot_max_rounds": 2},
                                   output_dir=str(tmp_path), **FAST), opponents=[scripted])
    before = {}

    def remember(trainer):
        for p in trainer.players:
            if "policy" not in p and p["id"] not in before:
                before[p["id"]] = weights_of(trainer, p["id"])
        return {}

    t.train(str(tiny_model_path), digits, callbacks=[remember])
    roles = {p["id"]: p for p in t.players}
    assert any(p["frozen"] and p.get("snapshot_of") for p in t.players)  # snapshots joined
    main = next(p for p in t.players if p["role"] == "main_agent" and not p["frozen"])
    assert main["version"] > 2
    for pid, w in before.items():
        if roles[pid]["frozen"]:
            assert same(w, weights_of(t, pid)), pid  # frozen players never change
    board = t.leaderboard
    assert "random-digit" in str(board) and len(board.rows) == len(t.players)
    assert {"elo", "bt", "games", "role", "epoch", "frozen"} <= set(board.rows[0])
    out = Path(tmp_path)
    assert (out / "elo.png").is_file() and (out / "payoff.png").is_file() and (out / "metrics.jsonl").is_file()
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"train/loss", "rollout/reward_mean", "pool/size", "engine/occupancy"} <= set(metrics[0])
    m = metrics[0]  # the round's time splits into playing, updating and the rest
    assert 0 < m["time/rollout_s"] and 0 < m["time/update_s"] and m["time/rollout_s"] + m["time/update_s"] <= m["time/round_s"]
    t.engine.close()


def test_checkpoints_are_complete_pickle_free_and_limited(tiny_model_path, tmp_path):
    t = SelfPlayTrainer(SelfPlayConfig(epochs=3, rounds=1, rules={"games_per_round": 2}, save_total_limit=2,
                                       output_dir=str(tmp_path), **FAST))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    cps = list_checkpoints(tmp_path)
    assert [c.name for c in cps] == ["checkpoint-1", "checkpoint-2"]
    files = [f for f in cps[-1].rglob("*") if f.is_file()]
    assert {f.suffix for f in files} <= {".json", ".safetensors", ".jsonl", ""}
    for f in files:
        assert not f.read_bytes().startswith(b"\x80")  # no pickle protocol header anywhere
    names = {f.relative_to(cps[-1]).as_posix() for f in files}
    assert {"players.json", "state.json", "rng.json", "config.json", "COMPLETE"} <= names
    assert any(n.startswith("adapters/main-0/") for n in names) and any(n.startswith("optimizer/main-0/") for n in names)
    state = json.loads((cps[-1] / "state.json").read_text())
    assert {"elo", "payoff", "rae", "bt_records", "updater_steps"} <= set(state)
    (tmp_path / "checkpoint-9").mkdir()  # a half-written checkpoint without its marker is never picked
    assert latest_checkpoint(tmp_path).name == "checkpoint-2"


@pytest.mark.parametrize("credit", ["value", "q", "q-minimax"])
def test_value_credit_trains_and_its_table_resumes(tiny_model_path, tmp_path, credit):
    backup = "minimax" if credit == "q-minimax" else "mean"
    credit = credit[0] if credit.startswith("q") else credit
    lam = 1.0 if backup == "minimax" else 0.5  # minimax has no lambda-return
    spec = QCredit(lam=lam, target_coef=0.5, target_min_visits=1, backup=backup) if credit == "q" else ValueCredit(lam=0.5)
    cfg = dict(epochs=2, rounds=2, rules={"games_per_round": 4}, output_dir=str(tmp_path), credit=spec, **FAST)
    t = Capture(SelfPlayConfig(**cfg))
    t.train(str(tiny_model_path), digits, grpo_config=GRPOConfig(entropy_coef=0.01))
    t.engine.close()
    assert all(row["train/entropy"] > 0 for row in t.metrics_log if "train/loss" in row)
    turns = [x for batch in t.seen for x in batch]
    assert turns and all(x.advantage is not None for x in turns)
    assert t.credit.values.values and t.metrics_log[-1]["credit/states"] == len(t.credit.values.values)
    state = json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())
    assert state["values"]["lam"] == (1.0 if backup == "minimax" else 0.5)
    assert len(state["values"]["values"]) == len(t.credit.values.values)
    assert state["values"].get("backup", "mean") == (backup if credit == "q" else "mean")
    assert state["values"]["actions"] == (credit == "q") and bool(t.credit.values.action_values) == (credit == "q")
    if credit == "q":
        assert t.metrics_log[-1]["credit/state_moves"] == len(t.credit.values.action_values)
        # the critic's picks reach the update next to the sampled turns, one per (player, prompt) at most
        picked = [[x for x in batch if x.target] for batch in t.seen]
        assert any(picked) and [len(b) for b in picked] == [row["credit/targets"] for row in t.metrics_log]
        assert all(x.advantage > 0 and x.logprobs == [0.0] * len(x.completion_ids) for b in picked for x in b)
    else:
        assert not any(x.target for x in turns)
    again = SelfPlayTrainer(SelfPlayConfig(**cfg))
    again.train(str(tiny_model_path), digits, resume_from_checkpoint=True)  # all epochs done: loads only
    again.engine.close()
    assert again.credit.values.state_dict() == t.credit.values.state_dict()


RUN = """
import sys, json
sys.path.insert(0, {tests!r})
from autocurricula import SelfPlayTrainer, SelfPlayConfig
from toy_games import digits
cfg = SelfPlayConfig(epochs=4, rounds=2, rules={{"games_per_round": 6}}, output_dir={out!r}, progress=False,
                     ratings={{"bt_bootstrap": 0}}, max_tokens=4, save_total_limit=None, seed=7)
t = SelfPlayTrainer(cfg)
t.train({model!r}, digits, resume_from_checkpoint={resume!r})
state = {{"players": t.pool.registry(), "elo": t.standings.elo.ratings,
          "weights": {{p["id"]: {{k: [a.tolist(), b.tolist()] for k, (a, b) in t.engine.adapter_weights(p["id"]).modules.items()}}
                      for p in t.players}}}}
open({out!r} + "/final.json", "w").write(json.dumps(state))
"""


def run_trainer(model, out, resume=False, kill_after=None):
    code = RUN.format(tests=str(Path(__file__).parent), out=str(out), model=str(model), resume=resume)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_after is None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
        return json.loads((Path(out) / "final.json").read_text())
    deadline = time.time() + 300
    while time.time() < deadline and not (Path(out) / kill_after / "COMPLETE").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_sigkill_and_resume_equals_uninterrupted_run(tiny_model_path, tmp_path):
    straight = run_trainer(tiny_model_path, tmp_path / "a")
    run_trainer(tiny_model_path, tmp_path / "b", kill_after="checkpoint-1")
    assert not (tmp_path / "b" / "final.json").exists()
    resumed = run_trainer(tiny_model_path, tmp_path / "b", resume=True)
    assert resumed["players"] == straight["players"]
    assert resumed["elo"] == straight["elo"]
    assert resumed["weights"] == straight["weights"]


def test_sigterm_saves_and_stops(tiny_model_path, tmp_path):
    code = RUN.format(tests=str(Path(__file__).parent), out=str(tmp_path), model=str(tiny_model_path), resume=False)
    code = code.replace("epochs=4", "epochs=50").replace("save_total_limit=None", "save_total_limit=None, save_strategy='no'")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "metrics.jsonl").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    cps = list_checkpoints(tmp_path)
    assert len(cps) == 1 and int(cps[0].name.split("-")[1]) < 49


def test_custom_trainer_with_seed_api(tiny_model_path, tmp_path):
    class Duel(AutocurriculumTrainer):
        def entry(self):
            return [{"role": "a"}, {"role": "b"}] if self.current_epoch == 0 else []

        def match(self):
            a = [x for x in self.players if x["role"] == "a"][0]
            b = [x for x in self.players if x["role"] == "b"][0]
            return [(a, b), (b, a)]

    t = Duel(AutocurriculumConfig(epochs=1, rounds=1, matches=3, output_dir=str(tmp_path), **FAST))
    t.train(str(tiny_model_path), digits)
    assert len(t.match_history) == 6 and t.current_epoch == 0
    # a new role starts from the base model, not as a copy of another role
    assert [p["id"] for p in t.players] == ["a-0", "b-0"] and t.players[1]["parent"] is None
    t.engine.close()


def test_push_league_and_trackers(tiny_model_path, tmp_path, hub, monkeypatch):
    import base64
    import types

    logged = []
    fake = types.SimpleNamespace(init=lambda **kw: logged.append(("init", kw)),
                                 log=lambda metrics, step: logged.append(("log", step, dict(metrics))),
                                 finish=lambda: logged.append(("finish",)))
    broken = types.SimpleNamespace(init=lambda **kw: None, log=lambda *a, **k: 1 / 0, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "trackio", fake)
    monkeypatch.setitem(sys.modules, "wandb", broken)  # a failing tracker is disabled, never fatal
    t = SelfPlayTrainer(SelfPlayConfig(epochs=2, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                       report_to=["trackio", "wandb"], **FAST))
    with pytest.warns(UserWarning, match="wandb logging failed"):
        t.train(str(tiny_model_path), digits)
    steps = [x for x in logged if x[0] == "log"]
    assert logged[0][0] == "init" and logged[-1] == ("finish",) and len(steps) >= 2
    assert "rating/elo/main-0" in steps[0][2] and "train/loss" in steps[0][2]

    calls, commits = hub
    t.push_to_hub("me/league", private=True, endpoint="https://hub.test", token="hf_test")
    t.engine.close()
    files = {op["value"]["path"]: op["value"] for op in commits[-1] if op.get("key") == "file"}
    assert {"README.md", "match_history.jsonl", "elo.png", "payoff.png", "mixture.json",
            "main-0/adapter_config.json", "main-0/adapter_model.safetensors", "main-0/README.md",
            "main-1/adapter_model.safetensors"} <= set(files)
    mixture = json.loads(base64.b64decode(files["mixture.json"]["content"]))
    assert mixture["weights"] and sum(mixture["weights"].values()) == pytest.approx(1.0)
    card = base64.b64decode(files["README.md"]["content"]).decode()
    assert "## Leaderboard" in card and "## Payoff matrix" in card and "`main-1` ← `main-0`" in card
    player_card = base64.b64decode(files["main-1/README.md"]["content"]).decode()
    assert "library_name: peft" in player_card and "| parent | main-0 |" in player_card
    for text in (card, player_card):  # a local base folder is no Hub id: no base_model, and the card says so
        assert "base_model" not in text.split("---")[1] and str(tiny_model_path) not in text.split("## Config")[0]


def test_cli_train_with_yaml(tiny_model_path, tmp_path):
    cfg = tmp_path / "league.yaml"
    cfg.write_text("rounds: 1\nrules:\n  games_per_learner: 2\n  main_exploiters: 0\n  league_exploiters: 1\n"
                   "progress: false\n"
                   "ratings:\n  bt_bootstrap: 0\nmax_tokens: 4\n"
                   "grpo:\n  learning_rate: 0.0005\nlora:\n  r: 4\n  lora_alpha: 8\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    out = subprocess.run([sys.executable, "-m", "autocurricula.cli", "train", "--model", str(tiny_model_path),
                          "--game", "toy_games:digits", "--league", "league", "--config", str(cfg), "--epochs", "1",
                          "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "main_agent-0" in out.stdout and (tmp_path / "out" / "checkpoint-0" / "COMPLETE").is_file()
    bad = subprocess.run([sys.executable, "-m", "autocurricula.cli", "train", "--model", str(tiny_model_path),
                          "--game", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "autocurricula.games" in bad.stderr


def test_nested_games_tag_turns_with_level_and_parent(tiny_model_path, tmp_path):
    from toy_games import nested

    t = Capture(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                               credit="grpo", **FAST))
    t.train(str(tiny_model_path), nested)
    turns = t.seen[0]
    assert len(turns) == 2 * 2 * 2 and {x.level for x in turns} == {1}
    parents = {x.parent for x in turns}
    assert len(parents) == 2 and not any("/" in p for p in parents)  # the spawning game: one per game
    assert len({x.game_id for x in turns}) == 4 and all(x.game_id.count("/") == 1 for x in turns)  # 2 x 2 sub-games
    assert len({(x.parent, x.group.split("|")[0]) for x in turns}) == 4  # two call sites per game: two groups
    t.engine.close()


def test_play_as_a_method_and_a_loaded_model(tiny_model_path, tmp_path):
    from mlx_lm import load

    class Mine(SelfPlayTrainer):
        async def play(self, players, model, tokenizer):
            return await digits(players, model, tokenizer)

    t = Mine(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path), **FAST))
    from autocurricula.engine import Engine

    def loaded():  # an already loaded mlx-lm model, handed over with its tokenizer
        return load(str(tiny_model_path))

    engine = Engine(*loaded(), name="tiny")
    t.train(engine)
    assert len(t.match_history) == 2 and t.run.model_name == "tiny"
    engine.close()
    pair = Mine(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path / "pair"),
                               **FAST))
    pair.train(loaded())  # the (model, tokenizer) pair mlx_lm.load returns, named by its architecture
    assert len(pair.match_history) == 2 and pair.run.model_name == "llama"
    pair.engine.close()


def test_default_league_trains_tictactoe_as_in_the_seed(tiny_model_path, tmp_path, monkeypatch):
    from autocurricula.games.tictactoe import play

    monkeypatch.chdir(tmp_path)  # the default output_dir is relative
    trainer = LeagueTrainer()
    trainer.config.progress = False
    trainer.train(str(tiny_model_path), play)
    print(trainer.leaderboard)
    assert trainer.current_epoch == trainer.config.epochs - 1
    assert (tmp_path / "autocurricula-output" / f"checkpoint-{trainer.current_epoch}" / "COMPLETE").is_file()
    assert {p["role"] for p in trainer.players} >= {"main_agent", "main_exploiter", "league_exploiter"}
    trainer.engine.close()


