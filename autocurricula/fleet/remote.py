"""An engine made of ``autocurricula serve`` servers: :class:`RemoteEngine` is a
:class:`~autocurricula.fleet.fleet.Fleet` over :class:`HttpWorker` transports, one per server::

    remote = RemoteEngine(["http://127.0.0.1:8000", "http://127.0.0.1:8001"], base="path/to/model")
    remote.load_adapter("alice", weights, version=3)     # pushed to every server holding alice
    c = remote.submit("Once upon", "alice", SamplingParams(max_tokens=16)).result()

Adapters travel as safetensors with their version. A server's versions of a name only grow, so it
may hold a player at a newer version from another run: ``known_players="adopt"`` (default) serves
the upload under an offset, completions reporting the trainer's version; ``"refuse"`` raises
:class:`PlayerVersionConflict`. A server unreachable, timing out or answering 503 is down.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from autocurricula.fleet.client import AsyncClient, ConflictError, NotFoundError, ServerError, UnavailableError
from autocurricula.engine.adapters import AdapterWeights, from_tensors, load_folder, to_safetensors_bytes
from autocurricula.engine.fingerprint import BaseModelMismatchError, fingerprint_engine, fingerprint_folder
from autocurricula.engine.protocol import RolloutEngine
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion
from autocurricula.fleet.fleet import AdapterLost, Fleet, WorkerDown

__all__ = ["BaseModelMismatchError", "HttpWorker", "PlayerVersionConflict", "RemoteEngine"]

log = logging.getLogger(__name__)
KNOWN_PLAYERS = ("adopt", "refuse")


class PlayerVersionConflict(RuntimeError):
    """A server already holds a player of this name at a newer version (``known_players="refuse"``)."""


class HttpWorker:
    """The :class:`~autocurricula.fleet.fleet.Worker` transport of one server: ``client`` for generation
    and uploads (``timeout`` before the server counts as failed), ``probe`` for health and fingerprint
    with a short timeout; ``known_players`` as in the module docstring."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0, known_players: str = "adopt"):
        self.known_players = _known_players(known_players)
        self.key = self.url = url
        self.label = f"server {url}"
        self.client = AsyncClient(url, api_key=api_key, timeout=timeout, max_retries=0)
        self.probe = AsyncClient(url, api_key=api_key, timeout=min(10.0, timeout), max_retries=0)
        # player -> server version minus ours, for players the server knew from an earlier run;
        # applied to every upload and every completion
        self.offset: dict[str, int] = {}

    async def ready(self) -> dict:
        fp = await down_on_failure(self.probe.fingerprint())
        return {"instance": fp.get("instance"), "fingerprint": fp}

    async def holding(self, names: list[str]) -> dict[str, int]:
        out = {}
        for name in names:
            try:
                info = await down_on_failure(self.client.adapter_info(name))
            except NotFoundError:
                continue
            out[name] = info["version"] - self.offset.get(name, 0)
        return out

    def pack(self, source: Any) -> bytes:
        return _safetensors_of(source)

    async def load(self, name: str, payload: bytes, version: int) -> None:
        off = self.offset.get(name, 0)
        try:
            await down_on_failure(self.client.upload_adapter(name, payload, version=version + off))
        except ConflictError:
            try:
                now = (await down_on_failure(self.client.adapter_info(name)))["version"]
            except NotFoundError:
                now = None
            if now != version + off:  # not a lost answer: the name was used before there
                self._reconcile(name, now, version)
                there = (await down_on_failure(self.client.upload_adapter(name, payload)))["version"]
                self.offset[name] = there - version
                log.warning("server %s held player %r at version %s from an earlier run: adopted its numbering "
                            "(version %d there is %d here; completions report this trainer's versions)",
                            self.url, name, now, there, version)

    def _reconcile(self, name: str, held: int | None, version: int) -> None:
        """With ``known_players="refuse"``, the error that says how to reset the server's player."""
        if self.known_players == "refuse":
            raise PlayerVersionConflict(
                f"server {self.url} already holds player {name!r} at version {held}, ahead of this trainer's "
                f"version {version}: a player left from an earlier run under the same name. Restart that server, "
                f"or remove the player (`curl -X DELETE {self.url}/v1/adapters/{name}`, or "
                f"Client({self.url!r}).unload_adapter({name!r})), or pass known_players='adopt' to continue "
                "from the server's numbering")

    async def unload(self, name: str) -> None:
        try:
            await down_on_failure(self.client.unload_adapter(name))
        except NotFoundError:
            pass

    async def complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        try:
            body = await down_on_failure(self.client.completions(**_fields(ids, player, params)))
        except NotFoundError as exc:
            raise AdapterLost(f"{self.label} does not hold {player!r}") from exc
        return self._completion(body, rid, player)

    async def complete_many(self, requests: list[tuple]) -> list:
        """One ``POST /v1/batch/completions``: the server admits them together."""
        try:
            bodies = await down_on_failure(self.client.batch_completions([_fields(*r[:3]) for r in requests]))
        except NotFoundError as exc:
            raise AdapterLost(f"{self.label} lost an adapter") from exc
        out: list = []
        for (_, player, _, rid), body in zip(requests, bodies):
            if "error" in body:
                err = body["error"]
                out.append(ServerError(err.get("code"), err.get("message", str(err)), body))
            else:
                out.append(self._completion(body, rid, player))
        return out

    async def health(self) -> dict:
        h = await down_on_failure(self.probe.health())
        return {**h, "ok": h.get("status") == "ok", "instance": h.get("instance")}

    async def occupancy(self) -> float:
        return float((await down_on_failure(self.probe.stats()))["occupancy"])

    async def close(self) -> None:
        await self.client.aclose()
        await self.probe.aclose()

    def _completion(self, body: dict, rid: str, player: str | None) -> Completion:
        ch = body["choices"][0]
        lps = (ch.get("logprobs") or {}).get("token_logprobs") or []
        offset = self.offset.get(player, 0) if player else 0
        ours = lambda v: None if v is None else v - offset  # noqa: E731 - the server's version in the trainer's numbering
        return Completion(request_id=rid, player=player, prompt_ids=list(ch["prompt_token_ids"]),
                          token_ids=list(ch["token_ids"]), logprobs=[float(x) for x in lps], text=ch["text"],
                          finish_reason=ch["finish_reason"], adapter_version=ours(body.get("adapter_version")),
                          version_spans=[(s, e, ours(v)) for s, e, v in body.get("version_spans") or []])


class RemoteEngine(Fleet):
    """The rollout engine over ``autocurricula serve`` servers (module docstring). ``servers``: a URL or
    a list. ``base``: a model folder, Hub id or :class:`~autocurricula.engine.Engine` giving the
    tokenizer and the fingerprint every server must match (or pass ``tokenizer`` and ``fingerprint``,
    or ``check_base=False``). ``api_key``: sent to every server. ``known_players``: "adopt" or "refuse".
    ``timeout``: seconds before a request's server counts as failed. ``down_timeout``: how long
    requests wait for a server to come back once every server is down (then they fail, naming the
    servers: a round stops within about this, not after its games' timeout). ``poll_s``:
    health-probe period.
    """

    group, key_name, request_prefix = "servers", "url", "remote"
    hint = "start them with `autocurricula serve --model M`"

    def __init__(self, servers: str | list[str], base: Any = None, *, tokenizer: Any = None,
                 api_key: str | None = None, timeout: float = 600.0, check_base: bool = True,
                 fingerprint: dict | None = None, poll_s: float = 1.0, connect_timeout: float = 30.0,
                 known_players: str = "adopt", down_timeout: float = 30.0):
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError("servers must be a list of http(s):// URLs of `autocurricula serve` servers, "
                             f"got {servers!r}")
        urls = [u.rstrip("/") for u in urls]
        if len(set(urls)) != len(urls):
            raise ValueError(f"servers lists a URL twice: {urls}")
        if not (isinstance(poll_s, (int, float)) and poll_s > 0 and timeout > 0):
            raise ValueError("poll_s and timeout must be positive numbers of seconds")
        tokenizer = tokenizer if tokenizer is not None else _tokenizer_of(base)
        if check_base and fingerprint is None:
            if base is None:
                raise ValueError("pass base= (the trainer's model folder, Hub id or Engine) so the servers' base "
                                 "model can be checked, or check_base=False")
            fingerprint = fingerprint_engine(base) if isinstance(base, RolloutEngine) else fingerprint_folder(base)
        name = base.name if isinstance(base, RolloutEngine) else str(base) if base is not None else "base"
        _known_players(known_players)  # refused now, not at the first upload
        super().__init__(lambda: [HttpWorker(u, api_key, timeout, known_players) for u in urls], name=name, tokenizer=tokenizer,
                         expected=fingerprint if check_base else None, check_base=check_base, timeout=timeout,
                         poll_s=poll_s, connect_timeout=connect_timeout, down_timeout=down_timeout)

    @property
    def servers(self) -> list[HttpWorker]:
        """The servers' transports (``url``, ``client``), in the order given."""
        return self.workers

    def wait_until_up(self, url: str, timeout: float = 30.0) -> bool:
        """Block until the server at ``url`` is up (re-synced) or ``timeout`` runs out."""
        return super().wait_until_up(url.rstrip("/"), timeout)

    def _unavailable(self, message: str) -> Exception:
        return UnavailableError(None, message)


def _known_players(value: str) -> str:
    if value not in KNOWN_PLAYERS:
        raise ValueError(f"known_players must be one of {KNOWN_PLAYERS}, got {value!r}")
    return value


async def down_on_failure(call):
    """Await a client call; no answer (refused, reset, timed out) or 503 is the server's failure."""
    try:
        return await call
    except ServerError as exc:
        if exc.status in (None, 503):
            raise WorkerDown(exc.message) from exc
        raise


def _fields(ids: list[int], player: str | None, params: SamplingParams) -> dict:
    """A completion request's fields: token ids in, token ids and logprobs back."""
    return dict(prompt=ids, model=player, max_tokens=params.max_tokens, temperature=params.temperature,
                top_p=params.top_p, top_k=params.top_k, stop=params.stop or None, seed=params.seed,
                ignore_eos=params.ignore_eos or None, logprobs=0, return_token_ids=True)


def _safetensors_of(source: Any) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, Path)):
        source = load_folder(source)
    elif isinstance(source, dict) and isinstance(source.get("tensors"), dict):
        source = from_tensors({k: np.asarray(v) for k, v in source["tensors"].items()}, scale=source.get("scale"))
    if not isinstance(source, AdapterWeights):
        raise TypeError("source must be AdapterWeights, an adapter folder, safetensors bytes or "
                        "{'tensors': {...}, 'scale': s}")
    return to_safetensors_bytes(source)


def _tokenizer_of(base: Any):
    if base is None:
        raise ValueError("pass base= (the trainer's model folder, Hub id or Engine) or tokenizer= so prompts "
                         "can be tokenized as the servers do")
    if isinstance(base, RolloutEngine):
        return base.tokenizer
    from mlx_lm.utils import load_tokenizer  # mlx_lm imports transformers: only when no tokenizer is given

    return load_tokenizer(Path(base) if Path(base).exists() else str(base))
