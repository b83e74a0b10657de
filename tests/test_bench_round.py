"""``autocurricula bench round``: the round's games, our side at a tiny budget, the vLLM side skipped
cleanly where it cannot run, and (slow, where vLLM is installed) both sides on the same games."""

from __future__ import annotations

import collections
import sys
from concurrent.futures import Future

import pytest

from autocurricula.bench import round as bench_round
from autocurricula.engine import Completion


@pytest.fixture
def no_vllm_env(monkeypatch):
    monkeypatch.delenv("AUTOCURRICULA_VLLM_PYTHON", raising=False)


def test_schedule_is_the_example_league_round():
    """64 games of the three learners, the main agent in every pairing but the league exploiter's
    games against the scripted players, seats alternating; a smaller round keeps a mix."""
    games = bench_round.schedule(64)
    assert len(games) == 64
    pairs = collections.Counter(tuple(sorted(g)) for g in games)
    assert sum(pairs.values()) == 64 and pairs[("main", "main")] == 8 and pairs[("main", "main_exploiter")] == 20
    assert {p for g in games for p in g} == {*bench_round.LEARNERS, "random", "minimax"}
    assert sum(g[0] == "main" for g in games) not in (0, 64)  # the main agent plays X and O
    assert len({tuple(sorted(g)) for g in bench_round.schedule(8)}) >= 3


class _Replies:
    """An arena model whose replies are fixed tokens (``token``): the games must not depend on them."""

    def __init__(self, token: int):
        self.token, self.tokenizer, self.rows = token, None, []

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def submit_many(self, requests):
        out = []
        for ids, adapter, params in requests:
            self.rows.append((tuple(ids), adapter, params.max_tokens, params.temperature))
            f = Future()
            toks = [self.token] * params.max_tokens
            f.set_result(Completion("r", adapter, list(ids), toks, [-1.0] * len(toks), self.decode(toks), "length", 0,
                                    [(0, len(toks), 0)]))
            out.append(f)
        return out


def test_both_sides_play_the_same_games_whatever_the_replies():
    """The boards come from the round's seed, so two models with different replies are asked the same
    prompts for the same learners and make the same turns; advantages are centred per learner."""
    a, b = _Replies(ord("5")), _Replies(ord("z"))
    ra, rb = bench_round.play_round(a, seed=3, games=12), bench_round.play_round(b, seed=3, games=12)
    assert a.rows == b.rows and len(a.rows) > 12
    assert {r[2:] for r in a.rows} == {(bench_round.MAX_TOKENS, bench_round.TEMPERATURE)}
    assert [x.rewards for x in ra] == [x.rewards for x in rb]
    turns = bench_round.credited_turns(ra)
    assert len(turns) == len(a.rows) and {t.player for t in turns} <= set(bench_round.LEARNERS)
    for name in {t.player for t in turns}:
        assert abs(sum(t.advantage for t in turns if t.player == name)) < 1e-9
    assert bench_round.play_round(_Replies(ord("5")), seed=4, games=12) != ra  # another round, other games


def test_our_side_runs_without_vllm_and_says_why(no_vllm_env):
    """Our side plays and updates at a tiny budget and reports rounds per hour; the vLLM side is
    skipped with the way to name it, and the table prints the reason."""
    r = bench_round.run("tiny", repeats=1, games=4, warmup_games=2, gap=0.0)
    ours = r["ours"]
    assert ours["rounds_per_hour"]["median"] > 0 and ours["turns"]["median"] > 4
    assert ours["tokens"]["median"] == bench_round.MAX_TOKENS * ours["turns"]["median"]  # exactly 2 per turn
    assert ours["update_s"]["median"] > 0 and ours["reload_s"]["median"] == 0
    why = r["vllm_torch_peft"]["skipped"]
    assert "--vllm-python" in why and "AUTOCURRICULA_VLLM_PYTHON" in why
    assert "round_vs_vllm_torch_peft" not in r
    table = bench_round.format_table(r)
    assert "rounds/h" in table and "skipped: not named" in table


def test_a_python_without_vllm_is_skipped(tmp_path, no_vllm_env, capsys):
    """A named python that is missing, or cannot import vLLM, is skipped with its reason before
    anything starts."""
    from autocurricula.bench.peers import peer_python

    python, why = peer_python("vllm", str(tmp_path / "nope" / "python"))
    assert python is None and "not an executable file" in why
    try:
        import vllm  # noqa: F401
    except ImportError:
        python, why = peer_python("vllm", sys.executable)
        assert python is None and "cannot import vllm" in why


def test_cli_has_bench_round():
    from autocurricula.cli import build_parser

    args = build_parser().parse_args(["bench", "round", "--shape", "qwen0.5b", "--repeats", "2"])
    assert (args.what, args.shape, args.repeats, args.vllm_python) == ("round", "qwen0.5b", 2, None)


@pytest.mark.slow
def test_vllm_side_plays_the_same_round():
    """With vLLM's virtual environment named (``AUTOCURRICULA_VLLM_PYTHON``), both sides play 8 games
    of the bench model (vLLM's CPU attention has no kernel for the tiny shape's head size of 16):
    the same turns and tokens, every adapter reloaded, and a ratio. Skipped where it is not installed."""
    from autocurricula.bench.peers import peer_python

    python, why = peer_python("vllm")
    if python is None:
        pytest.skip(f"vllm: {why}")
    r = bench_round.run("bench", repeats=2, games=8, warmup_games=2, vllm_python=python, gap=0.5)
    ours, theirs = r["ours"], r["vllm_torch_peft"]
    assert ours["turns"] == theirs["turns"] and ours["tokens"] == theirs["tokens"]
    assert theirs["generate_s"]["median"] > 0 and theirs["reload_s"]["median"] > 0
    assert r["round_vs_vllm_torch_peft"]["median"] > 0


def test_rollouts_vllm_is_skipped_with_the_vllm_side_and_refuses_other_names(no_vllm_env):
    from autocurricula.cli import build_parser

    args = build_parser().parse_args(["bench", "round", "--rollouts", "vllm"])
    assert args.rollouts == "vllm" and build_parser().parse_args(["bench", "round"]).rollouts == "engine"
    with pytest.raises(ValueError, match="rollouts must be 'engine' or 'vllm'"):
        bench_round.run("tiny", rollouts="ray")
    r = bench_round.run("tiny", repeats=1, games=4, warmup_games=2, gap=0.0, rollouts="vllm")
    assert "--vllm-python" in r["ours_vllm_rollouts"]["skipped"] and "round_vs_ours_vllm_rollouts" not in r
    assert "vllm+ours         skipped: not named" in bench_round.format_table(r)


@pytest.mark.slow
def test_rollouts_on_a_vllm_server_with_our_update_play_the_same_round():
    """``--rollouts vllm``: the same games through a vLLM server (VLLMEngine) with our update and
    the adapters reloaded by version; vLLM's logprobs are the learner's to float32 rounding."""
    from autocurricula.bench.peers import peer_python

    python, why = peer_python("vllm")
    if python is None:
        pytest.skip(f"vllm: {why}")
    r = bench_round.run("bench", repeats=2, games=8, warmup_games=2, vllm_python=python, gap=0.5, rollouts="vllm")
    ours, mine = r["ours"], r["ours_vllm_rollouts"]
    assert ours["turns"] == mine["turns"] and ours["tokens"] == mine["tokens"]
    assert mine["reload_s"]["median"] > 0 and r["round_vs_ours_vllm_rollouts"]["median"] > 0
    assert len(mine["mismatch"]) == 2 and all(0 < m["max"] < 1e-3 for m in mine["mismatch"])
