"""Games: a conformance suite run over every module of autocurricula.games, per-game rule checks
(reference figures for tic-tac-toe, Kuhn's -1/18, hand-checked payoffs), and one run of every game
through the real Arena on the tiny model."""

import asyncio
import functools
import importlib
import math
import pkgutil
import random
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import autocurricula.games as games_pkg
from autocurricula.games import highest_string as hs
from autocurricula.games import kuhn_poker as kuhn
from autocurricula.games import negotiation as neg
from autocurricula.games import tictactoe as ttt
from autocurricula.arena.game import Game, ListsMoves, Stateful, as_play, game_facts, game_moves
from autocurricula.records import GameFacts, call_scripted

GAME_MODULES = sorted(m.name for m in pkgutil.iter_modules(games_pkg.__path__) if not m.name.startswith("_"))
PENALTIES = [(-1.5, 0.5), (-3.0, 0.0)]


class FakeModel:
    """The ``model`` handle a game gets, for scripted players only: replies come from
    ``player["policy"]`` with this model's NumPy generator, as in the Arena."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.calls = []

    async def generate(self, player, prompt, **sampling):
        text = call_scripted(player["policy"], prompt, self.rng)
        self.calls.append({"player": player["id"], "prompt": prompt, "text": text, **sampling})
        return SimpleNamespace(text=text, token_ids=[], logprobs=[])

    async def judge(self, prompt, *, player=None, **sampling):
        """A judge: ``player``'s policy, else a random verdict (a side, a score, or nonsense)."""
        policy = player["policy"] if player else (lambda p, rng: str(rng.choice(["A", "B", "3", "7", "10", "?"])))
        return await self.generate({"id": "judge", "policy": policy}, prompt, **sampling)

    async def play(self, sub_play, players, *, group=None, trainable=True, name=None, **kwargs):
        """A nested game on this same fake model (grouping and training do not apply here)."""
        from autocurricula.arena.arena import GameResult, game_result

        rewards, extras = game_result(await sub_play(players, self, None, **kwargs), len(players))
        return GameResult(rewards, extras)


def run(play, players, model=None, **options):
    return asyncio.run(play(players, model or FakeModel(), None, **options))


def scripted(*policies):
    return [{"id": f"p{i}", "policy": p} for i, p in enumerate(policies)]


def replies(*texts):
    """A policy replying ``texts`` in order (then repeating the last one)."""
    it = iter(texts)
    last = [texts[-1]]

    def policy(prompt):
        last[0] = next(it, last[0])
        return last[0]

    return policy


def game_module(name):
    if name == "textarena":
        pytest.importorskip("textarena")
    if name == "openspiel":
        pytest.importorskip("pyspiel", reason="the OpenSpiel adapter needs open_spiel: pip install 'autocurricula[openspiel]'")
    return importlib.import_module(f"autocurricula.games.{name}")


def n_players(mod):
    return mod.NUM_PLAYERS or 3  # games for any number of players are tested with three


def test_discovery_finds_every_game():
    assert {"tictactoe", "highest_string", "kuhn_poker", "negotiation", "textarena"} <= set(GAME_MODULES)


# ---------------------------------------------------------------------- conformance, every game
# what a built-in game cannot declare, and why (the suite checks everything else)
NO_MOVES = "its replies are free text: no list of legal replies"
ANY_PLAYERS = {"highest_string": "any number of players from 2 (NUM_PLAYERS is None)"}


@pytest.mark.parametrize("name", GAME_MODULES)
def test_every_game_module_is_a_game(name):
    mod = game_module(name)
    assert isinstance(mod, Game), f"{name} lacks one of play, NUM_PLAYERS, ZERO_SUM, random_policy"
    if name in ANY_PLAYERS:
        assert mod.NUM_PLAYERS is None, ANY_PLAYERS[name]
    else:
        assert type(mod.NUM_PLAYERS) is int and mod.NUM_PLAYERS >= 1
    assert type(mod.ZERO_SUM) is bool
    assert callable(mod.play) and callable(mod.random_policy)
    assert as_play(mod) is mod.play
    assert not isinstance(mod, Stateful)  # state lives in game objects (proposer_solver.ProposerSolver)


@pytest.mark.parametrize("name", GAME_MODULES)
def test_every_game_declares_its_facts(name):
    """Each module declares what OpenSpiel's GameType would (GameFacts), consistent with NUM_PLAYERS and
    ZERO_SUM; where it declares a payoff range, random legal play stays inside it."""
    mod = game_module(name)
    facts = mod.FACTS
    assert isinstance(facts, GameFacts)
    assert game_facts(mod) is facts and game_facts(mod.play) == facts  # the module's play reaches them
    assert facts.num_players == mod.NUM_PLAYERS and facts.zero_sum == mod.ZERO_SUM
    assert facts.utility is not None and facts.dynamics is not None
    if name != "textarena":  # the environment decides the rest
        assert facts.information is not None and facts.chance is not None
    if facts.payoff_range is None:
        return
    n = n_players(mod)
    for seed in range(20):
        rewards = run(mod.play, scripted(*[mod.random_policy] * n), FakeModel(seed), seed=seed)
        for seat, r in enumerate(rewards):
            lo, hi = facts.seat_range(seat)
            assert lo - 1e-9 <= r <= hi + 1e-9, (seat, r, (lo, hi))


@pytest.mark.parametrize("name", GAME_MODULES)
def test_random_policy_replies_with_a_listed_move(name):
    mod = game_module(name)
    if not isinstance(mod, ListsMoves):
        assert game_moves(mod) is None and game_moves(mod.play) is None, NO_MOVES
        return
    assert game_moves(mod) == mod.moves and game_moves(mod.play) == mod.moves  # the module's play reaches it
    n = n_players(mod)
    for seed in range(10):
        model = FakeModel(seed)
        run(mod.play, scripted(*[mod.random_policy] * n), model, seed=seed)
        for call in model.calls:
            legal = mod.moves(call["prompt"])
            assert legal and call["text"] in legal, (call["prompt"], call["text"], legal)
            for draw in range(5):
                assert mod.random_policy(call["prompt"], random.Random(draw)) in legal


def test_a_game_object_plays_through_as_play_and_keeps_its_abilities():
    from autocurricula.games import proposer_solver as ps

    class Coin:
        """A Game object with moves and state: it counts the games it played."""

        NUM_PLAYERS, ZERO_SUM = 1, False

        def __init__(self):
            self.played = 0

        async def play(self, players, model, tokenizer=None):
            self.played += 1
            reply = (await model.generate(players[0], "heads or tails?")).text
            return [1.0 if reply == "heads" else 0.0]

        def random_policy(self, prompt, rng=None):
            return random.Random(rng).choice(self.moves(prompt))

        def moves(self, prompt):
            return ["heads", "tails"]

        def state_dict(self):
            return {"played": self.played}

        def load_state_dict(self, state):
            self.played = state["played"]

    coin = Coin()
    play = as_play(coin)
    assert isinstance(coin, Game) and isinstance(play, Stateful) and game_moves(play) == coin.moves
    assert run(play, scripted(lambda prompt: "heads")) == [1.0] and play.state_dict() == {"played": 1}
    play.load_state_dict({"played": 7})
    assert coin.played == 7
    assert game_moves(coin.play) == coin.moves

    async def plain(players, model, tokenizer=None):
        return [0.0]

    assert as_play(plain) is plain and game_moves(plain) is None
    game = ps.ProposerSolver()  # a play object with state, not a Game: taken as it is
    assert as_play(game) is game and isinstance(game, Stateful)
    with pytest.raises(TypeError, match="is not a Game: it lacks"):
        as_play(importlib.import_module("autocurricula.games._tasks"))


@pytest.mark.parametrize("name", GAME_MODULES)
def test_random_playouts_end_with_finite_rewards(name):
    mod = game_module(name)
    n = n_players(mod)
    for seed in range(40):
        model = FakeModel(seed)
        rewards = run(mod.play, scripted(*[mod.random_policy] * n), model, seed=seed)
        assert len(rewards) == n and all(type(r) is float and math.isfinite(r) for r in rewards), rewards
        if mod.ZERO_SUM:
            assert abs(sum(rewards)) < 1e-9, rewards
        assert model.calls, "no player was asked anything"
        # deterministic given the seed and the replies
        assert run(mod.play, scripted(*[mod.random_policy] * n), FakeModel(seed), seed=seed) == rewards


@pytest.mark.parametrize("penalty", PENALTIES)
@pytest.mark.parametrize("name", GAME_MODULES)
def test_garbage_replies_are_penalised_as_configured(name, penalty):
    mod = game_module(name)
    n = n_players(mod)
    for seat in range(n):
        for garbage in ("", " \n "):
            policies = [mod.random_policy] * n
            policies[seat] = replies(garbage)
            for seed in range(3):
                rewards = run(mod.play, scripted(*policies), FakeModel(seed), seed=seed, invalid_penalty=penalty)
                want = [penalty[1]] * n
                want[seat] = penalty[0]
                assert rewards == want, (seat, garbage, rewards)


@pytest.mark.parametrize("name", GAME_MODULES)
def test_bad_penalty_and_player_count_are_refused(name):
    mod = game_module(name)
    players = scripted(*[mod.random_policy] * n_players(mod))
    with pytest.raises(ValueError, match="finite"):
        run(mod.play, players, invalid_penalty=(float("nan"), 0.5))
    with pytest.raises(ValueError, match="players"):
        run(mod.play, players[:1] if len(players) > 1 else players * 2)


# ---------------------------------------------------------------------- through the real Arena
@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from autocurricula.engine import Engine, EngineConfig

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    yield eng
    eng.close()


def arena_run(engine, games, seed=0):
    from autocurricula.arena.arena import Arena

    return asyncio.run(Arena(engine, seed=seed).run(games))


@pytest.mark.parametrize("name", GAME_MODULES)
def test_scripted_games_through_the_arena(engine, name):
    from autocurricula.arena.arena import GameRecord

    mod = game_module(name)
    n = n_players(mod)
    games = []
    for i in range(6):
        players = [{"id": f"{name}-{i}-{s}", "policy": mod.random_policy} for s in range(n)]
        games.append((functools.partial(mod.play, seed=i), players, GameRecord(f"{name}-{i}", players), name))
    records = arena_run(engine, games)
    for rec in records:
        assert rec.error is None, rec.error
        assert len(rec.rewards) == n and all(math.isfinite(r) for r in rec.rewards)
        if mod.ZERO_SUM:
            assert abs(sum(rec.rewards)) < 1e-9
        assert rec.turns == []  # scripted players are never trained
    # the prompts survive the engine's encode/decode round trip: the same seeds give the same games
    again = arena_run(engine, [(g[0], g[1], type(g[2])(g[2].game_id, g[1]), name) for g in games])
    assert [r.rewards for r in again] == [r.rewards for r in records]


def test_arena_game_seed_is_stable_per_game(engine):
    from autocurricula.arena.arena import GameRecord

    seen = {}

    async def play(players, model, tokenizer=None):
        seen.setdefault(model.record.game_id, []).append(model.seed)
        return await ttt.play(players, model, tokenizer, opening_moves=(2, 6))

    def games():
        players = [{"id": "a", "policy": ttt.random_policy}, {"id": "b", "policy": ttt.random_policy}]
        return [(play, players, GameRecord(f"g{i}", players), "ttt") for i in range(8)]

    first = [r.rewards for r in arena_run(engine, games())]
    assert [r.rewards for r in arena_run(engine, games())] == first  # openings included: a rerun repeats
    assert all(len(set(v)) == 1 for v in seen.values()) and len({v[0] for v in seen.values()}) == 8
    arena_run(engine, games(), seed=1)
    assert all(len(set(v)) == 2 for v in seen.values())  # another run seed, other games


@pytest.mark.parametrize("mod", [ttt, kuhn, neg, hs], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_llm_player_through_the_arena(engine, mod):
    from autocurricula.arena.arena import GameRecord

    llm = {"id": "llm", "adapter": None}  # the base tiny model: mostly garbage, so mostly penalties
    games = []
    for i in range(4):
        players = [llm, {"id": "bot", "policy": mod.random_policy}]
        players = players if i % 2 == 0 else players[::-1]
        games.append((functools.partial(mod.play, seed=i), players, GameRecord(f"g{i}", players), "g"))
    records = arena_run(engine, games)
    for i, rec in enumerate(records):
        assert rec.error is None, rec.error
        assert len(rec.rewards) == 2 and all(math.isfinite(r) for r in rec.rewards)
        seat = 0 if i % 2 == 0 else 1
        assert rec.turns and {t.player for t in rec.turns} == {"llm"} and {t.seat for t in rec.turns} == {seat}
        assert all(len(t.completion_ids) <= 10 for t in rec.turns)  # the games ask for short replies


# ---------------------------------------------------------------------- tic-tac-toe
def test_tictactoe_rules():
    assert ttt.winner("XXXOO....") == "X" and ttt.winner("XO.XO.X.O") == "X"
    assert ttt.winner("OX.XOX..O") == "O" and ttt.winner("XOXXOOOXX") == "draw" and ttt.winner("X...O....") is None
    assert ttt.legal_moves("X.O......") == [2, 4, 5, 6, 7, 8, 9] and ttt.legal_moves("XXXOO....") == []
    assert ttt.parse_move("I play 7.") == 7 and ttt.parse_move("0 or 3") == 3 and ttt.parse_move("none") is None
    assert ttt.render_prompt("X.O.X...O", "O") == "X2O\n4X6\n78O\nyou are O, move:"
    # a chat template around the prompt is fine; the last board wins; misplaced numbers are refused
    assert ttt.parse_prompt("<|im_start|>user\n" + ttt.render_prompt("X.O.X...O", "O") + "<|im_end|>") == (
        "X.O.X...O", "O")
    with pytest.raises(ValueError, match="out of place"):
        ttt.parse_prompt("X3O\n4X6\n78O\nyou are O, move:")
    with pytest.raises(ValueError, match="no board"):
        ttt.parse_prompt("tic-tac-toe board:\nX.O\n.X.\n..O\nyou are O, move (1-9):")


def test_tictactoe_reachable_positions_and_prompts_round_trip():
    positions = ttt.reachable_positions()
    assert len(positions) == 4520 and len(set(positions)) == 4520
    assert (ttt.EMPTY_BOARD, "X") in positions
    for board, mark in positions:
        assert ttt.winner(board) is None and mark == ttt.to_move(board)
        assert ttt.parse_prompt(ttt.render_prompt(board, mark)) == (board, mark)


def test_tictactoe_minimax_known_positions():
    assert ttt.minimax_value(ttt.EMPTY_BOARD, "X") == 0
    assert ttt.optimal_moves(ttt.EMPTY_BOARD, "X") == set(range(1, 10))  # every opening draws
    assert ttt.optimal_moves("X........", "O") == {5}  # corner opening: only the centre holds
    assert ttt.optimal_moves("....X....", "O") == {1, 3, 7, 9}  # centre opening: any corner
    assert ttt.optimal_moves(".X.......", "O") == {1, 3, 5, 8}  # edge: adjacent corners, centre, far edge
    assert ttt.optimal_moves("XX.OO....", "X") == {3} and ttt.minimax_values("XX.OO....", "X")[3] == 1
    assert ttt.optimal_moves("XX..O....", "O") == {3}  # must block
    assert ttt.optimal_moves("XXXOO....", "O") == set()
    # perfect play never loses from any reachable position it is the side to move in with value >= 0
    for board, mark in ttt.reachable_positions():
        vals = ttt.minimax_values(board, mark)
        assert max(vals.values()) == ttt.minimax_value(board, mark)


def _exact_win_rates(policy_a, policy_b):
    """Exact (win, win-or-draw) of A over the two seatings, policies as board, mark -> moves (uniform)."""
    @functools.cache
    def outcome(board, a_is_x):
        w = ttt.winner(board)
        if w is not None:
            a_mark = "X" if a_is_x else "O"
            return (float(w == a_mark), float(w in (a_mark, "draw")))
        mark = ttt.to_move(board)
        moves = (policy_a if (mark == "X") == a_is_x else policy_b)(board, mark)
        sub = [outcome(ttt.apply_move(board, m, mark), a_is_x) for m in moves]
        return tuple(sum(s[k] for s in sub) / len(sub) for k in range(2))

    x, o = outcome(ttt.EMPTY_BOARD, True), outcome(ttt.EMPTY_BOARD, False)
    return (x[0] + o[0]) / 2, (x[1] + o[1]) / 2


def test_tictactoe_reference_figures():
    def rand(board, mark):
        return ttt.legal_moves(board)

    def best(board, mark):
        return sorted(ttt.optimal_moves(board, mark))

    policies = {"random": (rand, ttt.random_policy), "minimax": (best, ttt.minimax_policy)}
    # (A, B): exact (win, win-or-draw) of A, and the figures the task states (+-0.03)
    cases = {("random", "random"): (0.43, None), ("random", "minimax"): (None, 0.13),
             ("minimax", "random"): (0.87, None), ("minimax", "minimax"): (None, 1.0)}
    rng = random.Random(1)
    for (a, b), (want_win, want_wd) in cases.items():
        exact = _exact_win_rates(policies[a][0], policies[b][0])
        n, win, wd = 4000, 0, 0
        for i in range(n):
            a_is_x = i % 2 == 0
            pa, pb = policies[a][1], policies[b][1]
            w = ttt.play_out(pa, pb, rng) if a_is_x else ttt.play_out(pb, pa, rng)
            a_mark = "X" if a_is_x else "O"
            win += w == a_mark
            wd += w in (a_mark, "draw")
        got = (win / n, wd / n)
        for k, want in enumerate((want_win, want_wd)):
            assert abs(got[k] - exact[k]) < 0.03, (a, b, got, exact)
            if want is not None:
                assert abs(got[k] - want) < 0.03 and abs(exact[k] - want) < 0.03, (a, b, got, exact)
    assert _exact_win_rates(rand, rand)[0] == pytest.approx((0.5849206349 + 0.2880952381) / 2, abs=1e-9)
    assert _exact_win_rates(best, rand)[1] == 1.0 and _exact_win_rates(best, best) == (0.0, 1.0)


def test_tictactoe_evaluate_table_figures():
    positions = ttt.reachable_positions()
    # perfect play that takes an immediate win when there is one
    perfect = {(b, m): min(ttt.tactic(b, m)[1] if ttt.tactic(b, m)[0] == "win" else ttt.optimal_moves(b, m))
               for b, m in positions}
    figures = ttt.evaluate_table(perfect, games=1000)
    assert figures["optimal_move_rate"] == figures["legal_move_rate"] == 1.0
    assert figures["win_now_rate"] == figures["block_rate"] == figures["vs_minimax_draw_or_win"] == 1.0
    assert figures["vs_random"] > 0.8
    first = {(b, m): ttt.legal_moves(b)[0] for b, m in positions}  # first free cell, no strategy
    naive = ttt.evaluate_table(first, games=1000)
    assert naive["legal_move_rate"] == 1.0 and naive["optimal_move_rate"] < 0.8
    assert naive["win_now_rate"] < 0.7 and naive["block_rate"] < 0.5 and naive["vs_minimax_draw_or_win"] < 0.2
    broken = {**perfect, positions[0]: None}
    assert ttt.evaluate_table(broken, games=10)["legal_move_rate"] == pytest.approx(1 - 1 / len(positions))
    assert ttt.tactic("XX.OO....", "X") == ("win", {3})
    assert ttt.tactic("XX..O....", "O") == ("block", {3})
    assert ttt.tactic("XX.O.....", "O") == (None, set())  # blocking 3 still loses to the fork at 5
    assert ttt.tactic("XXOOX....", "O") == (None, set())  # X threatens 8 and 9: lost, no block
    assert ttt.tactic(".........", "X") == (None, set())


def test_tictactoe_play_outcomes_and_invalid_moves():
    x_wins = scripted(replies("1", "2", "3"), replies("4", "5"))
    assert run(ttt.play, x_wins) == [1.0, -1.0]
    o_wins = scripted(replies("1", "2", "9"), replies("5", "4", "6"))
    assert run(ttt.play, o_wins) == [-1.0, 1.0]
    draw = scripted(replies("1", "3", "4", "8", "9"), replies("2", "5", "6", "7"))
    assert run(ttt.play, draw) == [0.0, 0.0]
    assert run(ttt.play, scripted(replies("5"), replies("move 5"))) == [0.5, -1.5]  # occupied cell
    assert run(ttt.play, scripted(replies("centre"), replies("1"))) == [-1.5, 0.5]  # no digit
    assert run(ttt.play, scripted(replies("0"), replies("1")), invalid_penalty=(-2, 1)) == [-2.0, 1.0]
    model = FakeModel()
    run(ttt.play, scripted(ttt.minimax_policy, ttt.minimax_policy), model, max_tokens=3, temperature=0.5)
    assert all(c["max_tokens"] == 3 and c["temperature"] == 0.5 for c in model.calls)
    model = FakeModel()
    run(ttt.play, scripted(ttt.minimax_policy, ttt.minimax_policy), model)
    assert all(c["max_tokens"] == 2 and "temperature" not in c for c in model.calls)  # arena default


def test_tictactoe_opening_moves_are_seeded_and_never_end_the_game():
    def first_prompt(seed, k):
        model = FakeModel()
        run(ttt.play, scripted(ttt.random_policy, ttt.random_policy), model, seed=seed, opening_moves=k)
        return model.calls[0]["prompt"]

    for k in (0, 1, 4, 6):
        boards = set()
        for seed in range(20):
            board, mark = ttt.parse_prompt(first_prompt(seed, k))
            assert first_prompt(seed, k) == ttt.render_prompt(board, mark)
            assert ttt.winner(board) is None and mark == ttt.to_move(board) and board.count(".") == 9 - k
            boards.add(board)
        assert len(boards) > (1 if k else 0)
    with pytest.raises(ValueError, match="opening_moves"):
        run(ttt.play, scripted(ttt.random_policy, ttt.random_policy), opening_moves=9)


def test_tictactoe_opening_range_drawn_per_game_from_the_model_seed():
    def opening(seed, moves):
        model = FakeModel()
        model.seed = seed  # what the league's game handle provides
        run(ttt.play, scripted(ttt.random_policy, ttt.random_policy), model, opening_moves=moves)
        return ttt.parse_prompt(model.calls[0]["prompt"])[0]

    assert opening(7, (0, 6)) == opening(7, (0, 6))  # same game seed, same game
    assert {9 - opening(s, (2, 5)).count(".") for s in range(60)} == {2, 3, 4, 5}
    assert len({opening(s, 4) for s in range(20)}) > 1
    with pytest.raises(ValueError, match="lo <= hi"):
        run(ttt.play, scripted(ttt.random_policy, ttt.random_policy), opening_moves=(3, 1))


def test_tictactoe_policies_take_either_rng():
    prompt = ttt.render_prompt("X.O.X....", "O")
    assert ttt.minimax_policy(prompt, np.random.default_rng(0)) == "9"
    assert ttt.minimax_policy(prompt, random.Random(0)) == "9"
    assert int(ttt.random_policy(prompt)) in ttt.legal_moves("X.O.X....")


# ---------------------------------------------------------------------- Kuhn poker
def test_kuhn_hand_checked_payoffs():
    cases = {("KQ", ("check", "check")): (1, -1), ("JQ", ("check", "check")): (-1, 1),
             ("KJ", ("bet", "call")): (2, -2), ("QK", ("bet", "call")): (-2, 2),
             ("JK", ("bet", "fold")): (1, -1), ("KJ", ("check", "bet", "fold")): (-1, 1),
             ("QJ", ("check", "bet", "call")): (2, -2), ("JQ", ("check", "bet", "call")): (-2, 2)}
    for (cards, history), want in cases.items():
        assert kuhn.payoff(cards, history) == want
        p1 = [a for i, a in enumerate(history) if i % 2 == 0]
        p2 = [a for i, a in enumerate(history) if i % 2 == 1]
        assert run(kuhn.play, scripted(replies(*p1), replies(*p2)), cards=cards) == list(want)
    assert kuhn.legal_actions(()) == ("check", "bet") and kuhn.legal_actions(("bet",)) == ("call", "fold")
    assert kuhn.legal_actions(("check", "bet")) == ("call", "fold") and kuhn.legal_actions(("bet", "call")) == ()


def test_kuhn_parsing_and_invalid_actions():
    assert kuhn.parse_action("I BET!", kuhn.legal_actions(())) == "bet"
    assert kuhn.parse_action("call", kuhn.legal_actions(())) is None  # a word, but not legal here
    assert kuhn.parse_action("fold then bet", ("call", "fold")) == "fold" and kuhn.parse_action("hmm") is None
    assert run(kuhn.play, scripted(replies("call"), replies("call")), cards="KQ") == [-1.5, 0.5]
    assert run(kuhn.play, scripted(replies("bet"), replies("check")), cards="KQ") == [0.5, -1.5]
    prompt = kuhn.render_prompt("Q", ("check", "bet"), 0)
    assert prompt == "kuhn poker, cards J<Q<K, ante 1.\nyou are player 1, your card: Q\nhistory: check bet\n" \
                     "your action (call/fold):"
    assert kuhn.parse_prompt(prompt) == ("Q", ("check", "bet"), 0)


def test_kuhn_deals_come_from_the_seed_and_stay_private():
    def hand(seed):
        model = FakeModel()
        run(kuhn.play, scripted(replies("check"), replies("check")), model, seed=seed)
        return [kuhn.parse_prompt(c["prompt"])[0] for c in model.calls]

    deals = {"".join(hand(s)) for s in range(60)}
    assert deals == {a + b for a in "JQK" for b in "JQK" if a != b}
    assert all(hand(s) == hand(s) for s in range(5))
    assert kuhn.deal(random.Random(3)) == kuhn.deal(random.Random(3))


def test_kuhn_equilibrium_value_is_minus_one_eighteenth():
    for alpha in (0.0, 1 / 6, 1 / 3):
        s = kuhn.equilibrium_strategy(alpha)
        assert kuhn.exact_value(s, s) == pytest.approx(-1 / 18, abs=1e-12)
    # player 2's equilibrium strategy holds player 1 to -1/18 whatever pure J-bluff player 1 uses
    dev = dict(kuhn.equilibrium_strategy(1 / 3), **{"J:": 1.0})
    assert kuhn.exact_value(dev, kuhn.equilibrium_strategy(1 / 3)) <= -1 / 18 + 1e-12

    # Monte Carlo through play(): 20,000 hands, standard error ~0.009; tolerance 0.035
    policy = kuhn.strategy_policy(kuhn.equilibrium_strategy(1 / 6))
    players = scripted(policy, policy)

    async def many(n):
        model, rng = FakeModel(7), random.Random(7)
        return [(await kuhn.play(players, model, None, rng=rng))[0] for _ in range(n)]

    values = asyncio.run(many(20000))
    assert abs(np.mean(values) + 1 / 18) < 0.035, np.mean(values)


# ---------------------------------------------------------------------- negotiation
def test_negotiation_parsing():
    assert neg.parse_reply("I get 1 0 2") == (1, 0, 2) and neg.parse_reply("1,2,3 please") == (1, 2, 3)
    assert neg.parse_reply("102") == (1, 0, 2) and neg.parse_reply("Accept.") == "accept"
    assert neg.parse_reply("accept, or I get 1 1 1") == "accept" and neg.parse_reply("1 2 no") is None
    prompt = neg.render_prompt((2, 1, 3), (0, 4, 2), (1, 0, 2), 2, 4)
    assert prompt == ("negotiation, turn 2 of 4. items: book hat ball\npool: 2 1 3\nyour values: 0 4 2\n"
                      "offer to you: 1 0 2\nreply accept or I get a b c:")
    assert neg.parse_prompt(prompt) == {"turn": 2, "max_turns": 4, "pool": (2, 1, 3), "values": (0, 4, 2),
                                        "offer": (1, 0, 2)}
    assert neg.parse_prompt(neg.render_prompt((1, 1, 1), (1, 1, 1), None, 4, 4))["offer"] is None


def test_negotiation_hand_checked_deals():
    pool, values = (2, 1, 3), [(1, 4, 2), (3, 0, 1)]  # pool worth 12 to player 1, 9 to player 2
    kw = {"pool": pool, "values": values}
    # player 1 keeps 0 1 3 (worth 10/12), player 2 gets 2 0 0 (worth 6/9)
    r = run(neg.play, scripted(replies("I get 0 1 3"), replies("accept")), **kw)
    assert r == pytest.approx([10 / 12 - 6 / 9, 6 / 9 - 10 / 12])
    r = run(neg.play, scripted(replies("I get 0 1 3"), replies("accept")), reward="share", **kw)
    assert r == pytest.approx([10 / 12, 6 / 9])
    # counter-proposal accepted by player 1 on turn 3: player 2 keeps 2 0 1 (7/9), player 1 gets 0 1 2 (8/12)
    r = run(neg.play, scripted(replies("I get 1 1 1", "accept"), replies("I get 2 0 1")), **kw)
    assert r == pytest.approx([8 / 12 - 7 / 9, 7 / 9 - 8 / 12])
    # nobody accepts within max_turns: no deal
    assert run(neg.play, scripted(replies("I get 2 1 3"), replies("I get 2 1 3")), **kw) == [0.0, 0.0]
    model = FakeModel()
    assert run(neg.play, scripted(replies("I get 2 1 3"), replies("I get 2 1 3")), model, max_turns=6, **kw) \
        == [0.0, 0.0]
    assert len(model.calls) == 6 and "(last turn)" in model.calls[-1]["prompt"]
    # invalid: accepting with nothing on the table, asking for more than the pool, no reply
    assert run(neg.play, scripted(replies("accept"), replies("accept")), **kw) == [-1.5, 0.5]
    assert run(neg.play, scripted(replies("I get 0 0 0"), replies("I get 3 0 0")), **kw) == [0.5, -1.5]
    assert run(neg.play, scripted(replies("I get 0 0 0"), replies("hello")), **kw) == [0.5, -1.5]


def test_negotiation_values_are_private_and_seeded():
    for seed in range(20):
        model = FakeModel(seed)
        run(neg.play, scripted(neg.random_policy, neg.random_policy), model, seed=seed)
        pool, v1, v2 = neg.deal(random.Random(seed))
        for call in model.calls:
            f = neg.parse_prompt(call["prompt"])
            assert f["pool"] == pool and f["values"] == (v1 if call["player"] == "p0" else v2)
            assert call["prompt"].count("values") == 1  # its own values only
    for seed in range(50):
        pool, v1, v2 = neg.deal(random.Random(seed))
        assert all(1 <= n <= 3 for n in pool) and all(0 <= x <= 5 for x in v1 + v2)
        assert sum(a * b for a, b in zip(v1, pool)) > 0 and sum(a * b for a, b in zip(v2, pool)) > 0


# ---------------------------------------------------------------------- highest string
def test_highest_string_rewards():
    assert run(hs.play, scripted(replies("b"), replies("a"))) == [1.0, -1.0]
    assert run(hs.play, scripted(replies(" zz"), replies("zz\n"))) == [0.0, 0.0]
    assert run(hs.play, scripted(replies("c"), replies("b"), replies("a"))) == [1.0, 0.0, -1.0]
    assert run(hs.play, scripted(replies("x"), replies("x"), replies("a"))) == [0.5, 0.5, -1.0]
    assert run(hs.play, scripted(replies("x"), replies(""), replies("a"), replies("\t"))) == [0.5, -1.5, 0.5, -1.5]
    assert hs.pairwise_rewards(["b", "ab", "abc", "B"]) == pytest.approx([1.0, -1 / 3, 1 / 3, -1.0])
    model = FakeModel()
    run(hs.play, scripted(hs.random_policy, hs.random_policy, hs.random_policy), model)
    assert len({c["prompt"] for c in model.calls}) == 1 and all(c["max_tokens"] == 3 for c in model.calls)
    rng = random.Random(0)
    for _ in range(200):
        assert abs(sum(hs.play_out([hs.random_policy] * 4, rng))) < 1e-9


# ---------------------------------------------------------------------- TextArena adapter
def test_textarena_stays_optional(monkeypatch):
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert any(d.startswith("textarena") for d in extras["project"]["optional-dependencies"]["games"])
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "autocurricula.games.textarena", raising=False)
    mod = importlib.import_module("autocurricula.games.textarena")  # importing needs no textarena
    with pytest.raises(ImportError, match=r'pip install "autocurricula\[games\]"'):
        mod.make_play("TicTacToe-v0")
    with pytest.raises(ImportError, match="autocurricula"):
        run(mod.play, scripted(mod.random_policy, mod.random_policy))


def test_textarena_tictactoe():
    pytest.importorskip("textarena")
    from autocurricula.games import textarena as tag

    play = tag.make_play("TicTacToe-v0")
    players = scripted(tag.random_policy, tag.random_policy)
    state = random.getstate()
    results = [run(play, players, FakeModel(s), seed=s) for s in range(10)]
    assert random.getstate() == state  # TextArena's global seeding is kept inside the game
    assert results == [run(play, players, FakeModel(s), seed=s) for s in range(10)]
    assert {tuple(r) for r in results} <= {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)} and len(set(map(tuple, results))) > 1
    # player 0 moves first in TextArena; an occupied cell or garbage is invalid
    assert run(play, scripted(replies("[4]"), replies("[4]"))) == [0.5, -1.5]
    assert run(play, scripted(replies("centre"), replies("[4]")), invalid_penalty=(-2, 0)) == [-2.0, 0.0]
    # retries: TextArena forgives one invalid move, then the game goes on
    forgiving = tag.make_play("TicTacToe-v0", retries=1)
    assert run(forgiving, scripted(replies("oops", "[0]", "[1]", "[2]"), replies("[3]", "[4]"))) == [1.0, -1.0]
    assert run(forgiving, scripted(replies("oops", "again"), replies("[3]"))) == [-1.5, 0.5]
    model = FakeModel()
    run(tag.make_play("TicTacToe-v0", max_tokens=4, prompt_fn=lambda obs, pid: f"P{pid}:{obs}"),
        players, model, seed=0)
    assert all(c["max_tokens"] == 4 and c["prompt"].startswith(("P0:", "P1:")) for c in model.calls)


def test_textarena_kuhn_poker_and_unknown_ids():
    pytest.importorskip("textarena")
    from autocurricula.games import textarena as tag

    play = tag.make_play("KuhnPoker-v0")  # KuhnPoker-v1 (SPIRAL's) is not in textarena 0.7
    players = scripted(tag.random_policy, tag.random_policy)
    results = {tuple(run(play, players, FakeModel(s), seed=s)) for s in range(20)}
    assert results <= {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)} and len(results) > 1
    assert run(play, scripted(replies("raise"), replies("raise"))) in ([-1.5, 0.5], [0.5, -1.5])
    with pytest.raises(ValueError, match="KuhnPoker-v0"):
        tag.make_play("KuhnPoker-v1")
    out = asyncio.run(tag.run_env("TicTacToe-v0", players, FakeModel(), seed=1, max_steps=2))
    assert out["rewards"] == [0.0, 0.0] and out["steps"] == 2  # cut short: no result


def test_scripted_policies_any_callable_and_exact_prompt(engine):
    """Scripted players get the game's prompt text as written, whether the callable takes an rng,
    is a per-game lambda or is not hashable (the arena caches what it learns about each policy)."""
    from autocurricula.arena.arena import GameRecord

    class Unhashable:
        __hash__ = None

        def __call__(self, prompt):
            seen.append(prompt)
            return ttt.random_policy(prompt, random.Random(prompt))

    seen = []

    def with_rng(prompt, rng):  # made by this test: no earlier test has cached what it takes
        return ttt.random_policy(prompt, rng)

    def games():
        out = []
        for i in range(4):
            one_arg = lambda prompt: str(ttt.legal_moves(ttt.parse_prompt(prompt)[0])[0])  # noqa: E731
            players = [{"id": "u", "policy": Unhashable()},
                       {"id": "r", "policy": one_arg if i % 2 else with_rng}]
            out.append((functools.partial(ttt.play, seed=i), players, GameRecord(f"g{i}", players), "ttt"))
        return out

    import autocurricula.arena.arena as arena_module

    calls = []
    real_signature = arena_module.inspect.signature

    def counting_signature(fn):
        calls.append(fn)
        return real_signature(fn)

    arena_module.inspect.signature = counting_signature
    try:
        records = arena_run(engine, games())
    finally:
        arena_module.inspect.signature = real_signature
    assert all(r.error is None for r in records), [r.error for r in records]
    assert seen and all(p == ttt.render_prompt(*ttt.parse_prompt(p)) for p in seen)
    # looked up once per cacheable policy (with_rng, two lambdas), every call for the unhashable one
    unhashable = [c for c in calls if isinstance(c, Unhashable)]
    assert len(calls) - len(unhashable) == 3 and len(unhashable) == len(seen)
    assert [r.rewards for r in arena_run(engine, games())] == [r.rewards for r in records]


class CountingTokenizer:
    """The engine's tokenizer, counting the texts it encodes and the ids it decodes."""

    def __init__(self, tok):
        self.tok, self.encoded, self.decoded = tok, [], []

    def encode(self, text, *args, **kwargs):
        self.encoded.append(text)
        return self.tok.encode(text, *args, **kwargs)

    def decode(self, ids, *args, **kwargs):
        self.decoded.append(tuple(ids))
        return self.tok.decode(ids, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_engine_encode_and_decode_are_cached_and_copied(engine):
    prompt = ttt.render_prompt(ttt.EMPTY_BOARD, "O") + " (cache test)"  # a text no other test encodes
    long_prompt = "free text " * 300  # long free text (over 2048 characters) is not kept
    real = engine.tokenizer
    engine.tokenizer = counting = CountingTokenizer(real)
    try:
        ids = engine.encode(prompt)
        ids.append(-1)  # the caller's list is its own: the cache is not mutated through it
        assert engine.encode(prompt) == list(real.encode(prompt))
        assert engine.decode(engine.encode(prompt)) == prompt == engine.decode(engine.encode(prompt))
        assert counting.encoded == [prompt] and len(counting.decoded) == 1  # the tokenizer ran once each
        engine.encode(long_prompt), engine.encode(long_prompt)
        assert counting.encoded == [prompt, long_prompt, long_prompt]
    finally:
        engine.tokenizer = real


# ---------------------------------------------------------------------- chat prompts and the reasoning format
def test_reasoning_answers_are_parsed_from_the_answer_tags_only():
    from autocurricula.games._common import PromptStyle

    style = PromptStyle(reasoning=True)
    assert style.answer("3 looks weak, 7 blocks. <answer> 7 </answer>") == "7"
    assert style.answer("<answer>1</answer> no, <answer>9</answer>") == "9"  # the last answer counts
    assert style.answer("thinking 5... <answer>9", "stop") == "9"  # cut at the closing tag (a stop string)
    assert style.answer("thinking 5... <answer>9", "length") is None  # cut by the budget before the tag
    assert style.answer("I pick 5") is None  # no answer: only the answer is parsed
    assert style.answer("5", scripted=True) == "5"  # a scripted policy's move needs no tags
    assert PromptStyle().answer("any 5") == "any 5"
    assert style.max_tokens(2) == 2 + 256 + 16 and PromptStyle().max_tokens(2) == 2
    assert style.stop(None) == ["</answer>"] and PromptStyle().stop(None) is None
    with pytest.raises(ValueError, match="thinking_tokens"):
        PromptStyle(reasoning=True, thinking_tokens=-1)


@pytest.mark.parametrize("mod", [ttt, kuhn, neg], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_default_prompts_are_the_compact_ones(mod):
    model = FakeModel(0)
    run(mod.play, scripted(mod.random_policy, mod.random_policy), model, seed=3)
    for call in model.calls:
        assert isinstance(call["prompt"], str) and not call["prompt"].startswith(mod.RULES)
        assert "stop" not in call


@pytest.mark.parametrize("mod,move", [(ttt, "5"), (kuhn, "bet"), (neg, "I get 1 1 1")],
                         ids=["tictactoe", "kuhn_poker", "negotiation"])
def test_chat_and_reasoning_prompts_and_answers(mod, move):
    model = FakeModel(0)
    thought = f"Let me think. <answer>{move}</answer>"
    rewards = run(mod.play, scripted(replies(thought), replies("<answer>nonsense</answer>")), model, seed=1,
                  chat=True, reasoning=True, thinking_tokens=40, max_tokens=5)
    first, second = model.calls[0], model.calls[1]
    system, user = first["prompt"]
    assert system["role"] == "system" and system["content"].startswith(mod.RULES) and "<answer>" in system["content"]
    assert user["role"] == "user" and mod.parse_prompt(user["content"])  # the compact prompt, as it is
    assert first["max_tokens"] == 5 + 40 + 16 and first["stop"] == ["</answer>"]
    assert len(model.calls) == 2 and rewards == [0.5, -1.5]  # the second player's answer does not parse
    # plain text with the reasoning format: rules, the format, then the position
    model = FakeModel(0)
    run(mod.play, scripted(replies(thought), replies(thought)), model, seed=1, reasoning=True)
    assert isinstance(model.calls[0]["prompt"], str) and model.calls[0]["prompt"].startswith(mod.RULES)


def test_moves_come_in_answer_tags_when_the_prompt_asks_for_them():
    from autocurricula.games._common import PromptStyle

    position = ttt.render_prompt("X...O....", "X")
    assert ttt.moves(position) == ["2", "3", "4", "6", "7", "8", "9"]
    prompt = PromptStyle(reasoning=True).prompt(ttt.RULES, position)
    assert ttt.moves(prompt) == [f"<answer>{m}</answer>" for m in ttt.moves(position)]
    assert PromptStyle(reasoning=True).answer(ttt.moves(prompt)[0]) == "2"
    kuhn_prompt = PromptStyle(chat=False, reasoning=True).prompt(kuhn.RULES, kuhn.render_prompt("Q", ("bet",), 1))
    assert kuhn.moves(kuhn_prompt) == ["<answer>call</answer>", "<answer>fold</answer>"]


def test_with_options_keeps_the_game_name_and_moves():
    from autocurricula.arena.game import game_name

    game = ttt.with_options(chat=True, reasoning=True)
    play = as_play(game)
    assert isinstance(game, Game) and game_name(play) == "tictactoe" and game_moves(play) == game.moves
    assert game_moves(as_play(neg.with_options(chat=True))) is None  # negotiation lists no moves
    assert game_name(as_play(kuhn.with_options(reasoning=True))) == "kuhn_poker"
    partial = functools.partial(ttt.play, chat=True)  # loses both: why the docs use with_options
    assert game_name(partial) != "tictactoe" and game_moves(partial) is None
    model = FakeModel(0)
    rewards = run(play, scripted(replies("<answer>5</answer>"), replies("<answer>5</answer>")), model, seed=0)
    assert rewards == [0.5, -1.5] and isinstance(model.calls[0]["prompt"], list)  # O names X's cell


def test_an_instruct_style_game_trains_end_to_end(tiny_model_path, tmp_path):
    """Tic-tac-toe with chat=True and the reasoning format, on the tiny model's ChatML template,
    through a trainer for one round: turns carry the templated prompt and the whole reply."""
    from autocurricula import SelfPlayConfig, SelfPlayTrainer
    from autocurricula.views.callbacks import TrainerCallback
    from autocurricula.games._common import PromptStyle

    seen = []

    class Turns(TrainerCallback):
        def on_update(self, trainer, turns, result):
            seen.extend(turns)

    game = ttt.with_options(chat=True, reasoning=True, thinking_tokens=12, opening_moves=2)
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 4},
                                       output_dir=str(tmp_path / "run"), progress=False))
    try:
        t.train(str(tiny_model_path), game, callbacks=[Turns()])
        assert t.run.game_name == "tictactoe" and seen
        for turn in seen:
            text = t.engine.decode(turn.prompt_ids)  # the template's special tokens are not decoded
            position = text.split("\nuser\n", 1)[1].removesuffix("\nassistant\n")
            messages = PromptStyle(chat=True, reasoning=True).prompt(ttt.RULES, position)
            assert turn.prompt_ids == t.engine.apply_chat_template(messages)
            assert 0 < len(turn.completion_ids) <= 2 + 12 + 16  # thinking and answer, all trained
        assert t.engine.adapter_weights(t.players[0]["id"]).modules
    finally:
        t.engine.close()
