"""``autocurricula bench train --workload ...``: one round of real games, its tokens per row against
each learner's prefix trie, and its update run tree-packed and per row side by side; the flags it takes."""

import json

import pytest

from autocurricula.bench import train as bench_train
from autocurricula.cli import main
from autocurricula.records import Turn


def test_round_tokens_count_rows_tries_and_micro_batches():
    turns = [Turn("a", "g0", "X", [1, 2, 3], [4, 5], [-1.0] * 2), Turn("a", "g1", "X", [1, 2, 3], [4, 6], [-1.0] * 2),
             Turn("b", "g0", "O", [1, 2, 3], [4, 5], [-1.0] * 2)]
    out = bench_train.round_tokens(turns, budget=8)
    assert out == {"row_tokens": 15, "tree_tokens": 6 + 5, "padded_tokens": 3 * 4, "turns": 3, "learners": 2}


@pytest.mark.parametrize("workload", ["kuhn", "dataset"])
def test_a_workload_round_reports_its_ratio(workload, tiny_model_path, capsys):
    r = bench_train.run_workload(workload, model=str(tiny_model_path), games=4, repeats=2)
    assert [x["games"] for x in r["rounds"]] == [4, 4] and all(x["turns"] > 0 for x in r["rounds"])
    for x in r["rounds"]:
        assert 0 < x["tree_tokens"] < x["row_tokens"]
        assert x["tree_ratio"] == round(x["tree_tokens"] / x["row_tokens"], 4)
    ratios = [x["tree_ratio"] for x in r["rounds"]]
    assert r["tree_ratio"] == {"median": pytest.approx(sum(ratios) / 2, abs=1e-4), "min": min(ratios),
                               "max": max(ratios)}
    if workload == "dataset":  # G = 8 completions of one prompt each game: one group, one learner
        assert all(x["turns"] == 4 * 8 and x["learners"] == 1 for x in r["rounds"])
    for x in r["rounds"]:  # the update ran both ways on the round's turns
        assert x["tree_computed"] < x["rows_computed"] and x["tree_s"] > 0 and x["rows_s"] > 0
        assert x["tree_peak_mb"] > 0 and x["rows_peak_mb"] > 0 and x["tree_gflops"] > 0
    assert r["computed_ratio"]["max"] < 1 and r["gemm_gflops"] > 0
    table = bench_train.format_workload(r)
    for line in ("tree_tokens / row_tokens: median", "update seconds, tree / per row: median",
                 "update peak memory, tree / per row: median", "GEMM ceiling"):
        assert line in table


def test_workload_flags_are_checked(tiny_model_path, capsys):
    with pytest.raises(SystemExit, match=r"--workload kuhn is not a workload of bench peers"):
        main(["bench", "peers", "--workload", "kuhn"])
    with pytest.raises(SystemExit, match=r"--workload multiturn is not a workload of bench train"):
        main(["bench", "train", "--workload", "multiturn"])
    with pytest.raises(SystemExit):
        main(["bench", "train", "--workload", "kuhn", "--games", "0"])
    assert "--games" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--repeats must be a whole number of at least 1"):
        bench_train.run_workload("kuhn", model=str(tiny_model_path), repeats=0)
    main(["bench", "train", "--workload", "kuhn", "--model", str(tiny_model_path), "--games", "2", "--repeats", "1",
          "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["workload"] == "kuhn" and r["games"] == 2 and len(r["rounds"]) == 1
