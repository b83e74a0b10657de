"""Sliding-window and recurrent layers in the batched engine: rows of different lengths (left
padding), rows joining a running batch, and prefix-cache reuse give each row what it gets alone.

tests/test_families.py checks the same families against transformers through check-model; here
the batch layouts that check does not build. Default tier: Gemma 3 (sliding) and LFM2
(recurrent); the slow tier adds Mistral's and Phi-3's windows, Gemma 2 and Qwen3.5.
"""

import threading

import numpy as np
import pytest

pytest.importorskip("torch")

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams  # noqa: E402
from autocurricula.engine.models import refusal  # noqa: E402
from autocurricula.engine.tiny import build_family_model  # noqa: E402

WINDOWED = ["gemma3", "mistral_window", "phi3_window", "gemma2"]
RECURRENT = ["lfm2", "qwen3_5"]
DEFAULT = {"gemma3", "lfm2"}
PLAYERS = 4
LENGTHS = (5, 40, 90, 130)  # around and past the tiny models' 64-token window
GREEDY = dict(temperature=0.0, ignore_eos=True, max_tokens=12)


def _params(names):
    return [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in names]


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("window-families")


def _engine(path, prefix_cache_mb: float = 64.0) -> Engine:
    engine = Engine(str(path), config=EngineConfig(max_slots=PLAYERS + 2, prefix_cache_mb=prefix_cache_mb))
    spec = LoraSpec(r=8, lora_alpha=16, target_modules="all-linear")
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    for i in range(PLAYERS):
        engine.install(f"p{i}", AdapterWeights.random(dims, spec, seed=i + 1, b_std=0.05))
    return engine


def _prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(3, 500, size=n).tolist() for n in LENGTHS]


def _same(got, want):
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4)


@pytest.mark.parametrize("family", _params(WINDOWED + RECURRENT))
def test_ragged_and_joining_rows_equal_each_row_alone(family, family_dir):
    engine = _engine(build_family_model(family_dir / family, family))
    try:
        jobs = [(p, f"p{i}", SamplingParams(**GREEDY)) for i, p in enumerate(_prompts())]
        alone = [engine.submit(*job).result() for job in jobs]
        engine.clear_prefix_cache()
        _same([f.result() for f in engine.submit_many(jobs)], alone)  # one left-padded batch
        engine.clear_prefix_cache()
        # the last two rows join the first two after their first token (continuous batching)
        late: list = []
        joined = threading.Event()

        def on_token(event):
            if not joined.is_set():
                joined.set()
                late.extend(engine.submit_many(jobs[2:]))

        first = [engine.submit(*jobs[0], on_token=on_token), engine.submit(*jobs[1])]
        done = [f.result() for f in first]
        _same(done + [f.result() for f in late], alone)
        assert engine.stats["steps"] > 0
    finally:
        engine.close()


@pytest.mark.parametrize("family", _params(WINDOWED + RECURRENT))
def test_update_scores_what_the_sampler_sampled(family, family_dir):
    """The policy update's log-probabilities (one full forward, no cache) equal the sampler's
    (batched prefill and decode) past the window: Gemma 2's soft-capped head included."""
    engine = _engine(build_family_model(family_dir / family, family))
    try:
        prompts = _prompts()
        done = [f.result() for f in engine.submit_many(
            [(p, f"p{i}", SamplingParams(temperature=1.0, max_tokens=12, seed=i)) for i, p in enumerate(prompts)])]
        for i, c in enumerate(done):
            scored = engine.completion_logprobs([(c.prompt_ids, c.token_ids)], f"p{i}")[0]
            assert scored == pytest.approx(sum(c.logprobs), abs=1e-3)
    finally:
        engine.close()


@pytest.mark.parametrize("family", _params(WINDOWED + RECURRENT))
def test_prefix_reuse_past_the_window_gives_the_same_tokens(family, family_dir):
    """Blocks past the 64-token window are reused too; a recurrent model resumes from the state
    kept at the prompt's last whole block (112 of 130 tokens)."""
    engine = _engine(build_family_model(family_dir / family, family))
    try:
        prompt = _prompts()[-1]
        params = SamplingParams(**GREEDY)
        cold = engine.submit(prompt, "p1", params).result()
        hits = engine.stats["prefix_hit_tokens"]
        warm = engine.submit(prompt, "p1", params).result()
        assert engine.stats["prefix_hit_tokens"] - hits >= 112
        _same([warm], [cold])
    finally:
        engine.close()


@pytest.mark.parametrize("family", _params(WINDOWED + RECURRENT))
def test_turns_and_mixed_batches_reuse_prefixes_exactly(family, family_dir):
    """A conversation whose every prompt extends the previous prompt and completion, batched
    with rows that hit no cached block, gives each row what an engine without a prefix cache
    gives: rows that resume a recurrent state are prefilled apart and merged back in order."""
    path = build_family_model(family_dir / family, family)
    cached, plain = _engine(path), _engine(path, prefix_cache_mb=0)
    try:
        rng = np.random.default_rng(1)
        convo = rng.integers(3, 500, size=37).tolist()
        for turn in range(3):
            others = [rng.integers(3, 500, size=int(n)).tolist() for n in rng.integers(5, 60, size=3)]
            jobs = [(p, f"p{i}", SamplingParams(**GREEDY)) for i, p in enumerate([*others[:2], convo, others[2]])]
            hits = cached.stats["prefix_hit_tokens"]
            got = [f.result() for f in cached.submit_many(jobs)]
            _same(got, [f.result() for f in plain.submit_many(jobs)])
            # a recurrent row resumes all of the previous turn but its last partial block and the
            # new tokens (KV rows in a batch reuse only what the batch's common suffix leaves)
            if turn and family in RECURRENT:
                assert cached.stats["prefix_hit_tokens"] - hits >= len(convo) - 16 - 8
            convo = convo + got[2].token_ids + rng.integers(3, 500, size=5).tolist()
    finally:
        cached.close()
        plain.close()


def test_a_state_too_big_for_the_prefix_cache_is_not_kept(family_dir):
    """With room for fewer than eight states, rows keep none: nothing is reused, and every token
    is what an engine without a prefix cache gives."""
    path = build_family_model(family_dir / "lfm2", "lfm2")
    small, plain = _engine(path, prefix_cache_mb=0.01), _engine(path, prefix_cache_mb=0)
    try:
        jobs = [(p, f"p{i}", SamplingParams(**GREEDY)) for i, p in enumerate(_prompts())]
        for _ in range(2):
            _same([f.result() for f in small.submit_many(jobs)], [f.result() for f in plain.submit_many(jobs)])
        assert small.stats["prefix_hit_tokens"] == 0
        assert not any(b.state is not None for b in small.prefix_cache.blocks.values())
    finally:
        small.close()
        plain.close()


def test_served_and_refused_configs():
    assert refusal({"model_type": "mistral", "sliding_window": 64, "max_position_embeddings": 512}) is None
    assert refusal({"model_type": "gemma2", "sliding_window": 64, "max_position_embeddings": 512}) is None
    assert refusal({"model_type": "phi3", "sliding_window": 2047, "max_position_embeddings": 4096}) is None
    assert refusal({"model_type": "lfm2", "layer_types": ["conv", "full_attention"]}) is None
    assert refusal({"model_type": "qwen3_5_text", "layer_types": ["linear_attention", "full_attention"]}) is None
    # windows or recurrent layers in definitions the matrix does not check stay refused, by name
    assert "sliding_window=64" in refusal({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True,
                                           "max_position_embeddings": 512})
    assert "recurrent" in refusal({"model_type": "qwen3_next"})
    assert "qwen3_5_text" in refusal({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}})
