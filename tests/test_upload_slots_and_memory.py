"""Issue 68: adapter upload slots per client (by API key, else address) under a global ceiling,
and the memory a model's config implies, checked against the machine before anything is built.
Bounded in time; no real memory is allocated for the estimate."""

import asyncio
import json
import time

import pytest

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula.engine.adapters import to_safetensors_bytes
from autocurricula.engine.models import config as model_config
from autocurricula.engine.models.config import NotEnoughMemoryError, check_memory, estimate_memory
from autocurricula.fleet.client import Client
from autocurricula.serve.http_limits import UploadSlots, UploadSlotsBusy
from autocurricula.serve.server import create_app
from server_fixtures import engine  # noqa: F401  (shared fixture)
from test_server_hardening import weights
from test_server_limits import answer, connect, served


def _bounded(coro, seconds=5.0):
    return asyncio.run(asyncio.wait_for(coro, seconds))


# ------------------------------------------------------------------ upload slots
def test_one_client_holding_its_slots_does_not_stop_another():
    async def main():
        slots = UploadSlots(per_client=2, total=3)
        await slots.acquire("a", timeout=0.1)
        await slots.acquire("a", timeout=0.1)
        assert slots.locked("a") and not slots.locked("b")
        with pytest.raises(UploadSlotsBusy, match="this client already has 2"):
            await slots.acquire("a", timeout=0.05)
        await slots.acquire("b", timeout=0.1)  # a's slots do not stop b
        with pytest.raises(UploadSlotsBusy, match="3 adapter uploads are in progress on this server"):
            await slots.acquire("c", timeout=0.05)  # the global ceiling still bounds the total
        assert slots.held("b") == 1  # c's refused wait gave b's slot back untouched
        slots.release("a")
        await slots.acquire("c", timeout=0.1)
        for client in ("a", "b", "c"):
            slots.release(client)
        assert slots._clients == {} and not slots.locked("a")  # nothing kept per client once done

    _bounded(main())


def test_a_waiting_upload_gets_the_slot_its_client_frees():
    async def main():
        slots = UploadSlots(per_client=1, total=4)
        await slots.acquire("a")
        waiter = asyncio.create_task(slots.acquire("a", timeout=2.0))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        slots.release("a")
        await waiter
        assert slots.held("a") == 1
        slots.release("a")
        assert slots._clients == {}

    _bounded(main())


def test_stats_report_the_global_ceiling(engine):  # noqa: F811
    state = create_app(engine, max_concurrent_uploads=3).state.server
    assert state.limits()["max_total_uploads"] == 12 and state.upload_slots.per_client == 3


def test_a_stalled_upload_under_one_key_does_not_block_another_key(engine):  # noqa: F811
    """Client A's one slot is held by an upload that sent its header and then nothing; client B,
    with its own key, uploads at once, while A's second upload waits until A's first is dropped."""
    app = create_app(engine, api_key=["key-a", "key-b"], max_concurrent_uploads=1, body_timeout_s=3.0)
    good = to_safetensors_bytes(weights(engine, 3))
    n = int.from_bytes(good[:8], "little")
    head = ("PUT /v1/adapters/held HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(good)}\r\n\r\n").encode()
    with served(app) as port:
        holder = connect(port, head + good[: 8 + n])
        time.sleep(0.5)
        start = time.monotonic()
        with Client(f"http://127.0.0.1:{port}", api_key="key-b", max_retries=0) as c:
            assert c.upload_adapter("other", good)["version"] >= 1
        assert time.monotonic() - start < 2.0  # it did not wait for A's upload to be dropped
        with Client(f"http://127.0.0.1:{port}", api_key="key-a", max_retries=0, timeout=10) as c:
            start = time.monotonic()
            assert c.upload_adapter("second", good)["version"] >= 1
        assert time.monotonic() - start > 1.0  # A's own second upload waited for A's slot (the holder's drop)
        assert answer(holder).startswith(b"HTTP/1.1 408")
        assert "held" not in engine.players()
        for name in ("other", "second"):
            engine.unload_adapter(name)


# ------------------------------------------------------------------ memory estimate
def _checkpoint(folder, shapes: dict, dtype="F32", config=None):
    """A folder with config.json and a model.safetensors whose header names ``shapes`` (no data
    written beyond the header: only headers are read)."""
    size = {"F32": 4, "BF16": 2, "F16": 2, "U32": 4}[dtype]
    header, offset = {}, 0
    for key, shape in shapes.items():
        n = size
        for d in shape:
            n *= d
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    (folder / "config.json").write_text(json.dumps(config or {}))
    return folder


def test_the_estimate_counts_the_weights_from_their_headers(tmp_path):
    folder = _checkpoint(tmp_path, {"model.embed_tokens.weight": (1000, 64), "model.layers.0.mlp.weight": (64, 64)},
                         dtype="BF16")
    assert estimate_memory({}, folder) == (1000 * 64 + 64 * 64) * 2


def test_a_model_larger_than_the_free_memory_is_refused_by_name(tmp_path, monkeypatch):
    folder = _checkpoint(tmp_path, {"model.embed_tokens.weight": (1 << 20, 256)})  # 1 GiB of float32, on paper
    monkeypatch.setattr(model_config, "available_memory", lambda: 100 << 20)
    with pytest.raises(NotEnoughMemoryError) as info:
        check_memory({}, folder)
    message = str(info.value)
    assert "1024 MiB" in message and "100 MiB" in message and "smaller model" in message and "quantized" in message
    monkeypatch.setattr(model_config, "available_memory", lambda: 4 << 30)
    check_memory({}, folder)  # fits


def test_an_unknown_available_figure_skips_the_check(tmp_path, monkeypatch, caplog):
    folder = _checkpoint(tmp_path, {"model.embed_tokens.weight": (1 << 20, 256)})
    monkeypatch.setattr(model_config, "available_memory", lambda: None)
    with caplog.at_level("DEBUG", logger=model_config.__name__):
        check_memory({}, folder)
    assert "available memory" in caplog.text


def test_load_refuses_before_building(tiny_model_path, monkeypatch):
    from autocurricula.engine import models

    monkeypatch.setattr(model_config, "available_memory", lambda: 1)
    with pytest.raises(NotEnoughMemoryError, match="estimated"):
        models.load(str(tiny_model_path))
