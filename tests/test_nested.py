"""Nested games, judges and the sync style: sub-game rewards on sub-game turns, sibling groups,
trainable=False, blocking calls in sync games, and hand-computed GRPO / RAE advantages on a
two-level tree (a proposer game spawning four solver attempts)."""

import asyncio
import math

import pytest

from autocurricula.arena.arena import Arena, GameRecord, GameResult
from autocurricula.credit import GRPOCredit, RAECredit

PROPOSER = {"id": "proposer", "adapter": None}  # the base tiny model, trainable (no "frozen")
SOLVER = {"id": "solver", "adapter": None}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from autocurricula.engine import Engine, EngineConfig

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    yield eng
    eng.close()


def run_games(engine, games, lockstep=True):
    return asyncio.run(Arena(engine, seed=0, max_tokens=3, lockstep=lockstep).run(games))


def fill_outer_rewards(records):
    """What the trainer does: turns without a reward get their seat's reward in the top-level game."""
    turns = []
    for r in records:
        for t in r.turns:
            if t.reward is None:
                t.reward = r.rewards[t.seat]
            turns.append(t)
    return turns


def proposer_game(outcomes):
    """The proposer writes once; four solver attempts (sequential: a fixed turn order) score
    ``outcomes``; the proposer's reward is the goldilocks score of their pass rate."""

    async def solve(players, model, tokenizer, *, outcome):
        await model.generate(players[0], "solve: 2+2=", role="solver")
        return [float(outcome)]

    async def play(players, model, tokenizer):
        await model.generate(players[0], "propose a problem:")
        results = []
        for outcome in outcomes:
            results.append(await model.play(solve, [players[1]], outcome=outcome))
        pass_rate = sum(r[0] > 0 for r in results) / len(results)
        return GameResult([1 - 2 * abs(pass_rate - 0.5), 0.0], {"pass_rate": pass_rate})

    return play


def two_level_tree(engine):
    games = []
    for gid, outcomes in (("A", [1, 0, 0, 0]), ("B", [1, 1, 0, 0])):
        players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
        games.append((proposer_game(outcomes), players, GameRecord(gid, players), "ps"))
    records = run_games(engine, games)
    assert [r.error for r in records] == [None, None]
    return records


def test_sub_game_rewards_and_sibling_groups(engine):
    a, b = two_level_tree(engine)
    assert a.rewards == [0.5, 0.0] and b.rewards == [1.0, 0.0]
    assert a.extras == {"pass_rate": 0.25} and b.extras == {"pass_rate": 0.5}
    top = [t for t in a.turns if t.level == 0]
    subs = [t for t in a.turns if t.level == 1]
    assert len(top) == 1 and top[0].reward is None  # the outer game's reward: the trainer fills it
    assert [t.reward for t in subs] == [1.0, 0.0, 0.0, 0.0]  # each attempt's own reward
    assert {t.parent for t in subs} == {"A"} and len({t.group for t in subs}) == 1  # one sibling group
    assert [t.game_id for t in subs] == ["A/1", "A/2", "A/3", "A/4"]  # each attempt is its own game
    assert {t.game for t in subs} == {"ps/solve"} and {t.role for t in subs} == {"solver"}
    assert {t.seat for t in subs} == {0}  # the seat in the sub-game


def test_two_level_tree_grpo_advantages_by_hand(engine):
    turns = fill_outer_rewards(two_level_tree(engine))
    GRPOCredit(scale_rewards="group").assign(turns)
    adv = [round(t.advantage, 4) for t in turns]
    # proposers compared with proposers: rewards 0.5 and 1.0, mean 0.75, std sqrt(0.125) = 0.353553
    # -> +-0.25 / 0.353653. Solvers with their siblings: A = [1, 0, 0, 0], mean 0.25, std 0.5
    # -> 0.75 / 0.5001 and -0.25 / 0.5001; B = [1, 1, 0, 0], mean 0.5, std 0.57735 -> +-0.5 / 0.57745
    assert adv == [-0.7069, 1.4997, -0.4999, -0.4999, -0.4999,
                   0.7069, 0.8659, 0.8659, -0.8659, -0.8659]


def test_two_level_tree_rae_advantages_by_hand(engine):
    turns = fill_outer_rewards(two_level_tree(engine))
    credit = RAECredit(alpha=0.95)
    credit.assign(turns)
    rae = credit.rae
    adv = [round(t.advantage, 6) for t in turns]
    # one baseline per (game, role): "ps|seat0" for proposers, "ps/solve|solver" for solvers; every
    # attempt is an episode: A = R - b with b read first, then b <- 0.95 b + 0.05 R
    assert adv == [0.5, 1.0, -0.05, -0.0475, -0.045125,
                   0.975, 0.957131, 0.909275, -0.136189, -0.12938]
    assert rae.baselines["ps|seat0"] == pytest.approx(0.07375)
    assert rae.baselines["ps/solve|solver"] == pytest.approx(0.95 * 0.12937959453125)


def test_call_sites_and_group_keys(engine):
    async def one(players, model, tokenizer):
        await model.generate(players[0], "x")
        return [0.0]

    async def play(players, model, tokenizer):
        await asyncio.gather(*(model.play(one, players[:1]) for _ in range(3)))  # one call site: siblings
        await model.play(one, players[:1])  # another call site: another group
        for _ in range(2):
            await model.play(one, players[:1], group="q7")  # same group key
        return [0.0, 0.0]

    players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
    (rec,) = run_games(engine, [(play, players, GameRecord("g", players), "g")])
    groups = [t.group for t in rec.turns]
    assert len(set(groups[:3])) == 1 and len(set(groups)) == 3 and groups[4] == groups[5]
    assert groups[4].startswith("q7|")


def test_untrainable_sub_games_and_failed_sub_games_leave_no_turns(engine):
    async def leaf(players, model, tokenizer):
        await model.generate(players[0], "leaf")
        return [1.0]

    async def inner(players, model, tokenizer):
        await model.generate(players[0], "inner")
        await model.play(leaf, players)  # inherits trainable=False
        return [1.0]

    async def broken(players, model, tokenizer):
        await model.generate(players[0], "broken")
        await model.play(leaf, players)
        raise RuntimeError("boom")

    async def play(players, model, tokenizer):
        res = await model.play(inner, players[:1], trainable=False)
        assert res == [1.0] and res.turns == 0
        with pytest.raises(RuntimeError, match="boom"):
            await model.play(broken, players[:1])
        await model.generate(players[0], "top")
        return [0.0, 0.0]

    players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
    (rec,) = run_games(engine, [(play, players, GameRecord("g", players), "g")])
    assert rec.error is None, rec.traceback
    assert [t.level for t in rec.turns] == [0]


def test_judges_are_never_turns(engine):
    frozen = {"id": "snap", "adapter": None, "frozen": True}
    scripted = {"id": "bot", "policy": lambda prompt: "B"}
    seen = []

    async def play(players, model, tokenizer):
        base = await model.judge("who won? A or B:", max_tokens=2)
        same = await model.generate(None, "who won? A or B:", max_tokens=2)
        named = await model.judge("who won?", player=frozen)
        trainable_as_judge = await model.judge("who won?", player=players[0])  # its adapter, not trained
        bot = await model.judge("who won?", player=scripted)
        seen.extend([base.player_id, same.player_id, named.player_id, trainable_as_judge.player_id, bot.text])
        assert base.adapter_version is None or isinstance(base.adapter_version, int)
        return [0.0, 0.0]

    players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
    (rec,) = run_games(engine, [(play, players, GameRecord("g", players), "g")])
    assert rec.error is None, rec.traceback
    assert rec.turns == [] and seen == ["base", "base", "snap", "proposer", "B"]


@pytest.mark.parametrize("lockstep", [True, False])
def test_sync_games_block_on_play_and_judge_and_honour_trainable(engine, lockstep):
    async def async_sub(players, model, tokenizer):
        await model.generate(players[0], "async sub")
        return GameResult([1.0], {"k": 1})

    def sync_sub(players, model, tokenizer):
        model.generate(players[0], "sync sub")  # a sync game's generate(player, ...) blocks too
        return [-1.0]

    out = {}

    def play(players, model, tokenizer):  # seed style
        from autocurricula import set_player

        set_player(model, players[0])
        ids = tokenizer("judge this", return_tensors="np")
        model.generate(**ids, max_new_tokens=2, trainable=False)  # a judge call: not a turn
        model.generate(**ids, max_new_tokens=2)  # a turn
        out["a"] = model.play(async_sub, players[:1])
        out["s"] = model.play(sync_sub, players[1:])
        out["j"] = model.judge("who won?", max_tokens=2)
        return [[1.0, -1.0]], [[], []]

    players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
    (rec,) = run_games(engine, [(play, players, GameRecord("g", players), "g")], lockstep=lockstep)
    assert rec.error is None, rec.traceback
    assert out["a"] == GameResult([1.0], {"k": 1}) and out["s"] == [-1.0]
    assert out["j"].player_id == "base"
    assert [(t.level, t.reward) for t in rec.turns] == [(0, None), (1, 1.0), (1, -1.0)]


@pytest.mark.parametrize("style", ["sync", "async"])
def test_sibling_groups_follow_the_call_site_in_both_styles(engine, style):
    async def attempt(players, model, tokenizer):
        await model.generate(players[0], "attempt:")
        return [1.0]

    def sync_play(players, model, tokenizer):
        for _ in range(2):
            model.play(attempt, players[:1])
        model.play(attempt, players[:1])
        return [0.0, 0.0]

    async def async_play(players, model, tokenizer):
        for _ in range(2):
            await model.play(attempt, players[:1])
        await model.play(attempt, players[:1])
        return [0.0, 0.0]

    play = sync_play if style == "sync" else async_play
    players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
    (rec,) = run_games(engine, [(play, players, GameRecord("g", players), "g")])
    assert rec.error is None, rec.traceback
    groups = [t.group.split("|")[0] for t in rec.turns]
    assert len(groups) == 3 and groups[0] == groups[1] != groups[2]
    assert all(g.startswith(f"attempt@{play.__name__}:") for g in groups)
    assert [t.game_id for t in rec.turns] == ["g/1", "g/2", "g/3"]


def test_async_game_runs_a_sync_sub_game_in_a_thread(engine):
    def sync_sub(players, model, tokenizer):
        g = model.generate(players[0], "sync sub")
        return [1.0 if g.text is not None else 0.0]

    async def play(players, model, tokenizer):
        res = await model.play(sync_sub, players[:1])
        return [res[0], 0.0]

    players = [dict(PROPOSER, seat=0), dict(SOLVER, seat=1)]
    (rec,) = run_games(engine, [(play, players, GameRecord("g", players), "g")])
    assert rec.error is None, rec.traceback
    assert rec.rewards == [1.0, 0.0] and [t.reward for t in rec.turns] == [1.0]


def test_game_result_reads_as_rewards():
    r = GameResult([1, 0], {"pass_rate": 0.5})
    assert r[0] == 1.0 and list(r) == [1.0, 0.0] and r == [1.0, 0.0] and len(r) == 2
    assert math.isfinite(sum(r))



def test_sub_game_rewards_reach_the_update(tiny_model_path, tmp_path):
    """Through the trainer: sub-game turns keep the sub-game's reward (the outer game's is 5.0)."""
    from test_trainer import Capture

    from autocurricula import SelfPlayConfig

    async def attempt(players, model, tokenizer):
        await model.generate(players[0], "attempt:", max_tokens=3)
        return [1.0]

    async def outer(players, model, tokenizer):
        await asyncio.gather(*(model.play(attempt, players[:1]) for _ in range(3)))
        await model.generate(players[0], "outer:", max_tokens=3)
        return [5.0, 5.0]

    t = Capture(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2, "past_share": 0.0},
                               output_dir=str(tmp_path), credit="grpo", progress=False, ratings={"bt_bootstrap": 0},
                               max_tokens=3))
    t.train(str(tiny_model_path), outer)
    turns = t.seen[0]
    t.engine.close()
    subs = [x for x in turns if x.level == 1]
    assert len(subs) == 2 * 3 and {x.reward for x in subs} == {1.0}
    assert {x.reward for x in turns if x.level == 0} == {5.0}
