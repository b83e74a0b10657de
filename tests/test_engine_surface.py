"""The engine's public surface: nothing outside ``autocurricula/engine/`` reaches into its internals,
and what the updater needs (weights, install, lent stacks) is public and behaves."""

import re
from pathlib import Path

import numpy as np
import pytest

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, EngineProtocol, LoraSpec

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
                 "encode", "decode", "apply_chat_template", "health", "close"):
        assert getattr(EngineProtocol, name).__doc__, name


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, initial_rank=4))
    yield eng
    eng.close()


def _adapter(engine, seed, rank=4):
    spec = LoraSpec(r=rank)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=0.5)


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
    before = engine.logits(ids, "surface-b")

    def job():
        with engine.training_stacks([], 4) as stacks:
            dims = stacks.dims
            stacks.set({p: (mx.ones((1, i, 1)), mx.ones((1, 1, o))) for p, (i, o) in dims.items()}, 1)
            stacks.route(mx.array([0], dtype=mx.uint32))
            changed = np.array(engine.model(mx.array([ids], dtype=mx.int32))[0])
        return changed, engine.adapter_weights("surface-b").rank

    changed, _ = engine.call(job).result()
    assert not np.allclose(changed, before, atol=1e-3)  # the lent stacks were used
    np.testing.assert_array_equal(engine.logits(ids, "surface-b"), before)  # and the serving ones are back
