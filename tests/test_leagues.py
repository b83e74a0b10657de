"""League schedules on a fake pool: PFSP, AlphaStar match shares, snapshot rules."""

from collections import Counter

import numpy as np
import pytest

from autocurricula.leagues import LeagueConfig, LeagueTrainer, SelfPlayConfig, SelfPlayTrainer, pfsp
from autocurricula.loop.rating import Payoff
from autocurricula.records import Player

from league_doubles import ListedPlayers


def test_pfsp_weightings_by_hand():
    x = [0.1, 0.5, 0.9]
    np.testing.assert_allclose(pfsp(x, "squared"), np.array([0.81, 0.25, 0.01]) / 1.07)
    np.testing.assert_allclose(pfsp(x, "variance"), np.array([0.09, 0.25, 0.09]) / 0.43)
    np.testing.assert_allclose(pfsp(x, "linear"), np.array([0.9, 0.5, 0.1]) / 1.5)
    np.testing.assert_allclose(pfsp(x, "linear_capped"), np.array([0.5, 0.5, 0.1]) / 1.1)


def test_pfsp_all_zero_weights_is_uniform_not_nan():
    p = pfsp([1.0, 1.0, 1.0, 1.0], "squared")  # DI-engine divides 0 by 0 here
    np.testing.assert_allclose(p, [0.25] * 4)
    np.testing.assert_allclose(pfsp([0.0, 1.0], "variance"), [0.5, 0.5])
    with pytest.raises(ValueError, match="weighting"):
        pfsp([0.5], "cubic")


class League(ListedPlayers, LeagueTrainer):
    pass


def league(players, payoff=None, opponents=None, **rules):
    t = League(LeagueConfig(progress=False, rules=rules), opponents=opponents)
    t.listed = players
    t.payoff = payoff or Payoff()
    t.step = 0
    return t


def p(pid, role, frozen=False, **kw):
    return Player(id=pid, role=role, frozen=frozen, **kw)


def test_main_agent_shares_follow_alphastar():
    main = p("main", "main_agent")
    past = [p("main-old", "main_agent", True, snapshot_of="main"), p("other-old", "main_agent", True, snapshot_of="x")]
    t = league([main, *past])
    counts = Counter(t.opponent_for(main)["id"] for _ in range(20000))
    # 50% PFSP over past (win rates 0.5 -> equal weights), otherwise self-play except forgetting checks:
    # against main-old the win rate 0.5 < 0.7 triggers the forgetting branch (15%)
    assert counts["main"] / 20000 == pytest.approx(0.35, abs=0.02)
    assert (counts["main-old"] + counts["other-old"]) / 20000 == pytest.approx(0.65, abs=0.02)
    assert counts["main-old"] > counts["other-old"]  # the verification branch only replays main's own past


def test_anchor_share_sends_main_agents_to_the_fixed_opponents():
    main, exp = p("main", "main_agent"), p("exp", "main_exploiter")
    rnd, mm = p("random", "random", True, policy=str), p("minimax", "minimax", True, policy=str)
    past = [p(f"main-old{i}", "main_agent", True, snapshot_of="main") for i in range(20)]
    for share in (0.0, 0.5):
        t = league([main, exp, *past, rnd, mm], opponents=[{"id": "random", "policy": str},
                                                           {"id": "minimax", "policy": str}], anchor_share=share)
        counts = Counter(t.opponent_for(main)["id"] for _ in range(20000))
        fixed = (counts["random"] + counts["minimax"]) / 20000
        if share == 0:  # AlphaStar: the anchors are two of 22 past players in PFSP
            assert fixed < 0.1
        else:  # half the games uniformly over the anchors, the rest by the league rules
            assert fixed == pytest.approx(0.5 + 0.5 * fixed_share_without(t), abs=0.02)
            assert counts["random"] == pytest.approx(counts["minimax"], rel=0.1)
        assert Counter(t.opponent_for(exp)["id"] for _ in range(200)) == Counter({"main": 200})  # exploiters unchanged
    t.opponents = [{"policy": str}]
    with pytest.raises(ValueError, match="'id'"):
        t.opponent_for(main)
    with pytest.raises(ValueError, match="anchor_share"):
        LeagueConfig(rules={"anchor_share": 1.5})


def test_exploiter_games_sets_the_exploiters_share_of_a_round():
    main, mexp, lexp = p("main", "main_agent"), p("mexp", "main_exploiter"), p("lexp", "league_exploiter")
    past = [p("main-old", "main_agent", True, snapshot_of="main")]
    for exploiter_games, per_exploiter in ((None, 12), (3, 3)):
        t = league([main, mexp, lexp, *past], games_per_learner=12, exploiter_games=exploiter_games)
        games = t.match()
        assert len(games) == 12 + 2 * per_exploiter  # the main agent keeps its 12 whatever the exploiters get
        # the league exploiter's games are against the pool's past, never the live main agent
        assert sum(any(x["id"] == "lexp" for x in g) for g in games) == per_exploiter
    with pytest.raises(ValueError, match="main_exploiters=0"):
        LeagueConfig(rules={"exploiter_games": 0})  # an exploiter that never plays would still be snapshotted


def fixed_share_without(t):
    share, t.config.rules.anchor_share = t.config.rules.anchor_share, 0.0
    counts = Counter(t.opponent_for(p("main", "main_agent"))["id"] for _ in range(20000))
    t.config.rules.anchor_share = share
    return (counts["random"] + counts["minimax"]) / 20000


def test_main_agent_plays_exploiters_it_cannot_beat():
    main, exp = p("main", "main_agent"), p("exp", "main_exploiter")
    exp_old = p("exp-old", "main_exploiter", True, snapshot_of="exp")
    payoff = Payoff()
    for _ in range(20):
        payoff.update("main", "exp-old", "loss")
    t = league([main, exp, exp_old], payoff)
    counts = Counter(t.opponent_for(main)["id"] for _ in range(10000))
    assert counts["exp-old"] / 10000 == pytest.approx(0.65, abs=0.03)  # PFSP (only past) + verification


def test_main_exploiter_targets_main_or_its_past():
    main, expl = p("main", "main_agent"), p("expl", "main_exploiter")
    old = p("main-old", "main_agent", True, snapshot_of="main")
    payoff = Payoff()
    t = league([main, expl, old], payoff)
    assert t.opponent_for(expl)["id"] == "main"  # 0.5 > 0.1
    for _ in range(30):
        payoff.update("expl", "main", "loss")
    assert {t.opponent_for(expl)["id"] for _ in range(50)} == {"main-old"}  # hopeless: curriculum via past


def test_league_exploiter_uses_linear_capped_pfsp():
    le = p("le", "league_exploiter")
    a, b = p("a", "main_agent", True), p("b", "main_agent", True)
    payoff = Payoff()
    for _ in range(50):
        payoff.update("le", "a", "win")  # win rate ~1 -> weight ~0
    t = league([p("main", "main_agent"), le, a, b], payoff)
    counts = Counter(t.opponent_for(le)["id"] for _ in range(2000))
    assert counts["b"] > 0.95 * 2000


def test_snapshot_readiness_uses_win_rate_or_budget():
    main = p("main", "main_agent")
    old = p("old", "main_agent", True, snapshot_of="main")
    payoff = Payoff()
    t = league([main, old], payoff, snapshot_min_rounds=2, snapshot_max_rounds=5)
    t.load_extra_state({"last_snapshot": {"main": 0}})
    t.step = 0
    assert not t.ready_to_snapshot(main)  # too early
    t.step = 2
    assert not t.ready_to_snapshot(main)  # 0.5 win rate, budget not reached
    for _ in range(40):
        payoff.update("main", "old", "win")
    assert t.ready_to_snapshot(main)  # beats every past player
    payoff2 = Payoff()
    t.payoff = payoff2
    t.step = 4
    assert t.ready_to_snapshot(main)  # budget reached


def test_selfplay_share_of_past_opponents():
    class SelfPlay(ListedPlayers, SelfPlayTrainer):
        pass

    t = SelfPlay(SelfPlayConfig(rules={"games_per_round": 4000, "past_share": 0.25}, progress=False))
    main = p("main", "main")
    t.listed = [main, p("main-old", "main", True)]
    games = t.match()
    past = sum(any(q["id"] == "main-old" for q in g) for g in games)
    assert past / len(games) == pytest.approx(0.25, abs=0.03)
    vs_past = [g for g in games if any(q["id"] == "main-old" for q in g)]
    assert sum(g[0]["id"] == "main" for g in vs_past) / len(vs_past) == pytest.approx(0.5, abs=0.06)  # seats alternate


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="main_agents"):
        LeagueConfig(rules={"main_agents": 0})
    with pytest.raises(ValueError, match="selfplay_share"):
        LeagueConfig(rules={"selfplay_share": 0.8, "pfsp_share": 0.5})


def test_fictitious_play_samples_past_by_pfsp():
    from autocurricula.leagues import FictitiousConfig, FictitiousPlayTrainer

    class Fictitious(ListedPlayers, FictitiousPlayTrainer):
        pass

    t = Fictitious(FictitiousConfig(rules={"games_per_round": 3000, "weighting": "squared"}, progress=False))
    me = p("me", "learner")
    weak, strong = p("weak", "learner", True), p("strong", "learner", True)
    payoff = Payoff()
    for _ in range(50):
        payoff.update("me", "weak", "win")
    t.listed, t.payoff = [me, weak, strong], payoff
    opponents = Counter(next(q["id"] for q in g if q["id"] != "me") for g in t.match())
    assert opponents["strong"] > 0.95 * 3000  # PFSP "squared": beaten opponents are rarely replayed
    with pytest.raises(ValueError, match="weighting"):
        FictitiousConfig(rules={"weighting": "cubic"})


def test_round_robin_plays_every_pair_in_both_seat_orders(tiny_model_path, tmp_path):
    from autocurricula import RoundRobinConfig, RoundRobinTrainer
    from toy_games import digits, first_digit_policy

    scripted = {"id": "digits", "role": "scripted", "policy": first_digit_policy}
    t = RoundRobinTrainer(RoundRobinConfig(rules={"roles": ["red", "blue"]}, epochs=2, rounds=1, matches=2,
                                           max_tokens=2, progress=False, ratings={"bt_bootstrap": 0},
                                           output_dir=str(tmp_path)),
                          opponents=[scripted])
    t.train(str(tiny_model_path), digits)
    ids = [p["id"] for p in t.players]
    assert ids == ["red-0", "blue-0", "digits"]  # the same population every epoch
    games = [tuple(g["players"]) for g in t.match_history]
    assert len(games) == 2 * 3 * 2 * 2  # epochs x pairs x seat orders x matches
    assert {g: games.count(g) for g in set(games)} == {(a, b): 4 for a in ids for b in ids if a != b}
    assert {row["id"] for row in t.leaderboard.rows} == set(ids)
    with pytest.raises(ValueError, match="roles"):
        RoundRobinConfig(rules={"roles": []})
    t.engine.close()


def test_a_subclass_changes_one_roles_rule_through_its_public_method():
    main, mexp, lexp = p("main", "main_agent"), p("mexp", "main_exploiter"), p("lexp", "league_exploiter")
    old = p("main-old", "main_agent", True, snapshot_of="main")

    class OldSelves(League):
        def main_exploiter_opponent(self, player):
            return self.pfsp_opponent(player, self.historical(), "uniform")

    t = OldSelves(LeagueConfig(progress=False, rules={"games_per_learner": 20}))
    t.listed, t.payoff, t.step = [main, mexp, lexp, old], Payoff(), 0
    assert {t.opponent_for(mexp)["id"] for _ in range(50)} == {"main-old"}  # the override
    assert {t.opponent_for(lexp)["id"] for _ in range(50)} == {"main-old"}  # PFSP over the one frozen player
    assert {t.opponent_for(main)["id"] for _ in range(200)} == {"main", "main-old"}  # the main agent's rules
    games = t.match()
    assert len(games) == 60 and all("main-old" in {x["id"] for x in g} for g in games if mexp in g)


def test_a_built_in_league_promotes_the_base_config_or_refuses_a_foreign_one(caplog):
    import logging

    from autocurricula import AutocurriculumConfig
    from autocurricula.leagues import FictitiousConfig, FictitiousPlayTrainer, RoundRobinConfig, RoundRobinTrainer

    base = AutocurriculumConfig(epochs=1, rounds=3, seed=7, max_tokens=2, credit="grpo",
                                ratings={"bt_bootstrap": 0})
    with caplog.at_level(logging.INFO, logger="autocurricula.leagues.promote"):
        t = SelfPlayTrainer(base, epochs=2)
    assert type(t.config) is SelfPlayConfig and "SelfPlayConfig with the default SelfPlayRules" in caplog.text
    assert (t.config.epochs, t.config.rounds, t.config.seed, t.config.max_tokens) == (2, 3, 7, 2)
    assert t.config.credit == base.credit and t.config.ratings == base.ratings
    assert t.config.rules == SelfPlayConfig().rules  # the league's own defaults
    for trainer, config_class in ((LeagueTrainer, LeagueConfig), (FictitiousPlayTrainer, FictitiousConfig),
                                  (RoundRobinTrainer, RoundRobinConfig)):
        assert type(trainer(base).config) is config_class
    own = SelfPlayConfig(rules={"games_per_round": 5})
    assert SelfPlayTrainer(own).config is own  # the league's own config, as given
    with pytest.raises(TypeError, match=r"LeagueTrainer needs a LeagueConfig \(its rules: LeagueRules\).*got a "
                                        r"SelfPlayConfig.*build a LeagueConfig\(rules="):
        LeagueTrainer(own)


def test_mirror_selfplay_deploys_its_last_iterate_and_fictitious_selfplay_its_meta_strategy(tmp_path):
    from autocurricula.loop.config import RatingConfig
    from autocurricula.loop.standings import Standings

    class SelfPlay(ListedPlayers, SelfPlayTrainer):
        pass

    main, old = p("main", "main"), p("main-old", "main", True, snapshot_of="main")
    for share, expected in ((0.0, {"main": 1.0}), (0.25, {"main": 0.5, "main-old": 0.5})):
        t = SelfPlay(SelfPlayConfig(rules={"past_share": share}, progress=False))
        t.listed = [main, old]
        t.standings = Standings(RatingConfig(), tmp_path, 0)
        # no game between them yet: a meta-game over both would be uniform, one over the main alone is the main
        assert t.deployable_mixture() == pytest.approx(expected)


def test_mirror_selfplay_deploys_the_average_of_its_last_iterates(tmp_path):
    """``past_share=0``: the main player and its latest snapshots, newest first, equally weighted, in
    ``deployable_mixture()`` and the leaderboard's deploy column alike, even where games among them
    were recorded (a run resumed from ``past_share > 0``)."""
    from autocurricula.loop.config import RatingConfig
    from autocurricula.loop.standings import Standings

    class SelfPlay(ListedPlayers, SelfPlayTrainer):
        pass

    snaps = [p(f"main-{i}", "main", True, snapshot_of="main") for i in range(5)]  # oldest first, as they joined
    other, scripted = p("other-old", "main", True, snapshot_of="x"), p("random", "random", True, policy=lambda q: "1")
    everyone = ["main"] + [f"main-{i}" for i in (4, 3, 2, 1, 0)]  # newest first; other-old is not main's
    for last, expected in ((1, everyone[:1]), (3, everyone[:3]), (9, everyone)):
        t = SelfPlay(SelfPlayConfig(rules={"past_share": 0.0, "average_last": last}, progress=False))
        t.listed = [scripted, p("main", "main"), *snaps[:2], other, *snaps[2:]]
        t.standings = Standings(RatingConfig(bt_bootstrap=0), tmp_path, 0)
        for _ in range(30):  # main beats its newest snapshot: a meta-game over them would drop main-4
            t.standings.relative.update_match(["main", "main-4"], [1, -1])
        assert [q["id"] for q in t.meta_population()] == expected
        assert t.deployable_mixture() == pytest.approx({pid: 1 / len(expected) for pid in expected})
        deploy = {r["id"]: r["deploy"] for r in t.leaderboard.to_dicts() if r.get("deploy")}
        assert deploy == pytest.approx(t.deployable_mixture())
    for bad, hint in (({"average_last": 0}, "average_last must be >= 1"),
                      ({"average_last": 2, "past_share": 0.2}, "set past_share=0 or average_last=1")):
        with pytest.raises(ValueError, match=hint):
            SelfPlayConfig(progress=False, rules=bad)
