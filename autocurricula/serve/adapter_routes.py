"""The adapter routes: vLLM's ``load_lora_adapter`` / ``unload_lora_adapter`` and the
``/v1/adapters/{name}`` resource (upload, inspect, delete). Each parses its request, calls
:mod:`~autocurricula.serve.adapter_store` or :mod:`~autocurricula.serve.adapter_upload`, and
shapes the answer."""

from __future__ import annotations

from fastapi import Request

from autocurricula.engine.adapters import check_name
from autocurricula.serve.adapter_store import load_from_folder, remove
from autocurricula.serve.adapter_upload import upload
from autocurricula.serve.request_models import LoraRequest
from autocurricula.serve.state import StateDep
from autocurricula.serve.validation import lora_folder, upload_length


def sent_name(request: Request) -> str:
    """The adapter name exactly as sent: the route's pattern ends in ``$``, which would match
    before a trailing newline and hand ``bob`` to a request for ``bob\\n``."""
    return request.scope["path"].split("/v1/adapters/", 1)[1]


async def load_lora_adapter(body: LoraRequest, state: StateDep):
    """vLLM: load (or hot-swap) a peft / mlx-lm adapter folder that lies inside ``adapter_root``."""
    check_name(body.lora_name)
    version = await load_from_folder(state, body.lora_name, lora_folder(state.adapter_root, body.lora_path))
    return {"name": body.lora_name, "version": version,
            "message": f"Success: LoRA adapter '{body.lora_name}' added successfully."}


async def unload_lora_adapter(body: LoraRequest, state: StateDep):
    """vLLM: remove a player; running requests finish with its weights first."""
    await remove(state, body.lora_name)
    return {"name": body.lora_name, "deleted": True}


async def put_adapter(name: str, request: Request, state: StateDep, scale: float | None = None,
                      version: int | None = None):
    """Create or hot-swap a player from raw safetensors bytes (peft or mlx-lm keys), at
    ``version`` when given (it must be newer than the loaded one)."""
    name = check_name(sent_name(request))
    declared = upload_length(request.headers.get("content-type", ""), request.headers.get("content-length"),
                             scale, version, state.max_upload_bytes)
    version = await upload(state, name, request.receive, declared, scale, version, client=state.client_of(request))
    return {"name": name, "version": version}


async def list_adapters(state: StateDep):
    """Every loaded player's version, rank, scale and residency, in OpenAI list format."""
    return {"object": "list", "data": [state.engine.adapter_info(n) for n in state.engine.players()]}


async def get_adapter(name: str, request: Request, state: StateDep):
    """Version, rank, scale and residency of one player's adapter."""
    return state.engine.adapter_info(sent_name(request))


async def delete_route(name: str, request: Request, state: StateDep):
    """Remove a player."""
    name = sent_name(request)
    await remove(state, name)
    return {"name": name, "deleted": True}


# (method, path, handler), in the order the app matches them
ROUTES = (
    ("POST", "/v1/load_lora_adapter", load_lora_adapter),
    ("POST", "/v1/unload_lora_adapter", unload_lora_adapter),
    ("PUT", "/v1/adapters/{name:path}", put_adapter),
    ("GET", "/v1/adapters", list_adapters),
    ("GET", "/v1/adapters/{name:path}", get_adapter),
    ("DELETE", "/v1/adapters/{name:path}", delete_route),
)
