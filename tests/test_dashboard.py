"""`autocurricula dashboard`: every panel's JSON against a real tiny league run, path safety,
live refresh, the bounded transcripts file, and (slow) the page rendered by headless Chromium."""

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from autocurricula import LeagueConfig, LeagueTrainer
from autocurricula.serve.dashboard import RunView, create_app
from autocurricula.views.transcripts import keep_last, pair_key, read_transcripts, update_transcripts, write_transcripts

from toy_games import digits, first_digit_policy

PER_PAIR = 2


@pytest.fixture(scope="module")
def run(tiny_model_path, tmp_path_factory):
    """A finished two-epoch league (learners, snapshots, resets, a scripted player) and its folder."""
    out = tmp_path_factory.mktemp("league-run")
    # an older run's transcripts in the folder: the new run's first round drops them
    (out / "transcripts.jsonl").write_text(json.dumps({"game_id": "stale", "players": ["main_agent-0", "x"]}) + "\n")
    scripted = {"id": "random-digit", "role": "random", "policy": first_digit_policy}
    t = LeagueTrainer(LeagueConfig(epochs=2, rounds=2,
                                   rules={"games_per_learner": 4, "snapshot_min_rounds": 1, "snapshot_max_rounds": 2},
                                   output_dir=str(out), progress=False, ratings={"bt_bootstrap": 10}, max_tokens=4,
                                   transcripts_per_pair=PER_PAIR, save_total_limit=None),
                      opponents=[scripted])
    t.train(str(tiny_model_path), digits)
    t.engine.close()
    return t, out


@pytest.fixture(scope="module")
def client(run):
    return TestClient(create_app(run[1]))


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_leaderboard_is_the_trainers_with_intervals(run, client):
    t, _ = run
    got = client.get("/api/leaderboard").json()
    want = t.leaderboard.to_dicts()  # the same replay of the same games, same bootstrap seed
    assert [r["id"] for r in got["rows"]] == [r["id"] for r in want]
    for g, w in zip(got["rows"], want):
        assert g["elo"] == pytest.approx(w["elo"]) and g["games"] == w["games"]
        for k in ("bt", "bt_low", "bt_high"):
            assert g[k] == pytest.approx(w[k]) if w[k] is not None else g[k] is None
    rated = [r for r in got["rows"] if r["bt"] is not None]
    assert rated and all(r["bt_low"] <= r["bt"] <= r["bt_high"] for r in rated)
    assert got["ci"] == 0.95 and got["bootstrap"] == 10
    assert next(r for r in got["rows"] if r["id"] == "random-digit")["scripted"] is True
    # the two mixtures: over the players with an adapter (to deploy) and over every player
    for g, w in zip(got["rows"], want):
        assert g["deploy"] == pytest.approx(w["deploy"]) and g["nash"] == pytest.approx(w["nash"])
    assert sum(r["deploy"] for r in got["rows"]) == pytest.approx(1.0)
    assert next(r for r in got["rows"] if r["id"] == "random-digit")["deploy"] == 0.0
    games = [r["games"] for r in got["rows"]]
    assert games == sorted(games, key=lambda g: g == 0, reverse=False)  # the unrated (no games) last


def test_learning_curves_come_from_the_metrics(run, client):
    _, out = run
    panels = {p["title"]: p["series"] for p in client.get("/api/curves").json()["panels"]}
    metrics = lines(out / "metrics.jsonl")
    assert {"reward", "loss"} <= set(panels)
    assert panels["reward"]["rollout/reward_mean"] == [[m["step"], m["rollout/reward_mean"]] for m in metrics
                                                       if "rollout/reward_mean" in m]
    logged = {k for m in metrics for k in m}
    for title, series in panels.items():
        assert series and set(series) <= logged, title
    want = {k for k in logged if k.startswith(("eval/", "train/skipped_")) or k in ("train/loss", "train/kl")}
    assert want <= {k for series in panels.values() for k in series}


def test_reward_and_win_rate_are_logged_and_drawn_per_role(run, client):
    """Every learner's role has its reward and win-rate series; a role of several learners (two league
    exploiters) has one per player too, and the page's filter knows every role."""
    t, out = run
    metrics = lines(out / "metrics.jsonl")
    learners = {p["id"]: p["role"] for p in t.players if not p["frozen"] and "policy" not in p}
    several = {r for r in learners.values() if list(learners.values()).count(r) > 1}
    assert several == {"league_exploiter"}
    rounds = [m for m in metrics if "rollout/games" in m]
    for m in rounds:
        for role in set(learners.values()):
            assert -1.0 <= m[f"reward/role/{role}"] <= 1.0 and 0.0 <= m[f"win_rate/role/{role}"] <= 1.0
        assert {k.split("/", 2)[2] for k in m if k.startswith("reward/player/")} == \
            {pid for pid, r in learners.items() if r in several}
    curves = client.get("/api/curves").json()
    panels = {p["title"]: p for p in curves["panels"]}
    assert set(curves["roles"]) == set(learners.values())
    reward = panels["reward"]
    for role in set(learners.values()):
        assert reward["series"][f"reward/role/{role}"] == [[m["step"], m[f"reward/role/{role}"]] for m in rounds]
        assert reward["info"][f"reward/role/{role}"] == {"label": role, "role": role, "level": "role"}
        assert panels["win rate"]["info"][f"win_rate/role/{role}"]["level"] == "role"
    assert reward["info"]["rollout/reward_mean"] == {"label": "all learners", "role": None, "level": "league"}
    assert reward["info"]["reward/player/league_exploiter-1"] == {"label": "league_exploiter-1",
                                                                  "role": "league_exploiter", "level": "player"}
    # x in rounds (the trainer's step) or in games played: each round's games, from the history
    history = lines(out / "match_history.jsonl")
    per_round = [sum(1 for g in history if (g["epoch"], g["round"]) == (e, r)) for e in range(2) for r in range(2)]
    assert curves["games"] == [[k + 1, sum(per_round[:k + 1])] for k in range(4)]
    # the run's KL is 0 (beta=0) and no update was skipped: those panels are one line each
    assert panels["KL to the base"]["flat"] == "KL to the base: 0 throughout (rounds 1–4)"
    assert panels["skipped updates"]["flat"] == "skipped updates: 0 throughout (rounds 1–4)"
    assert reward["flat"] is None


def test_learning_curves_take_eval_figures_and_exploitability(tmp_path):
    rows = [{"step": 1, "epoch": 0, "eval/vs_random": 0.5, "eval/loses_to_best_response_as_x": True,
             "eval/exploitability": 0.4, "train/entropy": 1.2, "rating/elo/a": 1000.0},
            {"step": 2, "epoch": 0, "eval/vs_random": 0.7, "eval/loses_to_best_response_as_x": False,
             "eval/exploitability": 0.3, "train/entropy": 1.1, "train/skipped_nonfinite": 0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves = RunView(tmp_path).curves()
    panels = {p["title"]: p["series"] for p in curves["panels"]}
    assert panels == {"evaluation": {"eval/vs_random": [[1, 0.5], [2, 0.7]],
                                     "eval/loses_to_best_response_as_x": [[1, 1.0], [2, 0.0]]},
                      "exploitability": {"eval/exploitability": [[1, 0.4], [2, 0.3]]},
                      "entropy": {"train/entropy": [[1, 1.2], [2, 1.1]]},
                      "skipped updates": {"train/skipped_nonfinite": [[2, 0.0]]}}
    flat = {p["title"]: p["flat"] for p in curves["panels"]}
    assert flat == {"evaluation": None, "exploitability": None, "entropy": None,
                    "skipped updates": "skipped updates: 0 (round 2)"}
    assert curves["games"] == [] and curves["roles"] == []  # no history, no roles


def test_loss_per_role_and_flat_panels_from_a_metrics_file(tmp_path):
    """What the page gets once the update reports its loss per player (loss/role/*, loss/player/*),
    and panels whose series each hold one value all along, written as one line."""
    rows = [{"step": s, "epoch": 0, "train/loss": 0.5 - s / 10, "loss/role/main": 0.2,
             "loss/role/exploiter": 0.3 - s / 10, "loss/player/exp-0": 0.1, "loss/player/exp-1": 0.2 - s / 10,
             "train/kl": 0.0, "train/entropy": 1.5, "eval/vs_random": 0.25, "eval/vs_minimax": 0.0,
             "train/skipped_nonfinite": 0} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    history = [{"game_id": f"g{r}-{k}", "epoch": 0, "round": r, "players": ["main-0", "exp-0"],
                "roles": ["main", "exploiter"], "rewards": [1, -1]} for r in range(3) for k in range(r + 1)]
    history.append({"game_id": "x", "epoch": 0, "round": 1, "players": ["exp-1", "main-0"],
                    "roles": ["exploiter", "main"], "rewards": [0, 0]})
    (tmp_path / "match_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    curves = RunView(tmp_path).curves()
    panels = {p["title"]: p for p in curves["panels"]}
    loss = panels["loss"]
    assert set(loss["series"]) == {"train/loss", "loss/role/main", "loss/role/exploiter", "loss/player/exp-0",
                                   "loss/player/exp-1"} and loss["flat"] is None
    assert loss["info"]["train/loss"]["level"] == "league" and loss["info"]["loss/role/main"]["role"] == "main"
    assert loss["info"]["loss/player/exp-1"] == {"label": "exp-1", "role": "exploiter", "level": "player"}
    assert curves["roles"] == ["main", "exploiter"]
    assert panels["KL to the base"]["flat"] == "KL to the base: 0 throughout (rounds 1–3)"
    assert panels["entropy"]["flat"] == "entropy: 1.5 throughout (rounds 1–3)"
    assert panels["evaluation"]["flat"] == "evaluation: vs_random 0.25, vs_minimax 0 throughout (rounds 1–3)"
    assert curves["games"] == [[1, 1], [2, 4], [3, 7]]  # rounds of 1, 2 + 1 and 3 games


def test_games_played_needs_the_rounds_of_an_epoch(tmp_path):
    """Past the first epoch a round's number needs the rounds per epoch: from the checkpoint's config,
    else from a finished epoch of the history; without either the page offers rounds only."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "epoch": (s - 1) // 2, "train/kl": 0.0})
                                                    + "\n" for s in (1, 2, 3, 4)))
    games = [{"game_id": f"g{e}{r}", "epoch": e, "round": r, "players": ["a", "b"], "rewards": [1, 0]}
             for e in range(2) for r in range(2)]
    (tmp_path / "match_history.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    assert RunView(tmp_path).curves()["games"] == [[1, 1], [2, 2], [3, 3], [4, 4]]  # epoch 0 had 2 rounds
    (tmp_path / "match_history.jsonl").write_text(json.dumps({**games[2], "round": 0}) + "\n")
    assert RunView(tmp_path).curves()["games"] == []  # only epoch 1: how many rounds came before is unknown
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"config": {"rounds": 2}}))
    (ckpt / "COMPLETE").write_text("")
    assert RunView(tmp_path).curves()["games"] == [[1, 0], [2, 0], [3, 1], [4, 1]]


def test_elo_series_come_from_the_metrics(run, client):
    t, out = run
    series = client.get("/api/elo").json()["series"]
    metrics = lines(out / "metrics.jsonl")
    assert len(metrics) == 4  # 2 epochs x 2 rounds, logged every round
    assert set(series) == {p["id"] for p in t.players if any(f"rating/elo/{p['id']}" in m for m in metrics)}
    for pid, points in series.items():
        logged = [(m["step"], m[f"rating/elo/{pid}"]) for m in metrics if f"rating/elo/{pid}" in m]
        assert [tuple(x) for x in points] == logged
    first = t.players[0]["id"]  # in the league from the first round to the last
    assert len(series[first]) == 4 and series[first][-1][1] == pytest.approx(t.standings.elo.rating(first))
    elo = client.get("/api/elo").json()
    assert elo["roles"] == {p["id"]: p["role"] for p in t.players}
    assert set(elo["current"]) == {p["id"] for p in t.players if not p["frozen"] and "policy" not in p}


def test_payoff_is_the_trainers_win_rates(run, client):
    t, _ = run
    p = client.get("/api/payoff").json()
    ids = p["players"]
    assert set(ids) <= {q["id"] for q in t.players} and len(ids) >= 4
    met = 0
    for i, a in enumerate(ids):
        for j, b in enumerate(ids):
            v = p["win_rate"][i][j]
            if t.payoff.games(a, b) > 0:
                met += 1
                assert 0.0 <= v <= 1.0 and v == pytest.approx(t.payoff.win_rate(a, b))
                assert p["games"][i][j] == pytest.approx(t.payoff.games(a, b))
            else:
                assert v is None  # never met: no colour, not a fake 0.5
    assert met >= 4
    # ordered by role (in order of entry), then Elo, best first
    roles = list(dict.fromkeys(p["role"] for p in t.players))
    assert p["roles"] == [next(q["role"] for q in t.players if q["id"] == i) for i in ids]
    keys = [(roles.index(r), -t.standings.elo.rating(i)) for i, r in zip(ids, p["roles"])]
    assert keys == sorted(keys)


def test_lineage_has_parents_snapshots_and_resets(run, client):
    t, out = run
    lin = client.get("/api/lineage").json()
    registry = json.loads((sorted(out.glob("checkpoint-*"))[-1] / "players.json").read_text())
    assert [n["id"] for n in lin["nodes"]] == [p["id"] for p in registry] == [p["id"] for p in t.players]
    edges = {(e["from"], e["to"]): e["kind"] for e in lin["edges"]}
    assert edges == {(p["parent"], p["id"]): "snapshot" if p.get("snapshot_of") else "inherit"
                     for p in registry if p.get("parent")}
    assert "snapshot" in edges.values()
    nodes = {n["id"]: n for n in lin["nodes"]}
    assert all(nodes[b]["frozen"] and nodes[b]["snapshot_of"] == a for (a, b), k in edges.items() if k == "snapshot")
    assert nodes["random-digit"]["scripted"] == "first_digit_policy"
    assert {pid: n["resets"] for pid, n in nodes.items()} == {p["id"]: p.get("resets", 0) for p in t.players}


def test_transcripts_hold_the_last_games_of_each_pair_as_text(run, client):
    t, out = run
    history = {g["game_id"]: g for g in lines(out / "match_history.jsonl")}
    file_entries = read_transcripts(out / "transcripts.jsonl")  # written by the trainer's hook
    assert file_entries and "stale" not in {e["game_id"] for e in file_entries}
    pairs = client.get("/api/transcripts").json()["pairs"]
    per_pair = {}
    for g in history.values():
        per_pair.setdefault(pair_key(g["players"]), []).append(g["game_id"])
    assert {p["pair"] for p in pairs} == set(per_pair)
    for p in pairs:
        ids = [g["game_id"] for g in p["games"]]
        assert ids == per_pair[p["pair"]][-PER_PAIR:][::-1]  # the last N of the pair, newest first
        for g in p["games"]:
            assert g["players"] == history[g["game_id"]]["players"] and g["rewards"] == history[g["game_id"]]["rewards"]
            learners = [pid for pid in g["players"] if pid != "random-digit" and
                        not next(q for q in t.players if q["id"] == pid)["frozen"]]
            assert sorted(x["player"] for x in g["turns"]) == sorted(learners)  # each learner's recorded turn
            assert all(x["prompt"] == "Say a digit:" and isinstance(x["completion"], str) for x in g["turns"])
    one = pairs[0]["pair"]
    assert [p["pair"] for p in client.get("/api/transcripts", params={"pair": one}).json()["pairs"]] == [one]


def test_adapters_link_to_the_checkpoints_peft_folders(run, client):
    t, out = run
    ad = client.get("/api/adapters").json()
    latest = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    assert ad["checkpoint"] == latest.name
    assert {a["id"] for a in ad["adapters"]} == {p["id"] for p in t.players if "policy" not in p}
    a = ad["adapters"][0]
    assert {f["name"] for f in a["files"]} == {"adapter_config.json", "adapter_model.safetensors"}
    for f in a["files"]:
        got = client.get(f["url"])
        assert got.status_code == 200 and got.content == (latest / "adapters" / a["id"] / f["name"]).read_bytes()
    z = client.get(a["zip"])
    assert z.status_code == 200 and z.headers["content-type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(z.content)).namelist()
    assert sorted(names) == [f"{a['id']}/adapter_config.json", f"{a['id']}/adapter_model.safetensors"]
    assert json.loads(client.get(a["files"][0]["url"]).text)["peft_type"] == "LORA"
    assert client.get("/adapters/nobody.zip").status_code == 404


def test_page_is_self_contained_and_inlines_every_panel(run, client):
    t, _ = run
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    for ref in ("http://", "https://", "<link", "<script src", "@import", "url("):
        assert ref not in html  # offline: no CDN, no external fonts
    blob = html.split("const DATA = ", 1)[1].split(";\nconst POLL_MS", 1)[0]
    data = json.loads(blob)
    assert set(data) == {"summary", "leaderboard", "curves", "elo", "payoff", "lineage", "transcripts", "adapters"}
    assert [r["id"] for r in data["leaderboard"]["rows"]] == [r["id"] for r in t.leaderboard.rows]
    assert "setInterval(poll" in html and "api/summary" in html


def test_inlined_data_cannot_close_the_script_tag(tmp_path):
    (tmp_path / "match_history.jsonl").write_text(json.dumps(
        {"game_id": "g", "epoch": 0, "players": ["</script><b>x", "b"], "roles": ["r", "r"], "rewards": [1, 0]}) + "\n")
    html = TestClient(create_app(tmp_path)).get("/").text
    assert "</script><b>x" not in html and html.count("</script>") == 1


@pytest.mark.parametrize("url", ["/files/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/files/..%2f..%2fsecret.txt",
                                 "/files/%2fetc%2fpasswd", "/files/link/secret.txt", "/files/escape.txt",
                                 "/files/inside/..", "/files/", "/adapters/..%2f..%2fsecret.zip"])
def test_nothing_outside_the_output_dir_is_served(tmp_path, url):
    root = tmp_path / "run"
    (root / "inside").mkdir(parents=True)
    (root / "inside" / "ok.txt").write_text("fine")
    (tmp_path / "secret.txt").write_text("SECRET")
    (root / "link").symlink_to(tmp_path, target_is_directory=True)  # a link out of the folder
    (root / "escape.txt").symlink_to(tmp_path / "secret.txt")
    c = TestClient(create_app(root))
    assert c.get("/files/inside/ok.txt").text == "fine"
    r = c.get(url)
    assert r.status_code == 404 and b"SECRET" not in r.content and b"root:" not in r.content
    view = RunView(root)
    outside = ("../secret.txt", str(tmp_path / "secret.txt"), "link/secret.txt", "escape.txt", "inside/../../secret.txt")
    for bad in outside:
        assert view.file(bad) is None


def test_files_are_never_served_as_html(tmp_path):
    (tmp_path / "page.html").write_text("<script>alert(1)</script>")
    r = TestClient(create_app(tmp_path)).get("/files/page.html")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert "attachment" in r.headers["content-disposition"] and r.headers["x-content-type-options"] == "nosniff"


def test_panels_follow_a_run_that_is_still_writing(run, tmp_path):
    _, out = run
    live = tmp_path / "live"
    shutil.copytree(out, live)
    c = TestClient(create_app(live))
    before = c.get("/api/summary").json()
    rows = {r["id"]: r for r in c.get("/api/leaderboard").json()["rows"]}
    a, b = sorted(rows)[:2]
    with (live / "match_history.jsonl").open("a") as fh:
        fh.write(json.dumps({"game_id": "e9-r0-m0-0", "epoch": 9, "round": 0, "players": [a, "newcomer-0"],
                             "roles": ["x", "newcomer"], "rewards": [1.0, -1.0]}) + "\n")
        fh.write('{"game_id": "e9-r0-m1-0", "players": [')  # a writer mid-line
    after = c.get("/api/summary").json()
    assert after["fingerprint"] != before["fingerprint"] and after["games"] == before["games"] + 1
    rows2 = {r["id"]: r for r in c.get("/api/leaderboard").json()["rows"]}
    assert rows2[a]["games"] == rows[a]["games"] + 1 and rows2[a]["elo"] > rows[a]["elo"]
    assert rows2["newcomer-0"]["role"] == "newcomer" and rows2["newcomer-0"]["games"] == 1
    node = next(n for n in c.get("/api/lineage").json()["nodes"] if n["id"] == "newcomer-0")
    assert node["unsaved"] is True
    payoff = c.get("/api/payoff").json()
    i, j = payoff["players"].index(a), payoff["players"].index("newcomer-0")
    assert payoff["win_rate"][i][j] == 1.0 and payoff["win_rate"][j][i] == 0.0
    assert c.get("/api/summary").json()["fingerprint"] == after["fingerprint"]  # idle: nothing changes


def test_an_empty_folder_renders_and_a_missing_one_names_the_fix(tmp_path):
    c = TestClient(create_app(tmp_path))
    for name in ("summary", "leaderboard", "elo", "payoff", "lineage", "transcripts", "adapters"):
        assert c.get(f"/api/{name}").status_code == 200
    assert c.get("/api/leaderboard").json()["rows"] == [] and c.get("/").status_code == 200
    from autocurricula.cli import main

    with pytest.raises(SystemExit, match="output_dir of a training run"):
        main(["dashboard", str(tmp_path / "nope")])


# ---------------------------------------------------------------------- the transcripts file
def entry(gid, players):
    return {"game_id": gid, "players": players, "rewards": [0.0] * len(players), "turns": []}


def test_keep_last_bounds_each_pair_and_replaces_replayed_games():
    games = [entry(f"g{k}", ["a", "b"] if k % 2 else ["b", "a"]) for k in range(7)] + [entry("h0", ["a", "c"])]
    kept = keep_last(games, 3)
    assert [e["game_id"] for e in kept] == ["g4", "g5", "g6", "h0"]  # seat order does not split a pair
    replay = keep_last(kept + [dict(entry("g4", ["a", "b"]), rewards=[1.0, -1.0])], 3)
    assert [e["game_id"] for e in replay] == ["g5", "g6", "h0", "g4"] and replay[-1]["rewards"] == [1.0, -1.0]
    assert keep_last(games, 0) == []


def test_update_transcripts_rewrites_atomically_and_stays_bounded(tmp_path):
    path = tmp_path / "transcripts.jsonl"
    for k in range(20):
        update_transcripts(path, [entry(f"g{k}", ["a", "b"]), entry(f"h{k}", ["a", "c"])], 2)
    assert [e["game_id"] for e in read_transcripts(path)] == ["g18", "h18", "g19", "h19"]
    assert not [p for p in tmp_path.iterdir() if p.name != "transcripts.jsonl"]  # no temporary left over
    update_transcripts(path, [entry("x", ["a", "b"])], 2, fresh=True)  # a new run: the old games go
    assert [e["game_id"] for e in read_transcripts(path)] == ["x"]


def fake_trainer(tmp_path, per_pair, step=0):
    turn = SimpleNamespace(player="a", seat=0, level=0, prompt_ids=[1, 2], completion_ids=[3] * 5000, target=False)
    records = [SimpleNamespace(game_id=f"g{k}", players=[{"id": "a", "role": "r"}, {"id": "b", "role": "r"}],
                               rewards=[1.0, -1.0], turns=[turn], error=None) for k in range(5)]
    records.append(SimpleNamespace(game_id="bad", players=records[0].players, rewards=[], turns=[], error="boom"))
    decoded = []

    def decode(ids):
        decoded.append(list(ids))
        return "".join(chr(ord("a") + i % 26) for i in ids)

    t = SimpleNamespace(config=SimpleNamespace(transcripts_per_pair=per_pair, output_dir=str(tmp_path)),
                        engine=SimpleNamespace(decode=decode), current_epoch=1, current_round=2, step=step)
    return t, records, decoded


def test_write_transcripts_decodes_only_the_games_it_keeps(tmp_path):
    t, records, decoded = fake_trainer(tmp_path, 2)
    write_transcripts(tmp_path / "transcripts.jsonl", 2, records, t.engine.decode, 1, 2, fresh=True)
    got = read_transcripts(tmp_path / "transcripts.jsonl")
    assert [e["game_id"] for e in got] == ["g3", "g4"] and len(decoded) == 4  # 2 games x (prompt, completion)
    assert got[0]["turns"][0]["prompt"] == "bc" and got[0]["epoch"] == 1 and got[0]["round"] == 2
    assert len(got[0]["turns"][0]["completion"]) < 2100  # a runaway completion is clipped
    t0, records0, _ = fake_trainer(tmp_path / "off", 0)
    (tmp_path / "off").mkdir()
    write_transcripts(tmp_path / "off" / "transcripts.jsonl", 0, records0, t0.engine.decode, 1, 2, fresh=True)
    assert not (tmp_path / "off" / "transcripts.jsonl").exists()


def test_transcripts_per_pair_must_be_a_count():
    with pytest.raises(ValueError, match="transcripts_per_pair must be an integer >= 0"):
        LeagueConfig(transcripts_per_pair=-1)


# ---------------------------------------------------------------------- the page in a browser
def curve_titles(out):
    return [p["title"] for p in RunView(out).curves()["panels"]]


CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000"]


def chromium(args, tmp_path):
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          timeout=120, env={**os.environ, "HOME": str(tmp_path)})


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium at /usr/bin/chromium")
def test_headless_chromium_renders_every_panel(run, tmp_path):
    t, out = run
    shot = tmp_path / "dashboard.png"
    with socket.socket() as sock:  # a free port for the command line's server
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "autocurricula.cli", "dashboard", str(out), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "the dashboard command did not start"
            try:
                if httpx.get(url + "/api/summary", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        dom = chromium(["--window-size=1400,1000", "--dump-dom", url + "/"], tmp_path).stdout.decode()
        done = chromium([f"--screenshot={shot}", "--window-size=1400,1000", url + "/"], tmp_path)
        role_dom = chromium(["--window-size=1400,1000", "--dump-dom", url + "/#role=league_exploiter&x=games"],
                            tmp_path)
    finally:
        server.terminate()
        server.wait(10)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # the script ran: every panel holds what it draws (the inlined data sits after </main>)
    shown = dom.split("<main>", 1)[1].split("</main>", 1)[0]
    for pid in (p["id"] for p in t.players):
        assert f">{pid}<" in shown
    assert shown.count("<polyline") >= 4 and shown.count("<rect") >= 16 and "Say a digit:" in shown
    assert 'href="/adapters/main_agent-0.zip"' in shown and "BT 95% CI" in shown
    assert 'class="empty"' not in shown
    # the learning curves: a chart and a legend per panel that moves, one line per flat panel,
    # every x axis named; reward per role, and no player's series until their role is chosen
    curves = shown.split('id="curves"', 1)[1].split("</section>", 1)[0]
    data = RunView(out).curves()
    drawn = [p for p in data["panels"] if not p["flat"]]
    flat = [p["flat"] for p in data["panels"] if p["flat"]]
    assert curves.count('<div class="curve">') == len(drawn) >= 2 and curves.count("<svg") == len(drawn)
    for p in drawn:
        assert f"<h3>{p['title']}</h3>" in curves
    assert curves.count('<div class="flat">') == len(flat) >= 2
    assert "KL to the base: 0 throughout (rounds 1–4)" in flat and f'<div class="flat">{flat[0]}</div>' in curves
    assert curves.count('class="xlabel"') == len(drawn) and ">round</text>" in curves
    reward = curves.split("<h3>reward</h3>", 1)[1].split('<div class="curve">', 1)[0]
    reward_legend = reward.split('class="legend"', 1)[1]
    for role in data["roles"]:
        assert f"</span>{role}</span>" in reward_legend
    assert "</span>all learners</span>" in reward_legend and "league_exploiter-1" not in reward_legend
    assert reward.count("<polyline") == 1 + len(data["roles"])
    roles = shown.split('id="curve-role"', 1)[1].split("</select>", 1)[0]
    assert all(f'<option value="{role}">' in roles for role in data["roles"])
    assert '<option value="games">games played</option>' in shown
    # a link that picks a role of two learners and games played on x: the role's line and each player's
    chosen = role_dom.stdout.decode().split('id="curves"', 1)[1].split("</section>", 1)[0]
    chosen_reward = chosen.split("<h3>reward</h3>", 1)[1].split('<div class="curve">', 1)[0]
    legend_reward = chosen_reward.split('class="legend"', 1)[1]
    for name in ("league_exploiter", "league_exploiter-0", "league_exploiter-1", "all learners"):
        assert f"</span>{name}</span>" in legend_reward
    assert "main_agent" not in legend_reward and '<span class="item dim">' in legend_reward  # the league's line thin
    assert ">games played</text>" in chosen and ">round</text>" not in chosen.split('id="flat-curves"', 1)[0]
    # Elo: a legend naming every series, the current players drawn thick, a filter by role
    elo = shown.split('id="elo"', 1)[1].split("</section>", 1)[0]
    legend = elo.split('class="legend"', 1)[1]
    series = RunView(out).elo()
    for pid in series["series"]:
        assert f"</span>{pid}</span>" in legend
    assert elo.count('stroke-width="2.4"') == len(series["current"]) >= 1
    options = shown.split('id="elo-role"', 1)[1].split("</select>", 1)[0]
    assert all(f'<option value="{role}">' in options for role in {series["roles"][i] for i in series["series"]})
    # payoff: a number in every cell of two players that met
    payoff = shown.split('id="payoff"', 1)[1].split("</section>", 1)[0]
    met = sum(v is not None for row in RunView(out).payoff()["win_rate"] for v in row)
    assert payoff.count('pointer-events="none">') == met
    # the two mixtures, labelled; and no panel wider than its box at 1400 px
    assert ">deploy</th>" in shown and ">nash (all)</th>" in shown and "the mixture to deploy" in shown
    assert '<body data-clipped="">' in dom, dom.split("<body", 1)[1][:80]
    from PIL import Image

    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 1000)
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 200  # text, heatmap and lines, not a blank or error page


def test_dashboard_replays_duplicate_pairs_as_the_trainer_records_them(tmp_path):
    """Standings.record takes a duplicate pair as one relative-payoff sample and keeps its deal in the
    history; the dashboard's replay of that history gives the same relative payoffs."""
    from autocurricula.loop.config import RatingConfig
    from autocurricula.records import GameRecord
    from autocurricula.loop.standings import Standings

    standings = Standings(RatingConfig(bt_bootstrap=0), tmp_path, 0)
    rounds = [[("a", "c", [1, -1], None), ("a", "b", [2, -2], "d0"), ("b", "a", [1, -1], "d0")],
              [("c", "a", [0.5, -0.5], "d1"), ("a", "c", [-1, 1], "d1"), ("b", "c", [1, -1], "d2"),
               ("c", "b", [1, -1], "d2")]]
    for rnd, games in enumerate(rounds):
        records = [GameRecord(f"g{rnd}-{i}", [{"id": x}, {"id": y}], rewards=r, turns=[], deal=deal)
                   for i, (x, y, r, deal) in enumerate(games)]
        standings.record(records, epoch=0, round_=rnd, step=rnd)
    assert standings.relative.stats("a", "b")[2] == pytest.approx(1.0)  # one pair, one sample
    assert [row.get("deal") for row in lines(tmp_path / "match_history.jsonl")][:3] == [None, "d0", "d0"]
    history = standings.match_history()  # a Dataset takes its columns from its first row, which has no deal
    rows = history if isinstance(history, list) else history.to_list()
    assert [r["deal"] for r in rows][:3] == [None, "d0", "d0"]
    _, _, relative, _ = RunView(tmp_path)._replay()
    assert relative.state_dict() == standings.relative.state_dict()
