"""Kuhn poker league: the example's machinery on a tiny budget, the league's Nash mixture as a policy,
and the meta-strategy in the leaderboard printout and the Hub's league card."""

import json
import random
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from autocurricula.eval import kuhn
from autocurricula.eval.meta import nash_mixture, zero_sum_nash
from autocurricula.games import kuhn_poker
from autocurricula.loop.rating import Elo, Payoff, RelativePayoff, format_leaderboard, leaderboard_rows, nash_weights
from autocurricula.records import Player

from league_doubles import ListedPlayers

ROOT = Path(__file__).resolve().parents[1]
ALWAYS = dict.fromkeys(kuhn.INFOSETS, 1.0)
NEVER = dict.fromkeys(kuhn.INFOSETS, 0.0)
NASH = kuhn_poker.equilibrium_strategy(1 / 3)


@pytest.mark.slow  # a subprocess: warm-up, league and self-play on the tiny budget
def test_the_example_runs_on_a_tiny_budget_and_reports(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "kuhn_league.py"), "--smoke",
                          "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                         cwd=ROOT, env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    keys = ("exploitability_mixture", "exploitability_latest", "exploitability_selfplay")
    assert set(keys) <= set(summary) and summary["credit"] == "branch"
    for k in keys + ("exploitability_base",):
        assert 0.0 <= summary[k] <= 2.0, (k, summary[k])  # a Kuhn policy can lose at most 2 chips a hand
    assert all(len(summary["per_epoch"][c]) == 1 for c in ("mixture", "latest", "selfplay"))
    assert summary["references"] == {"nash": 0.0, "uniform": 0.4583, "always_bet_call": 0.3333}
    assert (tmp_path / "run" / "exploitability.png").stat().st_size > 1000
    rows = json.loads((tmp_path / "run" / "exploitability.json").read_text())["rows"]
    assert [r["run"] for r in rows] == ["league", "selfplay"]
    header = next(line for line in out.stdout.splitlines() if line.startswith("rank "))
    assert header.split()[-1] == "nash"  # the leaderboard printout carries the league's meta-strategy


def test_warmup_targets_hold_the_private_card():
    strategy = kuhn_poker.warmup_strategy(0)
    examples = kuhn_poker.warmup_examples(6000, 0)
    counts = {}
    for prompt, action in examples:
        card, history, _ = kuhn_poker.parse_prompt(prompt)
        n, k = counts.get(kuhn_poker.infoset(card, history), (0, 0))
        counts[kuhn_poker.infoset(card, history)] = (n + 1, k + (action in ("bet", "call")))
    assert set(counts) == set(kuhn.INFOSETS)
    assert all(abs(k / n - strategy[s]) < 0.08 for s, (n, k) in counts.items())
    # the same history with different cards has different targets: a card-blind base cannot match them
    assert len({round(strategy[f"{c}:"], 3) for c in "JQK"}) == 3
    assert all(0.2 <= p <= 0.8 for p in strategy.values())
    with pytest.raises(ValueError, match="spread"):
        kuhn_poker.warmup_strategy(0, (0.9, 0.1))


def _league(strategies: dict, frozen=(), payoff=None, relative=None):
    import tempfile

    from autocurricula.loop.config import RatingConfig
    from autocurricula.loop.standings import Standings

    players = [Player(id=pid, role="main_agent", frozen=pid in frozen) for pid in strategies]
    players.append(Player(id="random", role="random", policy=kuhn_poker.random_policy, frozen=True))
    standings = Standings(RatingConfig(), tempfile.mkdtemp(), seed=0)
    if relative is not None:
        standings.relative = relative
    return SimpleNamespace(players=players, engine=None, payoff=payoff or Payoff(), standings=standings,
                           elo=SimpleNamespace(rating=lambda pid: 0.0))


def test_the_mixture_is_the_snapshots_strategies_under_the_nash_weights(monkeypatch):
    strategies = {"main": ALWAYS, "snap-1": NEVER, "snap-2": NASH, "snap-3": kuhn.uniform_strategy()}
    reads = []

    def read(engine, player, **kw):
        reads.append(player)
        return strategies[player]

    monkeypatch.setattr(kuhn, "read_strategy", read)
    payoff, relative = Payoff(), RelativePayoff()
    for _ in range(30):  # a league where snap-1 beats everyone in the games
        for other in ("main", "snap-2", "snap-3"):
            payoff.update("snap-1", other, "win")
            relative.update_match(["snap-1", other], [1.0, -1.0])
    trainer = _league(strategies, frozen=("snap-1", "snap-2", "snap-3"), payoff=payoff, relative=relative)
    league = kuhn.LeagueStrategies(meta="chips", backend="python")
    figures = league.figures(trainer)
    ids = list(strategies)
    order = [strategies[i] for i in ids]
    chips = zero_sum_nash(kuhn.chip_payoffs(order))[0]
    assert figures["exploitability_mixture"] == pytest.approx(
        kuhn.exploitability(kuhn.mixture_strategy(order, chips), backend="python"))
    assert figures["exploitability_mixture"] < 1e-9  # the exact chip game puts its weight on Nash
    assert figures["mixture"] == {pid: round(float(w), 4) for pid, w in zip(ids, chips) if w > 0}
    winrate = nash_mixture(payoff.matrix(ids))
    assert winrate.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert trainer.standings.meta_strategy(ids) == {"main": 0.0, "snap-1": 1.0, "snap-2": 0.0, "snap-3": 0.0}
    assert figures["exploitability_mixture_league"] == pytest.approx(kuhn.exploitability(NEVER, backend="python"))
    assert figures["exploitability_latest"] == pytest.approx(kuhn.exploitability(ALWAYS, backend="python"))
    assert "random" not in reads and sorted(reads) == sorted(ids)
    league.figures(trainer)  # frozen snapshots are read once, the learner every time
    assert sorted(reads) == sorted(ids + ["main"])


def test_chip_payoffs_are_the_exact_seat_averaged_values():
    m = kuhn.chip_payoffs([NASH, ALWAYS, NEVER])
    assert np.allclose(m, -m.T)
    want = (kuhn_poker.exact_value(NASH, ALWAYS) - kuhn_poker.exact_value(ALWAYS, NASH)) / 2
    assert m[0, 1] == pytest.approx(want) and m[0, 1] > 0 and m[0, 2] > 0  # Nash wins from both pure policies
    assert kuhn.meta_mixture([NASH, NASH], meta="chips").tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="win_rates"):
        kuhn.meta_mixture([NASH], meta="league")
    with pytest.raises(ValueError, match="meta must be"):
        kuhn.LeagueStrategies(meta="elo")


def test_leaderboard_prints_the_leagues_nash_weight():
    payoff, elo = Payoff(), Elo()
    for _ in range(20):  # rock-paper-scissors among a, b, c; d loses to everyone
        for x, y in (("a", "b"), ("b", "c"), ("c", "a"), ("a", "d"), ("b", "d"), ("c", "d")):
            payoff.update(x, y, "win")
            elo.update([x, y], [1, 0])
    players = [{"id": p, "role": "main_agent", "frozen": False, "epoch": 0} for p in "abcd"]
    nash = nash_weights(payoff, list("abcd"))
    assert nash == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3, "d": 0.0})
    text = format_leaderboard(leaderboard_rows(players, elo, nash=nash))
    header, *lines = text.splitlines()
    assert header.split()[-1] == "nash"
    weights = {line.split()[1]: line.split()[-1] for line in lines}
    assert weights == {"a": "0.333", "b": "0.333", "c": "0.333", "d": "0.000"}
    assert "nash" not in format_leaderboard(leaderboard_rows(players, elo))  # no weights given, no column


def test_the_trainers_leaderboard_and_the_hub_card_carry_the_meta_strategy(tmp_path):
    from autocurricula.loop.config import RatingConfig
    from autocurricula.publish.hub import league_card
    from autocurricula.loop.standings import Standings

    payoff, elo = Payoff(), Elo()
    standings = Standings(RatingConfig(bt_bootstrap=0), tmp_path, seed=0)
    for _ in range(20):
        payoff.update("main", "snap", "win")
        elo.update(["main", "snap"], [1, 0])
        standings.relative.update_match(["main", "snap"], [1.0, -1.0])
    players = [Player(id="main", role="main_agent", frozen=False, epoch=0),
               Player(id="snap", role="main_agent", frozen=True, epoch=0, parent="main")]
    standings.elo, standings.payoff = elo, payoff
    run = SimpleNamespace(pool=SimpleNamespace(players=players), standings=standings, model_name="/nowhere/tiny",
                          game_name="kuhn_poker")
    board = standings.leaderboard(players)
    assert [(r["id"], r["nash"]) for r in board.rows] == [("main", 1.0), ("snap", 0.0)]
    assert str(board).splitlines()[1].split()[-1] == "1.000"
    card = league_card(run, board, {"main": 1.0}, {"seed": 0}, "LeagueTrainer", 1)
    assert "| Nash weight |" in card and "| 1.000 |" in card.split("| main |")[1].splitlines()[0]
    section = card.split("## Meta-strategy")[1].split("##")[0]
    assert "`main` 1.000" in section and "`snap`" not in section  # only players with weight > 0 are listed


def _example():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import kuhn_league
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return kuhn_league


def test_the_examples_exploiters_play_the_nash_mixture_of_the_frozen_players(monkeypatch, tmp_path):
    kuhn_league = _example()

    class Mixture(ListedPlayers, kuhn_league.MixtureLeague):
        pass

    strategies = {"main": NEVER, "snap-always": ALWAYS, "snap-nash": NASH, "snap-never": NEVER}
    monkeypatch.setattr(kuhn, "read_strategy", lambda engine, player, **kw: strategies[player])
    trainer = Mixture(kuhn_league.KuhnLeagueConfig(output_dir=str(tmp_path), seed=0), kuhn.LeagueStrategies())
    trainer.listed = _league(strategies, frozen=("snap-always", "snap-nash", "snap-never")).players
    # Nash wins chips from both pure policies, so the chip game's mixture is all on it
    picked = {trainer.nash_opponent()["id"] for _ in range(20)}
    assert picked == {"snap-nash"}
    exploiter = Player(id="lexp", role="league_exploiter", frozen=False)
    assert trainer.main_exploiter_opponent(exploiter)["id"] == "snap-nash"
    assert trainer.opponent_for(exploiter)["id"] == "snap-nash"


def test_the_examples_exploiters_learn_at_their_own_rate(recwarn):
    kuhn_league = _example()

    class League(ListedPlayers, kuhn_league.KuhnLeague):
        pass

    t = League(kuhn_league.KuhnLeagueConfig(rules={"exploiter_learning_rate": 1e-2,
                                                   "league_exploiter_reset_prob": 0.0}))
    t.listed = [Player(id="main", role="main_agent", frozen=False),
                Player(id="lexp", role="league_exploiter", frozen=False)]
    t.run = SimpleNamespace(grpo=SimpleNamespace(learning_rate=5e-3))
    assert (t.learning_rate_of("main"), t.learning_rate_of("lexp")) == (5e-3, 1e-2)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]  # the example's own field
    with pytest.raises(ValueError, match="exploiter_learning_rate"):
        kuhn_league.KuhnLeagueConfig(rules={"exploiter_learning_rate": 0.0})


def test_the_callback_logs_both_meta_games(monkeypatch):
    strategies = {"main": ALWAYS, "snap": NASH}
    monkeypatch.setattr(kuhn, "read_strategy", lambda engine, player, **kw: strategies[player])
    trainer = _league(strategies, frozen=("snap",))
    chips = kuhn.exploitability_callback(meta="chips", backend="python")(trainer)
    league = kuhn.exploitability_callback(backend="python")(trainer)  # default: the league's win rates
    assert set(chips) == {"eval/exploitability_latest", "eval/exploitability_mixture",
                          "eval/exploitability_mixture_league", "eval/exploitability_mixture_chips"}
    assert chips["eval/exploitability_mixture"] == chips["eval/exploitability_mixture_chips"] < 1e-9
    assert league["eval/exploitability_mixture"] == league["eval/exploitability_mixture_league"]
    # no games yet: the win-rate game is even, its mixture is half each
    assert league["eval/exploitability_mixture"] == pytest.approx(
        kuhn.exploitability(kuhn.mixture_strategy([ALWAYS, NASH], [0.5, 0.5]), backend="python"))


def test_least_exploitable_mixture_is_the_best_any_weights_reach():
    rng = random.Random(3)
    population = [{k: rng.random() for k in kuhn.INFOSETS} for _ in range(12)]
    population += [dict.fromkeys(kuhn.INFOSETS, 1.0), dict.fromkeys(kuhn.INFOSETS, 0.0)]
    weights, value = kuhn.least_exploitable_mixture(population)
    played = kuhn.exploitability(kuhn.mixture_strategy(population, list(weights)), backend="python")
    assert value == pytest.approx(played, abs=1e-9)  # the LP's value is the mixture's exploitability
    others = [kuhn.mixture_strategy(population, list(np.random.default_rng(s).dirichlet(np.ones(14)))) for s in range(20)]
    others += population + [kuhn.mixture_strategy(population, list(kuhn.meta_mixture(population)))]
    # 1e-9: the LP's answers are exact to about 1e-11 of the payoff range, on any machine's rounding
    assert value <= min(kuhn.exploitability(s, backend="python") for s in others) + 1e-9
    assert kuhn.least_exploitable_mixture(population[:1])[1] == pytest.approx(
        kuhn.exploitability(population[0], backend="python"), abs=1e-9)
    # with an equilibrium among the members, nothing is exploitable
    assert kuhn.least_exploitable_mixture(population + [NASH])[1] == pytest.approx(0.0, abs=1e-9)
