"""``autocurricula bench learn``: its suite, its arguments, and its smoke path end to end."""

import json

import pytest

from autocurricula.bench import learn
from autocurricula.cli import main


def test_the_matrix_suite_spans_scales_and_offsets_and_stays_put():
    games = learn.matrix_suite()
    assert len(games) == 20 and [g.name for g in games] == [f"learn-{i}" for i in range(20)]
    assert {g.shape for g in games} <= {(m, n) for m in range(2, 6) for n in range(2, 6)}
    scales = [g.scale for g in games]
    assert min(scales) < 1 < 10 < max(scales) and all(0.1 <= s <= 100 for s in scales)
    assert all(abs(g.offset) <= g.scale for g in games) and any(abs(g.offset) > 0.5 * g.scale for g in games)
    assert [g.payoff for g in learn.matrix_suite()] == [g.payoff for g in games]  # the same on every call
    scaled = learn.matrix_suite(3, payoff_scale=100)
    assert scaled[0].payoff[0][0] == pytest.approx(100 * games[0].payoff[0][0])


def test_uniform_plays_figures_do_not_depend_on_the_units():
    a, b = learn.matrix_suite(4), learn.matrix_suite(4, payoff_scale=100)
    for x, y in zip(a, b):
        fx, fy = learn.uniform_figures("matrix", x), learn.uniform_figures("matrix", y)
        assert fx["exploitability_share"] == pytest.approx(fy["exploitability_share"], abs=1e-5)
        assert fy["exploitability"] == pytest.approx(100 * fx["exploitability"], rel=1e-3)


@pytest.mark.parametrize("argv, message", [
    (["learn", "--games", "3"], "takes game names"),
    (["round", "--games", "kuhn"], "must be a whole number from 1 to 4096"),
    (["learn", "--games", "matrix:0"], "matrix:N needs a whole number"),
    (["learn", "--payoff-scale", "-1"], "--payoff-scale: must be a number > 0"),
    (["learn", "--epochs", "0"], "--epochs: must be a whole number from 1"),
    (["learn", "--budget", "huge"], "invalid choice"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("autocurricula.cli._bench", lambda args: pytest.fail("the bench ran"))
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_smoke_path_runs_the_suite_end_to_end(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pyspiel", reason="the OpenSpiel games need open_spiel: pip install 'autocurricula[openspiel]'")
    monkeypatch.setenv("AUTOCURRICULA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "rows.jsonl"
    main(["bench", "learn", "--budget", "smoke", "--games", "matrix:1,liars_dice", "--seeds", "3",
          "--output", str(out), "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["game"] for r in rows] == ["learn-0", "liars_dice(dice_sides=3)"] and rows == result["rows"]
    for r in rows:
        assert r["seed"] == 3 and r["default_recipe"] == "mirror self-play"
        for which in ("default", "selfplay", "uniform"):
            assert 0 <= r[which]["exploitability_share"] <= 1.0 + 1e-9
        assert 0 <= r["default"]["invalid_rate"] <= 1
    assert set(result["summary"]["3"]) == {"matrix", "liars_dice(dice_sides=3)"}
    assert result["budget"]["epochs"] == 1 and result["budget"]["games_per_round"] == 4


@pytest.mark.slow
def test_the_builtin_kuhn_poker_runs_beside_openspiels(tmp_path, capsys, monkeypatch):
    """``kuhn_builtin``: the package's own Kuhn poker (its prompts and warm-up examples), scored by
    the same played exploitability in chips, against the same goal as OpenSpiel's."""
    monkeypatch.setenv("AUTOCURRICULA_CACHE", str(tmp_path / "cache"))
    assert learn.uniform_figures("kuhn_builtin", None)["exploitability"] == pytest.approx(0.45833, abs=1e-5)
    main(["bench", "learn", "--budget", "smoke", "--games", "kuhn_builtin", "--seeds", "0", "--no-selfplay", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (row,) = result["rows"]
    assert row["game"] == "kuhn_poker (built-in)" and row["default_recipe"] == "mirror self-play"
    assert row["range"] == [-2.0, 2.0] and 0 < row["default"]["exploitability"] <= 4.0
    assert row["default"]["exploitability_share"] == pytest.approx(row["default"]["exploitability"] / 4, abs=1e-5)
    assert "met" in result["summary"]["0"]["kuhn_poker (built-in)"]
    with pytest.raises(ValueError, match="payoff-scale"):
        learn.suite_games("kuhn_builtin", payoff_scale=100)
