"""HTTP client: retries with backoff, error classes, SSE parsing, and a round trip to a real server."""

import asyncio
import json
import time

import httpx
import pytest

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.fleet.client import (AsyncClient, AuthError, BadRequestError, Client, NotFoundError,
                                  PermissionDeniedError, ServerError, UnavailableError)
from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
from autocurricula.engine.adapters import to_safetensors_bytes
from autocurricula.serve.server import create_app
from helpers import running_server

KEY = "client-key"


def err(status, message):
    return httpx.Response(status, json={"error": {"message": message, "type": "x", "param": None, "code": status}})


class Script:
    """A MockTransport handler answering with the given responses (or raising given exceptions) in turn."""

    def __init__(self, *answers):
        self.answers, self.requests = list(answers), []

    def __call__(self, request):
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def sync_client(script, **kw):
    kw.setdefault("backoff", 0.0)
    return Client("http://server", api_key=KEY, transport=httpx.MockTransport(script), **kw)


def test_retries_503_and_connection_errors_with_exponential_backoff(monkeypatch):
    delays = []
    monkeypatch.setattr(time, "sleep", delays.append)
    script = Script(err(503, "busy"), httpx.ConnectError("refused"), httpx.Response(200, json={"data": [{"id": "m"}]}))
    assert sync_client(script, backoff=0.5, max_backoff=0.8).models() == [{"id": "m"}]
    assert len(script.requests) == 3 and delays == [0.5, 0.8]
    assert script.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_gives_up_after_max_retries():
    script = Script(*[err(503, "engine thread died")] * 3)
    with pytest.raises(UnavailableError, match="engine thread died") as info:
        sync_client(script, max_retries=2).completions("x")
    assert info.value.status == 503 and len(script.requests) == 3
    script = Script(*[httpx.ConnectError("refused")] * 2)
    with pytest.raises(UnavailableError, match="cannot reach http://server") as info:
        sync_client(script, max_retries=1).health()  # health is never retried
    assert info.value.status is None and len(script.requests) == 1


@pytest.mark.parametrize("status,cls", [(400, BadRequestError), (401, AuthError), (403, PermissionDeniedError),
                                        (404, NotFoundError), (415, BadRequestError), (500, ServerError)])
def test_errors_carry_the_server_message_and_are_not_retried(status, cls):
    script = Script(err(status, f"problem {status}: do this instead"))
    with pytest.raises(cls, match=f"problem {status}") as info:
        sync_client(script).chat([{"role": "user", "content": "hi"}])
    assert info.value.status == status and info.value.body["error"]["code"] == status and len(script.requests) == 1


def test_timeouts_are_server_errors_and_names_are_quoted():
    script = Script(httpx.ReadTimeout("slow"))
    with pytest.raises(ServerError, match="ReadTimeout") as info:
        sync_client(script).adapter_info("a/b")
    assert info.value.status is None and len(script.requests) == 1
    assert script.requests[0].url.raw_path == b"/v1/adapters/a%2Fb"


def test_health_returns_the_unhealthy_body():
    script = Script(httpx.Response(503, json={"status": "unhealthy", "ok": False}))
    assert sync_client(script).health()["status"] == "unhealthy"


def test_upload_sends_safetensors_bytes():
    spec = LoraSpec(r=2, lora_alpha=4, target_modules=["q_proj"])
    w = AdapterWeights.random({"model.layers.0.self_attn.q_proj": (8, 8)}, spec)
    script = Script(httpx.Response(200, json={"name": "p", "version": 1}))
    assert sync_client(script).upload_adapter("p", w, scale=0.5) == {"name": "p", "version": 1}
    (req,) = script.requests
    assert (req.method, req.url.path, req.url.params["scale"]) == ("PUT", "/v1/adapters/p", "0.5")
    assert req.headers["content-type"] == "application/octet-stream" and req.content == to_safetensors_bytes(w)


def _sse(*objs, done=True):
    text = "".join(f"data: {json.dumps(o)}\n\n" for o in objs) + ("data: [DONE]\n\n" if done else "")
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


def test_stream_parsing_and_in_band_errors():
    chunks = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}]
    assert list(sync_client(Script(_sse(*chunks))).stream_completions("x")) == chunks
    failing = Script(_sse(chunks[0], {"error": {"message": "engine thread died", "code": 503}}, done=False))
    with pytest.raises(UnavailableError, match="engine thread died"):
        list(sync_client(failing).stream_chat([{"role": "user", "content": "x"}]))
    with pytest.raises(NotFoundError, match="nobody"):
        list(sync_client(Script(err(404, "unknown player 'nobody'"))).stream_completions("x", model="nobody"))


def test_async_client_retries_and_raises():
    async def main():
        script = Script(err(503, "busy"), httpx.Response(200, json={"choices": [{"text": "hi"}]}))
        async with AsyncClient("http://server", transport=httpx.MockTransport(script), backoff=0) as c:
            assert (await c.completions("x"))["choices"][0]["text"] == "hi"
            assert len(script.requests) == 2
        async with AsyncClient("http://server", transport=httpx.MockTransport(Script(_sse({"n": 1}))), backoff=0) as c:
            assert [ch async for ch in c.stream_chat([{"role": "user", "content": "x"}])] == [{"n": 1}]
        async with AsyncClient("http://server", transport=httpx.MockTransport(Script(err(400, "bad top_p"))),
                               backoff=0) as c:
            with pytest.raises(BadRequestError, match="top_p"):
                await c.completions("x", top_p=0)

    asyncio.run(main())


# ------------------------------------------------------------------ against a real server

@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2), name="tiny")
    root = tmp_path_factory.mktemp("client-adapters")
    with running_server(create_app(eng, api_key=KEY, adapter_root=str(root))) as url:
        yield eng, url
    eng.close()


def test_sync_round_trip(served, tmp_path):
    eng, url = served
    spec = LoraSpec(r=4, lora_alpha=8)
    dims = {p: eng.linear_dims[p] for p in spec.resolve(eng.linear_dims)}
    with Client(url, api_key=KEY, backoff=0) as c:
        assert c.health()["status"] == "ok"
        assert c.upload_adapter("p", AdapterWeights.random(dims, spec, seed=1, b_std=0.5))["version"] == 1
        assert c.upload_adapter("p", to_safetensors_bytes(AdapterWeights.random(dims, spec, seed=2)))["version"] == 2
        assert c.adapter_info("p")["version"] == 2 and [m["id"] for m in c.models()] == ["tiny", "p"]
        out = c.completions("the game", model="p", max_tokens=4, temperature=0)
        assert out["adapter_version"] == 2 and out["usage"]["completion_tokens"] <= 4
        kw = dict(model="p", max_tokens=6, temperature=0, ignore_eos=True)
        whole = c.chat([{"role": "user", "content": "hi"}], **kw)["choices"][0]["message"]["content"]
        chunks = list(c.stream_chat([{"role": "user", "content": "hi"}], **kw))
        assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks) == whole
        with pytest.raises(PermissionDeniedError, match="outside"):
            c.load_adapter("q", tmp_path)
        c.unload_adapter("p")
        with pytest.raises(NotFoundError, match="unknown player"):
            c.completions("x", model="p")
        with pytest.raises(BadRequestError, match="max_tokens"):
            c.completions("x", max_tokens=0)
    with pytest.raises(AuthError), Client(url, api_key="wrong") as bad:
        bad.models()


def test_async_round_trip(served):
    eng, url = served

    async def main():
        async with AsyncClient(url, api_key=KEY) as c:
            kw = dict(max_tokens=5, temperature=0, ignore_eos=True)
            whole = (await c.completions("hello", **kw))["choices"][0]["text"]
            chunks = [ch async for ch in c.stream_completions("hello", **kw)]
            assert "".join(ch["choices"][0]["text"] for ch in chunks) == whole
            assert chunks[-1]["usage"]["completion_tokens"] == 5
            many = await asyncio.gather(*(c.completions(f"prompt {i}", **kw) for i in range(6)))
            assert all(m["usage"]["completion_tokens"] == 5 for m in many)

    asyncio.run(main())
