"""Learning-rate schedules (``GRPOConfig.lr_scheduler_type``): the maths, the config checks, and a
league whose updates really use the scheduled rate, resumed runs included."""

import json

import numpy as np
import pytest

from autocurricula import SelfPlayConfig, SelfPlayTrainer
from autocurricula.loop.config import GRPOConfig, coerce_grpo_config
from autocurricula.training import Updater
from autocurricula.training.optim import scheduled_lr
from toy_games import digits


def test_schedules_by_hand():
    assert [scheduled_lr(1.0, "linear", k, 4) for k in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert scheduled_lr(2.0, "linear", 2, 4, min_ratio=0.5) == pytest.approx(1.5)
    assert [round(scheduled_lr(1.0, "cosine", k, 4), 6) for k in range(5)] == [1.0, 0.853553, 0.5, 0.146447, 0.0]
    assert scheduled_lr(1.0, "cosine", 4, 4, min_ratio=0.1) == pytest.approx(0.1)
    assert scheduled_lr(3e-3, "constant", 3, 4) == 3e-3
    assert scheduled_lr(1.0, "linear", 9, 4) == 0.0  # past the end: the floor
    # warmup_stable_decay: constant for the first 6 of 8, then a half cosine over the last quarter
    wsd = [round(scheduled_lr(1.0, "warmup_stable_decay", k, 8, decay_ratio=0.25), 6) for k in range(9)]
    assert wsd == [1.0] * 7 + [0.5, 0.0]
    assert scheduled_lr(2.0, "warmup_stable_decay", 8, 8, min_ratio=0.1, decay_ratio=0.5) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="decay_ratio"):
        scheduled_lr(1.0, "warmup_stable_decay", 0, 4)
    with pytest.raises(ValueError, match="schedule"):
        scheduled_lr(1.0, "step", 0, 4)


def test_config_checks_and_trl_names():
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        GRPOConfig(lr_scheduler_type="polynomial")
    with pytest.raises(ValueError, match="min_lr_ratio"):
        GRPOConfig(lr_scheduler_type="linear", min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="decaying schedule"):
        GRPOConfig(min_lr_ratio=0.1)  # a floor without a schedule does nothing
    with pytest.raises(ValueError, match="lr_decay_ratio in"):
        GRPOConfig(lr_scheduler_type="warmup_stable_decay")
    with pytest.raises(ValueError, match="belongs to"):
        GRPOConfig(lr_scheduler_type="linear", lr_decay_ratio=0.2)
    assert GRPOConfig(lr_scheduler_type="warmup_stable_decay", lr_decay_ratio=0.25).lr_decay_ratio == 0.25
    trl = pytest.importorskip("trl")
    cfg = coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False))
    assert cfg.lr_scheduler_type == "linear"  # trl's default, carried over as a plain string
    with pytest.raises(ValueError, match="not supported here"):
        coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False,
                                          lr_scheduler_type="polynomial"))
    with pytest.raises(ValueError, match="lr_scheduler_kwargs"):
        coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False,
                                          lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 2}))
    with pytest.raises(ValueError, match="warm-up"):
        coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False, warmup_steps=5))
    with pytest.raises(ValueError, match=r"pass our GRPOConfig\(lr_scheduler_type='warmup_stable_decay'"):
        coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False,
                                          lr_scheduler_type="warmup_stable_decay"))


def _stop_after_epoch_0(trainer):
    trainer.request_stop("SIGTERM")  # as the signal handler does: checkpoint, then stop


def _record_rates(monkeypatch) -> list[dict]:
    """The per-player rates every ``Updater.step`` receives, in order."""
    seen = []
    step = Updater.step

    def spy(self, turns, lr=None, skip=()):
        seen.append(dict(lr or {}))
        return step(self, turns, lr=lr, skip=skip)

    monkeypatch.setattr(Updater, "step", spy)
    return seen


def _run(tiny_model_path, out, monkeypatch, *, epochs=2, resume=False, stop=False, schedule="linear", decay=None):
    seen = _record_rates(monkeypatch)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=epochs, rounds=2, rules={"games_per_round": 4, "past_share": 0.0},
                                       output_dir=str(out), progress=False, ratings={"bt_bootstrap": 0}, max_tokens=4,
                                       game_name="digits", overwrite_output_dir=not resume, save_total_limit=None))
    t.train(str(tiny_model_path), digits, grpo_config=GRPOConfig(learning_rate=1e-2, lr_scheduler_type=schedule,
                                                                 lr_decay_ratio=decay),
            resume_from_checkpoint=resume or None, callbacks=[_stop_after_epoch_0] if stop else [])
    weights = {p["id"]: t.engine.adapter_weights(p["id"]) for p in t.players if not p["frozen"]}
    t.engine.close()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return t, seen, rows, weights


def test_a_league_updates_with_the_scheduled_rate_and_resumes_on_it(tiny_model_path, tmp_path, monkeypatch, caplog):
    t, seen, rows, straight = _run(tiny_model_path, tmp_path / "straight", monkeypatch)
    learner = next(p["id"] for p in t.players if not p["frozen"])
    assert [s[learner] for s in seen] == pytest.approx([1e-2, 7.5e-3, 5e-3, 2.5e-3])
    assert [r["train/learning_rate"] for r in rows if "train/loss" in r] == pytest.approx([1e-2, 7.5e-3, 5e-3,
                                                                                            2.5e-3])
    # a run stopped after epoch 0 and resumed continues the schedule where it was, to the same weights
    _run(tiny_model_path, tmp_path / "split", monkeypatch, stop=True)
    _, seen2, _, resumed = _run(tiny_model_path, tmp_path / "split", monkeypatch, resume=True)
    assert [s[learner] for s in seen2] == pytest.approx([5e-3, 2.5e-3])
    for path, (a, b) in straight[learner].modules.items():
        np.testing.assert_allclose(resumed[learner].modules[path][0], a, atol=1e-6, err_msg=path)
        np.testing.assert_allclose(resumed[learner].modules[path][1], b, atol=1e-6, err_msg=path)
    # warmup_stable_decay over the last half: 1e-2 twice, then the half cosine's 1e-2 and 5e-3
    _, seen4, _, _ = _run(tiny_model_path, tmp_path / "wsd", monkeypatch, schedule="warmup_stable_decay", decay=0.5)
    assert [s[learner] for s in seen4] == pytest.approx([1e-2, 1e-2, 1e-2, 5e-3])
    assert "barely falls" not in caplog.text
    # a share too small to decay over two rounds is said at the start
    _, seen5, _, _ = _run(tiny_model_path, tmp_path / "wsd-short", monkeypatch, schedule="warmup_stable_decay",
                          decay=0.25)
    assert [s[learner] for s in seen5] == pytest.approx([1e-2] * 4) and "barely falls" in caplog.text
    # the constant schedule leaves the updater's own rate in charge
    _, seen3, rows3, constant = _run(tiny_model_path, tmp_path / "constant", monkeypatch, schedule="constant")
    assert seen3 == [{}] * 4 and not any("train/learning_rate" in r for r in rows3)
    assert any(not np.allclose(a[0], b[0]) for (_, a), (_, b) in zip(sorted(straight[learner].modules.items()),
                                                                     sorted(constant[learner].modules.items())))


def test_a_league_gives_its_exploiters_their_own_rate(tiny_model_path, tmp_path, monkeypatch):
    from autocurricula import LeagueConfig, LeagueTrainer

    class Exploiters(LeagueTrainer):  # the learning_rate_of hook, as examples/kuhn_league.py uses it
        def learning_rate_of(self, player_id):
            role = next(p["role"] for p in self.players if p["id"] == player_id)
            return 3e-2 if role != "main_agent" else super().learning_rate_of(player_id)

    seen = _record_rates(monkeypatch)
    for schedule in ("constant", "linear"):
        seen.clear()
        config = LeagueConfig(epochs=1, rounds=2,
                              rules={"main_exploiters": 1, "league_exploiters": 1, "games_per_learner": 2},
                              output_dir=str(tmp_path / schedule), progress=False, ratings={"bt_bootstrap": 0},
                              max_tokens=2, game_name="digits", overwrite_output_dir=True)
        t = Exploiters(config)
        t.train(str(tiny_model_path), digits, grpo_config=GRPOConfig(learning_rate=1e-2, lr_scheduler_type=schedule))
        roles = {p["id"]: p["role"] for p in t.players if not p["frozen"]}
        t.engine.close()
        factors = [1.0, 1.0] if schedule == "constant" else [1.0, 0.5]
        assert len(seen) == 2
        for rates, f in zip(seen, factors):
            assert set(rates) == set(roles)
            for pid, rate in rates.items():
                assert rate == pytest.approx((1e-2 if roles[pid] == "main_agent" else 3e-2) * f), (pid, schedule)
