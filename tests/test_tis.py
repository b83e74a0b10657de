"""Truncated importance sampling against a sampler that is not the learner (vLLM's kernels,
precision and sampling settings): the correction of Yao, Liu et al. (2025) brings the policy
gradient's expectation back to the learner's own; without it, the gradient follows the sampler.
Pure maths on a categorical policy, no vLLM."""

import math

import mlx.core as mx
import numpy as np
import pytest

from autocurricula.training.config import GRPOConfig, coerce_grpo_config
from autocurricula.training.loss import (MISMATCH_KEYS, mismatch_metrics, mismatch_sums, policy_loss,
                                         policy_loss_reference, truncated_is_weights)

K = 8  # tokens of the toy vocabulary
EPS = 0.2


def _setup(seed: int = 0, perturbation: float = 0.6):
    """A learner's logits, a deliberately perturbed sampler's, and an advantage per token."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=K).astype(np.float32)
    sampler = theta + perturbation * rng.normal(size=K).astype(np.float32)
    adv = rng.normal(size=K).astype(np.float32)
    return theta, sampler, adv


def _log_softmax(x):
    return x - mx.logsumexp(x)


def _true_gradient(theta, adv) -> np.ndarray:
    """The gradient of the learner's own loss -E_{y~pi}[A(y)], exactly."""
    return np.array(mx.grad(lambda t: -(mx.exp(_log_softmax(t)) * mx.array(adv)).sum())(mx.array(theta)))


def _expected_update_gradient(theta, sampler_logits, adv, tokens=None, counts=None, cap=None, old="learner"):
    """The gradient of ``policy_loss`` in expectation over the sampler's draws (every token weighted
    by its sampler probability), or over given draws (``tokens`` with ``counts``). ``cap``: TIS
    cap (None: no correction). ``old``: "learner" (the ratio against the learner's own logprobs,
    what frameworks do) or "sampler" (the PPO ratio against the sampler's logprobs)."""
    log_q = np.array(_log_softmax(mx.array(sampler_logits)))
    if tokens is None:
        tokens, counts = np.arange(K), np.exp(log_q)
    tokens = np.asarray(tokens)
    w = np.asarray(counts, np.float32)[:, None]
    sampler_lp = mx.array(log_q[tokens][:, None])

    def loss(t):
        logp = _log_softmax(t)[mx.array(tokens)][:, None]  # one row per token, one completion token each
        learner_old = mx.stop_gradient(logp)  # the learner before the update: the first pass's own logprobs
        is_w = truncated_is_weights(learner_old, sampler_lp, cap) if cap is not None else None
        base = learner_old if old == "learner" else sampler_lp
        value, _ = policy_loss(logp, base, mx.array(adv[tokens]), mx.array(w), mx.ones(w.shape), EPS, EPS,
                               is_weights=is_w)
        return value

    return np.array(mx.grad(loss)(mx.array(theta)))


def _rel(g, want) -> float:
    return float(np.linalg.norm(g - want) / np.linalg.norm(want))


def test_the_correction_brings_the_gradients_expectation_back_from_a_perturbed_sampler():
    theta, sampler, adv = _setup()
    want = _true_gradient(theta, adv)
    ratio = np.exp(np.array(_log_softmax(mx.array(theta))) - np.array(_log_softmax(mx.array(sampler))))
    uncapped = float(ratio.max()) + 1.0
    naive = _rel(_expected_update_gradient(theta, sampler, adv), want)
    corrected = _rel(_expected_update_gradient(theta, sampler, adv, cap=uncapped), want)
    assert naive > 0.1, f"the perturbed sampler should bias the uncorrected gradient, off by only {naive:.3f}"
    assert corrected < 1e-5, f"with a cap above every ratio the correction is exact, off by {corrected:.2e}"


def test_a_binding_cap_still_corrects_most_of_the_bias():
    theta, sampler, adv = _setup(seed=0, perturbation=0.9)
    want = _true_gradient(theta, adv)
    ratio = np.exp(np.array(_log_softmax(mx.array(theta))) - np.array(_log_softmax(mx.array(sampler))))
    assert ratio.max() > 2.0, "the test needs a token whose ratio the cap truncates"
    naive = _rel(_expected_update_gradient(theta, sampler, adv), want)
    capped = _rel(_expected_update_gradient(theta, sampler, adv, cap=2.0), want)
    assert capped < 0.5 * naive, (capped, naive)


def test_the_sampled_estimate_converges_on_the_learners_gradient_with_the_correction_only():
    theta, sampler, adv = _setup(seed=1)
    want = _true_gradient(theta, adv)
    q = np.exp(np.array(_log_softmax(mx.array(sampler))), dtype=np.float64)
    draws = np.random.default_rng(7).choice(K, size=200_000, p=q / q.sum())
    tokens, counts = np.unique(draws, return_counts=True)
    freq = counts / counts.sum()
    corrected = _rel(_expected_update_gradient(theta, sampler, adv, tokens, freq, cap=1e6), want)
    naive = _rel(_expected_update_gradient(theta, sampler, adv, tokens, freq), want)
    assert corrected < 0.03 and naive > 0.1, (corrected, naive)


def test_the_ppo_ratio_against_the_sampler_clips_away_part_of_the_gradient():
    """Taking the PPO ratio against the sampler's logprobs (no recomputed learner logprobs) is not
    the correction: tokens whose mismatch already exceeds the clip range give no gradient."""
    theta, sampler, adv = _setup(seed=3, perturbation=0.9)
    want = _true_gradient(theta, adv)
    against_sampler = _rel(_expected_update_gradient(theta, sampler, adv, old="sampler"), want)
    corrected = _rel(_expected_update_gradient(theta, sampler, adv, cap=1e6), want)
    assert against_sampler > 0.05 and corrected < 1e-5, (against_sampler, corrected)


def test_truncated_weights_are_capped_and_carry_no_gradient():
    learner = mx.array([[0.0, -1.0, -3.0]])
    sampler = mx.array([[-1.0, -1.0, -1.0]])
    w = truncated_is_weights(learner, sampler, 2.0)
    assert np.allclose(np.array(w), [[2.0, 1.0, math.exp(-2.0)]], atol=1e-6)
    g = mx.grad(lambda x: truncated_is_weights(x, sampler, 2.0).sum())(learner)
    assert np.all(np.array(g) == 0)
    with pytest.raises(ValueError, match="cap must be a number > 0"):
        truncated_is_weights(learner, sampler, 0)


def test_weights_multiply_the_clipped_term_as_the_reference_does():
    rng = np.random.default_rng(0)
    logp, old = rng.normal(size=(3, 4)) - 2, rng.normal(size=(3, 4)) - 2
    adv, mask = rng.normal(size=3), np.ones((3, 4))
    is_w = np.minimum(np.exp(rng.normal(size=(3, 4)) * 0.3), 2.0)
    weights = np.full((3, 4), 1 / 12)
    got, _ = policy_loss(mx.array(logp, mx.float32), mx.array(old, mx.float32), mx.array(adv, mx.float32),
                         mx.array(weights, mx.float32), mx.array(mask, mx.float32), 0.2, 0.2,
                         is_weights=mx.array(is_w, mx.float32))
    want = policy_loss_reference(logp, old, adv, mask, "bnpo", 0.2, 0.2, is_weights=is_w)
    plain = policy_loss_reference(logp, old, adv, mask, "bnpo", 0.2, 0.2)
    assert abs(got.item() - want) < 1e-5 and abs(want - plain) > 1e-3


def test_mismatch_sums_add_up_to_the_rounds_metrics():
    learner = mx.array([[-1.0, -2.0, 0.0], [-0.5, -0.5, -9.0]])
    sampler = mx.array([[-1.1, -1.5, 0.0], [-0.5, -0.25, -1.0]])
    mask = mx.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the last column is padding
    s = mismatch_sums(learner, sampler, mask)
    m = mismatch_metrics(s["abs_log_ratio_sum"].item(), s["abs_log_ratio_max"].item(), s["abs_log_ratio_tokens"].item())
    assert set(m) == set(MISMATCH_KEYS)
    assert m["mismatch/mean_abs_log_ratio"] == pytest.approx((0.1 + 0.5 + 0.0 + 0.25) / 4, abs=1e-6)
    assert m["mismatch/max_abs_log_ratio"] == pytest.approx(0.5, abs=1e-6)
    assert mismatch_metrics(0.0, 0.0, 0) == {}


def test_the_correction_is_on_for_vllm_only_and_its_cap_is_checked():
    cfg = GRPOConfig()
    assert cfg.sampler_cap(sampled_by_vllm=True) == 2.0 and cfg.sampler_cap(sampled_by_vllm=False) is None
    assert GRPOConfig(vllm_importance_sampling_cap=None).sampler_cap(True) is None
    assert coerce_grpo_config({"vllm_importance_sampling_cap": 3}).sampler_cap(True) == 3.0
    # trl's switch: a dict or a trl config that turns the correction off
    assert coerce_grpo_config({"vllm_importance_sampling_correction": False}).sampler_cap(True) is None

    class TrlLike:
        vllm_importance_sampling_correction, vllm_importance_sampling_cap, loss_type = False, 2.0, "dapo"

    assert coerce_grpo_config(TrlLike()).sampler_cap(True) is None
    for bad in (0.5, float("inf"), True, "2"):
        with pytest.raises(ValueError, match="vllm_importance_sampling_cap must be a finite number >= 1"):
            GRPOConfig(vllm_importance_sampling_cap=bad)


# ------------------------------------------------------------------- wired into the update

@pytest.fixture()
def sampled(tiny_model_path):
    """An engine with two players and turns they sampled (their logprobs are the learner's own)."""
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
    from autocurricula.records import Turn

    engine = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4))
    spec = LoraSpec(r=4, lora_alpha=8)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims, engine.model_type)}
    turns = []
    for i, name in enumerate(("a", "b")):
        engine.load_adapter(name, AdapterWeights.random(dims, spec, seed=i, b_std=0.05))
        for j in range(4):
            c = engine.generate(f"Game {j}: your move", name, SamplingParams(max_tokens=5, seed=j, ignore_eos=True))
            turns.append(Turn(name, f"g{j}", "X", c.prompt_ids, c.token_ids, c.logprobs, advantage=1.0 - 2 * (j % 2)))
    yield engine, turns
    engine.close()


def _shifted(turns, delta):
    import dataclasses

    return [dataclasses.replace(t, logprobs=[x - delta for x in t.logprobs]) for t in turns]


@pytest.mark.parametrize("delta", [0.3, 1.0])
def test_the_update_reweights_vllm_turns_by_the_truncated_ratio(sampled, delta):
    """A sampler whose logprobs sit delta below the learner's: every token's weight is
    min(e^delta, cap), so the first pass's loss is the unperturbed loss times that weight (the PPO
    ratio, taken against the learner, is 1); without the correction the ratio e^delta is clipped."""
    from autocurricula.training import Updater

    engine, turns = sampled
    cap = 2.0
    plain, _ = Updater(engine, GRPOConfig(learning_rate=0.0)).gradients(turns)
    tis, _ = Updater(engine, GRPOConfig(learning_rate=0.0, vllm_importance_sampling_cap=cap),
                     sampled_by_vllm=True).gradients(_shifted(turns, delta))
    assert tis["loss"] == pytest.approx(plain["loss"] * min(math.exp(delta), cap), rel=1e-4, abs=1e-6)
    ours, _ = Updater(engine, GRPOConfig(learning_rate=0.0, vllm_importance_sampling_cap=cap)).gradients(
        _shifted(turns, delta))  # our engine's turns: never corrected
    assert ours["loss"] != pytest.approx(tis["loss"], rel=1e-3)


@pytest.mark.parametrize("slices", [1, 2])
def test_every_update_reports_the_sampler_learner_gap(sampled, slices):
    """The mean and largest |learner - sampler| per token: about 0 on the engine's own turns, delta
    on a shifted sampler; with two slices the learner's logprobs are taken before the first step."""
    from autocurricula.training import Updater

    engine, turns = sampled
    own = Updater(engine, GRPOConfig(learning_rate=0.0)).step(turns)
    assert own[MISMATCH_KEYS[0]] < 1e-4 and own[MISMATCH_KEYS[1]] < 1e-3
    cfg = GRPOConfig(learning_rate=1e-2, steps_per_generation=slices, vllm_importance_sampling_cap=2.0)
    shifted = Updater(engine, cfg, sampled_by_vllm=True).step(_shifted(turns, 0.5))
    assert shifted[MISMATCH_KEYS[0]] == pytest.approx(0.5, abs=1e-3)
    assert shifted[MISMATCH_KEYS[1]] == pytest.approx(0.5, abs=2e-3)
