"""Every Python snippet in the README and docs/ runs and prints what its `expect` comments say.

A snippet is a ```python block, optionally preceded by HTML comments:
- `<!-- readme-test: KIND -->`: `plain` (default: run it), `server` (run it against a real
  `autocurricula serve` on a free loopback port, substituted for 8000), `headline` (run it with the
  Hub download answered by the tiny model and a small config), `skip` (needs the network or a
  token: only compiled);
- `<!-- expect: REGEX -->` (one or more): the snippet's stdout must match each. Every snippet that
  runs must have at least one.
"""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"((?:<!--[^\n]*?-->[ \t]*\n)*)```python\n(.*?)```", re.S)
MODEL = "/tmp/autocurricula-readme/tiny-llama"  # the path the snippets use


def parse(path: Path) -> list[dict]:
    out = []
    for m in BLOCK.finditer(path.read_text()):
        comments = m.group(1)
        kind = re.search(r"readme-test: (\w+)", comments)
        out.append({"where": f"{path.relative_to(ROOT)}:{path.read_text()[:m.start()].count(chr(10)) + 1}",
                    "kind": kind.group(1) if kind else "plain", "code": m.group(2),
                    "expect": re.findall(r"<!-- expect: (.*?) -->", comments)})
    return out


SNIPPETS = [s for p in DOCS for s in parse(p)]


def ids(kind):
    return [s["where"] for s in SNIPPETS if s["kind"] == kind]


def of(kind):
    return [s for s in SNIPPETS if s["kind"] == kind]


def run_snippet(code: str, env: dict | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, f"snippet failed:\n{code}\n--- stderr ---\n{out.stderr[-3000:]}"
    return out.stdout


def check(snippet: dict, stdout: str) -> None:
    assert snippet["expect"], f"{snippet['where']}: add <!-- expect: REGEX --> saying what the snippet prints"
    for pattern in snippet["expect"]:
        assert re.search(pattern, stdout, re.M), f"{snippet['where']}: {pattern!r} not in:\n{stdout[-2000:]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    from autocurricula.engine.tiny import build_tiny_model

    build_tiny_model(MODEL)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autocurricula.cli", "serve", "--model", MODEL, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    yield port
    proc.terminate()
    proc.wait(30)


def test_docs_have_snippets_of_every_kind():
    assert len(of("plain")) >= 5 and of("server") and of("headline") and of("skip")


def test_the_checker_rejects_a_wrong_expectation():
    with pytest.raises(AssertionError):
        check({"where": "x", "expect": ["^leaderboard$"]}, "something else\n")
    with pytest.raises(AssertionError):
        check({"where": "x", "expect": []}, "anything\n")


@pytest.mark.parametrize("snippet", of("skip"), ids=ids("skip"))
def test_skipped_snippet_compiles(snippet):
    compile(snippet["code"], snippet["where"], "exec")  # needs the network or a token to run


@pytest.mark.parametrize("snippet", of("plain"), ids=ids("plain"))
def test_plain_snippet_prints_what_it_says(snippet):
    check(snippet, run_snippet(snippet["code"]))


@pytest.mark.parametrize("snippet", of("server"), ids=ids("server"))
def test_server_snippet_prints_what_it_says(snippet, server):
    check(snippet, run_snippet(snippet["code"].replace("127.0.0.1:8000", f"127.0.0.1:{server}")))


# The headline snippet names a Hub id and the default config. Here the Hub download (mlx-lm's
# snapshot_download) answers with the tiny model, and the league is made small; the rest is the
# code path a user runs.
HEADLINE_PRELUDE = """
import functools, tempfile
import mlx_lm.utils
from autocurricula.leagues import LeagueConfig, LeagueTrainer
from autocurricula.engine.tiny import build_tiny_model

_tiny = str(build_tiny_model({model!r}))
_real = mlx_lm.utils.snapshot_download
mlx_lm.utils.snapshot_download = lambda repo, **kw: _tiny if repo == {repo!r} else _real(repo, **kw)
LeagueTrainer.config_class = functools.partial(
    LeagueConfig, epochs=1, rounds=1, max_tokens=2, progress=False,
    rules={{"games_per_learner": 4, "main_exploiters": 1, "league_exploiters": 0}}, ratings={{"bt_bootstrap": 0}},
    output_dir=tempfile.mkdtemp(prefix="autocurricula-headline-"))
"""


@pytest.mark.parametrize("snippet", of("headline"), ids=ids("headline"))
def test_headline_snippet_runs_through_the_hub_code_path(snippet):
    repo = re.search(r'train\("([^"]+)"', snippet["code"]).group(1)
    assert not Path(repo).exists(), "the headline names a Hub id"
    prelude = HEADLINE_PRELUDE.format(model=MODEL, repo=repo)
    check(snippet, run_snippet(prelude + snippet["code"]))


def test_cli_env_reports_blas():
    out = subprocess.run([sys.executable, "-m", "autocurricula.cli", "env", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and '"blas"' in out.stdout
