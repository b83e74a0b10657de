"""The dashboard serves only its run (no symbolic link followed, zip included) and its page escapes
every value that comes from the run's files (issue 68, items 3 and 4)."""

import io
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autocurricula.serve.dashboard import RunView, create_app
from autocurricula.serve.dashboard_page import render_page

NODE = shutil.which("node")
PAYLOAD = "X\"' onmouseover=\"alert(1)\"><evil-tag>&amp;"


def checkpoint(root: Path, tag: int = 0) -> Path:
    """A complete checkpoint with one player's adapter folder."""
    ckpt = root / f"checkpoint-{tag}"
    (ckpt / "adapters" / "p0").mkdir(parents=True)
    (ckpt / "adapters" / "p0" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (ckpt / "adapters" / "p0" / "adapter_model.safetensors").write_bytes(b"weights")
    (ckpt / "players.json").write_text(json.dumps([{"id": "p0", "role": "main"}]))
    (ckpt / "COMPLETE").write_text("ok\n")
    return ckpt


def members(body: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def test_the_adapter_zip_leaves_out_links_as_files_does(tmp_path):
    root, secret = tmp_path / "run", tmp_path / "secret.txt"
    secret.write_text("SECRET")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "adapter_config.json").write_text("SECRET")
    folder = checkpoint(root) / "adapters" / "p0"
    (folder / "stolen.txt").symlink_to(secret)  # a link out of the run
    (folder / "inner.txt").symlink_to(folder / "adapter_config.json")  # a link that stays inside: refused too
    (folder.parent / "p1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # a linked player folder
    c = TestClient(create_app(root))

    z = c.get("/adapters/p0.zip")
    assert z.status_code == 200
    assert members(z.content) == {"p0/adapter_config.json": b'{"peft_type": "LORA"}',
                                  "p0/adapter_model.safetensors": b"weights"}
    assert c.get("/adapters/p1.zip").status_code == 404
    listed = c.get("/api/adapters").json()["adapters"]
    assert [a["id"] for a in listed] == ["p0"]
    assert sorted(f["name"] for f in listed[0]["files"]) == ["adapter_config.json", "adapter_model.safetensors"]
    for rel in ("checkpoint-0/adapters/p0/stolen.txt", "checkpoint-0/adapters/p0/inner.txt",
                "checkpoint-0/adapters/p1/adapter_config.json"):
        assert c.get("/files/" + rel).status_code == 404, rel
    assert c.get("/files/checkpoint-0/adapters/p0/adapter_config.json").json() == {"peft_type": "LORA"}


def test_a_linked_checkpoint_or_run_file_is_not_read(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "outside"
    root.mkdir()
    checkpoint(outside, 5)  # a complete checkpoint elsewhere, linked in as the latest
    (root / "checkpoint-5").symlink_to(outside / "checkpoint-5", target_is_directory=True)
    (outside / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 0.5, "secret": "SECRET"}) + "\n")
    (root / "metrics.jsonl").symlink_to(outside / "metrics.jsonl")
    view = RunView(root)
    assert view.checkpoint() is None and view.adapters()["adapters"] == []
    assert view.curves()["panels"] == [] and view.summary()["step"] is None
    assert TestClient(create_app(root)).get("/adapters/p0.zip").status_code == 404


def test_a_file_swapped_for_a_link_after_the_check_is_not_followed(tmp_path, monkeypatch):
    root = tmp_path / "run"
    folder = checkpoint(root) / "adapters" / "p0"
    (tmp_path / "secret.txt").write_text("SECRET")
    view = RunView(root)
    checked = view.file("checkpoint-0/adapters/p0/adapter_config.json")
    assert checked is not None
    # the race: the path passed the check, then became a link before it was opened
    (folder / "adapter_config.json").unlink()
    (folder / "adapter_config.json").symlink_to(tmp_path / "secret.txt")
    monkeypatch.setattr(RunView, "file", lambda self, rel: checked)
    r = TestClient(create_app(root)).get("/files/checkpoint-0/adapters/p0/adapter_config.json")
    assert r.status_code == 404 and b"SECRET" not in r.content
    monkeypatch.setattr(RunView, "_files_of", lambda self, d: sorted(d.iterdir()))  # listed before the swap
    z = TestClient(create_app(root)).get("/adapters/p0.zip")
    assert z.status_code == 200 and members(z.content) == {"p0/adapter_model.safetensors": b"weights"}


def test_a_growing_log_is_served_at_its_size_when_opened(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    r = TestClient(create_app(tmp_path)).get("/files/metrics.jsonl")
    assert r.status_code == 200 and r.text == '{"step": 1}\n'
    assert r.headers["content-length"] == str(len(r.content)) and r.headers["x-content-type-options"] == "nosniff"


def test_curves_and_elo_keep_only_rows_with_a_numeric_step(tmp_path):
    rows = [{"step": "<img src=x onerror=alert(1)>", "train/loss": 1.0, "rating/elo/a": 1000},
            {"step": True, "train/loss": 1.0}, {"step": float("nan"), "train/loss": 1.0},
            {"step": 2, "train/loss": 0.5, "rating/elo/a": 1010, "rating/elo/b": "high"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    view = RunView(tmp_path)
    assert [{k: p[k] for k in ("title", "series")} for p in view.curves()["panels"]] == \
        [{"title": "loss", "series": {"train/loss": [[2, 0.5]]}}]
    assert view.elo()["series"] == {"a": [[2, 1010]]}


# ---------------------------------------------------------------------- the page's script in node
HARNESS = r"""
const elements = Object.create(null);
function element(id) {
  if (!(id in elements)) elements[id] = {id, innerHTML: "", textContent: "", value: "", checked: true, className: "",
    clientWidth: 560, scrollWidth: 0, dataset: {}, addEventListener() {}, querySelector() { return null; }};
  return elements[id];
}
globalThis.document = {getElementById: element, querySelectorAll: () => [], body: {dataset: {}}};
globalThis.fetch = async () => { throw new Error("offline"); };
globalThis.setInterval = () => 0;
globalThis.location = {hash: process.argv[3] || "", pathname: "/", search: ""};
globalThis.history = {replaceState() {}};
const script = require("fs").readFileSync(process.argv[2], "utf8");
(0, eval)(script);
const out = {};
for (const [id, e] of Object.entries(elements)) out[id] = e.innerHTML;  // textContent is never parsed as HTML
process.stdout.write(JSON.stringify(out));
"""


def rendered(data: dict, tmp_path: Path, hash: str = "") -> dict[str, str]:
    """The HTML the page's script writes into each element for ``data``, run in node with a stub DOM
    (``hash``: the page's ``location.hash``, which may choose the filters)."""
    html = render_page(data)
    script = html.split("<script>", 1)[1].rsplit("</script>", 1)[0]
    (tmp_path / "page.js").write_text(script)
    (tmp_path / "harness.js").write_text(HARNESS)
    done = subprocess.run([NODE, str(tmp_path / "harness.js"), str(tmp_path / "page.js"), hash], capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


def hostile(p: str) -> dict:
    """Every panel, every value that comes from a file set to ``p`` (numbers too)."""
    return {
        "summary": {"output_dir": "/runs/" + p, "fingerprint": p, "checkpoint": p, "games": p, "players": p,
                    "step": p, "epoch": p, "updated": None, "now": 0},
        "leaderboard": {"rows": [{"rank": p, "id": p, "role": p, "epoch": p, "frozen": True, "elo": p, "bt": p,
                                  "bt_low": p, "bt_high": p, "games": p, "deploy": p, "nash": p, "scripted": False}],
                        "ci": 0.95, "bootstrap": p},
        "curves": {"panels": [{"title": p, "series": {"eval/" + p: [[p, 1.0], [2, 0.5], [3, p]]}},
                              {"title": p, "series": {"reward/role/" + p: [[1, 0.5], [2, p]],
                                                      "reward/player/" + p: [[1, 0.5], [2, 1.0]]},
                               "info": {"reward/role/" + p: {"label": p, "role": p, "level": "role"},
                                        "reward/player/" + p: {"label": p, "role": p, "level": "player"}},
                               "flat": None},
                              {"title": p, "series": {"train/kl": [[1, 0.0]]}, "info": {}, "flat": p}],
                   "roles": [p], "games": [[1, p], [2, 5]]},
        "elo": {"series": {p: [[p, 1000], [1, 1010], [2, p]]}, "roles": {p: p}, "current": [p]},
        "payoff": {"players": [p, "b"], "roles": [p, "r"], "win_rate": [[None, p], [0.5, None]],
                   "games": [[0, p], [1, 0]], "decay": p},
        "lineage": {"nodes": [{"id": p, "role": p, "epoch": p, "parent": None, "frozen": True, "snapshot_of": p,
                               "version": p, "resets": p, "scripted": p, "unsaved": True},
                              {"id": "c", "role": p, "epoch": p, "parent": p, "frozen": False, "snapshot_of": None,
                               "version": p, "resets": 0, "scripted": None, "unsaved": False}],
                    "edges": [], "checkpoint": p},
        "transcripts": {"pairs": [{"pair": p, "games": [{"game_id": p, "epoch": p, "round": p, "players": [p, "b"],
                                                          "rewards": [p, 1], "turns_total": p,
                                                          "turns": [{"player": p, "seat": p, "prompt": p,
                                                                     "completion": p}]}]}]},
        "adapters": {"checkpoint": p, "adapters": [{"id": p, "role": p, "checkpoint": p, "path": p, "zip": p,
                                                     "files": [{"name": p, "bytes": p, "url": p}]}]},
    }


@pytest.mark.skipif(NODE is None, reason="needs node to run the page's script")
def test_the_page_escapes_every_value_from_the_files(tmp_path):
    out = rendered(hostile(PAYLOAD), tmp_path)
    html = "".join(out.values())
    assert PAYLOAD.count("<evil") and "<evil" not in html and 'onmouseover="' not in html
    assert "&lt;evil-tag&gt;" in out["curves"] and "&lt;evil-tag&gt;" in out["elo"]
    assert "at round X&quot;&#39; onmouseover=&quot;alert(1)&quot;&gt;&lt;evil-tag&gt;&amp;amp;" in out["elo"]
    assert "&lt;evil-tag&gt;" in out["flat-curves"] and "&lt;evil-tag&gt;" in out["curve-role"]
    # a link that names the hostile role draws its series too, still escaped
    chosen = rendered(hostile(PAYLOAD), tmp_path, "#role=" + PAYLOAD + "&x=games")
    assert "<evil" not in "".join(chosen.values()) and "&lt;evil-tag&gt;" in chosen["curves"]
    for panel in ("leaderboard", "curves", "elo", "payoff", "lineage", "transcripts", "adapters", "summary"):
        assert "evil-tag" in out[panel], panel  # each panel drew the hostile values, escaped


@pytest.mark.skipif(NODE is None, reason="needs node to run the page's script")
def test_the_page_draws_a_run_in_node(tmp_path):
    """The escaping changes nothing for ordinary data: curves, Elo and the payoff are drawn."""
    run = tmp_path / "run"
    checkpoint(run)
    rows = [{"step": s, "epoch": 0, "train/loss": 1.0 / s, "rating/elo/p0": 1000 + s, "rating/elo/p1": 1000 - s}
            for s in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    games = [{"game_id": f"g{i}", "epoch": 0, "round": 0, "players": ["p0", "p1"], "roles": ["main", "main"],
              "rewards": [1, 0]} for i in range(3)]
    (run / "match_history.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    view = RunView(run)
    data = {name: getattr(view, name)() for name in ("summary", "leaderboard", "curves", "elo", "payoff", "lineage",
                                                      "transcripts", "adapters")}
    out = rendered(data, tmp_path)
    assert out["curves"].count("<polyline") == 1 and "at round 4</title>" in out["curves"]
    assert ">round</text>" in out["curves"] and ">round</text>" in out["elo"]  # every x axis names its unit
    assert out["elo"].count("<polyline") == 2 and ">p0</span>" in out["elo"]
    assert out["payoff"].count('pointer-events="none">') == 2 and 'href="/adapters/p0.zip"' in out["adapters"]


@pytest.mark.skipif(NODE is None, reason="needs node to run the page's script")
def test_the_curves_per_role_in_node(tmp_path):
    """Reward per role with a filter: all roles, then one role of two learners (each learner drawn),
    in rounds or games played; a league of one role draws its line once; flat panels are a line."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "epoch": 0, "rollout/reward_mean": s / 10, "reward/role/main": s / 5, "reward/role/exp": -s / 5,
             "reward/player/exp-0": -s / 4, "reward/player/exp-1": -s / 6, "train/kl": 0.0} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    games = [{"game_id": f"g{r}-{k}", "epoch": 0, "round": r, "players": ["main-0", f"exp-{k}"],
              "roles": ["main", "exp"], "rewards": [1, 0]} for r in range(3) for k in range(2)]
    (run / "match_history.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    data = {"summary": RunView(run).summary(), "leaderboard": {"rows": []}, "curves": RunView(run).curves(),
            "elo": {"series": {}}, "payoff": {}, "lineage": {}, "transcripts": {}, "adapters": {}}

    def legend(html):
        return re.findall(r"</span>([^<]+)</span>", html.split('class="legend"', 1)[1])

    every = rendered(data, tmp_path)
    assert legend(every["curves"]) == ["all learners", "main", "exp"] and every["curves"].count("<polyline") == 3
    assert every["flat-curves"] == '<div class="flat">KL to the base: 0 throughout (rounds 1–3)</div>'
    assert '<option value="main">main</option><option value="exp">exp</option>' in every["curve-role"]
    assert '<option value="games">games played</option>' in every["curve-x"] and ">round</text>" in every["curves"]
    exp = rendered(data, tmp_path, "#role=exp&x=games")
    assert legend(exp["curves"]) == ["all learners", "exp", "exp-0", "exp-1"]
    assert ">games played</text>" in exp["curves"]
    assert 'class="item dim"' in exp["curves"] and "at 6 games played</title>" in exp["curves"]  # round 3: 6 games
    one = [{k: v for k, v in r.items() if "exp" not in k} for r in rows]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one))
    single = rendered({**data, "curves": RunView(run).curves()}, tmp_path)
    assert legend(single["curves"]) == ["main"] and single["curves"].count("<polyline") == 1


def test_the_templates_interpolations_of_data_go_through_esc_or_num():
    """Without node: the fields the issue named are written through the escaping helpers."""
    from autocurricula.serve.dashboard_page import _PAGE

    for written in ("at ${at(last[0])}", "at ${at(s)}", "`round ${esc(x)}`", "`${esc(x)} ${esc(xName)}`",
                    "<td>${esc(r.rank)}</td>", '<td class="num">${esc(r.games)}</td>', 'stroke="${c}"',
                    "c = esc(opts.colourOf(id))", "const fmt = v => esc((opts.fmt || (u => num(u, decimals)))(v));",
                    '<div class="flat">${esc(p.flat)}</div>', ">${esc(xName)}</text>"):
        assert written in _PAGE, written
    assert "at step ${last[0]}" not in _PAGE and "at step ${s}" not in _PAGE



def test_a_non_finite_game_in_the_history_is_left_out_not_a_server_error(tmp_path):
    from fastapi.testclient import TestClient

    from autocurricula.serve.dashboard import create_app

    (tmp_path / "match_history.jsonl").write_text(
        '{"game_id":"g","epoch":NaN,"round":0,"players":["a","b"],"roles":["main","main"],"rewards":[NaN,1]}\n'
        '{"game_id":"h","epoch":0,"round":0,"players":["a","b"],"roles":["main","main"],"rewards":[1,-1]}\n')
    client = TestClient(create_app(tmp_path), raise_server_exceptions=False)
    for route in ("/api/leaderboard", "/api/lineage", "/"):
        assert client.get(route).status_code == 200, route
    games = {r["id"]: r.get("games") for r in client.get("/api/leaderboard").json()["rows"]}
    assert games == {"a": 1, "b": 1}  # the finite game counts, the other is left out
