"""Property-based fuzzing (hypothesis) of adapter uploads and of the dashboard (issue 68, item 7).

1. ``PUT /v1/adapters/{name}`` on the tiny model, in process and on a loopback server: safetensors
   headers with random names, dtypes, shapes and ranks, truncated bodies, header lengths that lie,
   huge declared sizes with tiny bodies, Content-Lengths that lie, random bytes. The answer is a
   2xx or a 4xx JSON error (never a 5xx, never a hang), and the process's RSS stays within
   ``RSS_MARGIN`` of where it started (bodies are small; declared sizes may be huge).
2. The dashboard on a loopback server: ``/files/...`` and ``/adapters/{id}.zip`` with traversal,
   links out of the run, encoded dots and long names never serve a byte from outside the run and
   never answer 5xx; metric rows with hostile values (non-numeric steps, HTML in names) give JSON
   whose points are finite numbers and a page whose inlined data cannot close its script.

Every property is bounded (``max_examples``, ``deadline``); the whole module takes well under two
minutes. Slow tier: run with ``-m slow``."""

from __future__ import annotations

import collections
import contextlib
import gc
import io
import json
import os
import socket
import tempfile
import time
import zipfile
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import autocurricula  # noqa: E402,F401  (fast BLAS before mlx)
from autocurricula.serve.dashboard import create_app as dashboard_app  # noqa: E402
from autocurricula.serve.server import create_app  # noqa: E402
from helpers import running_server  # noqa: E402
from server_fixtures import engine  # noqa: E402,F401  (shared fixture)

pytestmark = pytest.mark.slow

COMMON = dict(derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
RSS_MARGIN = 256 << 20  # what a run of small uploads may leave behind in RSS (allocator slack, caches)
MAX_UPLOAD = 64 << 20
SECRET = b"OUTSIDE-SECRET-7f3a"  # in every file outside the run
NAMES = ["fz0", "fz1", "fz2"]
SEEN = collections.Counter()  # statuses, for the report when run with -s
MESSAGES = collections.Counter()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ============================================================== 1. adapter uploads
DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I32": 4, "U8": 1, "BOOL": 1, "Q4": 1, "": 1}
SUFFIXES = {"mlx": (".lora_a", ".lora_b"), "peft": (".lora_A.weight", ".lora_B.weight")}
HOSTILE_META = st.one_of(st.sampled_from(["nan", "inf", "-1e309", "1e39", "0", "2.0", "", "x"]), st.text(max_size=6))


def one_in(n: int):
    return st.integers(0, n - 1).map(lambda i: i == 0)


@st.composite
def safetensors_bodies(draw, dims: dict[str, tuple[int, int]]) -> bytes:
    """A safetensors-like body: mostly a well-formed adapter header of random layers, dtype and
    rank (honest or random shapes and offsets, data when it is small), then one mutation."""
    paths = draw(st.lists(st.sampled_from(sorted(dims)[:6] * 3 + ["nope.q", "model.layers.99.mlp.up_proj", ""]),
                          min_size=draw(st.sampled_from([0, 1, 1, 1])), max_size=3, unique=True))
    style = draw(st.sampled_from(sorted(SUFFIXES)))
    prefix = "base_model.model." if style == "peft" and draw(st.booleans()) else ""
    r = draw(st.sampled_from([1, 2, 8, 64, 65, 0]))
    dtype = draw(st.sampled_from(["F32", "F16", "BF16", "F64"] * 4 + sorted(DTYPES)))  # floating point most often
    honest = draw(one_in(4)) is False
    header, end = {}, 0
    for path in paths:
        din, dout = dims.get(path, (256, 256))
        shapes = ([r, din], [dout, r]) if style == "peft" else ([din, r], [r, dout])
        for suffix, shape in zip(SUFFIXES[style], shapes):
            if not honest:
                shape = draw(st.one_of(st.just(shape), st.lists(st.integers(0, 1 << 40), max_size=3),
                                       st.lists(st.integers(-2, 300), max_size=3)))
            size = DTYPES[dtype] * int(np.prod(shape, dtype=object) if shape else 1)
            offsets = [end, end + size]
            if not honest and draw(st.booleans()):
                offsets = draw(st.lists(st.integers(-(1 << 40), 1 << 62), min_size=0, max_size=3))
            header[prefix + path + suffix] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
            end += size
        if draw(one_in(8)) and header:  # sometimes one of the pair is missing
            header.pop(next(iter(header)))
    if draw(one_in(4)):
        header["__metadata__"] = {"scale": draw(HOSTILE_META)}
    raw = json.dumps(header).encode()
    data_len = end if 0 <= end <= (2 << 20) else draw(st.integers(0, 4096))  # huge declared: a tiny body
    fill = draw(st.sampled_from(["zeros", "small", "random"]))
    if fill == "zeros":
        data = bytes(data_len)
    elif fill == "small":  # finite float32 values near zero (the bytes of 0.01)
        data = (np.full(data_len // 4, 0.01, np.float32).tobytes() + bytes(data_len % 4))
    else:
        data = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).bytes(data_len)
    body = len(raw).to_bytes(8, "little") + raw + data
    mutation = draw(st.sampled_from(["none"] * 7 + ["truncate", "lie_length", "trailing", "flip", "random",
                                                    "text_header"]))
    if mutation == "truncate":
        body = body[:draw(st.integers(0, len(body)))]
    elif mutation == "lie_length":
        n = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, len(raw) + 64),
                           st.sampled_from([0, 1, 2**63, 2**64 - 1, 4 << 20, (4 << 20) + 1])))
        body = n.to_bytes(8, "little") + body[8:]
    elif mutation == "trailing":
        body += draw(st.binary(min_size=1, max_size=64))
    elif mutation == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([body[i] ^ draw(st.integers(1, 255))]) + body[i + 1:]
    elif mutation == "random":
        body = draw(st.binary(max_size=512))
    elif mutation == "text_header":
        text = draw(st.one_of(st.text(max_size=40), st.sampled_from(['[]', '1', 'null', '{"a": 1}', '{"a": {}}',
                                                                     '{"a":{"dtype":"F32"}}', '{' * 200])))
        raw = text.encode("utf-8", "surrogatepass")
        body = len(raw).to_bytes(8, "little") + raw
    return body


@pytest.fixture(scope="module")
def upload_client(engine, tmp_path_factory):  # noqa: F811
    app = create_app(engine, adapter_root=str(tmp_path_factory.mktemp("fuzz-upload-root")), max_tokens_limit=8,
                     max_upload_bytes=MAX_UPLOAD, body_timeout_s=5.0)
    with TestClient(app) as c:
        yield c


def _json_error(status: int, text: str) -> None:
    assert 400 <= status < 500, (status, text[:500])
    assert json.loads(text)["error"]["message"], text[:500]


def test_fuzzed_uploads_answer_2xx_or_4xx_json_and_keep_memory_bounded(upload_client, engine):  # noqa: F811
    dims = dict(engine.linear_dims)
    c = upload_client

    def put(body: bytes, name: str, scale):
        params = {} if scale is None else {"scale": scale}
        t0 = time.monotonic()
        r = c.put(f"/v1/adapters/{name}", content=body, params=params,
                  headers={"Content-Type": "application/octet-stream"})
        assert time.monotonic() - t0 < 15, "an upload took too long to be answered"
        SEEN[("upload", r.status_code)] += 1
        assert r.status_code < 500, (r.status_code, r.text[:500], body[:300])
        if r.status_code >= 400:
            _json_error(r.status_code, r.text)
            MESSAGES[r.json()["error"]["message"][:60]] += 1
        else:
            assert r.json()["name"] == name and r.json()["version"] >= 1, r.text
        assert engine.health()["ok"], "an upload left the engine unhealthy"

    @given(body=safetensors_bodies(dims), name=st.sampled_from(NAMES),
           scale=st.sampled_from([None] * 6 + ["1.0", "nan", "1e39", "-2", "x"]))
    @settings(max_examples=250, deadline=10_000, **COMMON)
    def prop(body, name, scale):
        put(body, name, scale)

    def clean():
        for name in NAMES:
            c.delete(f"/v1/adapters/{name}")
        gc.collect()

    # warm up: one valid upload installed and deleted, so first-use allocations are not counted
    from autocurricula.engine.adapters import AdapterWeights, LoraSpec, to_safetensors_bytes

    path = sorted(dims)[0]
    put(to_safetensors_bytes(AdapterWeights.random({path: dims[path]}, LoraSpec(r=8, lora_alpha=8), seed=0)),
        NAMES[0], None)
    clean()
    before = rss()
    t0 = time.monotonic()
    prop()
    clean()
    grown = rss() - before
    print(f"\nuploads: {time.monotonic() - t0:.1f} s, RSS {before >> 20} MiB -> +{grown >> 20} MiB, "
          f"statuses {sorted((k[1], v) for k, v in SEEN.items() if k[0] == 'upload')}")
    print(MESSAGES.most_common(12))
    assert grown < RSS_MARGIN, f"RSS grew by {grown >> 20} MiB over the fuzzed uploads (margin {RSS_MARGIN >> 20})"
    assert any(k == ("upload", 200) for k in SEEN), "no generated upload was accepted: the strategy is too hostile"


def _status(raw: bytes) -> int | None:
    if not raw.startswith(b"HTTP/1."):
        return None
    return int(raw.split(b" ", 2)[1])


def _split(raw: bytes) -> tuple[int | None, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return _status(head), body


def _exchange(port: int, data: bytes, close_write: bool, within: float) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=within)
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
            if close_write:
                s.shutdown(socket.SHUT_WR)
        s.settimeout(within)
        out = b""
        with contextlib.suppress(socket.timeout, ConnectionResetError):
            while chunk := s.recv(1 << 16):
                out += chunk
                if b"\r\n\r\n" in out:  # one response is enough: stop at its Content-Length
                    head, _, rest = out.partition(b"\r\n\r\n")
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:") and len(rest) >= int(line.split(b":")[1]):
                            return out
        return out
    finally:
        s.close()


def test_uploads_whose_content_length_lies_are_answered_on_loopback(engine, tmp_path):  # noqa: F811
    """A raw socket sends a Content-Length that may exceed (by up to the limit) the bytes that
    follow, then stalls (the server answers 4xx JSON within the allowance) or half-closes (uvicorn
    drops the connection); afterwards a valid upload still gets a slot and is installed."""
    dims = dict(engine.linear_dims)
    app = create_app(engine, adapter_root=str(tmp_path), max_tokens_limit=8, max_upload_bytes=MAX_UPLOAD,
                     body_timeout_s=1.0)  # the allowance: a stalled upload is dropped after about a second
    with running_server(app) as url:
        port = int(url.rsplit(":", 1)[1])

        @given(body=safetensors_bodies(dims), extra=st.one_of(st.just(0), st.integers(1, 64),
                                                                st.integers(0, 2 * MAX_UPLOAD)),
               close_write=st.booleans(), name=st.sampled_from(NAMES))
        @settings(max_examples=40, deadline=15_000, **COMMON)
        def prop(body, extra, close_write, name):
            head = (f"PUT /v1/adapters/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                    f"Content-Length: {len(body) + extra}\r\n\r\n").encode()
            t0 = time.monotonic()
            raw = _exchange(port, head + body, close_write, within=10.0)
            took = time.monotonic() - t0
            status, text = _split(raw)
            SEEN[("loopback", status)] += 1
            if status is None:  # uvicorn closes a half-closed connection: no answer can come back
                assert close_write, (raw[:300], len(body), extra)
            else:
                assert status < 500, (status, text[:300], extra)
                assert took < 9.0, f"answered after {took:.1f} s"
                if status >= 400:
                    _json_error(status, text.decode(errors="replace"))
            assert engine.health()["ok"]

        t0 = time.monotonic()
        prop()
        print(f"\nloopback uploads: {time.monotonic() - t0:.1f} s, "
              f"statuses {sorted((str(k[1]), v) for k, v in SEEN.items() if k[0] == 'loopback')}")
        from autocurricula.engine.adapters import AdapterWeights, LoraSpec, to_safetensors_bytes

        path = sorted(dims)[0]
        body = to_safetensors_bytes(AdapterWeights.random({path: dims[path]}, LoraSpec(r=8, lora_alpha=8), seed=1))
        head = (f"PUT /v1/adapters/{NAMES[0]} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        status, text = _split(_exchange(port, head + body, False, within=10.0))
        assert status == 200, (status, text[:300])  # no slot or memory was kept by the refused and dropped ones
        for name in NAMES:
            _exchange(port, f"DELETE /v1/adapters/{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), False, 5.0)


# ============================================================== 2. the dashboard
def _plant_run(base: Path) -> Path:
    """A run folder with a checkpoint, and links out of it (and within it) in every place a route reads."""
    outside = base / "outside"
    (outside / "adapters-elsewhere").mkdir(parents=True)
    (outside / "secret.txt").write_bytes(SECRET)
    (outside / "adapters-elsewhere" / "adapter_config.json").write_bytes(SECRET)
    (outside / "metrics.jsonl").write_bytes(SECRET)
    run = base / "run"
    p0 = run / "checkpoint-0" / "adapters" / "p0"
    p0.mkdir(parents=True)
    (p0 / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (p0 / "adapter_model.safetensors").write_bytes(b"weights")
    (p0 / "stolen.txt").symlink_to(outside / "secret.txt")
    (p0 / "inner.txt").symlink_to(p0 / "adapter_config.json")
    (p0 / "..%2fsecret.txt").write_text("a file with an odd name, inside")
    (p0.parent / "p1").symlink_to(outside / "adapters-elsewhere", target_is_directory=True)
    (run / "checkpoint-0" / "players.json").write_text(json.dumps([{"id": "p0", "role": "main"}]))
    (run / "checkpoint-0" / "COMPLETE").write_text("ok\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 0.5}) + "\n")
    (run / "outlink").symlink_to(outside, target_is_directory=True)
    (run / "secret-link.txt").symlink_to(outside / "secret.txt")
    (run / "loop").symlink_to(run / "loop")
    return run


def _inside_contents(run: Path) -> set[bytes]:
    """The bytes of every regular file in the run that is not a link (what the dashboard may serve)."""
    out = set()
    for folder, dirs, files in os.walk(run, followlinks=False):
        for f in files:
            p = Path(folder) / f
            if not p.is_symlink() and p.is_file():
                out.add(p.read_bytes())
    return out


SEGMENTS = st.one_of(
    st.sampled_from(["..", ".", "%2e%2e", "%2E%2E", ".%2e", "%2e.", "..%2f", "..%2F", "%2f", "%5c", "..\\", "~",
                     "checkpoint-0", "adapters", "p0", "p1", "adapter_config.json", "stolen.txt", "inner.txt",
                     "..%252fsecret.txt", "..%2fsecret.txt", "outlink", "secret.txt", "secret-link.txt", "loop",
                     "metrics.jsonl", "outside", "run", "%00", "%ff", "%c0%ae%c0%ae", "COMPLETE", "", "*"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12),
    st.integers(200, 5000).map(lambda n: "a" * n))
VALID = ["checkpoint-0/adapters/p0/adapter_config.json", "checkpoint-0/adapters/p0/adapter_model.safetensors",
         "checkpoint-0/adapters/p0/..%2fsecret.txt", "metrics.jsonl", "checkpoint-0/players.json",
         "checkpoint-0/adapters/p0/stolen.txt", "checkpoint-0/adapters/p1/adapter_config.json", "outlink/secret.txt",
         "checkpoint-0/adapters/p0/../../../outside/secret.txt", "secret-link.txt", "loop/x"]
ENCODED = st.sampled_from(VALID).flatmap(  # each character of a known path percent-encoded or not
    lambda p: st.lists(st.sampled_from([False] * 3 + [True]), min_size=len(p), max_size=len(p))
    .map(lambda enc: "".join(f"%{ord(ch):02X}" if e and ch.isascii() else ch for ch, e in zip(p, enc))))
PATHS = st.one_of(ENCODED, st.tuples(st.sampled_from(["", "/", "%2f", "//", "\\"]), st.lists(SEGMENTS, min_size=1, max_size=6),
                  st.sampled_from(["/", "%2f", "\\", "//"])).map(lambda t: t[0] + t[2].join(t[1])))


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    run = _plant_run(tmp_path_factory.mktemp("fuzz-dashboard"))
    with running_server(dashboard_app(run)) as url:
        yield int(url.rsplit(":", 1)[1]), run


def _target(path: str) -> str:
    """``path`` as a request target: ``%`` sequences and slashes kept as sent, the rest encoded."""
    return quote(path, safe="/%\\.~:@!$&'()*+,;=")


def test_files_and_zips_never_leave_the_run(dashboard):
    port, run = dashboard
    allowed = _inside_contents(run)

    def get(target: str) -> tuple[int | None, bytes]:
        raw = _exchange(port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), False, 10.0)
        assert SECRET not in raw, (target, raw[:300])
        status, body = _split(raw)
        assert status is not None and status < 500, (target, raw[:300])
        return status, body

    @given(path=PATHS, zip_id=st.one_of(PATHS, st.sampled_from(["p0", "p1", "..", "%2e%2e", "p0/..", "p0%2f.."])))
    @settings(max_examples=300, deadline=5_000, **COMMON)
    def prop(path, zip_id):
        status, body = get("/files/" + _target(path))
        SEEN[("files", status)] += 1
        if status == 200:
            assert body in allowed, (path, body[:200])
        elif status in (404, 400, 422):
            if body.startswith(b"{"):
                json.loads(body)
        status, body = get("/adapters/" + _target(zip_id) + ".zip")
        SEEN[("zip", status)] += 1
        if status == 200:
            with zipfile.ZipFile(io.BytesIO(body)) as zf:
                for member in zf.namelist():
                    assert zf.read(member) in allowed, (zip_id, member)

    assert get("/files/checkpoint-0/adapters/p0/adapter_config.json")[0] == 200  # the route does serve the run
    t0 = time.monotonic()
    prop()
    print(f"\ndashboard paths: {time.monotonic() - t0:.1f} s, "
          f"statuses {sorted((k[0], str(k[1]), v) for k, v in SEEN.items() if k[0] in ('files', 'zip'))}")


HTML = st.sampled_from(["<script>alert(1)</script>", "</script><script>alert(1)</script>", "<img src=x onerror=alert(1)>",
                        "\" onmouseover=\"alert(1)", "'><evil>", "&amp;", "\u2028", "\ud800"])
HOSTILE = st.one_of(st.sampled_from([float("nan"), float("inf"), -float("inf"), [float("nan")], {"a": float("inf")}]),
                    st.integers(), st.integers(-2**70, 2**70), st.floats(), st.booleans(), st.none(), HTML,
                    st.text(max_size=10), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                                st.integers(), max_size=2))
KEYS = st.one_of(st.sampled_from(["train/loss", "eval/win_rate", "rating/elo/p0", "epoch"]),
                 st.tuples(st.sampled_from(["train/", "eval/", "rating/elo/", "", "reward/role/", "win_rate/player/",
                                            "loss/role/"]), st.one_of(HTML, st.text(max_size=8)))
                 .map("".join))
ROWS = st.lists(st.one_of(st.dictionaries(KEYS, HOSTILE, max_size=4).flatmap(
    lambda d: HOSTILE.map(lambda step: {"step": step, **d})), st.just("{not json"), st.just("[1, 2]")),
    min_size=1, max_size=6)


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def test_hostile_metric_rows_give_json_data_and_an_escaped_page():
    @given(rows=ROWS)
    @settings(max_examples=150, deadline=5_000, **COMMON)
    def prop(rows):
        with tempfile.TemporaryDirectory() as d:
            lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
            Path(d, "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
            c = TestClient(dashboard_app(d), raise_server_exceptions=False)
            for route in ("/api/curves", "/api/elo", "/api/summary", "/api/leaderboard", "/api/payoff"):
                r = c.get(route)
                SEEN[(route, r.status_code)] += 1
                assert r.status_code == 200, (route, r.status_code, r.text[:300], rows)

                def strict(name):  # JSON.parse in a browser refuses NaN and Infinity
                    raise AssertionError(f"{route} sent {name}: not JSON for the page")
                data = json.loads(r.text, parse_constant=strict)
                if route == "/api/curves":
                    for panel in data["panels"]:
                        for points in panel["series"].values():
                            assert all(_finite_number(s) and _finite_number(v) for s, v in points), points
                if route == "/api/elo":
                    for points in data["series"].values():
                        assert all(_finite_number(s) and _finite_number(v) for s, v in points), points
            page = c.get("/")
            assert page.status_code == 200, page.text[:300]
            script = page.text.split("<script>", 1)[1]
            assert script.count("</script") == 1 and "<evil" not in page.text and "<img" not in script, rows

    t0 = time.monotonic()
    prop()
    print(f"\nmetric rows: {time.monotonic() - t0:.1f} s, "
          f"statuses {sorted((k[0], k[1], v) for k, v in SEEN.items() if k[0].startswith('/api'))}")
