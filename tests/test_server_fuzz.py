"""Property-based fuzzing of the server's OpenAPI schema with schemathesis (in-process ASGI, no
network): whatever a client sends, the answer is never a 5xx. The default-tier run is small and
bounded; ``-m slow`` runs a larger one."""

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

import autocurricula  # noqa: E402,F401  (fast BLAS before mlx)
from autocurricula.engine import Engine, EngineConfig  # noqa: E402
from autocurricula.serve.server import create_app  # noqa: E402


@pytest.fixture(scope="module")
def fuzz_engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2), name="tiny")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def api(fuzz_engine, tmp_path_factory):
    # max_tokens_limit keeps each generated completion short; the rest are the server's defaults
    app = create_app(fuzz_engine, adapter_root=str(tmp_path_factory.mktemp("fuzz-root")), max_tokens_limit=8)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api")
COMMON = dict(deadline=20_000, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


def _no_5xx(case, fuzz_engine):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.status_code, response.text)
    assert fuzz_engine.health()["ok"], "a request left the engine unhealthy"


@schema.parametrize()
@settings(max_examples=6, **COMMON)
def test_fuzz_no_5xx(case, fuzz_engine):
    _no_5xx(case, fuzz_engine)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=300, **COMMON)
def test_fuzz_no_5xx_long(case, fuzz_engine):
    _no_5xx(case, fuzz_engine)


# Hand-written strategies reach what schema-driven generation rarely does: integers at the edges of
# int32/int64, NaN and inf, lone surrogates, wrong JSON types and unknown fields.
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EDGES = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**32, 2**63 - 1, 2**63, 2**64, -(2**63)]
VALUES = st.one_of(st.sampled_from(EDGES), st.none(), st.booleans(), st.integers(), st.floats(),
                   st.text(max_size=8), st.sampled_from(["a\ud800b", "\udfff", "yes"]),
                   st.lists(st.integers(-2, 2**31), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                  max_size=2))
FIELDS = ["top_k", "seed", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "logprobs",
          "top_logprobs", "stop", "stream", "ignore_eos", "return_token_ids", "echo", "best_of", "min_tokens",
          "presence_penalty", "frequency_penalty", "logit_bias", "suffix", "user", "response_format", "model",
          "tools", "tool_choice", "stream_options", "wizardry"]
TEXTS = st.one_of(st.just("hello"), st.text(min_size=1, max_size=12), st.sampled_from(["a\ud800b", ""]))
PROMPTS = st.one_of(TEXTS, st.lists(st.integers(-1, 1100), min_size=1, max_size=4), st.lists(TEXTS, max_size=2))
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "user", "system", "assistant", "wizard"]),
                                           "content": TEXTS}), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def fuzz_client(fuzz_engine, tmp_path_factory):
    from fastapi.testclient import TestClient

    app = create_app(fuzz_engine, adapter_root=str(tmp_path_factory.mktemp("fuzz-root-2")), max_tokens_limit=16)
    with TestClient(app) as c:
        yield c


def _hostile(fuzz_client, fuzz_engine, chat, prompt, messages, field, value, extra):
    """A mostly valid body with one or two hostile fields (so that many reach the engine)."""
    import json

    body = {"messages": messages} if chat else {"prompt": prompt}
    body.update({"max_tokens": 4, field: value, **extra})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = fuzz_client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code >= 400:
        assert r.json()["error"]["message"], r.text
    assert fuzz_engine.health()["ok"], f"{body} left the engine unhealthy"


HOSTILE = dict(chat=st.booleans(), prompt=PROMPTS, messages=MESSAGES, field=st.sampled_from(FIELDS), value=VALUES,
               extra=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=1))


@given(**HOSTILE)
@settings(max_examples=150, **COMMON)
def test_hostile_generation_bodies_never_5xx(fuzz_client, fuzz_engine, **kw):
    _hostile(fuzz_client, fuzz_engine, **kw)


@pytest.mark.slow
@given(**HOSTILE)
@settings(max_examples=2000, **COMMON)
def test_hostile_generation_bodies_never_5xx_long(fuzz_client, fuzz_engine, **kw):
    _hostile(fuzz_client, fuzz_engine, **kw)
