"""Finiteness end to end: advantages outside float32, and updates whose loss or gradients are
not finite, never reach the adapters."""

import numpy as np
import pytest

import autocurricula  # noqa: F401
from autocurricula.credit import ConstantCredit
from autocurricula.engine import AdapterWeights, Engine, LoraSpec, SamplingParams
from autocurricula.records import Turn
from autocurricula.loop.rounds import check_advantages
from autocurricula.training import Updater
from autocurricula.training.config import GRPOConfig
from autocurricula.training.update import MAX_NONFINITE_IN_A_ROW, NonFiniteUpdateError


def test_advantages_outside_float32_are_refused_with_the_game_and_value():
    turns = [Turn("p", "g7", "r", [1], [2], [0.0], reward=1e300, game="dice")]
    ConstantCredit().assign(turns)
    with pytest.raises(ValueError, match=r"g7 \(dice\).*1e\+300.*float32"):
        check_advantages(turns, "constant")
    ok = [Turn("p", "g8", "r", [1], [2], [0.0], reward=1.0)]
    ConstantCredit().assign(ok)
    check_advantages(ok, "constant")


def _weights(engine, name):
    return {p: [np.array(x) for x in pair] for p, pair in engine.adapter_weights(name).modules.items()}


def test_a_nonfinite_update_is_skipped_counted_and_stops_after_a_few(tiny_model_path):
    engine = Engine(str(tiny_model_path))
    try:
        engine.load_adapter("p", AdapterWeights.random(engine.linear_dims, LoraSpec(r=4), seed=0))
        c = engine.generate("x", "p", SamplingParams(max_tokens=4, seed=1))
        huge = Turn("p", "g", "r", c.prompt_ids, c.token_ids, c.logprobs, reward=1.0)
        huge.advantage = 3e38  # finite in float32, but the loss's sum overflows
        up = Updater(engine, GRPOConfig(learning_rate=1e-2))
        before, version = _weights(engine, "p"), engine.adapter_info("p")["version"]
        for i in range(MAX_NONFINITE_IN_A_ROW - 1):
            out = up.step([huge, huge])
            assert out["skipped_nonfinite"] == 1  # the gradient overflows
        after = _weights(engine, "p")
        assert engine.adapter_info("p")["version"] == version  # nothing installed
        assert all(np.array_equal(before[k][j], after[k][j]) for k in before for j in (0, 1))
        with pytest.raises(NonFiniteUpdateError, match="learning_rate"):
            up.step([huge, huge])
        fine = Turn("p", "g", "r", c.prompt_ids, c.token_ids, c.logprobs, reward=1.0)
        fine.advantage = 1.0
        up.nonfinite_in_a_row = 0
        assert up.step([fine])["skipped_nonfinite"] == 0 and engine.adapter_info("p")["version"] == version + 1
    finally:
        engine.close()
