"""The CPU fast paths: float32 bases, the rational SiLU, the pruned sampler, sorted training rows."""

import mlx.core as mx
import numpy as np
import pytest

from autocurricula.engine import Engine, EngineConfig
from autocurricula.engine.cpu_kernels import SILU_ABS_TOL, fast_silu, fast_swiglu, install_fast_mlp, \
    uninstall_fast_mlp

pytestmark = pytest.mark.skipif(mx.default_device().type != mx.DeviceType.cpu, reason="CPU backend paths")

IDS = [5, 17, 300, 42, 9, 77, 512, 3, 64, 128, 900, 11, 250, 31, 7, 600]
# Dequantizing computes x @ dequantize(w).T in float32 where quantized_matmul dequantizes on the
# fly: the same weights, another summation order. Measured 7.6e-6 on logits of magnitude 8.
DEQUANT_LOGITS_TOL = 1e-4
# The rational SiLU is within 3e-7 * max(1, |x|) of the exact one; through 4 layers the logits
# move by about 1e-5 (measured 6.7e-6 here, 1.3e-5 on a Qwen2.5-0.5B-shaped model).
FAST_SILU_LOGITS_TOL = 1e-4


def test_rational_silu_is_within_its_bound_on_a_dense_grid():
    x = np.concatenate([np.linspace(-100, 100, 2_000_001, dtype=np.float32),
                        np.linspace(-20, 20, 2_000_001, dtype=np.float32),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38], dtype=np.float32)])
    with np.errstate(over="ignore"):
        exact = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64)))
    got = np.array(fast_silu(mx.array(x))).astype(np.float64)
    assert np.isfinite(got).all()
    err = np.abs(got - exact) / np.maximum(1.0, np.abs(x.astype(np.float64)))
    assert err.max() <= SILU_ABS_TOL, err.max()
    # the update differentiates it (its own fused backward): d/dgate and d/dx stay as close
    xs = mx.linspace(-30, 30, 600_001)
    up = mx.full(xs.shape, 1.5)
    d_gate, d_up = mx.grad(lambda g, u: fast_swiglu(g, u).sum(), argnums=(0, 1))(xs, up)
    xd = np.array(xs).astype(np.float64)
    sig = 1 / (1 + np.exp(-xd))
    assert np.abs(np.array(d_gate) - 1.5 * sig * (1 + xd * (1 - sig))).max() < 1e-5  # measured 3.7e-6
    assert (np.abs(np.array(d_up) - xd * sig) / np.maximum(1, np.abs(xd))).max() < SILU_ABS_TOL
    # swiglu = silu(gate) * x, also from half precision inputs (computed in float32)
    g = mx.array(x[:1000:7])
    for dtype in (mx.float32, mx.bfloat16):
        out = fast_swiglu(g.astype(dtype), mx.full(g.shape, 2.0, dtype=dtype))
        assert out.dtype == dtype
        ref = 2 * exact[:1000:7]
        tol = 1e-6 if dtype == mx.float32 else 1e-2
        assert np.allclose(np.array(out.astype(mx.float32)), ref, rtol=tol, atol=tol)


def test_quantized_base_is_dequantized_on_cpu_and_matches_the_quantized_logits(tiny_quantized_path):
    import mlx.nn as nn

    kept = Engine(str(tiny_quantized_path), config=EngineConfig(keep_quantized=True, cpu_fast_kernels=False))
    fast = Engine(str(tiny_quantized_path), config=EngineConfig(cpu_fast_kernels=False))
    try:
        kinds = lambda e: {type(m) for _, m in e.model.named_modules()}  # noqa: E731
        assert nn.QuantizedLinear in kinds(kept) and nn.QuantizedEmbedding in kinds(kept)
        assert kept.cpu_paths["weights"] == "as stored"
        assert not kinds(fast) & {nn.QuantizedLinear, nn.QuantizedEmbedding}
        assert fast.cpu_paths["weights"] == "float32" and fast.cpu_paths["dequantized"] > 0
        assert all(v.dtype == mx.float32 for _, v in _leaves(fast.model.parameters()))
        a, b = kept.logits(IDS), fast.logits(IDS)
        assert np.abs(a - b).max() < DEQUANT_LOGITS_TOL
        assert (a.argmax(-1) == b.argmax(-1)).all()
        assert kept.linear_dims == fast.linear_dims  # adapters fit either way
        # greedy tokens agree
        ta = kept.generate(IDS, max_tokens=8, temperature=0, ignore_eos=True).token_ids
        tb = fast.generate(IDS, max_tokens=8, temperature=0, ignore_eos=True).token_ids
        assert ta == tb
    finally:
        kept.close()
        fast.close()


def test_half_precision_weights_are_upcast_unless_kept():
    from autocurricula.engine.cpu_kernels import to_float32
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=1, intermediate_size=128,
                           num_attention_heads=4, rms_norm_eps=1e-5, vocab_size=100, num_key_value_heads=4)
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    counts = to_float32(model)
    assert counts["upcast"] > 0 and all(v.dtype == mx.float32 for _, v in _leaves(model.parameters()))


def test_fast_silu_logits_and_greedy_tokens_match_the_exact_mlp(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig())
    try:
        assert eng.cpu_paths["fast_silu_mlps"] == 4
        fast_logits = eng.logits(IDS)
        fast_tokens = eng.generate(IDS, max_tokens=12, temperature=0, ignore_eos=True).token_ids
        assert eng.call(uninstall_fast_mlp, eng.model).result() == 4
        exact_logits = eng.logits(IDS)
        exact_tokens = eng.generate(IDS, max_tokens=12, temperature=0, ignore_eos=True).token_ids
        assert 0 < np.abs(fast_logits - exact_logits).max() < FAST_SILU_LOGITS_TOL  # > 0: the path was used
        assert fast_tokens == exact_tokens
        assert eng.call(install_fast_mlp, eng.model).result() == 4
        assert np.array_equal(eng.logits(IDS), fast_logits)
    finally:
        eng.close()


def test_fast_kernels_can_be_turned_off(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(cpu_fast_kernels=False))
    try:
        assert eng.cpu_paths["fast_silu_mlps"] == 0
        assert all("FastSiLU" not in type(m).__name__ for _, m in eng.model.named_modules())
    finally:
        eng.close()


def test_only_plain_swiglu_mlps_are_switched():
    import mlx.nn as nn

    class Gelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)

        def __call__(self, x):
            return self.down_proj(nn.gelu(self.gate_proj(x)) * self.up_proj(x))

    m = Gelu()
    assert install_fast_mlp(m) == 0 and type(m) is Gelu


# ------------------------------------------------------------------ sampler
def _reference_sample_np(logits, temps, top_ps, top_ks, seeds, positions):
    """The straightforward sampler (full-vocabulary sort, noise for every token), per row."""
    from autocurricula.engine.sampling import row_uniforms_np

    logits = logits.astype(np.float32)
    greedy = temps <= 0
    t = np.where(greedy, 1.0, temps).astype(np.float32)[:, None]
    scaled = logits / t
    m = scaled.max(axis=-1, keepdims=True)
    logp = scaled - (m + np.log(np.exp(scaled - m).sum(axis=-1, keepdims=True)))
    tokens = logits.argmax(axis=-1)
    for r in np.flatnonzero(~greedy):
        lp = logp[r]
        if top_ks[r] > 0 or top_ps[r] < 1:
            order = np.argsort(-lp, kind="stable")
            probs = np.exp(lp[order])
            keep = np.arange(lp.size) < (top_ks[r] if top_ks[r] > 0 else lp.size)
            keep &= (np.cumsum(probs) - probs) < top_ps[r]
            mask = np.zeros(lp.size, bool)
            mask[order[keep]] = True
            lp = np.where(mask, lp, -np.inf)
        u = row_uniforms_np(seeds[r : r + 1], positions[r : r + 1], lp.size)[0]
        tokens[r] = (lp - np.log(-np.log(u))).argmax()
    return tokens, np.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


@pytest.mark.parametrize("vocab", [7, 300, 1024, 40000])
def test_pruned_sampler_draws_exactly_the_reference_tokens(vocab):
    from autocurricula.engine.sampling import sample_np

    rng = np.random.default_rng(vocab)
    for trial in range(6):
        b = 8
        logits = (rng.standard_normal((b, vocab)) * [0.1, 1, 3, 10, 30, 3][trial]).astype(np.float32)
        if trial == 5:
            logits = np.round(logits)  # ties
        args = dict(temps=rng.choice([0, 0.5, 1, 1.3], b).astype(np.float32),
                    top_ps=rng.choice([1, 1, 0.9, 0.5, 0.99], b).astype(np.float32),
                    top_ks=rng.choice([0, 0, 5, 50, 2000], b).astype(np.int32),
                    seeds=rng.integers(0, 2**32, b, dtype=np.uint64).astype(np.uint32),
                    positions=rng.integers(0, 5000, b).astype(np.uint32))
        tokens, logprobs = sample_np(logits, **args)
        ref_tokens, ref_logprobs = _reference_sample_np(logits, **args)
        assert tokens.tolist() == ref_tokens.tolist()
        assert np.array_equal(logprobs, ref_logprobs)  # log-softmax(logits / T) before truncation


def test_pruned_sampler_is_independent_of_the_batch():
    from autocurricula.engine.sampling import sample_np

    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((64, 30000)) * 4).astype(np.float32)
    args = dict(temps=np.ones(64, np.float32), top_ps=np.where(np.arange(64) % 3 == 0, 0.9, 1.0).astype(np.float32),
                top_ks=np.where(np.arange(64) % 5 == 0, 40, 0).astype(np.int32),
                seeds=np.arange(64, dtype=np.uint32) * 7919, positions=np.full(64, 21, np.uint32))
    batch = sample_np(logits, **args)
    for r in (0, 1, 3, 5, 63):
        alone = sample_np(logits[r : r + 1], **{k: v[r : r + 1] for k, v in args.items()})
        assert alone[0][0] == batch[0][r] and alone[1][0] == batch[1][r]


# ------------------------------------------------------------------ training
def test_update_rows_are_grouped_by_player_within_length_buckets():
    from autocurricula.training.update import Row, microbatches

    rows = [Row(p, [1] * n, 1, 1, 0.0, [0.0], 1.0) for p, n in
            [(2, 9), (0, 9), (1, 5), (2, 5), (0, 5), (1, 9), (0, 3), (2, 3)]]
    batches = microbatches(rows, 64)
    assert sorted(id(r) for b in batches for r in b) == sorted(id(r) for r in rows)
    for b in batches:
        assert [r.player for r in b] == sorted(r.player for r in b)  # gather_mm's sorted_indices holds
        assert max(len(r.ids) for r in b) - 1 <= 64 // len(b)  # the token budget still holds


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _leaves(v)
    else:
        yield None, tree


def test_serve_flag_reaches_the_engine_config(monkeypatch, tiny_model_path):
    import autocurricula.serve.server as server
    from autocurricula.cli import build_parser

    seen = []
    monkeypatch.setattr(server, "serve", lambda model, **kw: seen.append(kw["keep_quantized"]))
    for argv, want in ((["--keep-quantized"], True), ([], False)):
        args = build_parser().parse_args(["serve", "--model", str(tiny_model_path), *argv])
        args.func(args)
        assert seen.pop() is want
    with pytest.raises(ValueError, match="keep_quantized must be True or False"):
        EngineConfig(keep_quantized="yes")
