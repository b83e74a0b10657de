"""Mixtures served as models, and the conversations that keep the adapter they drew.

A mixture (:mod:`autocurricula.publish.mixture`) is a model of the API: a request naming it is
served by one of its adapters, drawn by the mixture's weights when its conversation starts and kept
for the conversation's later turns. A conversation is named by the session key the client sends:
the ``X-Session-Id`` header, else the request's OpenAI ``user`` field (the header wins: ``user``
names an end user, who may play many games, and the header one game). A request with neither is a
conversation of its own and draws afresh. :class:`SessionTable` remembers the draws, least recently
used first out beyond its cap (``--max-mixture-sessions``); a forgotten conversation draws again on
its next turn.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from dataclasses import dataclass

from autocurricula.publish.mixture import MixturePolicy

SESSION_HEADER = "X-Session-Id"
ADAPTER_HEADER = "X-Autocurricula-Adapter"  # the player (adapter) that served a mixture's request


@dataclass
class ServedMixture:
    """Mixture ``name`` as the server holds it: its policy, and the player (engine adapter name,
    ``NAME:ADAPTER``) each of its adapters is loaded as."""

    name: str
    policy: MixturePolicy
    players: dict[str, str]  # adapter name in mixture.json -> player name in the engine
    folder: str

    def weights(self) -> dict[str, float]:
        """``{player: weight}``."""
        return {self.players[n]: w for n, w in self.policy.weights.items()}

    def draw(self, rng) -> str:
        """A player drawn by the weights from ``rng``."""
        return self.players[self.policy.draw(rng)]


def member_name(mixture: str, adapter: str) -> str:
    """The player name of ``adapter`` of ``mixture``: ``mixture:adapter``."""
    return f"{mixture}:{adapter}"


def session_key(header: str | None, user: str | None) -> str | None:
    """The conversation's key: the ``X-Session-Id`` header when sent, else the ``user`` field, else
    None (empty strings count as not sent)."""
    return header or user or None


class SessionTable:
    """``(mixture, session) -> player`` for at most ``cap`` sessions, least recently used out first.
    Keys are kept as 16-byte digests, so a long session key costs no more memory than a short one.
    Used from the event loop only (no lock)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.table: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self.counts: Counter[str] = Counter()  # sessions held per mixture

    def __len__(self) -> int:
        return len(self.table)

    def player(self, mixture: ServedMixture, key: str | None, rng, scope: str = "") -> str:
        """The player of session ``key`` of ``mixture`` (``scope``: the client, so two clients' equal
        keys are two sessions): the one drawn at its first request, or a new draw from ``rng``."""
        if key is None:
            return mixture.draw(rng)
        k = (mixture.name, hashlib.blake2b(f"{scope}\x00{key}".encode("utf-8", "surrogatepass"),
                                           digest_size=16).digest())
        got = self.table.get(k)
        if got is not None:
            self.table.move_to_end(k)
            return got
        player = self.table[k] = mixture.draw(rng)
        self.counts[mixture.name] += 1
        while len(self.table) > self.cap:
            (name, _), _ = self.table.popitem(last=False)
            self.counts[name] -= 1
        return player

    def forget(self, mixture: str) -> None:
        """Drop every session of ``mixture`` (unloaded, or loaded again: its next turns draw anew)."""
        if self.counts.pop(mixture, 0):
            self.table = OrderedDict((k, v) for k, v in self.table.items() if k[0] != mixture)
