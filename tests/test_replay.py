"""Replay with forced answers and branch credit: a replay reproduces the recorded game, branches
estimate state values with known odds, unreplayable games are caught, and credit="branch" runs in
a short league with one batched Arena.run of branches per round."""

import asyncio
import json
import os
import pickle
import random
import types
from concurrent.futures import Future

import numpy as np
import pytest

from autocurricula import SelfPlayConfig, SelfPlayTrainer
from autocurricula.arena.arena import Arena, GameRecord, GameResult
from autocurricula.loop.checkpoint import latest_checkpoint
from autocurricula.credit import RAE, BranchCredit, branch_advantage, branch_value, pick_positions
from autocurricula.arena.replay import ReplayDiverged, Replayer, turn_positions

from helpers import example_module
from toy_games import digits, first_digit_policy, nested, seed_style


class DigitEngine:
    """No model: every engine call answers a uniform digit drawn from its sampling seed."""

    tokenizer = None

    def __init__(self):
        self.submits = 0

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))

    def submit_many(self, requests):
        return [self.submit(*r) for r in requests]  # answers are ready at once: no batch to keep together

    def submit(self, ids, adapter, params):
        self.submits += 1
        text = str(int(np.random.default_rng(params.seed).integers(10)))
        fut = Future()
        fut.set_result(types.SimpleNamespace(text=text, token_ids=[ord(text)], logprobs=[-2.3], prompt_ids=list(ids),
                                             finish_reason="stop", adapter_version=1))
        return fut


async def dice(players, model, tokenizer=None):
    """Seat 0 says a digit d, seat 1 a digit e after seeing d; the higher digit wins. With uniform
    digits, seat 0's value after d is P(d > e) - P(d < e) = (2d - 9) / 10, and 0 before it."""
    d = int((await model.generate(players[0], "roll", max_tokens=1)).text)
    e = int((await model.generate(players[1], f"beat {d}", max_tokens=1)).text)
    return [1.0, -1.0] if d > e else [-1.0, 1.0] if e > d else [0.0, 0.0]


def scripted(pid):
    return {"id": pid, "policy": first_digit_policy}


def logged(arena, play, players_list, prefix="g"):
    games = [(play, players, GameRecord(f"{prefix}{i}", players, calls=[]), "game")
             for i, players in enumerate(players_list)]
    return asyncio.run(arena.run(games))


# ---------------------------------------------------------------------- pure maths
def test_branch_maths_by_hand():
    assert branch_value([1.0, -1.0, 1.0, 1.0]) == 0.5
    assert branch_value([]) is None and branch_value([None, 2.0]) == 2.0
    assert branch_advantage(1.0, 0.25) == 0.75  # G - V(s_t)
    assert pick_positions([5, 1, 3], 0, seed=1) == [1, 3, 5]  # 0 = all
    some = pick_positions(list(range(10)), 3, seed=7)
    assert len(some) == 3 and some == sorted(some) and some == pick_positions(list(range(10)), 3, seed=7)


def test_branch_settings_are_checked():
    assert BranchCredit(samples=3, turns_per_game=2, advantage="moves").samples == 3
    for bad in (dict(samples=0), dict(samples=1.5), dict(turns_per_game=-1), dict(advantage="gae"),
                dict(advantage="td")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            BranchCredit(**bad)


# ---------------------------------------------------------------------- replay reproduces the game
def test_replay_reproduces_every_kind_of_game(tiny_model_path):
    from autocurricula.engine import Engine, EngineConfig
    from autocurricula.games import kuhn_poker, tictactoe

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    try:
        arena = Arena(eng, seed=3, max_tokens=3)
        a, b = {"id": "a", "adapter": None}, {"id": "b", "adapter": None}
        cases = [(tictactoe.play, [[a, b], [b, scripted("r")]]),  # trainable and scripted seats
                 (kuhn_poker.play, [[a, b]]),  # the deal comes from model.seed
                 (nested, [[a, b]]),  # sub-games, with a judge call (trainable=False) in each
                 (seed_style, [[a, b]])]  # sync play: set_player + model.generate(**inputs)
        for play, seats in cases:
            records = logged(arena, play, seats)
            replayer = Replayer(arena, play)
            for rec in records:
                assert rec.error is None and rec.calls, rec.error
                again = replayer.replay(rec)  # every answer forced
                assert again.error is None and again.rewards == rec.rewards, (play, again.error)
                assert again.replay.used == len(rec.calls) and again.turns == []  # forced calls make no turns
                replayer.check(rec)
            # the log maps every recorded turn to its call
            pos = turn_positions(records[0])
            assert len(pos) == len(records[0].turns) and all(records[0].calls[p][4] is t
                                                             for t in records[0].turns for p in [pos[id(t)]])
    finally:
        eng.close()


def test_replay_makes_no_engine_call_and_branches_resample_from_the_state():
    eng = DigitEngine()
    arena = Arena(eng, seed=0)
    p0, p1 = {"id": "p0"}, {"id": "p1"}
    rec, = logged(arena, dice, [[p0, p1]])
    assert eng.submits == 2 and [t.player for t in rec.turns] == ["p0", "p1"]
    replayer = Replayer(arena, dice)
    again = replayer.replay(rec)
    assert eng.submits == 2 and again.rewards == rec.rewards
    d = rec.calls[0][3].text
    (b1,), = replayer.branch([(rec, 1)], 1)
    assert [t.prompt_ids for t in b1.turns] == [rec.calls[1][2]]  # seat 0's move is forced: "beat d" again
    assert b1.turns[0].game_id == rec.game_id  # the branch keeps the game's node, hence model.seed
    branches, = replayer.branch([(rec, 0)], 20)
    firsts = {eng.decode(b.turns[0].completion_ids) for b in branches}
    assert len(firsts) > 3 and all(b.turns[0].prompt_ids == rec.calls[0][2] for b in branches)
    assert d in "0123456789"


class TemperatureEngine(DigitEngine):
    """DigitEngine that records each call's sampling temperature; at temperature 0 its digit is a
    function of the prompt alone, as a model's greedy answer is."""

    def __init__(self):
        super().__init__()
        self.temperatures = []

    def submit(self, ids, adapter, params):
        self.temperatures.append(params.temperature)
        if params.temperature == 0:
            params = types.SimpleNamespace(seed=sum(ids) * 7919 % 1000)
        return super().submit(ids, adapter, params)


async def dice_with_judge(players, model, tokenizer=None):
    """``dice`` with a judge call (trainable=False, its own temperature) between the two moves."""
    d = int((await model.generate(players[0], "roll", max_tokens=1)).text)
    await model.generate(players[0], "judge", max_tokens=1, temperature=0.7, trainable=False)
    e = int((await model.generate(players[1], f"beat {d}", max_tokens=1, temperature=1.3)).text)
    return [1.0, -1.0] if d > e else [-1.0, 1.0] if e > d else [0.0, 0.0]


def test_branch_temperature_sets_the_players_sampling_and_spares_judges():
    eng = TemperatureEngine()
    arena = Arena(eng, seed=0)
    rec, = logged(arena, dice_with_judge, [[{"id": "p0"}, {"id": "p1"}]])
    assert eng.temperatures == [1.0, 0.7, 1.3]  # the arena's default, then what the game asked
    replayer = Replayer(arena, dice_with_judge)
    eng.temperatures.clear()
    replayer.branch([(rec, 0)], 1)  # no temperature: as the game asks
    assert eng.temperatures == [1.0, 0.7, 1.3]
    eng.temperatures.clear()
    replayer.branch([(rec, 0)], 2, temperature=0.0)
    # the players' calls greedy, the judge's untouched; the two branches ask the same greedy calls,
    # and the engine answers each once (the replayer's greedy memo)
    assert sorted(eng.temperatures) == [0.0, 0.0, 0.7, 0.7]
    eng.temperatures.clear()
    replayer.branch_moves([(rec, 0, [rec.calls[0][3]])], 1, temperature=0.25)
    assert eng.temperatures == [0.7, 0.25]  # the move is forced; the rest follows the branch temperature


def test_greedy_memo_answers_repeated_greedy_calls_without_the_engine():
    eng = TemperatureEngine()
    arena = Arena(eng, seed=0)
    players = [[{"id": "p0"}, {"id": "p1"}] for _ in range(4)]

    async def greedy_dice(players, model, tokenizer=None):
        d = int((await model.generate(players[0], "roll", max_tokens=1, temperature=0.0)).text)
        e = int((await model.generate(players[1], f"beat {d}", max_tokens=1, temperature=0.0)).text)
        return [float(d > e) - float(e > d), float(e > d) - float(d > e)]

    plain = logged(arena, greedy_dice, players)
    assert eng.submits == 8  # no memo: every call goes to the engine
    memo = {}
    games = [(greedy_dice, p, GameRecord(f"g{i}", p, calls=[]), "game") for i, p in enumerate(players)]
    first = asyncio.run(arena.run(games, greedy_memo=memo))
    assert eng.submits == 8 + 2 and len(memo) == 2  # one tick's identical requests go to the engine once
    again = asyncio.run(arena.run([(greedy_dice, p, GameRecord(f"h{i}", p, calls=[]), "game")
                                   for i, p in enumerate(players)], greedy_memo=memo))
    assert eng.submits == 10  # a later run with the same memo asks nothing
    assert [r.rewards for r in plain] == [r.rewards for r in first] == [r.rewards for r in again]
    assert [[c.generation.text for c in r.calls] for r in first] == [[c.generation.text for c in r.calls] for r in plain]
    sampled = asyncio.run(arena.run([(dice, p, GameRecord(f"s{i}", p), "game") for i, p in enumerate(players)],
                                    greedy_memo={}))
    assert eng.submits == 18 and all(r.error is None for r in sampled)  # sampled calls are never memoised


def test_greedy_branches_from_one_state_are_one_game(tiny_model_path):
    """With temperature 0 every branch from a state plays the same continuation, the model's greedy
    one, whatever its seed; sampled branches differ."""
    from autocurricula.engine import Engine, EngineConfig
    from autocurricula.games import tictactoe

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    try:
        arena = Arena(eng, seed=5, max_tokens=3)
        a = {"id": "a", "adapter": None}
        rec, = logged(arena, tictactoe.play, [[a, a]])
        replayer = Replayer(arena, tictactoe.play)
        greedy = replayer.branch([(rec, 0)], 6, temperature=0.0)[0]
        sampled = replayer.branch([(rec, 0)], 6)[0]
        assert all(g.error is None and g.turns for g in greedy + sampled)
        assert len({tuple(tuple(t.completion_ids) for t in g.turns) for g in greedy}) == 1
        want = eng.generate(rec.calls[0][2], None, max_tokens=2, temperature=0.0).token_ids
        assert greedy[0].turns[0].completion_ids == want
        assert len({tuple(g.turns[0].completion_ids) for g in sampled}) > 1
    finally:
        eng.close()


# ---------------------------------------------------------------------- values with known odds
@pytest.mark.parametrize("mode", ["return", "td"])
def test_branch_values_match_known_odds(mode):
    arena = Arena(DigitEngine(), seed=1)
    records = logged(arena, dice, [[{"id": "p0"}, {"id": "p1"}] for _ in range(3)])
    for r in records:
        for t in r.turns:
            t.reward = r.rewards[t.seat]
    td = example_module("credit_variants").TDBranchCredit  # examples/credit_variants.py
    credit = BranchCredit(samples=400) if mode == "return" else td(samples=400)
    credit.see_round(records, Replayer(arena, dice))
    turns = [t for r in records for t in r.turns]
    adv = credit.advantages(turns)
    tol = 0.2  # 4 standard errors of a mean of 400 returns in [-1, 1]
    for r in records:
        d = int(r.calls[0][3].text)
        v_after = (2 * d - 9) / 10  # seat 0's value once d is said
        a0, a1 = adv[turns.index(r.turns[0])], adv[turns.index(r.turns[1])]
        g0, g1 = r.rewards
        # seat 0 moves from the start (V = 0); seat 1 moves after d (its V is -v_after)
        assert abs(a0 - ((g0 - 0.0) if mode == "return" else v_after)) < tol, (mode, d, a0)
        assert abs(a1 - (g1 + v_after)) < tol, (mode, d, a1)  # td: the next state is the end, V = G
    # both modes branch from 0 and 1 (after the last call, td's V is the game's return)
    assert credit.metrics()["credit/branched_turns"] == 6 and credit.metrics()["credit/branch_games"] == 3 * 2 * 400


def test_budget_and_fallback():
    arena = Arena(DigitEngine(), seed=2)
    records = logged(arena, dice, [[{"id": "p0"}, {"id": "p1"}] for _ in range(4)])
    for r in records:
        for t in r.turns:
            t.reward = r.rewards[t.seat]
    credit = BranchCredit(samples=2, turns_per_game=1)
    credit.see_round(records, Replayer(arena, dice))
    assert credit.metrics()["credit/branched_turns"] == 4  # one turn per game
    assert credit.metrics()["credit/branch_games"] == 4 * 2
    turns = [t for r in records for t in r.turns]
    adv = credit.advantages(turns)
    fallback = RAE()
    rae = fallback.advantages(turns)  # a fresh RAE's advantages: what the turns not branched get
    games_of_differing = {t.game_id for t, a, b in zip(turns, adv, rae) if a != b}
    assert 0 < len(games_of_differing) == sum(a != b for a, b in zip(adv, rae))  # at most one turn per game
    # branch values serve their round once: asked again, every turn gets the fallback's advantage
    assert credit.advantages(turns) == fallback.advantages(turns)


# ---------------------------------------------------------------------- games that do not qualify
async def module_random_prompt(players, model, tokenizer=None):
    """Not replayable: the prompt draws from module random, not model.seed."""
    a = await model.generate(players[0], f"pick {random.random()}")
    b = await model.generate(players[1], "pick")
    return [1.0, -1.0] if a.text > b.text else [-1.0, 1.0]


async def urandom_reward(players, model, tokenizer=None):
    """Not replayable: same prompts, but the reward comes from os.urandom."""
    await model.generate(players[0], "pick")
    x = float(int.from_bytes(os.urandom(6), "little"))
    return [x, -x]


CALLS = {"n": 0}


async def counter_game(players, model, tokenizer=None):
    """Not replayable: how many calls it makes depends on a global counter."""
    CALLS["n"] += 1
    for _ in range(3 if CALLS["n"] == 1 else 1):
        await model.generate(players[0], "pick")
    return [0.0, 0.0]


class Stateful:
    def __call__(self, players, model, tokenizer=None):
        return dice(players, model, tokenizer)

    def state_dict(self):
        return {}


@pytest.mark.parametrize("play, match", [(module_random_prompt, "different prompt"),
                                         (urandom_reward, "gave rewards"),
                                         (counter_game, "used 1 of its 3")])
def test_unreplayable_games_are_detected(play, match):
    arena = Arena(DigitEngine(), seed=0)
    rec, = logged(arena, play, [[scripted("s0"), scripted("s1")]])
    with pytest.raises(ReplayDiverged, match=match):
        Replayer(arena, play).check(rec)


def test_branch_credit_refuses_unreplayable_games():
    arena = Arena(DigitEngine(), seed=0)
    with pytest.raises(ValueError, match="carries state"):
        Replayer(arena, Stateful())
    records = logged(arena, module_random_prompt, [[{"id": "p0"}, {"id": "p1"}]])
    with pytest.raises(ReplayDiverged, match="not replayable"):
        BranchCredit(samples=2).see_round(records, Replayer(arena, module_random_prompt))


@pytest.mark.parametrize("game", ["tictactoe", "kuhn_poker", "negotiation", "highest_string", "dataset", "debate",
                                  "red_blue", "refine", "textarena", "proposer_solver"])
def test_builtin_games_replay(game):
    """The built-in games qualify (their judges' calls are answered by the engine and forced too)."""
    import importlib

    mod = importlib.import_module(f"autocurricula.games.{game}")
    arena = Arena(DigitEngine(), seed=5)
    n = getattr(mod, "NUM_PLAYERS", None) or 2
    seats = [[{"id": f"s{i}", "policy": mod.random_policy} for i in range(n)] for _ in range(4)]
    records = logged(arena, mod.play, seats)
    replayer = Replayer(arena, mod.play)
    for rec in records:
        assert rec.error is None, rec.error
        replayer.check(rec)


# ---------------------------------------------------------------------- in a league
def test_branch_credit_in_a_short_league(tiny_model_path, tmp_path, monkeypatch):
    runs, seen, branched = [], [], []
    real_run = Arena.run

    async def counting_run(self, games, *a, **k):
        runs.append(len(games))
        return await real_run(self, games, *a, **k)

    real_see, real_branch = BranchCredit.see_round, Replayer.branch

    def see(self, records, replayer):
        seen.append(records)
        return real_see(self, records, replayer)

    def branch(self, requests, samples, tag="b", **kw):
        out = real_branch(self, requests, samples, tag, **kw)
        branched.append((requests, out))
        return out

    monkeypatch.setattr(Arena, "run", counting_run)
    monkeypatch.setattr(BranchCredit, "see_round", see)
    monkeypatch.setattr(Replayer, "branch", branch)
    cfg = dict(epochs=1, rounds=2, rules={"games_per_round": 3}, progress=False, ratings={"bt_bootstrap": 0},
               max_tokens=4, credit=BranchCredit(samples=3))
    t = SelfPlayTrainer(SelfPlayConfig(output_dir=str(tmp_path / "a"), **cfg))
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    state = json.loads((latest_checkpoint(tmp_path / "a") / "state.json").read_text())
    assert state["rae"]["baselines"]  # the fallback's baselines are checkpointed
    # per round: the games, then all branches together (round 1 also replays one game to check it)
    assert runs == [3, 1, 3 * 2 * 3, 3, 3 * 2 * 3]
    assert [m["credit/branched_turns"] for m in t.metrics_log] == [6, 6]
    differ = 0
    for records, (requests, out) in zip(seen, branched):
        index = {(r.game_id, p): i for i, (r, p) in enumerate(requests)}
        for rec in records:
            pos = turn_positions(rec)
            for turn in rec.turns:  # A = G - mean of the K branch returns of the turn's seat
                rows = [g.rewards[turn.seat] for g in out[index[(rec.game_id, pos[id(turn)])]]]
                assert turn.advantage == pytest.approx(turn.reward - sum(rows) / len(rows))
            differ += len({round(t.advantage, 9) for t in rec.turns}) > 1
    assert differ > 0  # moves of one game get credit of their own
    # the same seed gives the same branches, hence the same advantages
    again = SelfPlayTrainer(SelfPlayConfig(output_dir=str(tmp_path / "b"), **cfg))
    again.train(str(tiny_model_path), digits)
    again.engine.close()
    advantages = [[t.advantage for rec in records for t in rec.turns] for records in seen]
    assert [[t.advantage for rec in records for t in rec.turns] for records in seen[2:]] == advantages[:2]


async def seeds_seen(players, model, tokenizer=None):
    """Records the game's seed and its sub-game's: what a deal would draw from."""
    inner = []

    async def sub(players, model, tokenizer=None):
        inner.append(model.seed)
        return [0.0, 0.0]

    await model.play(sub, players)
    return GameResult([0.0, 0.0], {"seed": model.seed, "sub": inner[0]})


def test_games_of_one_deal_draw_the_same_chance():
    """GameRecord.deal: mirrored games (seats swapped) share model.seed, in their sub-games too,
    and a branch keeps it; games without a deal keep the seed of their game id."""
    from autocurricula.arena.arena import GameHandle, derive_seed
    from autocurricula.records import Deal
    from autocurricula.loop.rounds import match_games

    arena = Arena(DigitEngine(), seed=4)
    p0, p1 = {"id": "p0"}, {"id": "p1"}
    entries = [Deal((p0, p1), "a"), Deal((p1, p0), "a"), Deal((p0, p1), "b"), (p0, p1)]
    games = match_games(entries, seeds_seen, "g", 0, 0, 2, True)
    assert pickle.loads(pickle.dumps(entries[1])).key == "a"  # an entry keeps its deal through pickling
    assert [g[2].deal for g in games] == ["e0-r0-da-0", "e0-r0-da-1"] * 2 + ["e0-r0-db-0", "e0-r0-db-1", None, None]
    records = asyncio.run(arena.run(games))
    seeds = [r.extras["seed"] for r in records]
    subs = [r.extras["sub"] for r in records]
    assert seeds[0] == seeds[2] and seeds[1] == seeds[3] and subs[0] == subs[2] and subs[1] == subs[3]
    assert len({seeds[0], seeds[1], seeds[4], seeds[6], seeds[7]}) == 5  # repeats and other deals differ
    # without a deal, the seed is the one a game id always gave
    assert seeds[6] == derive_seed(4, records[6].game_id, 0, None, "game")
    assert subs[6] == derive_seed(4, f"{records[6].game_id}/1", 1, records[6].game_id, "game")
    assert GameHandle(arena, records[6], "g").seed == seeds[6]
    replayed = Replayer(arena, seeds_seen).replay(records[2])
    assert replayed.extras["seed"] == seeds[0]


def test_a_kuhn_duplicate_pair_deals_each_seat_the_same_card(tiny_model_path):
    from autocurricula.engine import Engine
    from autocurricula.games import kuhn_poker
    from autocurricula.records import Deal
    from autocurricula.loop.rounds import match_games

    eng = Engine(str(tiny_model_path))
    try:
        arena = Arena(eng, seed=1, max_tokens=3)
        a, b = {"id": "a", "adapter": None}, {"id": "b", "adapter": None}
        entries = [e for i in range(6) for e in (Deal((a, b), i), Deal((b, a), i))]
        records = asyncio.run(arena.run(match_games(entries, kuhn_poker.play, "kuhn", 0, 0, 1, False)))
    finally:
        eng.close()
    assert all(r.error is None for r in records)
    cards = [kuhn_poker.parse_prompt(eng.decode(r.turns[0].prompt_ids))[0] for r in records]  # seat 0's card
    assert cards[0::2] == cards[1::2] and len(set(cards)) > 1
