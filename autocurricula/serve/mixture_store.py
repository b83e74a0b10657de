"""The mixtures a server holds (:mod:`.sessions`): loading a mixture folder at start
(``--mixture NAME=FOLDER``) or at run time (``POST /v1/load_mixture``), and removing one. Each of
its adapters is a player ``NAME:ADAPTER`` of the engine (listed, and playable by that name), which
stays as long as the mixture: the adapter routes refuse to replace or delete it alone."""

from __future__ import annotations

from autocurricula.engine import UnknownPlayerError
from autocurricula.engine.adapters import AdapterError, check_name, load_folder
from autocurricula.engine.spill import host_bytes
from autocurricula.publish.mixture import Mixture, MixtureError, MixturePolicy, read_mixture
from autocurricula.serve.adapter_store import install, off_loop, remove
from autocurricula.serve.errors import APIError
from autocurricula.serve.sessions import ServedMixture, member_name
from autocurricula.serve.state import ServerState


def name_conflict(state: ServerState, name: str) -> str | None:
    """Why ``name`` cannot be a mixture's model name, if it cannot (it names something else)."""
    if name == state.engine.name:
        return f"{name!r} is the base model's name"
    if (owner := state.mixture_of(name)) is not None:
        return f"{name!r} is an adapter of mixture {owner!r}"
    if name in state.engine.players():
        return f"{name!r} is a loaded adapter's name"
    return None


def members(name: str, mixture: Mixture) -> dict[str, str]:
    """``{adapter: player}`` of mixture ``name``; a MixtureError when a player name would be too long."""
    out = {}
    for adapter in mixture.names:
        try:
            out[adapter] = check_name(member_name(name, adapter))
        except AdapterError:
            raise MixtureError(f"mixture {name!r}: its adapter {adapter!r} would be served as player "
                               f"{member_name(name, adapter)!r}, longer than 128 characters; choose a shorter "
                               "mixture name") from None
    return out


def read_weights(state: ServerState, mixture: Mixture, root: str | None) -> dict:
    """Every adapter of ``mixture`` parsed and checked against the base model, before any is
    installed (a mixture is loaded whole or not at all). Blocks: run it off the event loop."""
    out = {}
    for adapter, folder in mixture.adapters.items():
        try:
            weights = load_folder(folder, root or str(mixture.folder), state.max_lora_rank)
            weights.validate(state.engine.linear_dims)
        except AdapterError as exc:
            raise MixtureError(f"mixture {str(mixture.folder)!r}: adapter {adapter!r}: {exc}") from None
        except ValueError as exc:  # shapes of another base model
            raise MixtureError(f"mixture {str(mixture.folder)!r}: adapter {adapter!r} does not fit the served base "
                               f"model ({exc}); serve the mixture on the base model it was trained on"
                               f"{f' ({mixture.base_model})' if mixture.base_model else ''}") from None
        out[adapter] = weights
    return out


def preload_mixtures(state: ServerState, mixtures: dict[str, str], preloaded: int = 0) -> None:
    """Load the operator's ``{name: folder}`` before serving (not limited to the adapter root);
    ``preloaded``: adapters loaded beside them, for the ``max_cpu_adapters`` check."""
    read = {}
    for name, folder in mixtures.items():
        check_name(name)
        if (why := name_conflict(state, name)) is not None or name in read:
            raise MixtureError(f"--mixture {name}={folder}: {why or 'the name is given twice'}; give the mixture "
                               "another name")
        mixture = read_mixture(folder)
        read[name] = (mixture, members(name, mixture))
    count = preloaded + sum(len(m.names) for m, _ in read.values())
    if state.max_cpu_adapters is not None and count > state.max_cpu_adapters:
        raise MixtureError(f"{count} adapters to preload (the mixtures' included) exceed max_cpu_adapters="
                           f"{state.max_cpu_adapters}; raise it (--max-cpu-adapters), or serve fewer mixtures")
    for name, (mixture, players) in read.items():
        weights = read_weights(state, mixture, None)
        for adapter, player in players.items():
            state.engine.load_adapter(player, weights[adapter])
            state.sizes[player] = host_bytes(weights[adapter])
            state.folders[player] = str(mixture.adapters[adapter])
        state.mixtures[name] = ServedMixture(name, MixturePolicy(mixture), players, str(mixture.folder))


async def load_mixture(state: ServerState, name: str, folder: str) -> ServedMixture:
    """Load (or replace) mixture ``name`` from ``folder`` (already checked to lie inside the root):
    every adapter is read and checked first, then installed; sessions of a replaced mixture draw
    anew. A refusal leaves the server as it was."""
    check_name(name)
    if (why := name_conflict(state, name)) is not None:
        raise APIError(409, f"cannot load mixture {name!r}: {why}; give the mixture another name", "mixture_name")
    mixture = await off_loop(read_mixture, folder)
    players = members(name, mixture)
    taken = [p for p in players.values() if p in state.engine.players() and state.mixture_of(p) != name]
    if taken:
        raise APIError(409, f"cannot load mixture {name!r}: its player {taken[0]!r} is already a loaded adapter; "
                            "delete it, or give the mixture another name", "mixture_name")
    weights = await off_loop(read_weights, state, mixture, state.adapter_root)
    old = state.mixtures.get(name)
    added = []
    try:
        for adapter, player in players.items():
            new = player not in state.engine.players()
            await install(state, player, weights[adapter])
            if new:
                added.append(player)
            state.folders[player] = str(mixture.adapters[adapter])
    except BaseException:
        for player in added:  # a new mixture is loaded whole or not at all
            try:
                await remove(state, player)
            except UnknownPlayerError:
                pass
        raise
    served = state.mixtures[name] = ServedMixture(name, MixturePolicy(mixture), players, str(mixture.folder))
    state.sessions.forget(name)
    if old is not None:  # players of the old mixture that the new one no longer has
        for player in set(old.players.values()) - set(players.values()):
            try:
                await remove(state, player)
            except UnknownPlayerError:
                pass
    return served


async def unload_mixture(state: ServerState, name: str) -> None:
    """Remove mixture ``name`` and its players; running requests finish with their weights first."""
    served = state.mixtures.pop(name, None)
    if served is None:
        raise APIError(404, f"no mixture {name!r} is loaded (loaded: {sorted(state.mixtures)}); GET /v1/mixtures "
                            "lists them", "mixture_name")
    state.sessions.forget(name)
    for player in served.players.values():
        try:
            await remove(state, player)
        except UnknownPlayerError:
            pass


def check_not_member(state: ServerState, name: str, doing: str) -> None:
    """409 when ``name`` is a mixture (or one of a mixture's players), which the adapter routes do not replace or
    delete alone."""
    if name in state.mixtures:
        raise APIError(409, f"cannot {doing} {name!r}: it is a mixture; POST /v1/unload_mixture removes it, "
                            "or give the adapter another name")
    mixture = state.mixture_of(name)
    if mixture is not None:
        raise APIError(409, f"cannot {doing} {name!r}: it is an adapter of mixture {mixture!r}; load the mixture "
                            "again (POST /v1/load_mixture) or unload it (POST /v1/unload_mixture)")


def mixture_info(state: ServerState, served: ServedMixture) -> dict:
    """One mixture as ``GET /v1/mixtures`` lists it."""
    m = served.policy.mixture
    return {"name": served.name, "object": "mixture", "folder": served.folder, "weights": served.weights(),
            "base_model": m.base_model, "game": m.game, "sessions": state.sessions.counts.get(served.name, 0)}

