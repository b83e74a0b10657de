"""Prefix caching: reused KV rows give the tokens a full prefill gives (greedy), per adapter
version, and the cache stays within its memory bound."""

import numpy as np
import pytest

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams

SPEC = LoraSpec(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"])
GREEDY = dict(temperature=0.0, ignore_eos=True)


def _engine(path, mb):
    return Engine(str(path), config=EngineConfig(max_slots=4, prefix_cache_mb=mb, prefix_block=4))


def _load(eng, names, seed=0):
    dims = {p: eng.linear_dims[p] for p in SPEC.resolve(eng.linear_dims)}
    for i, n in enumerate(names):
        eng.load_adapter(n, AdapterWeights.random(dims, SPEC, seed=seed + i, b_std=0.3))


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    cached, plain = _engine(tiny_model_path, 8.0), _engine(tiny_model_path, 0)
    for e in (cached, plain):
        _load(e, ["a", "b", "c"])
    yield cached, plain
    cached.close()
    plain.close()


def _run(eng, jobs, max_tokens=6):
    futs = eng.submit_many([(ids, player, SamplingParams(max_tokens=max_tokens, **GREEDY)) for ids, player in jobs])
    return [f.result(120).token_ids for f in futs]


def _prompts(seed, n, shared=13, tail=(3, 9)):
    rng = np.random.default_rng(seed)
    head = rng.integers(3, 1000, shared).tolist()
    return [head + rng.integers(3, 1000, int(rng.integers(*tail))).tolist() for _ in range(n)]


def test_shared_prefixes_across_players_give_the_same_tokens(engines):
    cached, plain = engines
    players = ["a", "b", "c", None]
    first = [(p, players[i % 4]) for i, p in enumerate(_prompts(0, 8))]
    second = [(p, players[(i + 1) % 4]) for i, p in enumerate(_prompts(0, 8))]  # same prompts, other players too
    hits0 = cached.stats["prefix_hit_tokens"]
    for jobs in (first, second, first):
        assert _run(cached, jobs) == _run(plain, jobs)
    assert cached.stats["prefix_hit_tokens"] > hits0  # the cache was used, not bypassed
    assert plain.stats["prefix_hit_tokens"] == 0 and plain.prefix_cache is None


def test_a_prompt_extended_across_turns_reuses_the_previous_turn(engines):
    cached, plain = engines
    convo = _prompts(1, 1, shared=10, tail=(2, 3))[0]
    for turn in range(4):  # each prompt = the previous prompt + its completion + new tokens
        hits, queries = cached.stats["prefix_hit_tokens"], cached.stats["prefix_query_tokens"]
        got = _run(cached, [(convo, "b")])[0]
        assert got == _run(plain, [(convo, "b")])[0]
        if turn:
            reused = cached.stats["prefix_hit_tokens"] - hits
            assert reused >= len(convo) - 1 - 4 - 9, (turn, reused, len(convo))  # all but < one block + new tokens
        assert cached.stats["prefix_query_tokens"] - queries == len(convo)
        convo = convo + got + [5, 6, 7, 8, 9][: turn + 2]
    assert 0 < cached.stats["prefix_hit_rate"] <= 1


def test_a_new_adapter_version_never_reuses_stale_kv(engines, tiny_model_path):
    cached, plain = engines
    prompt = _prompts(2, 1, shared=20, tail=(2, 3))[0]
    before = _run(cached, [(prompt, "c")])
    assert before == _run(plain, [(prompt, "c")])
    _load(cached, ["c"], seed=50)  # new weights, same name: version 2
    _load(plain, ["c"], seed=50)
    assert not any(k[0] == ("c", 1) for k in cached.prefix_cache.blocks)  # forgotten at install
    hits = cached.stats["prefix_hit_tokens"]
    after = _run(cached, [(prompt, "c")])
    assert after == _run(plain, [(prompt, "c")]) and after != before
    assert cached.stats["prefix_hit_tokens"] == hits  # nothing of version 1 was reused
    cached.unload_adapter("c")
    assert not any(k[0][0] == "c" for k in cached.prefix_cache.blocks)
    _load(cached, ["c"], seed=50)


def test_a_short_shared_instruction_is_served_from_the_cache_by_default(engines, tiny_model_path):
    _, plain = engines
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4))  # the default block
    try:
        _load(eng, ["a"])
        rng = np.random.default_rng(4)
        instruction = rng.integers(3, 1000, 12).tolist()  # as `bench peers`: 12 shared tokens, new boards
        for round_ in range(3):
            jobs = [(instruction + rng.integers(3, 1000, 8).tolist(), "a") for _ in range(8)]
            hits = eng.stats["prefix_hit_tokens"]
            assert _run(eng, jobs, max_tokens=4) == _run(plain, jobs, max_tokens=4)
            assert eng.stats["prefix_hit_tokens"] - hits == (12 * 8 if round_ else 0)
    finally:
        eng.close()


def test_the_memory_bound_evicts_least_recently_used_blocks(tiny_model_path):
    eng = _engine(tiny_model_path, 2.0)  # a few inserts of the tiny model (32 KB per 4-token block)
    try:
        _load(eng, ["a"])
        pc = eng.prefix_cache
        for seed in range(6):
            _run(eng, [(p, "a") for p in _prompts(10 + seed, 4, shared=16, tail=(8, 12))], max_tokens=4)
            assert pc.nbytes <= pc.capacity
        assert pc.evictions > 0 and pc.blocks
        assert pc.nbytes == sum(b.nbytes for b in pc.blocks.values())
        for blk in pc.blocks.values():  # every kept block is reachable: its parent is kept too
            assert blk.parent is None or blk.parent.key in pc.blocks
    finally:
        eng.close()


def test_config_rejects_a_negative_budget():
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        EngineConfig(prefix_cache_mb=-1)


def test_refine_renders_each_seat_as_a_growing_conversation():
    from autocurricula.games.refine import Conversation

    for chat in (False, True):
        c = Conversation("Be brief.", "Task: T\nText:", chat)
        prompts = [c.prompt()]
        for k in range(3):
            c.add(f"reply {k}", f"Critique: note {k}\nRevised text:")
            prompts.append(c.prompt())
        for prev, cur, k in zip(prompts, prompts[1:], range(3)):
            if chat:
                assert cur[: len(prev)] == prev and cur[len(prev)] == {"role": "assistant", "content": f"reply {k}"}
            else:
                assert cur.startswith(prev + f" reply {k}\n")


def test_refine_games_reuse_their_own_earlier_turns(tiny_model_path):
    import asyncio
    import functools

    from autocurricula.arena.arena import Arena, GameRecord
    from autocurricula.games import refine

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4))  # the default cache
    try:
        _load(eng, ["a", "b"])
        players = [{"id": "a"}, {"id": "b"}]
        play = functools.partial(refine.play, rounds=2, max_tokens=6)
        games = [(functools.partial(play, seed=i), players, GameRecord(f"r{i}", players), "refine") for i in range(4)]
        records = asyncio.run(Arena(eng, seed=0).run(games))
        assert all(r.error is None for r in records)
        assert eng.stats["prefix_hit_rate"] > 0.3, eng.stats
    finally:
        eng.close()


def test_server_stats_report_prefix_hits(tiny_model_path):
    from fastapi.testclient import TestClient

    from autocurricula.serve.server import create_app

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2), name="tiny")
    try:
        with TestClient(create_app(eng)) as client:
            body = {"model": "tiny", "prompt": "A prompt long enough to fill a few prefix blocks, twice.",
                    "max_tokens": 3, "temperature": 0}
            for _ in range(2):
                assert client.post("/v1/completions", json=body).status_code == 200
            stats = client.get("/v1/stats").json()["stats"]
        assert stats["prefix_query_tokens"] > stats["prefix_hit_tokens"] > 0
        assert 0 < stats["prefix_hit_rate"] < 1 and stats["prefix_cached_tokens"] > 0
    finally:
        eng.close()


def test_trainer_and_serve_settings_reach_the_engine(monkeypatch, tiny_model_path, tmp_path):
    import autocurricula.serve.server as server
    from autocurricula import AutocurriculumConfig, SelfPlayConfig, SelfPlayTrainer
    from autocurricula.cli import build_parser

    from toy_games import digits

    with pytest.raises(ValueError, match="prefix_cache_mb"):
        AutocurriculumConfig(engine={"prefix_cache_mb": -1})
    t = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, rules={"games_per_round": 2}, output_dir=str(tmp_path),
                                       progress=False, max_tokens=2, save_strategy="no", engine={"prefix_cache_mb": 0}))
    t.train(str(tiny_model_path), digits)
    try:
        assert t.engine.config.prefix_cache_mb == 0 and t.engine.prefix_cache is None
    finally:
        t.engine.close()
    seen = []
    monkeypatch.setattr(server, "serve", lambda model, **kw: seen.append(kw["prefix_cache_mb"]))
    for argv, want in ((["--prefix-cache-mb", "0"], 0.0), ([], 64.0)):
        args = build_parser().parse_args(["serve", "--model", str(tiny_model_path), *argv])
        args.func(args)
        assert seen.pop() == want


def test_clearing_the_cache_forgets_every_prefix(tiny_model_path):
    eng = _engine(tiny_model_path, 8.0)
    try:
        _load(eng, ["a"])
        prompt = _prompts(7, 1, shared=40)[0]
        _run(eng, [(prompt, "a")])
        assert eng.stats["prefix_cached_tokens"] > 0
        hits = eng.stats["prefix_hit_tokens"]
        eng.clear_prefix_cache()
        assert eng.stats["prefix_cached_tokens"] == 0
        _run(eng, [(prompt, "a")])
        assert eng.stats["prefix_hit_tokens"] == hits  # the repeat found nothing to reuse
        _run(eng, [(prompt, "a")])
        assert eng.stats["prefix_hit_tokens"] > hits  # and caches it again
    finally:
        eng.close()


def test_a_bfloat16_model_reuses_its_kv_rows_exactly(tiny_model_path, tmp_path):
    import shutil

    import mlx.core as mx

    folder = tmp_path / "bf16"
    shutil.copytree(tiny_model_path, folder)
    weights = mx.load(str(folder / "model.safetensors"))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in weights.items()})
    cached, plain = (Engine(str(folder), config=EngineConfig(max_slots=2, prefix_cache_mb=mb, prefix_block=4,
                                                             keep_quantized=True)) for mb in (8.0, 0))
    try:
        convo = _prompts(3, 1, shared=12, tail=(2, 3))[0]
        for _ in range(3):  # host blocks hold bfloat16 as its bits; a hit must give them back unchanged
            got = _run(cached, [(convo, None)])[0]
            assert got == _run(plain, [(convo, None)])[0]
            convo = convo + got + [7, 8]
        assert cached.stats["prefix_hit_tokens"] > 0
        (blk,) = list(cached.call(lambda: list(cached.prefix_cache.blocks.values())[:1]).result())
        assert blk.kv.dtype == np.uint16
    finally:
        cached.close()
        plain.close()


def test_a_long_prompt_in_the_batch_does_not_stop_short_ones_reusing_their_prefix(engines):
    cached, plain = engines
    rng = np.random.default_rng(5)
    instruction = rng.integers(3, 1000, 12).tolist()
    _run(cached, [(instruction + rng.integers(3, 1000, 6).tolist(), "a")], max_tokens=2)  # caches it
    short = [instruction + rng.integers(3, 1000, 6).tolist() for _ in range(3)]
    jobs = [(rng.integers(3, 1000, 60).tolist(), "a")] + [(p, "a") for p in short]  # the long one: no hit
    hits = cached.stats["prefix_hit_tokens"]
    assert _run(cached, jobs) == _run(plain, jobs)  # prefilled in two groups, merged: the same tokens
    assert cached.stats["prefix_hit_tokens"] - hits == 3 * 12
