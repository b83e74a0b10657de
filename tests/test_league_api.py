"""One way to do each thing: specs from entry/on_round_end, snapshot_spec, credit objects, the
reward rule, scripted-policy calls, seat order, trl fields without effect, rng.json without py_rng."""

import contextlib
import hashlib
import json

import numpy as np
import pytest

import autocurricula  # noqa: F401
from autocurricula import GRPOConfig, LeagueConfig, LeagueTrainer, SelfPlayConfig, SelfPlayTrainer
from autocurricula.arena.arena import GameRecord
from autocurricula.loop.config import coerce_grpo_config
from autocurricula.credit import (CREDIT_METHODS, ConstantCredit, Credit, GRPOCredit, QCredit, RAECredit, make_credit,
                                  register_credit)
from autocurricula.records import Turn
from autocurricula.leagues import FictitiousConfig, FictitiousPlayTrainer
from autocurricula.loop.pool import call_scripted, is_scripted, snapshot_spec, takes_rng
from autocurricula.loop.trainer import AutocurriculumTrainer

from league_doubles import ListedPlayers, PooledPlayers, fake_pool
from toy_games import digits

FAST = dict(progress=False, ratings={"bt_bootstrap": 0}, max_tokens=4)


class PooledLeague(PooledPlayers, LeagueTrainer):
    pass


def pooled(trainer):
    trainer.pool = fake_pool()
    return trainer


def policy(prompt):
    return "1"


def test_entry_returns_specs_without_touching_the_pool():
    opponents = [{"id": "bot", "role": "bot", "policy": policy}]
    league = PooledLeague(LeagueConfig(rules={"main_exploiters": 1, "league_exploiters": 2}, **FAST),
                          opponents=opponents)
    specs = league.entry()  # no engine, no pool: entry only describes the newcomers
    assert [s["role"] for s in specs] == ["main_agent", "main_agent", "main_exploiter", "league_exploiter",
                                          "league_exploiter", "bot"]
    assert specs[1]["frozen"] and specs[1]["parent"] is specs[0] and specs[1]["snapshot_of"] is specs[0]
    fict = FictitiousPlayTrainer(FictitiousConfig(**FAST), opponents=opponents)
    specs = fict.entry()
    assert [s["role"] for s in specs] == ["learner", "learner", "bot"] and specs[1]["parent"] is specs[0]
    pooled(league)
    players = league.pool.add_all(league.entry(), 0)
    assert [p["id"] for p in players] == ["main_agent-0", "main_agent-1", "main_exploiter-0", "league_exploiter-0",
                                          "league_exploiter-1", "bot"]
    snap = players[1]
    assert (snap["parent"], snap["snapshot_of"], snap["frozen"]) == ("main_agent-0", "main_agent-0", True)
    assert league.pool.engine.adapters["main_agent-1"] is league.pool.engine.adapters["main_agent-0"]
    assert is_scripted(players[-1]) and not is_scripted(players[0])


def test_snapshot_spec_of_a_pool_player_and_unknown_references():
    p = fake_pool()
    me = p.add({"role": "main", "info": {"note": 7}}, 0)
    spec = snapshot_spec(me)
    assert spec == {"role": "main", "info": {"note": 7}, "frozen": True, "parent": me["id"], "snapshot_of": me["id"]}
    with pytest.raises(ValueError, match="earlier spec of the same list"):
        p.add_all([{"role": "x", "parent": {"role": "nobody"}}], 0)


def test_on_round_end_snapshots_join_one_by_one_then_exploiters_reset():
    league = pooled(PooledLeague(LeagueConfig(rules={"main_exploiters": 1, "league_exploiters": 0,
                                                     "snapshot_min_rounds": 1, "snapshot_max_rounds": 99,
                                                     "snapshot_win_rate": 0.7}, **FAST)))
    league.payoff = type("P", (), {"win_rates": lambda self, a, ids: [1.0 if i == "main_exploiter-0" or a == "x"
                                                                      else 0.9 for i in ids],
                                   "win_rate": lambda self, a, b: 0.5})()
    league.step = 0
    league.pool.add_all(league.entry(), 0)
    before = league.pool.engine.adapters["main_exploiter-0"]
    seen = []
    for spec in league.on_round_end([]):  # the trainer adds each spec as it comes
        seen.append(len(league.players))
        league.pool.add_all([spec], 0)
    assert [p["id"] for p in league.players][-2:] == ["main_agent-2", "main_exploiter-1"]
    assert seen == [3, 4]  # the second decision saw the first snapshot in the pool
    snap = league.pool.get("main_exploiter-1")
    assert league.pool.engine.adapters["main_exploiter-1"] is before  # copied before the reset
    assert league.pool.engine.adapters["main_exploiter-0"] is not before and league.pool.get("main_exploiter-0")[
        "resets"] == 1
    assert snap["snapshot_of"] == "main_exploiter-0"
    assert league.extra_state()["last_snapshot"] == {"main_agent-0": 1, "main_exploiter-0": 1}


def test_a_subclass_extends_on_round_end_by_yielding_more_specs():
    class Guests(PooledPlayers, SelfPlayTrainer):
        def on_round_end(self, records):
            yield from super().on_round_end(records)
            yield {"role": "guest", "init": "base"}

    t = pooled(Guests(SelfPlayConfig(**FAST)))
    t.pool.add_all(t.entry(), 0)
    for spec in t.on_round_end([]):  # the trainer adds each spec as it comes
        t.pool.add_all([spec], 0)
    assert [p["id"] for p in t.players] == ["main-0", "guest-0"]


def test_random_seats_is_one_coin_from_the_trainer_rng():
    t = SelfPlayTrainer(SelfPlayConfig(seed=5, **FAST))
    coins = np.random.default_rng(5).random(50)
    got = [t.random_seats("a", "b") for _ in range(50)]
    assert got == [("a", "b") if c < 0.5 else ("b", "a") for c in coins]


def test_scripted_calls_share_one_rng_check():
    def with_rng(prompt, rng):
        return f"{prompt}:{rng}"

    assert call_scripted(policy, "p", "r") == "1" and call_scripted(with_rng, "p", "r") == "p:r"
    assert takes_rng(with_rng) and not takes_rng(policy) and not takes_rng(len)  # builtins: no signature needed


def test_credit_methods_are_objects_built_by_name():
    credit = make_credit(QCredit(target_coef=0.5), GRPOConfig(), 0)
    assert isinstance(credit, QCredit) and credit.values.actions and credit.name == "q"
    assert isinstance(make_credit("rae", GRPOConfig(), 0), RAECredit)
    assert isinstance(make_credit("constant", GRPOConfig(), 0), ConstantCredit)
    grpo = make_credit("grpo", GRPOConfig(scale_rewards="none"), 0)
    assert isinstance(grpo, GRPOCredit) and grpo.scale_rewards == "none"
    turns = [Turn("p", f"g{i}", "r", [1, i], [2], [0.0], reward=float(i), seat=0) for i in range(3)]
    credit.assign(turns)
    # first visits: A = G - V, V a new state's fallback: the role baseline, 0.05 after rewards 0 and 1
    assert [t.advantage for t in turns] == pytest.approx([0.0, 1.0, 1.95])
    assert credit.metrics() == {"credit/states": 3, "credit/state_moves": 3, "credit/targets": 0}
    restored = make_credit(QCredit(target_coef=0.5), GRPOConfig(), 0)
    restored.load_state_dict(json.loads(json.dumps(credit.state_dict())))
    assert restored.values.state_dict() == credit.values.state_dict()
    with pytest.raises(ValueError, match="register_credit"):
        make_credit("mine", GRPOConfig(), 0)


class Halves(Credit):
    name = "halves"

    def __init__(self):
        self.calls = 0

    def advantages(self, turns):
        self.calls += 1
        return [t.reward / 2 for t in turns]

    def metrics(self):
        return {"credit/calls": self.calls}

    def state_dict(self):
        return {"halves": {"calls": self.calls}}

    def load_state_dict(self, state):
        self.calls = state.get("halves", {}).get("calls", 0)


def test_a_registered_credit_method_drives_the_trainer(tiny_model_path, tmp_path):
    config = SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 2}, credit="halves", output_dir=str(tmp_path),
                            **FAST)
    register_credit("halves", Halves)  # after its config: the name is looked up when training starts
    try:
        t = SelfPlayTrainer(config)
        t.train(str(tiny_model_path), digits)
        t.engine.close()
    finally:
        CREDIT_METHODS.pop("halves")
    assert t.credit.calls == 2 and [row["credit/calls"] for row in t.metrics_log] == [1, 2]
    state = json.loads((tmp_path / "checkpoint-0" / "state.json").read_text())
    assert state["halves"] == {"calls": 2} and "python" not in json.loads((tmp_path / "checkpoint-0" /
                                                                          "rng.json").read_text())


def test_rewards_the_arena_set_are_kept():
    from autocurricula.loop.rounds import rewarded_turns, rollout_metrics

    sub = Turn("a", "g0/sub", "r", [1], [2], [0.0], reward=0.25, seat=0)  # a sub-game's reward
    own = Turn("a", "g0", "r", [1], [2], [0.0], seat=1)
    judge = Turn("a", "g0", "r", [1], [2], [0.0], seat=-1)  # no seat, no reward: not trained
    record = GameRecord("g0", [{"id": "a"}, {"id": "b"}])
    record.rewards, record.turns = [1.0, -1.0], [sub, own, judge]
    turns = rewarded_turns([record])
    assert turns == [sub, own] and (sub.reward, own.reward, judge.reward) == (0.25, -1.0, None)
    players = [{"id": "a", "frozen": False}, {"id": "b", "frozen": False}]
    assert rollout_metrics([record], turns, players, lambda p: True)["rollout/turns"] == 2


def test_trl_fields_without_effect_are_accepted_and_ignored():
    names = {"num_generations", "gradient_accumulation_steps", "seed"}
    assert not names & set(GRPOConfig.__dataclass_fields__)
    cfg = coerce_grpo_config({"learning_rate": 1e-3, "num_generations": 4, "gradient_accumulation_steps": 8,
                              "seed": 1})
    assert cfg == GRPOConfig(learning_rate=1e-3)
    with pytest.raises(ValueError, match="unknown GRPO settings"):
        coerce_grpo_config({"num_generation": 4})
    trl_like = type("TrlGRPOConfig", (), {"learning_rate": 3e-4, "num_generations": 8, "seed": 42,
                                          "gradient_accumulation_steps": 2, "loss_type": "dapo"})()
    assert coerce_grpo_config(trl_like) == GRPOConfig(learning_rate=3e-4)


def test_a_checkpoint_with_a_python_rng_entry_still_resumes(tiny_model_path, tmp_path):
    cfg = dict(epochs=2, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path), **FAST)
    t = SelfPlayTrainer(SelfPlayConfig(**cfg, save_total_limit=None))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    rng = tmp_path / "checkpoint-0" / "rng.json"
    data = json.loads(rng.read_text())
    data["python"] = [3, list(range(625)), None]  # as such checkpoints carry it
    rng.write_text(json.dumps(data))
    from autocurricula.loop.checkpoint import MANIFEST

    manifest = json.loads((tmp_path / "checkpoint-0" / MANIFEST).read_text())  # the edited file's new size and hash
    manifest["files"]["rng.json"] = {"size": rng.stat().st_size, "sha256": hashlib.sha256(rng.read_bytes()).hexdigest()}
    (tmp_path / "checkpoint-0" / MANIFEST).write_text(json.dumps(manifest))
    again = SelfPlayTrainer(SelfPlayConfig(**cfg))
    again.train(str(tiny_model_path), digits, resume_from_checkpoint=str(tmp_path / "checkpoint-0"))
    again.engine.close()
    assert again.current_epoch == 1 and again.step == 2
