"""GRPO-family losses and the fused multi-player update."""

import contextlib

import numpy as np
import pytest

import autocurricula  # noqa: F401
import mlx.core as mx

from autocurricula.training.config import GRPOConfig, coerce_grpo_config
from autocurricula.credit import GRPOCredit
from autocurricula.records import Turn
from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
from autocurricula.training import AdamWState, Updater
from autocurricula.training.loss import policy_loss, policy_loss_reference, token_weights
from autocurricula.training.optim import adamw
from autocurricula.training.update import merge_step_metrics, split_turns


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level,beta", [("token", 0.0), ("token", 0.1), ("sequence", 0.0)])
def test_loss_matches_numpy_reference(loss_type, level, beta):
    rng = np.random.default_rng(0)
    lengths = [5, 3, 4]
    mask = np.zeros((3, 5), np.float32)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    old = rng.normal(-2, 0.5, (3, 5)).astype(np.float32)
    logp = (old + rng.normal(0, 0.3, (3, 5))).astype(np.float32)  # some ratios beyond the clip range
    ref = (old + rng.normal(0, 0.2, (3, 5))).astype(np.float32)
    adv = np.array([1.0, -0.5, 2.0], np.float32)
    w = token_weights(lengths, [False] * 3, loss_type, max_completion_length=8)
    weights = mask * np.array(w, np.float32)[:, None]
    loss, _ = policy_loss(mx.array(logp), mx.array(old), mx.array(adv), mx.array(weights), mx.array(mask), 0.2, 0.28,
                          beta, mx.array(ref), level == "sequence")
    want = policy_loss_reference(logp, old, adv, mask, loss_type, 0.2, 0.28, beta, ref, level == "sequence", 8)
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_target_rows_weigh_alike_whatever_their_length():
    """Under "grpo" a played row's tokens share 1 / (rows x its length), as trl has it; target rows
    share the mean length of the live target rows, so a move's weight does not fall with its token
    count. Equal-length targets (tic-tac-toe's one-token cells) keep trl's weights exactly."""
    lengths, masked = [2, 6, 5, 3], [False, False, False, True]
    targets = [True, True, False, True]
    w = token_weights(lengths, masked, "grpo", 8, targets)
    assert w[0] == w[1] == pytest.approx(1 / (4 * 4))  # the live target rows' mean length: (2 + 6) / 2
    assert w[2] == pytest.approx(1 / (4 * 5)) and w[3] == 0.0  # a played row: its own length; masked: 0
    assert token_weights([3, 3, 5], [False] * 3, "grpo", 8, [True, True, False]) == \
        token_weights([3, 3, 5], [False] * 3, "grpo", 8)
    for loss_type in ("bnpo", "dr_grpo", "dapo"):  # every row alike already: targets change nothing
        assert token_weights(lengths, masked, loss_type, 8, targets) == token_weights(lengths, masked, loss_type, 8)
    with pytest.raises(ValueError, match="one target flag per sequence"):
        token_weights(lengths, masked, "grpo", 8, [True])


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    p0 = rng.normal(size=(2, 6, 3)).astype(np.float32)
    grads = [rng.normal(size=p0.shape).astype(np.float32) for _ in range(10)]
    tp = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.AdamW([tp], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    p, m, v = mx.array(p0), mx.zeros(p0.shape), mx.zeros(p0.shape)
    for step, g in enumerate(grads, 1):
        tp.grad = torch.tensor(g)
        opt.step()
        p, m, v = adamw(p, mx.array(g), m, v, [1e-2, 1e-2], [step, step], 0.9, 0.999, 1e-8, 0.01)
    assert np.abs(np.array(p) - tp.detach().numpy()).max() < 4e-7


def test_trl_config_is_accepted():
    trl = pytest.importorskip("trl")
    cfg = coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False, loss_type="dr_grpo",
                                            epsilon_high=0.28, beta=0.04))
    assert (cfg.loss_type, cfg.clip_high, cfg.beta) == ("dr_grpo", 0.28, 0.04)
    with pytest.raises(ValueError, match="loss_type"):
        GRPOConfig(loss_type="ppo")


# ----------------------------------------------------------------- on the tiny model
SPEC = LoraSpec(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
GREEDY_OFF = dict(temperature=1.0, ignore_eos=True)


def load_players(engine, names, seed=0):
    dims = {p: engine.linear_dims[p] for p in SPEC.resolve(engine.linear_dims)}
    for i, n in enumerate(names):
        engine.load_adapter(n, AdapterWeights.random(dims, SPEC, seed=seed + i, b_std=0.05))


def play_turns(engine, names, per_player=4, seed=0):
    turns = []
    for n in names:
        for j in range(per_player):
            c = engine.generate(f"Game {j}: your move", n, SamplingParams(max_tokens=6, seed=seed + j, **GREEDY_OFF))
            turns.append(Turn(n, f"g{j}", "X", c.prompt_ids, c.token_ids, c.logprobs, reward=float(j % 2),
                              group=f"prompt{j // 2}"))
    return GRPOCredit().assign(turns)


@pytest.fixture()
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=8))
    yield eng
    eng.close()


def logprob_of(engine, player, turn):
    """Summed logprob of the turn's completion under the player's adapter."""
    return engine.completion_logprobs([(turn.prompt_ids, turn.completion_ids)], player)[0]


def test_sampler_logprobs_equal_training_logprobs(engine):
    load_players(engine, ["a"])
    t = play_turns(engine, ["a"], per_player=1)[0]
    assert logprob_of(engine, "a", t) == pytest.approx(sum(t.logprobs), abs=1e-4)


def test_step_moves_logprobs_in_the_direction_of_the_advantage(engine):
    load_players(engine, ["a"])
    turns = play_turns(engine, ["a"], per_player=4)
    before = [logprob_of(engine, "a", t) for t in turns]
    up = Updater(engine, GRPOConfig(learning_rate=5e-3, loss_type="grpo"))
    metrics = up.step(turns)
    after = [logprob_of(engine, "a", t) for t in turns]
    assert metrics["version/a"] == 2 and engine.adapter_info("a")["version"] == 2
    for t, b, a in zip(turns, before, after):
        assert (a - b) * t.advantage > 0, (t.advantage, b, a)


def test_target_turns_are_log_likelihood_steps_without_sampler_logprobs(engine):
    load_players(engine, ["a"])
    (sampled,) = play_turns(engine, ["a"], per_player=1)
    # the critic's pick: another completion of the same prompt, never sampled, no logprobs of its own
    target = Turn("a", "g0", "X", sampled.prompt_ids, [5, 6], [-20.0, -20.0], advantage=0.5, target=True)
    before = logprob_of(engine, "a", target)
    m = Updater(engine, GRPOConfig(learning_rate=5e-3, loss_type="grpo", epsilon=1e-3)).step([target])
    assert logprob_of(engine, "a", target) > before + 0.01
    assert m["clip_ratio"] == 0  # its ratio is taken against the current logprobs: 1, never clipped
    # as a plain turn, those (ignored) logprobs would make the ratio huge: clipped, nothing learnt
    plain = Turn("a", "g0", "X", sampled.prompt_ids, [5, 6], [-20.0, -20.0], advantage=0.5)
    before = logprob_of(engine, "a", plain)
    m = Updater(engine, GRPOConfig(learning_rate=5e-3, loss_type="grpo", epsilon=1e-3)).step([plain])
    assert m["clip_ratio"] == 1 and logprob_of(engine, "a", plain) == pytest.approx(before, abs=1e-5)


def assert_same_adapters(engine, other, names, lr=None, steps=None, **tolerance):
    from helpers import assert_same_adam_updates

    for n in names:
        wa, wb = engine.slots.records[n].weights, other.slots.records[n].weights
        for p in wa.modules:
            for x, y in zip(wa.modules[p], wb.modules[p]):
                if lr is not None:  # other batchings: equal up to Adam's amplified rounding
                    assert_same_adam_updates(x, y, lr, steps, f"{n} {p}")
                else:
                    np.testing.assert_allclose(x, y, err_msg=f"{n} {p}", **tolerance)


@contextlib.contextmanager
def twin(tiny_model_path, names):
    """Another engine with the same players (same adapters), closed afterwards."""
    other = Engine(str(tiny_model_path), config=EngineConfig(max_slots=8))
    try:
        load_players(other, names)
        yield other
    finally:
        other.close()


def test_fused_step_equals_sequential_steps(tiny_model_path, engine):
    names = ["a", "b", "c"]
    load_players(engine, names)
    turns = play_turns(engine, names)
    with twin(tiny_model_path, names) as other:
        cfg = GRPOConfig(learning_rate=1e-2, max_tokens_per_microbatch=64)  # forces several micro-batches
        fused, seq = Updater(engine, cfg), Updater(other, cfg)
        for _ in range(2):
            fused.step(turns)
            for n in names:
                seq.step([t for t in turns if t.player == n])
        assert_same_adapters(engine, other, names, lr=1e-2, steps=2)


def test_padding_the_width_leaves_the_step_unchanged(tiny_model_path, engine):
    """The updater pads micro-batches on a GPU (width a multiple of 4): exact, as shown here on CPU."""
    names = ["a", "b"]
    load_players(engine, names)
    turns = play_turns(engine, names)
    with twin(tiny_model_path, names) as other:
        plain, padded = Updater(engine, GRPOConfig(learning_rate=1e-2)), Updater(other, GRPOConfig(learning_rate=1e-2))
        padded.width_multiple = 16
        a, b = plain.step(turns), padded.step(turns)
        # the loss sums terms of either sign: float32 rounding of about 1e-5 of their size remains
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-5)
        assert_same_adapters(engine, other, names, lr=1e-2, steps=1)


def test_absent_and_frozen_players_are_bit_identical(engine):
    load_players(engine, ["a", "b", "frozen", "absent"])
    turns = play_turns(engine, ["a", "b", "frozen"], per_player=2)
    snap = {n: {p: tuple(x.copy() for x in ab) for p, ab in engine.slots.records[n].weights.modules.items()}
            for n in ("frozen", "absent")}
    versions = {n: engine.adapter_info(n)["version"] for n in snap}
    up = Updater(engine, GRPOConfig(learning_rate=1e-2, weight_decay=0.1))
    for _ in range(5):
        up.step(turns, skip={"frozen"})
    for n, mods in snap.items():
        assert engine.adapter_info(n)["version"] == versions[n] and n not in up.optim
        for p, (a, b) in mods.items():
            assert np.array_equal(engine.slots.records[n].weights.modules[p][0], a)
            assert np.array_equal(engine.slots.records[n].weights.modules[p][1], b)
    assert up.optim["a"].step == 5


def test_optimizer_state_round_trip_gives_identical_next_step(tiny_model_path, engine, tmp_path):
    load_players(engine, ["a"])
    turns = play_turns(engine, ["a"])
    cfg = GRPOConfig(learning_rate=1e-2)
    up = Updater(engine, cfg)
    up.step(turns)
    up.optim["a"].save(tmp_path / "opt")
    saved = engine.slots.records["a"].weights
    other = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    try:
        other.load_adapter("a", saved)
        up2 = Updater(other, cfg)
        up2.optim["a"] = AdamWState.load(tmp_path / "opt")
        up.step(turns)
        up2.step(turns)
        for p, (a, b) in engine.slots.records["a"].weights.modules.items():
            assert np.array_equal(a, other.slots.records["a"].weights.modules[p][0])
            assert np.array_equal(b, other.slots.records["a"].weights.modules[p][1])
    finally:
        other.close()


def test_kl_and_truncation_options_run(engine):
    load_players(engine, ["a"])
    turns = play_turns(engine, ["a"])
    turns[0].truncated = True
    m = Updater(engine, GRPOConfig(beta=0.1, mask_truncated_completions=True, importance_sampling_level="sequence")).step(turns)
    assert m["kl"] >= 0 and m["rows"] == len(turns) - 1  # the truncated turn is masked; with beta > 0 zero-advantage turns stay


def entropy_of(engine, player, turn):
    """Mean entropy of the next-token distributions at the turn's completion positions."""
    logits = engine.logits(turn.prompt_ids + turn.completion_ids[:-1], player)[len(turn.prompt_ids) - 1:]
    logits = logits - logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return float(-(np.exp(logp) * logp).sum(axis=-1).mean())


def test_entropy_bonus_raises_entropy_and_keeps_zero_advantage_turns(engine):
    load_players(engine, ["a"])
    turns = play_turns(engine, ["a"])
    for t in turns:
        t.advantage = 0.0  # only the bonus acts
    before = [entropy_of(engine, "a", t) for t in turns]
    up = Updater(engine, GRPOConfig(learning_rate=5e-3, entropy_coef=0.5))
    for _ in range(3):
        m = up.step(turns)
    after = [entropy_of(engine, "a", t) for t in turns]
    assert m["rows"] == len(turns) and m["entropy"] > 0
    assert sum(after) > sum(before) + 1e-3, (before, after)
    assert "entropy" not in Updater(engine, GRPOConfig()).step(play_turns(engine, ["a"]))
    with pytest.raises(ValueError, match="entropy_coef"):
        GRPOConfig(entropy_coef=-1)


def test_remote_servers_receive_the_new_weights(tiny_model_path, engine):
    from helpers import running_server

    from autocurricula.fleet.client import Client
    from autocurricula.serve.server import create_app

    remote = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    try:
        load_players(engine, ["a"])
        load_players(remote, ["a"])
        turns = play_turns(engine, ["a"], per_player=2)
        with running_server(create_app(remote)) as url, Client(url) as client:
            Updater(engine, GRPOConfig(learning_rate=1e-2), remotes=[client]).step(turns)
            assert remote.adapter_info("a")["version"] == engine.adapter_info("a")["version"] == 2
            ids = turns[0].prompt_ids
            np.testing.assert_allclose(remote.logits(ids, "a"), engine.logits(ids, "a"), atol=1e-5)
    finally:
        remote.close()


def test_split_turns_deals_each_players_games_round_robin():
    turns = [Turn(p, g, "X", [1], [2], [0.0]) for p, g in
             [("a", "g0"), ("a", "g0"), ("b", "g0"), ("a", "g1"), ("a", "g2"), ("b", "g3"), ("a", "g0")]]
    parts = split_turns(turns, 2)
    keys = [[(t.player, t.game_id) for t in part] for part in parts]
    # a's games g0, g1, g2 go to slices 0, 1, 0; b's g0, g3 to 0, 1; a game's turns stay together
    assert keys == [[("a", "g0"), ("a", "g0"), ("b", "g0"), ("a", "g2"), ("a", "g0")], [("a", "g1"), ("b", "g3")]]
    assert split_turns(turns, 1) == [turns] and len(split_turns(turns[:1], 4)) == 1  # empty slices dropped
    merged = merge_step_metrics([{"rows": 2, "tokens": 10, "loss": 0.5, "players": 2, "clip_ratio": 0.1,
                                  "grad_norm/a": 1.0},
                                 {"rows": 1, "tokens": 30, "loss": 0.25, "players": 1, "clip_ratio": 0.5}])
    assert merged == {"rows": 3, "tokens": 40, "loss": 0.75, "players": 2, "clip_ratio": 0.4, "grad_norm/a": 1.0}


def test_steps_per_generation_is_one_step_per_slice(tiny_model_path, engine):
    names = ["a", "b"]
    load_players(engine, names)
    turns = play_turns(engine, names)
    with twin(tiny_model_path, names) as other, twin(tiny_model_path, names) as one:
        split = Updater(engine, GRPOConfig(learning_rate=1e-2, steps_per_generation=2))
        by_hand = Updater(other, GRPOConfig(learning_rate=1e-2))
        m = split.step(turns)
        for part in split_turns(turns, 2):
            by_hand.step(part)
        assert split.optim["a"].step == by_hand.optim["a"].step == 2 and m["rows"] == len(turns)
        assert engine.adapter_info("a")["version"] == 3
        assert_same_adapters(engine, other, names, atol=1e-6, rtol=1e-5)
        Updater(one, GRPOConfig(learning_rate=1e-2)).step(turns)  # and not one step over all the turns
        with pytest.raises(AssertionError):
            assert_same_adapters(engine, one, names, atol=1e-6, rtol=1e-5)


def test_steps_per_generation_checks_and_trl():
    with pytest.raises(ValueError, match="steps_per_generation"):
        GRPOConfig(steps_per_generation=0)
    trl = pytest.importorskip("trl")
    cfg = coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False,
                                            gradient_accumulation_steps=2, steps_per_generation=8))
    assert cfg.steps_per_generation == 4  # trl counts micro-steps: 8 of them, 2 per optimizer step
    assert coerce_grpo_config(trl.GRPOConfig(output_dir="/tmp/ac-trl", use_cpu=True, bf16=False)).steps_per_generation == 1


def test_num_iterations_reuses_turns_with_clipping(engine):
    load_players(engine, ["a"])
    turns = play_turns(engine, ["a"])
    up = Updater(engine, GRPOConfig(learning_rate=2e-2, num_iterations=3, epsilon=0.05))
    m = up.step(turns)
    assert up.optim["a"].step == 3 and engine.adapter_info("a")["version"] == 4
    assert m["clip_ratio"] > 0  # by the last pass the policy has moved past the clip range
