"""Generation requests handed to the engine: submitting (the engine queues them for its one MLX
thread; the calls that tokenize run in the thread pool), waiting for the results while watching
for a client that went away, and the answers as OpenAI bodies or server-sent events."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future

from starlette.concurrency import run_in_threadpool

from autocurricula.engine import SamplingParams
from autocurricula.serve.errors import APIError, error_body, failure_body, failure_status
from autocurricula.serve.request_models import BatchCompletionRequest, Message, SamplingFields
from autocurricula.serve.responses import (completion_choice, envelope, first_chat_choice, last_choice, sse, summary,
                                           token_choice)
from autocurricula.serve.state import ServerState
from autocurricula.serve.validation import batch_item_input, chat_messages, check_batch_tokens

Disconnected = Callable[[], Awaitable[bool]]  # Request.is_disconnected


def submit(state: ServerState, prompt, player: str | None, params: SamplingParams, on_token, rid: str) -> Future:
    """Queue one request (its own group of the fair queue); blocks while a text prompt is tokenized."""
    if isinstance(prompt, str):
        state.check_fits(prompt, "prompt")
    state.touch(player)
    try:
        return state.engine.submit(prompt, player, params, on_token=on_token, request_id=rid,
                                   queue_timeout_s=state.max_queue_s, group=rid)
    except ValueError as exc:  # prompt too long / empty / bad token ids
        raise APIError(400, str(exc), "prompt") from None


async def settle(engine, is_disconnected: Disconnected, futs: list[Future], rids: list[str]) -> list[asyncio.Future]:
    """Wait for every future; a client that goes away cancels them all (499)."""
    waiters = [asyncio.wrap_future(f) for f in futs]
    try:
        while not all(w.done() for w in waiters):
            await asyncio.wait(waiters, timeout=0.25, return_when=asyncio.ALL_COMPLETED)
            if not all(w.done() for w in waiters) and await is_disconnected():
                for rid in rids:
                    engine.cancel(rid)
                raise APIError(499, "client disconnected")
    except asyncio.CancelledError:
        for rid in rids:
            engine.cancel(rid)
        raise
    return waiters


def request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


async def complete(state: ServerState, chat: bool, body: SamplingFields, prompt, params: SamplingParams, want_lp: bool,
                   is_disconnected: Disconnected, served: tuple[str | None, str] | None = None) -> dict:
    """One completion or chat completion, answered whole. ``served``: ``(player, model name)`` of
    :meth:`ServerState.resolve` (default: ``body.model``'s, without a session)."""
    (player, model), rid = served or state.resolve(body.model, None), request_id(chat)
    fut = await run_in_threadpool(submit, state, prompt, player, params, None, rid)
    c = (await settle(state.engine, is_disconnected, [fut], [rid]))[0].result()
    ch = completion_choice(chat, c, state.engine.tokenizer.decode, want_lp, body.return_token_ids)
    return envelope(chat, rid, model, [ch], **summary(c))


async def open_stream(state: ServerState, chat: bool, body: SamplingFields, prompt, params: SamplingParams,
                      want_lp: bool, served: tuple[str | None, str] | None = None) -> AsyncIterator[str]:
    """Submit a streamed request (errors before the first token are still HTTP errors) and return
    its server-sent events, ending in ``data: [DONE]``. ``served``: as :func:`complete`'s."""
    (player, model), rid = served or state.resolve(body.model, None), request_id(chat)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    fut = await run_in_threadpool(
        submit, state, prompt, player, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev), rid)
    # Tokens and the final result travel through one FIFO, so the result comes after the last token.
    fut.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, f))
    return stream_events(state.engine, chat, rid, model, events, want_lp, body.return_token_ids)


async def stream_events(engine, chat: bool, rid: str, model: str, events: asyncio.Queue, want_lp: bool,
                        want_ids: bool) -> AsyncIterator[str]:
    """Server-sent events of request ``rid``: a chunk per token event from ``events``, then, on
    its :class:`Future`, the last chunk (or the error, in-band) and ``[DONE]``. A consumer that
    stops early cancels the request."""
    finished = False
    try:
        if chat:
            yield sse(envelope(chat, rid, model, [first_chat_choice()], chunk=True))
        while True:
            ev = await events.get()
            if isinstance(ev, Future):
                finished = True
                try:
                    c = ev.result()
                except Exception as exc:  # the status line is sent already: report in-band
                    yield sse(error_body(failure_status(exc), str(exc)))
                else:
                    yield sse(envelope(chat, rid, model, [last_choice(chat, c, want_ids)], chunk=True, **summary(c)))
                yield "data: [DONE]\n\n"
                return
            ch = token_choice(chat, ev, engine.tokenizer.decode, want_lp, want_ids)
            yield sse(envelope(chat, rid, model, [ch], chunk=True, adapter_version=ev.version))
    finally:
        if not finished:  # the client went away (generator cancelled or closed)
            engine.cancel(rid)


def chat_prompt(state: ServerState, messages: list[Message]) -> list[int]:
    """The token ids of a conversation through the chat template; blocks while it tokenizes."""
    norm = chat_messages(messages, state.max_chat_messages)
    state.check_fits("".join(m["content"] for m in norm), "messages")
    tokenizer = state.engine.tokenizer
    try:  # the rendered text is checked before it is tokenized: the template adds text per message
        state.check_fits(tokenizer.apply_chat_template(norm, add_generation_prompt=True, tokenize=False), "messages")
        return state.engine.apply_chat_template(norm)
    except APIError:
        raise
    except Exception as exc:  # template errors are the conversation's fault
        raise APIError(400, f"cannot apply the chat template: {exc}", "messages") from None


async def complete_batch(state: ServerState, body: BatchCompletionRequest, is_disconnected: Disconnected,
                         resolve: Callable[[str | None, str | None], tuple[str | None, str]] | None = None) -> dict:
    """Several completions admitted together, in order (see ``POST /v1/batch/completions``). An
    invalid request refuses the whole batch before any runs; one that fails in the engine
    answers its error in its place. ``resolve(model, user)``: each request's ``(player, model
    name)`` (default: :meth:`ServerState.resolve` without the request's session header)."""
    resolve = resolve or (lambda model, user: state.resolve(model, user))
    items, names, group = [], [], f"batch-{uuid.uuid4().hex}"  # the whole batch is one group of the fair queue
    checked = [batch_item_input(item, f"requests[{i}]", state.max_tokens, state.check_fits)
               for i, item in enumerate(body.requests)]
    check_batch_tokens([params for _, params in checked], state.max_batch_tokens)
    for item, (prompt, params) in zip(body.requests, checked):
        player, name = resolve(item.model, item.user)
        names.append(name)
        items.append((prompt, player, params, None, f"cmpl-{uuid.uuid4().hex}", state.max_queue_s, group))
    for it in items:
        state.touch(it[1])
    try:
        futs = await run_in_threadpool(state.engine.submit_many, items)
    except ValueError as exc:  # which request: the engine checks them in order
        raise APIError(400, f"a request of the batch: {exc}", "requests") from None
    rids = [it[4] for it in items]
    data = []
    for item, name, rid, w in zip(body.requests, names, rids, await settle(state.engine, is_disconnected, futs, rids)):
        if w.exception() is not None:
            data.append(failure_body(w.exception()))
            continue
        c = w.result()
        ch = completion_choice(False, c, state.engine.tokenizer.decode, item.logprobs is not None,
                               item.return_token_ids)
        data.append(envelope(False, rid, name, [ch], **summary(c)))
    return {"object": "list", "data": data}
