"""examples/negotiation_league.py on a tiny budget, and the negotiation warm-up examples."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autocurricula.games import negotiation

ROOT = Path(__file__).resolve().parent.parent


def test_warmup_examples_are_valid_moves_in_their_state():
    examples = negotiation.warmup_examples(300, seed=1)
    assert examples == negotiation.warmup_examples(300, seed=1)  # reproducible from the seed
    accepts = 0
    for prompt, reply in examples:
        state = negotiation.parse_prompt(prompt)
        move = negotiation.parse_reply(reply)
        if move == "accept":
            accepts += 1
            assert state["offer"] is not None  # accepting needs a pending offer
        else:
            assert move is not None and all(0 <= k <= n for k, n in zip(move, state["pool"]))
    assert 0 < accepts < len(examples)


@pytest.mark.slow  # a subprocess: warm-up, one epoch and the evaluation
def test_negotiation_example_runs_and_reports(tmp_path):
    args = [sys.executable, str(ROOT / "examples" / "negotiation_league.py"), "--epochs", "1", "--rounds", "1",
            "--games-per-learner", "6", "--branch-samples", "2", "--branch-turns", "1", "--eval-games", "8",
            "--curve-games", "4", "--hidden", "32", "--layers", "1", "--heads", "8", "--warmup-steps", "10",
            "--output-dir", str(tmp_path / "run")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"deal_value_base", "deal_value_trained", "ci95", "credit", "curve", "eval_games"} <= set(summary)
    assert summary["credit"] == "branch" and summary["eval_games"] == 8
    lo, hi = summary["ci95"]
    assert lo - 1e-3 <= summary["deal_value_trained"] - summary["deal_value_base"] <= hi + 1e-3
    assert all(0 <= summary[k] <= 1 for k in ("deal_value_base", "deal_value_trained"))
    assert [row["epoch"] for row in summary["curve"]] == [0]
