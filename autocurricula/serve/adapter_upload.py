"""``PUT /v1/adapters/{name}``: a raw safetensors body streamed, checked and parsed piece by piece
(header length, header, data) within the upload limits, then installed."""

from __future__ import annotations

import asyncio
import time

from starlette.concurrency import run_in_threadpool

from autocurricula.engine.adapters import (MAX_HEADER_BYTES, MAX_TENSORS, AdapterError, adapter_from_parts,
                                           header_length, parse_header)
from autocurricula.serve.adapter_store import check_room, install
from autocurricula.serve.errors import CLOSE, RETRY_LATER, APIError
from autocurricula.serve.http_limits import BodyError, BodyReader, ClientGone
from autocurricula.serve.state import ServerState

MIN_UPLOAD_RATE = 1 << 20  # bytes/s an upload must keep up, beyond --body-timeout, before it is cut off


async def read_upload(receive, declared: int | None, scale: float | None, max_bytes: int, timeout_s: float,
                      max_lora_rank: int | None):
    """Read and parse a safetensors body from ASGI ``receive``: the header length before the
    header, the header before the data, and the data into one buffer of the size the header
    declares. ``declared``: the Content-Length, if sent."""
    hint = f"--body-timeout {timeout_s:g} s plus 1 s per MiB"
    reader = BodyReader(receive, time.monotonic() + timeout_s, hint)
    n = header_length(await reader.read(8), MAX_HEADER_BYTES)
    if declared is not None and 8 + n > declared:
        raise AdapterError(f"the header length ({n} bytes) runs past the body's {declared} bytes; send the "
                           "bytes of a .safetensors file")
    header = await run_in_threadpool(parse_header, await reader.read(n), MAX_TENSORS)
    total = header.total_bytes
    if total > max_bytes:
        raise APIError(413, f"the adapter's tensors make a file of {total} bytes, more than the limit of "
                            f"{max_bytes} bytes (--max-upload-bytes)")
    if declared is not None and declared != total:
        raise AdapterError(f"the body has {declared} bytes but the file its header describes has {total}; send "
                           "the .safetensors file as written, without padding or truncation")
    reader.deadline += header.data_bytes / MIN_UPLOAD_RATE
    data = await reader.read_into(header.data_bytes)
    if await reader.trailing():
        raise AdapterError(f"bytes follow the {total} bytes that the header describes, and no tensor covers "
                           "them; send the .safetensors file as written")
    return await run_in_threadpool(adapter_from_parts, header, data, scale, max_lora_rank)


async def upload(state: ServerState, name: str, receive, declared: int | None, scale: float | None,
                 version: int | None) -> int:
    """Read an upload (at most ``max_concurrent_uploads`` at once) and install it as ``name``;
    returns the new version. Every refusal of the body closes the connection."""
    check_room(state, name)
    try:  # uploads beyond the limit wait for a turn, without reading their bodies
        await asyncio.wait_for(state.upload_slots.acquire(), timeout=state.body_timeout_s)
    except TimeoutError:
        raise APIError(429, f"{state.max_concurrent_uploads} adapter uploads are in progress "
                            "(--max-concurrent-uploads); retry later", headers=RETRY_LATER) from None
    try:
        weights = await read_upload(receive, declared, scale, state.max_upload_bytes, state.body_timeout_s,
                                    state.max_lora_rank)
    except BodyError as exc:
        raise APIError(exc.status, f"adapter upload: {exc.message}", headers=CLOSE) from None
    except AdapterError as exc:
        raise APIError(400, str(exc), headers=CLOSE) from None
    except APIError as exc:
        raise APIError(exc.status, exc.message, exc.param, CLOSE) from None
    except ClientGone:
        raise APIError(499, "client disconnected") from None
    finally:
        state.upload_slots.release()
    version = await install(state, name, weights, version)
    state.folders.pop(name, None)
    return version
