"""``PUT /v1/adapters/{name}``: a raw safetensors body streamed, checked and parsed piece by piece
within the upload limits, then installed. The header is checked against the base model before any
data is read; the data goes in bounded chunks straight into each tensor's own array; a client
that stops sending is dropped within seconds, and what a refused upload read goes back at once."""

from __future__ import annotations

import asyncio
import ctypes

import numpy as np

from autocurricula.engine.adapters import (MAX_HEADER_BYTES, MAX_TENSORS, AdapterError, header_length, held_bytes,
                                           held_tensor, parse_header, stored_dtype, upload_plan, weights_from_plan)
from autocurricula.serve.adapter_store import check_room, check_size, install, off_loop
from autocurricula.serve.errors import CLOSE, RETRY_LATER, APIError
from autocurricula.serve.http_limits import (MIN_UPLOAD_RATE, BodyError, BodyReader, ClientGone, UploadSlotsBusy,
                                              upload_allowance)
from autocurricula.serve.state import ServerState

_OFF_LOOP_BYTES = 1 << 20  # a tensor this large is converted (float32, mlx-lm's orientation) on a thread


async def read_upload(receive, declared: int | None, scale: float | None, max_bytes: int, timeout_s: float,
                      max_lora_rank: int | None, dims: dict[str, tuple[int, int]] | None = None,
                      check_held=None):
    """Read and parse a safetensors body from ASGI ``receive``: the header length before the
    header, and the header, checked against the limits and the base model (``dims``, its
    ``{path: (in, out)}``; ``check_held(bytes)`` may refuse the size it will hold), before any
    data. Then each tensor, in the order the file stores them, into an array of its own size
    filled chunk by chunk as the bytes arrive (never the whole body at once, and no second copy of
    it). ``declared``: the Content-Length, if sent. Arrival: see :class:`BodyReader`, with
    :func:`~autocurricula.serve.http_limits.upload_allowance` and ``MIN_UPLOAD_RATE``."""
    allowance = upload_allowance(timeout_s)
    hint = (f"an upload may pause at most {allowance:g} s and must average {MIN_UPLOAD_RATE / 2**20:g} MiB/s "
            f"after its first {allowance:g} s (--body-timeout sets the pause when shorter)")
    reader = BodyReader(receive, allowance, MIN_UPLOAD_RATE, hint)
    n = header_length(await reader.read(8), MAX_HEADER_BYTES)
    if declared is not None and 8 + n > declared:
        raise AdapterError(f"the header length ({n} bytes) runs past the body's {declared} bytes; send the "
                           "bytes of a .safetensors file")
    header = await off_loop(parse_header, await reader.read(n), MAX_TENSORS)
    total = header.total_bytes
    if total > max_bytes:
        raise APIError(413, f"the adapter's tensors make a file of {total} bytes, more than the limit of "
                            f"{max_bytes} bytes (--max-upload-bytes)")
    if declared is not None and declared != total:
        raise AdapterError(f"the body has {declared} bytes but the file its header describes has {total}; send "
                           "the .safetensors file as written, without padding or truncation")
    plan = await off_loop(upload_plan, header, dims, max_lora_rank, scale)
    if check_held is not None:
        check_held(held_bytes(header, plan))
    held: dict[str, np.ndarray] = {}
    raw = view = None
    try:
        for key, (dtype, shape, lo, hi) in sorted(header.tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
            raw = np.empty(shape, stored_dtype(dtype))  # pages are touched only as bytes come in
            view = memoryview(raw.reshape(-1).view(np.uint8))
            await reader.read_into(view)
            view.release()
            transposed = plan[key][2]
            if raw.nbytes >= _OFF_LOOP_BYTES:
                held[key] = await off_loop(held_tensor, raw, dtype, transposed)
            else:
                held[key] = held_tensor(raw, dtype, transposed)
            raw = None
        if await reader.trailing():
            raise AdapterError(f"bytes follow the {total} bytes that the header describes, and no tensor covers "
                               "them; send the .safetensors file as written")
        return await off_loop(weights_from_plan, header, plan, held, scale)
    except BaseException:  # no traceback keeps what was read (read_into's frame holds the released view)
        held.clear()
        if view is not None:
            view.release()
        raw = view = None
        raise


_libc = None


def give_back_memory() -> None:
    """Return freed heap pages to the system (glibc's ``malloc_trim``; nothing elsewhere), so the
    memory of a refused upload leaves the server's RSS at once, not at the next large allocation."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc
            _libc = False
    if _libc:
        _libc(0)


async def upload(state: ServerState, name: str, receive, declared: int | None, scale: float | None,
                 version: int | None, client: str = "") -> int:
    """Read an upload (at most ``max_concurrent_uploads`` at once from ``client``, see
    :class:`~autocurricula.serve.http_limits.UploadSlots`) and install it as ``name``;
    returns the new version. Every refusal of the body closes the connection; the slot and the
    memory of a refused or dropped upload are given back before the answer."""
    check_room(state, name)
    try:  # uploads beyond the limit wait for a turn, without reading their bodies
        await state.upload_slots.acquire(client, timeout=state.body_timeout_s)
    except UploadSlotsBusy as exc:
        raise APIError(429, f"{exc}; retry later", headers=RETRY_LATER) from None
    error = None
    try:
        weights = await read_upload(receive, declared, scale, state.max_upload_bytes, state.body_timeout_s,
                                    state.max_lora_rank, dims=getattr(state.engine, "linear_dims", None),
                                    check_held=lambda size: check_size(state, size))
    except BodyError as exc:  # the answer is raised below, outside the handler: no traceback keeps the frames
        error = APIError(exc.status, f"adapter upload: {exc.message}", headers=CLOSE)
    except AdapterError as exc:
        error = APIError(400, str(exc), headers=CLOSE)
    except APIError as exc:
        error = APIError(exc.status, exc.message, exc.param, CLOSE)
    except ClientGone:
        error = APIError(499, "client disconnected")
    finally:
        state.upload_slots.release(client)
    if error is not None:
        give_back_memory()
        raise error
    try:
        version = await install(state, name, weights, version)
    except (AdapterError, APIError) as exc:  # e.g. weights that are not finite: the same answer, no frames kept
        error = APIError(exc.status, exc.message, exc.param, exc.headers) if isinstance(exc, APIError) \
            else type(exc)(str(exc))
    if error is not None:
        weights = None
        give_back_memory()
        raise error
    state.folders.pop(name, None)
    return version
