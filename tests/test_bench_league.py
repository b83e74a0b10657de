"""``autocurricula bench league``: every figure present and finite, printed with its ratio.

The run itself (a league per setting, real `autocurricula serve` subprocesses and a local Ray
instance) takes a few minutes on 2 cores, so it is in the slow tier
(``pytest -m slow tests/test_bench_league.py``)."""

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


def _fake(ray=True) -> dict:
    gps = {"inprocess": 10.0, "inprocess_pipelined": 12.0, "server1": 9.0, "server1_pipelined": 14.0,
           "server2": 11.0, "ray2": 13.0 if ray else None}
    return {"model": "m", "blas": "b", "device": "cpu", "cpus": 2, "quick": True, "games_per_s": gps,
            "round_s": {k: (1.0 if v else None) for k, v in gps.items()},
            "turns_per_s": {k: (20.0 if v else None) for k, v in gps.items()},
            "update_s": {k: (0.5 if v else None) for k, v in gps.items()},
            "remote_vs_inprocess": league._ratio(gps["server1"], gps["inprocess"]),
            "two_servers_vs_one": league._ratio(gps["server2"], gps["server1"]),
            "pipelined_vs_serial": league._ratio(gps["server1_pipelined"], gps["server1"]),
            "pipelined_vs_serial_inprocess": league._ratio(gps["inprocess_pipelined"], gps["inprocess"]),
            "ray_vs_inprocess": league._ratio(gps["ray2"], gps["inprocess"]), "retried": 0, "stale_dropped": 3,
            "settings": {}}


def test_cli_prints_the_table_with_ratios_and_goal(monkeypatch, capsys):
    from autocurricula.cli import main

    seen = {}

    def run(model=None, quick=False, settings=league.SETTINGS):
        seen.update(model=model, quick=quick)
        return _fake(ray=False)

    monkeypatch.setattr(league, "run", run)
    main(["bench", "league", "--quick"])
    out = capsys.readouterr().out
    assert seen == {"model": None, "quick": True}
    assert "pipelined_vs_serial" in out and "goal >= 1.5 (ok)" in out  # 14 / 9 = 1.56
    assert "ray2" in out and "(ray not installed)" in out
    assert "stale_dropped" in out and "remote_vs_inprocess" in out and "turns/s" in out
    _check(_fake(ray=False), ray_expected=False)
    bad = _fake()
    bad["two_servers_vs_one"] = float("nan")
    assert not league.finite(bad)  # the check the slow test relies on catches a NaN


def test_ratios_are_none_when_a_setting_is_missing():
    assert league._ratio(None, 2.0) is None and league._ratio(2.0, 0) is None and league._ratio(3.0, 2.0) == 1.5
