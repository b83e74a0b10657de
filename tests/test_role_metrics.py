"""The round's metrics per role and per player: reward and win rate from the games, loss from an
updater that reports it per player (``loss/<player id>``)."""

import pytest

from autocurricula.loop.rounds import by_role, learner_roles, rollout_metrics, update_metrics
from autocurricula.records import GameRecord, Player


def game(gid, players, rewards, error=None):
    record = GameRecord(gid, [dict(p) for p in players])
    record.rewards, record.error = rewards, error
    return record


MAIN = {"id": "main-0", "role": "main", "frozen": False}
EXP_A = {"id": "exp-0", "role": "exploiter", "frozen": False}
EXP_B = {"id": "exp-1", "role": "exploiter", "frozen": False}
SNAP = {"id": "main-0@1", "role": "main", "frozen": True}
POOL = [MAIN, EXP_A, EXP_B, SNAP]


def trainable(p):
    return not p["frozen"]


def test_reward_and_win_rate_per_role_and_per_player_of_a_role_with_several_learners():
    records = [game("g0", [MAIN, EXP_A], [1.0, -1.0]),
               game("g1", [EXP_B, MAIN], [0.0, 0.0]),           # a draw: half a win each
               game("g2", [EXP_A, SNAP], [1.0, -1.0]),          # the snapshot's seat is not a learner's
               game("g3", [MAIN, EXP_B], [9.0, 9.0], error="boom")]  # a failed game counts for nothing
    m = rollout_metrics(records, [], POOL, trainable)
    assert m["rollout/reward_mean"] == pytest.approx((1 - 1 + 0 + 0 + 1) / 5)
    assert m["reward/role/main"] == pytest.approx(0.5) and m["win_rate/role/main"] == pytest.approx(0.75)
    assert m["reward/role/exploiter"] == pytest.approx(0.0)
    assert m["win_rate/role/exploiter"] == pytest.approx((0 + 1 + 0.5) / 3)
    # the exploiter role has two learners: each has its own series; main has one, so none
    assert m["reward/player/exp-0"] == 0.0 and m["win_rate/player/exp-0"] == 0.5
    assert m["reward/player/exp-1"] == 0.0 and m["win_rate/player/exp-1"] == 0.5
    assert not any(k.endswith("/player/main-0") or "main-0@1" in k for k in m)


def test_a_multi_player_game_scores_each_seat_against_every_other():
    players = [{"id": f"p{i}", "role": "seat", "frozen": False} for i in range(3)]
    m = rollout_metrics([game("g", players, [3.0, 1.0, 1.0])], [], players, trainable)
    # p0 beats both (1), p1 and p2 lose to p0 and draw each other (0.25 each)
    assert m["win_rate/role/seat"] == pytest.approx((1 + 0.25 + 0.25) / 3)
    assert m["win_rate/player/p0"] == 1.0 and m["win_rate/player/p1"] == 0.25


def test_players_without_a_role_and_seats_a_custom_match_made():
    pool = [Player(id="solo", version=0)]  # a Player's default role
    outsider = {"id": "visitor", "frozen": False}  # no role, not in the pool
    m = rollout_metrics([game("g", [pool[0], outsider], [1.0, 0.0])], [], pool, lambda p: not p.get("frozen"))
    assert m["reward/role/player"] == pytest.approx(0.5)  # both count under the default role "player"
    assert m["reward/player/solo"] == 1.0 and m["reward/player/visitor"] == 0.0
    assert learner_roles(pool, lambda p: True) == {"solo": "player"}


def test_no_learner_seat_no_role_metrics():
    m = rollout_metrics([game("g", [SNAP, SNAP], [1.0, -1.0])], [], POOL, trainable)
    assert not any(k.startswith(("reward/", "win_rate/")) for k in m) and "rollout/reward_mean" not in m


def test_loss_per_role_is_taken_from_the_updaters_per_player_losses():
    """The fused update reports ``loss`` (all players); an updater that also reports ``loss/<player>``
    gets ``loss/role/<role>`` (summed, as train/loss sums players) and per player in a role of several."""
    roles = learner_roles(POOL, trainable)
    assert roles == {"main-0": "main", "exp-0": "exploiter", "exp-1": "exploiter"}
    out = {"loss": 0.6, "kl": 0.0, "tokens": 12, "grad_norm/main-0": 1.0, "version/main-0": 3,
           "loss/main-0": 0.1, "loss/exp-0": 0.2, "loss/exp-1": 0.3}
    m = update_metrics(out, 0.5, {}, roles)
    assert m["train/loss"] == 0.6
    assert m["loss/role/main"] == pytest.approx(0.1) and m["loss/role/exploiter"] == pytest.approx(0.5)
    assert m["loss/player/exp-0"] == pytest.approx(0.2) and m["loss/player/exp-1"] == pytest.approx(0.3)
    assert "loss/player/main-0" not in m
    # today's update reports no per-player loss: nothing per role, nothing else changes
    bare = {k: v for k, v in out.items() if not k.startswith("loss/")}
    assert not any(k.startswith("loss/") for k in update_metrics(bare, 0.5, {}, roles))
    assert update_metrics(bare, 0.5, {}, roles) == update_metrics(bare, 0.5, {})
    # a frozen snapshot's or an unknown player's loss is not a learner's
    assert "loss/role/main" not in update_metrics({"loss/main-0@1": 0.4, "loss/ghost": 1.0}, 0.1, {}, roles)


def test_by_role_leaves_out_players_without_a_role():
    got = by_role("x", {"a": [1.0, 3.0], "b": [5.0], "c": [7.0], "z": [100.0]}, {"a": "r", "b": "r", "c": "s"},
                  lambda v: sum(v) / len(v))
    assert got == {"x/player/a": 2.0, "x/player/b": 5.0, "x/role/r": 3.0, "x/role/s": 7.0}
