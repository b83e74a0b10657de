"""Uploads cost what they carry (issue 68 items 1 and 2).

1. The safetensors header is checked against the base model (names, dtypes, 2-D shapes, ranks,
   the held size) before any data is read; the data goes in chunks straight into each tensor's
   own array, never into a buffer of the whole declared size, and never copied a second time.
2. An upload must keep arriving: it may pause at most the allowance (10 s, or --body-timeout when
   shorter) and must average 1 MiB/s after it, so a stalled client is dropped within seconds
   with a 408 and gives back its slot and its memory.

Sizes are small (a few MiB at most); allocations are measured with tracemalloc (numpy reports its
buffers to it) or with the process's RSS; every wait is bounded by shortened deadlines."""

from __future__ import annotations

import asyncio
import json
import os
import time
import tracemalloc
import types

import numpy as np
import pytest

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.engine.adapters import AdapterWeights, LoraSpec, to_safetensors_bytes
from autocurricula.fleet.client import Client
from autocurricula.serve.adapter_upload import read_upload, upload
from autocurricula.serve.errors import CLOSE, APIError
from autocurricula.serve.http_limits import BodyError
from autocurricula.serve.server import create_app
from autocurricula.serve.state import ServerState
from server_fixtures import engine  # noqa: F401  (shared fixture)
from test_server_limits import answer, connect, served, upload_head

DIMS = {f"m{i}.q": (256, 256) for i in range(8)}  # 16 tensors of 256 x 64 float32 (64 KiB) at rank 64
TENSOR = 256 * 64 * 4


def adapter(dims=DIMS, r=64, seed=0) -> AdapterWeights:
    return AdapterWeights.random(dims, LoraSpec(r=r, lora_alpha=r), seed=seed)


def _file(header: dict, data_bytes: int = 0) -> bytes:
    """A safetensors header (and ``data_bytes`` zeros, when given)."""
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(data_bytes)


def head_of(body: bytes) -> int:
    """Bytes of the 8-byte length and the header."""
    return 8 + int.from_bytes(body[:8], "little")


def header_only(dims: dict, r: int) -> tuple[bytes, int]:
    """The header of an mlx-lm adapter of rank ``r`` on ``dims`` (float32) and its file's length,
    without its data."""
    header, end = {}, 0
    for path, (din, dout) in dims.items():
        for key, shape in ((f"{path}.lora_a", [din, r]), (f"{path}.lora_b", [r, dout])):
            size = 4 * shape[0] * shape[1]
            header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [end, end + size]}
            end += size
    head = _file(header)
    return head, len(head) + end


def rss() -> int | None:
    """This process's resident memory in bytes (None without /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


class Feeder:
    """An ASGI ``receive`` sending ``body`` in ``chunk``-byte messages, ``gap`` seconds apart,
    that stops for good (a stalled client) once ``stall_after`` bytes are out."""

    def __init__(self, body: bytes, chunk: int = 64 << 10, stall_after: int | None = None, gap: float = 0.0):
        self.body, self.chunk, self.stall_after, self.gap, self.sent = body, chunk, stall_after, gap, 0

    async def __call__(self):
        end = len(self.body) if self.stall_after is None else self.stall_after
        if self.sent >= end:
            await asyncio.Event().wait()  # nothing more, ever
        if self.gap:
            await asyncio.sleep(self.gap)
        piece = self.body[self.sent: min(self.sent + self.chunk, end)]
        self.sent += len(piece)
        return {"type": "http.request", "body": piece, "more_body": self.sent < len(self.body)}


class FakeEngine:
    """What an upload asks of the engine before it installs: the players and the linear layers."""

    name = "base"
    config = types.SimpleNamespace(preempt_after_steps=16)

    def __init__(self, dims=DIMS):
        self.linear_dims = dims

    def players(self):
        return []


def state_for(**limits) -> ServerState:
    return ServerState(FakeEngine(), max_tokens=16, max_batch_tokens=16, **limits)


def _bounded(coro, seconds: float = 10.0):
    return asyncio.run(asyncio.wait_for(coro, seconds))


# ------------------------------------------------------------------ 1. the header first
@pytest.mark.parametrize("header, status, words", [
    ({"m0.q.lora_a": {"dtype": "F32", "shape": [1 << 26], "data_offsets": [0, 1 << 28]}}, 400, "2-D matrices"),
    ({"m0.q.lora_a": {"dtype": "F32", "shape": [1 << 23, 8], "data_offsets": [0, 1 << 28]},
      "m0.q.lora_b": {"dtype": "F32", "shape": [8, 256], "data_offsets": [1 << 28, (1 << 28) + 8192]}},
     400, "lora_a (8388608, 8) / lora_b (8, 256) do not fit a (256, r) / (r, 256) layer"),
    ({"nope.lora_a": {"dtype": "F32", "shape": [256, 8], "data_offsets": [0, 8192]},
      "nope.lora_b": {"dtype": "F32", "shape": [8, 256], "data_offsets": [8192, 16384]}},
     400, "nope: not a linear layer of the base model"),
    ({"m0.q.lora_a": {"dtype": "F32", "shape": [256, 128], "data_offsets": [0, 131072]},
      "m0.q.lora_b": {"dtype": "F32", "shape": [128, 256], "data_offsets": [131072, 262144]}},
     400, "rank 128 exceeds the limit of 64"),
    ({"m0.q.lora_a": {"dtype": "I32", "shape": [256, 8], "data_offsets": [0, 8192]}}, 400, "dtype int32"),
    ({"m0.q.lora_a": {"dtype": "F32", "shape": [256, 8], "data_offsets": [0, 8192]}}, 400, "only one of"),
    ({"__metadata__": {"scale": "nan"},
      "m0.q.lora_a": {"dtype": "F32", "shape": [256, 8], "data_offsets": [0, 8192]},
      "m0.q.lora_b": {"dtype": "F32", "shape": [8, 256], "data_offsets": [8192, 16384]}}, 400, "metadata scale"),
    ({"m0.q.lora_a": {"dtype": "F32", "shape": [256, 64], "data_offsets": [0, TENSOR]},
      "m0.q.lora_b": {"dtype": "F32", "shape": [64, 256], "data_offsets": [TENSOR, 2 * TENSOR]}},
     507, "--max-cpu-adapter-bytes 1000"),
])
def test_the_header_is_checked_before_any_data_is_read(header, status, words):
    body = _file(header)
    data = max(hi for key, info in header.items() if key != "__metadata__" for hi in info["data_offsets"])
    feeder = Feeder(body, stall_after=len(body))  # the header, and then not one byte of data
    state = state_for(max_cpu_adapter_bytes=1000, body_timeout_s=5.0)
    with pytest.raises(APIError) as info:
        _bounded(upload(state, "p", feeder, len(body) + data, None, None))
    assert info.value.status == status and words in info.value.message, info.value.message
    assert info.value.headers == CLOSE and feeder.sent == len(body) and not state.upload_slots.locked()


def test_an_upload_that_fits_is_read_into_its_tensors_and_matches_the_file():
    for w, peft in ((adapter(), False), (adapter(r=8, seed=3), True)):
        body = to_safetensors_bytes(w)
        if peft:  # peft keys, (r, in) / (out, r), in bfloat16: widened and transposed on the way in
            header, data = {"__metadata__": {"scale": "1.0"}}, b""
            for path, (a, b) in w.modules.items():
                for key, t in ((f"base_model.model.{path}.lora_A.weight", a.T), (f"base_model.model.{path}.lora_B.weight", b.T)):
                    raw = (np.ascontiguousarray(t).view(np.uint32) >> 16).astype("<u2").tobytes()  # bfloat16
                    header[key] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
                    data += raw
            body = _file(header) + data
        got = _bounded(read_upload(Feeder(body, chunk=1000), len(body), None, 1 << 30, 5.0, 64, DIMS))
        for path, (a, b) in w.modules.items():
            ga, gb = got.modules[path]
            assert ga.dtype == np.float32 and ga.flags.c_contiguous and gb.flags.c_contiguous
            tol = 1e-2 if peft else 0
            np.testing.assert_allclose(ga, a, atol=tol * np.abs(a).max())
            np.testing.assert_allclose(gb, b, atol=tol * np.abs(b).max())


def test_reading_an_upload_allocates_its_tensors_and_no_copy_of_the_body():
    """1 MiB of tensors: the reader's peak is what the adapter holds plus a chunk or two, where a
    buffer of the body and copies out of it cost twice that."""
    body = to_safetensors_bytes(adapter())
    held = 16 * TENSOR
    feeder = Feeder(body)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        weights = _bounded(read_upload(feeder, len(body), None, 1 << 30, 5.0, 64, DIMS))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert sum(a.nbytes + b.nbytes for a, b in weights.modules.values()) == held
    assert peak < held + (384 << 10), f"peak {peak} bytes for {held} bytes of tensors"


# ------------------------------------------------------------------ 2. arrival
def _stalled_read(stall_after: int, timeout_s: float):
    """Read an upload whose client stops after ``stall_after`` bytes; (error, seconds, peak bytes,
    bytes still held afterwards), measured with tracemalloc."""
    body = to_safetensors_bytes(adapter())
    with pytest.raises(BodyError):  # once untraced: what the first run sets up for good (the thread pool...)
        _bounded(read_upload(Feeder(body, stall_after=stall_after), len(body), None, 1 << 30, 0.1, 64, DIMS))
    feeder = Feeder(body, stall_after=stall_after)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        start = time.monotonic()
        try:
            _bounded(read_upload(feeder, len(body), None, 1 << 30, timeout_s, 64, DIMS))
            error = None
        except BodyError as exc:
            error = (exc.status, exc.message)  # keep no traceback: its frames would hold what was read
        seconds = time.monotonic() - start
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return error, seconds, peak - base, current - base, body


def test_a_stalled_upload_is_dropped_within_the_allowance_holding_only_what_arrived():
    body = to_safetensors_bytes(adapter())
    stall = head_of(body) + 3 * TENSOR + 100  # the header, three tensors and a bit of the fourth
    error, seconds, peak, after, _ = _stalled_read(stall, timeout_s=0.5)
    assert error is not None and error[0] == 408 and "did not arrive in time" in error[1], error
    assert f"{stall} bytes came in" in error[1] and "pause at most 0.5 s" in error[1]
    assert 0.4 < seconds < 3
    # the declared 1 MiB is never allocated: three tensors read, the fourth's array, a chunk
    assert peak < 4 * TENSOR + (192 << 10), peak
    assert after < (32 << 10), f"{after} bytes still held after the upload was dropped"  # a tensor is 64 KiB


def test_a_trickle_below_the_rate_is_dropped_although_it_never_pauses():
    body = to_safetensors_bytes(adapter())
    feeder = Feeder(body, chunk=64, gap=0.01)  # 6.4 KB/s: never a pause of the allowance, far below 1 MiB/s
    start = time.monotonic()
    with pytest.raises(BodyError) as info:
        _bounded(read_upload(feeder, len(body), None, 1 << 30, 0.5, 64, DIMS))
    assert info.value.status == 408 and time.monotonic() - start < 3
    assert feeder.sent < len(body) // 4


def test_stalled_uploads_cannot_keep_the_slots_from_the_trainer(engine):
    """Two clients send the header of a 64 MiB adapter and stop; with the old deadline (60 s plus
    1 s per MiB) they held both slots for minutes. Now they are dropped after the allowance
    (--body-timeout 1.5 s here), and the trainer's push, waiting for a slot, goes through."""
    app = create_app(engine, body_timeout_s=1.5, max_lora_rank=None)  # 2 upload slots
    dims = {p: engine.linear_dims[p] for p in LoraSpec(r=8).resolve(engine.linear_dims, engine.model_type)}
    head, length = header_only(dims, r=4096)
    assert length > 64 << 20
    good = to_safetensors_bytes(adapter(dims, r=8, seed=1))
    with served(app) as port:
        before = rss()
        holders = [connect(port, upload_head(f"holder-{i}", length) + head) for i in range(2)]
        start = time.monotonic()
        time.sleep(0.3)
        stalled = rss() - before if before is not None else 0
        with Client(f"http://127.0.0.1:{port}", max_retries=0) as c:
            assert c.upload_adapter("trainer", good)["version"] >= 1
            waited = time.monotonic() - start
            assert c.stats()["limits"]["upload_allowance_s"] == 1.5
        for s in holders:
            reply = answer(s)
            assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive in time" in reply, reply[:300]
        assert waited < 6, waited
        assert stalled < (24 << 20), f"two stalled uploads took {stalled >> 20} MiB"
        assert not any(n.startswith("holder") for n in engine.players())
    engine.unload_adapter("trainer")


def test_a_refused_upload_gives_its_memory_back(engine):
    """A 32 MiB upload with a NaN in its last tensor is read and refused at install. Nothing of it
    stays: not with the worker thread that handled it (an idle anyio worker keeps its last job's
    arguments until its next job), not in a traceback. Measured with tracemalloc, which sees
    numpy's buffers, in this process (server and client alike)."""
    dims = {p: engine.linear_dims[p] for p in LoraSpec(r=8).resolve(engine.linear_dims, engine.model_type)}
    w = adapter(dims, r=2048)
    last = list(w.modules)[-1]
    w.modules[last][1][0, 0] = np.nan
    body = to_safetensors_bytes(w)
    del w
    with served(create_app(engine, max_lora_rank=None)) as port:
        with Client(f"http://127.0.0.1:{port}", max_retries=0) as c:
            assert c.health()  # the connection is open
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                for _ in range(3):
                    try:
                        c.upload_adapter("nan", body)
                    except Exception as exc:  # noqa: BLE001 - only its message is kept
                        message = str(exc)
                    else:
                        message = ""
                    assert "NaN or inf" in message, message
                held = tracemalloc.get_traced_memory()[0] - base
            finally:
                tracemalloc.stop()
    assert held < (1 << 20), f"{held >> 20} MiB still held after three refused 32 MiB uploads"
    assert "nan" not in engine.players()


def test_the_stats_name_the_upload_limits():
    limits = state_for(body_timeout_s=60.0).limits()
    assert (limits["upload_allowance_s"], limits["min_upload_bytes_per_s"]) == (10.0, 1 << 20)
    assert state_for(body_timeout_s=2.0).limits()["upload_allowance_s"] == 2.0
