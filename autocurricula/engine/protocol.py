"""What the arena and the trainer need from an engine, whatever runs it.

Three backends implement it: the in-process :class:`~autocurricula.engine.Engine` (the default),
:class:`~autocurricula.remote.RemoteEngine` (one or many ``autocurricula serve`` servers over
HTTP) and :class:`~autocurricula.cluster.RayEngine` (Ray actors, each with its own Engine). Code that only plays games takes an ``EngineProtocol``; code that trains
adapters (the updater, the pool) needs the in-process engine, whose weights it changes, through
three more public methods of :class:`~autocurricula.engine.Engine`: ``adapter_weights(name)`` (the
host copy to train from), ``install(name, weights)`` (hot-swap the result, returns the version) and
``training_stacks(paths, rank)`` (on the engine thread: lend the multi-LoRA stacks to a training
forward and route rows to them). Nothing outside ``autocurricula/engine/`` touches more than these.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from autocurricula.engine.sampling import SamplingParams

__all__ = ["EngineProtocol"]


@runtime_checkable
class EngineProtocol(Protocol):
    """An engine that generates for named players (LoRA adapters of one base model)."""

    name: str  # the base model's name: as a player it means "no adapter"
    tokenizer: Any  # the base model's tokenizer (games may tokenize with it)
    # counters; backends add their own (the in-process engine: "prefix_hit_tokens",
    # "prefix_query_tokens", "prefix_hit_rate"; remote servers: "retried")
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

    def close(self) -> None:
        """Release threads, connections and memory."""
        ...
