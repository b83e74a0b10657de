"""Checks of a parsed request beyond its schema, and its translation into engine terms: each
raises :class:`~autocurricula.serve.errors.APIError` with the answer a client gets, before
anything reaches the engine."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from autocurricula.engine import SamplingParams
from autocurricula.engine.adapters import finite32
from autocurricula.engine.sampling import INT32_MAX
from autocurricula.serve.errors import CLOSE, APIError
from autocurricula.serve.request_models import ChatRequest, CompletionRequest, Message, SamplingFields, valid_unicode

# Fields we do not implement: accepted only at their neutral value, so nobody gets silently ignored.
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "best_of": 1,
           "logit_bias": None, "suffix": None, "tools": None, "tool_choice": "none", "min_tokens": 0}
DEFAULT_MAX_TOKENS = 16  # a completion's max_tokens when none is sent (OpenAI's default)
UPLOAD_TYPES = ("", "application/octet-stream", "application/x-safetensors")


# ---------------------------------------------------------------- generation requests
def sampling_params(body: SamplingFields, max_tokens: int, limit: int) -> SamplingParams:
    """The engine's sampling parameters for ``body``; ``limit``: the server's largest max_tokens."""
    for key, neutral in NEUTRAL.items():
        value = getattr(body, key, None)
        if value not in (None, neutral, [], {}):
            raise APIError(400, f"{key} is not supported by this server; omit it", key)
    if body.n not in (None, 1):
        raise APIError(400, "only n=1 is supported; send n requests instead (the server batches them)", "n")
    if max_tokens > limit:
        raise APIError(400, f"max_tokens={max_tokens} exceeds this server's limit of {limit}; lower it",
                       "max_tokens")
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
            stop=body.stop or [], seed=body.seed, ignore_eos=body.ignore_eos)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def one_prompt(prompt: Any, where: str | None = None) -> str | list[int]:
    """A completion's prompt: a text or token ids; a list of one of them is unwrapped, a list of
    several refused. ``where`` names the request inside a batch."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            if where is None:
                raise APIError(400, "only one prompt per request is supported; send one request per "
                                    "prompt (the server batches concurrent requests)", "prompt")
            raise APIError(400, f"{where}.prompt: one prompt per request; add a request per prompt", where)
        prompt = prompt[0]
    return prompt


def completion_input(body: CompletionRequest) -> tuple[str | list[int], int]:
    """The prompt and max_tokens of ``POST /v1/completions``."""
    prompt = one_prompt(body.prompt)
    if body.echo:
        raise APIError(400, "echo is not supported; prepend the prompt to the returned text yourself", "echo")
    return prompt, DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens


def batch_item_input(item: CompletionRequest, where: str, limit: int,
                     fits: Callable[[str, str], None]) -> tuple[str | list[int], SamplingParams]:
    """The prompt and sampling parameters of one request of a batch; errors name ``where``.
    ``fits(text, param)`` refuses a text prompt too long for the context."""
    prompt = one_prompt(item.prompt, where)
    if item.stream:
        raise APIError(400, f"{where}.stream: a batch is answered as a whole; stream with "
                            "/v1/completions instead", where)
    if item.echo:
        raise APIError(400, f"{where}.echo is not supported", where)
    try:
        params = sampling_params(item, DEFAULT_MAX_TOKENS if item.max_tokens is None else item.max_tokens, limit)
        if isinstance(prompt, str):
            fits(prompt, where)
    except APIError as exc:
        raise APIError(exc.status, f"{where}: {exc.message}", where) from None
    return prompt, params


def check_batch_tokens(params: list[SamplingParams], limit: int) -> None:
    if (asked := sum(p.max_tokens for p in params)) > limit:
        raise APIError(400, f"the batch asks for {asked} tokens (the sum of its max_tokens), more than this "
                            f"server's limit of {limit} (--max-batch-tokens); split it or lower max_tokens",
                       "requests")


def check_chat(body: ChatRequest) -> None:
    if body.top_logprobs:
        raise APIError(400, "top_logprobs is not supported (only the sampled token's logprob is "
                            "computed); use logprobs: true without top_logprobs", "top_logprobs")


def chat_messages(messages: list[Message], limit: int) -> list[dict]:
    """``messages`` as the chat template takes them, ``{"role", "content"}`` with text content
    (OpenAI content parts joined); at most ``limit`` of them."""
    if len(messages) > limit:
        raise APIError(400, f"messages holds {len(messages)} messages, more than this server's limit of "
                            f"{limit} (--max-chat-messages); shorten the conversation", "messages")
    norm = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):  # OpenAI content parts: only text is understood
            if any(not isinstance(p, dict) or p.get("type") != "text" or set(p) - {"type", "text"}
                   or not isinstance(p.get("text"), str) for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported, as "
                                    '{"type": "text", "text": "..."}', "messages")
            content = "".join(p["text"] for p in content)
            try:
                valid_unicode(content)
            except ValueError as exc:
                raise APIError(400, f"messages[{i}].content {exc}", "messages") from None
        norm.append({"role": m.role, "content": content})
    return norm


def chat_max_tokens(body: ChatRequest, prompt_tokens: int, limit: int, context: int) -> int:
    """``max_tokens`` (or ``max_completion_tokens``); when neither is sent, what the context leaves."""
    max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
    if max_tokens is None:
        max_tokens = min(limit, context - prompt_tokens)
        if max_tokens <= 0:
            raise APIError(400, f"the conversation ({prompt_tokens} tokens) fills the context of "
                                f"{context} tokens; shorten it", "messages")
    return max_tokens


def longest_token_chars(tokenizer) -> int:
    """Characters of the vocabulary's longest token: no text is fewer tokens than its length over this."""
    try:
        return max(len(t) for t in tokenizer.get_vocab())
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: a generous bound
        return 256


def check_fits(text: str, param: str, context: int, token_chars: int, encode: Callable[[str], list[int]]) -> None:
    """Refuse text that cannot fit ``context`` tokens without tokenizing all of it: no token is
    longer than ``token_chars``, and a prefix's tokens already count."""
    cap = context * token_chars
    if len(text) > cap:
        raise APIError(400, f"{param} has {len(text)} characters, more than the context of {context} tokens "
                            f"can hold with this tokenizer (at most {cap}); shorten it", param)
    probe = 4 * context
    if len(text) > probe and (n := len(encode(text[:probe]))) > context + 64:  # 64: a cut last word
        raise APIError(400, f"{param} is longer than the context of {context} tokens (its first {probe} "
                            f"characters alone are {n} tokens); shorten it", param)


# ---------------------------------------------------------------- adapter requests
def lora_folder(root: str | None, lora_path: str | None, param: str = "lora_path") -> str:
    """The folder ``load_lora_adapter`` (or ``load_mixture``: ``param`` names the field) reads:
    ``lora_path`` resolved inside the adapter root."""
    what = "a mixture folder" if param == "mixture_path" else "an adapter folder"
    if root is None:
        raise APIError(403, "loading adapters from server paths is disabled; start the server with "
                            "--adapter-root DIR (or upload the weights with PUT /v1/adapters/{name}, or serve a "
                            "mixture with --mixture NAME=FOLDER)", param)
    if not lora_path:
        raise APIError(400, f"{param} is required: {what}, relative to the adapter root", param)
    if "\x00" in lora_path:
        raise APIError(400, f"{param} contains a NUL character", param)
    path = os.path.realpath(os.path.join(root, lora_path))
    if os.path.commonpath([root, path]) != root:
        raise APIError(403, f"{param} {lora_path!r} is outside the server's adapter root; "
                            f"put {what} inside --adapter-root", param)
    if not os.path.isdir(path):
        raise APIError(400, f"{param} {lora_path!r} is not a folder inside the adapter root", param)
    return path


def upload_length(content_type: str, content_length: str | None, scale: float | None, version: int | None,
                  limit: int) -> int | None:
    """Check an adapter upload's headers and query before its body is read; returns the
    declared length (None when not sent). ``limit``: the largest upload in bytes."""
    if version is not None and not 1 <= version <= INT32_MAX:
        raise APIError(400, f"version must be an integer in [1, {INT32_MAX}]", "version")
    ctype = content_type.split(";")[0].strip().lower()
    if ctype not in UPLOAD_TYPES:
        raise APIError(415, f"content-type {ctype!r} is not accepted; send the raw .safetensors bytes "
                            "as application/octet-stream")
    if scale is not None and not finite32(scale):  # 1e39 is finite only as float64
        raise APIError(400, "scale must be a finite number in float32's range (|scale| <= 3.4e38)", "scale")
    declared = int(content_length) if content_length and content_length.isdigit() else None
    if declared is not None and declared > limit:
        raise APIError(413, f"adapter upload of {declared} bytes exceeds the limit of {limit} bytes "
                            "(--max-upload-bytes)", headers=CLOSE)
    return declared
