"""PSRO: the meta-solvers on known games, the relative-payoff meta-game with its errors, matrix
games scored as played, the deployable mixture, and a league that approaches an equilibrium."""

import json

import numpy as np
import pytest

from autocurricula.eval.meta import exploitability, regret_matching, robust_mixture, zero_sum_nash
from autocurricula.loop.rating import RelativePayoff, meta_weights
from league_doubles import RunParts

BIASED_RPS = np.array([[0.0, -1.0, 2.0], [1.0, 0.0, -1.0], [-2.0, 1.0, 0.0]])  # Nash (1/4, 1/2, 1/4)


# -- solvers -------------------------------------------------------------------------------------
def test_exploitability_is_zero_at_the_equilibrium_and_positive_off_it():
    x, y, _ = zero_sum_nash(BIASED_RPS)
    assert x == pytest.approx([0.25, 0.5, 0.25], abs=1e-12)
    assert exploitability(BIASED_RPS, x, y) == pytest.approx(0.0, abs=1e-12)
    uniform = np.full(3, 1 / 3)
    # against uniform, rows' best reply (row 0) gets 1/3 and columns' best (column 1) holds rows to 0
    assert exploitability(BIASED_RPS, uniform, uniform) == pytest.approx(1 / 3)


def test_regret_matching_approaches_the_equilibrium_of_known_games():
    for game, nash in ((BIASED_RPS, [0.25, 0.5, 0.25]), (np.array([[1.0, -1.0], [-1.0, 1.0]]), [0.5, 0.5])):
        x, y = regret_matching(game, 4000)
        assert exploitability(game, x, y) < 1e-3
        assert x == pytest.approx(nash, abs=0.01)


def test_robust_mixture_is_lp_nash_on_known_entries_and_distrusts_uncertain_ones():
    assert robust_mixture(BIASED_RPS) == pytest.approx([0.25, 0.5, 0.25], abs=1e-9)
    # player 2 seems to beat player 1, on too few games to be sure; player 0 is sure against both
    mean = np.array([[0.0, 0.2, 0.1], [-0.2, 0.0, -0.5], [-0.1, 0.5, 0.0]])
    sure = np.array([[0.0, 0.01, 0.01], [0.01, 0.0, 0.8], [0.01, 0.8, 0.0]])
    assert robust_mixture(mean, sure, z=0.0) == pytest.approx([1.0, 0.0, 0.0])  # 0 dominates on the means too
    assert robust_mixture(mean, sure, z=2.0) == pytest.approx([1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="z must be >= 0"):
        robust_mixture(mean, sure, z=-1)


def test_relative_payoffs_see_payoff_sizes_that_win_rates_cannot():
    """Rock-paper-scissors where rock's win pays 2: the equilibrium is (1/4, 1/2, 1/4); win rates
    see plain rock-paper-scissors and give (1/3, 1/3, 1/3)."""
    from autocurricula.loop.rating import Payoff, nash_weights

    ids = ["rock", "paper", "scissors"]
    rel, wins = RelativePayoff(decay=1.0), Payoff(decay=1.0)
    for _ in range(400):
        for i in range(3):
            for j in range(i + 1, 3):
                r = BIASED_RPS[i, j]
                rel.update_match([ids[i], ids[j]], [r, -r], frozen=set(ids))
                wins.update(ids[i], ids[j], "win" if r > 0 else "loss")
    mix = meta_weights(rel, ids, z=0.0)
    assert [mix[i] for i in ids] == pytest.approx([0.25, 0.5, 0.25], abs=1e-9)
    assert list(nash_weights(wins, ids).values()) == pytest.approx([1 / 3] * 3, abs=1e-9)


def test_relative_payoff_counts_errors_and_decay():
    rel = RelativePayoff(decay=0.5)
    assert np.isnan(rel.stats("a", "b")[0]) and rel.stats("a", "b")[2] == 0
    for r in (1.0, -1.0, 1.0, 1.0):
        rel.update_match(["a", "b"], [r, -r], frozen={"a", "b"})  # frozen pair: every game kept
        rel.update_match(["a", "c"], [r, -r])  # a learner in the pair: decayed
    mean, se, n = rel.stats("a", "b")
    assert (mean, n) == (0.5, 4.0) and rel.stats("b", "a")[0] == -0.5 and se > 0
    assert rel.stats("a", "c")[2] < 4.0  # the older games of a moving player count less
    state = json.loads(json.dumps(rel.state_dict()))
    again = RelativePayoff().load_state_dict(state)
    assert again.stats("a", "b") == rel.stats("a", "b") and again.stats("c", "a") == rel.stats("c", "a")


def test_a_player_without_games_gets_no_weight_and_one_game_is_not_certainty():
    rel = RelativePayoff()
    for _ in range(50):
        rel.update_match(["a", "b"], [0.1, -0.1], frozen={"a", "b"})
    rel.update_match(["c", "a"], [1.0, -1.0])  # one lucky game
    w = meta_weights(rel, ["a", "b", "c", "new"], z=1.0)
    assert w["new"] == 0.0 and w["b"] == 0.0
    assert w["c"] < 0.6  # a single win does not make c the mixture
    for _ in range(50):  # once c has shown it against both, it is
        rel.update_match(["c", "a"], [1.0, -1.0], frozen={"a", "c"})
        rel.update_match(["c", "b"], [1.0, -1.0], frozen={"b", "c"})
    assert meta_weights(rel, ["a", "b", "c", "new"], z=1.0)["c"] == pytest.approx(1.0)


# -- matrix games ----------------------------------------------------------------------------------
def test_matrix_game_rules_and_forfeits():
    from autocurricula.games.matrix import MatrixGame, random_game

    g = MatrixGame([[1.0, -0.5], [0.2, 0.3], [-1.0, 0.4]])
    assert g.shape == (3, 2) and g.moves(g.prompt(0)) == [" red", " blue", " green"] and g.moves(g.prompt(1)) == [" up", " down"]
    assert g.rewards(0, 1) == [-0.5, 0.5]
    assert g.rewards(None, 0) == [-1.0, 1.0]  # rows forfeit their worst entry
    assert g.rewards(1, None) == [1.0, -1.0]  # columns forfeit theirs (rows' best)
    assert g.rewards(None, None) == [0.0, 0.0]
    assert g.action(1, " down ") == 1 and g.action(1, "blue") is None and g.action(0, "red blue") is None
    assert g.action(0, "up") is None  # each seat answers with its own words
    assert random_game(7).payoff == random_game(7).payoff and random_game(7).name == "random-7"
    shapes = {random_game(s).shape for s in range(40)}
    assert {m for m, _ in shapes} == {2, 3, 4, 5} and {n for _, n in shapes} == {2, 3, 4, 5}
    with pytest.raises(ValueError, match="columns need at least 6 distinct words"):
        MatrixGame([[0.0] * 6])
    with pytest.raises(ValueError, match="rows need at least 2 distinct words"):
        MatrixGame([[0.0], [1.0]], words=("a", "a"))


def test_matrix_game_plays_through_the_game_protocol():
    import asyncio

    from autocurricula.arena.game import Game, game_moves
    from autocurricula.games.matrix import MatrixGame

    g = MatrixGame([[1.0, -1.0], [-1.0, 1.0]])
    assert isinstance(g, Game) and game_moves(g)(g.prompt(0)) == [" red", " blue"]

    class Scripted:
        async def generate(self, player, prompt, **kw):
            return {"p0": " blue", "p1": "oops"}[player["id"]]

    assert asyncio.run(g.play([{"id": "p0"}, {"id": "p1"}], Scripted())) == [1.0, -1.0]


def test_exploitability_as_played_counts_invalid_replies():
    from autocurricula.eval.matrix import exploitability_as_played, figures
    from autocurricula.games.matrix import MatrixGame

    g = MatrixGame(BIASED_RPS.tolist())
    nash = [np.array([0.25, 0.5, 0.25, 0.0])] * 2
    assert exploitability_as_played(g, [nash], [1.0]) == pytest.approx(0.0, abs=1e-12)
    # 10% invalid, the rest at the equilibrium: each forfeit costs the worst payoff (2)
    leaky = [np.array([0.225, 0.45, 0.225, 0.1])] * 2
    got = figures(g, {"p": leaky}, {"p": 1.0})
    assert got["invalid_rate"] == pytest.approx(0.1)
    assert got["exploitability"] == pytest.approx(0.1 * 2.0, abs=1e-12)
    # renormalising over the legal words would hide it: the legal part alone is the equilibrium
    assert exploitability(BIASED_RPS, leaky[0][:3] / 0.9, leaky[1][:3] / 0.9) == pytest.approx(0.0, abs=1e-12)
    assert got["exploitability_share"] == pytest.approx(0.2 / 4.0)


# -- the league ----------------------------------------------------------------------------------------
def test_a_league_can_play_duplicate_pairs(tmp_path):
    """``trainer.mirrored``: both seat orders on one deal, the entries a custom ``match`` returns
    (their games share a deal: tests/test_replay.py; one sample per deal: test_psro_units)."""
    from autocurricula import PSROConfig, PSROTrainer
    from autocurricula.records import Deal
    from autocurricula.loop.standings import Standings

    from autocurricula.records import Player

    me = Player(id="responder-0", frozen=False)
    pop = [Player(id=f"population-{i}", frozen=True) for i in range(3)]

    class Duplicate(RunParts, PSROTrainer):
        players = property(lambda self: [me, *pop])

        def match(self):
            return [g for i in range(self.config.rules.games_per_round // 2)
                    for g in self.mirrored(me, self.responder_opponent(me), f"r{i}")]

    trainer = Duplicate(PSROConfig(seed=0, output_dir=str(tmp_path), progress=False, rules={"games_per_round": 8}))
    trainer.standings = Standings(trainer.config.ratings, tmp_path, 0)
    games = trainer.match()
    assert len(games) == 8 and all(isinstance(g, Deal) and me in g for g in games)
    for a, b in zip(games[0::2], games[1::2]):
        assert a.key == b.key and tuple(a) == tuple(b)[::-1]
    assert len({g.key for g in games}) == 4

    class Population(RunParts, PSROTrainer):  # the same pairs from the config, evaluation games single
        players = property(lambda self: [me, *pop])

    trainer = Population(PSROConfig(seed=0, output_dir=str(tmp_path), progress=False,
                                    rules={"games_per_round": 8, "eval_games": 4, "responder_pairs": True}))
    trainer.standings = Standings(trainer.config.ratings, tmp_path, 0)
    games = trainer.match()
    assert len(games) == 12 and not any(isinstance(g, Deal) for g in games[8:])
    assert [g.key for g in games[:8]] == [f"responder-0/{i}" for i in range(4) for _ in (0, 1)]
    assert all(tuple(a) == tuple(b)[::-1] and me in a for a, b in zip(games[0:8:2], games[1:8:2]))
    for bad in (dict(games_per_round=9), dict(games_per_round=2), dict(responder_pairs=1)):
        with pytest.raises(ValueError, match="responder_pairs"):
            PSROConfig(rules={"responder_pairs": True, **bad})


def test_psro_units():
    from autocurricula.leagues.psro import PSROConfig, beats_mixture, eval_priorities, relative_rewards
    from autocurricula.records import GameRecord

    recs = [GameRecord(game_id=i, players=[{"id": a}, {"id": b}], rewards=r, turns=[])
            for i, (a, b, r) in enumerate([("me", "p0", [1, -1]), ("p1", "me", [0.5, -0.5]), ("me", "x", [1, -1])])]
    assert relative_rewards(recs, "me", {"p0", "p1"}).tolist() == [1.0, -0.5]
    # a duplicate pair is one sample, its games' mean: the luck of its deal cancels in it
    pair = [GameRecord(game_id=f"d{i}", players=[{"id": a}, {"id": b}], rewards=r, turns=[], deal="k")
            for i, (a, b, r) in enumerate([("me", "p0", [2, -2]), ("p0", "me", [1, -1])])]
    assert relative_rewards(pair + recs, "me", {"p0", "p1"}).tolist() == [0.5, 1.0, -0.5]
    assert not beats_mixture(np.array([1.0]), 2.0)  # one game proves nothing
    assert beats_mixture(np.full(10, 0.3) + np.linspace(-0.01, 0.01, 10), 2.0)
    assert not beats_mixture(np.array([1.0, -1.0] * 20), 2.0)
    w, se, n = np.array([1.0, 0.0, 0.0]), np.full((3, 3), 0.1), np.ones((3, 3))
    n[1, 2] = n[2, 1] = 0  # never played: first in line
    p = eval_priorities(w, se, n)
    assert p.sum() == pytest.approx(1.0) and p.argmax() == 2 and p.min() > 0
    with pytest.raises(ValueError, match="responders"):
        PSROConfig(rules={"responders": 0})


def _warm(tmp_path, seed=0):
    from autocurricula.games.matrix import random_game
    from autocurricula.engine.tiny import build_tiny_model
    from autocurricula.training.warmup import sft_warmup

    base = build_tiny_model(tmp_path / "base", hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                            seed=seed)
    examples = [ex for g in range(64) for ex in random_game(10_000 + g).warmup_examples(200, seed=g)]
    return sft_warmup(base, tmp_path / "warm", examples, steps=150, batch_size=64, learning_rate=2e-3, seed=seed)


def test_psro_mixture_of_a_matrix_game_falls_below_a_bound(tmp_path):
    """A 2x2 game of the random family with a mixed equilibrium: from the format warm-up (0.12 of
    the payoff range exploitable) PSRO's deployed mixture gets below 0.06 within 64 rounds (0.017
    on the machine that set the bound); the mixture exports with its weights."""
    from autocurricula import PSROConfig, PSROTrainer
    from autocurricula.eval.matrix import figures, read_policy
    from autocurricula.games.matrix import random_game

    game = random_game(2)
    warm = _warm(tmp_path)
    trainer = PSROTrainer(PSROConfig(epochs=8, rounds=8, seed=0, output_dir=str(tmp_path / "run"), progress=False,
                                     save_strategy="no"))
    trainer.train(str(warm), game, grpo_config={"learning_rate": 1e-2})
    try:
        mixture = trainer.deployable_mixture()
        assert set(mixture) <= {p["id"] for p in trainer.population()} and sum(mixture.values()) == pytest.approx(1)
        pols = {pid: read_policy(trainer.engine, pid, game) for pid in mixture}
        base = figures(game, {"b": read_policy(trainer.engine, None, game)}, {"b": 1.0})
        got = figures(game, pols, mixture)
        assert base["exploitability_share"] > 0.1
        assert got["exploitability_share"] < 0.06, (got, mixture)
        assert got["invalid_rate"] < 0.05, got
        assert len(trainer.population()) >= 3  # best responses joined
        rows = {r["id"]: r for r in trainer.leaderboard.rows}
        assert all(rows[pid]["deploy"] == pytest.approx(w) for pid, w in mixture.items())
        out = trainer.export_mixture(tmp_path / "mixture")
        saved = json.loads((out / "mixture.json").read_text())
        assert saved["weights"] == pytest.approx(mixture) and saved["format"] == "peft"
        assert all((out / pid / "adapter_model.safetensors").is_file() for pid in mixture)
    finally:
        trainer.engine.close()


# -- Kuhn poker as played ------------------------------------------------------------------------------
def test_played_exploitability_is_the_plain_one_without_invalid_replies_and_counts_them():
    from autocurricula.eval.kuhn import (INFOSETS, exploitability, mixture_strategy, played_exploitability,
                                         played_mixture, uniform_strategy)
    from autocurricula.games.kuhn_poker import equilibrium_strategy

    eq = equilibrium_strategy(0.2)
    as_played = {k: (v, 0.0) for k, v in eq.items()}
    assert played_exploitability(as_played) == pytest.approx(0.0, abs=1e-12)
    uniform = {k: (0.5, 0.0) for k in INFOSETS}
    mix = played_mixture([as_played, uniform], [0.3, 0.7])
    assert played_exploitability(mix) == pytest.approx(
        exploitability(mixture_strategy([eq, uniform_strategy()], [0.3, 0.7]), backend="python"), abs=1e-12)
    # a king facing check-bet that answers nonsense 88% of the time: folding-by-forfeit is exploited
    leaky = dict(as_played, **{"K:check bet": (0.12, 0.88)})
    assert played_exploitability(leaky) > 0.05
    # renormalised over the legal words, the same strategy looks like Nash
    assert exploitability(dict(eq, **{"K:check bet": 1.0}), backend="python") == pytest.approx(0.0, abs=1e-12)


def test_read_played_matches_the_replies_the_game_parses(tmp_path):
    """The reply tree's probabilities agree with sampled replies parsed by the game, within
    sampling error, invalid ones included."""
    from autocurricula.engine import Engine, SamplingParams
    from autocurricula.eval.kuhn import prompt_of, read_played
    from autocurricula.games import kuhn_poker
    from autocurricula.engine.tiny import build_tiny_model
    from autocurricula.training.warmup import sft_warmup

    base = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
    warm = sft_warmup(base, tmp_path / "warm", kuhn_poker.warmup_examples(2000, 0, (0.1, 0.9)), steps=25,
                      batch_size=32, learning_rate=3e-3, seed=0)  # short: many replies are still invalid
    engine = Engine(str(warm), name="w")
    try:
        played, unresolved = read_played(engine, None)
        n = 1500
        for infoset in ("Q:", "K:check bet"):
            legal = kuhn_poker.legal_actions(tuple(infoset.split(":")[1].split()))
            futures = engine.submit_many([(prompt_of(infoset), None, SamplingParams(max_tokens=3, seed=i))
                                          for i in range(n)])
            outs = [f.result().text for f in futures]
            words = [kuhn_poker.parse_action(t, legal) for t in outs]
            agg = sum(w in ("bet", "call") for w in words) / n
            bad = sum(w is None for w in words) / n
            p_agg, p_bad = played[infoset]
            assert 0.02 < p_bad < 0.98  # the check has invalid replies to count
            for got, want in ((agg, p_agg), (bad, p_bad)):
                assert abs(got - want) < 4 * (want * (1 - want) / n) ** 0.5 + unresolved + 1e-3, (infoset, got, want)
    finally:
        engine.close()


def test_meta_opponent_composes_with_the_alphastar_league(tmp_path, tiny_model_path):
    """An AlphaStar league whose league exploiter plays the meta-strategy over the historical
    players: one overridden public method; the roles and the deployable mixture stay."""
    from autocurricula import LeagueConfig, LeagueTrainer
    from autocurricula.games import matrix

    drawn = []

    class MetaLeague(LeagueTrainer):
        def league_exploiter_opponent(self, player):
            opponent = self.meta_opponent(self.historical())
            drawn.append(opponent["id"])
            return opponent

    trainer = MetaLeague(LeagueConfig(epochs=1, rounds=2,
                                      rules={"games_per_learner": 4, "main_exploiters": 0, "league_exploiters": 1},
                                      output_dir=str(tmp_path), progress=False, save_strategy="no",
                                      ratings={"bt_bootstrap": 0}))
    trainer.train(str(tiny_model_path), matrix)
    try:
        historical = {p["id"] for p in trainer.historical()}
        assert len(drawn) == 8 and set(drawn) <= historical
        assert {p.get("role") for p in trainer.players} >= {"main_agent", "league_exploiter"}
        mixture = trainer.deployable_mixture()
        assert mixture and sum(mixture.values()) == pytest.approx(1.0)
    finally:
        trainer.engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["psro_matrix_games.py", "psro_kuhn.py"])
@pytest.mark.parametrize("credit", [[], ["--credit", "moves", "--restart-rounds", "0"],
                                    ["--credit", "pooled", "--restart-rounds", "0", "--responder-pairs",
                                     "--steps-per-generation", "4"],
                                    ["--credit", "mirror", "--steps-per-generation", "4", "--branch-samples", "1",
                                     "--games-per-round", "64", "--catch-up"]])
def test_psro_examples_smoke(script, credit, tmp_path):
    """Both measurement commands run end to end on a tiny budget and print their summary line, with
    the default credit, with per-move credit, with the pooled recipe and with mirror self-play
    (which deploys its main player alone: one epoch, so ``average_last`` is 1; with the branch games,
    games a round and catch-up set by flag)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    extra = (["--games", "1"] if script == "psro_matrix_games.py" else []) + credit
    out = subprocess.run([sys.executable, str(root / "examples" / script), "--smoke", *extra], capture_output=True,
                         text=True, timeout=900, cwd=root / "examples",
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    key = "summary" if script == "psro_matrix_games.py" else "final"
    assert {"psro", "selfplay"} <= set(last[key])
    if key == "final" and "mirror" in credit:
        assert list(last[key]["selfplay"]["mixture"]) == ["main-0"]
    if "mirror" in credit:
        assert (last["branch_samples"], last["games_per_round"], last["catch_up"]) == (1, 64, True)


def test_psro_players_tell_their_seats_apart(tmp_path):
    """``random_game(19)``: rows should answer their first word, columns their second. A policy that
    answers alike in both seats is exploitable by at least 0.0745 of the range; with words of its
    own per seat, PSRO's mixture gets below 0.03 within 32 rounds (0.005 on the machine that set the
    bound)."""
    from autocurricula import PSROConfig, PSROTrainer
    from autocurricula.eval.matrix import exploitability_as_played, figures, read_policy
    from autocurricula.games.matrix import random_game

    game = random_game(19)
    blind = min(exploitability_as_played(game, [[np.array([q, 1 - q, 0.0])] * 2], [1.0])
                for q in np.linspace(0, 1, 101))
    assert blind / np.ptp(np.asarray(game.payoff)) > 0.074
    trainer = PSROTrainer(PSROConfig(epochs=4, rounds=8, seed=0, output_dir=str(tmp_path / "run"), progress=False,
                                     save_strategy="no"))
    trainer.train(str(_warm(tmp_path)), game, grpo_config={"learning_rate": 1e-2})
    try:
        mixture = trainer.deployable_mixture()
        got = figures(game, {pid: read_policy(trainer.engine, pid, game) for pid in mixture}, mixture)
        assert got["exploitability_share"] < 0.03, (got, mixture)
    finally:
        trainer.engine.close()


def test_a_new_member_starts_with_its_responders_games_as_entries(tmp_path):
    """A responder that joins hands the games of its joining round to the new member as its first
    restricted-game entries (frozen pair, no decay), one per deal, so a member that joins in the
    final round can be weighed; ``games_against`` lists each game's opponent and relative reward,
    ``deal_samples`` each deal's."""
    from autocurricula import PSROConfig, PSROTrainer
    from autocurricula.games.matrix import random_game
    from autocurricula.leagues.psro import deal_samples, games_against
    from autocurricula.records import GameRecord

    recs = [GameRecord(game_id=i, players=[{"id": a}, {"id": b}], rewards=r, turns=[])
            for i, (a, b, r) in enumerate([("me", "p0", [1, -1]), ("p1", "me", [0.5, -0.5]), ("me", "x", [1, -1])])]
    assert games_against(recs, "me", {"p0", "p1"}) == [("p0", 1.0), ("p1", -0.5)]
    pair = [GameRecord(game_id=f"d{i}", players=[{"id": a}, {"id": b}], rewards=r, turns=[], deal="k")
            for i, (a, b, r) in enumerate([("me", "p0", [2, -2]), ("p0", "me", [1, -1])])]
    assert deal_samples(pair + recs, "me", {"p0", "p1"}) == [("p0", 0.5), ("p0", 1.0), ("p1", -0.5)]

    joined = []

    class Watched(PSROTrainer):
        def on_round_end(self, records):
            members = {p["id"] for p in self.population()}
            me = self.responders()[0]["id"]
            before = len(self.players)
            yield from super().on_round_end(records)  # the snapshot's entries are set once it resumes
            if len(self.players) > before:
                games = deal_samples(records, me, members)
                opponents = sorted({o for o, _ in games})
                mu, _, n = self.standings.relative.matrices([self.players[-1]["id"], *opponents])
                joined.append((games, mu[0, 1:], n[0, 1:], opponents))

    trainer = Watched(PSROConfig(epochs=2, rounds=4, seed=0, output_dir=str(tmp_path / "run"), progress=False,
                                 save_strategy="no"))
    trainer.train(str(_warm(tmp_path)), random_game(19), grpo_config={"learning_rate": 1e-2})
    trainer.engine.close()
    assert joined, "no responder joined"
    for games, mu, n, opponents in joined:
        for k, opp in enumerate(opponents):
            ds = [d for o, d in games if o == opp]
            assert n[k] == len(ds) and mu[k] == pytest.approx(np.mean(ds))
