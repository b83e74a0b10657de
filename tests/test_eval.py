"""autocurricula.eval: tic-tac-toe best response, Kuhn exploitability and mapping, Nash meta-strategy."""

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from autocurricula.eval import kuhn, meta
from autocurricula.eval.tictactoe import adversarial_figures, best_response, best_response_callback
from autocurricula.games import kuhn_poker
from autocurricula.games.tictactoe import (apply_move, legal_moves, minimax_values, optimal_moves,
                                           reachable_positions)


# ---------------------------------------------------------------- tic-tac-toe best response
def perfect(board, mark):
    return min(optimal_moves(board, mark))


def first_free(board, mark):
    return legal_moves(board)[0]


# the issue's exploit: after X5 O9 X1, O6 loses to a fork (only 3 or 7 hold)
FORKED = apply_move(apply_move(apply_move("." * 9, 5, "X"), 9, "O"), 1, "X")


def forkable(board, mark):
    """Perfect play, except that O answers X5 with 9 and then, after X1, plays 6."""
    if board == apply_move("." * 9, 5, "X"):
        return 9
    if board == FORKED:
        return 6
    return perfect(board, mark)


def test_perfect_policy_never_loses_as_x_or_o():
    figures = adversarial_figures(perfect)
    assert figures["worst_case_as_x"] == figures["worst_case_as_o"] == "draw"
    assert not figures["loses_to_best_response_as_x"] and not figures["loses_to_best_response_as_o"]
    assert figures["value_losing_share"] == 0.0


def test_first_free_cell_loses_as_both_and_the_line_is_a_real_game():
    for mark in ("X", "O"):
        br = best_response(first_free, mark)
        assert br.outcome == "loss" and br.value_losing
        board = "." * 9
        for i, move in enumerate(br.line):  # the line replays: the policy's moves are its own
            who = "X" if i % 2 == 0 else "O"
            if who == mark:
                assert move == first_free(board, mark)
            board = apply_move(board, move, who)
        from autocurricula.games.tictactoe import winner
        assert winner(board) == ("O" if mark == "X" else "X")


def test_the_issues_fork_is_found():
    as_o, as_x = best_response(forkable, "O"), best_response(forkable, "X")
    assert as_x.outcome == "draw" and as_o.outcome == "loss"
    assert as_o.line[:4] == [5, 9, 1, 6]  # the best response steers into the one weak position
    # exactly that position loses value; once lost, no later move can lose more
    assert as_o.value_losing == [(FORKED, "O", 6)]
    assert minimax_values(FORKED, "O")[6] == -1 and optimal_moves(FORKED, "O") == {3, 7}
    assert as_o.value_losing_share == pytest.approx(1 / as_o.positions)
    figures = adversarial_figures(forkable)
    assert figures["loses_to_best_response_as_o"] and not figures["loses_to_best_response_as_x"]


def test_a_table_policy_and_an_illegal_move_lose():
    table = {pos: perfect(*pos) for pos in reachable_positions()}
    assert best_response(table, "X").outcome == "draw"
    table[("." * 9, "X")] = None  # an unparseable reply on the first move loses at once
    br = best_response(table, "X")
    assert br.outcome == "loss" and br.line == [None] and br.value_losing == [("." * 9, "X", None)]
    with pytest.raises(KeyError, match="greedy_table"):
        best_response({}, "O")
    with pytest.raises(ValueError, match="'X' or 'O'"):
        best_response(perfect, "x")


def test_positions_are_those_reachable_under_any_opponent_play():
    # first-free as X: X's positions are every board reachable with X's moves fixed; count by brute force
    seen, stack = set(), ["." * 9]
    from autocurricula.games.tictactoe import to_move, winner
    while stack:
        b = stack.pop()
        if b in seen or winner(b) is not None:
            continue
        seen.add(b)
        moves = [first_free(b, "X")] if to_move(b) == "X" else legal_moves(b)
        stack.extend(apply_move(b, m, to_move(b)) for m in moves)
    assert best_response(first_free, "X").positions == sum(to_move(b) == "X" for b in seen)


# ---------------------------------------------------------------- Kuhn poker
def test_openspiel_mapping_matches_the_game_tree():
    pyspiel = pytest.importorskip("pyspiel")
    game = pyspiel.load_game("kuhn_poker")
    checked = set()
    for c1 in range(3):
        for c2 in range(3):
            if c1 == c2:
                continue
            cards = kuhn_poker.CARDS[c1] + kuhn_poker.CARDS[c2]

            def walk(state, history):
                if state.is_terminal():
                    assert state.returns()[0] == kuhn_poker.payoff(cards, history)[0]
                    return
                seat = state.current_player()
                infoset = f"{cards[seat]}:{' '.join(history)}"
                assert state.information_state_string(seat) == kuhn.openspiel_key(infoset)
                assert kuhn_poker.parse_prompt(kuhn.prompt_of(infoset)) == (cards[seat], history, seat)
                checked.add(infoset)
                passive, aggressive = ("check", "bet") if "check" in kuhn_poker.legal_actions(history) else \
                    ("fold", "call")
                assert [state.action_to_string(a) for a in state.legal_actions()] == ["Pass", "Bet"]
                walk(state.child(0), history + (passive,))
                walk(state.child(1), history + (aggressive,))

            state = game.new_initial_state()
            state.apply_action(c1)
            state.apply_action(c2)
            walk(state, ())
    assert checked == set(kuhn.INFOSETS)


@pytest.mark.parametrize("backend", ["python", "openspiel"])
def test_exploitability_of_known_policies(backend):
    if backend == "openspiel":
        pytest.importorskip("pyspiel")
    for alpha in (0.0, 1 / 6, 1 / 3):
        assert kuhn.exploitability(kuhn_poker.equilibrium_strategy(alpha), backend=backend) == pytest.approx(0, abs=1e-9)
    assert kuhn.exploitability(kuhn.uniform_strategy(), backend=backend) == pytest.approx(11 / 24)  # 0.458
    assert kuhn.exploitability(dict.fromkeys(kuhn.INFOSETS, 1.0), backend=backend) == pytest.approx(1 / 3)
    # the pure strategy the issue reports: J folds / checks, Q and K call, no bluffing
    pure = {k: 0.0 if k.startswith("J") else 1.0 for k in kuhn.INFOSETS}
    assert kuhn.exploitability(pure, backend=backend) > 0.1


def test_a_swapped_card_mapping_is_caught():
    pytest.importorskip("pyspiel")
    nash = kuhn_poker.equilibrium_strategy(1 / 3)
    assert kuhn.exploitability(nash, card_order="KQJ") > 1.0
    assert kuhn.exploitability(nash, card_order="QJK") > 0.2


def test_python_and_openspiel_agree_on_random_policies():
    pytest.importorskip("pyspiel")
    rng = random.Random(0)
    for _ in range(10):
        s = {k: rng.random() for k in kuhn.INFOSETS}
        assert kuhn.exploitability(s, backend="python") == pytest.approx(kuhn.exploitability(s, backend="openspiel"))


def test_best_response_values_by_hand():
    always = dict.fromkeys(kuhn.INFOSETS, 1.0)
    # player 1 always bets; player 2 folds J (-1), calls with Q (J or K behind: (+2 - 2) / 2 = 0), calls K (+2)
    assert kuhn.best_response_value(always, 1) == pytest.approx((-1 + 0 + 2) / 3)
    # player 2 always bets/calls; player 1 checks and folds J (-1), Q breaks even (0), bets K (+2)
    assert kuhn.best_response_value(always, 0) == pytest.approx((-1 + 0 + 2) / 3)
    # a strategy that never bluffs: player 2 with J folds to a bet, so player 1 bets J as a bluff and wins +1
    honest = {k: 0.0 if k.startswith("J") else 1.0 for k in kuhn.INFOSETS}
    assert kuhn.best_response_value(honest, 0) > kuhn.best_response_value(kuhn_poker.equilibrium_strategy(), 0)
    with pytest.raises(ValueError, match="lacks information sets"):
        kuhn.exploitability({"J:": 0.5})


def test_mixture_is_sampling_a_player_per_hand():
    rng = random.Random(1)
    players = [{k: rng.random() for k in kuhn.INFOSETS} for _ in range(3)]
    weights = [0.5, 0.3, 0.2]
    mix = kuhn.mixture_strategy(players, weights)
    naive = {k: sum(w * s[k] for s, w in zip(players, weights)) for k in kuhn.INFOSETS}
    for _ in range(3):
        opp = {k: rng.random() for k in kuhn.INFOSETS}
        as_p1 = sum(w * kuhn_poker.exact_value(s, opp) for s, w in zip(players, weights))
        as_p2 = sum(w * kuhn_poker.exact_value(opp, s) for s, w in zip(players, weights))
        assert kuhn_poker.exact_value(mix, opp) == pytest.approx(as_p1)
        assert kuhn_poker.exact_value(opp, mix) == pytest.approx(as_p2)
        assert kuhn_poker.exact_value(naive, opp) != pytest.approx(as_p1)  # plain averaging is not the mixture
    # a Nash mixture of Nash strategies is Nash
    nash = kuhn.mixture_strategy([kuhn_poker.equilibrium_strategy(0), kuhn_poker.equilibrium_strategy(1 / 3)], [1, 1])
    assert kuhn.exploitability(nash, backend="python") == pytest.approx(0, abs=1e-9)
    with pytest.raises(ValueError, match="one weight per strategy"):
        kuhn.mixture_strategy(players, [1.0])
    # weights whose normalised sum rounds above 1: the mixture of sure bets is still a strategy
    sure = dict.fromkeys(kuhn.INFOSETS, 1.0)
    mix = kuhn.mixture_strategy([sure, sure, sure], [0.1, 0.6, 0.2])
    assert all(0.0 <= p <= 1.0 for p in mix.values())
    kuhn.exploitability(mix, backend="python")  # accepted as a strategy


# ---------------------------------------------------------------- meta-strategy
def test_rock_paper_scissors_is_uniform():
    rps = [[0, -1, 1], [1, 0, -1], [-1, 1, 0]]
    x, y, v = meta.zero_sum_nash(rps)
    np.testing.assert_allclose(x, [1 / 3] * 3, atol=1e-9)
    np.testing.assert_allclose(y, [1 / 3] * 3, atol=1e-9)
    assert v == pytest.approx(0, abs=1e-12)
    # the same game as a league's win-rate matrix
    win_rates = (np.asarray(rps) + 1) / 2
    assert meta.nash_mixture(win_rates, ["r", "p", "s"]) == pytest.approx({"r": 1 / 3, "p": 1 / 3, "s": 1 / 3})


def test_an_even_league_is_uniform_and_alpha_rank_agrees_on_rps():
    np.testing.assert_allclose(meta.nash_mixture(np.full((3, 3), 0.5)), [1 / 3] * 3)
    pytest.importorskip("open_spiel")
    from autocurricula.loop.rating import alpha_rank

    with np.errstate(over="ignore"):
        ranks = alpha_rank((np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]]) + 1) / 2)
    np.testing.assert_allclose(ranks, [1 / 3] * 3, atol=1e-6)


def test_dominated_strategy_gets_weight_zero():
    # rock-paper-scissors plus a strategy that does worse than rock against everything
    win_rates = [[0.5, 0.0, 1.0, 1.0], [1.0, 0.5, 0.0, 1.0], [0.0, 1.0, 0.5, 1.0], [0.0, 0.0, 0.0, 0.5]]
    w = meta.nash_mixture(win_rates)
    assert w[3] == 0.0
    np.testing.assert_allclose(w[:3], [1 / 3] * 3, atol=1e-9)


def test_two_by_two_by_hand():
    # row: 3x + (1-x) = 2(1-x) -> x = 1/4; column: 3y = y + 2(1-y) -> y = 1/2; value 3/2
    x, y, v = meta.zero_sum_nash([[3, 0], [1, 2]])
    np.testing.assert_allclose(x, [0.25, 0.75], atol=1e-12)
    np.testing.assert_allclose(y, [0.5, 0.5], atol=1e-12)
    assert v == pytest.approx(1.5)
    # a saddle point: a pure equilibrium
    x, y, v = meta.zero_sum_nash([[2, 3], [1, 0]])
    np.testing.assert_allclose(x, [1, 0]), np.testing.assert_allclose(y, [1, 0])
    assert v == pytest.approx(2)


def test_lp_is_an_equilibrium_on_random_games():
    rng = np.random.default_rng(0)
    for m, n in [(3, 5), (6, 4), (8, 8)]:
        a = rng.normal(size=(m, n))
        x, y, v = meta.zero_sum_nash(a)
        assert (x @ a).min() == pytest.approx(v) and (a @ y).max() == pytest.approx(v)  # no deviation gains


def _kuhn_league_snapshots() -> np.ndarray:
    """The 99 frozen players of ``research/league_ideal.py --step 1 --tau 0.01 --structure league`` with
    policies clipped at 1e-13: near-pure, often repeated Kuhn strategies, whose meta-game has rank 10."""
    data = json.loads((Path(__file__).parent / "data" / "kuhn_league_snapshots.json").read_text())
    return kuhn.chip_payoffs([dict(zip(data["infosets"], row)) for row in data["strategies"]])


# the LP's pairs are exact to about its ratio-test tolerance (1e-11 of the range); 1e-9 leaves room for
# another machine's rounding
LP_GAP = 1e-9


@pytest.mark.parametrize("bland", [False, True], ids=["default-pivots", "bland-throughout"])
def test_lp_solves_a_league_of_near_duplicate_snapshots(monkeypatch, bland):
    # a simplex that pivots on the smallest-index row blows up on this game and never converges
    if bland:
        monkeypatch.setattr(meta, "_BLAND_AFTER", 0)
    a = _kuhn_league_snapshots()
    assert a.shape == (99, 99) and np.linalg.matrix_rank(a) < 20
    for k in (40, 79, 99):  # the league as it grew
        x, y, v = meta.zero_sum_nash(a[:k, :k])
        assert meta.exploitability(a[:k, :k], x, y) < LP_GAP and v == pytest.approx(0, abs=LP_GAP)  # symmetric


def test_lp_solves_a_large_random_game():
    a = np.random.default_rng(0).normal(size=(300, 300))
    x, y, v = meta.zero_sum_nash(a)
    assert meta.exploitability(a, x, y) < LP_GAP * np.ptp(a)
    assert (x @ a).min() == pytest.approx(v, abs=LP_GAP) and (a @ y).max() == pytest.approx(v, abs=LP_GAP)


@pytest.mark.parametrize("scale", [1e-12, 1e-6, 1e6, 1e12])
def test_lp_is_indifferent_to_the_payoffs_units(scale):
    rps = np.array([[0, -1, 2], [2, 0, -1], [-1, 2, 0]], dtype=float)  # unequal wins: still (1/3, 1/3, 1/3)
    x, y, v = meta.zero_sum_nash(rps * scale + 5 * scale)
    np.testing.assert_allclose(x, [1 / 3] * 3, atol=1e-9)
    assert v == pytest.approx((5 + 1 / 3) * scale, rel=1e-9)
    a = np.random.default_rng(1).normal(size=(60, 60)) * scale
    x, y, _ = meta.zero_sum_nash(a)
    assert meta.exploitability(a, x, y) < LP_GAP * np.ptp(a)


def test_simplex_keeps_its_contract_on_the_callers_matrix():
    a = np.random.default_rng(2).uniform(3.7, 18.5, size=(7, 9))
    y, u, total = meta.simplex_max(a)
    assert (a @ y).max() <= 1 + 1e-9 and (a.T @ u).min() >= 1 - 1e-9  # both feasible
    assert y.min() >= 0 and u.min() >= 0
    assert y.sum() == pytest.approx(total, rel=1e-9) and u.sum() == pytest.approx(total, rel=1e-9)  # optimal


@pytest.mark.parametrize("returned", ["not optimal", "nan"])
def test_lp_refuses_to_return_a_pair_that_is_no_equilibrium(monkeypatch, returned):
    # what a solver lost to rounding could hand back: a feasible pair that is not optimal, or NaN
    pair = (np.array([1.0, 0.0]), np.array([1.0, 0.0])) if returned == "not optimal" else (np.full(2, np.nan),) * 2
    monkeypatch.setattr(meta, "simplex_max", lambda a: (*pair, 1.0))
    with pytest.raises(RuntimeError, match="from an equilibrium"):
        meta.zero_sum_nash([[3, 0], [1, 2]])


def test_a_league_keeps_a_meta_strategy_when_the_lp_fails(monkeypatch):
    def fails(a):
        raise RuntimeError("the simplex did not converge")
    monkeypatch.setattr(meta, "zero_sum_nash", fails)
    rps = np.array([[0.5, 0.0, 1.0], [1.0, 0.5, 0.0], [0.0, 1.0, 0.5]])
    with pytest.warns(RuntimeWarning, match="regret matching"):
        np.testing.assert_allclose(meta.nash_mixture(rps), [1 / 3] * 3, atol=1e-3)
    with pytest.warns(RuntimeWarning, match="regret matching"):
        np.testing.assert_allclose(meta.robust_mixture(rps - 0.5), [1 / 3] * 3, atol=1e-3)
    with pytest.warns(RuntimeWarning, match="regret matching"):  # the Kuhn example's chip meta-game
        np.testing.assert_allclose(kuhn.meta_mixture([kuhn.uniform_strategy(), dict.fromkeys(kuhn.INFOSETS, 1.0)]),
                                   [0.0, 1.0], atol=1e-3)


def test_replicator_dynamics_approaches_the_mixture():
    x, y = meta.replicator_dynamics([[3, 0], [1, 2]], steps=20000, step_size=0.05)
    np.testing.assert_allclose(x, [0.25, 0.75], atol=0.03)
    np.testing.assert_allclose(y, [0.5, 0.5], atol=0.03)
    # general-sum: a dominated row dies out
    x, _ = meta.replicator_dynamics([[2, 2], [1, 1]], [[1, 0], [0, 1]], steps=2000)
    assert x[1] < 0.05


def test_meta_inputs_are_checked():
    with pytest.raises(ValueError, match="square"):
        meta.nash_mixture([[0.5, 0.5]])
    with pytest.raises(ValueError, match="NaN"):
        meta.zero_sum_nash([[0, np.nan]])
    with pytest.raises(ValueError, match="one per row"):
        meta.nash_mixture([[0.5]], ["a", "b"])


# ---------------------------------------------------------------- with a (tiny) model
@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from autocurricula.engine import Engine
    from autocurricula.engine.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("eval") / "tiny", hidden_size=64, num_layers=1, num_heads=4,
                            intermediate_size=128)
    engine = Engine(str(path), name="base")
    yield engine, path
    engine.close()


def _fake_trainer(engine, ids, tmp=None):
    import tempfile

    from autocurricula.loop.config import RatingConfig
    from autocurricula.loop.rating import Payoff
    from autocurricula.loop.standings import Standings

    from autocurricula.records import Player

    players = [Player(id=pid, frozen=i > 0, role="main_agent") for i, pid in enumerate(ids)]
    return SimpleNamespace(engine=engine, players=players + [Player(id="random", policy=print, frozen=True)],
                           elo=SimpleNamespace(rating=lambda pid: 0.0), payoff=Payoff(),
                           standings=Standings(RatingConfig(), tmp or tempfile.mkdtemp(), seed=0))


def test_best_response_callback_reads_the_engines_greedy_policy(tiny_engine):
    from autocurricula.engine import LoraSpec
    from autocurricula.eval.tictactoe import greedy_table
    from autocurricula.loop.pool import fresh_adapter

    engine, _ = tiny_engine
    engine.load_adapter("main", fresh_adapter(engine.linear_dims, LoraSpec(r=2), np.random.default_rng(0)))
    metrics = best_response_callback()(_fake_trainer(engine, ["main"]))
    expected = adversarial_figures(greedy_table(engine, "main"))
    assert metrics["eval/loses_to_best_response_as_x"] == float(expected["loses_to_best_response_as_x"])
    assert metrics["eval/loses_to_best_response_as_o"] == float(expected["loses_to_best_response_as_o"])
    assert metrics["eval/value_losing_share"] == pytest.approx(expected["value_losing_share"])
    assert set(metrics) == {"eval/loses_to_best_response_as_x", "eval/loses_to_best_response_as_o",
                            "eval/worst_case_value_as_x", "eval/worst_case_value_as_o", "eval/value_losing_share"}


class CharEngine:
    """A stand-in engine over characters whose next-character probabilities make the bare action
    word of each information set come out with a known probability (half the mass goes to junk)."""

    def __init__(self, target):
        self.target, self.tokenizer = target, SimpleNamespace(encode=self._chars, eos_token_id=0)
        self.prompts = {tuple(self._chars(kuhn.prompt_of(k))): k for k in kuhn.INFOSETS}

    @staticmethod
    def _chars(text, add_special_tokens=True):
        return [ord(c) for c in text]

    encode = _chars

    def logits(self, ids, player):
        n = next(len(p) for p in self.prompts if tuple(ids[:len(p)]) == p)
        infoset = self.prompts[tuple(ids[:n])]
        p = self.target[infoset] if player == "main" else 1 - self.target[infoset]
        history = infoset.split(":")[1].split()
        aggressive, passive = ("bet", "check") if "check" in kuhn_poker.legal_actions(history) else ("call", "fold")
        words = {aggressive: 0.5 * p, passive: 0.5 * (1 - p), "zzzz": 0.5}
        out = np.full((len(ids), 128), -50.0)
        for pos in range(n - 1, len(ids)):
            prefix = "".join(map(chr, ids[n:pos + 1]))
            mass = sum(m for w, m in words.items() if w.startswith(prefix))
            for c in {w[len(prefix)] for w in words if w.startswith(prefix) and len(w) > len(prefix)}:
                out[pos, ord(c)] = np.log(sum(m for w, m in words.items() if w.startswith(prefix + c)) / mass)
        return out


def test_read_strategy_scores_each_information_sets_action_words():
    target = {k: 0.1 + 0.8 * i / 11 for i, k in enumerate(kuhn.INFOSETS)}  # all distinct
    engine = CharEngine(target)
    assert kuhn.read_strategy(engine, "main") == pytest.approx(target)
    assert kuhn.read_strategy(engine, "other") == pytest.approx({k: 1 - v for k, v in target.items()})
    with pytest.raises(ValueError, match="empty"):
        kuhn.read_strategy(engine, "main", completion=lambda a: "")


def test_exploitability_callback_on_a_tiny_model(tiny_engine):
    from autocurricula.engine import LoraSpec
    from autocurricula.loop.pool import fresh_adapter

    engine, _ = tiny_engine
    for pid in ("k-main", "k-snap"):
        engine.load_adapter(pid, fresh_adapter(engine.linear_dims, LoraSpec(r=2), np.random.default_rng(1)))
    trainer = _fake_trainer(engine, ["k-main", "k-snap"])
    metrics = kuhn.exploitability_callback()(trainer)
    read = kuhn.read_strategy(engine, "k-main")
    assert all(0.0 < v < 1.0 for v in read.values())
    assert metrics["eval/exploitability_latest"] == pytest.approx(kuhn.exploitability(read))
    # both adapters start as the base (B = 0), so any mixture of them is the same policy
    assert metrics["eval/exploitability_mixture"] == pytest.approx(metrics["eval/exploitability_latest"])


def test_tictactoe_epoch_evaluator_reports_the_best_response(tiny_engine):
    """The examples' per-epoch evaluator puts the best-response booleans in every row and the summary."""
    from autocurricula.engine import LoraSpec
    from autocurricula.eval.tictactoe import EpochEvaluator
    from autocurricula.loop.pool import fresh_adapter

    engine, _ = tiny_engine
    engine.load_adapter("ex-main", fresh_adapter(engine.linear_dims, LoraSpec(r=2), np.random.default_rng(2)))
    trainer = _fake_trainer(engine, ["ex-main"])
    trainer.current_epoch, trainer.config = 0, SimpleNamespace(epochs=1)
    evaluator = EpochEvaluator(games=10, printer=None)
    with pytest.raises(ValueError, match="callbacks"):
        evaluator.summary(trainer)
    metrics = evaluator(trainer)
    summary = evaluator.summary(trainer, {})
    from autocurricula.eval.tictactoe import greedy_table
    expected = adversarial_figures(greedy_table(engine, "ex-main"))
    for key in ("loses_to_best_response_as_x", "loses_to_best_response_as_o"):
        assert summary[key] is expected[key] and metrics[f"eval/{key}"] == float(expected[key])
    assert summary["value_losing_share"] == pytest.approx(expected["value_losing_share"], abs=1e-4)
