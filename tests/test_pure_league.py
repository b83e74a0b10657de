"""A pure league (a ``LeagueTrainer`` given no fixed ``opponents``): no scripted player enters the pool."""

from collections import Counter

import pytest

from autocurricula.leagues import LeagueConfig, LeagueTrainer
from autocurricula.loop.pool import is_scripted
from autocurricula.loop.rating import Payoff
from autocurricula.records import Player
from league_doubles import RunParts

SCRIPTED = [{"id": "random", "role": "random", "policy": str}, {"id": "minimax", "role": "minimax", "policy": str}]


class FakePool:
    def __init__(self, players):
        self.players = players


def pool_from_entry(trainer: LeagueTrainer) -> list[Player]:
    """The pool a league starts with: its entry specs as players (learners live, snapshots frozen)."""
    players, counts, ids = [], Counter(), {}
    for spec in trainer.entry():
        role = spec.get("role", "player")
        pid = spec.get("id") or f"{role}-{counts[role]}"
        counts[role] += 1
        ids[id(spec)] = pid
        player = {**spec, "id": pid, "role": role, "frozen": "policy" in spec or spec.get("frozen", False)}
        if isinstance(spec.get("snapshot_of"), dict):  # a snapshot of a spec earlier in the list
            player["snapshot_of"] = player["parent"] = ids[id(spec["snapshot_of"])]
        players.append(Player(**player))
    return players


class League(RunParts, LeagueTrainer):
    pass


def league(pure: bool = False, **rules) -> LeagueTrainer:
    t = League(LeagueConfig(progress=False, rules=rules), opponents=None if pure else [dict(o) for o in SCRIPTED])
    t.current_epoch, t.step, t.payoff = 0, 0, Payoff()
    return t


def test_entry_leaves_scripted_players_out_only_when_pure():
    ids = {s.get("id") for s in league().entry()}
    assert {"random", "minimax"} <= ids  # default: they join the pool as historical players
    pure = league(pure=True).entry()
    assert not any(s.get("id") in ("random", "minimax") or is_scripted(s) for s in pure)
    assert [s["role"] for s in pure if "snapshot_of" not in s] == ["main_agent", "main_exploiter",
                                                                   "league_exploiter", "league_exploiter"]


@pytest.mark.parametrize("anchor_share", [0.0, 0.5])
def test_default_league_still_sends_main_agent_games_to_scripted_players(anchor_share):
    t = league(anchor_share=anchor_share, main_exploiters=1, league_exploiters=1)
    t.pool = FakePool(pool_from_entry(t))
    main = t.learners("main_agent")[0]
    counts = Counter(t.opponent_for(main)["id"] for _ in range(4000))
    scripted = (counts["random"] + counts["minimax"]) / 4000
    assert scripted > (0.5 if anchor_share else 0.2)  # PFSP: 2 of 3 historical players at the start


def test_pure_league_main_agent_never_meets_a_scripted_player():
    t = league(pure=True, main_exploiters=1, league_exploiters=1, games_per_learner=64)
    players = pool_from_entry(t)
    # a later league: snapshots of every role join the pool
    players += [Player(id=f"main_agent-s{i}", role="main_agent", frozen=True, snapshot_of="main_agent-0")
                for i in range(3)]
    players += [Player(id="main_exploiter-s", role="main_exploiter", frozen=True, snapshot_of="main_exploiter-0")]
    t.pool = FakePool(players)
    for _ in range(20):
        t.payoff.update("main_agent-0", "main_exploiter-s", "loss")  # verification games too
    opponents = Counter()
    for _ in range(20):
        for game in t.match():
            ids = [p["id"] for p in game]
            assert not {"random", "minimax"} & set(ids)
            assert not any(is_scripted(p) for p in game)
            if "main_agent-0" in ids:
                opponents[next((i for i in ids if i != "main_agent-0"), "main_agent-0")] += 1
    assert opponents["main_agent-0"] > 0 and opponents["main_exploiter-s"] > 0  # self-play and verification
    assert sum(v for k, v in opponents.items() if k.startswith("main_agent-s")) > 0  # PFSP over snapshots


def test_pure_league_refuses_anchor_share():
    with pytest.raises(ValueError, match="anchor_share=0"):
        league(pure=True, anchor_share=0.5)


@pytest.mark.slow  # subprocesses: the example's warm-up, an epoch and a resumed one, twice
@pytest.mark.parametrize("flags", [["--branch-turns", "1", "--branch-samples", "2"],
                                   ["--branch-advantage", "moves", "--branch-samples", "1", "--branch-temperature",
                                    "0", "--branch-replies", "--move-loss", "cross_entropy",
                                    "--steps-per-generation", "2"]])
def test_tictactoe_league_example_pure_with_branch_credit(tmp_path, flags):
    """The example's pure league with branch credit (sampled-move values; every move valued after the
    best reply, greedy on) runs, reports the best-response verdicts, and resumes for another epoch."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    args = [sys.executable, str(root / "examples" / "tictactoe_league.py"), "--pure", "--credit", "branch", *flags,
            "--rounds", "1", "--games-per-learner", "8", "--exploiter-games", "2", "--hidden", "32", "--layers", "1",
            "--heads", "8", "--warmup-steps", "20", "--eval-games", "50", "--output-dir", str(tmp_path / "run")]

    def run(*more):
        out = subprocess.run(args + list(more), capture_output=True, text=True, timeout=600,
                             env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    out = run("--epochs", "1")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["credit"] == "branch"
    assert isinstance(summary["loses_to_best_response_as_x"], bool)
    assert isinstance(summary["loses_to_best_response_as_o"], bool)
    assert [row["epoch"] for row in summary["curve"]] == [0] and 0 <= summary["optimal_move_rate"] <= 1
    board = out.stdout.split("rank", 1)[1].strip().splitlines()[:-1]  # the leaderboard's rows
    assert board and not any(row.split()[1] in ("random", "minimax") for row in board)  # never in the pool
    assert (tmp_path / "run" / "checkpoint-0" / "COMPLETE").exists()
    resumed = json.loads(run("--epochs", "2", "--resume").stdout.strip().splitlines()[-1])
    assert [row["epoch"] for row in resumed["curve"]] == [1]  # epoch 0 came from the checkpoint
    assert (tmp_path / "run" / "checkpoint-1" / "COMPLETE").exists()
