"""Credit assigners on hand-computed numbers."""

import json
import math

import pytest

from autocurricula.credit import RAE, Turn, assign_credit, grpo_advantages


def turn(player="p", game_id="g0", role="X", reward=0.0, **kw):
    return Turn(player, game_id, role, [1, 2], [3], [-0.5], reward=reward, **kw)


def test_grpo_group_scaling_by_hand():
    ts = [turn(game_id=f"g{i}", reward=r, group="seed-1") for i, r in enumerate([1, 0, 0, 1])]
    std = math.sqrt(4 * 0.25 / 3)  # Bessel-corrected, as trl's nanstd
    a = 0.5 / (std + 1e-4)
    assert grpo_advantages(ts) == pytest.approx([a, -a, -a, a])
    assert grpo_advantages(ts, "none") == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_batch_scaling_and_groups():
    ts = [turn(reward=2, group="a"), turn(reward=0, group="a"), turn(reward=5, group="b"), turn(reward=1, group="b")]
    rewards = [2, 0, 5, 1]
    mean = sum(rewards) / 4
    batch_std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)
    want = [1 / (batch_std + 1e-4), -1 / (batch_std + 1e-4), 2 / (batch_std + 1e-4), -2 / (batch_std + 1e-4)]
    assert grpo_advantages(ts, "batch") == pytest.approx(want)


def test_grpo_hierarchy_compares_only_same_level_and_parent():
    top = [turn(reward=1, group="s"), turn(reward=-1, group="s")]
    sub = [turn(reward=10, group="s", level=1, parent="g0"), turn(reward=0, group="s", level=1, parent="g0"),
           turn(reward=7, group="s", level=1, parent="g1")]  # alone in its parent: A = 0
    adv = grpo_advantages(top + sub, "none")
    assert adv == pytest.approx([1, -1, 5, -5, 0])


def test_grpo_rejects_missing_rewards():
    with pytest.raises(ValueError, match="no reward"):
        grpo_advantages([Turn("p", "g", "X", [1], [2], [-1.0])])


def test_rae_reads_baseline_before_update():
    rae = RAE()
    xs = [turn(game_id=f"g{i}", role="X", reward=r, game="ttt") for i, r in enumerate([1, 0, 1])]
    adv = rae.advantages(xs)
    # b: 0 -> 0.05 -> 0.0475 -> 0.095125
    assert adv == pytest.approx([1.0, -0.05, 1 - 0.0475])
    assert rae.baselines["ttt|X"] == pytest.approx(0.95 * 0.0475 + 0.05)


def test_rae_one_update_per_episode_and_roles_separate():
    rae = RAE(alpha=0.5)
    ts = [turn(game_id="g0", role="X", reward=1, game="ttt"), turn(game_id="g0", role="X", reward=1, game="ttt"),
          turn(game_id="g0", role="O", reward=-1, game="ttt"), turn(game_id="g1", role="X", reward=0, game="ttt")]
    adv = rae.advantages(ts)
    assert adv == pytest.approx([1, 1, -1, -0.5])  # g1's X reads b = 0.5 (one update from g0)
    assert rae.baselines == pytest.approx({"ttt|X": 0.25, "ttt|O": -0.5})


def test_rae_per_player_and_state_round_trip():
    rae = RAE(per_player=True)
    rae.advantages([turn(player="a", reward=1), turn(player="b", game_id="g1", reward=-1)])
    assert set(rae.baselines) == {"game|X|a", "game|X|b"}
    restored = RAE()
    restored.load_state_dict(json.loads(json.dumps(rae.state_dict())))
    nxt = [turn(player="a", game_id="g2", reward=0)]
    assert restored.advantages(list(nxt)) == rae.advantages(list(nxt))


def test_assign_credit_sets_advantages():
    ts = assign_credit([turn(reward=3), turn(reward=-2)], "constant")
    assert [t.advantage for t in ts] == [3, -2]
    with pytest.raises(ValueError, match="RAE state"):
        assign_credit(ts, "rae")
    with pytest.raises(ValueError, match="unknown credit"):
        assign_credit(ts, "ppo")
