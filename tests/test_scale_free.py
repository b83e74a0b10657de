"""Scale-free credit: a game, its copy with payoffs x 0.1 and its copy x 100 + 7 give the same advantages
(every built-in credit method, declared payoff range or running estimate) and the same training run."""

import math
import random

import numpy as np
import pytest

from autocurricula.credit import (BranchCredit, ConstantCredit, GRPOCredit, MirrorCredit, QCredit, RAECredit,
                                  RewardScale, ValueCredit)
from autocurricula.records import GameFacts, GameRecord, Turn

COPIES = [(1.0, 0.0), (0.1, 0.0), (100.0, 7.0)]
# the update computes in float32: advantages that agree to a few float32 ulps cannot train differently
TOL = 8 * float(np.finfo(np.float32).eps)


def episodes(seed: int, rounds: int = 4, games: int = 24):
    """Rounds of a small sequential two-seat game: each seat moves at positions that repeat (so the
    tabular critics learn), rewards in [-2, 2] plus a forfeit of -3 now and then."""
    rng = random.Random(seed)
    out = []
    for r in range(rounds):
        turns, records = [], []
        for g in range(games):
            gid = f"r{r}g{g}"
            first = rng.choice([1, 2, 3])
            reward = rng.choice([-2.0, -1.0, 1.0, 2.0, 0.5]) if rng.random() > 0.1 else -3.0
            rewards = [reward, -reward]
            path = [first]
            rec = GameRecord(gid, [{"id": "p0"}, {"id": "p1"}], rewards=list(rewards))
            for step in range(rng.choice([2, 3])):
                seat = step % 2
                move = rng.choice([5, 6])
                t = Turn(f"p{seat}", gid, f"seat{seat}", list(path), [move, 0], [-0.7, -0.1], game="g",
                         seat=seat, reward=rewards[seat], group=f"s{first}")
                path.append(move)
                turns.append(t)
            rec.turns = turns[-len(path) + 1:]
            records.append(rec)
        out.append((turns, records))
    return out


def scaled(rounds, a: float, b: float):
    out = []
    for turns, records in rounds:
        new_turns = [Turn(t.player, t.game_id, t.role, list(t.prompt_ids), list(t.completion_ids), list(t.logprobs),
                          game=t.game, seat=t.seat, reward=a * t.reward + b, group=t.group) for t in turns]
        new_records = [GameRecord(r.game_id, r.players, rewards=[a * x + b for x in r.rewards]) for r in records]
        out.append((new_turns, new_records))
    return out


def credit_advantages(credit, rounds, facts):
    """The trainer's path (``AutocurriculumTrainer._credit``) without a model: widen the running range,
    normalise, assign, take the extra turns."""
    scale = RewardScale(facts, "g")
    out = []
    for turns, records in rounds:
        scale.see(turns, records)
        with scale.normalised(turns, records):
            credit.assign(turns)
            extra = credit.extra_turns(turns)
        out.append([t.advantage for t in turns] + [t.advantage for t in extra])
        assert all(t.reward == pytest.approx(r) for t, r in zip(turns, [t.reward for t in turns]))
    return out


CREDITS = {
    "rae": lambda: RAECredit(),
    "rae_per_player": lambda: RAECredit(per_player=True),
    "grpo_group": lambda: GRPOCredit("group"),
    "grpo_batch": lambda: GRPOCredit("batch"),
    "grpo_none": lambda: GRPOCredit("none"),
    "constant": lambda: ConstantCredit(),
    "value": lambda: ValueCredit(lam=0.5),
    "q": lambda: QCredit(target_coef=1.0),
    "q_minimax": lambda: QCredit(target_coef=1.0, backup="minimax"),
}


@pytest.mark.parametrize("declared", [True, False], ids=["declared_range", "running_estimate"])
@pytest.mark.parametrize("name", sorted(CREDITS))
def test_every_credit_method_is_invariant_to_the_payoffs_units(name, declared):
    rounds = episodes(0)
    facts = GameFacts(2, "zero_sum", payoff_range=(-2.0, 2.0)) if declared else GameFacts(2, "zero_sum")
    got = []
    for a, b in COPIES:
        got.append(credit_advantages(CREDITS[name](), scaled(rounds, a, b), facts.affine(a, b)))
    base = got[0]
    assert any(abs(x) > 0.05 for rnd in base for x in rnd), "the advantages must say something"
    for other in got[1:]:
        for r0, r1 in zip(base, other):
            assert len(r0) == len(r1)
            np.testing.assert_allclose(r1, r0, rtol=TOL, atol=TOL)


def test_without_the_scale_the_units_would_show():
    """The control: the same credit on the raw rewards differs between the copies."""
    rounds = episodes(1)
    raw = []
    for a, b in COPIES[:2]:
        credit = RAECredit()
        raw.append([credit.advantages(turns) for turns, _ in scaled(rounds, a, b)])
    assert not np.allclose(raw[0][0], raw[1][0])


def test_declared_ranges_per_seat_and_the_running_estimate():
    facts = GameFacts(2, "zero_sum", seat_ranges=((-1.0, 3.0), (-3.0, 1.0)))
    scale = RewardScale(facts, "m")
    assert scale.normalise(3.0, "m", 0, 0) == 1.0 and scale.normalise(-1.0, "m", 0, 0) == -1.0
    assert scale.normalise(-3.0, "m", 0, 1) == -1.0 and scale.normalise(1.0, "m", 0, 0) == 0.0
    assert scale.normalise(-2.0, "m", 0, 0) == -1.5  # a forfeit outside the range stays outside
    # a sub-game (level 1) and an undeclared game learn their range as they go
    open_scale = RewardScale(GameFacts(2), "m")
    assert open_scale.normalise(5.0, "m") == 5.0  # nothing seen: left as it is
    open_scale.see([Turn("p", "g", "r", [1], [2], [0.0], game="m", seat=0, reward=4.0)])
    assert open_scale.normalise(4.0, "m") == 0.0 and open_scale.normalise(9.0, "m") == 1.0
    open_scale.see([], [GameRecord("g", [{}, {}], rewards=[0.0, 2.0])])
    assert open_scale.range_of("m", 0, 0) == (0.0, 4.0) and open_scale.range_of("m", 0, 1) == (2.0, 2.0)
    state = open_scale.state_dict()
    again = RewardScale(GameFacts(2), "m")
    again.load_state_dict(state)
    assert again.range_of("m", 0, 0) == (0.0, 4.0)


def test_normalised_restores_the_games_own_rewards_even_on_error():
    scale = RewardScale(GameFacts(2, payoff_range=(-10, 10)), "g")
    t = Turn("p", "g0", "r", [1], [2], [0.0], game="g", seat=0, reward=5.0)
    rec = GameRecord("g0", [{}, {}], rewards=[5.0, -5.0])
    kept = rec.rewards
    with pytest.raises(RuntimeError):
        with scale.normalised([t], [rec]):
            assert t.reward == 0.5 and rec.rewards == [0.5, -0.5]
            raise RuntimeError("credit failed")
    assert t.reward == 5.0 and rec.rewards is kept and kept == [5.0, -5.0]


def test_game_facts_move_with_an_affine_copy():
    facts = GameFacts(2, "zero_sum", "imperfect", "sequential", True, payoff_range=(-2, 2))
    assert facts.affine(100, 7).payoff_range == (-193.0, 207.0)
    assert facts.affine(100, 7).utility == "constant_sum" and facts.affine(100, 7).zero_sum
    assert facts.affine(0.1).utility == "zero_sum"
    with pytest.raises(ValueError, match="scale"):
        facts.affine(-1)


# ------------------------------------------------------------------ a short training run, three units

def _run(tiny_model_path, tmp_path, game, credit, tag):
    from autocurricula import SelfPlayConfig, SelfPlayTrainer
    from autocurricula.views.callbacks import TrainerCallback

    seen = []

    class Spy(TrainerCallback):
        def on_update(self, trainer, turns, result):
            seen.append([(t.player, tuple(t.completion_ids), float(t.advantage)) for t in turns])

    config = SelfPlayConfig(epochs=1, rounds=3, seed=3, output_dir=str(tmp_path / tag), progress=False,
                            credit=credit, game_name="g", max_tokens=2, save_strategy="no",
                            rules={"games_per_round": 12, "past_share": 0.0}, ratings={"bt_bootstrap": 0})
    trainer = SelfPlayTrainer(config)
    trainer.train(str(tiny_model_path), game, grpo_config={"learning_rate": 1e-2}, callbacks=[Spy()])
    rewards = [list(r) for r in trainer.match_history["rewards"]]
    trainer.engine.close()
    return seen, rewards


@pytest.mark.parametrize("credit", ["rae", "mirror", "q_kuhn"])
def test_training_is_the_same_in_every_unit(tiny_model_path, tmp_path, credit):
    """Same seed, the game and its copies x 0.1 and x 100 + 7: the same games are sampled, the same
    advantages reach every update, round after round (so the adapters follow the same path)."""
    from autocurricula.games import kuhn_poker
    from autocurricula.games import AffineGame
    from autocurricula.games.matrix import random_game

    base = kuhn_poker if credit == "q_kuhn" else random_game(4)
    make = {"rae": lambda: "rae", "mirror": lambda: MirrorCredit(samples=1),
            "q_kuhn": lambda: QCredit(target_coef=1.0)}[credit]
    runs = [_run(tiny_model_path, tmp_path, AffineGame(base, a, b), make(), f"{credit}-{a}-{b}") for a, b in COPIES]
    (seen0, rewards0) = runs[0]
    assert len(seen0) == 3 and all(seen0)
    for (a, b), (seen, rewards) in zip(COPIES[1:], runs[1:]):
        np.testing.assert_allclose(np.array(rewards), a * np.array(rewards0) + b, rtol=1e-9, atol=1e-9)
        for r0, r1 in zip(seen0, seen):
            assert [(p, c) for p, c, _ in r0] == [(p, c) for p, c, _ in r1]  # the same moves sampled
            np.testing.assert_allclose([x for *_, x in r1], [x for *_, x in r0], rtol=TOL, atol=TOL)
    assert any(abs(x) > 1e-3 for rnd in seen0 for *_, x in rnd)
    assert math.isfinite(sum(x for rnd in seen0 for *_, x in rnd))
