"""The generation routes (OpenAI's completions, chat completions and model list, plus the batch
extension): each parses its body, calls :mod:`~autocurricula.serve.generation`, and shapes the
answer."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from autocurricula.serve.generation import chat_prompt, complete, complete_batch, open_stream
from autocurricula.serve.request_models import BatchCompletionRequest, ChatRequest, CompletionRequest, SamplingFields
from autocurricula.serve.responses import models_body
from autocurricula.serve.sessions import ADAPTER_HEADER, SESSION_HEADER, session_key
from autocurricula.serve.state import ServerState, StateDep
from autocurricula.serve.validation import chat_max_tokens, check_chat, completion_input, sampling_params


def resolve(state: ServerState, request: Request, model: str | None, user: str | None) -> tuple[str | None, str]:
    """``(player, model name)`` of a request: a mixture's player is the one its conversation drew
    (the ``X-Session-Id`` header, else ``user``, names the conversation; :mod:`.sessions`)."""
    return state.resolve(model, session_key(request.headers.get(SESSION_HEADER), user), request)


async def respond(state: ServerState, chat: bool, request: Request, body: SamplingFields, prompt, max_tokens: int,
                  want_lp: bool):
    params = sampling_params(body, max_tokens, state.max_tokens)
    served = resolve(state, request, body.model, body.user)
    # a mixture's request says which of its adapters served it; other names need no saying (and the
    # base model's name, a path, may not fit a header)
    said = {ADAPTER_HEADER: served[1]} if body.model in state.mixtures else {}
    if body.stream:
        events = await open_stream(state, chat, body, prompt, params, want_lp, served)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **said})
    return JSONResponse(await complete(state, chat, body, prompt, params, want_lp, request.is_disconnected, served),
                        headers=said)


async def completions(body: CompletionRequest, request: Request, state: StateDep):
    """OpenAI text completion (one prompt: a string or a list of token ids)."""
    prompt, max_tokens = completion_input(body)
    return await respond(state, False, request, body, prompt, max_tokens, body.logprobs is not None)


async def batch_completions(body: BatchCompletionRequest, request: Request, state: StateDep):
    """Several text completions, each with its own ``model`` (player) and sampling fields,
    admitted to the engine together in this order, so they share their first batch (what a
    trainer's lockstep tick needs). Answers ``{"object": "list", "data": [...]}``: one
    ``text_completion`` per request, in order, or ``{"error": {...}}`` for one that failed in
    the engine. A request that is invalid, or names an unknown player, refuses the whole batch
    (400 / 404; the fields checked here name ``requests[i]``, the engine's checks of prompt
    length and token ids name the problem), and none of it runs. A request naming a mixture is
    served by its conversation's player (``user``, or the ``X-Session-Id`` header for them all)."""
    return await complete_batch(state, body, request.is_disconnected,
                                lambda model, user: resolve(state, request, model, user))


async def chat_completions(body: ChatRequest, request: Request, state: StateDep):
    """OpenAI chat completion; ``messages`` go through the tokenizer's chat template."""
    check_chat(body)
    ids = await run_in_threadpool(chat_prompt, state, body.messages)
    max_tokens = chat_max_tokens(body, len(ids), state.max_tokens, state.engine.max_context)
    return await respond(state, True, request, body, ids, max_tokens, body.logprobs)


async def models(state: StateDep):
    """The base model, every loaded player (LoRA) and every mixture, in OpenAI list format."""
    engine = state.engine
    return models_body(engine.name, engine.players(), state.folders, engine.max_context,
                       {name: (m.folder, m.weights()) for name, m in state.mixtures.items()})


# (method, path, handler), in the order the app matches them
ROUTES = (
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/batch/completions", batch_completions),
    ("POST", "/v1/chat/completions", chat_completions),
    ("GET", "/v1/models", models),
)
