"""The adapter routes: vLLM's ``load_lora_adapter`` / ``unload_lora_adapter``, the
``/v1/adapters/{name}`` resource (upload, inspect, delete), and the mixtures (``load_mixture``,
``unload_mixture``, ``GET /v1/mixtures``). Each parses its request, calls
:mod:`~autocurricula.serve.adapter_store`, :mod:`~autocurricula.serve.adapter_upload` or
:mod:`~autocurricula.serve.mixture_store`, and shapes the answer."""

from __future__ import annotations

from fastapi import Request

from autocurricula.engine.adapters import check_name
from autocurricula.serve.adapter_store import load_from_folder, remove
from autocurricula.serve.adapter_upload import upload
from autocurricula.serve.mixture_store import check_not_member, load_mixture, mixture_info, unload_mixture
from autocurricula.serve.request_models import LoraRequest, MixtureRequest
from autocurricula.serve.state import StateDep
from autocurricula.serve.validation import lora_folder, upload_length


def sent_name(request: Request) -> str:
    """The adapter name exactly as sent: the route's pattern ends in ``$``, which would match
    before a trailing newline and hand ``bob`` to a request for ``bob\\n``."""
    return request.scope["path"].split("/v1/adapters/", 1)[1]


async def load_lora_adapter(body: LoraRequest, state: StateDep):
    """vLLM: load (or hot-swap) a peft / mlx-lm adapter folder that lies inside ``adapter_root``."""
    check_name(body.lora_name)
    check_not_member(state, body.lora_name, "load adapter")
    version = await load_from_folder(state, body.lora_name, lora_folder(state.adapter_root, body.lora_path))
    return {"name": body.lora_name, "version": version,
            "message": f"Success: LoRA adapter '{body.lora_name}' added successfully."}


async def unload_lora_adapter(body: LoraRequest, state: StateDep):
    """vLLM: remove a player; running requests finish with its weights first."""
    check_not_member(state, body.lora_name, "unload adapter")
    await remove(state, body.lora_name)
    return {"name": body.lora_name, "deleted": True}


async def put_adapter(name: str, request: Request, state: StateDep, scale: float | None = None,
                      version: int | None = None):
    """Create or hot-swap a player from raw safetensors bytes (peft or mlx-lm keys), at
    ``version`` when given (it must be newer than the loaded one)."""
    name = check_name(sent_name(request))
    check_not_member(state, name, "upload adapter")
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
    check_not_member(state, name, "delete adapter")
    await remove(state, name)
    return {"name": name, "deleted": True}


async def load_mixture_route(body: MixtureRequest, state: StateDep):
    """Load (or replace) a mixture folder that lies inside ``adapter_root`` as model ``mixture_name``:
    each new conversation draws one of its adapters by its weights and keeps it."""
    check_name(body.mixture_name)
    folder = lora_folder(state.adapter_root, body.mixture_path, "mixture_path")
    served = await load_mixture(state, body.mixture_name, folder)
    return {**mixture_info(state, served), "message": f"Success: mixture '{served.name}' loaded with "
                                                      f"{len(served.players)} adapters."}


async def unload_mixture_route(body: MixtureRequest, state: StateDep):
    """Remove a mixture and its adapters; its conversations are forgotten."""
    await unload_mixture(state, body.mixture_name)
    return {"name": body.mixture_name, "deleted": True}


async def list_mixtures(state: StateDep):
    """Every mixture: its adapters' weights (by player name), folder and sessions held."""
    return {"object": "list", "data": [mixture_info(state, m) for m in state.mixtures.values()]}


# (method, path, handler), in the order the app matches them
ROUTES = (
    ("POST", "/v1/load_lora_adapter", load_lora_adapter),
    ("POST", "/v1/unload_lora_adapter", unload_lora_adapter),
    ("PUT", "/v1/adapters/{name:path}", put_adapter),
    ("GET", "/v1/adapters", list_adapters),
    ("GET", "/v1/adapters/{name:path}", get_adapter),
    ("DELETE", "/v1/adapters/{name:path}", delete_route),
    ("POST", "/v1/load_mixture", load_mixture_route),
    ("POST", "/v1/unload_mixture", unload_mixture_route),
    ("GET", "/v1/mixtures", list_mixtures),
)
