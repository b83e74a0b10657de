"""Rollouts on vLLM's OpenAI-compatible servers: :class:`VLLMEngine` is a
:class:`~autocurricula.fleet.fleet.Fleet` over :class:`VLLMWorker` transports, one per server::

    trainer.train("path/to/model", play, servers=["vllm+http://127.0.0.1:8000", "vllm+http://127.0.0.1:8001"])

Each server runs ``vllm serve MODEL --enable-lora --max-loras N --max-lora-rank R`` with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (docs/cluster.md gives the whole command). What travels:

- **Adapters** are written once per version, in peft format, to a folder every server can read
  (:class:`AdapterFolder`), and each server loads them under a versioned name,
  ``<player>@v<version>`` (``POST /v1/load_lora_adapter``). A request names the version current
  when it is sent, so one completion (one turn) never mixes two versions of a player, and reports
  the version that produced it. The previous version is unloaded (``POST
  /v1/unload_lora_adapter``) once no request of this worker uses it, and its folder is removed
  once no server holds it.
- **Completions** go to ``POST /v1/completions`` with the prompt's token ids, ``logprobs=0`` and
  ``return_token_ids``: the prompt ids, completion ids and each sampled token's logprob come
  back as from our servers. vLLM batches concurrent requests itself (continuous batching), so a
  lockstep tick is sent as concurrent requests.
- **Refusals at start-up**, by name: an adapter whose rank exceeds the server's
  ``--max-lora-rank`` (:class:`VLLMRankError`), a module the server's model cannot adapt
  (:class:`VLLMModuleError`), a base model that is not the trainer's (config and weights of the
  folder the server loaded, and its tokenizer's ids of a probe text:
  :class:`~autocurricula.engine.fingerprint.BaseModelMismatchError`).

vLLM's sampler and our update compute slightly different probabilities of the same tokens, so
the update corrects with truncated importance sampling (``GRPOConfig.vllm_importance_sampling_*``,
:mod:`autocurricula.training.loss`); :meth:`VLLMEngine.make_updater` turns it on.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import logging
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from autocurricula.engine.adapters import AdapterWeights, load_folder
from autocurricula.engine.fingerprint import BaseModelMismatchError, fingerprint_engine, fingerprint_folder, model_folder
from autocurricula.engine.protocol import RolloutEngine
from autocurricula.engine.sampling import SamplingParams
from autocurricula.engine.scheduler import Completion
from autocurricula.fleet.client import AsyncClient, NotFoundError, ServerError, UnavailableError
from autocurricula.fleet.fleet import AdapterLost, Fleet, WorkerDown
from autocurricula.fleet.remote import down_on_failure

__all__ = ["SCHEME", "AdapterFolder", "VLLMEngine", "VLLMModuleError", "VLLMRankError", "VLLMRefusal",
           "VLLMWorker", "served_name", "tokenizer_probe", "vllm_urls"]

log = logging.getLogger(__name__)

SCHEME = "vllm+"  # servers=["vllm+http://host:port"]: a vLLM OpenAI server, not ours
# the tokenizer probe: words, digits, punctuation, whitespace runs, accents and CJK, a byte-fallback emoji
PROBE = "Say something long: x o 0123456789 ,.;:!? (a) [b] {c}\n\n\t  ÄÖü éà 你好世界 🙂 <|im_end|>"
_RANK = re.compile(r"LoRA rank (\d+) is greater than max_lora_rank (\d+)")
_MODULES = re.compile(r"expected target modules in (.+?) but received (\[.*?\])")


class VLLMRefusal(ValueError):
    """A vLLM server cannot serve this adapter (see the subclasses)."""


class VLLMRankError(VLLMRefusal):
    """The adapter's rank is above the server's ``--max-lora-rank``."""


class VLLMModuleError(VLLMRefusal):
    """The adapter adapts a module the server's model does not support LoRA on."""


def vllm_urls(servers: Any) -> list[str] | None:
    """The plain URLs of ``servers`` when they name vLLM servers (``vllm+http://...``), None when
    none does; a list mixing them with our servers is refused."""
    urls = [servers] if isinstance(servers, str) else servers
    if not isinstance(urls, (list, tuple)) or not urls or not all(isinstance(u, str) for u in urls):
        return None
    ours = [u for u in urls if not u.startswith(SCHEME)]
    if len(ours) == len(urls):
        return None
    if ours:
        raise ValueError(f"servers mixes vLLM servers ({SCHEME}http://...) with others ({ours}); one fleet runs one "
                         "kind: list only vLLM servers, or only `autocurricula serve` servers")
    plain = [u[len(SCHEME):] for u in urls]
    bad = [u for u in urls if not u[len(SCHEME):].startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"a vLLM server is named {SCHEME}http://host:port (or {SCHEME}https://...), got {bad}")
    return plain


def served_name(player: str, version: int) -> str:
    """The name a player's version is loaded under on a vLLM server: ``<player>@v<version>``."""
    return f"{player}@v{version}"


def tokenizer_probe(without_special: list[int], with_special: list[int]) -> str:
    """A hash of a tokenizer's ids of :data:`PROBE`, without and with special tokens: equal for two
    tokenizers that split text alike."""
    ids = [[int(t) for t in without_special], [int(t) for t in with_special]]
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


class AdapterFolder:
    """Where the trainer writes each player's versions for the vLLM servers to read:
    ``<root>/<player>/v<version>``, a peft folder written once per version (whatever the number of
    servers) by ``write_adapter(weights, folder)``. A version's folder is removed once no server
    holds it and a newer one exists. ``root`` None: a temporary folder, removed by :meth:`close`
    (only servers on this machine can read it)."""

    def __init__(self, write_adapter: Callable[[AdapterWeights, Path], Any], root: str | Path | None = None):
        self.write_adapter = write_adapter
        self.temporary = root is None
        self.root = Path(tempfile.mkdtemp(prefix="autocurricula-vllm-adapters-") if root is None else root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()  # vLLM resolves paths against its own working folder
        self._lock = threading.Lock()
        self._holders: dict[tuple[str, int], set] = {}
        self._newest: dict[str, int] = {}

    def path(self, player: str, version: int) -> Path:
        return self.root / player / f"v{version}"

    def write(self, player: str, version: int, weights: AdapterWeights) -> Path:
        """The folder of ``player`` at ``version``, written now unless it already is."""
        with self._lock:
            folder = self.path(player, version)
            if not (folder / "adapter_config.json").is_file():
                self.write_adapter(weights, folder)
            self._newest[player] = max(version, self._newest.get(player, 0))
            return folder

    def acquire(self, player: str, version: int, holder: Any) -> None:
        with self._lock:
            self._holders.setdefault((player, version), set()).add(holder)

    def release(self, player: str, version: int, holder: Any) -> None:
        """``holder`` no longer holds the version: its folder goes once nobody does and it is not the newest."""
        with self._lock:
            held = self._holders.get((player, version), set())
            held.discard(holder)
            if not held and version < self._newest.get(player, 0):
                self._holders.pop((player, version), None)
                shutil.rmtree(self.path(player, version), ignore_errors=True)

    def close(self) -> None:
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)


class VLLMWorker:
    """The :class:`~autocurricula.fleet.fleet.Worker` transport of one vLLM OpenAI server at ``url``
    (plain ``http://host:port``): ``client`` for completions and adapter loads (``timeout`` before
    the server counts as failed), ``probe`` for health, with a short timeout. ``folder``: the
    :class:`AdapterFolder` shared by every worker of the fleet. ``check_base``: read the server's
    model folder to fingerprint it (it must be readable here)."""

    def __init__(self, url: str, folder: AdapterFolder, api_key: str | None = None, timeout: float = 600.0,
                 check_base: bool = True):
        self.key = self.url = url
        self.label = f"vLLM server {url}"
        self.folder, self.check_base = folder, check_base
        self.client = AsyncClient(url, api_key=api_key, timeout=timeout, max_retries=0)
        self.probe = AsyncClient(url, api_key=api_key, timeout=min(10.0, timeout), max_retries=0)
        self.base_id: str | None = None  # the served model's id: requests without a player name it
        self.instance: str | None = None
        self.current: dict[str, tuple[int, str]] = {}  # player -> (version, served name) requests use
        self.users: dict[str, int] = {}  # served name -> requests of this worker in flight
        self.retiring: dict[str, tuple[str, int]] = {}  # served name -> (player, version), unloaded when unused
        self.stats = {"loads": 0, "unloads": 0}
        self.loaded: list[str] = []  # served names, in load order (tests read it)
        self.unloaded: list[str] = []

    async def ready(self) -> dict:
        models = (await down_on_failure(self.probe.models()))
        base = next((m for m in models if m.get("parent") is None), None)
        if base is None:
            raise WorkerDown(f"{self.label} lists no base model in /v1/models")
        self.base_id = base["id"]
        instance = _start_time(await down_on_failure(self.probe.metrics()))
        if self.instance is not None and instance != self.instance:  # restarted: it holds none of our adapters
            held = [(name, version) for name, (version, _) in self.current.items()] + list(self.retiring.values())
            for name, version in held:
                self.folder.release(name, version, self.key)
            self.current.clear()
            self.retiring.clear()
        self.instance = instance
        fingerprint: dict = {"model": base.get("root") or base["id"]}
        if self.check_base:
            root = fingerprint["model"]
            if model_folder(root) is None:
                raise BaseModelMismatchError(
                    f"cannot check the base model of {self.label}: it serves {root!r}, which is neither a folder nor "
                    "a downloaded Hub model on this machine. Make the model readable here at the same path (as the "
                    "adapter folder must be for the server), or pass check_base=False if you are sure it is the "
                    "trainer's model")
            fingerprint.update(await asyncio.to_thread(fingerprint_folder, root))
            ids = [await down_on_failure(self.probe.tokenize(PROBE, self.base_id, special)) for special in (False, True)]
            fingerprint["tokenizer"] = tokenizer_probe(*ids)
        return {"instance": self.instance, "fingerprint": fingerprint}

    async def holding(self, names: list[str]) -> dict[str, int]:
        served = {m["id"] for m in await down_on_failure(self.client.models())}
        return {n: self.current[n][0] for n in names if n in self.current and self.current[n][1] in served}

    def pack(self, source: Any) -> AdapterWeights:
        """The weights, written to the adapter folder at the first load of each version."""
        if isinstance(source, (str, Path)):
            source = load_folder(source)
        if not isinstance(source, AdapterWeights):
            raise TypeError("source must be AdapterWeights or an adapter folder (peft or mlx-lm)")
        return source

    async def load(self, name: str, payload: AdapterWeights, version: int) -> None:
        folder = await asyncio.to_thread(self.folder.write, name, version, payload)
        served = served_name(name, version)
        try:
            await self._load(served, folder)
        except ServerError as exc:
            if "already been loaded" not in exc.message:
                raise self._refusal(exc, name, version) from exc
            # a lost answer to our own load, or a name left by an earlier run with other weights: load again
            await self._unload(served)
            await self._load(served, folder)
        self.folder.acquire(name, version, self.key)
        self.stats["loads"] += 1
        self.loaded.append(served)
        old = self.current.get(name)
        self.current[name] = (version, served)
        if old is not None and old[1] != served:
            await self._retire(name, *old)

    async def unload(self, name: str) -> None:
        old = self.current.pop(name, None)
        if old is not None:
            await self._retire(name, *old)
        else:
            for m in await down_on_failure(self.client.models()):  # a player dropped while the worker was away
                if m.get("parent") is not None and m["id"].rpartition("@v")[0] == name:
                    await self._unload(m["id"])

    async def complete(self, ids: list[int], player: str | None, params: SamplingParams, rid: str) -> Completion:
        if player is None:
            version, served = None, self.base_id
        elif player in self.current:
            version, served = self.current[player]
        else:
            raise AdapterLost(f"{self.label} holds no version of {player!r}")
        self.users[served] = self.users.get(served, 0) + 1
        try:
            body = await down_on_failure(self.client.completions(**completion_fields(ids, served, params)))
        except NotFoundError as exc:
            if player is None:
                raise
            raise AdapterLost(f"{self.label} does not hold {served!r}") from exc
        finally:
            self.users[served] -= 1
            if not self.users[served]:
                del self.users[served]
                if served in self.retiring:
                    try:
                        await self._unload_retired(served)
                    except Exception as exc:  # noqa: BLE001 - the completion stands; the name stays loaded
                        log.warning("%s: could not unload %s: %s", self.label, served, exc)
        return _completion(body, rid, player, version)

    async def complete_many(self, requests: list[tuple]) -> list:
        """The requests sent at once (vLLM batches them); a server failure or a lost adapter fails
        the whole call (the fleet retries each request), any other error stands in place."""
        outs = await asyncio.gather(*(self.complete(*r) for r in requests), return_exceptions=True)
        for kind in (WorkerDown, AdapterLost):
            failed = next((o for o in outs if isinstance(o, kind)), None)
            if failed is not None:
                raise failed
        return list(outs)

    async def health(self) -> dict:
        """``GET /health``; a connection the server closed while idle is tried once more on a new one."""
        for attempt in range(2):
            try:
                await self.probe.live()
                return {"ok": True, "instance": self.instance}
            except ServerError as exc:
                if exc.status is not None or attempt:
                    return {"ok": False, "instance": self.instance, "why": exc.message}
        raise AssertionError("unreachable")

    async def occupancy(self) -> float:
        """vLLM reports no batch occupancy: 0.0."""
        return 0.0

    async def close(self) -> None:
        await self.client.aclose()
        await self.probe.aclose()

    # ------------------------------------------------------------------ internals
    async def _load(self, served: str, folder: Path) -> None:
        await down_on_failure(self.client.load_lora_adapter(served, str(folder)))

    async def _unload(self, served: str) -> None:
        try:
            await down_on_failure(self.client.unload_lora_adapter(served))
        except NotFoundError:
            pass
        self.stats["unloads"] += 1
        self.unloaded.append(served)

    async def _retire(self, name: str, version: int, served: str) -> None:
        self.retiring[served] = (name, version)
        if not self.users.get(served):
            await self._unload_retired(served)

    async def _unload_retired(self, served: str) -> None:
        name, version = self.retiring.pop(served)
        try:
            await self._unload(served)
        except WorkerDown:  # it is gone; whatever it held goes with it
            pass
        self.folder.release(name, version, self.key)

    def _refusal(self, exc: ServerError, name: str, version: int) -> Exception:
        """vLLM's refusal of an adapter, as an error that names the problem and the fix."""
        rank = _RANK.search(exc.message)
        if rank:
            return VLLMRankError(
                f"{self.label} cannot serve {name!r} (version {version}): its LoRA rank {rank.group(1)} is above the "
                f"server's --max-lora-rank {rank.group(2)}. Restart vLLM with --max-lora-rank {rank.group(1)} (or "
                f"more), or train with a LoRA rank of at most {rank.group(2)}")
        modules = _MODULES.search(exc.message)
        if modules:
            try:
                supported = sorted(ast.literal_eval(modules.group(1)))
                refused = sorted({p.rsplit(".", 1)[-1] for p in ast.literal_eval(modules.group(2))})
            except (ValueError, SyntaxError):  # another vLLM's wording of the lists: show them as sent
                supported, refused = modules.group(1), modules.group(2)
            return VLLMModuleError(
                f"{self.label} cannot serve {name!r} (version {version}): its model supports LoRA only on "
                f"{supported}, and the adapter adapts {refused}. Train with target_modules among those "
                f"(LoraConfig(target_modules=[...]))")
        return exc


class VLLMEngine(Fleet):
    """The rollout engine over vLLM OpenAI servers (module docstring). ``servers``: URLs, plain
    (``http://host:port``) or as ``train(servers=...)`` names them (``vllm+http://host:port``).
    ``base``: the trainer's :class:`~autocurricula.engine.Engine` or model folder, giving the
    tokenizer and the fingerprint every server must match (config and weights of its model
    folder, and its tokenizer). ``write_adapter(weights, folder)``: writes one version as a peft
    folder (``functools.partial(autocurricula.publish.export.export_peft,
    base_model_name_or_path=MODEL)``; ``train(servers=["vllm+http://..."])`` passes it).
    ``adapter_dir``: the folder the versions are written to, which every server must read at the
    same path (default: a temporary folder on this machine). ``api_key``: vLLM's ``--api-key``.
    ``timeout``, ``down_timeout``, ``poll_s``, ``connect_timeout``: as for
    :class:`~autocurricula.fleet.remote.RemoteEngine`."""

    group, key_name, request_prefix = "servers", "url", "vllm"
    hint = ("start them with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --max-loras N "
            "--max-lora-rank R` (docs/cluster.md)")

    def __init__(self, servers: str | list[str], base: Any = None, *, write_adapter: Callable[[AdapterWeights, Path], Any],
                 adapter_dir: str | Path | None = None, tokenizer: Any = None, api_key: str | None = None,
                 timeout: float = 600.0, check_base: bool = True, poll_s: float = 1.0, connect_timeout: float = 60.0,
                 down_timeout: float = 30.0):
        urls = vllm_urls(servers) or ([servers] if isinstance(servers, str) else list(servers))
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"servers must be URLs of vLLM OpenAI servers (http://host:port), got {servers!r}")
        urls = [u.rstrip("/") for u in urls]
        if len(set(urls)) != len(urls):
            raise ValueError(f"servers lists a URL twice: {urls}")
        if not (isinstance(poll_s, (int, float)) and poll_s > 0 and timeout > 0):
            raise ValueError("poll_s and timeout must be positive numbers of seconds")
        if not callable(write_adapter):
            raise TypeError("write_adapter must be a function (weights, folder) that writes a peft folder, e.g. "
                            "functools.partial(autocurricula.publish.export.export_peft, base_model_name_or_path=MODEL)")
        if base is None and (tokenizer is None or check_base):
            raise ValueError("pass base= (the trainer's Engine or model folder) so the servers' base model can be "
                             "checked and prompts tokenized as they do, or tokenizer= with check_base=False")
        tokenizer = tokenizer if tokenizer is not None else _tokenizer_of(base)
        expected = _expected_fingerprint(base, tokenizer) if check_base else None
        self.folder = AdapterFolder(write_adapter, adapter_dir)
        name = base.name if isinstance(base, RolloutEngine) else str(base) if base is not None else "base"
        try:
            super().__init__(lambda: [VLLMWorker(u, self.folder, api_key, timeout, check_base) for u in urls],
                             name=name, tokenizer=tokenizer, expected=expected, check_base=check_base,
                             timeout=timeout, poll_s=poll_s, connect_timeout=connect_timeout,
                             down_timeout=down_timeout)
        except BaseException:
            self.folder.close()
            raise

    @property
    def servers(self) -> list[VLLMWorker]:
        """The servers' transports, in the order given."""
        return self.workers

    def wait_until_up(self, url: str, timeout: float = 30.0) -> bool:
        return super().wait_until_up(url.removeprefix(SCHEME).rstrip("/"), timeout)

    def make_updater(self, engine, grpo_config=None) -> Any:
        """The trainer's in-process Updater, told that its turns were sampled here: it corrects
        the sampler/learner mismatch (``GRPOConfig.vllm_importance_sampling_cap``)."""
        from autocurricula.training import Updater  # the update runs in the trainer's process, on its engine

        return Updater(engine, grpo_config, sampled_by_vllm=True)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.folder.close()

    def _unavailable(self, message: str) -> Exception:
        return UnavailableError(None, message)


def completion_fields(ids: list[int], model: str | None, params: SamplingParams) -> dict:
    """A vLLM completion request's fields: token ids in; token ids and the sampled tokens' logprobs back."""
    fields = dict(prompt=ids, model=model, max_tokens=params.max_tokens, temperature=params.temperature,
                  top_p=params.top_p, stop=params.stop or None, seed=params.seed,
                  ignore_eos=params.ignore_eos or None, logprobs=0, return_token_ids=True)
    if params.top_k:
        fields["top_k"] = params.top_k
    return fields


def _completion(body: dict, rid: str, player: str | None, version: int | None) -> Completion:
    ch = body["choices"][0]
    ids = list(ch["token_ids"])
    lps = [float(x) for x in ((ch.get("logprobs") or {}).get("token_logprobs") or [])]
    if len(lps) != len(ids):
        raise ServerError(None, f"vLLM answered {len(ids)} tokens with {len(lps)} logprobs; it must return one per "
                                "token (logprobs=0)")
    return Completion(request_id=rid, player=player, prompt_ids=list(ch["prompt_token_ids"]), token_ids=ids,
                      logprobs=lps, text=ch.get("text") or "", finish_reason=ch.get("finish_reason") or "length",
                      adapter_version=version, version_spans=[(0, len(ids), version)])


def _start_time(metrics: str) -> str | None:
    """The server process's start time from vLLM's Prometheus text: a restarted server has a new one."""
    m = re.search(r"^process_start_time_seconds\s+(\S+)", metrics, re.M)
    return m.group(1) if m else None


def _expected_fingerprint(base: Any, tokenizer: Any) -> dict:
    """The trainer's side of the check: its model folder's fingerprint and its tokenizer's probe."""
    fp = fingerprint_engine(base) if isinstance(base, RolloutEngine) else fingerprint_folder(base)
    ids = [tokenizer.encode(PROBE, add_special_tokens=special) for special in (False, True)]
    return {**fp, "tokenizer": tokenizer_probe(*ids)}


def _tokenizer_of(base: Any):
    if isinstance(base, RolloutEngine):
        return base.tokenizer
    from mlx_lm.utils import load_tokenizer  # mlx_lm imports transformers: only when no tokenizer is given

    return load_tokenizer(Path(base) if Path(base).exists() else str(base))
