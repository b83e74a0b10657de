"""The in-process server fixtures shared by the server test modules (import them by name)."""

import pytest
from fastapi.testclient import TestClient

from autocurricula.engine import Engine, EngineConfig
from autocurricula.serve.server import create_app


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4), name="tiny")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("adapter-root")


@pytest.fixture(scope="module")
def client(engine, root):
    with TestClient(create_app(engine, adapter_root=str(root), max_tokens_limit=256)) as c:
        yield c
