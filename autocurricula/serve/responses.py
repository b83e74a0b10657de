"""OpenAI response bodies built from the engine's results: completions, chat completions, their
stream chunks and the model list. Plain data in, plain dicts out."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

Decode = Callable[[list[int]], str]


def logprobs_body(chat: bool, tokens: list[str], lps: list[float]) -> dict | None:
    """The ``logprobs`` of a choice: ``tokens`` decoded one by one, ``lps`` their logprobs. The
    engine computes no alternatives, so ``top_logprobs`` holds only the sampled token."""
    if not tokens:
        return None
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(tokens, lps)], "refusal": None}
    offsets = [0, *itertools.accumulate(len(t) for t in tokens)][:-1]
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps)],
            "text_offset": offsets}


def choice(chat: bool, text: str, finish: str | None, logprobs: dict | None = None, token_ids: list[int] | None = None,
           prompt_ids: list[int] | None = None, delta: bool = False) -> dict:
    """One choice; ``token_ids`` (and ``prompt_ids``) only when the request asked for them."""
    c: dict[str, Any] = {"index": 0}
    if chat:
        c["delta" if delta else "message"] = {"content": text} if delta else {"role": "assistant", "content": text}
    else:
        c["text"] = text
    c["logprobs"] = logprobs
    c["finish_reason"] = finish
    if token_ids is not None:
        c["token_ids"] = token_ids
        if prompt_ids is not None:
            c["prompt_token_ids"] = prompt_ids
    return c


def completion_choice(chat: bool, c, decode: Decode, want_lp: bool, want_ids: bool) -> dict:
    """The choice of a finished :class:`~autocurricula.engine.Completion`."""
    lp = logprobs_body(chat, [decode([t]) for t in c.token_ids], c.logprobs) if want_lp else None
    return choice(chat, c.text, c.finish_reason, lp, c.token_ids if want_ids else None, c.prompt_ids)


def token_choice(chat: bool, ev, decode: Decode, want_lp: bool, want_ids: bool) -> dict:
    """The choice of a stream chunk carrying one token (an engine ``TokenEvent``)."""
    lp = logprobs_body(chat, [decode([ev.token_id])], [ev.logprob]) if want_lp else None
    return choice(chat, ev.text, None, lp, [ev.token_id] if want_ids else None, delta=True)


def last_choice(chat: bool, c, want_ids: bool) -> dict:
    """The choice of a stream's last chunk: empty, with the finish reason."""
    return choice(chat, "", c.finish_reason, None, [] if want_ids else None, c.prompt_ids, delta=True)


def first_chat_choice() -> dict:
    """A chat stream opens with the assistant's role and no text."""
    return {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def envelope(chat: bool, rid: str, model: str, choices: list[dict], chunk: bool = False, **extra) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices, **extra}


def summary(c) -> dict:
    """Usage and adapter versions of a finished completion (extension fields beyond OpenAI)."""
    n, m = len(c.prompt_ids), len(c.token_ids)
    return {"usage": {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m},
            "adapter_version": c.adapter_version, "version_spans": [list(s) for s in c.version_spans]}


def sse(obj) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def models_body(base: str, players: list[str], folders: dict[str, str], max_context: int,
                mixtures: dict[str, tuple[str, dict[str, float]]] | None = None) -> dict:
    """``GET /v1/models``: the base model, then every loaded player (LoRA) as its child, then every
    mixture (``{name: (folder, {player: weight})}``) with its players' weights in ``mixture``."""
    cards = [(base, base, None)] + [(n, folders.get(n, n), base) for n in players]
    data = [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "autocurricula", "root": root,
             "parent": parent, "max_model_len": max_context} for name, root, parent in cards]
    data += [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "autocurricula", "root": folder,
              "parent": base, "max_model_len": max_context, "mixture": weights}
             for name, (folder, weights) in (mixtures or {}).items()]
    return {"object": "list", "data": data}
