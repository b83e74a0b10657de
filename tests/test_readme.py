"""Every Python snippet in the README runs (server snippets against a real `autocurricula serve`)."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- readme-test: (\w+) -->\s*)?```python\n(.*?)```", re.S)
BLOCKS = [(m.group(2) or "plain", m.group(3)) for m in BLOCK.finditer((ROOT / "README.md").read_text())]
MODEL = "/tmp/autocurricula-readme/tiny-llama"  # the path the snippets use


def run_snippet(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, f"snippet failed:\n{code}\n--- stderr ---\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def server():
    from autocurricula.tiny import build_tiny_model

    build_tiny_model(MODEL)
    try:
        httpx.get("http://127.0.0.1:8000/health", timeout=1)
        pytest.fail("port 8000 is already in use; the README snippets talk to 127.0.0.1:8000")
    except httpx.TransportError:
        pass
    proc = subprocess.Popen([sys.executable, "-m", "autocurricula.cli", "serve", "--model", MODEL, "--port", "8000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ})
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get("http://127.0.0.1:8000/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    yield proc
    proc.terminate()
    proc.wait(30)


def test_readme_has_snippets():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", [i for i, (kind, _) in enumerate(BLOCKS) if kind == "skip"])
def test_skipped_snippet_compiles(index):
    compile(BLOCKS[index][1], "README.md", "exec")  # needs the network to run; syntax checked here


@pytest.mark.parametrize("index", [i for i, (kind, _) in enumerate(BLOCKS) if kind == "plain"])
def test_plain_snippet_runs(index):
    assert run_snippet(BLOCKS[index][1]).strip()


@pytest.mark.parametrize("index", [i for i, (kind, _) in enumerate(BLOCKS) if kind == "server"])
def test_server_snippet_runs(index, server):
    assert run_snippet(BLOCKS[index][1]).strip()


def test_cli_env_reports_blas():
    out = subprocess.run([sys.executable, "-m", "autocurricula.cli", "env", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and '"blas"' in out.stdout
