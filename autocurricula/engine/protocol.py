"""What the arena, the trainer and the updater need from an engine, whatever runs it.

Two protocols, one inside the other:

- :class:`RolloutEngine`: generate for named players (LoRA adapters of one base model), install
  and drop their adapters at versions, report health and counters, mirror another engine's
  players (:meth:`~RolloutEngine.sync_from`) and say who updates them
  (:meth:`~RolloutEngine.make_updater`). The arena and the trainer see only this. Three backends
  implement it: the in-process :class:`~autocurricula.engine.Engine` (the default),
  :class:`~autocurricula.fleet.remote.RemoteEngine` (``autocurricula serve`` servers over HTTP) and
  :class:`~autocurricula.fleet.cluster.RayEngine` (Ray actors, each with its own Engine); the last two
  are one :class:`~autocurricula.fleet.fleet.Fleet` over two worker transports.
- :class:`TrainableEngine`: adds what updates and scoring need from the engine whose weights
  change: the host copy of an adapter, hot-swapping a result in, jobs on the engine thread, the
  multi-LoRA stacks lent to a training forward, and completion log-probabilities. The in-process
  Engine implements it; nothing outside ``autocurricula/engine/`` touches more than these.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Protocol, runtime_checkable

from autocurricula.engine.sampling import SamplingParams

__all__ = ["RolloutEngine", "TrainableEngine"]


@runtime_checkable
class RolloutEngine(Protocol):
    """An engine that generates for named players (LoRA adapters of one base model)."""

    name: str  # the base model's name: as a player it means "no adapter"
    tokenizer: Any  # the base model's tokenizer (games may tokenize with it)
    # counters; at least "retried" (requests a failed worker left that another served; 0 in one
    # process). Backends add their own, e.g. the in-process engine's "prefix_hit_rate".
    stats: dict

    def submit(self, prompt: str | list[int], player: str | None = None,
               params: SamplingParams | None = None) -> Future:
        """Queue one completion; the Future resolves to a
        :class:`~autocurricula.engine.scheduler.Completion` (``prompt_ids``, ``token_ids``,
        ``logprobs``, ``text``, ``finish_reason``, ``adapter_version``, ``version_spans``).
        Raises ``UnknownPlayerError`` for a player without an adapter."""
        ...

    def submit_many(self, requests: list[tuple]) -> list[Future]:
        """Queue ``[(prompt, player, params), ...]`` so that they are admitted together, in order
        (the arena's lockstep ticks); all are checked before any is queued."""
        ...

    def load_adapter(self, name: str, source: Any, version: int | None = None) -> int:
        """Install (or hot-swap) a player's adapter at ``version`` (default: the next one); returns
        the version. ``source``: ``AdapterWeights``, an adapter folder or a tensor dict."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Drop a player; requests already running finish with its weights."""
        ...

    def adapter_info(self, name: str) -> dict:
        """At least ``{"name", "version"}`` of a player's adapter."""
        ...

    def players(self) -> list[str]:
        """Names of the players with an adapter installed."""
        ...

    def encode(self, text: str) -> list[int]:
        """Text to token ids with the base model's tokenizer."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Token ids to text, special tokens dropped (as completions report it)."""
        ...

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Chat messages to prompt token ids, generation prompt added."""
        ...

    def health(self) -> dict:
        """``{"ok": bool, ...}``: whether the engine can take requests now."""
        ...

    @property
    def occupancy(self) -> float:
        """Mean rows per decode step over the batch capacity."""
        ...

    def sync_from(self, engine: Any) -> dict:
        """Make this engine's players those of ``engine`` (the trainer's in-process engine): the
        same adapters at the same versions. Returns ``{"pushed": [...], "dropped": [...]}``; an
        engine that is itself the trainer's pushes nothing."""
        ...

    def make_updater(self, engine: Any, grpo_config: Any = None) -> Any:
        """The updater of ``engine``'s players when this backend runs updates itself (e.g. on Ray
        learner actors), else None: the trainer builds its in-process
        :class:`~autocurricula.training.Updater`."""
        ...

    def close(self) -> None:
        """Release threads, connections and memory."""
        ...


@runtime_checkable
class TrainableEngine(RolloutEngine, Protocol):
    """A :class:`RolloutEngine` whose adapters the updater trains in place (the in-process Engine)."""

    linear_dims: dict  # adaptable module path -> (in, out) dims: the shapes an adapter may take
    model_type: str | None  # the family (config.json's model_type): its default LoRA targets

    def adapter_weights(self, name: str) -> Any:
        """The host copy of a player's current ``AdapterWeights`` (what an update starts from)."""
        ...

    def install(self, name: str, weights: Any, version: int | None = None, validate: bool = True) -> int:
        """Hot-swap ``weights`` in for a player (between two decode steps); returns the version."""
        ...

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` as a job on the engine thread (all MLX work runs there)."""
        ...

    def training_stacks(self, paths: Any, rank: int) -> Any:
        """On the engine thread: a context manager lending the multi-LoRA stacks of ``paths`` to a
        training forward (``.set`` differentiable stacks, ``.route`` rows to them)."""
        ...

    def token_logprobs(self, ids: Any, pos: Any, tgt: Any, temperature: float, entropy: bool = False) -> Any:
        """On the engine thread, inside :meth:`training_stacks`: differentiable log-probabilities
        of tokens ``tgt`` at positions ``pos`` of ``ids`` (and entropies with ``entropy``)."""
        ...

    def tree_fallback(self) -> str | None:
        """Why the update cannot pack this model's rows as prefix trees, or None where it can."""
        ...

    def tree_pair_cost(self) -> float:
        """One attention score's cost in units of one token's work (where tree packing cuts its tries)."""
        ...

    def tree_logprobs(self, ids: Any, positions: Any, tin: Any, tout: Any, pick: Any, tgt: Any, temperature: float,
                      entropy: bool = False) -> Any:
        """:meth:`token_logprobs` for rows packed as prefix trees (one tree per batch row)."""
        ...

    def completion_logprobs(self, pairs: list[tuple[list[int], list[int]]], player: str | None = None,
                            temperature: float = 1.0) -> list[float]:
        """For each ``(prompt_ids, completion_ids)``, the summed log-probability of the completion
        under a player's adapter (branch credit scores moves with it)."""
        ...

