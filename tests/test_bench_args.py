"""``autocurricula bench`` checks its arguments before anything runs (issue 68, item 7): every count
bounded, the engine bench's model sized against the machine, errors from argparse (exit 2, the flag
and its range named, no traceback). Nothing here runs a bench."""

import argparse

import pytest

from autocurricula.bench import args as bench_args
from autocurricula.cli import build_parser, main


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("argv, flag, allowed", [
    (["engine", "--batch", "100000000"], "--batch", "from 1 to 4096"),
    (["engine", "--hidden", "1000000", "--layers", "1000"], "--hidden", "from 8 to 16384, a multiple of 8"),
    (["engine", "--layers", "1000"], "--layers", "from 1 to 256"),
    (["train", "--hidden", "0"], "--hidden", "from 8 to 16384"),
    (["engine", "--hidden", "12"], "--hidden", "a multiple of 8"),
    (["engine", "--new-tokens", "0"], "--new-tokens", "from 1 to 2048"),
    (["round", "--games", "0"], "--games", "from 1 to 4096"),
    (["round", "--games", "-1"], "--games", "from 1 to 4096"),
    (["round", "--torch-threads", "0"], "--torch-threads", "from 1 to 1024"),
    (["league", "--repeats", "0"], "--repeats", "from 1 to 100"),
    (["league", "--repeats", "two"], "--repeats", "not 'two'"),
])
def test_each_flag_is_refused_outside_its_range_by_argparse(argv, flag, allowed, capsys, monkeypatch):
    monkeypatch.setattr("autocurricula.cli._bench", lambda args: pytest.fail("the bench ran"))
    err = refused(argv, capsys)
    assert f"argument {flag}: must be a whole number" in err and allowed in err


def test_the_engine_benchs_model_is_sized_against_the_machine(capsys, monkeypatch):
    monkeypatch.setattr("autocurricula.cli._bench", lambda args: pytest.fail("the bench ran"))
    err = refused(["engine", "--hidden", "16384", "--layers", "256"], capsys)
    assert "--hidden 16384 --layers 256" in err and "GiB" in err and "of this machine's" in err
    assert "lower --hidden, --layers, --batch or --new-tokens" in err
    # a KV cache too large for the machine, with a small model
    monkeypatch.setattr(bench_args, "machine_memory", lambda: 8 * 2**30)
    err = refused(["engine", "--batch", "4096", "--new-tokens", "2048"], capsys)
    assert "KV cache" in err and "8.0 GiB" in err


def test_the_estimate_counts_model_kv_cache_and_adapters():
    small = bench_args.engine_bytes(256, 4, 64, 48)
    assert 30 * 2**20 < small["model"] < 60 * 2**20 and small["total"] < 2**30  # the defaults: well under 1 GiB
    big = bench_args.engine_bytes(1_000_000, 1000, 64, 48)
    assert big["total"] > 2**40  # the 3.6 TiB attempt: refused long before
    ns = argparse.Namespace(what="engine", model=None, hidden=256, layers=4, batch=64, new_tokens=48)
    assert bench_args.memory_problem(ns, memory=8 * 2**30) is None
    assert "need about" in bench_args.memory_problem(ns, memory=2**20)
    # another bench, or a model of the user's: --hidden / --layers build nothing
    assert bench_args.memory_problem(argparse.Namespace(**{**vars(ns), "what": "train"}), memory=2**20) is None
    assert bench_args.memory_problem(argparse.Namespace(**{**vars(ns), "model": "m"}), memory=2**20) is None


def test_the_defaults_and_in_range_values_pass(monkeypatch):
    ran = []
    monkeypatch.setattr("autocurricula.cli._bench", lambda args: ran.append(args))
    main(["bench", "engine"])
    main(["bench", "round", "--games", "1", "--repeats", "1", "--torch-threads", "2"])
    main(["bench", "engine", "--hidden", "512", "--layers", "8", "--batch", "8", "--new-tokens", "16"])
    assert [a.what for a in ran] == ["engine", "round", "engine"]
    assert (ran[1].games, ran[1].repeats, ran[1].torch_threads) == (1, 1, 2)
    args = build_parser().parse_args(["bench", "engine"])
    assert (args.hidden, args.layers, args.batch, args.new_tokens, args.games, args.repeats) == (256, 4, 64, 48,
                                                                                                    None, None)
