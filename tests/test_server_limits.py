"""Server limits: bounded uploads, fair admission, connection timeouts, the adapter cap, names
without a trailing newline and the adapter list. Each test holds the server to one limit, bounded
in time; real servers bind 127.0.0.1 only."""

import contextlib
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.fleet.client import Client, InsufficientStorageError, TooManyRequestsError
from autocurricula.engine import AdapterError, Engine, EngineConfig, SamplingParams
from autocurricula.engine import adapters as adapters_module
from autocurricula.engine.adapters import (MAX_HEADER_BYTES, MAX_TENSORS, check_name, from_safetensors_bytes,
                                           read_safetensors, to_safetensors_bytes)
from autocurricula.engine.scheduler import QueueTimeoutError
from autocurricula.serve.http_limits import header_timeout_protocol
from autocurricula.serve.server import create_app
from helpers import running_server
from server_fixtures import client, engine, root  # noqa: F401  (shared fixtures)
from test_server_hardening import error_of, put, weights

GREEDY = {"temperature": 0, "ignore_eos": True}


@contextlib.contextmanager
def served(app, header_timeout_s=None, **config):
    """A real uvicorn server on a free 127.0.0.1 port (with the header timeout when given); its port."""
    if header_timeout_s is not None:
        config["http"] = header_timeout_protocol(header_timeout_s)
    with running_server(app, **config) as url:
        yield int(url.rsplit(":", 1)[1])


def connect(port, data=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        s.sendall(data)
    return s


def answer(s, within=10.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``within`` seconds pass)."""
    s.settimeout(within)
    out = b""
    with contextlib.suppress(socket.timeout, ConnectionResetError):
        while chunk := s.recv(1 << 16):
            out += chunk
    return out


def response(s) -> bytes:
    """One whole HTTP response (headers and Content-Length body) from the socket."""
    s.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(1 << 16)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(body) < length:
        body += s.recv(1 << 16)
    return head + b"\r\n\r\n" + body


def upload_head(name, length):
    return (f"PUT /v1/adapters/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _file(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


# ------------------------------------------------------------------ bounded uploads
def test_the_header_is_parsed_once(engine, monkeypatch):
    calls, real = [], json.loads
    monkeypatch.setattr(adapters_module.json, "loads", lambda *a, **k: calls.append(1) or real(*a, **k))
    from_safetensors_bytes(to_safetensors_bytes(weights(engine)))
    assert len(calls) == 1


def test_tensors_are_copied_out_of_the_upload(engine):
    data = to_safetensors_bytes(weights(engine))
    raw = np.frombuffer(data, np.uint8)
    got = from_safetensors_bytes(data)
    for a, b in got.modules.values():
        assert not np.shares_memory(a, raw) and not np.shares_memory(b, raw)
    assert not any(np.shares_memory(t, raw) for t in read_safetensors(data).values())


@pytest.mark.parametrize("case", ["padded", "gap", "overlap"])
def test_bytes_no_tensor_covers_are_refused(client, engine, case):
    good = to_safetensors_bytes(weights(engine, 1))
    if case == "padded":
        data, words = good + b"\0" * 4096, ("padding",)
    else:
        key = "model.layers.0.self_attn.q_proj.lora_a"
        spans = {"gap": ([0, 16], [32, 48]), "overlap": ([0, 16], [8, 24])}[case]
        header = {key: {"dtype": "F32", "shape": [2, 2], "data_offsets": spans[0]},
                  key[:-1] + "b": {"dtype": "F32", "shape": [2, 2], "data_offsets": spans[1]}}
        data, words = _file(header, b"\0" * spans[1][1]), ("no tensor covers" if case == "gap" else "overlaps",)
    with pytest.raises(AdapterError, match="|".join(words)):
        from_safetensors_bytes(data)
    error_of(put(client, "padded", data), 400)
    assert "padded" not in engine.players()


def test_header_size_and_tensor_count_are_capped(client):
    many = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(MAX_TENSORS + 1)}
    error_of(put(client, "many", _file(many)), 400, f"limit of {MAX_TENSORS}")
    big = (MAX_HEADER_BYTES + 1).to_bytes(8, "little") + b" " * 64
    error_of(put(client, "big", big), 400, "header of", f"limit of {MAX_HEADER_BYTES}")


def test_header_length_is_checked_before_the_body_is_read(engine):
    """A header that claims 1 GiB (and a body that claims 2 GiB) is answered after 8 bytes."""
    with served(create_app(engine)) as port:
        s = connect(port, upload_head("bomb", (2 << 30) - 1) + (1 << 30).to_bytes(8, "little"))
        start = time.monotonic()
        reply = answer(s)
        assert reply.startswith(b"HTTP/1.1 400") and b"exceeds the limit" in reply, reply[:300]
        assert time.monotonic() - start < 5
        # a padded file is refused once its header is read: the body's length does not match it
        good = to_safetensors_bytes(weights(engine, 2))
        n = int.from_bytes(good[:8], "little")
        s = connect(port, upload_head("pad", len(good) + (256 << 20)) + good[: 8 + n])
        reply = answer(s)
        assert reply.startswith(b"HTTP/1.1 400") and b"without padding" in reply, reply[:300]
        assert "pad" not in engine.players()


def test_concurrent_uploads_are_limited(engine):
    """One slot: the second upload waits for it. The holder sends a valid header and then nothing,
    so it keeps the slot only for the upload allowance (--body-timeout here, 2 s), gets a 408, and
    the waiting upload goes through (the 429 of a wait that ends first: test_server_units)."""
    app = create_app(engine, max_concurrent_uploads=1, body_timeout_s=2.0)
    good = to_safetensors_bytes(weights(engine, 3))
    n = int.from_bytes(good[:8], "little")
    with served(app) as port:
        holder = connect(port, upload_head("holder", len(good)) + good[: 8 + n])
        start = time.monotonic()
        time.sleep(0.5)
        with Client(f"http://127.0.0.1:{port}", max_retries=0) as c:
            assert c.upload_adapter("second", good)["version"] >= 1
        assert 1.5 < time.monotonic() - start < 8  # it waited for the holder to be dropped
        reply = answer(holder)
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive in time" in reply, reply[:300]
        assert "holder" not in engine.players()
        engine.unload_adapter("second")


def test_the_number_of_held_adapters_is_capped(engine):
    with TestClient(create_app(engine, max_cpu_adapters=2)) as c:
        for name in ("cap-a", "cap-b"):
            assert put(c, name, to_safetensors_bytes(weights(engine, 4))).status_code == 200
        error_of(put(c, "cap-c", to_safetensors_bytes(weights(engine, 5))), 507, "--max-cpu-adapters", "DELETE")
        assert "cap-c" not in engine.players()
        assert put(c, "cap-a", to_safetensors_bytes(weights(engine, 6))).json()["version"] == 2  # a hot swap fits
        assert c.delete("/v1/adapters/cap-b").status_code == 200
        assert put(c, "cap-c", to_safetensors_bytes(weights(engine, 5))).status_code == 200
        for name in ("cap-a", "cap-c"):
            c.delete(f"/v1/adapters/{name}")


@pytest.fixture(scope="module")
def one_slot(tiny_model_path):  # one adapter slot: serving another player writes its weights again
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=1, max_batch=4), name="tiny")
    yield eng
    eng.close()


def held(engine) -> list[str]:
    return [n for n in engine.players() if not engine.adapter_info(n)["spilled"]]


def test_adapters_beyond_the_cap_spill_to_disk_and_answer_the_same(one_slot, tmp_path):
    def ask(c, name):
        r = c.post("/v1/completions", json={"model": name, "prompt": "hello there", "max_tokens": 12,
                                             "return_token_ids": True, **GREEDY})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    names = ["sp-a", "sp-b", "sp-c", "sp-d"]
    sent = {n: weights(one_slot, 20 + i) for i, n in enumerate(names)}
    with TestClient(create_app(one_slot, adapter_root=str(tmp_path), max_cpu_adapters=2)) as c:
        first = {}
        for n in names:
            assert put(c, n, to_safetensors_bytes(sent[n])).status_code == 200
            first[n] = ask(c, n)
            assert len(held(one_slot)) <= 2
        assert one_slot.players() == names and held(one_slot) == ["sp-c", "sp-d"]  # the least recent spilled
        assert len(list((tmp_path / ".spilled").rglob("*.safetensors"))) == 2
        assert len({tuple(t) for t in first.values()}) > 1  # the players answer differently
        for n in names:  # each read back from disk into the one slot: the same greedy tokens
            assert ask(c, n) == first[n]
        for n in names:
            got = one_slot.adapter_weights(n)
            for path, (a, b) in sent[n].modules.items():
                np.testing.assert_array_equal(got.modules[path][0], a)
                np.testing.assert_array_equal(got.modules[path][1], b)
        assert len(held(one_slot)) <= 2
        # a spilled copy that changed on disk is refused by name; the server goes on
        spilled = next(n for n in names if n not in held(one_slot))
        ask(c, held(one_slot)[0])  # the one slot holds another player now
        file = next(p for p in (tmp_path / ".spilled").rglob(f"{spilled}.*.safetensors"))
        file.write_bytes(file.read_bytes()[:-4] + b"\0\0\0\1")
        r = c.post("/v1/completions", json={"model": spilled, "prompt": "hello", "max_tokens": 2})
        error_of(r, 500, "changed on disk", "upload the adapter again")
        assert put(c, spilled, to_safetensors_bytes(sent[spilled])).status_code == 200  # a new upload heals it
        assert ask(c, spilled) == first[spilled] and len(held(one_slot)) <= 2
        for n in names:
            assert c.delete(f"/v1/adapters/{n}").status_code == 200
        assert not list((tmp_path / ".spilled").rglob("*.safetensors"))  # deleting removes the files
    assert not list((tmp_path / ".spilled").iterdir())  # and the app's folder goes when it shuts down


def test_a_byte_budget_spills_too(one_slot, tmp_path):
    size = 4 * 2 * (256 * 8 + 8 * 256) * 4  # rank 8 on q_proj and v_proj of 4 layers, float32
    with TestClient(create_app(one_slot, adapter_root=str(tmp_path), max_cpu_adapters=None,
                               max_cpu_adapter_bytes=2 * size + 100)) as c:
        for i, n in enumerate(["byte-a", "byte-b", "byte-c"]):
            assert put(c, n, to_safetensors_bytes(weights(one_slot, 40 + i))).status_code == 200
        assert one_slot.players() == ["byte-a", "byte-b", "byte-c"] and held(one_slot) == ["byte-b", "byte-c"]
        error_of(put(c, "byte-big", to_safetensors_bytes(weights(one_slot, 43, r=64))), 507,
                 "--max-cpu-adapter-bytes", f"{64 * size // 8} bytes")
        assert c.get("/v1/stats").json()["limits"]["max_cpu_adapter_bytes"] == 2 * size + 100
        for n in ["byte-a", "byte-b", "byte-c"]:
            c.delete(f"/v1/adapters/{n}")


def test_an_adapter_in_use_is_never_spilled(one_slot, tmp_path):
    with TestClient(create_app(one_slot, adapter_root=str(tmp_path), max_cpu_adapters=2)) as c:
        for i, n in enumerate(["use-a", "use-b"]):
            assert put(c, n, to_safetensors_bytes(weights(one_slot, 30 + i))).status_code == 200
        running = one_slot.submit("go", "use-a", SamplingParams(max_tokens=1900, **GREEDY), request_id="use-run")
        queued = one_slot.submit("go", "use-b", SamplingParams(max_tokens=2, **GREEDY), request_id="use-queued")
        try:
            deadline = time.monotonic() + 10
            while one_slot.health()["running"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            # use-a is the least recently used, but a running row pins it; use-b waits for the slot
            error_of(put(c, "use-c", to_safetensors_bytes(weights(one_slot, 32))), 507, "--max-cpu-adapters",
                     "in use")
            assert held(one_slot) == ["use-a", "use-b"] and "use-c" not in one_slot.players()
        finally:
            one_slot.cancel("use-run")
        assert running.result(timeout=30).finish_reason == "cancelled"
        assert queued.result(timeout=30).finish_reason == "length"
        assert put(c, "use-c", to_safetensors_bytes(weights(one_slot, 32))).status_code == 200  # now one spills
        assert len(held(one_slot)) == 2 and one_slot.players() == ["use-a", "use-b", "use-c"]
        for n in ["use-a", "use-b", "use-c"]:
            c.delete(f"/v1/adapters/{n}")


def test_client_maps_507_and_retries_429_after_retry_after():
    calls = []

    def handler(request):
        calls.append(time.monotonic())
        if request.url.path.endswith("/full"):
            return httpx.Response(507, json={"error": {"message": "the server holds 2 adapters", "code": 507}})
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "1"}, json={"error": {"message": "busy", "code": 429}})
        return httpx.Response(200, json={"name": "x", "version": 1})

    with Client("http://server", transport=httpx.MockTransport(handler), backoff=0.0, max_backoff=2.0) as c:
        assert c.upload_adapter("x", b"bytes")["version"] == 1
        assert calls[1] - calls[0] >= 0.9  # Retry-After honoured over a zero backoff
        with pytest.raises(InsufficientStorageError, match="holds 2 adapters"):
            c.upload_adapter("full", b"bytes")


# ------------------------------------------------------------------ fair admission
def test_batch_token_budget(engine):
    with TestClient(create_app(engine)) as c:  # the default: max_batch x the context
        big = {"requests": [{"prompt": "go", "max_tokens": 2000, "ignore_eos": True}] * 4096}
        start = time.monotonic()
        error_of(c.post("/v1/batch/completions", json=big), 400, "--max-batch-tokens", "8192000")
        assert time.monotonic() - start < 10 and engine.health()["queued"] == 0
    with TestClient(create_app(engine, max_batch_tokens=10)) as c:
        error_of(c.post("/v1/batch/completions", json={"requests": [{"prompt": "go", "max_tokens": 6}] * 2}),
                 400, "12 tokens", "limit of 10")
        r = c.post("/v1/batch/completions", json={"requests": [{"prompt": "go", "max_tokens": 5, **GREEDY}] * 2})
        assert r.status_code == 200 and len(r.json()["data"]) == 2


@pytest.fixture(scope="module")
def one_row(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, max_batch=1), name="tiny")
    yield eng
    eng.close()


def test_a_request_queued_past_max_queue_s_gets_503_with_retry_after(one_row):
    hog = one_row.submit("hog", params=SamplingParams(max_tokens=1900, **GREEDY), request_id="hog")
    try:
        with TestClient(create_app(one_row, max_queue_s=0.3)) as c:
            deadline = time.monotonic() + 10
            while one_row.health()["running"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            waiting = one_row.submit("patient", params=SamplingParams(max_tokens=2, **GREEDY), request_id="patient")
            start = time.monotonic()
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            error_of(r, 503, "queue", "retry")
            assert int(r.headers["retry-after"]) >= 1 and time.monotonic() - start < 5
            batch = c.post("/v1/batch/completions", json={"requests": [{"prompt": "a", "max_tokens": 2}] * 2})
            assert [d["error"]["code"] for d in batch.json()["data"]] == [503, 503]
            stats = c.get("/v1/stats").json()
            assert stats["queue"]["waiting"] >= 1 and stats["queue"]["running"] == 1  # the patient request
            assert stats["limits"]["max_queue_s"] == 0.3
            assert not hog.done()
    finally:
        one_row.cancel("hog")
        one_row.cancel("patient")
    assert hog.result(timeout=30).finish_reason == "cancelled"
    assert waiting.result(timeout=30).finish_reason == "cancelled"  # no deadline: it waited


def test_the_engine_expires_queued_requests_only_when_asked(one_row):
    hog = one_row.submit("hog", params=SamplingParams(max_tokens=1900, **GREEDY), request_id="hog2")
    try:
        late = one_row.submit("late", params=SamplingParams(max_tokens=2), queue_timeout_s=0.2)
        with pytest.raises(QueueTimeoutError, match="waited in the queue"):
            late.result(timeout=10)
    finally:
        one_row.cancel("hog2")
    hog.result(timeout=30)
    assert one_row.generate("again", max_tokens=2, **GREEDY).finish_reason == "length"


@pytest.fixture(scope="module")
def four_rows(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2, max_batch=4, preempt_after_steps=4),
                 name="tiny")
    yield eng
    eng.close()


def test_a_small_request_gets_a_row_while_a_batch_holds_them_all(four_rows):
    big = {"requests": [{"prompt": f"go {i}", "max_tokens": 150, **GREEDY} for i in range(4)]}
    with running_server(create_app(four_rows)) as url, httpx.Client(base_url=url, timeout=120) as c:
        done = {}

        def batch():
            done["batch"] = c.post("/v1/batch/completions", json=big)
            done["batch_at"] = time.monotonic()

        t = threading.Thread(target=batch)
        t.start()
        deadline = time.monotonic() + 30
        while four_rows.health()["running"] < 4:  # the batch holds every row
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.005)
        small = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, **GREEDY})
        small_at = time.monotonic()
        queue = c.get("/v1/stats").json()["queue"]
        t.join(120)
    assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 2
    assert done["batch"].status_code == 200 and small_at < done["batch_at"]  # served while the batch ran
    data = done["batch"].json()["data"]
    assert [d["usage"]["completion_tokens"] for d in data] == [150] * 4
    assert four_rows.stats["paused"] >= 1 and set(queue) >= {"waiting", "running", "paused"}
    # the paused rows resumed where they stopped: the same greedy tokens as running alone
    alone = [f.result(timeout=60).text for f in four_rows.submit_many(
        [(f"go {i}", None, SamplingParams(max_tokens=150, **GREEDY)) for i in range(4)])]
    assert [d["choices"][0]["text"] for d in data] == alone


def test_a_paused_row_streams_on_and_can_be_cancelled(four_rows):
    events: dict[str, list] = {}
    params = SamplingParams(max_tokens=60, **GREEDY)
    futs = four_rows.submit_many([(f"go {i}", None, params, lambda ev: events.setdefault(ev.request_id, []).append(ev),
                                   f"stream-{i}", None, "streams") for i in range(2)])
    deadline = time.monotonic() + 10
    while four_rows.health()["running"] < 2 or four_rows.stats["tokens"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.005)

    def pause_all():  # on the engine thread, between two steps
        four_rows.scheduler.pause(list(range(len(four_rows.scheduler.rows))))
        four_rows.scheduler.cancel("stream-1")  # while it waits to resume

    four_rows.call(pause_all).result(timeout=10)
    done, cancelled = futs[0].result(timeout=60), futs[1].result(timeout=60)
    assert done.finish_reason == "length" and len(done.token_ids) == 60
    assert "".join(ev.text for ev in events["stream-0"]) == done.text  # the stream went on where it stopped
    assert done.text == four_rows.generate("go 0", max_tokens=60, **GREEDY).text
    assert cancelled.finish_reason == "cancelled" and 0 < len(cancelled.token_ids) < 60
    assert cancelled.text == four_rows.decode(cancelled.token_ids)


def test_requests_without_a_group_are_never_paused(four_rows):
    before = four_rows.stats["paused"]
    params = SamplingParams(max_tokens=40, **GREEDY)
    futs = four_rows.submit_many([(f"go {i}", None, params) for i in range(4)])
    late = four_rows.submit("hi", params=SamplingParams(max_tokens=2, **GREEDY))
    late.result(timeout=60)
    assert all(f.done() for f in futs) and four_rows.stats["paused"] == before  # it waited its turn


# ------------------------------------------------------------------ connections
def test_idle_and_slow_header_connections_are_closed(engine):
    with served(create_app(engine), header_timeout_s=0.5) as port:
        idle, partial = connect(port), connect(port, b"GET /health HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        assert answer(idle) == b"" and answer(partial) == b""
        assert time.monotonic() - start < 5
        # a kept-alive connection is served, then closed once the next headers stall
        s = connect(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert response(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\n")
        assert answer(s) == b""
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:  # a prompt client is unaffected
            assert c.get("/health").status_code == 200


def test_slow_bodies_get_408(engine):
    with served(create_app(engine, body_timeout_s=0.5), header_timeout_s=5) as port:
        s = connect(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{")
        start = time.monotonic()
        reply = answer(s)
        assert reply.startswith(b"HTTP/1.1 408") and b"--body-timeout" in reply, reply[:300]
        good = to_safetensors_bytes(weights(engine, 7))
        s = connect(port, upload_head("slow", len(good)) + good[:100])
        reply = answer(s)
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive in time" in reply, reply[:300]
        assert time.monotonic() - start < 8 and "slow" not in engine.players()


def test_serve_passes_the_connection_limits_to_uvicorn(tiny_model_path, monkeypatch):
    import uvicorn

    from autocurricula.cli import build_parser, main

    args = build_parser().parse_args(["serve", "--model", "m"])
    assert (args.header_timeout, args.body_timeout, args.max_connections, args.max_cpu_adapters,
            args.max_cpu_adapter_bytes, args.max_queue_s, args.max_chat_messages) == (30.0, 60.0, 512, 256, None,
                                                                                       120.0, 1024)
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    main(["serve", "--model", str(tiny_model_path), "--port", "0", "--header-timeout", "7",
          "--max-connections", "9", "--max-cpu-adapters", "3"])
    assert seen["limit_concurrency"] == 9 and issubclass(seen["http"], uvicorn.protocols.http.h11_impl.H11Protocol)
    with TestClient(seen["app"]) as c:
        assert c.get("/v1/stats").json()["limits"]["max_cpu_adapters"] == 3


def test_chat_message_count_and_template_length_are_capped(engine):
    with TestClient(create_app(engine, max_chat_messages=8)) as c:
        msgs = [{"role": "user", "content": "hi"}] * 9
        error_of(c.post("/v1/chat/completions", json={"messages": msgs}), 400, "9 messages", "--max-chat-messages")
    with TestClient(create_app(engine)) as c:
        error_of(c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": ""}] * 5000}), 400,
                 "messages")
        # empty contents pass the content check; the rendered template is what overflows
        start = time.monotonic()
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": ""}] * 1000})
        error_of(r, 400, "characters, more than the context")
        assert time.monotonic() - start < 5


# ------------------------------------------------------------------ names and the adapter list
@pytest.mark.parametrize("name", ["bob\n", "bob\r\n", "\nbob"])
def test_names_with_a_newline_are_refused(client, engine, name):
    with pytest.raises(AdapterError, match="invalid adapter name"):
        check_name(name)
    quoted = name.replace("\n", "%0A").replace("\r", "%0D")
    r = put(client, quoted, to_safetensors_bytes(weights(engine, 8)))
    assert r.status_code in (400, 404), r.text  # 404: a leading newline matches no route
    if r.status_code == 400:
        error_of(r, 400, "invalid adapter name")
    r = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": "x"})
    error_of(r, 400, "invalid adapter name")
    assert not any("bob" in p for p in engine.players())  # not stored under "bob" either
    assert client.get(f"/v1/adapters/{quoted}").status_code == 404


def test_get_adapters_lists_them(client, engine):
    assert put(client, "listed", to_safetensors_bytes(weights(engine, 9))).status_code == 200
    r = client.get("/v1/adapters", follow_redirects=False)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and "listed" in [a["name"] for a in body["data"]]
    assert {"name", "version", "rank", "scale", "resident"} <= set(body["data"][0])
    client.delete("/v1/adapters/listed")
    assert "listed" not in [a["name"] for a in client.get("/v1/adapters").json()["data"]]
