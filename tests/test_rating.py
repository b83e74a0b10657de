"""Ratings (Elo, decayed payoff, Bradley–Terry, leaderboard) on hand-computed numbers."""

import json
import math
import random

import pytest

from autocurricula.loop.rating import (
    Elo,
    Payoff,
    alpha_rank,
    bradley_terry,
    bradley_terry_bootstrap,
    format_leaderboard,
    leaderboard_rows,
)

E_200 = 1 / (1 + 10 ** (-200 / 400))  # expected score of a 1200 against a 1000 (0.7597...)


# ----------------------------------------------------------------------------- Elo


def test_elo_two_players_win():
    elo = Elo(k=20)
    assert elo.rating("a") == 1000 and elo.expected("a", "b") == 0.5
    deltas = elo.update(["a", "b"], [1.0, 0.0])
    assert deltas == pytest.approx({"a": 10, "b": -10})
    assert elo.rating("a") == pytest.approx(1010) and elo.rating("b") == pytest.approx(990)
    elo.update(["a", "b"], [-1.0, 3.0])  # the higher reward wins, whatever the sign
    e = 1 / (1 + 10 ** (20 / 400))
    assert elo.rating("b") == pytest.approx(990 + 20 * (1 - e))
    assert elo.rating("a") == pytest.approx(1010 - 20 * (1 - e))


def test_elo_draw_counts_half_and_pulls_together():
    elo = Elo(k=20, ratings={"hi": 1200.0, "lo": 1000.0})
    assert elo.expected("hi", "lo") == pytest.approx(E_200)
    deltas = elo.update(["hi", "lo"], [0.5, 0.5])
    assert deltas["hi"] == pytest.approx(20 * (0.5 - E_200))  # -5.195
    assert deltas["hi"] == pytest.approx(-5.19501, abs=1e-4)
    assert deltas["lo"] == pytest.approx(-deltas["hi"])
    assert 1000 < elo.rating("lo") < elo.rating("hi") < 1200


def test_elo_three_players_by_hand_and_conserved():
    elo = Elo(k=20)
    assert elo.update(["a", "b", "c"], [3, 2, 1]) == pytest.approx({"a": 10, "b": 0, "c": -10})

    elo = Elo(k=20, ratings={"a": 1200.0, "b": 1000.0, "c": 1000.0})
    d = elo.update(["a", "b", "c"], [1, 1, 0])
    # a: draw with b, beats c; b: draw with a, beats c; c loses both. K/(N-1) = 10.
    assert d["a"] == pytest.approx(10 * ((0.5 - E_200) + (1 - E_200)))
    assert d["b"] == pytest.approx(10 * ((0.5 - (1 - E_200)) + (1 - 0.5)))
    assert d["c"] == pytest.approx(10 * ((0 - (1 - E_200)) + (0 - 0.5)))
    assert sum(d.values()) == pytest.approx(0, abs=1e-12)
    assert sum(elo.ratings.values()) == pytest.approx(3200)


def test_elo_conservation_random_matches():
    rng = random.Random(0)
    elo = Elo(k=32)
    ids = [f"p{i}" for i in range(6)]
    for step in range(200):
        players = rng.sample(ids, rng.randint(2, 5))
        elo.update(players, [rng.choice([0, 0.5, 1]) for _ in players], step=step)
    assert sum(elo.ratings.values()) == pytest.approx(1000 * len(elo.ratings))


def test_elo_self_play_same_id_is_neutral():
    elo = Elo()
    assert elo.update(["a", "a"], [1, 0]) == {"a": 0.0}
    assert elo.rating("a") == 1000


def test_elo_history_compact_and_state_dict_round_trip():
    elo = Elo(k=20)
    elo.update(["a", "b"], [1, 0], step=5)
    elo.update(["a", "b"], [1, 0], step=7)
    elo.update(["c", "d"], [0, 0], step=9)  # a draw at equal ratings: no change, but first seen
    elo.update(["c", "d"], [0, 0], step=11)  # no change: nothing appended
    assert [s for s, _ in elo.history["a"]] == [5, 7]
    assert elo.history["a"][-1][1] == elo.rating("a")
    assert elo.history["c"] == [(9, 1000.0)]
    assert elo.games == {"a": 2, "b": 2, "c": 2, "d": 2}
    state = json.loads(json.dumps(elo.state_dict()))
    back = Elo.from_state_dict(state)
    assert back.ratings == elo.ratings and back.history == elo.history and back.games == elo.games
    assert back.updates == 4 and back.k == 20
    assert back.update(["a", "b"], [0, 1]) == elo.update(["a", "b"], [0, 1])


def test_elo_history_is_bounded():
    elo = Elo(max_history=16)
    for i in range(200):
        elo.update(["a", "b"], [i % 2, (i + 1) % 2])
    assert len(elo.history["a"]) <= 16
    assert elo.history["a"][-1] == (199, elo.rating("a"))
    steps = [s for s, _ in elo.history["a"]]
    assert steps == sorted(steps)


def test_elo_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        Elo().update(["a", "b"], [1])


# ----------------------------------------------------------------------------- Payoff


def test_payoff_decay_by_hand():
    pay = Payoff(decay=0.99)
    assert pay.win_rate("a", "b") == 0.5 and pay.games("a", "b") == 0
    for _ in range(3):
        pay.update("a", "b", "win")
    g = 0.99**2 + 0.99 + 1
    assert pay.games("a", "b") == pytest.approx(g) and pay.games("b", "a") == pytest.approx(g)
    assert pay.win_rate("a", "b") == 1.0 and pay.win_rate("b", "a") == 0.0

    pay = Payoff(decay=0.99)
    pay.update("a", "b", "win")
    pay.update("a", "b", 0.0)  # a loss
    pay.update("b", "a", "draw")
    assert pay.win_rate("a", "b") == pytest.approx((0.99**2 + 0.5 * 1) / g)
    assert pay.win_rate("b", "a") == pytest.approx((0.99 + 0.5 * 1) / g)
    assert pay.win_rate("a", "b") + pay.win_rate("b", "a") == pytest.approx(1)
    assert pay.win_rates("a", ["b", "zzz"]) == pytest.approx([(0.99**2 + 0.5) / g, 0.5])
    with pytest.raises(ValueError):
        pay.update("a", "b", 0.3)


def test_payoff_matrix_match_and_state_dict():
    pay = Payoff(decay=0.5)
    pay.update_match(["a", "b", "c"], [2, 1, 1])  # a beats b and c; b draws c
    assert pay.players == ["a", "b", "c"]
    assert pay.matrix() == [[0.5, 1.0, 1.0], [0.0, 0.5, 0.5], [0.0, 0.5, 0.5]]
    pay.update("a", "a", "win")  # self-play: one entry, decayed once, a win and a loss
    assert pay.games("a", "a") == 2 and pay.win_rate("a", "a") == 0.5
    back = Payoff().load_state_dict(json.loads(json.dumps(pay.state_dict())))
    assert back.decay == 0.5 and back.matrix(["a", "b", "c"]) == pay.matrix(["a", "b", "c"])
    back.update("b", "a", "win")
    assert back.games("a", "b") == pytest.approx(1.5)
    assert back.win_rate("b", "a") == pytest.approx(1 / 1.5)


def test_a_duplicate_pair_is_one_relative_payoff_sample():
    from autocurricula.loop.rating import RelativePayoff

    rel = RelativePayoff(decay=1.0)
    # one deal, seats swapped: a wins 2 as the first seat and loses 1 as the second; a lone game
    rel.update_games([(["a", "b"], [2, -2], "d1"), (["b", "a"], [1, -1], "d1"), (["a", "b"], [-1, 1], None)])
    mean, _, n = rel.stats("a", "b")
    assert n == 2 and mean == pytest.approx((0.5 + -1.0) / 2)
    per_game = RelativePayoff(decay=1.0)
    per_game.update_games([(["a", "b"], [2, -2], None), (["b", "a"], [1, -1], None), (["a", "b"], [-1, 1], None)])
    assert per_game.stats("a", "b")[2] == 3
    # pairs whose luck cancels measure tighter than the same games one by one
    pairs, games = RelativePayoff(decay=1.0), RelativePayoff(decay=1.0)
    for k, luck in enumerate([3, -3, 2, -2, 3, -1]):
        deal = [(["a", "b"], [luck + 0.2, -luck - 0.2], f"d{k}"), (["b", "a"], [luck, -luck], f"d{k}")]
        pairs.update_games(deal)
        games.update_games([(ids, r, None) for ids, r, _ in deal])
    assert pairs.stats("a", "b")[0] == pytest.approx(games.stats("a", "b")[0]) == pytest.approx(0.1)
    assert pairs.stats("a", "b")[1] < games.stats("a", "b")[1] / 2


# ----------------------------------------------------------------------------- Bradley–Terry


def _mm_reference(records, iters=5000):
    """Hunter's (2004) MM iteration without prior: gamma_i = W_i / sum_j N_ij / (gamma_i + gamma_j)."""
    players = sorted({r[0] for r in records} | {r[1] for r in records})
    wins = {p: 0.0 for p in players}
    n = {}
    for a, b, s in records:
        wins[a] += s
        wins[b] += 1 - s
        n[a, b] = n.get((a, b), 0) + 1
        n[b, a] = n.get((b, a), 0) + 1
    gamma = {p: 1.0 for p in players}
    for _ in range(iters):
        new = {i: wins[i] / sum(n.get((i, j), 0) / (gamma[i] + gamma[j]) for j in players if j != i)
               for i in players}
        norm = math.exp(sum(math.log(g) for g in new.values()) / len(new))
        gamma = {p: g / norm for p, g in new.items()}
    return {p: 1000 + 400 * math.log10(g) for p, g in gamma.items()}


def test_bt_three_of_four_and_draws_as_halves():
    r = bradley_terry([("a", "b", 1)] * 3 + [("a", "b", 0)], ridge=1e-9)
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(3), abs=1e-3)
    assert (r["a"] + r["b"]) / 2 == pytest.approx(1000)
    r = bradley_terry([("a", "b", 1), ("b", "a", 0.5)], ridge=1e-9)  # 1.5 of 2 is 3 of 4
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(3), abs=1e-3)
    r = bradley_terry([("a", "b", 1)] * 3 + [("a", "b", 0)], ridge=1e-9, scale=1, base=math.e, initial=0)
    assert r["a"] - r["b"] == pytest.approx(math.log(3), abs=1e-6)


def test_bt_matches_mm_reference():
    rng = random.Random(1)
    strength = {"a": 1.5, "b": 0.5, "c": 0.0, "d": -1.0}
    ids = list(strength)
    records = []
    for _ in range(300):
        a, b = rng.sample(ids, 2)
        p = 1 / (1 + math.exp(strength[b] - strength[a]))
        u = rng.random()
        records.append((a, b, 1.0 if u < p * 0.9 else 0.5 if u < p * 0.9 + 0.1 else 0.0))
    want = _mm_reference(records)
    got = bradley_terry(records, ridge=1e-10)
    assert got == pytest.approx(want, abs=1e-3)
    assert sum(got.values()) / 4 == pytest.approx(1000)
    assert sorted(got, key=got.get, reverse=True) == ["a", "b", "c", "d"]


def test_bt_undefeated_finite_and_default_prior_small():
    r = bradley_terry([("a", "b", 1)] * 5 + [("b", "c", 1)] * 5)
    assert all(math.isfinite(v) for v in r.values())
    assert r["a"] > r["b"] > r["c"]
    r = bradley_terry([("a", "b", 1)] * 3 + [("a", "b", 0)])  # default ridge: off by < 1 point
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(3), abs=1.0)
    assert bradley_terry([]) == {}


def _transitive(n_rounds, seed=0):
    rng = random.Random(seed)
    true = {"p0": 1300, "p1": 1150, "p2": 1000, "p3": 850, "p4": 700}
    ids = list(true)
    recs = []
    for _ in range(n_rounds):
        a, b = rng.sample(ids, 2)
        p = 1 / (1 + 10 ** ((true[b] - true[a]) / 400))
        recs.append((a, b, 1.0 if rng.random() < p else 0.0))
    return recs


def test_bt_ordering_on_transitive_data():
    r = bradley_terry(_transitive(2000))
    assert sorted(r, key=r.get, reverse=True) == ["p0", "p1", "p2", "p3", "p4"]
    assert r["p0"] - r["p4"] == pytest.approx(600, abs=120)


def test_bt_bootstrap_contains_point_deterministic_and_narrows():
    small = _transitive(60)
    big = _transitive(1200)
    b1 = bradley_terry_bootstrap(small, rounds=50, seed=3)
    assert b1 == bradley_terry_bootstrap(small, rounds=50, seed=3)
    assert b1 != bradley_terry_bootstrap(small, rounds=50, seed=4)
    point = bradley_terry(small)
    for p, (r, lo, hi) in b1.items():
        assert r == pytest.approx(point[p]) and lo <= r <= hi and lo < hi
    b2 = bradley_terry_bootstrap(big, rounds=50, seed=3)
    width = lambda b: sum(hi - lo for _, lo, hi in b.values()) / len(b)
    assert width(b2) < 0.6 * width(b1)


# ----------------------------------------------------------------------------- α-Rank


def test_alpha_rank_optional():
    try:
        import open_spiel.python.egt.alpharank  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install open_spiel"):
            alpha_rank([[0.5, 1.0], [0.0, 0.5]])
        pytest.skip("open_spiel not installed")
    pi = alpha_rank([[0.5, 1.0], [0.0, 0.5]], ["strong", "weak"])
    assert pi["strong"] > pi["weak"] and sum(pi.values()) == pytest.approx(1)


# ----------------------------------------------------------------------------- leaderboard


def test_leaderboard_rows_and_format():
    elo = Elo(ratings={"main": 1100.0, "exploiter-1": 1040.5, "old": 980.0})
    players = [{"id": "old", "role": "main", "epoch": 1, "frozen": True},
               {"id": "main", "role": "main", "epoch": 3, "frozen": False},
               {"id": "exploiter-1", "role": "main_exploiter", "epoch": 2, "frozen": False},
               {"id": "newbie"}]
    bt = {"main": (1090.0, 1050.25, 1130.0), "old": 990.0}
    rows = leaderboard_rows(players, elo, bt, {"main": 40, "old": 12, "exploiter-1": 30})
    assert [r["id"] for r in rows] == ["main", "exploiter-1", "old", "newbie"]  # unrated (no games) below the rated
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert list(rows[0]) == ["rank", "id", "role", "epoch", "frozen", "elo", "bt", "bt_low", "bt_high", "games"]
    assert rows[0]["bt_low"] == 1050.25 and rows[2]["bt"] == 990.0 and rows[2]["bt_low"] is None
    assert rows[3]["elo"] == 1000 and rows[3]["games"] == 0 and rows[3]["role"] is None

    text = format_leaderboard(rows)
    print(text)
    lines = text.splitlines()
    assert len(lines) == 5
    assert lines[0].split() == ["rank", "id", "role", "epoch", "frozen", "elo", "bt", "bt_low", "bt_high", "games"]
    assert lines[1].split() == ["1", "main", "main", "3", "False", "1100.0", "1090.0", "1050.2", "1130.0", "40"]
    assert lines[2].split()[1:3] == ["exploiter-1", "main_exploiter"]
    assert lines[4].split() == ["4", "newbie", "-", "-", "-", "unrated", "-", "-", "-", "0"]
    # columns are aligned: the elo column ends at the same offset in every line
    end = lines[0].index("elo") + len("elo")
    assert all(line[:end].endswith(("elo", "1100.0", "1040.5", "unrated", "980.0")) for line in lines)
    assert format_leaderboard([]).split() == lines[0].split()
