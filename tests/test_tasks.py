"""The design documents' tasks (dataset RL, proposer/solver, debate, red/blue, refine): rewards on
scripted players (no model), the artifact store, and one short league run per task on the tiny model."""

import asyncio
import functools
import random

import pytest

from autocurricula.arena.artifacts import ArtifactStore
from autocurricula.games import dataset as ds
from autocurricula.games import proposer_solver as ps
from test_games import FakeModel, replies, run, scripted


# ---------------------------------------------------------------------- dataset RL
def test_dataset_rewards_per_completion_and_both_reward_fn_signatures():
    rows = [{"prompt": "2+3=", "answer": "5"}]
    model = FakeModel()
    got = run(ds.play, scripted(replies("5", "4", "5 apples", "")), model, dataset=rows, num_generations=4)
    assert got == [(1.0 + 0.0 + 1.0 - 1.5) / 4]  # right, wrong, right, empty: the penalty
    assert [c["prompt"] for c in model.calls] == ["2+3="] * 4

    def batched(completions, prompts, answer):  # trl's form: one list per column
        assert prompts == ["2+3="] * len(completions) and answer == ["5"] * len(completions)
        return [len(c) for c in completions]

    assert run(ds.play, scripted(replies("55")), dataset=rows, reward_fn=batched, num_generations=2) == [2.0]
    assert run(ds.play, scripted(replies("x")), dataset=rows, reward_fn=lambda completion, **cols: 0.25) == [0.25]
    with pytest.raises(ValueError, match="prompt_column"):
        run(ds.play, scripted(replies("1")), dataset=[{"question": "1+1="}])


def test_arithmetic_dataset_is_local_and_checkable():
    data = ds.arithmetic_dataset(50, seed=3)
    assert len(data) == 50 and set(data.column_names) == {"prompt", "answer"}
    for row in data:
        a, op, b = row["prompt"][0], row["prompt"][1], row["prompt"][2]
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert ds.arithmetic_dataset(50, seed=3)[:] == data[:]
    assert ds.exact_answer(" -4 then", answer="-4") == 1.0 and ds.exact_answer("none", answer="1") == 0.0


# ---------------------------------------------------------------------- proposer/solver
def test_safe_eval_allows_arithmetic_only():
    assert ps.safe_eval("12+7*3") == 33 and ps.safe_eval("-(2-5)*4") == 12
    for bad in ("__import__('os')", "2**99", "1/2", "1.5+1", "a+1", "9" * 50, "", "(1"):
        with pytest.raises(ValueError):
            ps.safe_eval(bad)
    with pytest.raises(ValueError, match="beyond"):
        ps.safe_eval("999999*999999")


def test_goldilocks_rewards_by_pass_rate():
    def solver_right(n_right):
        calls = [0]

        def policy(prompt):
            calls[0] += 1
            return "7" if calls[0] <= n_right else "8"

        return policy

    for n_right, want in [(0, 0.0), (1, 0.5), (2, 1.0), (3, 0.5), (4, 0.0)]:
        out = run(ps.play, scripted(replies("3+4"), solver_right(n_right)), attempts=4)
        assert list(out) == [want, n_right / 4] and out.extras["pass_rate"] == n_right / 4
        assert out.extras["accepted"] == (0 < n_right < 4)
    assert ps.goldilocks(0.5) == 1.0 and ps.goldilocks(0.0) == ps.goldilocks(1.0) == 0.0


def test_bad_problems_and_silent_solvers_are_penalised():
    assert list(run(ps.play, scripted(replies("2**9"), replies("1")))) == [-1.5, 0.5]
    assert list(run(ps.play, scripted(replies("2+2"), replies("no idea")))) == [0.5, -1.5]
    some = run(ps.play, scripted(replies("2+2"), replies("4", "?")), attempts=2)  # one answer: a pass rate
    assert list(some) == [1.0, 0.5]


def test_custom_checker_plugs_in():
    class Words:
        propose_prompt = "Write a word.\nProblem:"

        def parse(self, reply):
            return reply.strip() or None

        def solve_prompt(self, problem):
            return f"Spell {problem} backwards:"

        def check(self, problem, answer):
            return None if not answer.strip() else answer.strip() == problem[::-1]

    out = run(ps.play, scripted(replies("abc"), replies("cba", "abc")), checker=Words(), attempts=2)
    assert list(out) == [1.0, 0.5]


def test_artifact_store_grows_samples_by_weight_and_round_trips():
    game = ps.ProposerSolver(attempts=2)
    for _ in range(3):
        asyncio.run(game(scripted(replies("3+4"), replies("7", "1")), FakeModel()))
    assert list(game.store.items) == ["3+4"] and game.store.items["3+4"][1] == 3  # accepted three times
    model = FakeModel()
    out = asyncio.run(game(scripted(replies("1+1"), replies("2", "0")), model, seed=1))
    assert out.extras["replayed"] == "3+4" and sum("Solve: 3+4" in c["prompt"] for c in model.calls) == 2
    store = ArtifactStore(capacity=2)
    for item, w in [("a", 1.0), ("b", 3.0), ("c", 2.0)]:
        store.add(item, w)
    assert sorted(store.items) == ["b", "c"]  # the lowest weight left
    draws = store.sample(random.Random(0), k=2000)
    assert 0.55 < draws.count("b") / 2000 < 0.65  # 3 : 2
    again = ArtifactStore()
    again.load_state_dict(store.state_dict())
    assert again.state_dict() == store.state_dict() and again.sample(random.Random(5), 5) == store.sample(
        random.Random(5), 5)
    with pytest.raises(ValueError, match="empty"):
        ArtifactStore().sample(random.Random(0))
    with pytest.raises(ValueError, match="finite"):
        store.add("x", float("nan"))


# ---------------------------------------------------------------------- short league runs on the tiny model
def league(tmp_path, tiny_model_path, play, trainer_cls=None, **cfg):
    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    config = SelfPlayConfig(**{**dict(epochs=1, rounds=2, rules={"games_per_round": 2, "past_share": 0.0},
                                      output_dir=str(tmp_path), progress=False, ratings={"bt_bootstrap": 0},
                                      max_tokens=6), **cfg})
    t = (trainer_cls or SelfPlayTrainer)(config)
    t.train(str(tiny_model_path), play)
    t.engine.close()
    return t


def test_dataset_league_run(tiny_model_path, tmp_path):
    from autocurricula import AutocurriculumTrainer

    class Solo(AutocurriculumTrainer):  # one learner, alone: a 1-player game
        def match(self):
            return [(self.players[0],)] * self.config.rules.games_per_round

    def longer(completion, **columns):  # a random tiny model is never right: score something it varies
        return float(len(completion))

    t = league(tmp_path, tiny_model_path, functools.partial(ds.play, reward_fn=longer), Solo)
    rows = [r for r in t.metrics_log if "rollout/turns" in r]
    assert rows and all(r["rollout/errors"] == 0 for r in rows) and rows[-1]["rollout/turns"] == 2 * 4
    assert t.players[0]["version"] > 1


def test_proposer_solver_league_run_checkpoints_the_store(tiny_model_path, tmp_path):
    """The store lives in the league state: a checkpoint carries it and a resume restores it."""
    import json

    game = ps.ProposerSolver(attempts=2)
    game.store.add("1+1", 1.0)  # so the replay path runs too
    t = league(tmp_path, tiny_model_path, game)
    rows = [r for r in t.metrics_log if "rollout/errors" in r]
    assert rows and all(r["rollout/errors"] == 0 for r in rows)
    saved = json.loads((tmp_path / "checkpoint-0" / "state.json").read_text())
    assert saved["game"] == game.state_dict() and "1+1" in game.store
    fresh = ps.ProposerSolver(attempts=2)
    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    again = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 2, "past_share": 0.0},
                                           output_dir=str(tmp_path), progress=False, ratings={"bt_bootstrap": 0},
                                           max_tokens=6))
    again.train(str(tiny_model_path), fresh, resume_from_checkpoint=True)
    again.engine.close()
    assert fresh.store.state_dict() == game.store.state_dict()


# ---------------------------------------------------------------------- debate, red/blue, refine
from autocurricula.games import debate, red_blue, refine  # noqa: E402


def judge_of(policy):
    return {"id": "judge", "policy": policy}


def test_debate_swaps_sides_so_a_position_biased_judge_cancels():
    out = run(debate.play, scripted(replies("mine is strong"), replies("mine is weak")), judge=judge_of(lambda p: "A"))
    assert list(out) == [0.0, 0.0] and out.extras["winners"] == ["A", "A"]

    def content_judge(prompt):  # the debater with the strong argument wins, whatever its position
        a_line = next(line for line in prompt.splitlines() if line.startswith("Debater A ("))
        return "A" if "strong" in a_line else "B"

    model = FakeModel()
    out = run(debate.play, scripted(replies("mine is strong"), replies("mine is weak")), model,
              judge=judge_of(content_judge), claims=["Tea beats coffee."])
    assert list(out) == [1.0, -1.0] and out.extras["winners"] == ["A", "B"]
    sides = [next(line for line in c["prompt"].splitlines() if line.startswith("You are debater"))
             for c in model.calls if c["player"] != "judge"]
    assert sides == ["You are debater A, arguing for the claim.", "You are debater B, arguing against the claim."] * 2
    assert all("Tea beats coffee." in c["prompt"] for c in model.calls)
    assert list(run(debate.play, scripted(replies("x"), replies("y")), judge=judge_of(lambda p: "?"))) == [0.0, 0.0]
    assert list(run(debate.play, scripted(replies("x"), replies("")))) == [0.5, -1.5]


def test_debate_judge_transcript_holds_both_sides_and_chat_prompts():
    seen = []

    def judge(prompt):
        seen.append(prompt)
        return "B"

    model = FakeModel()
    run(debate.play, scripted(replies("pro"), replies("con")), model, judge=judge_of(judge), exchanges=2, chat=True)
    transcript = seen[0][1]["content"]  # chat: the system message, then the user's
    assert transcript.count("Debater A (for): pro") == 2 and transcript.count("Debater B (against): con") == 2
    debater_prompts = [c["prompt"] for c in model.calls if c["player"] != "judge"]
    assert all(isinstance(p, list) and p[0]["role"] == "system" for p in debater_prompts)


def test_red_blue_rewards():
    right = run(red_blue.play, scripted(replies("Beware."), replies("12")), questions=[("5+7=", 12)])
    wrong = run(red_blue.play, scripted(replies("The answer is 13."), replies("13")), questions=[("5+7=", 12)])
    assert right == [-1.0, 1.0] and wrong == [1.0, -1.0]
    model = FakeModel()
    run(red_blue.play, scripted(replies("Trust me, it is 3."), replies("1")), model, seed=4)
    assert model.calls[1]["prompt"].split("\n\n", 1)[1].startswith("Trust me, it is 3.\nQuestion: ")
    assert run(red_blue.play, scripted(replies(" "), replies("1"))) == [-1.5, 0.5]
    assert run(red_blue.play, scripted(replies("hm"), replies(""))) == [0.5, -1.5]
    long = run(red_blue.play, scripted(replies("x" * 500), replies("1")), FakeModel(), max_prefix_chars=10)
    assert long in ([1.0, -1.0], [-1.0, 1.0])


def test_refine_rewards_rounds_and_a_fixed_critic():
    model = FakeModel()
    out = run(refine.play, scripted(replies("draft", "better", "best"), replies("shorter")), model, rounds=2,
              judge=judge_of(lambda p: "8"))
    assert list(out) == [0.8, 0.8] and out.extras["history"] == ["draft", "better", "best"]
    assert [c["player"] for c in model.calls] == ["p0", "p1", "p0", "p1", "p0", "judge"]
    model = FakeModel()
    run(refine.play, scripted(replies("draft"), replies("shorter")), model, critic_trainable=False,
        judge=judge_of(lambda p: "11"))
    assert [c.get("trainable", True) for c in model.calls] == [True, False, True, True]
    assert list(run(refine.play, scripted(replies("d"), replies("c")), judge=judge_of(lambda p: "no"))) == [0.0, 0.0]
    assert list(run(refine.play, scripted(replies("d"), replies("")), judge=judge_of(lambda p: "5"))) == [0.5, -1.5]


@pytest.mark.parametrize("mod", [debate, red_blue, refine], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_language_task_league_run(mod, tiny_model_path, tmp_path):
    """A short self-play league with the base model as judge: runs end to end, turns are trained."""
    t = league(tmp_path, tiny_model_path, functools.partial(mod.play, max_tokens=6))
    rows = [r for r in t.metrics_log if "rollout/errors" in r]
    assert len(rows) == 2 and all(r["rollout/errors"] == 0 and r["rollout/turns"] > 0 for r in rows)


# ---------------------------------------------------------------------- the examples, at toy size
@pytest.mark.parametrize("script,args,keys", [
    ("dataset_rl.py", ["--rounds", "2", "--prompts", "4", "--generations", "4", "--warmup-steps", "5"],
     {"before", "after", "held_out", "minutes"}),
    ("proposer_solver.py", ["--epochs", "2", "--rounds", "1", "--games-per-round", "4", "--warmup-steps", "5"],
     {"pass_rate_first_last", "distance_to_half_first_last", "store_size", "minutes"}),
    ("language_tasks.py", ["--epochs", "1", "--rounds", "1", "--games-per-round", "2", "--max-tokens", "4"],
     {"debate", "red_blue", "refine", "minutes"})])
def test_task_examples_run_and_print_their_figures(script, args, keys, tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / script
    out = subprocess.run([sys.executable, str(path), *args, "--hidden", "32", "--layers", "1", "--heads", "8",
                          "--output-dir", str(tmp_path / "run")] if script != "language_tasks.py" else
                         [sys.executable, str(path), *args, "--output-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert keys <= set(summary)
    if script == "language_tasks.py":
        assert all(summary[name]["errors"] == 0 and summary[name]["turns"] > 0 for name in ("debate", "red_blue", "refine"))
