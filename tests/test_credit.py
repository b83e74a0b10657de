"""Credit methods on hand-computed numbers; the Credit objects, their configs, and the registry."""

import copy
import json
import math
import warnings

import pytest

from autocurricula.loop.config import GRPOConfig
from autocurricula.credit import (RAE, BranchCredit, ConstantCredit, Credit, GRPOCredit, QCredit,
                                  RAECredit, StateValues, ValueCredit,
                                  grpo_advantages, make_credit, register_credit)
from autocurricula.credit import registry
from autocurricula.records import Turn


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


def move(state, game_id, reward, player="p", role="X"):
    # a turn whose prompt (the observed state) is ``state``
    return Turn(player, game_id, role, [state], [3], [-0.5], reward=reward, game="ttt")


@pytest.mark.parametrize("lam", [1.0, 0.0])
def test_state_values_by_hand(lam):
    sv = StateValues(lam=lam)
    # g0 visits states 10 then 11 and wins; g1 visits 10 then 12 and loses
    adv = sv.advantages([move(10, "g0", 1), move(11, "g0", 1), move(10, "g1", -1), move(12, "g1", -1)])
    # g0: unseen states fall back to the role baseline 0 -> A = 1 for the last move and, with
    # lam 1, the first; TD(0) gives the first V(11) - V(10) = 0. Then V(10) = V(11) = 1 (first
    # visit: step 1) and the role baseline becomes 0.05.
    # g1: V(10) = 1, V(12) unseen = 0.05. MC (lam 1): A = R - V(s). TD(0): the first move is judged
    # by the value of the state it led to, V(12) - V(10).
    want = [1, 1, -2, -1.05] if lam == 1 else [0, 1, 0.05 - 1, -1.05]
    assert adv == pytest.approx(want)
    assert sv.values[sv.key(move(10, "x", 0))] == pytest.approx([0.0, 2])  # running mean of 1 and -1
    assert sv.values[sv.key(move(12, "x", 0))][0] == pytest.approx(0.05 - 1.05)


def test_state_values_give_moves_of_one_game_different_credit():
    sv = StateValues(lam=0.0)
    for i in range(40):  # state 2 usually wins, state 3 usually loses
        sv.advantages([move(1, f"a{i}", 1), move(2, f"a{i}", 1)])
        sv.advantages([move(1, f"b{i}", -1), move(3, f"b{i}", -1)])
    # a game that blundered into 3 and then got lucky: its first move is still blamed
    adv = sv.advantages([move(1, "g", 1), move(3, "g", 1)])
    assert adv[0] < -0.5 < 0.5 < adv[1]
    rae_adv = RAE().advantages([move(1, "g", 1), move(3, "g", 1)])
    assert rae_adv[0] == rae_adv[1]  # what Monte-Carlo credit cannot do


def test_state_values_round_trip_cap_and_errors():
    sv = StateValues(per_player=True, max_states=3)
    for i in range(5):
        sv.advantages([move(i, f"g{i}", 1.0, player="a")])
    assert len(sv.values) == 3 and sv.key(move(0, "x", 0, player="a")) not in sv.values  # oldest dropped
    assert sv.key(move(1, "x", 0, player="a")) != sv.key(move(1, "x", 0, player="b"))
    restored = StateValues()
    restored.load_state_dict(json.loads(json.dumps(sv.state_dict())))
    nxt = [move(4, "h", 0.0, player="a"), move(9, "h", 0.0, player="a")]
    assert restored.advantages(list(nxt)) == sv.advantages(list(nxt))
    with pytest.raises(ValueError, match="lam"):
        StateValues(lam=2)


def act(state, completion, game_id, reward):
    return Turn("p", game_id, "X", [state], [completion], [-0.5], reward=reward, game="ttt")


def test_action_values_by_hand():
    q, v = StateValues(actions=True), StateValues()
    games = [[act(1, 7, "g0", 1)], [act(1, 7, "g1", -1)], [act(1, 8, "g2", -1)]]
    # g0: first visit of state 1 and of (1, 7): Q = R = 1, V read before = 0 -> A = 1, as "value".
    # g1: V(1) = 1 (first visit, step 1); Q(1, 7) = mean(1, -1) = 0 -> A = 0 - 1; "value": -1 - 1.
    # g2: V(1) = mean(1, -1) = 0; new pair (1, 8): Q = -1 -> A = -1, the same as "value".
    assert [q.advantages(g)[0] for g in games] == pytest.approx([1, -1, -1])
    assert [v.advantages(g)[0] for g in games] == pytest.approx([1, -2, -1])
    assert q.action_values[q.action_key(act(1, 7, "x", 0))][:2] == pytest.approx([0.0, 2])
    assert len(q.action_values) == 2 and not v.action_values


def test_action_values_credit_the_move_not_the_luck():
    q, v = StateValues(actions=True), StateValues()
    for i in range(40):  # in state 1, move 7 wins 3 games in 4 and move 8 loses 3 in 4
        for table in (q, v):
            table.advantages([act(1, 7, f"a{i}", 1 if i % 4 else -1)])
            table.advantages([act(1, 8, f"b{i}", -1 if i % 4 else 1)])
    # the good move in a game the opponent's luck lost, and the bad move in a lucky win
    unlucky, lucky = [act(1, 7, "u", -1)], [act(1, 8, "l", 1)]
    assert q.advantages(list(unlucky))[0] > 0.3 and q.advantages(list(lucky))[0] < -0.3
    assert v.advantages(list(unlucky))[0] < -0.5 and v.advantages(list(lucky))[0] > 0.5  # outcome decides


def test_action_values_round_trip_and_method_check():
    q = StateValues(actions=True, max_states=2)
    for i in range(4):
        q.advantages([act(1, 7 + i, f"g{i}", float(i % 2))])
    assert len(q.action_values) == 2  # the cap bounds the pair table too
    restored = StateValues()
    restored.load_state_dict(json.loads(json.dumps(q.state_dict())))
    assert restored.actions
    nxt = [act(1, 9, "h", 1.0), act(2, 7, "h", 1.0)]
    assert restored.advantages(list(nxt)) == q.advantages(list(nxt))
    assert [t.advantage for t in QCredit().assign([act(3, 7, "k", 1.0)])] == [1.0]


def test_greedy_targets_pick_the_best_known_move_by_hand():
    q = StateValues(actions=True)
    for i, (move, r) in enumerate([(7, 1), (7, 1), (8, -1), (8, -1)]):
        q.advantages([act(1, move, f"g{i}", r)])
    # V(1) = mean(1, 1, -1, -1) = 0; Q(1, 7) = 1 and Q(1, 8) = -1, two visits each. Shrunk by one visit
    # at V: score(7) = (2 * 1 + 0) / 3 = 2/3, so A = 0.5 * (2/3 - 0) = 1/3 for the move not sampled here.
    seen = [act(1, 8, "now", -1), act(1, 8, "again", -1)]
    (target,) = q.greedy_targets(seen, coef=0.5)  # one target per (player, state)
    assert target.completion_ids == [7] and target.prompt_ids == [1] and target.target
    assert target.advantage == pytest.approx(1 / 3) and target.logprobs == [0.0] and target.player == "p"
    other = Turn("o", "g9", "O", [1], [8], [-0.5], reward=-1.0, game="ttt")
    assert [t.player for t in q.greedy_targets([other, *seen], coef=0.5)] == ["o", "p"]
    # one lucky win is not enough: min_visits, and the shrinkage toward V when it is allowed
    q.advantages([act(1, 9, "lucky", 1)])  # V = 0.2, Q(1, 9) = 1 after one visit
    assert q.greedy_targets(seen, coef=1.0)[0].completion_ids == [7]
    (t1,) = q.greedy_targets(seen, coef=1.0, min_visits=1)
    assert t1.completion_ids == [7] and t1.advantage == pytest.approx((2 + 0.2) / 3 - 0.2)  # 9 scores (1 + .2) / 2
    # no target when no known move beats the state's value, or with coef 0
    bad = StateValues(actions=True)
    for i in range(3):
        bad.advantages([act(2, 5, f"b{i}", -1)])
    assert bad.greedy_targets([act(2, 5, "x", -1)], coef=1.0) == [] and q.greedy_targets(seen, coef=0) == []
    # the known moves survive a JSON round trip and the cap
    restored = StateValues(actions=True)
    restored.load_state_dict(json.loads(json.dumps(q.state_dict())))
    assert [(t.completion_ids, t.advantage) for t in restored.greedy_targets(seen, 1.0)] == \
        [(t.completion_ids, t.advantage) for t in q.greedy_targets(seen, 1.0)]
    capped = StateValues(actions=True, max_states=1)
    for i, move in enumerate([7, 7, 8, 8]):
        capped.advantages([act(1, move, f"c{i}", 1 if move == 7 else -1)])
    assert capped.greedy_targets(seen, 1.0) == []  # move 7 was dropped with its entry; 8 is below V
    assert capped._moves == {capped.key(seen[0]): {capped.action_key(seen[0])}}
    with pytest.raises(ValueError, match="actions=True"):
        StateValues().greedy_targets(seen, 1.0)
    with pytest.raises(ValueError, match="completions=True"):
        StateValues(actions=True, completions=False).greedy_targets(seen, 1.0)
    # a cut-off completion stays cut off as a target (mask_truncated_completions then drops it too);
    # without completions the table keeps none
    cut, lean = StateValues(actions=True), StateValues(actions=True, completions=False)
    for i in range(3):
        for table in (cut, lean):
            table.advantages([Turn("p", f"t{i}", "X", [4], [6], [-0.5], reward=1.0, game="ttt", truncated=True)])
            table.advantages([Turn("p", f"u{i}", "X", [4], [7], [-0.5], reward=-1.0, game="ttt")])
    (picked,) = cut.greedy_targets([act(4, 7, "x", -1)], 1.0)
    assert picked.completion_ids == [6] and picked.truncated and not lean._moves
    assert all(entry[2] == [] for entry in lean.action_values.values())
    again = StateValues(actions=True)
    again.load_state_dict(json.loads(json.dumps(cut.state_dict())))
    assert again.greedy_targets([act(4, 7, "x", -1)], 1.0)[0].truncated
    # the index of known moves is rebuilt from a table given to the constructor
    assert StateValues(actions=True, action_values=q.action_values)._moves == q._moves
    with pytest.raises(ValueError, match="min_visits"):
        q.greedy_targets(seen, 1.0, min_visits=0)


# ---------------------------------------------------------------------- credit objects
def rounds_of_turns(n_rounds=4):
    """Turns of small two-seat games whose states repeat, with groups, sub-games and three players."""
    out = []
    for r in range(n_rounds):
        turns = []
        for g in range(6):
            for k in range(2):
                for seat, role in enumerate("XO"):
                    move = (g * 2 + r + seat) % 3
                    turns.append(Turn(f"p{(g + seat) % 3}", f"r{r}g{g}", role, [g % 2, k], [move], [-0.5], game="ttt",
                                      reward=float((move == 0) - (move == 2) * (g % 2)), seat=seat,
                                      group=f"s{g % 2}" if g % 3 else None, level=k,
                                      parent=f"r{r}g{g}" if k else None))
        out.append(turns)
    return out


def run_rounds(assign, extra=lambda turns: []):
    rows = []
    for turns in rounds_of_turns():
        turns = copy.deepcopy(turns)
        adv = assign(turns)
        rows.append((adv, [(t.prompt_ids, t.completion_ids, t.advantage) for t in extra(turns)]))
    return rows


def by_object(credit):
    return run_rounds(lambda ts: [t.advantage for t in credit.assign(ts)], credit.extra_turns)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_and_constant_objects_give_the_pure_functions_values(scale):
    bound = make_credit("grpo", GRPOConfig(scale_rewards=scale), 0)
    assert bound.scale_rewards == scale
    want = run_rounds(lambda ts: grpo_advantages(ts, scale))
    assert by_object(bound) == want == by_object(GRPOCredit(scale_rewards=scale))
    # an explicit setting is kept; unbound, it is trl's default "group"
    assert make_credit(GRPOCredit(scale_rewards="none"), GRPOConfig(scale_rewards=scale), 0).scale_rewards == "none"
    assert by_object(GRPOCredit()) == run_rounds(lambda ts: grpo_advantages(ts, "group"))
    assert by_object(ConstantCredit()) == run_rounds(lambda ts: [t.reward for t in ts])


@pytest.mark.parametrize("alpha, per_player", [(0.95, False), (0.5, True)])
def test_table_objects_give_their_tables_values(alpha, per_player):
    rae, targets = RAE(alpha, per_player), 0
    assert by_object(RAECredit(alpha=alpha, per_player=per_player)) == run_rounds(rae.advantages)
    for lam, max_states in ((1.0, 200_000), (0.3, 5)):
        table = StateValues(lam, alpha, per_player, max_states)
        assert by_object(ValueCredit(lam=lam, alpha=alpha, per_player=per_player, max_states=max_states)) == \
            run_rounds(table.advantages)
        for coef, visits in ((0.0, 2), (0.7, 1)):
            q = StateValues(lam, alpha, per_player, max_states, actions=True, completions=coef > 0)
            credit = QCredit(lam=lam, alpha=alpha, per_player=per_player, max_states=max_states, target_coef=coef,
                             target_min_visits=visits)
            got, want = by_object(credit), run_rounds(q.advantages, lambda ts: q.greedy_targets(ts, coef, visits)
                                                      if coef else [])
            assert got == want and credit.values.state_dict() == q.state_dict()
            targets += sum(len(extra) for _, extra in got)
    assert targets > 0


@pytest.mark.parametrize("make, match", [
    (lambda: RAECredit(alpha=1.0), "alpha"), (lambda: ValueCredit(lam=-0.1), "lam"),
    (lambda: ValueCredit(max_states=0), "max_states"), (lambda: QCredit(target_coef=-1.0), "target_coef"),
    (lambda: QCredit(target_coef=math.nan), "target_coef"), (lambda: QCredit(target_min_visits=0), "target_min_visits"),
    (lambda: GRPOCredit(scale_rewards="std"), "scale_rewards"), (lambda: BranchCredit(samples=0), "samples"),
    (lambda: BranchCredit(samples=True), "samples"), (lambda: BranchCredit(turns_per_game=-1), "turns_per_game"),
    (lambda: BranchCredit(advantage="gae"), "advantage"),
    (lambda: BranchCredit(move_temperature=0.0), "move_temperature"),
    (lambda: BranchCredit(move_temperature="x"), "move_temperature"),
    (lambda: BranchCredit(move_clip=-1.0), "move_clip"),
])
def test_each_constructor_validates_its_settings(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_every_hook_has_a_default():
    class Halves(Credit):
        def advantages(self, turns):
            return [t.reward / 2 for t in turns]

    credit = make_credit(Halves(), GRPOConfig(), 3)  # bind: nothing to take
    assert Credit.replays is False and credit.replays is False and BranchCredit.replays is True
    assert credit.check_game(lambda players, model: [0.0]) is None and credit.see_round([], None) is None
    ts = credit.assign([turn(reward=3.0)])
    assert ts[0].advantage == 1.5 and credit.extra_turns(ts) == [] and credit.metrics() == {}
    assert credit.state_dict() == {} and credit.load_state_dict({}) is None
    with pytest.raises(NotImplementedError, match="advantages"):
        Credit().advantages([])


def test_make_credit_copies_an_object_and_binds_it():
    spec = RAECredit(alpha=0.5)
    a, b = make_credit(spec, GRPOConfig(), 0), make_credit(spec, GRPOConfig(), 0)
    a.assign([turn(reward=1.0)])
    assert a.rae.baselines and not b.rae.baselines and not spec.rae.baselines  # no learnt state is shared
    branch = make_credit(BranchCredit(samples=2), GRPOConfig(temperature=0.7), 11)
    assert (branch.seed, branch.sampling_temperature) == (11, 0.7) and branch == BranchCredit(samples=2)
    assert make_credit("branch", GRPOConfig(), 5) == BranchCredit()  # a name: the method's defaults
    with pytest.raises(ValueError, match="register_credit"):
        make_credit("ppo", GRPOConfig(), 0)
    with pytest.raises(TypeError, match="Credit object"):
        make_credit(3, GRPOConfig(), 0)


class Halves(Credit):
    name = "halves"

    def __init__(self, scale=0.5):
        self.scale, self.seed = scale, None

    def bind(self, grpo_config, seed):
        self.seed = seed

    def advantages(self, turns):
        return [t.reward * self.scale for t in turns]


def test_register_credit_takes_zero_argument_factories_only():
    try:
        register_credit("halves", Halves)  # a Credit subclass is a factory
        credit = make_credit("halves", GRPOConfig(), 4)
        assert isinstance(credit, Halves) and credit.seed == 4
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning for the zero-argument form
            register_credit("halves", lambda: Halves(0.25))
        assert make_credit("halves", GRPOConfig(), 0).scale == 0.25
        with pytest.raises(TypeError, match="no arguments"):
            register_credit("halves", lambda config, grpo_config: Halves(config["scale"]))
        register_credit("halves", lambda: "not a credit")
        with pytest.raises(TypeError, match="not a Credit"):
            make_credit("halves", GRPOConfig(), 0)
        with pytest.raises(TypeError, match="no arguments"):
            register_credit("halves", lambda a, b, c: Halves())
    finally:
        registry.CREDIT_METHODS.pop("halves", None)


def test_minimax_backup_by_hand():
    q = StateValues(actions=True, backup="minimax")
    # state 1: move 7 led on to state 2 (won there with move 9) in g0, and the opponent's other reply
    # ended g1 at once, lost; move 8 ended g2 in a draw. The worst known result of 7 is the loss.
    turns = [act(1, 7, "g0", 1), act(2, 9, "g0", 1), act(1, 7, "g1", -1), act(1, 8, "g2", 0)]
    adv = q.advantages(turns)
    k1, k2 = q.key(turns[0]), q.key(turns[1])
    assert q.values[k1][0] == 0 and q.values[k2][0] == 1  # V = the best move's worst case
    # centred on the mean Q of the tried moves weighted by their plays: (2 * -1 + 0) / 3 at state 1
    assert adv == pytest.approx([-1 / 3, 0.0, -1 / 3, 2 / 3])
    (target,) = q.greedy_targets(turns[:1], coef=2.0, min_visits=1)
    assert target.completion_ids == [8] and target.advantage == pytest.approx(2.0 * (0 - (-2 / 3)))
    assert q.greedy_targets(turns[:1], coef=2.0, min_visits=2) == []  # 8 was tried once
    # a later round that loses at state 2 lowers it (state 1 still draws with move 8)
    q.advantages([act(2, 9, "g3", -1)])
    assert q.values[k2][0] == -1 and q.values[k1][0] == 0
    restored = StateValues(actions=True, backup="minimax")
    restored.load_state_dict(json.loads(json.dumps(q.state_dict())))
    more = [act(1, 8, "g4", 0), act(3, 5, "g5", 1)]
    assert restored.advantages(copy.deepcopy(more)) == q.advantages(copy.deepcopy(more))
    assert restored.children == q.children
    with pytest.raises(ValueError, match="backup"):
        StateValues(actions=True).load_state_dict(q.state_dict())  # a table backed up another way


def test_minimax_backup_takes_two_completions_of_one_move_as_one():
    """Completions 7 and 70 led on to the same next position (state 2), so they are one move: the
    loss found after 70 lowers 7 too, and the target is its most played completion."""
    q = StateValues(actions=True, backup="minimax")
    q.advantages([act(1, 7, "g0", 1), act(2, 9, "g0", 1), act(1, 7, "g1", 1), act(3, 9, "g1", 1),
                  act(1, 8, "g2", 0)])
    assert q.values[q.key(act(1, 0, "", 0))][0] == 1  # 7 won after both replies seen
    q.advantages([act(1, 70, "g3", -1), act(2, 5, "g3", -1)])  # 70, then at state 2 a loss: 70 is 7
    seven, seventy = (q.action_key(act(1, m, "", 0)) for m in (7, 70))
    assert q.action_values[seven][0] == q.action_values[seventy][0] == 1  # one move: they share a value
    assert q.values[q.key(act(2, 0, "", 0))][0] == 1  # at state 2 the best move (9) still wins (5 lost)
    q.advantages([act(2, 9, "g4", -1)])  # 9 loses there too: V(2) = -1, and 7/70 fall with it, state 1 unplayed
    assert q.action_values[seven][0] == q.action_values[seventy][0] == -1
    assert q.values[q.key(act(1, 0, "", 0))][0] == 0  # 8's draw is now the best move at state 1
    (target,) = q.greedy_targets([act(1, 7, "now", 0)], coef=1.0, min_visits=1)
    # two moves: 7/70 played 3 times (Q -1), 8 once (Q 0)
    assert target.completion_ids == [8] and target.advantage == pytest.approx(0 - (3 * -1 + 0) / 4)
    restored = StateValues(actions=True, backup="minimax")
    restored.load_state_dict(json.loads(json.dumps(q.state_dict())))
    assert restored._same[seven] == {seven, seventy}  # the grouping is rebuilt from the graph
    # with min_visits=2 a move seen once does not set its position's value: an opponent's one blunder
    # after it says little about the replies not seen
    wary = StateValues(actions=True, backup="minimax", min_visits=2)
    wary.advantages([act(1, 7, "w0", 1), act(1, 8, "w1", -1), act(1, 8, "w2", 0)])
    assert wary.values[wary.key(act(1, 0, "", 0))][0] == -1  # 8 counts (twice), 7 (once) does not
    assert wary.advantages([act(1, 7, "w3", 1)]) == [1.0]  # now 7 counts: V = 1, baseline (1 - 1) / 2 = 0
    assert wary.values[wary.key(act(1, 0, "", 0))][0] == 1
    with pytest.raises(ValueError, match="min_visits"):
        StateValues(actions=True, backup="minimax", min_visits=0)
    small = StateValues(actions=True, backup="minimax", max_states=3)  # the graph's indexes stay bounded
    for i in range(40):
        small.advantages([act(i, 7, f"s{i}", 1), act(i + 1, 7, f"s{i}", 1), act(i, 70, f"t{i}", 1),
                          act(i + 1, 8, f"t{i}", 0)])
    assert len(small.action_values) == 3 and len(small.values) <= 3
    assert len(small.children) <= 3 and len(small._same) <= 3 and len(small._via) <= 3
    assert sum(len(p) for p in small._parents.values()) <= 3
    cycle = StateValues(actions=True, backup="minimax")  # a position that comes back: the backup still ends
    cycle.advantages([act(1, 7, "c", 1), act(2, 7, "c", 1), act(1, 8, "c", 1), act(2, 8, "c", 1)])
    assert cycle.values[cycle.key(act(1, 0, "", 0))][0] == 1
    with pytest.raises(ValueError, match="'mean' or 'minimax'"):
        QCredit(backup="max")
    with pytest.raises(ValueError, match="lam"):
        QCredit(backup="minimax", lam=0.5)


def test_minimax_backup_regroups_a_move_after_an_eviction_as_a_resume_would():
    """7 and 700 were one move only through 70, which shared a next position with each. Once the
    full table drops 70 they are two moves, live as after a resume: a loss after 700 leaves 7."""
    q = StateValues(actions=True, backup="minimax", max_states=5)
    q.advantages([act(1, 7, "a", 1), act(2, 9, "a", 1), act(1, 70, "b", 1), act(2, 9, "b", 1),
                  act(1, 70, "c", 1), act(3, 9, "c", 1), act(1, 700, "d", 1), act(3, 9, "d", 1)])
    seven, seventy, seven_hundred = (q.action_key(act(1, m, "", 0)) for m in (7, 70, 700))
    assert q._same[seven] == {seven, seventy, seven_hundred}
    q.advantages([act(1, 7, "e", 1), act(2, 9, "e", 1), act(1, 700, "f", 1), act(3, 9, "f", 1)])
    q.advantages([act(5, 1, "g", 1)])  # a new position: the full table drops 70, the oldest
    assert seventy not in q.action_values
    assert q._same[seven] == {seven} and q._same[seven_hundred] == {seven_hundred}
    restored = StateValues(actions=True, backup="minimax", max_states=5)
    restored.load_state_dict(json.loads(json.dumps(q.state_dict())))
    assert restored._same == q._same and restored._parents == q._parents
    more = [act(1, 700, "h", -1), act(3, 9, "h", -1)]  # 9 loses at position 3: 700 falls, 7 keeps its win
    assert restored.advantages(copy.deepcopy(more)) == q.advantages(copy.deepcopy(more))
    assert q.action_values[seven_hundred][0] == -1 and q.action_values[seven][0] == 1


def test_minimax_backup_waits_for_the_next_position_of_a_common_one():
    """A position played in many games of a round is backed up again once the next position of its
    newest move has a value: the move that won is worth a win, not a placeholder."""
    q = StateValues(actions=True, backup="minimax")
    adv = q.advantages([act(1, 7, "g0", 1), act(1, 7, "g1", 1), act(1, 7, "g2", 1), act(1, 8, "g3", 1),
                        act(2, 9, "g3", 1)])
    assert q.action_values[q.action_key(act(1, 8, "", 0))][0] == 1 and q.values[q.key(act(1, 0, "", 0))][0] == 1
    assert adv == [0.0, 0.0, 0.0, 0.0, 0.0]  # every move won: no move is better than the others
    with pytest.raises(ValueError, match="actions=True"):
        StateValues(backup="minimax")


def test_minimax_backup_finds_perfect_play_where_mean_returns_do_not():
    """Every game from a mid-game tic-tac-toe position, fed in random rounds: the backed-up values are
    the exact minimax values of every position and move, while the mean returns favour a move that
    loses to one line of play."""
    import random

    from autocurricula.games.tictactoe import apply_move, legal_moves, minimax_value, minimax_values, to_move, winner

    start = "......OXX"  # O to move; six free cells
    games = []

    def every_game(board, history):
        w = winner(board)
        if w is not None:
            games.append((history, w))
            return
        for m in legal_moves(board):
            every_game(apply_move(board, m, to_move(board)), history + [(board, to_move(board), m)])

    every_game(start, [])
    rng = random.Random(0)
    rng.shuffle(games)

    def turns_of(i, game):
        history, w = game
        return [Turn("p", f"g{i}", mark, [ord(c) for c in board + mark], [m], [-1.0], game="ttt",
                     reward=0.0 if w == "draw" else (1.0 if w == mark else -1.0)) for board, mark, m in history]

    tables = {b: QCredit(backup=b, target_min_visits=1) for b in ("mean", "minimax")}  # every reply is played
    for lo in range(0, len(games), 7):  # rounds of 7 games
        for credit in tables.values():
            credit.assign([t for i, g in enumerate(games[lo:lo + 7], lo) for t in turns_of(i, g)])
    table = tables["minimax"].values
    positions = {(board, mark) for history, _ in games for board, mark, _ in history}
    mean_misses = 0
    for board, mark in positions:
        turn = Turn("p", "probe", mark, [ord(c) for c in board + mark], [0], [0.0], game="ttt")
        assert table.values[table.key(turn)][0] == minimax_value(board, mark)
        exact = minimax_values(board, mark)
        for m, value in exact.items():
            assert table.action_values[table.action_key(Turn(**{**turn.to_dict(), "completion_ids": [m]}))][0] == value
        means = tables["mean"].values
        q = {m: means.action_values[means.action_key(Turn(**{**turn.to_dict(), "completion_ids": [m]}))][0]
             for m in exact}
        mean_misses += exact[max(q, key=q.get)] < max(exact.values())
    assert mean_misses > 0  # the claim is not empty: a mean return picks a value-losing move somewhere
