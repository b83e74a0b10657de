import os
import sys
from pathlib import Path

import pytest

# A process-wide OpenBLAS preload slows torch down; the engine tests want it, the torch parity
# tests do not care about speed. Keep whatever the environment says.
os.environ.setdefault("AUTOCURRICULA_BLAS", "auto")


def pytest_addoption(parser):
    parser.addoption("--vllm-python", default=None,
                     help="the python of a virtual environment with vLLM (else $AUTOCURRICULA_VLLM_PYTHON): the "
                          "slow tests of tests/test_vllm_server.py start vLLM servers with it; see docs/benchmarks.md")


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


# ---------------------------------------------------------------------- research/ stays out of the default tier
RESEARCH = str(Path(__file__).resolve().parent.parent / "research") + os.sep
_research_seen: list[str] = []  # research/ code run in this process, or research/ scripts started


def _default_tier(config) -> bool:
    """Whether this run deselects the slow tier (pytest's default ``-m 'not slow'``)."""
    markexpr = config.getoption("markexpr", "") or ""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression

        return not Expression.compile(markexpr).evaluate(lambda name, **kwargs: name == "slow")
    except Exception:  # another pytest's internals: read the expression as written
        return "not slow" in markexpr


def _under_research(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and "research" in str(path) \
        and os.path.realpath(path).startswith(RESEARCH)


def _research_audit(event: str, args: tuple) -> None:
    """Notes code compiled from a research/ file being executed (an import, or a script loaded from
    its path) and a process started on a research/ script."""
    try:
        if event == "exec":
            name = getattr(args[0], "co_filename", "")
            if _under_research(name):
                _research_seen.append(name)
        elif event == "subprocess.Popen":
            argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
            _research_seen.extend(f"a process: {a}" for a in argv if _under_research(a))
    except Exception:  # an audit hook must never break what it watches
        pass


def pytest_configure(config):
    if _default_tier(config):
        sys.addaudithook(_research_audit)


def pytest_sessionfinish(session, exitstatus):
    """The default tier never runs research/ (its tests are slow: tests/test_research.py): fail the
    session when it imported, loaded or started anything under research/."""
    if not _default_tier(session.config):
        return
    found = list(dict.fromkeys(_research_seen + [
        f"{name} ({module.__file__})" for name, module in list(sys.modules.items())
        if _under_research(getattr(module, "__file__", None) or "")]))
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = ("the default tier ran research/ code (research scripts are tested in the slow tier only, "
                   "tests/test_research.py): " + "; ".join(found[:5]) + (" ..." if len(found) > 5 else ""))
        if reporter is not None:
            reporter.write_line("")  # after the progress line
            reporter.write_sep("=", message, red=True)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
