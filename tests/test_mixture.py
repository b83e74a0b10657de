"""Deploying a league's mixture (issue 70 item 1): ``mixture.json`` checked on load and refused by
name with the fix; one adapter drawn per conversation and kept, sticky by the session key; a
mixture exported by a real (tiny, short) tic-tac-toe league served with ``autocurricula serve
--mixture`` and played through the official ``openai`` client; the run-time route; the Python
policy (``autocurricula.load_mixture``); the Hub card's serve command."""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

import autocurricula
from autocurricula.publish.mixture import TOLERANCE, MixtureError, MixturePolicy, check_weights, read_mixture
from autocurricula.serve.sessions import ServedMixture, SessionTable

from server_fixtures import engine  # noqa: F401  (shared fixture)

CONVERSATIONS = 2000


def binomial_bounds(n: int, p: float, level: float = 0.999) -> tuple[int, int]:
    """The central ``level`` interval of Binomial(n, p): counts outside it have probability at most
    ``1 - level`` (exact, from the pmf)."""
    if p <= 0 or p >= 1:
        return (0, 0) if p <= 0 else (n, n)
    tail = (1 - level) / 2
    cdf, lo, hi = 0.0, None, n
    for k in range(n + 1):
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p)
                        + (n - k) * math.log1p(-p))
        if lo is None and cdf > tail:
            lo = k
        if cdf >= 1 - tail:
            hi = k
            break
    return lo, hi


def test_binomial_bounds_are_the_central_interval():
    lo, hi = binomial_bounds(2000, 0.3)
    assert 530 <= lo < 600 < hi <= 670 and 130 < hi - lo < 140  # ± 3.29 standard deviations (20.5 each)
    assert binomial_bounds(10, 0.0) == (0, 0) and binomial_bounds(10, 1.0) == (10, 10)


# ---------------------------------------------------------------------------------------------- mixture.json
def adapter_folder(folder):
    """A folder with the files of a peft adapter (read_mixture reads no tensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"\0")
    return folder


def mixture_folder(folder, weights, adapters=None, **doc):
    """A mixture folder: ``weights`` in mixture.json (``doc``: more keys), a stub adapter folder for each
    of ``adapters`` (default: every weighted name)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in weights if adapters is None else adapters:
        adapter_folder(folder / name)
    (folder / "mixture.json").write_text(json.dumps({"weights": weights, "base_model": "base", "format": "peft",
                                                     **doc}))
    return folder


def _outside_adapter(tmp):
    folder = mixture_folder(tmp / "m", {"a": 0.5, "b": 0.5}, ["a"])
    os.symlink(adapter_folder(tmp / "elsewhere"), folder / "b")
    return folder


def _outside_file(tmp):
    folder = mixture_folder(tmp / "m", {"a": 1.0})
    os.remove(folder / "a" / "adapter_model.safetensors")
    (tmp / "secret").write_bytes(b"\0")
    os.symlink(tmp / "secret", folder / "a" / "adapter_model.safetensors")
    return folder


def _outside_json(tmp):
    folder = mixture_folder(tmp / "m", {"a": 1.0})
    (tmp / "other.json").write_text((folder / "mixture.json").read_text())
    os.remove(folder / "mixture.json")
    os.symlink(tmp / "other.json", folder / "mixture.json")
    return folder


def _raw(text):
    def make(tmp):
        folder = mixture_folder(tmp / "m", {"a": 1.0})
        (folder / "mixture.json").write_text(text)
        return folder
    return make


def _no_weights_files(tmp):
    folder = mixture_folder(tmp / "m", {"a": 1.0})
    os.remove(folder / "a" / "adapter_model.safetensors")
    return folder


REFUSALS = {  # case -> (make the folder under tmp, what the message must say: the problem, then the fix)
    "no folder": (lambda tmp: tmp / "nowhere", r"does not exist.*trainer\.export_mixture"),
    "no mixture.json": (lambda tmp: adapter_folder(tmp / "m"), r"has no mixture\.json.*export"),
    "not JSON": (_raw("{weights"), r"not valid JSON.*export it again"),
    "not an object": (_raw("[1, 2]"), r"holds a JSON list; it must be an object"),
    "no weights": (_raw('{"base_model": "x"}'), r"has no 'weights'"),
    "empty weights": (lambda tmp: mixture_folder(tmp / "m", {}), r"non-empty object"),
    "NaN": (_raw('{"weights": {"a": NaN}}'), r"weight of 'a' is nan, not finite"),
    "infinite": (_raw('{"weights": {"a": Infinity}}'), r"weight of 'a' is inf, not finite"),
    "negative": (lambda tmp: mixture_folder(tmp / "m", {"a": 1.5, "b": -0.5}), r"weight of 'b' is -0\.5, negative"),
    "a string": (lambda tmp: mixture_folder(tmp / "m", {"a": "1"}), r"weight of 'a' is '1', not a number"),
    "a boolean": (lambda tmp: mixture_folder(tmp / "m", {"a": True}), r"weight of 'a' is True, not a number"),
    "sum below 1": (lambda tmp: mixture_folder(tmp / "m", {"a": 0.5, "b": 0.4999}),
                    r"sum to 0\.9999, not 1 \(within 1e-06\); divide each by their sum"),
    "sum above 1": (lambda tmp: mixture_folder(tmp / "m", {"a": 0.5, "b": 0.500002}), r"sum to 1\.000002"),
    "a path as a name": (_raw('{"weights": {"../a": 1.0}}'), r"invalid adapter name '\.\./a'.*folder names"),
    "missing adapter": (lambda tmp: mixture_folder(tmp / "m", {"a": 0.5, "b": 0.5}, ["a"]),
                        r"adapter 'b' is missing.*export the mixture again.*or remove it"),
    "adapter without weights": (_no_weights_files, r"adapter 'a' .*has no adapter_config\.json with"),
    "adapter linked outside": (_outside_adapter, r"adapter 'b' of mixture .*resolves to .*outside the mixture folder"),
    "file linked outside": (_outside_file, r"adapter_model\.safetensors of adapter 'a'.*outside the mixture folder"),
    "mixture.json linked outside": (_outside_json, r"mixture\.json of .*outside the mixture folder.*copy the files"),
    "unknown format": (lambda tmp: mixture_folder(tmp / "m", {"a": 1.0}, format="gguf"),
                       r"format 'gguf' is not one of peft, mlx"),
    "base model not a string": (lambda tmp: mixture_folder(tmp / "m", {"a": 1.0}, base_model=3),
                                r"'base_model' is 3, not a string"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_mixture_that_cannot_be_played_is_refused_by_name_with_the_fix(case, tmp_path):
    make, message = REFUSALS[case]
    folder = make(tmp_path)
    with pytest.raises(MixtureError, match=f"(?s){message}"):
        read_mixture(folder)
    with pytest.raises(MixtureError, match=f"(?s){message}"):  # the Python policy reads through the same check
        autocurricula.load_mixture(folder)


def test_weights_within_the_tolerance_and_zero_weights_are_accepted(tmp_path):
    folder = mixture_folder(tmp_path / "m", {"a": 0.25, "b": 0.75 + TOLERANCE / 2, "c": 0})
    mixture = read_mixture(folder)
    assert mixture.names == ["a", "b", "c"] and mixture.base_model == "base" and mixture.format == "peft"
    assert mixture.adapters["a"] == (tmp_path / "m" / "a").resolve()
    inside = mixture_folder(tmp_path / "n", {"a": 1.0})  # a link that stays inside the folder is fine
    os.symlink(inside / "a", inside / "alias")
    (inside / "mixture.json").write_text(json.dumps({"weights": {"alias": 1.0}}))
    assert read_mixture(inside).adapters["alias"] == (inside / "a").resolve()
    assert check_weights({"x": 1}) == {"x": 1.0}


# ------------------------------------------------------------------------------------------------ the draw
def test_the_policy_draws_by_the_weights_reproducibly_and_never_a_zero_weight(tmp_path):
    folder = mixture_folder(tmp_path / "m", {"a": 0.2, "never": 0.0, "b": 0.3, "c": 0.5})
    policy = autocurricula.load_mixture(folder, seed=7)
    assert isinstance(policy, MixturePolicy) and policy.names == ["a", "never", "b", "c"]
    assert policy.weights == {"a": 0.2, "never": 0.0, "b": 0.3, "c": 0.5} and policy.base_model == "base"
    draws = [policy.draw() for _ in range(20_000)]
    again = autocurricula.load_mixture(folder, seed=7)
    assert draws[:50] == [again.draw() for _ in range(50)]  # the same seed, the same draws
    counts = Counter(draws)
    assert counts["never"] == 0
    for name, w in policy.weights.items():
        lo, hi = binomial_bounds(len(draws), w)
        assert lo <= counts[name] <= hi, (name, counts)


def test_a_session_keeps_its_draw_and_the_table_forgets_the_least_recently_used(tmp_path):
    import random

    policy = MixturePolicy(read_mixture(mixture_folder(tmp_path / "m", {"a": 0.5, "b": 0.5})))
    mix = ServedMixture("mix", policy, {"a": "mix:a", "b": "mix:b"}, str(tmp_path / "m"))
    other = ServedMixture("other", policy, {"a": "other:a", "b": "other:b"}, str(tmp_path / "m"))
    table, rng = SessionTable(cap=100), random.Random(0)
    first = {f"s{i}": table.player(mix, f"s{i}", rng) for i in range(100)}
    assert set(first.values()) == {"mix:a", "mix:b"}
    for _ in range(5):  # later turns, in any order, keep the first draw
        for key in reversed(list(first)):
            assert table.player(mix, key, rng) == first[key]
    assert table.player(other, "s0", rng).startswith("other:")  # a key is a session of one mixture only
    assert len(table) == 100 and table.counts == {"mix": 99, "other": 1}  # s99 (least recent) gave way
    fresh = Counter(table.player(mix, None, rng) for _ in range(400))  # no key: a conversation of one turn
    assert set(fresh) == {"mix:a", "mix:b"} and len(table) == 100
    scoped = {table.player(mix, "s1", rng, scope=f"client-{i}") for i in range(40)}  # another client's "s1"
    assert scoped == {"mix:a", "mix:b"}
    table.forget("mix")
    assert table.counts == {"other": 1} and len(table) == 1


def test_the_session_table_keeps_keys_as_digests_of_fixed_size(tmp_path):
    import random

    policy = MixturePolicy(read_mixture(mixture_folder(tmp_path / "m", {"a": 1.0})))
    mix = ServedMixture("mix", policy, {"a": "mix:a"}, str(tmp_path / "m"))
    table = SessionTable(cap=3)
    table.player(mix, "k" * 100_000, random.Random(0))
    (name, digest), = table.table
    assert name == "mix" and len(digest) == 16


# ------------------------------------------------------------------------------ a mixture of adapters, in process
SYNTHETIC = {"alice": 0.5, "bob": 0.3, "carol": 0.2}


@pytest.fixture(scope="module")
def synthetic(engine, tiny_model_path, tmp_path_factory):  # noqa: F811
    """A mixture folder as trainer.export_mixture writes one: three random peft adapters of the tiny
    model and their weights (SYNTHETIC)."""
    from autocurricula.engine import AdapterWeights, LoraSpec
    from autocurricula.publish.export import export_peft
    from autocurricula.publish.mixture import mixture_document

    folder = tmp_path_factory.mktemp("synthetic") / "mixture"
    spec = LoraSpec(r=4, lora_alpha=8)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    for seed, name in enumerate(SYNTHETIC):
        export_peft(AdapterWeights.random(dims, spec, seed=seed, b_std=0.5), folder / name, str(tiny_model_path))
    (folder / "mixture.json").write_text(mixture_document(SYNTHETIC, str(tiny_model_path), "peft", "tictactoe"))
    return folder


# ------------------------------------------------------------------------------------ a trained league's mixture
@pytest.fixture(scope="module")
def league(tiny_model_path, tmp_path_factory):
    """A tic-tac-toe league as the default example trains one (main agent, main and league exploiters,
    the random player in the pool) on the tiny model, one short round, and its exported mixture."""
    from autocurricula import LeagueConfig, LeagueTrainer
    from autocurricula.games import tictactoe

    out = tmp_path_factory.mktemp("mixture-league")
    config = LeagueConfig(epochs=1, rounds=1, output_dir=str(out / "run"), seed=0, max_tokens=2, progress=False,
                          ratings={"bt_bootstrap": 0}, game_name="tictactoe",
                          rules={"games_per_learner": 4, "exploiter_games": 4, "main_exploiters": 1,
                                 "league_exploiters": 1, "snapshot_min_rounds": 1, "snapshot_max_rounds": 1})
    trainer = LeagueTrainer(config, opponents=[{"id": "random", "role": "random", "policy": tictactoe.random_policy}])
    trainer.train(str(tiny_model_path), tictactoe.play)
    folder = trainer.export_mixture(out / "mixture")
    yield trainer, folder
    trainer.engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(league, tiny_model_path):
    """``autocurricula serve --mixture league=FOLDER`` on a free loopback port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autocurricula.cli", "serve", "--model", str(tiny_model_path),
                             "--port", str(port), "--mixture", f"league={league[1]}", "--mixture-seed", "0",
                             "--served-model-name", "tiny"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-3000:]
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.mark.slow  # a training run (about 10 s on 2 cores)
def test_the_trained_mixture_is_valid_as_exported(league):
    trainer, folder = league
    mixture = read_mixture(folder)
    assert mixture.weights == pytest.approx(trainer.deployable_mixture()) and mixture.game == "tictactoe"
    assert mixture.format == "peft" and set(mixture.adapters) == set(trainer.deployable_mixture())


@pytest.mark.slow  # a training run, then 2,600 requests (about 30 s on 2 cores)
def test_openai_client_plays_the_trained_mixture_one_adapter_per_conversation(served, league):
    """2,000 new conversations through the official client: each adapter's share within the binomial
    99.9% bound of its weight; 200 of them go on for three more turns and never switch adapter."""
    import openai

    weights = read_mixture(league[1]).weights
    oai = openai.OpenAI(base_url=f"{served}/v1", api_key="none", max_retries=0, timeout=60)
    listed = {m.id: m for m in oai.models.list()}
    assert "league" in listed and listed["league"].model_dump()["mixture"] == pytest.approx(
        {f"league:{a}": w for a, w in weights.items()})
    assert {f"league:{a}" for a in weights} <= set(listed)  # each adapter is also a model of its own

    def turn(i: int, messages: list) -> str:
        session = f"game-{i}"  # half send the header, half the user field
        key = {"extra_headers": {"X-Session-Id": session}} if i % 2 else {"user": session}
        raw = oai.chat.completions.with_raw_response.create(model="league", messages=messages, max_tokens=1,
                                                           **key)
        reply = raw.parse()
        assert raw.headers["X-Autocurricula-Adapter"] == reply.model  # the header and `model` agree
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or "."})
        return reply.model

    conversations = {i: [{"role": "user", "content": f"board {i}: your move"}] for i in range(CONVERSATIONS)}
    with ThreadPoolExecutor(8) as pool:
        drawn = dict(zip(conversations, pool.map(lambda i: turn(i, conversations[i]), conversations)))
    counts = Counter(drawn.values())
    assert set(counts) <= {f"league:{a}" for a in weights}, counts
    for adapter, w in weights.items():
        lo, hi = binomial_bounds(CONVERSATIONS, w)
        assert lo <= counts[f"league:{adapter}"] <= hi, (adapter, w, counts)

    def go_on(i: int) -> list[str]:
        served_by = []
        for t in range(3):
            conversations[i].append({"role": "user", "content": f"turn {t + 2}"})
            served_by.append(turn(i, conversations[i]))
        return served_by

    later = list(range(0, CONVERSATIONS, 10))
    with ThreadPoolExecutor(8) as pool:
        for i, served_by in zip(later, pool.map(go_on, later)):
            assert served_by == [drawn[i]] * 3, (i, drawn[i], served_by)

    # the header wins over the user field: both sent, the header's conversation answers
    by_header = next(i for i in drawn if i % 2)
    by_user = next((i for i in drawn if not i % 2 and drawn[i] != drawn[by_header]), None)
    if by_user is not None:  # (a mixture of one adapter has no second adapter to tell them apart)
        reply = oai.chat.completions.create(model="league", messages=conversations[by_header], max_tokens=1,
                                            user=f"game-{by_user}", extra_headers={"X-Session-Id": f"game-{by_header}"})
        assert reply.model == drawn[by_header]
    stream = oai.chat.completions.with_raw_response.create(model="league", messages=conversations[0], max_tokens=2,
                                                          user="game-0", stream=True)
    chunks = list(stream.parse())
    assert stream.headers["X-Autocurricula-Adapter"] == drawn[0] and {c.model for c in chunks} == {drawn[0]}
    stats = httpx.get(f"{served}/v1/mixtures").json()["data"][0]
    assert stats["name"] == "league" and stats["sessions"] == CONVERSATIONS and stats["game"] == "tictactoe"


@pytest.mark.slow  # the served trained mixture
def test_the_deploy_pages_client_snippet_keeps_its_adapter(served):
    """docs/deploy.md's openai snippet (compiled only by test_readme: it needs this server)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    code = next(c for c in re.findall(r"```python\n(.*?)```", page, re.S) if "X-Session-Id" in c)
    code = code.replace("http://127.0.0.1:8000", served).replace('model="ttt"', 'model="league"')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    names = {name for _, *pair in lines for name in pair}
    assert [t for t, *_ in lines] == ["0", "1"] and len(names) == 1, out.stdout
    assert lines[0][1].startswith("league:")


def test_serving_a_mixture_that_cannot_be_played_is_one_line_before_the_model_loads(tmp_path, tiny_model_path):
    from autocurricula.cli import main

    bad = mixture_folder(tmp_path / "bad", {"a": 0.7, "b": 0.7})
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model", str(tmp_path / "no-model"), "--mixture", f"m={bad}"])
    message = str(info.value.code)
    assert message.startswith("autocurricula serve: ") and "sum to 1.4, not 1" in message and "\n" not in message
    with pytest.raises(SystemExit, match=r"--mixture 'm': write it as NAME=FOLDER"):
        main(["serve", "--model", str(tiny_model_path), "--mixture", "m"])
    good = mixture_folder(tmp_path / "good", {"a": 1.0})
    with pytest.raises(SystemExit, match=r"--mixture m and --adapter m: one name for two models"):
        main(["serve", "--model", str(tiny_model_path), "--mixture", f"m={good}", "--adapter", f"m={good / 'a'}"])


# ------------------------------------------------------------------------------------- run time, in process
@pytest.fixture()
def root_client(engine, synthetic, tmp_path):  # noqa: F811
    """A server whose adapter root holds a mixture (``mixture/``) and a plain adapter."""
    from autocurricula.serve.server import create_app

    root = tmp_path / "root"
    shutil.copytree(synthetic, root / "mixture")
    shutil.copytree(synthetic / "alice", root / "plain")
    with TestClient(create_app(engine, adapter_root=str(root), max_tokens_limit=8, mixture_seed=1)) as c:
        yield c, root
    for player in engine.players():
        engine.unload_adapter(player)


def load(client, name, path):
    return client.post("/v1/load_mixture", json={"mixture_name": name, "mixture_path": path})


def test_a_mixture_loads_at_run_time_and_serves_each_session_one_adapter(root_client):
    client, root = root_client
    weights = SYNTHETIC
    r = load(client, "mix", "mixture")
    assert r.status_code == 200, r.text
    assert r.json()["weights"] == pytest.approx({f"mix:{a}": w for a, w in weights.items()})
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert "mix" in ids and {f"mix:{a}" for a in weights} <= set(ids)
    body = {"model": "mix", "prompt": "x o x", "max_tokens": 1}
    first = client.post("/v1/completions", json={**body, "user": "alice"})
    assert first.status_code == 200 and first.headers["x-autocurricula-adapter"] == first.json()["model"]
    assert all(client.post("/v1/completions", json={**body, "user": "alice"}).json()["model"]
               == first.json()["model"] for _ in range(5))
    header = client.post("/v1/completions", json={**body, "user": "bob"}, headers={"X-Session-Id": "alice"})
    assert header.json()["model"] == first.json()["model"]  # the header names the session, not `user`
    requests = [{**body, "user": "alice"}, {**body, "user": "carol"}, {**body, "user": "carol"},
                {**body, "model": None}]
    batch = client.post("/v1/batch/completions", json={"requests": requests})
    data = batch.json()["data"]
    assert data[0]["model"] == first.json()["model"] and data[1]["model"] == data[2]["model"]
    assert data[1]["model"].startswith("mix:") and data[3]["model"] == "tiny"
    assert client.get("/v1/mixtures").json()["data"][0]["sessions"] == 2  # alice and carol (bob sent a header)
    plain = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert "x-autocurricula-adapter" not in plain.headers  # only a mixture's answers say it

    again = load(client, "mix", "mixture")  # loaded again: the same players, new versions, sessions forgotten
    assert again.status_code == 200 and again.json()["sessions"] == 0
    r = client.post("/v1/unload_mixture", json={"mixture_name": "mix"})
    assert r.status_code == 200 and not any(a["name"].startswith("mix:")
                                            for a in client.get("/v1/adapters").json()["data"])
    assert client.post("/v1/completions", json=body).status_code == 404


def test_the_run_time_route_refuses_what_it_cannot_serve(root_client, synthetic):
    client, root = root_client
    (root / "empty").mkdir()
    outside = shutil.copytree(synthetic, root.parent / "outside")
    escaping = shutil.copytree(synthetic, root / "escaping")
    victim = next(p for p in escaping.iterdir() if p.is_dir())
    shutil.rmtree(victim)
    os.symlink(outside / victim.name, victim)
    assert load(client, "m", "../outside").status_code == 403
    r = load(client, "m", "empty")
    assert r.status_code == 400 and "has no mixture.json" in r.json()["error"]["message"]
    r = load(client, "m", "escaping")
    assert r.status_code == 400 and "outside the mixture folder" in r.json()["error"]["message"]
    assert load(client, "tiny", "mixture").status_code == 409  # the base model's name
    assert client.post("/v1/load_lora_adapter", json={"lora_name": "plain", "lora_path": "plain"}).status_code == 200
    r = load(client, "plain", "mixture")
    assert r.status_code == 409 and "loaded adapter" in r.json()["error"]["message"]
    assert load(client, "bad/name", "mixture").status_code == 400
    assert client.post("/v1/unload_mixture", json={"mixture_name": "nope"}).status_code == 404
    assert load(client, "m", "mixture").status_code == 200
    member = next(p for p in client.get("/v1/mixtures").json()["data"][0]["weights"])
    for r in (client.delete(f"/v1/adapters/{member}"),
              client.post("/v1/unload_lora_adapter", json={"lora_name": member}),
              client.post("/v1/load_lora_adapter", json={"lora_name": member, "lora_path": "plain"}),
              client.post("/v1/load_lora_adapter", json={"lora_name": "m", "lora_path": "plain"})):
        assert r.status_code == 409 and "mixture" in r.json()["error"]["message"], r.text
    assert load(client, "plain:x", "mixture").status_code == 200  # another name: fine
    assert len(client.get("/v1/mixtures").json()["data"]) == 2


def test_the_openai_client_takes_a_mixtures_answers(engine, synthetic):  # noqa: F811
    """The official client, against a real server on 127.0.0.1: the mixture is a model, its answers
    name the adapter in ``model`` and in a header, and a conversation keeps its adapter."""
    import openai
    from helpers import running_server

    from autocurricula.serve.server import create_app

    with running_server(create_app(engine, mixtures={"mix": str(synthetic)}, mixture_seed=0)) as url:
        oai = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        listed = {m.id: m.model_dump() for m in oai.models.list()}
        assert listed["mix"]["mixture"] == pytest.approx({f"mix:{a}": w for a, w in SYNTHETIC.items()})
        drawn = Counter()
        for i in range(24):
            messages = [{"role": "user", "content": f"game {i}"}]
            raw = oai.chat.completions.with_raw_response.create(model="mix", messages=messages, max_tokens=1,
                                                               user=f"g{i}")
            first = raw.parse().model
            assert raw.headers["X-Autocurricula-Adapter"] == first and first.startswith("mix:")
            messages += [{"role": "assistant", "content": "."}, {"role": "user", "content": "again"}]
            again = oai.chat.completions.create(model="mix", messages=messages, max_tokens=1, user=f"g{i}")
            assert again.model == first
            text = oai.completions.create(model="mix", prompt="x", max_tokens=1,
                                          extra_headers={"X-Session-Id": f"g{i}"})
            assert text.model == first  # the same session, by header, through the completions route
            drawn[first] += 1
        assert len(drawn) == 3, drawn  # 24 draws of 0.5 / 0.3 / 0.2 (seed 0): each adapter played
    for player in engine.players():
        engine.unload_adapter(player)


def test_load_mixture_loads_the_adapters_into_an_engine_as_players(engine, synthetic):  # noqa: F811
    from autocurricula.engine.adapters import load_folder

    policy = autocurricula.load_mixture(synthetic, seed=0)
    players = policy.load_into(engine, prefix="py-")
    try:
        assert players == {a: f"py-{a}" for a in SYNTHETIC} and set(players.values()) <= set(engine.players())
        name = policy.draw()
        assert policy.adapter_folder(name) == (synthetic / name).resolve()
        engine.load_adapter("direct", load_folder(synthetic / name))
        ids = engine.encode("x o x")
        assert abs(engine.logits(ids, players[name]) - engine.logits(ids, "direct")).max() == 0
    finally:
        for player in engine.players():
            engine.unload_adapter(player)


def test_no_adapter_root_means_no_run_time_mixtures(engine):  # noqa: F811
    from autocurricula.serve.server import create_app

    with TestClient(create_app(engine)) as client:
        r = load(client, "m", "anything")
        assert r.status_code == 403 and "--mixture NAME=FOLDER" in r.json()["error"]["message"]


# -------------------------------------------------------------------------------------------- Python and Hub
@pytest.mark.slow  # a training run (about 10 s on 2 cores)
def test_load_mixture_plays_the_trained_adapters_in_an_engine(league, tiny_model_path):
    from autocurricula.engine import Engine

    trainer, folder = league
    policy = autocurricula.load_mixture(folder, seed=0)
    assert policy.weights == pytest.approx(trainer.deployable_mixture())
    with Engine(str(tiny_model_path)) as engine:
        players = policy.load_into(engine, prefix="mix-")
        assert sorted(engine.players()) == sorted(players.values())
        name = policy.draw()
        ours = engine.logits(engine.encode("x o x"), players[name])
        trained = trainer.engine.logits(trainer.engine.encode("x o x"), name)
        assert abs(ours - trained).max() < 1e-3  # the exported adapter is the player that trained


@pytest.mark.slow  # a training run (about 10 s on 2 cores)
def test_push_to_hub_puts_a_servable_mixture_and_its_serve_command_on_the_hub(league, hub, tmp_path):
    pytest.importorskip("huggingface_hub")
    trainer, _ = league
    calls, commits = hub
    trainer.push_to_hub("me/ttt-league", endpoint="https://hub.test", token="hf_test")
    files = {op["value"]["path"]: base64.b64decode(op["value"]["content"]) for op in commits[-1]
             if op.get("key") == "file"}
    repo = tmp_path / "ttt-league"  # as `hf download me/ttt-league --local-dir ttt-league` writes it
    for path, data in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    mixture = read_mixture(repo)
    assert mixture.weights == pytest.approx(trainer.deployable_mixture()) and mixture.game == "tictactoe"
    card = files["README.md"].decode()
    section = card.split("### Serve it")[1].split("## Meta-strategy")[0]
    assert "hf download me/ttt-league --local-dir ttt-league" in section
    assert "autocurricula serve --model BASE_MODEL --mixture ttt-league=ttt-league" in section  # a local base
    assert 'autocurricula.load_mixture("ttt-league", seed=0)' in section and "X-Session-Id" in section


def test_the_card_says_when_there_is_nothing_to_serve():
    from autocurricula.publish.hub import mixture_card

    assert "Nothing to serve yet" in mixture_card({}, "org/base", "me/x")
    text = mixture_card({"a": 1.0}, "org/base", "me/x")
    assert "autocurricula serve --model org/base --mixture x=x" in text
