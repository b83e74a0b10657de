import os

import pytest

# A process-wide OpenBLAS preload slows torch down; the engine tests want it, the torch parity
# tests do not care about speed. Keep whatever the environment says.
os.environ.setdefault("AUTOCURRICULA_BLAS", "auto")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """The built-in tiny llama model (hidden 256, 4 layers, vocab 1024), built once per session."""
    from autocurricula.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_quantized_path(tmp_path_factory):
    """The same tiny model converted with mlx-lm to 4-bit (as `mlx_lm.convert -q` does)."""
    from autocurricula.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-4bit", quantize_bits=4)


@pytest.fixture()
def hub():
    """Route huggingface_hub's HTTP client through a recording mock transport; yields
    (calls, commits) where commits are the decoded NDJSON operations of each commit."""
    import json

    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import _http

    httpx = __import__(type(_http.get_session()).__module__.split(".")[0])
    calls, commits = [], []

    def handler(request):
        calls.append((request.method, request.url.path, dict(request.url.params)))
        path = request.url.path
        if path.endswith("/api/repos/create"):
            return httpx.Response(200, json={"url": "https://hub.test/me/league", "name": "me/league", "id": "1"})
        if "/preupload/" in path:
            files = json.loads(request.content)["files"]
            return httpx.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                       for f in files]})
        if "/commit/" in path:
            commits.append([json.loads(line) for line in request.content.decode().splitlines() if line.strip()])
            return httpx.Response(200, json={"commitUrl": "https://hub.test/me/league/commit/" + "a" * 40,
                                             "commitOid": "a" * 40, "success": True})
        return httpx.Response(200, json={})

    old = _http._GLOBAL_CLIENT_FACTORY
    huggingface_hub.set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(handler)))
    huggingface_hub.close_session()
    yield calls, commits
    huggingface_hub.set_client_factory(old)
    huggingface_hub.close_session()
