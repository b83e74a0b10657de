"""Engine behaviour: mixed batches equal per-row runs, continuous batching, hot-swap, LRU, sampling."""

import threading
import time

import numpy as np
import pytest

import autocurricula  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
from autocurricula.engine.lora import LoraContext, MultiLoRALinear

TOL = 1e-4  # float32; batching changes summation order only
GREEDY = dict(temperature=0.0, ignore_eos=True)


def random_adapter(engine, seed, r=8, targets=("q_proj", "v_proj"), b_std=0.3):
    spec = LoraSpec(r=r, lora_alpha=2 * r, target_modules=list(targets))
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=b_std)


def hold(engine):
    """Block the engine thread until the returned event is set, so submissions batch together."""
    go = threading.Event()
    engine.call(go.wait, 30)
    return go


def run_together(engine, jobs):
    go = hold(engine)
    futs = [engine.submit(prompt, player, SamplingParams(**kw)) for prompt, player, kw in jobs]
    go.set()
    return [f.result(timeout=120) for f in futs]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=8, max_batch=16))
    for i in range(4):
        eng.load_adapter(f"p{i}", random_adapter(eng, seed=i))
    yield eng
    eng.close()


def test_multilora_layer_matches_dense_math():
    mx.random.seed(0)
    base = nn.Linear(32, 24)
    ctx = LoraContext()
    layer = MultiLoRALinear(base, slots=4, rank=4, ctx=ctx)
    rng = np.random.default_rng(0)
    adapters = {s: (rng.normal(size=(32, r)).astype(np.float32), rng.normal(size=(r, 24)).astype(np.float32), 0.5 * s)
                for s, r in ((1, 4), (2, 2), (3, 3))}  # ranks below the stack's rank are zero-padded
    for s, (a, b, scale) in adapters.items():
        layer.write_slot(s, mx.array(a), mx.array(b), scale)
    x = mx.array(rng.normal(size=(5, 3, 32)).astype(np.float32))
    slots = [0, 1, 2, 3, 1]
    ctx.slots = mx.array(slots, dtype=mx.uint32)
    got = np.array(layer(x))
    base_out = np.array(base(x))
    for row, s in enumerate(slots):
        want = base_out[row]
        if s:
            a, b, scale = adapters[s]
            want = want + scale * (np.array(x[row]) @ a @ b)
        np.testing.assert_allclose(got[row], want, atol=1e-4, rtol=1e-4)


def test_mixed_batch_equals_each_row_alone(engine):
    jobs = [("The quick brown fox", None, dict(max_tokens=8, **GREEDY)),
            ("The quick brown fox", "p0", dict(max_tokens=8, **GREEDY)),
            ("hello", "p1", dict(max_tokens=5, **GREEDY)),
            ("A much longer prompt with several words in it", "p2", dict(max_tokens=8, **GREEDY)),
            ("hello", "p3", dict(max_tokens=8, **GREEDY))]
    steps_before = engine.stats["steps"]
    together = run_together(engine, jobs)
    assert engine.stats["steps"] - steps_before <= 8  # they really shared decode steps
    assert len({tuple(c.token_ids) for c in together}) > 2  # adapters make a difference
    for (prompt, player, kw), got in zip(jobs, together):
        alone = engine.generate(prompt, player, SamplingParams(**kw))
        assert got.token_ids == alone.token_ids
        np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=TOL)


def test_requests_join_and_leave_a_running_batch(engine):
    long = engine.submit("Once upon a time", "p0", SamplingParams(max_tokens=40, **GREEDY))
    seen = threading.Event()
    first = engine.submit("short one", "p1", SamplingParams(max_tokens=3, **GREEDY), on_token=lambda e: seen.set())
    assert seen.wait(60)
    later = [engine.submit("joining late", p, SamplingParams(max_tokens=4, **GREEDY)) for p in ("p2", None)]
    results = [f.result(60) for f in [long, first, *later]]
    assert not long.done() or results[0].finish_reason == "length"
    for c, (prompt, player, n) in zip(results, [("Once upon a time", "p0", 40), ("short one", "p1", 3),
                                                ("joining late", "p2", 4), ("joining late", None, 4)]):
        alone = engine.generate(prompt, player, SamplingParams(max_tokens=n, **GREEDY))
        assert c.token_ids == alone.token_ids and len(c.token_ids) == n
        np.testing.assert_allclose(c.logprobs, alone.logprobs, atol=TOL)


def test_hot_swap_takes_effect_next_step_and_fails_nothing(engine):
    engine.load_adapter("swap", random_adapter(engine, seed=10))
    new = random_adapter(engine, seed=11, b_std=1.0)
    k = 5
    params = SamplingParams(max_tokens=20, **GREEDY)
    before = engine.generate("Swap me", "swap", params)

    def on_token(event):  # runs on the engine thread: queue the swap, don't wait for it
        if event.token_id is not None and len(tokens) == k:
            engine.call(engine._install, "swap", new)
        tokens.append(event.token_id)

    tokens = []
    others = [engine.submit("bystander", "p0", SamplingParams(max_tokens=20, **GREEDY))]
    got = engine.submit("Swap me", "swap", params, on_token=on_token).result(60)
    assert all(f.result(60).finish_reason == "length" for f in others)
    assert got.version_spans == [(0, k + 1, 1), (k + 1, 20, 2)] and got.swapped
    assert got.token_ids[: k + 1] == before.token_ids[: k + 1]
    assert got.token_ids[k + 1 :] != before.token_ids[k + 1 :]
    assert engine.adapter_info("swap")["version"] == 2


def test_lru_eviction_and_reload_give_identical_outputs(tiny_model_path, engine):
    small = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, max_batch=8))
    try:
        for i in range(5):
            small.load_adapter(f"q{i}", random_adapter(small, seed=100 + i))
            engine.load_adapter(f"q{i}", random_adapter(engine, seed=100 + i))
        jobs = [("evict me", f"q{i % 5}", dict(max_tokens=6, **GREEDY)) for i in range(10)]
        got = run_together(small, jobs)  # 5 players, 2 slots: requests wait, none fail
        want = run_together(engine, jobs)
        assert small.slots.evictions > 0
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOL)
    finally:
        small.close()


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    kw = dict(max_tokens=10, temperature=1.0, seed=1234)
    alone = engine.generate("Sample", "p1", SamplingParams(**kw))
    crowd = run_together(engine, [("Sample", "p1", kw)] + [("noise", "p2", dict(max_tokens=10))] * 5)
    assert crowd[0].token_ids == alone.token_ids
    other_seed = engine.generate("Sample", "p1", SamplingParams(**{**kw, "seed": 99}))
    assert other_seed.token_ids != alone.token_ids


def test_top_k_one_is_greedy_and_logprobs_are_log_probabilities(engine):
    greedy = engine.generate("Topk", None, SamplingParams(max_tokens=6, **GREEDY))
    topk = engine.generate("Topk", None, SamplingParams(max_tokens=6, temperature=0.7, top_k=1, ignore_eos=True))
    assert topk.token_ids == greedy.token_ids
    assert all(lp <= 0 for lp in greedy.logprobs)


def test_stop_strings_truncate_text(engine):
    full = engine.generate("stop test", "p0", SamplingParams(max_tokens=12, **GREEDY))
    stop = full.text[3:5]
    assert stop
    cut = engine.generate("stop test", "p0", SamplingParams(max_tokens=12, stop=[stop], **GREEDY))
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]


def test_different_ranks_and_targets_share_one_engine(tiny_model_path, engine):
    lo = random_adapter(engine, seed=7, r=4)
    hi = random_adapter(engine, seed=8, r=16, targets=("q_proj", "k_proj", "v_proj", "o_proj", "down_proj"))
    solo = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, initial_rank=4))
    try:
        solo.load_adapter("lo", lo)
        want = solo.generate("rank test", "lo", SamplingParams(max_tokens=8, **GREEDY))
    finally:
        solo.close()
    engine.load_adapter("lo", lo)
    engine.load_adapter("hi", hi)  # grows the stacks to rank 16 and adds layers
    assert engine.lora.rank >= 16
    got, other = run_together(engine, [("rank test", "lo", dict(max_tokens=8, **GREEDY)),
                                       ("rank test", "hi", dict(max_tokens=8, **GREEDY))])
    assert got.token_ids == want.token_ids
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=TOL)
    assert other.token_ids != got.token_ids


def test_unload_waits_for_running_rows(engine):
    engine.load_adapter("temp", random_adapter(engine, seed=20))
    fut = engine.submit("unload", "temp", SamplingParams(max_tokens=30, **GREEDY))
    engine.unload_adapter("temp")
    assert fut.result(60).finish_reason == "length"
    assert "temp" not in engine.players()
    with pytest.raises(KeyError):
        engine.submit("x", "temp")


def test_cancel_a_running_request(engine):
    started = threading.Event()
    fut = engine.submit("cancel", None, SamplingParams(max_tokens=500, **GREEDY), request_id="c-1",
                        on_token=lambda e: started.set())
    assert started.wait(60)
    engine.cancel("c-1")
    out = fut.result(60)
    assert out.finish_reason == "cancelled" and len(out.token_ids) < 500


def test_bad_requests_raise_clear_errors(engine):
    with pytest.raises(ValueError, match="context"):
        engine.submit([1] * 10, None, SamplingParams(max_tokens=engine.max_context))
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], None)
    with pytest.raises(KeyError, match="nobody"):
        engine.submit("hi", "nobody")
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_quantized_base_mixed_batch(tiny_quantized_path):
    # keep_quantized: on CPU the engine would otherwise dequantize, and this tests the quantized path
    eng = Engine(str(tiny_quantized_path), config=EngineConfig(max_slots=4, keep_quantized=True))
    try:
        for i in range(3):
            eng.load_adapter(f"p{i}", random_adapter(eng, seed=i))
        assert all(isinstance(layer.base, nn.QuantizedLinear) for layer in eng.lora.layers.values())
        jobs = [("quantized", p, dict(max_tokens=6, **GREEDY)) for p in (None, "p0", "p1", "p2")]
        together = run_together(eng, jobs)
        assert len({tuple(c.token_ids) for c in together}) > 1
        for (prompt, player, kw), got in zip(jobs, together):
            alone = eng.generate(prompt, player, SamplingParams(**kw))
            assert got.token_ids == alone.token_ids
            np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=TOL)
    finally:
        eng.close()


def test_dead_engine_thread_is_reported(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=1))

    def boom(*a, **k):
        raise RuntimeError("simulated engine crash")

    eng.scheduler.step = boom  # the next decode step crashes the loop
    fut = eng.submit("x", None, SamplingParams(max_tokens=5))
    with pytest.raises(Exception, match="simulated"):
        fut.result(60)
    eng._thread.join(10)
    assert eng.health()["ok"] is False
    with pytest.raises(Exception, match="not running"):
        eng.submit("x")


def test_numpy_and_mlx_samplers_agree():
    from autocurricula.engine.sampling import sample, sample_np

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 300)).astype(np.float32) * 3
    args = dict(temps=np.array([0, 1, 0.7, 1.3, 1, 0.5], dtype=np.float32),
                top_ps=np.array([1, 1, 0.9, 1, 0.5, 0.95], dtype=np.float32),
                top_ks=np.array([0, 0, 0, 5, 0, 20], dtype=np.int32),
                seeds=np.arange(6, dtype=np.uint32) * 7919, positions=np.arange(6, dtype=np.uint32) + 30)
    t_mx, lp_mx = sample(mx.array(logits), **args)
    t_np, lp_np = sample_np(logits, **args)
    assert np.array(t_mx).tolist() == t_np.tolist()
    np.testing.assert_allclose(np.array(lp_mx), lp_np, atol=1e-5)
    # top-k restricts the draw: row 3 only ever picks from its 5 most likely tokens
    picks = {int(sample_np(logits, **{**args, "positions": args["positions"] + i})[0][3]) for i in range(200)}
    assert picks <= set(np.argsort(-logits[3])[:5].tolist()) and len(picks) > 1


def test_uniforms_stay_strictly_inside_zero_one():
    from autocurricula.engine.sampling import unit, unit_np

    extremes = np.array([0, 1, 2**31, 2**32 - 2, 2**32 - 1], dtype=np.uint32)
    for u in (unit_np(extremes), np.array(unit(mx.array(extremes)))):
        assert (u > 0).all() and (u < 1).all()
        assert np.isfinite(-np.log(-np.log(u))).all()


def test_cancelling_the_future_stops_the_request_and_keeps_the_engine(engine):
    import asyncio

    async def impatient():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.agenerate("cancel me", None, max_tokens=300, **GREEDY), timeout=0.01)

    asyncio.run(impatient())
    others = [engine.submit("still served", p, SamplingParams(max_tokens=5, **GREEDY)) for p in (None, "p0", "p1")]
    assert [f.result(60).finish_reason for f in others] == ["length"] * 3
    assert engine.health()["ok"]


def test_stop_string_at_the_very_start(engine):
    full = engine.generate("stop test", "p0", SamplingParams(max_tokens=12, **GREEDY))
    first = full.text[:2]
    events = []
    cut = engine.submit("stop test", "p0", SamplingParams(max_tokens=12, stop=[first], **GREEDY),
                        on_token=events.append).result(60)
    assert cut.finish_reason == "stop" and cut.text == ""
    assert "".join(e.text for e in events) == ""


def test_streamed_deltas_add_up_to_the_text(engine):
    for seed in range(5):
        events = []
        c = engine.submit("stream", "p2", SamplingParams(max_tokens=30, seed=seed), on_token=events.append).result(60)
        assert "".join(e.text for e in events) == c.text
        assert events[-1].finish_reason == c.finish_reason


def test_close_settles_queued_and_running_requests(tiny_model_path):
    from autocurricula.engine import EngineDeadError

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=1, max_batch=1))
    running = eng.submit("long", None, SamplingParams(max_tokens=1000, **GREEDY))
    queued = eng.submit("waiting", None, SamplingParams(max_tokens=5, **GREEDY))
    eng.close()
    for fut in (running, queued):
        with pytest.raises(EngineDeadError):
            fut.result(10)
    with pytest.raises(EngineDeadError):
        eng.submit("after close")


def test_a_busy_player_cannot_starve_another_when_slots_are_short(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=1, max_batch=4, max_wait_steps=5))
    try:
        eng.load_adapter("a", random_adapter(eng, seed=1))
        eng.load_adapter("b", random_adapter(eng, seed=2))
        first = [eng.submit("a", "a", SamplingParams(max_tokens=20, **GREEDY)) for _ in range(2)]
        b = eng.submit("b", "b", SamplingParams(max_tokens=3, **GREEDY))
        later = [eng.submit("a", "a", SamplingParams(max_tokens=20, **GREEDY)) for _ in range(6)]
        b.result(60)
        # after max_wait_steps, b stops letting later a-requests pass: it need not wait for all of them
        assert sum(f.done() for f in later) < len(later)
        [f.result(60) for f in first + later]
    finally:
        eng.close()


def test_unload_serves_requests_queued_before_it(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, max_batch=1))
    try:
        eng.load_adapter("a", random_adapter(eng, seed=1))
        busy = eng.submit("busy", None, SamplingParams(max_tokens=40, **GREEDY))
        queued = eng.submit("queued", "a", SamplingParams(max_tokens=3, **GREEDY))  # no batch room yet
        eng.unload_adapter("a")
        assert queued.result(60).finish_reason == "length" and busy.result(60)
        assert "a" not in eng.players()
        eng.load_adapter("a", random_adapter(eng, seed=3))
        assert eng.adapter_info("a")["version"] == 2  # versions never repeat for a name
    finally:
        eng.close()


def test_engine_calls_from_the_engine_thread_run_inline(engine):
    assert engine.call(lambda: engine.call(lambda: 41).result() + 1).result(10) == 42
    with pytest.raises(RuntimeError, match="engine thread"):
        engine.call(lambda: engine.generate("x")).result(10)


def test_submit_many_admits_a_group_together_or_not_at_all(engine):
    jobs = [("the player wins", None, dict(max_tokens=6, temperature=0, ignore_eos=True)),
            ("x o x", None, dict(max_tokens=6, seed=3, ignore_eos=True)),
            ("once upon a time", None, dict(max_tokens=6, seed=4, ignore_eos=True))]
    held = run_together(engine, jobs)
    steps = engine.stats["steps"]
    futs = engine.submit_many([(p, player, SamplingParams(**kw)) for p, player, kw in jobs])
    many = [f.result(timeout=120) for f in futs]
    assert [c.token_ids for c in many] == [c.token_ids for c in held]  # the same batch as a held engine
    assert engine.stats["steps"] - steps <= 6  # all three decoded side by side, not one after another
    done = engine.stats["completions"]
    with pytest.raises(ValueError, match="context"):
        engine.submit_many([("fine", None, SamplingParams(max_tokens=2)),
                            ("too long", None, SamplingParams(max_tokens=10**6))])
    time.sleep(0.2)
    assert engine.stats["completions"] == done  # the valid request was not queued either


def test_prefill_groups_rows_of_similar_work():
    from autocurricula.engine.runner import prefill_groups

    assert prefill_groups([20, 20, 20], [False] * 3) == [[0, 1, 2]]  # one forward, in order
    # widest first; a row needing at most half its group's width starts a new group
    assert prefill_groups([20, 300, 8, 160, 150, 20], [False] * 6) == [[1, 3], [4], [0, 5], [2]]
    assert prefill_groups([4, 3, 4], [False] * 3) == [[0, 1, 2]]  # one group: the rows as given
    assert prefill_groups([20, 12, 20], [False, True, False]) == [[0, 2], [1]]  # a reused state: alone


def test_admission_counts_prompt_tokens_not_the_padded_rectangle(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, max_batch=8, max_prefill_tokens=100))
    try:
        first = {}  # request -> decode step of its first token: rows prefilled together share it

        def note(i):
            return lambda ev: first.setdefault(i, eng.stats["steps"])

        prompts = [list(range(3, 83))] + [list(range(10 + i, 20 + i)) for i in range(4)]  # 80 + 4 x 10 tokens
        go = hold(eng)
        futs = [eng.submit(p, None, SamplingParams(max_tokens=3, **GREEDY), on_token=note(i))
                for i, p in enumerate(prompts)]
        go.set()
        together = [f.result(timeout=120).token_ids for f in futs]
        assert {i for i, s in first.items() if s == min(first.values())} == {0, 1, 2}  # 80 + 10 + 10 <= 100
        assert together == [eng.generate(p, None, SamplingParams(max_tokens=3, **GREEDY)).token_ids for p in prompts]
    finally:
        eng.close()
