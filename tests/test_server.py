"""HTTP server: OpenAI/vLLM compatibility, adapter routes, input errors, auth, health, cancellation."""

import json
import re
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save, save_file

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
from autocurricula.engine.adapters import to_safetensors_bytes
from autocurricula.serve.server import create_app
from helpers import running_server, write_peft
from server_fixtures import client, engine, root  # noqa: F401  (shared fixtures)

KEY = "test-key"
GREEDY = {"temperature": 0, "ignore_eos": True}
CHAT = [{"role": "user", "content": "who wins the game?"}]


@pytest.fixture(scope="module")
def base_url(engine, root):
    with running_server(create_app(engine, api_key=KEY, adapter_root=str(root))) as url:
        yield url


def weights(engine, seed, r=8, b_std=0.5):
    spec = LoraSpec(r=r, lora_alpha=2 * r)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=b_std)


def put(client, name, data, **params):
    return client.put(f"/v1/adapters/{name}", content=data, params=params,
                      headers={"Content-Type": "application/octet-stream"})


def complete(client, model=None, prompt="the player wins", max_tokens=8, **extra):
    r = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                             **GREEDY, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def error_of(resp, status, *words):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    for w in words:
        assert w.lower() in err["message"].lower(), err["message"]
    return err


def sse(resp):
    lines = [ln for ln in resp.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln[len("data: "):]) for ln in lines[:-1]]


def spy_submits(engine, monkeypatch):
    futures, real = [], engine.submit

    def spy(*args, **kwargs):
        futures.append(real(*args, **kwargs))
        return futures[-1]

    monkeypatch.setattr(engine, "submit", spy)
    return futures


# ------------------------------------------------------------------ generation
def test_completion_matches_engine(client, engine):
    body = complete(client, prompt="hello world", max_tokens=6, logprobs=1, return_token_ids=True)
    want = engine.generate("hello world", max_tokens=6, **GREEDY)
    (ch,) = body["choices"]
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert ch["token_ids"] == want.token_ids and ch["prompt_token_ids"] == want.prompt_ids
    assert ch["text"] == want.text and ch["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(want.prompt_ids), "completion_tokens": 6,
                             "total_tokens": len(want.prompt_ids) + 6}
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
    np.testing.assert_allclose(lp["token_logprobs"], want.logprobs, atol=1e-4)
    assert body["adapter_version"] is None and body["version_spans"] == [[0, 6, None]]


def test_prompt_forms_agree(client, engine):
    ids = engine.encode("hello world")
    texts = {complete(client, prompt=p)["choices"][0]["text"] for p in ("hello world", ids, [ids], ["hello world"])}
    assert len(texts) == 1


def test_chat_logprobs_and_template(client, engine):
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": CHAT, "max_tokens": 5,
                                                  "logprobs": True, "return_token_ids": True, **GREEDY})
    body = r.json()
    (ch,) = body["choices"]
    assert body["object"] == "chat.completion" and ch["message"]["role"] == "assistant"
    assert ch["prompt_token_ids"] == engine.apply_chat_template(CHAT)
    content = ch["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 5
    assert all(set(c) == {"token", "logprob", "bytes", "top_logprobs"} and c["top_logprobs"] == [] for c in content)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("sampling", [GREEDY, {"temperature": 1.0, "seed": 7}])
def test_stream_equals_non_stream(client, chat, sampling):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"messages": CHAT} if chat else {"prompt": "the league"}
    body.update(max_tokens=12, **sampling)
    whole = client.post(path, json=body).json()
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = sse(r)
    pieces = [c["choices"][0]["delta" if chat else "text"] for c in chunks]
    text = "".join((p.get("content") or "") if chat else p for p in pieces)
    ch = whole["choices"][0]
    assert text == (ch["message"]["content"] if chat else ch["text"])
    assert chunks[-1]["choices"][0]["finish_reason"] == ch["finish_reason"]
    assert chunks[-1]["usage"] == whole["usage"] and chunks[-1]["version_spans"] == whole["version_spans"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk" if chat else "text_completion"}


def test_stop_string_stream_and_whole(client):
    text = complete(client, max_tokens=16)["choices"][0]["text"]
    stop = next(text[i:i + 2] for i in range(len(text) // 2, len(text)) if "\ufffd" not in text[i:i + 2])
    want = text[: text.find(stop)]
    whole = complete(client, max_tokens=16, stop=[stop])["choices"][0]
    assert (whole["text"], whole["finish_reason"]) == (want, "stop")
    body = {"prompt": "the player wins", "max_tokens": 16, "stop": stop, "stream": True, **GREEDY}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert "".join(c["choices"][0]["text"] for c in sse(r)) == want


# ------------------------------------------------------------------ bad input
BAD = [
    ("/v1/completions", {"prompt": "x", "model": "nobody"}, 404, "unknown player"),
    ("/v1/completions", {"prompt": [5] * 3000}, 400, "context"),
    ("/v1/completions", {"prompt": [99999]}, 400, "token ids"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 257}, 400, "limit of 256"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_k": -5}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "seed": -1}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n=1"),
    ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "one prompt"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", [1, 2], 400, "invalid request"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"prompt": "x"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "model": "nobody"}, 404, "nobody"),
    ("/v1/load_lora_adapter", {"lora_name": "x"}, 400, "lora_path"),
]


@pytest.mark.parametrize("path,body,status,word", BAD, ids=[f"{b[0][4:]}-{b[3]}" for b in BAD])
def test_bad_requests_get_openai_errors(client, path, body, status, word):
    error_of(client.post(path, json=body), status, word)


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"prompt": "x",}'])
def test_malformed_json_is_400_not_422(client, raw):
    r = client.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    error_of(r, 400)


def test_batch_route_admits_its_requests_together_each_with_its_own_player(client, engine, monkeypatch):
    assert put(client, "batch_a", to_safetensors_bytes(weights(engine, 31))).status_code == 200
    assert put(client, "batch_b", to_safetensors_bytes(weights(engine, 32))).status_code == 200
    ids = engine.encode("x o x")
    reqs = [{"prompt": ids, "model": m, "max_tokens": 4, "logprobs": 0, "return_token_ids": True, **GREEDY}
            for m in ("batch_a", None, "batch_b", "tiny", "batch_a")]
    reqs[1]["prompt"] = "o x o"  # text and token prompts mix
    calls, real = [], engine.submit_many
    monkeypatch.setattr(engine, "submit_many", lambda items: calls.append(len(items)) or real(items))
    before = dict(engine.stats)
    r = client.post("/v1/batch/completions", json={"requests": reqs})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert calls == [5]  # one atomic admission for the whole batch
    steps = engine.stats["steps"] - before["steps"]
    assert steps == 3 and engine.stats["rows_stepped"] - before["rows_stepped"] == 5 * steps  # one batch throughout
    assert [d["model"] for d in data] == ["batch_a", "tiny", "batch_b", "tiny", "batch_a"]
    assert [d["adapter_version"] for d in data] == [1, None, 1, None, 1]
    for req, d in zip(reqs, data):  # each as its own /v1/completions request answers it
        alone = complete(client, model=req["model"], prompt=req["prompt"], max_tokens=4, return_token_ids=True)
        assert d["object"] == "text_completion" and d["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]
        assert len(d["choices"][0]["logprobs"]["token_logprobs"]) == 4
    assert data[0]["choices"][0]["token_ids"] == data[4]["choices"][0]["token_ids"]
    assert data[0]["choices"][0]["token_ids"] != data[2]["choices"][0]["token_ids"]  # players differ


@pytest.mark.parametrize("bad,status,word", [
    ({"model": "nobody"}, 404, "nobody"),
    ({"stream": True}, 400, "requests[1].stream"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": ["a", "b"]}, 400, "requests[1].prompt"),
    ({"presence_penalty": 1.0}, 400, "requests[1]: presence_penalty"),
])
def test_a_bad_request_refuses_the_whole_batch_and_runs_none_of_it(client, engine, bad, status, word, monkeypatch):
    queued, real = [], engine.submit_many
    monkeypatch.setattr(engine, "submit_many", lambda items: queued.extend(real(items)))
    monkeypatch.setattr(engine, "submit", lambda *a, **k: queued.append(a))
    reqs = [{"prompt": "x", "max_tokens": 2}, {"prompt": "o", "max_tokens": 2, **bad}]
    error_of(client.post("/v1/batch/completions", json={"requests": reqs}), status, word)
    assert queued == []  # the first, valid request was not queued either
    error_of(client.post("/v1/batch/completions", json={"requests": []}), 400, "requests")


def test_unknown_route_and_server_keeps_serving(client):
    error_of(client.get("/v1/nothing"), 404)
    assert client.get("/health").json()["status"] == "ok"
    stats = client.get("/v1/stats").json()
    assert stats["stats"]["completions"] > 0 and 0 < stats["occupancy"] <= 1 and stats["health"]["ok"]
    assert complete(client)["choices"][0]["finish_reason"] == "length"


# ------------------------------------------------------------------ adapters
def test_upload_hot_swap_info_delete(client, engine):
    base = complete(client)["choices"][0]["text"]
    assert put(client, "alice", to_safetensors_bytes(weights(engine, 1))).json() == {"name": "alice", "version": 1}
    first = complete(client, model="alice")
    assert first["choices"][0]["text"] != base
    assert first["adapter_version"] == 1 and first["version_spans"] == [[0, 8, 1]]
    assert put(client, "alice", to_safetensors_bytes(weights(engine, 2))).json()["version"] == 2
    second = complete(client, model="alice")
    assert second["adapter_version"] == 2 and second["choices"][0]["text"] != first["choices"][0]["text"]
    info = client.get("/v1/adapters/alice").json()
    assert (info["name"], info["version"], info["rank"], info["scale"]) == ("alice", 2, 8, 2.0)
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["tiny"]["parent"] is None and models["alice"]["parent"] == "tiny"
    # scale=0 switches the adapter off: the base model's output comes back
    assert put(client, "alice", to_safetensors_bytes(weights(engine, 2)), scale=0).json()["version"] == 3
    assert complete(client, model="alice")["choices"][0]["text"] == base
    assert client.delete("/v1/adapters/alice").json() == {"name": "alice", "deleted": True}
    error_of(client.post("/v1/completions", json={"model": "alice", "prompt": "x"}), 404, "alice")
    error_of(client.get("/v1/adapters/alice"), 404)
    error_of(client.delete("/v1/adapters/alice"), 404)


def test_upload_at_a_version_and_fingerprint(client, engine, tiny_model_path):
    from autocurricula.engine.fingerprint import fingerprint_engine, fingerprint_folder

    data = to_safetensors_bytes(weights(engine, 3))
    error_of(put(client, "vplayer", data, version=0), 400, "version")
    assert put(client, "vplayer", data, version=7).json() == {"name": "vplayer", "version": 7}
    assert complete(client, model="vplayer")["adapter_version"] == 7
    error_of(put(client, "vplayer", data, version=7), 409, "version 7")  # not newer: refused, kept
    assert client.get("/v1/adapters/vplayer").json()["version"] == 7
    assert put(client, "vplayer", data, version=9).json()["version"] == 9
    assert put(client, "vplayer", data).json()["version"] == 10  # no version: the next one
    client.delete("/v1/adapters/vplayer")
    error_of(put(client, "vplayer", data, version=3), 409, "not newer")  # a name's versions only grow
    # an engine named "tiny" has no folder: printed from its parameters, stable across calls
    fp = client.get("/v1/fingerprint").json()
    assert fp["kind"] == "params" and fp["model"] == "tiny" and fp == client.get("/v1/fingerprint").json()
    assert fp["weights"] == fingerprint_engine(engine)["weights"]
    assert fp["instance"] == client.get("/health").json()["instance"]
    # the adapter stacks the engine wraps around linears are no part of the base model
    from mlx_lm import load

    from autocurricula.engine.fingerprint import fingerprint_model

    plain = fingerprint_model(load(str(tiny_model_path))[0])
    assert (plain["weights"], plain["config"], plain["tensors"]) == (fp["weights"], fp["config"], fp["tensors"])
    folder = fingerprint_folder(tiny_model_path)
    assert folder["kind"] == "files" and folder["tensors"] == fp["tensors"]


def _tensors(engine, shape_a=None, dtype=np.float32, module="model.layers.0.self_attn.q_proj"):
    din, dout = engine.linear_dims.get(module, (256, 256))
    a = np.zeros(shape_a or (din, 4), dtype)
    return save({f"{module}.lora_a": a, f"{module}.lora_b": np.zeros((4, dout), dtype)})


def test_bad_uploads(client, engine):
    error_of(put(client, "bob", _tensors(engine, shape_a=(17, 4))), 400, "do not fit")
    error_of(put(client, "bob", _tensors(engine, module="model.layers.0.mlp.nope")), 400, "not a linear layer")
    error_of(put(client, "bob", _tensors(engine, dtype=np.int32)), 400, "dtype")
    error_of(put(client, "bob", save({"model.layers.0.something": np.zeros(3, np.float32)})), 400, "unsupported")
    nan = weights(engine, 3)
    next(iter(nan.modules.values()))[0][0, 0] = np.nan
    error_of(put(client, "bob", to_safetensors_bytes(nan)), 400, "nan")
    error_of(put(client, "bob", b"definitely not safetensors"), 400, "safetensors")
    r = client.put("/v1/adapters/bob", content=b"{}", headers={"Content-Type": "application/json"})
    error_of(r, 415, "octet-stream")
    good = to_safetensors_bytes(weights(engine, 4))
    for name in ("a..b", "x%2F..%2Fy", "a%2Fb", ".hidden", "tiny"):
        error_of(put(client, name, good), 400, name.replace("%2F", "/") if name != "tiny" else "base model")
    error_of(put(client, "bob", good, scale="huge"), 400, "scale")
    assert "bob" not in [m["id"] for m in client.get("/v1/models").json()["data"]]



def write_mlx(folder, w: AdapterWeights):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, (a, b) in w.modules.items():
        tensors[f"{path}.lora_a"], tensors[f"{path}.lora_b"] = a, b
    save_file(tensors, str(folder / "adapters.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": "lora", "lora_parameters": {"rank": 8, "scale": w.scale}}))


def test_load_lora_adapter_from_folders_inside_root(client, engine, root):
    w = weights(engine, 5)
    write_peft(root / "peft", w)
    write_mlx(root / "mlx", w)
    put(client, "uploaded", to_safetensors_bytes(w))
    want = complete(client, model="uploaded")["choices"][0]["text"]
    for name, path in (("from-peft", "peft"), ("from-mlx", str(root / "mlx"))):
        r = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        assert r.status_code == 200 and r.json()["version"] == 1, r.text
        assert complete(client, model=name)["choices"][0]["text"] == want
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["from-peft"]["root"] == str((root / "peft").resolve())
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "from-peft"}).status_code == 200
    error_of(client.post("/v1/completions", json={"model": "from-peft", "prompt": "x"}), 404)
    error_of(client.post("/v1/unload_lora_adapter", json={"lora_name": "from-peft"}), 404)
    for name in ("from-mlx", "uploaded"):
        client.delete(f"/v1/adapters/{name}")


def test_load_lora_adapter_rejects_paths_outside_root(client, engine, root, tmp_path):
    write_peft(tmp_path / "outside", weights(engine, 6))
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "empty").mkdir()
    load = lambda path, name="evil": client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    error_of(load(str(tmp_path / "outside")), 403, "outside")
    error_of(load("../" + tmp_path.name), 403, "outside")
    error_of(load("escape"), 403, "outside")
    error_of(load("missing"), 400, "not a folder")
    error_of(load("a\x00b"), 400, "NUL")
    error_of(load("empty"), 400, "adapter_config.json")
    error_of(load("empty", name="../evil"), 400, "invalid adapter name")
    assert "evil" not in [m["id"] for m in client.get("/v1/models").json()["data"]]


def test_load_lora_adapter_needs_adapter_root(engine):
    with TestClient(create_app(engine)) as c:
        error_of(c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/tmp"}), 403, "--adapter-root")


# ------------------------------------------------------------------ auth and health
def test_api_key_guards_every_route_but_health(engine):
    app = create_app(engine, api_key=KEY)
    checked = 0
    with TestClient(app) as c:
        for route in app.routes:
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            for method in sorted(getattr(route, "methods", None) or {"GET"}):
                r = c.request(method, path)
                assert r.status_code == (200 if route.path == "/health" else 401), (method, path, r.text)
                checked += 1
        assert checked >= 12 and {"/docs", "/openapi.json", "/v1/adapters/{name:path}"} <= {r.path for r in app.routes}
        error_of(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "api key")
        error_of(c.get("/not-a-route"), 401)
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_dead_engine_gives_503(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=1), name="doomed")

    def crash(*args, **kwargs):
        raise RuntimeError("simulated engine crash")

    eng.scheduler.step = crash  # the next decode step kills the engine thread
    with TestClient(create_app(eng)) as c:
        assert c.get("/health").status_code == 200
        error_of(c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4}), 503, "engine thread died")
        deadline = time.monotonic() + 10
        while eng.health()["alive"] and time.monotonic() < deadline:  # the thread winds down
            time.sleep(0.05)
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "unhealthy" and "simulated" in r.json()["error"]
        error_of(c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4}), 503, "not running")
        error_of(c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4}), 503)
        error_of(put(c, "late", to_safetensors_bytes(weights(eng, 0))), 503)
    eng.close()


# ------------------------------------------------------------------ real HTTP server
def test_official_openai_client_round_trip(base_url):
    import openai

    oai = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in oai.models.list()][0] == "tiny"
    comp = oai.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert comp.choices[0].finish_reason == "length" and comp.usage.completion_tokens == 5
    extra = comp.model_dump()
    assert extra["version_spans"] == [[0, 5, None]] and len(extra["choices"][0]["token_ids"]) == 5
    kw = dict(model="tiny", messages=CHAT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    chat = oai.chat.completions.create(logprobs=True, **kw)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens == 6
    streamed = "".join(ch.choices[0].delta.content or "" for ch in oai.chat.completions.create(stream=True, **kw)
                       if ch.choices)
    assert streamed == chat.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="nobody", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.completions.create(model="tiny", prompt="x", max_tokens=0)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0).models.list()


def test_hot_swap_mid_stream_shows_in_version_spans(base_url, engine):
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=30) as h:
        assert put(h, "swapper", to_safetensors_bytes(weights(engine, 7))).json()["version"] == 1
        body = {"model": "swapper", "prompt": "go", "max_tokens": 300, "stream": True, **GREEDY}
        versions = []
        with h.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    last = json.loads(line[len("data: "):])
                    versions.append(last["adapter_version"])
                    if len(versions) == 3:  # swap while the completion is running
                        assert put(h, "swapper", to_safetensors_bytes(weights(engine, 8))).json()["version"] == 2
        h.delete("/v1/adapters/swapper")
    spans = last["version_spans"]
    assert versions[0] == 1 and versions[-1] == 2 and len(spans) == 2
    assert spans[0][:1] + spans[0][2:] == [0, 1] and spans[1][1:] == [300, 2] and spans[0][1] == spans[1][0]


LONG = {"prompt": "go", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}


def test_stream_disconnect_cancels_generation(base_url, engine, monkeypatch):
    futures = spy_submits(engine, monkeypatch)
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as h:
        with h.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen >= 3:
                    break  # leaving the block closes the connection mid-stream
    done = futures[0].result(timeout=20)
    assert done.finish_reason == "cancelled" and len(done.token_ids) < LONG["max_tokens"]


def test_non_stream_disconnect_cancels_generation(base_url, engine, monkeypatch):
    futures = spy_submits(engine, monkeypatch)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url}/v1/completions", json=LONG, headers={"Authorization": f"Bearer {KEY}"}, timeout=0.5)
    done = futures[0].result(timeout=20)
    assert done.finish_reason == "cancelled" and len(done.token_ids) < LONG["max_tokens"]


def test_oversized_upload_is_refused(engine):
    with TestClient(create_app(engine, max_upload_bytes=1000)) as small:
        data = to_safetensors_bytes(weights(engine, 30))
        assert len(data) > 1000
        error_of(put(small, "big", data), 413, "limit")
        assert "big" not in engine.players()


def test_serve_preloads_adapters_given_on_the_command_line(engine, tmp_path):
    from autocurricula.cli import _adapter_args, build_parser

    folder = write_peft(tmp_path / "alice", weights(engine, seed=7, r=4), r=4, alpha=8)
    args = build_parser().parse_args(["serve", "--model", "m", "--adapter", f"alice={folder}", "--adapter", "bob=x"])
    assert _adapter_args(args.adapter) == {"alice": str(folder), "bob": "x"}
    for bad in (["alice"], ["=x"], ["a=x", "a=y"]):
        with pytest.raises(SystemExit, match="--adapter"):
            _adapter_args(bad)
    try:
        with TestClient(create_app(engine, adapters={"alice-pre": str(folder)})) as c:
            models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
            assert models["alice-pre"]["root"] == str(folder.resolve())
            assert complete(c, "alice-pre")["adapter_version"] == 1
            assert complete(c, "alice-pre")["choices"][0]["text"] != complete(c, None)["choices"][0]["text"]
    finally:
        engine.unload_adapter("alice-pre")
    with pytest.raises(Exception, match="rank"):  # the rank cap holds for preloaded folders too
        create_app(engine, adapters={"wide": str(folder)}, max_lora_rank=2)
