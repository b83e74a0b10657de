"""``autocurricula bench league``: every figure present and finite, printed with its ratio.

The default tier runs the bench for real on its in-process settings and a tiny model (seconds);
the full quick run (real `autocurricula serve` subprocesses and a local Ray instance) takes a few
minutes on 2 cores, so it is in the slow tier (``pytest -m slow tests/test_bench_league.py``)."""

import json
import math

import pytest

from autocurricula.bench import league

KEYS = ("games_per_s", "round_s", "remote_vs_inprocess", "two_servers_vs_one", "pipelined_vs_serial",
        "ray_vs_inprocess", "retried", "stale_dropped")


def _check(r: dict, ray_expected: bool) -> None:
    for key in KEYS:
        assert key in r, key
    assert set(r["games_per_s"]) == set(league.SETTINGS)
    for name, g in r["games_per_s"].items():
        if name == "ray2" and not ray_expected:
            assert g is None
            continue
        assert isinstance(g, float) and math.isfinite(g) and g > 0, (name, g)
        assert math.isfinite(r["round_s"][name]) and r["round_s"][name] > 0
        assert math.isfinite(r["turns_per_s"][name]) and r["turns_per_s"][name] > 0
    ratios = ["remote_vs_inprocess", "two_servers_vs_one", "pipelined_vs_serial"] + (
        ["ray_vs_inprocess"] if ray_expected else [])
    for key in ratios:
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r[key])
    assert isinstance(r["retried"], int) and isinstance(r["stale_dropped"], int)
    assert league.finite(r)


@pytest.mark.slow  # six 2-epoch leagues, three server processes and a Ray instance: ~3 min on 2 cores
def test_quick_run_prints_every_figure(capsys):
    from autocurricula.cli import main

    try:
        import ray  # noqa: F401
        has_ray = True
    except ImportError:
        has_ray = False
    main(["bench", "league", "--quick", "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _check(r, has_ray)
    assert r["quick"] is True


INPROCESS = ("inprocess", "inprocess_pipelined")


def test_a_real_run_of_the_in_process_settings_prints_its_figures(tmp_path, monkeypatch, capsys):
    from autocurricula.cli import main
    from autocurricula.engine.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
    real, runs = league.run, []

    def run(model=None, quick=False, settings=league.SETTINGS, repeats=1):  # the CLI's call, tiny model, in-process
        runs.append(real(model=str(base), quick=quick, settings=INPROCESS, repeats=repeats))
        return runs[-1]

    monkeypatch.setattr(league, "run", run)
    main(["bench", "league", "--quick", "--repeats", "2"])
    out = capsys.readouterr().out
    (r,) = runs
    assert r["quick"] is True and r["repeats"] == 2 and set(r["games_per_s"]) == set(INPROCESS) and league.finite(r)
    for name in INPROCESS:
        # quick: 2 rounds of the measured epoch, each 8 games of the main agent and 4 of each exploiter
        assert [run["games"] for run in r["settings"][name]] == [2 * (8 + 4 + 4)] * 2  # interleaved repeats
        each = sorted(run["games_per_s"] for run in r["settings"][name])
        assert r["games_per_s"][name] == round((each[0] + each[1]) / 2, 3)  # the median of two
        assert r["games_per_s"][name] > 0 and r["round_s"][name] > 0 and r["turns_per_s"][name] > 0
        row = next(line.split() for line in out.splitlines() if line.split()[:1] == [name])
        assert float(row[1]) == r["games_per_s"][name] and float(row[3]) == r["round_s"][name]
    per_repeat = [league.ratio(p["games_per_s"], s["games_per_s"])
                  for p, s in zip(r["settings"]["inprocess_pipelined"], r["settings"]["inprocess"])]
    ratio = r["pipelined_vs_serial_inprocess"]
    assert ratio == league.median(per_repeat) > 0 and r["spread"]["pipelined_vs_serial_inprocess"] == \
        [min(per_repeat), max(per_repeat)]
    line = next(line for line in out.splitlines() if line.startswith("pipelined_vs_serial_inprocess"))
    assert float(line.split()[1]) == ratio and "over 2" in line
    assert r["remote_vs_inprocess"] is None and r["ray_vs_inprocess"] is None  # settings not run
    assert r["stale_dropped"] == 0  # max_staleness=1 >= num_iterations=1 keeps every overlapped turn


def test_ratios_are_none_when_a_setting_is_missing():
    assert league.ratio(None, 2.0) is None and league.ratio(2.0, 0) is None and league.ratio(3.0, 2.0) == 1.5
