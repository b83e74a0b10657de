"""The research/ scripts (diagnostics and reproductions, research/README.md): every test here is in
the slow tier, so the default suite never imports research/ (tests/conftest.py checks it)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import load_script as _load

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _diagnostics():
    return _load(ROOT / "research" / "tictactoe_diagnostics.py", "ttt_diag")


def test_target_quality_of_perfect_and_board_blind_continuations():
    """With a perfect greedy policy playing the continuations, greedy values are the minimax values,
    so every target's best moves are optimal; with the board-blind rule the best reply repairs most."""
    diag = _diagnostics()
    from autocurricula.games import tictactoe as T

    perfect = {(b, m): min(T.optimal_moves(b, m)) for b, m in T.reachable_positions()}
    got = diag.target_quality(perfect)
    assert got["greedy"]["top_moves_optimal"] == got["best_reply"]["top_moves_optimal"] == 1.0
    blind = diag.target_quality(diag.static_table())
    assert blind["greedy"]["top_moves_optimal"] < 0.8 < blind["best_reply"]["top_moves_optimal"] < 1.0


@pytest.mark.parametrize("mode", [["static"], ["targets"], ["memo", "--games", "2", "--repeats", "1"],
                                  ["regression", "--steps", "2", "--states", "4", "--eval-every", "2",
                                   "--move-loss", "cross_entropy"],
                                  ["supervised", "--lora", "--steps", "2", "--eval-every", "2", "--rank", "4"],
                                  ["bandit", "--epochs", "1", "--rounds", "2", "--games", "8", "--group", "4",
                                   "--entropy-coef", "0.1", "--num-iterations", "2", "--eval-every", "1"],
                                  ["scripted", "--epochs", "1", "--rounds", "2", "--games", "4", "--openings", "0-3",
                                   "--eval-every", "1", "--credit", "q", "--q-targets", "1.0", "--q-target-min-visits", "1"], ["cost", "--heads-list", "2,8"]])
def test_tictactoe_diagnostics_run(mode, tmp_path):
    import json
    import os

    args = [sys.executable, str(ROOT / "research" / "tictactoe_diagnostics.py"), *mode, "--hidden", "32", "--layers",
            "1", "--heads", "4", "--warmup-steps", "20", "--eval-games", "20", "--output-dir", str(tmp_path / "run")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if mode[0] == "cost":  # one row per head count, ratios against the first
        assert [r["heads"] for r in rows] == [2, 8] and rows[0]["ratio"] == 1.0 and rows[1]["ms_per_step"] > 0
        return
    if mode[0] == "memo":  # the same targets either way
        assert rows[0]["same_targets"] is True and rows[0]["branch_games"] > 0
        return
    if mode[0] == "targets":  # shares of positions and probability mass
        assert all(0 <= rows[0][rule][k] <= 1 for rule in ("greedy", "best_reply") for k in rows[0][rule])
        return
    assert rows and all(0 <= r["optimal_move_rate"] <= 1 for r in rows)
    if mode[0] == "static":
        assert rows[0]["optimal_move_rate"] == 0.678  # the plateau's figure, exactly


def test_diagnostics_count_whom_the_main_agent_met(tmp_path):
    import json

    games = [["main_agent-0", "minimax"], ["main_agent-0", "main_agent-0"], ["main_exploiter-3", "main_agent-0"],
             ["minimax", "main_agent-0"], ["random", "main_exploiter-3"]]
    (tmp_path / "match_history.jsonl").write_text("".join(json.dumps({"players": g}) + "\n" for g in games))
    assert _diagnostics().opponents(str(tmp_path)) == {"player": "main_agent-0", "games": 4,
                                                       "share": {"minimax": 0.5, "self": 0.25, "main_exploiter": 0.25}}


def test_true_restricted_game_of_the_psro_diagnostic():
    """research/psro_restricted_game.py's exact restricted game: antisymmetric, each entry the mean
    over the two seats of what member i wins from j (invalid replies forfeiting)."""
    import numpy as np

    from autocurricula.games.matrix import BIASED_RPS

    mod = _load(ROOT / "research" / "psro_restricted_game.py", "psro_rg")
    e = np.eye(4)
    rock, paper = [e[0], e[0]], [e[1], e[1]]  # the same word index in both seats
    leaky = [0.5 * e[0] + 0.5 * e[3], 0.5 * e[0] + 0.5 * e[3]]  # half invalid
    m = mod.true_restricted_game(BIASED_RPS, [rock, paper, leaky])
    assert np.allclose(m, -m.T)
    assert m[1, 0] == 1.0  # paper beats rock by 1 in either seat
    # against rock, half of leaky's replies are rock (a draw) and half forfeit the seat's worst payoff (2)
    assert m[2, 0] == -1.0


def test_soft_q_targets_of_the_research_script():
    """research/soft_targets.py's ``SoftQCredit``: one target turn per known move of a visited
    state, with ``A = coef * softmax(Q / tau)`` (mean backup: Q shrunk by one visit at V; minimax:
    the backed-up Q): the advantages sum to coef, a move tried fewer than ``target_min_visits``
    times gets none, and ``targets_only`` zeroes the played turns' advantages while the table still
    learns from them (with ``off_target``, only those of moves that get a target turn)."""
    import math

    from autocurricula.records import Turn

    mod = _load(ROOT / "research" / "soft_targets.py", "soft_targets_research")

    def act(completion, game_id, reward):
        return Turn("p", game_id, "X", [1], [completion], [-0.5], reward=reward, game="kuhn")

    played = [(7, 1), (7, 1), (8, -1), (8, -1), (9, 1)]
    credit = mod.SoftQCredit(0.5, target_coef=0.8)
    for i, (move, r) in enumerate(played):
        credit.values.advantages([act(move, f"g{i}", r)])
    # V = 0.2; scores shrunk by one visit at V: 7 -> (2 + 0.2) / 3, 8 -> (-2 + 0.2) / 3; 9 has one visit
    targets = credit.extra_turns([act(8, "now", -1)])
    s7, s8 = 2.2 / 3, -1.8 / 3
    p7 = 1 / (1 + math.exp((s8 - s7) / 0.5))
    assert all(t.target for t in targets)
    assert {t.completion_ids[0]: t.advantage for t in targets} == pytest.approx({7: 0.8 * p7, 8: 0.8 * (1 - p7)})

    only = mod.SoftQCredit(0.5, targets_only=True, target_coef=0.8, backup="minimax")
    advantages = [only.advantages([act(move, f"g{i}", r)]) for i, (move, r) in enumerate(played)]
    assert advantages == [[0.0]] * 5 and credit.advantages([act(9, "g5", -1)]) != [0.0]
    # minimax: each move's backed-up value is its (deterministic) outcome, 1 and -1
    targets = only.extra_turns([act(8, "now", -1)])
    p7 = 1 / (1 + math.exp(-2 / 0.5))
    assert {t.completion_ids[0]: t.advantage for t in targets} == pytest.approx({7: 0.8 * p7, 8: 0.8 * (1 - p7)})
    # off_target: a move with no target turn (tried once: 9) keeps A = Q - V; a targeted one (7) gets 0
    off = mod.SoftQCredit(0.5, targets_only=True, off_target=True, target_coef=0.8)
    for i, (move, r) in enumerate(played[:4]):
        off.advantages([act(move, f"g{i}", r)])
    v = off.values.value(act(9, "g4", -1))
    assert off.advantages([act(9, "g4", -1)]) == pytest.approx([-1 - v]) and v == pytest.approx(0.0, abs=0.2)
    assert off.advantages([act(7, "g5", 1)]) == [0.0]
    with pytest.raises(ValueError, match="targets_only"):
        mod.SoftQCredit(0.5, off_target=True, target_coef=0.8)
    # round_step: a state's scores averaged over the rounds it is met, weight max(1 / n, step) at the n-th
    avg = mod.SoftQCredit(0.5, round_step=0.1, target_coef=0.8)
    for i, (move, r) in enumerate(played[:4]):
        avg.advantages([act(move, f"g{i}", r)])
    turn = act(8, "now", -1)
    first = {k[1][0]: k[0] for k in avg.known_moves(turn, avg.values.key(turn))}
    assert avg.extra_turns([turn])  # round 1: this round's scores
    for i in range(3):
        avg.advantages([act(8, f"h{i}", 1)])  # move 8 now wins
    second = {k[1][0]: k[0] for k in avg.known_moves(turn, avg.values.key(turn))}
    mean = {m: (first[m] + second[m]) / 2 for m in (7, 8)}  # round 2: weight max(1 / 2, 0.1)
    p7 = 1 / (1 + math.exp((mean[8] - mean[7]) / 0.5))
    assert second[8] > first[8] + 0.5
    assert {t.completion_ids[0]: t.advantage for t in avg.extra_turns([turn])} == \
        pytest.approx({7: 0.8 * p7, 8: 0.8 * (1 - p7)})
    with pytest.raises(ValueError, match="round_step"):
        mod.SoftQCredit(0.5, round_step=0.0, target_coef=0.8)
    # listed: the targets cover the game's moves only; a reply that is none of them keeps its A
    listed = mod.SoftQCredit(0.5, targets_only=True, off_target=True, listed=True, target_coef=0.8)
    with pytest.raises(RuntimeError, match="ListedMoves"):
        listed.is_listed([1], [7])
    listed.moves_of = lambda prompt: ["7", "8"] if prompt == "1" else []
    listed.decode = lambda ids, skip_special_tokens=True: " ".join(map(str, ids))
    for i, (move, r) in enumerate(played[:4] + [(9, -1), (9, -1)]):  # 9: an invalid word, tried twice
        listed.advantages([act(move, f"g{i}", r)])
    assert {t.completion_ids[0] for t in listed.extra_turns([act(8, "now", -1)])} == {7, 8}
    assert listed.advantages([act(9, "g6", -1)]) != [0.0] and listed.advantages([act(7, "g7", 1)]) == [0.0]
    unlisted = mod.SoftQCredit(0.5, targets_only=True, off_target=True, target_coef=0.8)
    for i, (move, r) in enumerate(played[:4] + [(9, -1), (9, -1)]):
        unlisted.advantages([act(move, f"g{i}", r)])
    assert {t.completion_ids[0] for t in unlisted.extra_turns([act(8, "now", -1)])} == {7, 8, 9}
    with pytest.raises(ValueError, match="lists its moves"):
        mod.ListedMoves(lambda players, model, tokenizer: None)
    # minimax: "9." and "9" reach the same next position, one move; with listed its listed spelling is
    # the target (visits summed), and round_step keeps its average when its most played spelling changes
    spelled = {9: "9", 46: ".", 5: "5"}

    def line(game_id, first, then, r):  # two turns of one player: the first move decides the next prompt
        return [Turn("p", game_id, "X", [1], first, [0.0] * len(first), reward=r, game="t"),
                Turn("p", game_id, "X", [2] if first[0] == 9 else [3], then, [0.0] * len(then), reward=r, game="t")]

    def board(**kw):
        c = mod.SoftQCredit(0.5, targets_only=True, off_target=True, target_coef=1.0, backup="minimax", **kw)
        c.moves_of = lambda prompt: ["9", "5"] if prompt == "<1>" else []
        c.decode = lambda ids, skip_special_tokens=True: "".join(spelled.get(i, f"<{i}>") for i in ids)
        return c

    first = sum([line(f"a{i}", [9, 46], [5], 1) for i in range(3)], line("b", [9], [5], 1))
    first += sum([line(f"c{i}", [5], [9], -1) for i in range(2)], [])
    probe = Turn("p", "z", "X", [1], [9], [0.0], reward=0, game="t")
    grouped = board(listed=True)
    assert set(grouped.advantages(first)[0:8:2]) == {0.0}  # both spellings are the targeted move 9
    p9 = 1 / (1 + math.exp(-2 / 0.5))
    assert {tuple(t.completion_ids): t.advantage for t in grouped.extra_turns([probe])} == \
        pytest.approx({(9,): p9, (5,): 1 - p9})
    kept = board(round_step=0.1)
    kept.advantages(first)
    assert {tuple(t.completion_ids) for t in kept.extra_turns([probe])} == {(9, 46), (5,)}  # "9." most played
    kept.advantages(sum([line(f"e{i}", [9], [5], -1) for i in range(3)], []))  # now "9", and move 9 loses
    p9 = 1 / (1 + math.exp(-1 / 0.5))  # averages (1 - 1) / 2 = 0 against -1
    assert {tuple(t.completion_ids): t.advantage for t in kept.extra_turns([probe])} == \
        pytest.approx({(9,): p9, (5,): 1 - p9})
    # anchor_games: a game with a scripted seat stays out of the mean table and gets no advantage
    from autocurricula.records import GameRecord

    from types import SimpleNamespace

    from autocurricula.credit import QCredit
    from autocurricula.credit.registry import make_credit

    # the trainer trains with its own copy of the config's credit: the callback names the games to that one
    given = mod.SoftQCredit(0.5, anchor_games=True, target_coef=0.8)
    trainer = SimpleNamespace(credit=make_credit(given, None, 0))
    assert trainer.credit is not given
    mod.AnchorGames().on_games(trainer, [GameRecord("vs_random", [{"id": "p"}, {"id": "random", "policy": len}]),
                                         GameRecord("g0", [{"id": "p"}, {"id": "p"}])])
    apart = trainer.credit
    assert apart.anchored == {"vs_random"}
    assert apart.advantages([act(7, "vs_random", 1), act(7, "g0", 1)]) == [0.0, 1.0]  # g0: A = 1 - V(new) = 1
    with pytest.raises(TypeError, match="SoftQCredit"):
        mod.AnchorGames().on_games(SimpleNamespace(credit=QCredit()), [])
    assert [v[1] for v in apart.values.action_values.values()] == [1]  # one visit: g0's
    board = mod.SoftQCredit(0.5, anchor_games=True, target_coef=0.8, backup="minimax")
    board.anchored = {"vs_random"}  # a minimax value holds against any line: the anchor's games enter it
    board.advantages([act(7, "vs_random", 1), act(7, "g0", 1)])
    assert [v[1] for v in board.values.action_values.values()] == [2]
    with pytest.raises(ValueError, match="tau > 0"):
        mod.SoftQCredit(0.0, target_coef=1.0)
    with pytest.raises(ValueError, match="target_coef > 0"):
        mod.SoftQCredit(0.15, target_coef=0.0)


def test_anchor_bias_of_the_research_script():
    """research/anchor_bias_ideal.py: with exact values, a learner that plays half its games against
    the uniform random player (the tic-tac-toe league's anchor share) settles near a best response
    to that mixture: Kuhn at 0.10 chips per hand, above the goal of 0.05, where the same steps
    without the anchor settle at the tau = 0.15 floor (0.031); on the matrix games the anchor
    raises the median share too. Its values are exact: the hard target against uniform play is the
    best response, which earns uniform play's exploitability (0.458)."""
    import numpy as np
    from autocurricula.eval.kuhn import exploitability
    from autocurricula.games.kuhn_poker import exact_value
    from autocurricula.games.matrix import random_game

    mod = _load(ROOT / "research" / "anchor_bias_ideal.py", "anchor_bias")
    uniform = dict.fromkeys(mod.INFOSETS, 0.5)
    br = dict(mod.WARM_BASE)
    for _ in range(2):  # a move's value takes the learner's later moves: the second pass values them as chosen
        q = mod.kuhn_values(br, uniform)
        br = {k: mod.target(*q[k], 0.15, soft=False) for k in mod.INFOSETS}
    earned = 0.5 * (exact_value(br, uniform) - exact_value(uniform, br))
    assert abs(earned - exploitability(uniform, backend="python")) < 1e-9
    free, anchored = (mod.kuhn_curve(a, 0.15, 0.1, 120) for a in (0.0, 0.5))
    assert free[-1] < 0.035 and anchored[-1] > 0.09  # 0.031 and 0.101
    free_kuhn = free[-1]
    # the opponent is drawn per hand, so each set weighs the two by their reach (Kuhn's theorem); a
    # plain per-set average of their play would end at 0.111
    assert abs(anchored[-1] - 0.1007) < 0.002
    assert abs(anchored[-1] - anchored[-20]) < 1e-3  # settled, not cycling
    games = [np.asarray(random_game(g).payoff, dtype=float) for g in range(20)]
    free, anchored = ([mod.matrix_share(g, a, 0.15, 0.1, 120) for g in games] for a in (0.0, 0.5))
    assert np.median(free) < 0.03 < np.median(anchored) and max(anchored) > 0.08  # 0.028 / 0.049, worst 0.115
    # errors in the values (a table of sampled returns) keep the soft dynamics off their floor;
    # the noise is seeded, so the same seed gives the same curve
    noisy = [mod.kuhn_curve(0.0, 0.15, 0.1, 120, noise=0.2, seed=s) for s in (0, 0, 1)]
    assert noisy[0] == noisy[1] != noisy[2]
    assert min(np.mean(c[-30:]) for c in noisy) > 0.045 and free_kuhn < 0.035  # 0.059 - 0.074 against 0.031


def test_ideal_mirror_selfplay_of_the_research_script():
    """research/mirror_selfplay_ideal.py: with exact values, self-play that jumps to the smoothed best
    response each round (step 1) cycles far from equilibrium on Kuhn and the matrix games, while
    steps of 0.045 toward it (tau 0.15, the examples' ``--credit mirror``) converge within the
    examples' 96 rounds: the floor a trained run is measured against. On biased rock-paper-scissors
    (payoffs up to 2: equilibrium 1/4, 1/2, 1/4; uniform play is exploitable by 1/12 of the range)
    a step of 0.1 is too large and still swings, where 0.045 settles."""
    import numpy as np
    from autocurricula.games.matrix import BIASED_RPS, random_game

    mod = _load(ROOT / "research" / "mirror_selfplay_ideal.py", "mirror_ideal")
    assert min(mod.kuhn_curve(0.15, 1.0, 96)[24:]) > 0.2  # a cycle of four policies, 0.21 to 0.49
    mirror = mod.kuhn_curve(0.15, 0.045, 96)
    assert mirror[23] > mirror[-1] and mirror[-1] < 0.035  # uniform play: 0.458
    # deals weighted by games whose moves are a quarter uniform: the pooled values are no longer
    # the policy's, and the same steps end above the goal (0.055)
    assert round(mirror[-1], 4) == 0.0307  # unchanged by the explore option's code (0 by default)
    fixed_point = _load(ROOT / "research" / "kuhn_moves_fixed_point.py", "kuhn_fixed_point")
    uniform = dict.fromkeys(fixed_point.INFOSETS, 0.5)
    kings_bet = {**uniform, "K:": 0.9, "J:": 0.1}  # deals reached by a first seat that bets its kings
    plain, weighted = fixed_point.move_values(uniform), fixed_point.move_values(uniform, kings_bet)
    assert all(plain[k] == weighted[k] for k in ("J:", "Q:", "K:"))  # the first move: no one has acted
    assert weighted["Q:bet"][0] < plain["Q:bet"][0] == 0.0  # calling a bet with a queen: more kings behind it
    assert mod.kuhn_curve(0.15, 0.045, 96, explore=0.25)[-1] > 0.05
    jump = [mod.matrix_curve(np.array(random_game(g).payoff), 0.15, 1.0, 96)[-1] for g in range(20)]
    shares = [mod.matrix_curve(np.array(random_game(g).payoff), 0.15, 0.045, 96)[-1] for g in range(20)]
    assert np.median(jump) > 0.1 and np.median(shares) <= 0.03 and max(shares) <= 0.055  # 0.027 / 0.050
    rps = np.array(BIASED_RPS.payoff)
    jump, big, small = (mod.matrix_curve(rps, 0.15, step, 200) for step in (1.0, 0.1, 0.045))
    assert min(jump[100:]) > 0.2  # 0.249: near-pure replies chasing each other
    assert max(big[100:]) > 0.075  # swings between 0.043 and 0.133; settled would be below 0.0175
    assert max(small[150:]) < 0.0175


def test_averaged_iterates_of_the_mirror_research_script(capsys):
    """research/mirror_selfplay_ideal.py ``--average-last``: the uniform mixture of the last N
    iterates. One iterate is the last one; on Kuhn poker averaging rescues a step of 0.2, whose last
    iterate cycles (0.10 - 0.19), but not steps of 0.3 and more (research/results_history.md, one configuration
    for every game)."""
    import numpy as np
    from autocurricula.games.matrix import random_game

    mod = _load(ROOT / "research" / "mirror_selfplay_ideal.py", "mirror_ideal")
    for step, band in ((0.045, (0.02, 0.04)), (0.2, (0.03, 0.05)), (0.3, (0.05, 0.07)), (0.45, (0.055, 0.075))):
        iterates = mod.kuhn_iterates(0.15, step, 96)
        curve = mod.kuhn_curve(0.15, step, 96)
        assert mod.kuhn_average_exploitability(iterates, 1) == pytest.approx(curve[-1], abs=1e-12)
        assert band[0] < mod.kuhn_average_exploitability(iterates, 32) < band[1], step  # 0.032 0.041 0.054 0.061
        if step >= 0.2:
            assert max(curve[-24:]) > 0.18  # the last iterate cycles
    same = [dict.fromkeys(mod.INFOSETS, 0.3)] * 5
    assert mod.kuhn_average_exploitability(same, 5) == pytest.approx(mod.exploitability(same[0], backend="python"))
    # a hand drawn from one of two players, not a plain average per set: only the player that checks
    # a king reaches "K:check bet", so the mixture calls there as that player does (0.375, not 0.458)
    half = dict.fromkeys(mod.INFOSETS, 0.5)
    bets, checks = {**half, "K:": 1.0, "K:check bet": 0.0}, {**half, "K:": 0.0, "K:check bet": 1.0}
    drawn = mod.exploitability({**half, "K:check bet": 1.0}, backend="python")
    assert mod.kuhn_average_exploitability([bets, checks], 2) == pytest.approx(drawn)
    assert drawn < mod.exploitability(half, backend="python") - 0.05
    with pytest.raises(ValueError, match="last 1 to 5"):
        mod.kuhn_average_exploitability(same, 6)
    payoff = np.array(random_game(0).payoff)
    assert mod.matrix_curve(payoff, 0.15, 1.0, 96, average_last=1) == mod.matrix_curve(payoff, 0.15, 1.0, 96)
    jump = [mod.matrix_curve(np.array(random_game(g).payoff), 0.15, 1.0, 96, average_last=32)[-1] for g in range(20)]
    assert np.median(jump) < 0.06 < max(jump)  # 0.052 / 0.134, from 0.200 / 0.426 for the last iterate
    with pytest.raises(ValueError, match="at least 1"):
        mod.matrix_curve(payoff, 0.15, 1.0, 4, average_last=0)
    with pytest.raises(SystemExit):
        mod.main(["--step", "0.2", "--average-last", "97"])
    assert "--average-last N averages the last N of --rounds 96" in capsys.readouterr().err
    mod.main(["--step", "0.2", "--games", "2", "--rounds", "40", "--average-last", "1", "20"])
    row = __import__("json").loads(capsys.readouterr().out)
    assert row["average_last"]["1"]["kuhn"] == row["kuhn"]["last"] and set(row["average_last"]) == {"1", "20"}


def test_ideal_mirror_selfplay_on_tictactoe():
    """research/mirror_selfplay_ideal.py on tic-tac-toe: with exact values at every reachable position,
    steps of 0.045 from uniform legal play make the greedy policy unbeaten by the exact best response
    as X and O from round 4 (after round 1 it still loses as O), and the sampled policy's loss against
    its best response shrinks round by round (measured: -0.90 / -0.99 after round 1, -0.21 / -0.69
    after round 16). Stepping only the positions of a round's sampled games is far slower."""
    mod = _load(ROOT / "research" / "mirror_selfplay_ideal.py", "mirror_ideal")
    curve = mod.tictactoe_curve(0.15, 0.045, 16)
    assert curve[0]["loses_as_o"] and not any(r["loses_as_x"] or r["loses_as_o"] for r in curve[3:])
    worst = [r["sampled_vs_best_response_as_o"] for r in curve]
    assert worst[0] < -0.95 and -0.8 < worst[-1] < -0.6 and all(b >= a for a, b in zip(worst, worst[1:]))
    # on this curve, value-losing positions (measured: 0.038 after round 1) are gone exactly when it
    # is unbeaten
    assert curve[0]["value_losing_share"] > 0.02
    assert all((r["value_losing_share"] > 0) == (r["loses_as_x"] or r["loses_as_o"]) for r in curve)
    summary = mod.tictactoe_summary(0.15, 0.045, 8)
    assert summary["greedy_unbeaten_from_round"] == 4 and summary["value_losing_share_every_8_rounds"] == [0.0]
    # only the positions of 128 sampled games a round: after 8 rounds greedy play still loses
    # (measured: 0.156 of its positions value-losing)
    sampled = mod.tictactoe_curve(0.15, 0.045, 8, games=128)[-1]
    assert (sampled["loses_as_x"] or sampled["loses_as_o"]) and sampled["value_losing_share"] > 0.1


def test_model_policy_of_the_tictactoe_diagnosis(tiny_model_path, capsys, monkeypatch):
    """research/mirror_selfplay_ideal.py's ``model_policy`` (the warm start of ``--from-warm-base``):
    each legal move's probability, renormalised over the legal moves, is what the model's full
    logits give its tokens and end of sequence, in ``legal_moves`` order."""
    import numpy as np

    from autocurricula.engine import Engine
    from autocurricula.games.tictactoe import legal_moves, render_prompt

    mod = _load(ROOT / "research" / "mirror_selfplay_ideal.py", "mirror_ideal")
    boards = {".........": "X", "X...O....": "X", "XO.XO....": "X", "XOX.O.X..": "O"}
    read = mod.model_policy(str(tiny_model_path), boards=list(boards))
    assert set(read) == set(boards)
    engine = Engine(str(tiny_model_path), name="base")
    try:
        tok = engine.tokenizer
        for board, mark in boards.items():
            prompt, logps = engine.encode(render_prompt(board, mark)), []
            for m in legal_moves(board):
                ids = list(tok.encode(str(m), add_special_tokens=False)) + [tok.eos_token_id]
                logits = engine.logits(prompt + ids[:-1]).astype(np.float64)
                rows = logits[len(prompt) - 1:]
                rows = rows - rows.max(axis=1, keepdims=True)
                lp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
                logps.append(sum(lp[i, t] for i, t in enumerate(ids)))
            want = np.exp(np.array(logps) - max(logps))
            np.testing.assert_allclose(read[board], want / want.sum(), rtol=1e-4, atol=1e-6)
    finally:
        engine.close()
    # a start that plays the optimal moves (0.9 of the mass) is unbeaten after a round; uniform is not
    from autocurricula.games.tictactoe import optimal_moves, reachable_positions

    start = {b: np.array([9.0 if m in optimal_moves(b, mk) else 1.0 for m in legal_moves(b)])
             for b, mk in reachable_positions()}
    good = mod.tictactoe_curve(0.15, 0.045, 1, games=8, samples=1, start=start)[0]
    assert not (good["loses_as_x"] or good["loses_as_o"]) and good["value_losing_share"] == 0.0
    assert mod.tictactoe_curve(0.15, 0.045, 1, games=8, samples=1)[0]["loses_as_o"]
    with pytest.raises(SystemExit):
        mod.main(["--from-warm-base"])
    assert "add --tictactoe" in capsys.readouterr().err
    # --from-warm-base reads the seed's warm base and starts every variant from it
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import ttt_common

    seen = []
    monkeypatch.setattr(ttt_common, "warm_base", lambda seed, progress: Path(f"warm-{seed}"))
    monkeypatch.setattr(mod, "model_policy", lambda base: {"read": base})
    monkeypatch.setattr(mod, "tictactoe_summary", lambda *a, **options: seen.append(options) or {})
    mod.main(["--tictactoe", "--from-warm-base", "--seed", "2", "--games", "1", "--step", "0.045", "--rounds", "1",
              "--variants", "256_games_1_sample", "128_games_exact"])
    assert [o["start"] for o in seen] == [{"read": "warm-2"}] * 2 and [o["seed"] for o in seen] == [2, 2]


def test_worst_known_values_of_the_tictactoe_diagnosis():
    """research/mirror_selfplay_ideal.py's minimax table: with every reply of a subtree in the graph
    it is the exact minimax value (negamax here, independently); with only the opponent's weaker
    reply known it is that reply's outcome, higher than the truth."""
    from autocurricula.games.tictactoe import apply_move, legal_moves, winner

    mod = _load(ROOT / "research" / "mirror_selfplay_ideal.py", "mirror_ideal")

    def mark(board):
        return "X" if board.count("X") == board.count("O") else "O"

    def negamax(after):  # for the player who just moved
        end = winner(after)
        if end is not None:
            return 0.0 if end == "draw" else 1.0
        return -max(negamax(apply_move(after, m, mark(after))) for m in legal_moves(after))

    def full(board, graph):
        if winner(board) is None:
            graph[board] = {apply_move(board, m, mark(board)) for m in legal_moves(board)}
            for child in graph[board]:
                full(child, graph)
        return graph

    for after in ("XO.X.O...", "X...O....", "XX..O....", "X.O.X...O"):  # X or O just moved
        assert mod.worst_known(after, full(after, {})) == negamax(after)
    # X moved to XX..O....: O must block at 3 (then a draw). Knowing only O's weak reply at 9, after
    # which X wins at 3, the table says X's move wins
    after, weak = "XX..O....", "XX..O...O"
    graph = {after: {weak}, weak: {apply_move(weak, 3, "X")}}
    assert mod.worst_known(after, graph) == 1.0 and negamax(after) < 1.0
    with pytest.raises(ValueError, match="give samples"):
        mod.tictactoe_curve(0.15, 0.045, 1, games=4, minimax=True)
    with pytest.raises(ValueError, match="explore"):
        mod.tictactoe_curve(0.15, 0.045, 1, games=4, explore=1.0)
    with pytest.raises(ValueError, match="give games"):
        mod.tictactoe_curve(0.15, 0.045, 1, explore=0.1)
    with pytest.raises(ValueError, match="pick one"):
        mod.tictactoe_curve(0.15, 0.045, 1, games=4, samples=1, minimax=True, greedy_playouts=True)
    for options in mod.TICTACTOE_VARIANTS.values():  # every diagnosis runs (2 rounds of 8 games)
        curve = mod.tictactoe_curve(0.15, 0.045, 2, **{**options, "games": options.get("games") and 8})
        assert len(curve) == 2 and all(r["loses_as_o"] for r in curve)  # uniform play still loses


def test_ideal_kuhn_psro_of_the_research_script():
    """research/kuhn_psro_ideal.py: its exact response earns what the exact best response does, in
    each seat, and PSRO with exact responses reaches the equilibrium from uniform play."""
    from autocurricula.eval import kuhn
    from autocurricula.games.kuhn_poker import exact_value

    mod = _load(ROOT / "research" / "kuhn_psro_ideal.py", "kuhn_ideal")
    rng = __import__("random").Random(0)
    for _ in range(3):
        opponent = {k: rng.random() for k in kuhn.INFOSETS}
        mine = mod.response(opponent, 0.0, 0.0)
        assert exact_value(mine, opponent) == pytest.approx(kuhn.best_response_value(opponent, 0))
        assert -exact_value(opponent, mine) == pytest.approx(kuhn.best_response_value(opponent, 1))
    figures = mod.curve(dict.fromkeys(kuhn.INFOSETS, 0.5), 0.0, 0.0, 12)
    assert figures[0] == pytest.approx(0.4583, abs=1e-4)  # uniform play
    assert figures[-1] == pytest.approx(0.0, abs=1e-9)
    # a smoothed response stops short: the mixture keeps the softmax target's error
    assert mod.curve(dict.fromkeys(kuhn.INFOSETS, 0.5), 0.25, 2.0, 12)[-1] > 0.03
    # unbounded, a visit's logit is linear in its values: the mean over visits is the set's own target
    assert mod.curve(mod.WARM_BASE, 0.25, math.inf, 6, True) == pytest.approx(mod.curve(mod.WARM_BASE, 0.25, math.inf, 6))
    # bounded per visit (the opponent's card known), the sharp target stalls where the set's reaches 0.02
    assert min(mod.curve(mod.WARM_BASE, 0.1, 3.0, 12, True)) > 0.05 > 0.02 > mod.curve(mod.WARM_BASE, 0.1, 3.0, 12)[-1]


def test_mirror_fit_figures_of_the_research_script(tiny_model_path):
    """research/mirror_fit.py: a state's reach is the share of the mirror target's step (in centred
    log-probabilities) that the update took, and one round at an almost-zero rate reaches nothing of
    its targets while the configuration's rate moves them; both variants get the same targets (on this
    unwarmed model mostly the pull toward the base policy; on warm bases the script reports
    same_targets_as_first)."""
    import argparse

    import numpy as np

    mod = _load(ROOT / "research" / "mirror_fit.py", "mirror_fit")
    before = np.log([0.5, 0.3, 0.2])
    target = [0.6, 0.3, 0.1]
    reach, miss, kl0, kl1 = mod.state_figures(target, before, np.log(target))
    assert reach == pytest.approx(1.0) and miss == pytest.approx(0.0, abs=1e-9) and kl1 == pytest.approx(0.0, abs=1e-12)
    assert kl0 > 0
    half = before + 0.5 * (np.log(target) - before)
    assert mod.state_figures(target, before, half)[0] == pytest.approx(0.5)
    assert mod.state_figures(target, before, before)[:2] == (0.0, 0.0)
    d = np.log(target) - before
    d -= d.mean()
    side = np.cross(d, np.ones(3))  # centred and orthogonal to the target's direction
    reach, miss, _, _ = mod.state_figures(target, before, before + side)
    assert reach == pytest.approx(0.0, abs=1e-9) and miss > 0.1
    assert mod.parse_variants("1x1, 8x0.5") == [(1, 1.0), (8, 0.5)]
    for bad in ("8", "0x1", "1x0"):
        with pytest.raises(SystemExit):
            mod.parse_variants(bad)
    from autocurricula.games.matrix import random_game

    assert mod.lora_spec("qv").target_modules == ["q_proj", "v_proj"]
    wide = mod.lora_spec("all:16")
    assert (wide.r, wide.lora_alpha, wide.target_modules) == (16, 32.0, "all-linear")
    for bad in ("all", "all:0", "qk:8"):
        with pytest.raises(SystemExit):
            mod.lora_spec(bad)
    assert mod.cosine(mod.direction(target, before), d) == pytest.approx(1.0)
    args = argparse.Namespace(games_per_round=16, branch_samples=1, steps_per_generation=4, seed=0,
                              once_per_state=False, lora="qv", exact=False, train_on="sampled")
    rows = {}
    for passes, rate in ((1, 1e-7), (4, 1.0)):
        states, _, _ = mod.one_round(tiny_model_path, random_game(0), {}, args, passes, rate)
        rows[passes] = states
        figures = mod.summary([(v[0], *mod.state_figures(list(v[1].values()), v[2], v[3])) for v in states.values()])
        assert figures["states"] == 2  # one prompt per seat
        if passes == 1:  # before = the base (a LoRA starts at zero), after = the player's adapter
            assert abs(figures["reach_median"]) < 1e-3 and abs(figures["kl_closed"]) < 1e-3
        else:  # an unwarmed model mostly learns to write the listed words: the figures only move
            assert abs(figures["kl_closed"]) > 0.05
    assert rows[1].keys() == rows[4].keys() and all(rows[1][k][1] == pytest.approx(rows[4][k][1]) for k in rows[1])


def test_exact_move_values_of_tictactoe():
    """research/mirror_selfplay_ideal.py's exact move values under a policy (uniform play: X's first
    moves average 0.585 - 0.288, the known win and loss rates of random tic-tac-toe; a winning move
    is worth 1)."""
    import numpy as np

    from autocurricula.games.tictactoe import legal_moves, reachable_positions

    ideal = _load(ROOT / "research" / "mirror_selfplay_ideal.py", "mirror_selfplay_ideal")
    positions = dict(reachable_positions())
    uniform = {b: np.full(len(legal_moves(b)), 1 / len(legal_moves(b))) for b in positions}
    q = ideal.exact_move_values(uniform, positions, ["." * 9, "XX.OO...."])
    assert np.mean(q["." * 9]) == pytest.approx(0.5849 - 0.2881, abs=2e-4)
    moves = legal_moves("XX.OO....")
    assert q["XX.OO...."][moves.index(3)] == 1.0  # X completes the top row
    assert all(v < 1.0 for m, v in zip(moves, q["XX.OO...."]) if m != 3)


def test_mirror_fit_exact_rows():
    """research/mirror_fit.py --exact's figures: a policy that lands on the exact targets at the
    visited boards reaches 1 there (aligned, all of KL closed) and 0 elsewhere; sampled targets equal
    to the exact ones have value cosine 1, and otherwise the cosine of the centred values (with the
    policy's share of the step taken out); targets are read in the moves' order, whatever the dict's."""
    import numpy as np

    from autocurricula.credit import MirrorCredit, mirror_distribution

    mod = _load(ROOT / "research" / "mirror_fit.py", "mirror_fit")
    credit, rng = MirrorCredit(), np.random.default_rng(0)
    base = {f"b{i}": rng.dirichlet(np.ones(n)) for i, n in enumerate((2, 3, 4, 5, 3, 4, 1))}
    q = {b: list(rng.uniform(-1, 1, len(p))) for b, p in base.items()}
    exact = {b: mirror_distribution(q[b], list(np.log(p)), credit.move_temperature, credit.move_clip, credit.step)
             for b, p in base.items()}
    visited = {b: (1, exact[b]) for b in ("b0", "b1", "b2")}
    after = {b: np.asarray(exact[b]) if b in visited else p for b, p in base.items()}
    out = mod.exact_rows(base, after, q, visited, credit)
    assert out["visited"]["states"] == 3 and out["unvisited"]["states"] == 3  # one-move boards are skipped
    v, u = out["visited"], out["unvisited"]
    assert v["reach_median"] == pytest.approx(1) and v["kl_closed"] == pytest.approx(1)
    assert v["alignment_median"] == pytest.approx(1) and v["sampled_alignment_median"] == pytest.approx(1)
    assert v["value_cosine_median"] == pytest.approx(1) and v["sampled_step_median"] == pytest.approx(v["exact_step_median"])
    assert u["reach_median"] == pytest.approx(0, abs=1e-9) and u["kl_closed"] == pytest.approx(0, abs=1e-9)
    # one visited board, moved part way to the exact target plus a part off it, with other sampled targets
    lb = np.log(base["b2"])
    d_e = mod.direction(exact["b2"], lb)
    side = np.array([1.0, -1.0, 1.0, -1.0]) - np.dot([1.0, -1.0, 1.0, -1.0], d_e) / np.dot(d_e, d_e) * d_e
    moved = np.exp(lb + 0.5 * d_e + 0.3 * side)
    noisy = mirror_distribution(list(rng.uniform(-1, 1, 4)), list(lb), credit.move_temperature, credit.move_clip,
                                credit.step)
    part = mod.exact_rows({"b2": base["b2"], "b4": base["b4"], "b5": base["b5"]},
                          {"b2": moved, "b4": base["b4"], "b5": base["b5"]}, q, {"b2": (1, noisy)}, credit)["visited"]
    d_u, d_s = np.log(moved) - lb - np.mean(np.log(moved) - lb), mod.direction(noisy, lb)
    assert part["reach_median"] == pytest.approx(0.5, abs=1e-4)
    assert part["alignment_median"] == pytest.approx(mod.cosine(d_u, d_e), abs=1e-4)
    assert part["alignment_median"] < 0.99  # the cosine, not the reach
    assert part["sampled_alignment_median"] == pytest.approx(mod.cosine(d_u, d_s), abs=1e-4)
    assert part["exact_step_median"] == pytest.approx(np.linalg.norm(d_e), abs=1e-4)
    assert part["sampled_step_median"] == pytest.approx(np.linalg.norm(d_s), abs=1e-4)
    norms = [np.linalg.norm(mod.direction(exact[b], np.log(base[b]))) for b in ("b3", "b4", "b5")]
    assert u["exact_step_median"] == pytest.approx(float(np.median(norms)), abs=1e-4)  # b6 (one move) skipped
    other = list(rng.uniform(-1, 1, 5))
    sampled = mirror_distribution(other, list(np.log(base["b3"])), credit.move_temperature, credit.move_clip, credit.step)
    one = mod.exact_rows({"b3": base["b3"]}, {"b3": base["b3"]}, q, {"b3": (1, sampled)}, credit)
    centred = lambda x: np.asarray(x) - np.mean(x)  # noqa: E731
    assert one["visited"]["value_cosine_median"] == pytest.approx(mod.cosine(centred(other), centred(q["b3"])), abs=1e-4)  # medians are rounded
    d = np.array([1.0, -2.0, 1.0])
    assert mod.cosine(d, -d) == pytest.approx(-1) and mod.cosine(d, np.array([1.0, 0.0, -1.0])) == pytest.approx(0)
    assert math.isnan(mod.cosine(d, np.zeros(3)))

    class Tok:  # a move's tokens: its digit's code; end of sequence 0
        eos_token_id = 0

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    targets = {(ord("7"), 0): 0.2, (ord("3"), 0): 0.5, (ord("9"), 0): 0.3}
    assert mod.in_move_order(targets, [3, 7, 9], Tok()) == [0.5, 0.2, 0.3]

    from autocurricula.records import Turn  # --train-on exact: the update gets the given targets

    turns = [Turn(player="a", game_id="g", role="X", prompt_ids=[5], completion_ids=[m, 0], logprobs=[0.0, 0.0],
                  advantage=0.5) for m in (1, 2)]
    credit = mod.RecordingMirror(train_on={((5,), (1, 0)): 0.9, ((5,), (2, 0)): 0.1})
    credit._targets = list(turns)  # what the round's branch games produced
    assert [t.advantage for t in credit.extra_turns(turns)] == [0.9, 0.1]
    assert [t.advantage for t in credit.recorded] == [0.5, 0.5]  # the figures keep the sampled targets


def test_mirror_fit_exact_figures_of_a_round(tiny_model_path):
    """``--exact`` end to end on the tiny model: every position with a choice is measured, a round at
    an almost-zero rate reaches none of the exact targets, and one at the configuration's rate moves
    them (the player is read through its adapter); 4 minutes, the model scores all 4,520 positions
    twice a round."""
    import argparse

    sys.path.insert(0, str(ROOT / "examples"))
    from ttt_common import OpeningGame

    mod = _load(ROOT / "research" / "mirror_fit.py", "mirror_fit")
    args = argparse.Namespace(games_per_round=2, branch_samples=1, steps_per_generation=1, seed=0,
                              once_per_state=False, lora="qv", exact=True, train_on="sampled")
    for rate in (1e-7, 1.0):
        states, _, exact = mod.one_round(tiny_model_path, OpeningGame((0, 4)), {"max_tokens": 2}, args, 1, rate)
        assert exact["visited"]["states"] == len([v for v in states.values() if len(v[1]) > 1])
        assert exact["visited"]["states"] + exact["unvisited"]["states"] == 4298  # every position with a choice
        moved = max(abs(exact[part]["kl_closed"]) for part in ("visited", "unvisited"))
        assert (moved < 1e-3) if rate < 1e-3 else (moved > 1e-3)


def test_mirror_replay_keeps_the_last_rounds_targets():
    """research/mirror_replay.py: the update takes this round's move targets and those of the
    keep_rounds - 1 rounds before it, only for the players that played this round."""
    from autocurricula.records import Turn

    mod = _load(ROOT / "research" / "mirror_replay.py", "mirror_replay")
    credit = mod.ReplayMirror(keep_rounds=2)
    rounds = [[Turn(player="a", game_id=str(r), role="p", prompt_ids=[r], completion_ids=[1], logprobs=[0.0])] for r in range(3)]
    seen = []
    for r, targets in enumerate(rounds):
        credit._targets = list(targets)  # what the round's branch games produced
        seen.append([t.prompt_ids[0] for t in credit.extra_turns(targets)])
    assert seen == [[0], [0, 1], [1, 2]]
    credit._targets = []
    assert credit.extra_turns([Turn(player="b", game_id="9", role="p", prompt_ids=[9], completion_ids=[1], logprobs=[0.0])]) == []
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="keep_rounds"):
            mod.ReplayMirror(keep_rounds=bad)


def test_league_config_elsewhere_takes_the_tictactoe_leagues_settings(tmp_path):
    """research/league_config_elsewhere.py: the tic-tac-toe league example's update and credit (q
    targets, 4 steps a round, 2e-3 decayed over the last quarter, LoRA r8 on all linears), with the
    mean backup and each exploiter at an eighth of the main agent's games."""
    import argparse

    mod = _load(ROOT / "research" / "league_config_elsewhere.py", "league_elsewhere")
    from autocurricula.credit import MirrorCredit
    from autocurricula.games import kuhn_poker

    args = argparse.Namespace(epochs=3, rounds=2, seed=5, games_per_round=128, snapshot_min_rounds=None,
                              snapshot_max_rounds=None, random_anchor=False, soft_targets=None,
                              targets_only=False, off_target=False, round_step=None, listed=False, alpha=None, anchor_off_table=False,
                              per_player=False, selfplay_share=None, mirror_step=None,
                              branch_samples=None, meta_z=None, loss_type=None, exploiter_games=None)
    trainer, keywords = mod.league(args, str(tmp_path), kuhn_poker)
    config, grpo, lora = trainer.config, keywords["grpo_config"], keywords["lora_config"]
    rules = config.rules
    assert (config.epochs, config.rounds, config.seed) == (3, 2, 5)
    assert (rules.games_per_learner, rules.exploiter_games, rules.main_exploiters, rules.league_exploiters) \
        == (128, 16, 1, 1)
    assert (config.credit.name, config.credit.target_coef, config.credit.backup) == ("q", 1.0, "mean")
    assert (grpo.learning_rate, grpo.lr_scheduler_type, grpo.lr_decay_ratio, grpo.steps_per_generation, grpo.beta) \
        == (2e-3, "warmup_stable_decay", 0.25, 4, 0.0)
    assert (lora.r, lora.target_modules) == (8, "all-linear") and grpo.loss_type == "grpo"
    args.loss_type = "dapo"  # --loss-type swaps only the loss
    swapped = mod.league(args, str(tmp_path), kuhn_poker)[1]["grpo_config"]
    assert swapped.loss_type == "dapo" and swapped.learning_rate == grpo.learning_rate
    args.loss_type = None
    args.exploiter_games = 128  # --exploiter-games sets each exploiter's games a round
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.rules.exploiter_games == 128
    args.exploiter_games = None
    assert trainer.opponents == [] and rules.anchor_share == 0  # no scripted players, no anchor games
    assert (rules.snapshot_min_rounds, rules.snapshot_max_rounds) == (2, 4)  # LeagueRules' defaults
    # the example's own command line: the flags the script passes are tictactoe_league.py's set_defaults
    example = (ROOT / "examples" / "tictactoe_league.py").read_text()
    assert 'parser.set_defaults(q_backup="minimax", steps_per_generation=4, epochs=12, ' \
        'lr_schedule="warmup_stable_decay")' in example
    assert 'default=0.5, help="main agent: share of games against the' in example  # its --anchor-share
    args.snapshot_min_rounds, args.snapshot_max_rounds = 4, 8
    rules = mod.league(args, str(tmp_path), kuhn_poker)[0].config.rules
    assert (rules.snapshot_min_rounds, rules.snapshot_max_rounds) == (4, 8)
    args.random_anchor = True  # the example's anchor: the game's own random player, half the main agent's games
    trainer = mod.league(args, str(tmp_path), kuhn_poker)[0]
    assert [(p["id"], p["policy"]) for p in trainer.opponents] == [("random", kuhn_poker.random_policy)]
    assert trainer.config.rules.anchor_share == mod.ANCHOR_SHARE == 0.5
    args.soft_targets = 0.15  # the same settings with targets toward softmax(Q / 0.15)
    credit = mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit
    assert isinstance(credit, mod.SoftQCredit) and (credit.tau, credit.target_coef, credit.backup) == (0.15, 1.0, "mean")
    assert not credit.targets_only
    args.targets_only = True
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit.targets_only
    assert not credit.off_target
    args.off_target = True
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit.off_target
    assert credit.round_step is None
    args.round_step = 0.045
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit.round_step == 0.045
    assert not credit.listed
    args.listed = True  # the game's moves named to the credit by a callback
    with_moves, listed_keywords = mod.league(args, str(tmp_path), kuhn_poker)
    assert with_moves.config.credit.listed and [type(c) for c in listed_keywords["callbacks"]] == [mod.ListedMoves]
    args.listed = False
    assert credit.alpha == 0.95  # ValueCredit's
    args.alpha = 0.99
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit.values.alpha == 0.99
    assert not credit.per_player
    args.per_player = True
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit.values.per_player
    assert (config.rules.selfplay_share, config.rules.pfsp_share) == (0.35, 0.5)  # LeagueRules' defaults
    args.selfplay_share = 1.0  # the main agent plays only itself
    rules = mod.league(args, str(tmp_path), kuhn_poker)[0].config.rules
    assert (rules.selfplay_share, rules.pfsp_share) == (1.0, 0.0)
    assert keywords["callbacks"] == []
    args.anchor_off_table = True  # the random player's games named to the credit each round
    trainer, keywords = mod.league(args, str(tmp_path), kuhn_poker)
    [named] = keywords["callbacks"]
    assert isinstance(named, mod.AnchorGames) and trainer.config.credit.anchor_games
    args.soft_targets, args.alpha, args.per_player, args.mirror_step = None, None, False, 1.0  # branch values
    credit = mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit
    assert isinstance(credit, MirrorCredit) and (credit.step, credit.move_temperature, credit.samples) == (1.0, 0.075, 2)
    args.branch_samples = 8
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.credit.samples == 8
    assert config.ratings.meta_z == 1.0  # RatingConfig's
    args.meta_z = 0.0  # the deployed mixture solved on the means
    assert mod.league(args, str(tmp_path), kuhn_poker)[0].config.ratings.meta_z == 0.0


@pytest.mark.parametrize("argv, fix", [
    (["--soft-targets", "0"], "temperature above 0"),
    (["--selfplay-share", "1.5"], "share in [0, 1]"),
    (["--alpha", "1"], "[0, 1)"),
    (["--targets-only"], "add --soft-targets TAU"),
    (["--soft-targets", "0.15", "--off-target"], "add --targets-only"),
    (["--round-step", "0.05"], "add --soft-targets TAU"),
    (["--listed"], "add --soft-targets TAU"),
    (["--replies"], "use it with --game matrix"),
    (["--soft-targets", "0.15", "--round-step", "0"], "weight in (0, 1]"),
    (["--soft-targets", "0.15", "--anchor-off-table"], "add --random-anchor"),
    (["--mirror-step", "0"], "step in (0, 1]"),
    (["--branch-samples", "4"], "add --mirror-step W"),
    (["--meta-z", "-1"], "standard errors >= 0"),
    (["--mirror-step", "1", "--branch-samples", "0"], "at least 1 branch game per move"),
    (["--mirror-step", "1", "--soft-targets", "0.15"], "--soft-targets set the value table's credit"),
    (["--exploiter-games", "0"], "1 or more games a round"),
])
def test_league_config_elsewhere_refuses_settings_that_do_nothing(argv, fix, capsys):
    """Each research flag that needs another, or a value out of range, stops the script before any
    game with an error that names the flag to add or the range."""
    mod = _load(ROOT / "research" / "league_config_elsewhere.py", "league_elsewhere")
    with pytest.raises(SystemExit) as stop:
        mod.main(["--game", "kuhn", *argv])
    assert stop.value.code == 2 and fix in capsys.readouterr().err


def test_league_config_elsewhere_passes_the_branch_settings_on(capsys, monkeypatch):
    """A valid --mirror-step run gets past every check with its branch games and meta-solver setting,
    and the summary line records them (the run itself replaced by a stub)."""
    import json

    mod = _load(ROOT / "research" / "league_config_elsewhere.py", "league_elsewhere_valid")
    seen = []
    monkeypatch.setattr(mod, "kuhn", lambda args: seen.append(args) or {"final": None})
    mod.main(["--game", "kuhn", "--mirror-step", "1", "--branch-samples", "8", "--meta-z", "0"])
    [args] = seen
    assert (args.mirror_step, args.branch_samples, args.meta_z) == (1.0, 8, 0.0)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["mirror_step"], summary["branch_samples"], summary["meta_z"]) == (1.0, 8, 0.0)


@pytest.mark.parametrize("argv, fix", [
    (["--off-target"], "add --targets-only"),
    (["--round-step", "0"], "weight in (0, 1]"),
    (["--tau", "0"], "--tau must be above 0"),
    (["--", "--credit", "value"], "--credit at q"),
])
def test_soft_targets_script_refuses_settings_that_do_nothing(argv, fix, capsys):
    """research/soft_targets.py stops before the example's warm-up, naming the flag to add or its range."""
    mod = _load(ROOT / "research" / "soft_targets.py", "soft_targets_research")
    with pytest.raises(SystemExit) as stop:
        mod.main(argv)
    assert stop.value.code == 2 and fix in capsys.readouterr().err


@pytest.mark.parametrize("anchor", [[], ["--random-anchor"], ["--mirror-step", "1", "--branch-samples", "1"]])
def test_league_config_elsewhere_smoke(anchor, tmp_path):
    """The research script runs end to end on a tiny budget (one matrix game), with and without the
    game's random player as the anchor, and with branch values in place of the table, and prints the
    game's row and a summary of it."""
    import json
    import os

    out = subprocess.run([sys.executable, str(ROOT / "research" / "league_config_elsewhere.py"), "--game", "matrix",
                          "--smoke", *anchor], capture_output=True, text=True, timeout=280, cwd=ROOT,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.stdout.strip().splitlines()[:-1]]
    assert [r["game"] for r in rows] == ["random-0"] and len(rows[0]["mixture"]) >= 1
    assert last["summary"]["worst"] == rows[0]["exploitability_share"] and 0 <= last["summary"]["worst"] <= 1
    assert abs(sum(rows[0]["mixture"].values()) - 1) < 0.01  # the deployed mixture's weights, rounded
    assert last["random_anchor"] is ("--random-anchor" in anchor)
    assert (last["mirror_step"], last["branch_samples"]) == ((1.0, 1) if "--mirror-step" in anchor else (None, None))


@pytest.mark.parametrize("variant", [["--off-target", "--listed", "--replies"],
                                     ["--random-anchor", "--anchor-off-table"]])
def test_league_config_elsewhere_soft_targets_smoke(variant, tmp_path):
    """The soft-target variants run end to end (one matrix game): targets over the listed moves with
    the other replies' advantages kept (and the main agent's replies read per seat), or the anchor's
    games kept out of the table through the trainer's own credit; the summary records the settings."""
    import json
    import os

    out = subprocess.run([sys.executable, str(ROOT / "research" / "league_config_elsewhere.py"), "--game", "matrix",
                          "--smoke", "--soft-targets", "0.15", "--targets-only", "--alpha", "0.99", *variant],
                         capture_output=True, text=True, timeout=280, cwd=ROOT,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert (last["soft_targets"], last["targets_only"], last["alpha"]) == (0.15, True, 0.99)
    assert last["anchor_off_table"] is ("--anchor-off-table" in variant) and 0 <= last["summary"]["worst"] <= 1
    assert last["off_target"] is last["listed"] is ("--off-target" in variant)
    [row] = [json.loads(line) for line in out.stdout.strip().splitlines()[:-1]]
    if "--replies" in variant:  # per seat: each word's probability, the invalid rest, the likeliest tokens
        assert [len(seat["words"]) for seat in row["main_agent_replies"]] == list(row["shape"])
        for seat in row["main_agent_replies"]:
            assert abs(sum(seat["words"].values()) + seat["invalid"] - 1) < 0.01 and len(seat["top_tokens"]) == 8
    else:
        assert "main_agent_replies" not in row


@pytest.mark.timeout(900)
def test_soft_targets_tictactoe_smoke(tmp_path):
    """research/soft_targets.py runs the tic-tac-toe league example with soft targets alone (over the
    listed moves, other replies keeping their advantages): one short epoch, the example's final JSON
    line after the script's own settings line."""
    import json
    import os

    out = subprocess.run([sys.executable, str(ROOT / "research" / "soft_targets.py"), "--tau", "0.15",
                          "--targets-only", "--off-target", "--listed", "--", "--epochs", "1", "--rounds", "1", "--games-per-learner", "4",
                          "--eval-games", "200", "--output-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=880, cwd=ROOT,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[0]) == {"soft_targets": 0.15, "targets_only": True, "off_target": True, "round_step": None,
                                    "listed": True, "backup": "minimax", "target_coef": 1.0}
    summary = json.loads(lines[-1])
    assert summary["epochs"] == 1 and "loses_to_best_response_as_o" in summary
    assert summary["credit_class"] == "SoftQCredit"  # the credit it trained with, not --credit's
    bad = subprocess.run([sys.executable, str(ROOT / "research" / "soft_targets.py"), "--", "--credit", "value"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--credit at q" in bad.stderr


@pytest.mark.timeout(900)  # reading an untrained tiny model's reply trees takes minutes
def test_league_config_elsewhere_kuhn_smoke(tmp_path):
    """The research script's Kuhn path: one epoch on the tiny smoke model, scored as played."""
    import json
    import os

    out = subprocess.run([sys.executable, str(ROOT / "research" / "league_config_elsewhere.py"), "--game", "kuhn",
                          "--smoke"], capture_output=True, text=True, timeout=880, cwd=ROOT,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    final = json.loads(out.stdout.strip().splitlines()[-1])["summary"]["final"]
    assert (final["trainer"], final["epoch"]) == ("league_q", 0)
    assert 0 <= final["exploitability"] <= 2 and 0 <= final["invalid_rate"] <= 1  # chips per hand; a share
    main = json.loads(out.stdout.strip().splitlines()[-1])["summary"]["main_agent"]
    assert main["epoch"] == 0 and 0 <= main["main_agent"]["exploitability"] <= 2


def test_league_config_elsewhere_scores_the_main_agent_and_its_snapshots():
    """The research script's per-epoch figures beside the mixture: the live main agent alone, and
    its snapshots drawn uniformly (not the exploiters, not other players' snapshots)."""
    from types import SimpleNamespace

    from autocurricula.records import Player

    mod = _load(ROOT / "research" / "league_config_elsewhere.py", "league_elsewhere_main")
    players = [Player(id="main_agent-0", role="main_agent", frozen=False),
               Player(id="main_agent-1", role="main_agent", frozen=True, snapshot_of="main_agent-0"),
               Player(id="main_agent-2", role="main_agent", frozen=True, snapshot_of="main_agent-0"),
               Player(id="main_exploiter-0", role="main_exploiter", frozen=False),
               Player(id="main_exploiter-1", role="main_exploiter", frozen=True, snapshot_of="main_exploiter-0")]
    elo = SimpleNamespace(rating=lambda pid: 1000.0)
    trainer = SimpleNamespace(players=players, standings=SimpleNamespace(elo=elo), engine=None,
                              run=SimpleNamespace(grpo=SimpleNamespace(temperature=1.0)), current_epoch=3)
    value = {"main_agent-0": 0.5, "main_agent-1": 0.1, "main_agent-2": 0.3, "main_exploiter-1": 9.0}
    reads = []

    def read(engine, pid, temperature):  # a one-set strategy: {set: (P(bet or call), invalid)}
        reads.append(pid)
        return {"K:": (value[pid], 0.0)}, 0.0

    def mixture(strategies, weights):
        return sum(w * s["K:"][0] for s, w in zip(strategies, weights))

    figures = SimpleNamespace(read=read, mixture=mixture, score=lambda mix: {"exploitability": mix})
    assert mod.MainAgentFigures(figures).last == 4  # the last third of 12 epochs, as mirror self-play deploys
    main = mod.MainAgentFigures(figures, last=2)
    main(trainer)
    value["main_agent-0"] = 0.7  # the live main agent moves between epochs
    main(trainer)
    assert main.rows[-1] == {"epoch": 3, "main_agent": {"exploitability": 0.7}, "main_agent_policy": {"K:": 0.7},
                             "snapshots": 2, "snapshot_average": {"exploitability": 0.2},
                             "last_epochs_average": {"epochs": 2, "exploitability": 0.6}}
    assert reads.count("main_agent-0") == 2 and reads.count("main_agent-1") == 1  # snapshots are frozen: read once
    value["main_agent-0"] = 0.1
    main(trainer)  # the window keeps the last two epochs' reads: 0.7 and 0.1
    assert main.rows[-1]["last_epochs_average"] == {"epochs": 2, "exploitability": 0.4}


def test_population_nash_finds_the_equilibrium_member_and_reads_frozen_players_once():
    """research/league_config_elsewhere.py's diagnostic: the exact Nash over every trained player picks
    a Nash strategy out of a population that holds one, scores it as played (invalid replies kept), and
    reads frozen players once and live learners every epoch; scripted players stay out."""
    from types import SimpleNamespace

    from autocurricula.eval.kuhn import INFOSETS, exploitability, played_exploitability, played_mixture

    mod = _load(ROOT / "research" / "league_config_elsewhere.py", "league_elsewhere_population")
    alpha = 0.2  # player 1's family of equilibria: bet a jack with alpha, a king with 3 alpha, ...
    nash = {"J:": alpha, "Q:": 0.0, "K:": 3 * alpha, "J:check": 1 / 3, "Q:check": 0.0, "K:check": 1.0,
            "J:bet": 0.0, "Q:bet": 1 / 3, "K:bet": 1.0, "J:check bet": 0.0, "Q:check bet": alpha + 1 / 3,
            "K:check bet": 1.0}
    assert exploitability(nash) < 1e-9
    strategies = {"main_agent-0": dict.fromkeys(INFOSETS, 1.0), "main_agent-1": nash,
                  "main_exploiter-0": dict.fromkeys(INFOSETS, 0.5), "random": dict.fromkeys(INFOSETS, 0.5)}
    from autocurricula.records import Player

    players = [Player(id="main_agent-0", role="main_agent", frozen=False),
               Player(id="main_agent-1", role="main_agent", frozen=True, snapshot_of="main_agent-0"),
               Player(id="main_exploiter-0", role="main_exploiter", frozen=False),
               Player(id="random", role="random", frozen=True, policy=lambda *a: "bet")]
    trainer = SimpleNamespace(players=players, engine=None, run=SimpleNamespace(grpo=SimpleNamespace(temperature=1.0)), current_epoch=2,
                              standings=SimpleNamespace(elo=SimpleNamespace(rating=lambda pid: 1000.0)))
    reads = []

    def read(engine, pid, temperature):
        reads.append(pid)
        return {k: (0.99 * v, 0.01) for k, v in strategies[pid].items()}, 0.0  # 1% invalid everywhere

    figures = SimpleNamespace(read=read, mixture=played_mixture,
                              score=lambda mix: {"exploitability": played_exploitability(mix)})
    population = mod.PopulationNash(figures)
    population(trainer)
    population(trainer)
    got = population.rows[-1]["population_nash"]
    assert (got["support"], got["on_live_main"], got["players"]) == (1, 0.0, 3)  # the scripted player left out
    played_nash = {k: (0.99 * v, 0.01) for k, v in nash.items()}
    assert got["exploitability"] == pytest.approx(played_exploitability(played_nash), abs=1e-4)
    assert 0 < got["exploitability"] < 0.05  # the invalid replies cost, the strategy itself is a Nash
    assert reads.count("main_agent-1") == 1 and reads.count("main_agent-0") == 2 and "random" not in reads
    best = population.rows[-1]["least_exploitable"]  # the least exploitable mixture: the Nash member too
    assert best["support"] == 1 and best["exploitability"] == pytest.approx(got["exploitability"], abs=1e-4)


def test_league_ideal_separates_the_league_structure_from_the_fit():
    """research/league_ideal.py, exact values and no model: mirror self-play's steps settle at the
    soft targets' floor (0.031 chips per hand); a fit that lands at 4/3 of the target's call odds
    holds the same steps far off; jumping to the soft targets in the league leaves the main agent far off
    while the Nash over its population and live learners is near the equilibrium."""
    mod = _load(ROOT / "research" / "league_ideal.py", "league_ideal")
    settle = mod.run(0.045, "selfplay", 96, 0.15, 3, 0)
    biased = mod.run(0.045, "selfplay", 96, 0.15, 3, 0, call_bias=4 / 3)
    league = mod.run(1.0, "league", 48, 0.15, 3, 0)
    assert settle["main_agent"]["last"] == pytest.approx(0.031, abs=0.002)
    assert biased["main_agent"]["last"] > 0.15
    assert league["main_agent"]["last"] > 0.15 and league["mixture"]["last"] < 0.04
    assert league["mixture_on_live_main"]["last"] == 0.0
    # exploiters that realise a tenth of each round's target leave a population farther off
    assert mod.run(1.0, "league", 48, 0.15, 3, 0, exploiter_step=1.0) == league
    partial = mod.run(1.0, "league", 48, 0.15, 3, 0, exploiter_step=0.1)
    assert partial["mixture"]["last"] > league["mixture"]["last"] + 0.01
    with pytest.raises(SystemExit):
        mod.main(["--exploiter-step", "0"])


def test_kuhn_self_targets_reads_the_main_agent_and_finds_the_fixed_point_at_its_target(tmp_path):
    """research/kuhn_self_targets.py: the soft targets' fixed point is its own self-play target at
    every set (so a trained policy's distance from its target means something), and the policy is
    read from the research script's JSON lines for the epoch asked."""
    import json
    import math

    mod = _load(ROOT / "research" / "kuhn_self_targets.py", "kuhn_self_targets")
    fixed = mod.fixed_point(0.15, math.inf, 4000)
    rows = mod.self_targets(fixed, 0.15)
    assert max(abs(r["p"] - r["target"]) for r in rows.values()) < 1e-3
    assert rows["J:bet"]["gap"] == pytest.approx(-1.0)  # calling a bet with the jack always loses one more chip
    uniform = dict.fromkeys(mod.INFOSETS, 0.5)
    far = mod.self_targets(uniform, 0.15)
    assert max(abs(r["p"] - r["target"]) for r in far.values()) > 0.4
    log = tmp_path / "run.jsonl"
    lines = [{"epoch": e, "main_agent": {}, "main_agent_policy": {k: 0.1 * (e + 1) for k in mod.INFOSETS}} for e in (0, 1)]
    log.write_text("progress\n" + json.dumps(lines[0]) + "\nepoch 1: 100%|###| 8/8" + json.dumps(lines[1]) + "\n")
    assert mod.read_policy(str(log)) == (1, {k: 0.2 for k in mod.INFOSETS})
    assert mod.read_policy(str(log), 0)[1]["Q:bet"] == 0.1
    with pytest.raises(SystemExit, match="no main_agent_policy line for epoch 5"):
        mod.read_policy(str(log), 5)


def test_runs_diverge_finds_the_first_game_that_differs(tmp_path):
    import json

    diverge = _load(ROOT / "research" / "runs_diverge.py", "runs_diverge")
    rows = [("e0-r0-m0-0", [1.0, -1.0]), ("e0-r0-m1-0", [0.0, 0.0]), ("e1-r0-m0-0", [1.0, -1.0]),
            ("e1-r0-m1-0", [-1.0, 1.0])]
    for name, flip in (("a", None), ("b", "e1-r0-m0-0")):
        run = tmp_path / name
        run.mkdir()
        with open(run / "match_history.jsonl", "w") as fh:
            for game, rewards in rows:
                rewards = [-r for r in rewards] if game == flip else rewards
                fh.write(json.dumps({"game_id": game, "players": ["p", "q"], "rewards": rewards}) + "\n")
    out = diverge.compare(tmp_path / "a", tmp_path / "b")
    assert out["first_that_differs"] == "e1-r0-m0-0" and out["identical_before_it"] == 2
    assert out["games_that_differ"] == 1 and out["share_that_differs_per_epoch"] == {0: 0.0, 1: 0.5}
    assert diverge.compare(tmp_path / "a", tmp_path / "a")["first_that_differs"] is None


def test_runs_diverge_measures_how_far_two_models_weights_are(tmp_path):
    import mlx.core as mx

    diverge = _load(ROOT / "research" / "runs_diverge.py", "runs_diverge")
    for name, bump in (("a", 0.0), ("b", 1e-3)):
        (tmp_path / name).mkdir()
        mx.save_safetensors(str(tmp_path / name / "model.safetensors"),
                            {"w": mx.array([[1.0, -2.0]]), "v": mx.array([4.0 + bump])})
    out = diverge.weights_apart(tmp_path / "a", tmp_path / "b")
    assert not out["identical"] and out["tensor"] == "v"
    assert out["max_abs_difference"] == pytest.approx(1e-3, rel=1e-3)
    assert out["relative_to_its_largest_weight"] == pytest.approx(1e-3 / 4, rel=1e-3)
    assert diverge.weights_apart(tmp_path / "a", tmp_path / "a")["identical"]
