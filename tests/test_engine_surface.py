"""The engine's public surface: nothing outside ``autocurricula/engine/`` reaches into its internals,
and what the updater needs (weights, install, lent stacks) is public and behaves."""

import re
from pathlib import Path

import numpy as np
import pytest

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, RolloutEngine, TrainableEngine

PKG = Path(__file__).resolve().parent.parent / "autocurricula"
# an engine object's internals (slot table, LoRA stacks, residency, scheduler) or private names
INTERNAL = re.compile(r"(?<![\w.])(?:self\.|self\._)?(?:engine|eng|_engine)\.(?:slots|lora|residency|scheduler)\b"
                      r"|(?<![\w.])(?:self\.|self\._)?(?:engine|eng|_engine)\._[a-z]\w*")


def test_nothing_outside_the_engine_package_reaches_into_engine_internals():
    hits = []
    for path in PKG.rglob("*.py"):
        if (PKG / "engine") in path.parents:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if INTERNAL.search(line.split("#")[0]):
                hits.append(f"{path.relative_to(PKG.parent)}:{i}: {line.strip()}")
    assert not hits, "use the Engine's public methods instead:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_guards_against():
    for bad in ("engine.slots.records[n]", "self.engine.lora.layers", "engine._install(n, w)",
                "x = eng.lora.ctx.slots", "self.engine._write_slot(rec)"):
        assert INTERNAL.search(bad), bad
    for fine in ("from autocurricula.engine.scheduler import Completion", "engine.adapter_weights(n)",
                 "engine.install(n, w)", "engine.linear_dims[p]"):
        assert not INTERNAL.search(fine), fine


def test_the_scheduler_uses_no_private_engine_methods():
    src = (PKG / "engine" / "scheduler.py").read_text() + (PKG / "engine" / "runner.py").read_text()
    assert not re.search(r"\be\._\w|self\.e\._\w", src)


def test_protocol_documents_what_arena_and_trainer_call():
    for name in ("submit", "submit_many", "load_adapter", "unload_adapter", "adapter_info", "players",
                 "encode", "decode", "apply_chat_template", "health", "occupancy", "sync_from", "make_updater",
                 "close"):
        assert getattr(RolloutEngine, name).__doc__, name
    for name in ("adapter_weights", "install", "call", "training_stacks", "token_logprobs", "tree_fallback",
                 "tree_logprobs", "completion_logprobs"):
        assert getattr(TrainableEngine, name).__doc__, name


def test_the_engine_package_imports_nothing_above_it_and_its_scheduler_not_the_engine():
    for path in (PKG / "engine").glob("*.py"):
        src = path.read_text()
        assert not re.search(r"(?:from|import) autocurricula\.(?!engine\b|records\b|files\b)", src), path.name
    sched = (PKG / "engine" / "scheduler.py").read_text() + (PKG / "engine" / "runner.py").read_text()
    assert "autocurricula.engine.engine" not in sched


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, initial_rank=4))
    yield eng
    eng.close()


def _adapter(engine, seed, rank=4):
    spec = LoraSpec(r=rank)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=0.5)


def test_the_in_process_engine_is_a_rollout_and_a_trainable_engine(engine):
    assert isinstance(engine, RolloutEngine) and isinstance(engine, TrainableEngine)
    assert engine.stats["retried"] == 0
    assert engine.sync_from(engine) == {"pushed": [], "dropped": []}
    assert engine.make_updater(engine, None) is None  # the trainer builds its in-process Updater


def test_install_and_adapter_weights_round_trip(engine):
    w = _adapter(engine, 1)
    v1 = engine.install("surface-a", w)
    assert engine.adapter_weights("surface-a") is w
    v2 = engine.call(engine.install, "surface-a", _adapter(engine, 2), None, False).result()  # inline on the thread
    assert v2 == v1 + 1 == engine.adapter_info("surface-a")["version"]
    with pytest.raises(Exception, match="does not fit"):
        engine.install("surface-a", AdapterWeights({next(iter(w.modules)): (np.zeros((3, 4), np.float32),
                                                                            np.zeros((4, 5), np.float32))}, 1.0))


def test_training_stacks_only_on_the_engine_thread_and_restore_serving(engine):
    import mlx.core as mx

    with pytest.raises(RuntimeError, match="engine thread"):
        with engine.training_stacks([], 4):
            pass
    engine.install("surface-b", _adapter(engine, 3))
    ids = engine.encode("hello there")
    pair = (ids[:-1], ids[-1:])
    before = engine.completion_logprobs([pair], "surface-b")
    pos, tgt = mx.array([[len(ids) - 2]]), mx.array([ids[-1:]])

    def job():
        with engine.training_stacks([], 4) as stacks:
            dims = stacks.dims
            stacks.set({p: (mx.ones((1, i, 1)), mx.ones((1, 1, o))) for p, (i, o) in dims.items()}, 1)
            stacks.route(mx.array([0], dtype=mx.uint32))
            changed = engine.token_logprobs(mx.array([ids[:-1]]), pos, tgt, 1.0)
        return float(changed.sum().item()), engine.adapter_weights("surface-b").rank

    changed, _ = engine.call(job).result()
    assert abs(changed - before[0]) > 1e-3  # the lent stacks were used
    assert engine.completion_logprobs([pair], "surface-b") == before  # and the serving ones are back
