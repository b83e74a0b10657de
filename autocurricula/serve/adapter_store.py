"""The adapters a server holds: installing them within the memory caps (``max_cpu_adapters``,
``max_cpu_adapter_bytes``), spilling the least recently used idle ones to disk to make room, and
removing them. Engine calls that wait on its thread run on a worker thread (:func:`off_loop`), off the
event loop."""

from __future__ import annotations

import asyncio
import functools
import os

from autocurricula.engine import UnknownPlayerError
from autocurricula.engine.adapters import AdapterError, check_name, load_folder
from autocurricula.engine.spill import host_bytes
from autocurricula.serve.errors import RETRY_LATER, APIError
from autocurricula.serve.state import ServerState


async def off_loop(fn, *args):
    """``fn(*args)`` on a worker thread of the event loop's executor. Not Starlette's
    ``run_in_threadpool``: an idle anyio worker keeps its last job (arguments, result, exception)
    until it gets another, which would keep an adapter's weights, or a refused upload's tensors,
    in memory long after their request; concurrent.futures' workers drop each job when done."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


def preload(state: ServerState, adapters: dict[str, str]) -> None:
    """Load the operator's ``{name: folder}`` before serving (not limited to the adapter root)."""
    if state.max_cpu_adapters is not None and len(adapters) > state.max_cpu_adapters:
        raise ValueError(f"{len(adapters)} adapters to preload exceed max_cpu_adapters={state.max_cpu_adapters}; "
                         "raise it")
    for name, folder in adapters.items():
        check_name(name)
        weights = load_folder(folder, None, state.max_lora_rank)
        state.engine.load_adapter(name, weights)
        state.sizes[name] = host_bytes(weights)
        state.folders[name] = os.path.realpath(folder)


def held_in_memory(state: ServerState) -> list[str]:
    """Players whose weights are in memory (not spilled), least recently used first."""
    infos = [state.engine.adapter_info(n) for n in state.engine.players()]
    return sorted((i["name"] for i in infos if not i["spilled"]), key=lambda n: state.last_use.get(n, -1))


def check_room(state: ServerState, name: str) -> None:
    """Without a spill folder, refuse a new player beyond the cap before its body is read."""
    held, cap = state.engine.players(), state.max_cpu_adapters
    if cap is not None and state.spill_dir is None and name not in held and len(held) >= cap:
        raise APIError(507, f"the server holds {len(held)} adapters, its limit (--max-cpu-adapters "
                            f"{cap}); DELETE /v1/adapters/{{name}} of a player no longer needed, "
                            "raise the limit, or start the server with --adapter-root DIR to spill the least "
                            "recently used adapters to disk")


def check_size(state: ServerState, size: int) -> None:
    """507 for an adapter of ``size`` bytes that alone exceeds ``max_cpu_adapter_bytes`` (uploads:
    from the header, before the data is read)."""
    max_bytes = state.max_cpu_adapter_bytes
    if max_bytes is not None and size > max_bytes:
        raise APIError(507, f"the adapter's weights take {size} bytes, more than this server holds for all "
                            f"adapters (--max-cpu-adapter-bytes {max_bytes}); send a smaller rank, "
                            "or raise the limit")


async def make_room(state: ServerState, name: str, size: int) -> None:
    """Spill least recently used idle players until ``name``'s ``size`` bytes fit under the caps
    (507 when they cannot)."""
    max_count, max_bytes, spill_dir = state.max_cpu_adapters, state.max_cpu_adapter_bytes, state.spill_dir
    if max_count is None and max_bytes is None:
        return
    check_size(state, size)
    check_room(state, name)
    others = [n for n in held_in_memory(state) if n != name]
    count, total = len(others) + 1, sum(state.sizes.get(n, 0) for n in others) + size

    def over() -> bool:
        return (max_count is not None and count > max_count) or (max_bytes is not None and total > max_bytes)

    for victim in others:
        if not over():
            break
        try:
            freed = await off_loop(state.engine.spill_adapter, victim, spill_dir) if spill_dir else False
        except UnknownPlayerError:  # deleted meanwhile: its room is free
            freed = True
        except OSError as exc:
            raise APIError(507, f"cannot spill adapter {victim!r} to {spill_dir} ({exc}); free disk space, or "
                                "raise --max-cpu-adapters / --max-cpu-adapter-bytes") from None
        if freed:
            count, total = count - 1, total - state.sizes.get(victim, 0)
    if over():
        why = ("start the server with --adapter-root DIR to spill the least recently used adapters to disk"
               if spill_dir is None else "every other one is in use by a queued or running request, so none "
                                         "can be spilled to disk; retry when they finish")
        raise APIError(507, f"the server holds {len(others)} adapters of {total - size} bytes in memory, and this "
                            f"one does not fit its limits (--max-cpu-adapters {max_count}, "
                            f"--max-cpu-adapter-bytes {max_bytes}): {why}, or raise the limit",
                       headers=RETRY_LATER if spill_dir else None)


async def install(state: ServerState, name: str, source, version: int | None = None) -> int:
    """Create or hot-swap player ``name`` from ``source`` (a folder inside the adapter root, or
    parsed weights), making room first; returns its new version."""
    check_name(name)
    try:
        check_room(state, name)  # before a folder is read, and again under the lock
        if isinstance(source, str):  # a folder: every file must resolve inside the root
            source = await off_loop(load_folder, source, state.adapter_root, state.max_lora_rank)
        async with state.install_lock:
            await make_room(state, name, host_bytes(source))
            state.touch(name)
            version = await off_loop(state.engine.load_adapter, name, source, version)
            state.sizes[name] = host_bytes(source)
            return version
    except (AdapterError, APIError):
        raise
    except ValueError as exc:
        if version is not None:  # the engine's one check of a given version: newer than every earlier one
            raise APIError(409, f"adapter {name!r}: {exc}; send a newer version (or none, to take the "
                                "next one)", "version") from None
        raise APIError(400, f"cannot load adapter {name!r}: {exc}") from None
    except OSError as exc:  # e.g. an unreadable folder
        raise APIError(400, f"cannot load adapter {name!r}: {exc}") from None


async def load_from_folder(state: ServerState, name: str, folder: str) -> int:
    """Install ``name`` from ``folder`` (already checked to lie inside the root) and remember it."""
    version = await install(state, name, folder)
    state.folders[name] = folder
    return version


async def remove(state: ServerState, name: str) -> None:
    """Remove a player; running requests finish with its weights first."""
    await off_loop(state.engine.unload_adapter, name)
    state.forget(name)
