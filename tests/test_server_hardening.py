"""Server hardening: hostile and careless inputs get a 4xx naming the problem, and one bad
request never takes the engine (or other requests) down."""

import json
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.fleet.client import Client
from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
from autocurricula.engine.adapters import to_safetensors_bytes
from autocurricula.engine.scheduler import RequestError
from autocurricula.serve.server import create_app
from helpers import running_server, write_peft
from server_fixtures import client, engine, root  # noqa: F401  (shared fixtures)

GREEDY = {"temperature": 0, "ignore_eos": True}
CHAT = [{"role": "user", "content": "who wins?"}]


def weights(engine, seed=0, r=8, b_std=0.5):
    spec = LoraSpec(r=r, lora_alpha=2 * r)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=b_std)


def put(client, name, data, **params):
    return client.put(f"/v1/adapters/{name}", content=data, params=params,
                      headers={"Content-Type": "application/octet-stream"})


def error_of(resp, status, *words):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == status
    for w in words:
        assert w.lower() in err["message"].lower(), err["message"]
    return err


def still_serves(client):
    r = client.post("/v1/completions", json={"prompt": "the player wins", "max_tokens": 4, **GREEDY})
    assert r.status_code == 200, r.text
    assert client.get("/health").json()["status"] == "ok"


# ------------------------------------------------------------------ 1. bounded integers, robust engine
@pytest.mark.parametrize("field,value", [("top_k", 2**31), ("top_k", -2), ("seed", 2**63), ("max_tokens", 2**31),
                                         ("n", 2**64), ("logprobs", 2**31), ("min_tokens", 2**40)])
def test_out_of_range_integers_are_400_and_the_engine_survives(client, field, value):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, field: value})
    err = error_of(r, 400, field)
    assert "less than or equal" in err["message"] or "greater than or equal" in err["message"]
    still_serves(client)


def test_top_k_two_to_the_31_does_not_kill_the_engine(client):
    error_of(client.post("/v1/completions", json={"prompt": "x", "top_k": 2**31}), 400, "top_k")
    error_of(client.post("/v1/chat/completions", json={"messages": CHAT, "top_k": 2**31}), 400, "top_k")
    still_serves(client)


@pytest.mark.parametrize("kw", [dict(top_k=2**31), dict(max_tokens=2**31), dict(seed=2**63), dict(top_k=True),
                                dict(max_tokens=True), dict(temperature=True), dict(ignore_eos="yes")])
def test_sampling_params_bound_every_field(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kw)


def test_a_request_failing_in_sampling_fails_alone(engine):
    bad = SamplingParams(max_tokens=4, temperature=1.0, top_k=5)
    bad.top_k = 2**31  # past validation, as a bug elsewhere might: np.int32 overflows in the sampler
    good = SamplingParams(max_tokens=6, **GREEDY)
    running = engine.submit("a long running neighbour", params=SamplingParams(max_tokens=40, **GREEDY))
    futures = [engine.submit("hello", params=good), engine.submit("hello", params=bad),
               engine.submit("hello", params=good)]
    with pytest.raises(RequestError, match="OverflowError|out of bounds|int32"):
        futures[1].result(timeout=60)
    assert [f.result(timeout=60).finish_reason for f in (futures[0], futures[2])] == ["length", "length"]
    assert futures[0].result().token_ids == futures[2].result().token_ids
    assert running.result(timeout=60).finish_reason == "length"
    assert engine.health()["ok"] and engine.generate("again", max_tokens=3, **GREEDY).finish_reason == "length"
    assert engine.stats["failed"] >= 1


def test_a_failing_decode_step_fails_its_rows_and_the_engine_goes_on(engine, monkeypatch):
    import autocurricula.engine.runner as runner

    real, calls = runner.decode_step, []

    def flaky(eng, rows):
        calls.append(len(rows))
        if len(calls) == 2:
            raise RuntimeError("simulated kernel failure")
        return real(eng, rows)

    monkeypatch.setattr(runner, "decode_step", flaky)
    with pytest.raises(RequestError, match="simulated kernel failure"):
        engine.generate("x", max_tokens=8, **GREEDY)
    monkeypatch.setattr(runner, "decode_step", real)
    assert engine.health()["ok"] and engine.generate("x", max_tokens=3, **GREEDY).finish_reason == "length"


def test_http_answers_500_for_the_failing_request_only(client, engine, monkeypatch):
    real = engine.submit

    def sabotage(prompt, player=None, params=None, **kw):
        if prompt == "sabotage":
            params.top_k = 2**31
        return real(prompt, player, params, **kw)

    monkeypatch.setattr(engine, "submit", sabotage)
    error_of(client.post("/v1/completions", json={"prompt": "sabotage", "max_tokens": 3, "top_k": 3}),
             500, "failed", "other requests")
    with client.stream("POST", "/v1/completions", json={"prompt": "sabotage", "max_tokens": 3, "top_k": 3,
                                                        "stream": True}) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert events[-1]["error"]["code"] == 500
    still_serves(client)


# ------------------------------------------------------------------ 2. size limits before work
def test_request_body_limit_is_413_before_parsing(engine):
    with TestClient(create_app(engine, max_request_bytes=1 << 20)) as c:
        big = json.dumps({"prompt": "a " * (1 << 20), "max_tokens": 2}).encode()
        error_of(c.post("/v1/completions", content=big, headers={"Content-Type": "application/json"}), 413,
                 "--max-request-bytes")

        def chunks():  # no Content-Length: the bytes are counted as they arrive
            for _ in range(20):
                yield b" " * (100 << 10)

        error_of(c.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}), 413)
        still_serves(c)


def test_default_body_limit_is_a_few_megabytes(engine):
    with TestClient(create_app(engine)) as c:
        body = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'
        error_of(c.post("/v1/completions", content=body, headers={"Content-Type": "application/json"}), 413)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_over_long_prompt_is_refused_without_tokenizing_it(client, route):
    text = "a " * 1_500_000  # 3 MB: tokenizing it all takes seconds
    body = {"prompt": text} if route == "/v1/completions" else {"messages": [{"role": "user", "content": text}]}
    start = time.monotonic()
    error_of(client.post(route, json={**body, "max_tokens": 2}), 400, "context", "shorten")
    assert time.monotonic() - start < 2.0
    # between 4x the context in characters and the hard cap: only a prefix is tokenized
    start = time.monotonic()
    error_of(client.post("/v1/completions", json={"prompt": "a " * 12_000, "max_tokens": 2}), 400, "context")
    assert time.monotonic() - start < 2.0
    still_serves(client)


# ------------------------------------------------------------------ 3. rank limit, and stacks that shrink
def test_max_lora_rank_on_upload_and_folder(engine, root):
    with TestClient(create_app(engine, adapter_root=str(root), max_lora_rank=16)) as c:
        error_of(put(c, "wide", to_safetensors_bytes(weights(engine, 1, r=32))), 400, "rank 32", "--max-lora-rank")
        write_peft(root / "wide", weights(engine, 1, r=32), r=32, alpha=64)
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": "wide"})
        error_of(r, 400, "rank 32", "limit of 16")
        assert put(c, "narrow", to_safetensors_bytes(weights(engine, 1, r=16))).status_code == 200
        assert "wide" not in engine.players()
        c.delete("/v1/adapters/narrow")
    with TestClient(create_app(engine)) as c:  # the default limit is vLLM's 64
        error_of(put(c, "wide", to_safetensors_bytes(weights(engine, 1, r=65))), 400, "limit of 64")


def test_stacks_shrink_when_the_widest_adapter_leaves(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2), name="tiny")
    try:
        with TestClient(create_app(eng, max_lora_rank=128)) as c:
            assert put(c, "keep", to_safetensors_bytes(weights(eng, 1, r=4))).status_code == 200
            before = c.post("/v1/completions", json={"model": "keep", "prompt": "go", "max_tokens": 6, **GREEDY})
            layer = next(iter(eng.lora.layers.values()))
            assert eng.lora.rank == 8 and layer.lora_a.shape[-1] == 8  # initial_rank
            assert put(c, "big", to_safetensors_bytes(weights(eng, 2, r=128))).status_code == 200
            assert eng.lora.rank == 128 and layer.lora_a.shape[-1] == 128
            big_a = layer.lora_a
            assert c.delete("/v1/adapters/big").status_code == 200
            assert eng.lora.rank == 8
            for lay in eng.lora.layers.values():  # every stack replaced by a smaller array
                assert lay.lora_a.shape[-1] == 8 and lay.lora_b.shape[1] == 8
            assert layer.lora_a is not big_a and layer.lora_a.nbytes * 16 == big_a.nbytes
            after = c.post("/v1/completions", json={"model": "keep", "prompt": "go", "max_tokens": 6, **GREEDY})
            assert after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
            # a hot swap that replaces the widest adapter shrinks too
            assert put(c, "big", to_safetensors_bytes(weights(eng, 2, r=128))).status_code == 200
            assert put(c, "big", to_safetensors_bytes(weights(eng, 3, r=16))).status_code == 200
            assert eng.lora.rank == 16 and layer.lora_a.shape[-1] == 16
    finally:
        eng.close()


# ------------------------------------------------------------------ 4. 4xx, not 500
def post_ascii(client, path, body):
    # json.dumps escapes a lone surrogate as \\ud800, as a JavaScript client would send it
    return client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})


def test_lone_surrogates_are_400(client, root):
    error_of(post_ascii(client, "/v1/completions", {"prompt": "a\ud800b", "max_tokens": 2}), 400, "surrogate")
    error_of(post_ascii(client, "/v1/completions", {"prompt": ["a\udfffb"], "max_tokens": 2}), 400, "surrogate")
    bad_chat = [{"role": "user", "content": "a\ud800b"}]
    error_of(post_ascii(client, "/v1/chat/completions", {"messages": bad_chat}), 400, "surrogate")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a\ud800b"}]}]
    error_of(post_ascii(client, "/v1/chat/completions", {"messages": parts}), 400, "surrogate")
    error_of(post_ascii(client, "/v1/completions", {"prompt": "x", "model": "\ud800"}), 400, "surrogate")
    error_of(post_ascii(client, "/v1/completions", {"prompt": "x", "stop": ["\ud800"]}), 400, "surrogate")
    r = post_ascii(client, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "\ud800"})
    error_of(r, 400, "surrogate")
    still_serves(client)


def _header_file(header: dict | bytes, body: bytes = b"\0" * 16) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


KEY_A = "model.layers.0.self_attn.q_proj.lora_a"
HOSTILE = {
    "huge shape": _header_file({KEY_A: {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 16]}}),
    "wrapping shape": _header_file({KEY_A: {"dtype": "F32", "shape": [2**32, 2**32, 4], "data_offsets": [0, 0]}}),
    "negative shape": _header_file({KEY_A: {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}}),
    "float shape": _header_file({KEY_A: {"dtype": "F32", "shape": [2.0, 2.0], "data_offsets": [0, 16]}}),
    "deep nesting": _header_file(b"[" * 100_000 + b"]" * 100_000),
    "deep in entry": _header_file(b'{"k": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "bad metadata": _header_file({"__metadata__": ["x"]}),
    "one-d tensor": save({KEY_A: np.zeros(4, np.float32), KEY_A[:-1] + "b": np.zeros(4, np.float32)}),
    "rank zero": save({KEY_A: np.zeros((256, 0), np.float32), KEY_A[:-1] + "b": np.zeros((0, 256), np.float32)}),
    "scalar": save({KEY_A: np.zeros((), np.float32), KEY_A[:-1] + "b": np.zeros((), np.float32)}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_safetensors_are_400(client, case):
    error_of(put(client, "hostile", HOSTILE[case]), 400)
    assert "hostile" not in [m["id"] for m in client.get("/v1/models").json()["data"]]


CONFIGS = {"list": "[1, 2]", "string": '"LORA"', "null": "null", "deep": "[" * 100_000, "not json": "{not json",
           "alpha list": '{"lora_alpha": [1]}', "alpha nan": '{"r": 8, "lora_alpha": NaN}',
           "alpha 1e39": '{"lora_alpha": 1e39}', "alpha text": '{"lora_alpha": "lots"}'}


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_broken_adapter_config_is_400(client, engine, root, config):
    folder = write_peft(root / "broken", weights(engine, 2))
    (folder / "adapter_config.json").write_text(config)
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "broken", "lora_path": "broken"})
    error_of(r, 400)
    assert "broken" not in [m["id"] for m in client.get("/v1/models").json()["data"]]


@pytest.mark.parametrize("raw,words", [(b'{"prompt": "caf\xe9"}', ("utf-8",)),
                                       (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ("nested",)),
                                       (b"[" * 100_000, ("nested",))], ids=["utf8", "deep-field", "deep-body"])
def test_unparseable_bodies_say_what_to_send(client, raw, words):
    r = client.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    err = error_of(r, 400, *words)
    assert "error parsing the body" not in err["message"] and "send" in err["message"]


# ------------------------------------------------------------------ 5. finiteness in float32
def test_non_finite_in_float32_is_refused(client, engine, root):
    good = to_safetensors_bytes(weights(engine, 3))
    for scale in ("1e39", "-1e39", "nan", "inf"):
        error_of(put(client, "inf", good, scale=scale), 400, "scale", "float32")
    meta_nan = save({k: v for k, v in _mlx_tensors(weights(engine, 3)).items()}, metadata={"lora_alpha": "NaN"})
    error_of(put(client, "inf", meta_nan), 400, "lora_alpha")
    meta_big = save(_mlx_tensors(weights(engine, 3)), metadata={"scale": "1e39"})
    error_of(put(client, "inf", meta_big), 400, "scale")
    wide = {k: v.astype(np.float64) for k, v in _mlx_tensors(weights(engine, 3)).items()}
    next(v for k, v in wide.items() if k.endswith("lora_b"))[0, 0] = 1e39  # finite in float64, inf in float32
    error_of(put(client, "inf", save(wide)), 400, "nan or inf")
    error_of(put(client, "inf", good, scale="3e38"), 400, "overflows float32")  # b x scale
    write_peft(root / "alpha-nan", weights(engine, 3), alpha=float("nan"))
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "inf", "lora_path": "alpha-nan"})
    error_of(r, 400, "lora_alpha")
    assert "inf" not in engine.players()


def _mlx_tensors(w):
    out = {}
    for path, (a, b) in w.modules.items():
        out[f"{path}.lora_a"], out[f"{path}.lora_b"] = a, b
    return out


# ------------------------------------------------------------------ 6. symlinked files out of the root
def test_symlinked_files_out_of_the_root_are_refused(client, engine, root, tmp_path):
    outside = write_peft(tmp_path / "secret", weights(engine, 4))
    inside = root / "looks-innocent"
    inside.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (inside / name).symlink_to(outside / name)
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "sneaky", "lora_path": "looks-innocent"})
    error_of(r, 403, "outside the adapter root")
    mixed = root / "half-linked"  # a real config, linked weights
    mixed.mkdir()
    (mixed / "adapter_config.json").write_text((outside / "adapter_config.json").read_text())
    (mixed / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "sneaky", "lora_path": "half-linked"})
    error_of(r, 403, "adapter_model.safetensors")
    assert "sneaky" not in engine.players()
    # links that stay inside the root are fine
    own = write_peft(root / "real", weights(engine, 4))
    linked = root / "linked-inside"
    linked.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (linked / name).symlink_to(own / name)
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "fine", "lora_path": "linked-inside"})
    assert r.status_code == 200, r.text
    client.delete("/v1/adapters/fine")


# ------------------------------------------------------------------ 7. strict types, no silent fields
STRICT = [
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "tool_calls"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"messages": CHAT, "functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": True}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 4.0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "x", "logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "temperature": "0"}, "temperature"),
    ("/v1/completions", {"prompt": "x", "ignore_eos": 1}, "ignore_eos"),
    ("/v1/completions", {"prompt": [1, True]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "min_p": 0.1}, "min_p"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 1.0}, "frequency_penalty"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 10}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "suffix": "end"}, "suffix"),
    ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "b", "base_model_name": "c"}, "base_model_name"),
]


@pytest.mark.parametrize("path,body,field", STRICT, ids=[f"{s[0][4:]}-{s[2]}" for s in STRICT])
def test_unimplemented_or_mistyped_fields_are_named(client, path, body, field):
    error_of(client.post(path, json=body), 400, field)


def test_harmless_openai_fields_and_neutral_values_pass(client):
    body = {"prompt": "x", "max_tokens": 2, "user": "u-1", "metadata": {"run": "a"}, "store": False,
            "stream_options": {"include_usage": True}, "frequency_penalty": 0, "presence_penalty": 0.0,
            "best_of": 1, "logit_bias": {}, "temperature": 1}
    assert client.post("/v1/completions", json=body).status_code == 200
    chat = {"messages": [{"role": "system", "content": "be brief"}, *CHAT], "max_tokens": 2, "user": "u",
            "tool_choice": "none", "parallel_tool_calls": False}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200


# ------------------------------------------------------------------ 8. keep-alive
def test_serve_passes_keep_alive_and_limits_to_uvicorn(tiny_model_path, monkeypatch):
    import uvicorn

    from autocurricula.cli import build_parser

    args = build_parser().parse_args(["serve", "--model", "m"])
    assert (args.timeout_keep_alive, args.max_lora_rank, args.max_request_bytes) == (75.0, 64, 8 << 20)
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    from autocurricula.cli import main

    main(["serve", "--model", str(tiny_model_path), "--port", "0", "--timeout-keep-alive", "12.5",
          "--max-request-bytes", "1000"])
    assert seen["timeout_keep_alive"] == 12.5 and seen["host"] == "127.0.0.1"
    with TestClient(seen["app"]) as c:
        error_of(c.post("/v1/completions", json={"prompt": "x" * 2000}), 413)
    with pytest.raises(ValueError, match="timeout_keep_alive"):
        from autocurricula.serve.server import serve

        serve(str(tiny_model_path), timeout_keep_alive=0)


@pytest.mark.parametrize("exc", [httpx.ReadError("connection reset by peer"),
                                 httpx.RemoteProtocolError("Server disconnected without sending a response."),
                                 httpx.WriteError("broken pipe")])
def test_client_retries_a_connection_closed_under_it(exc):
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) == 1:
            raise exc
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    with Client("http://server", transport=httpx.MockTransport(handler), backoff=0.0) as c:
        assert c.completions("x")["choices"][0]["text"] == "ok"
    assert len(calls) == 2 and calls[0].content == calls[1].content


def test_keep_alive_shorter_than_client_idle_time_is_absorbed_by_retries(engine):
    """A real server whose keep-alive (0.2 s) is far below httpx's (5 s): requests sent right as the
    server closes idle connections still succeed."""
    with running_server(create_app(engine), timeout_keep_alive=0.2) as url:
        with Client(url, backoff=0.01, max_retries=3, timeout=30) as c:
            for i in range(24):  # bounded: about 5 s
                assert c.completions("go", max_tokens=1)["usage"]["completion_tokens"] == 1
                time.sleep(0.17 + 0.005 * (i % 12))  # around the server's 0.2 s idle close
                assert c.models()[0]["id"] == "tiny"


def test_float32_edge_sampling_values(client, engine):
    # 5e-324 > 0 in float64 but 0 in float32: no token would survive top-p
    error_of(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "top_p": 5e-324}), 400, "top_p")
    # a denormal temperature would turn logits / T into inf and the logprobs into NaN: greedy instead
    assert SamplingParams(temperature=1e-40).temperature == 0.0
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "temperature": 1e-40, "logprobs": 1,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert all(np.isfinite(r.json()["choices"][0]["logprobs"]["token_logprobs"]))
    still_serves(client)
