"""The JSON bodies the server accepts, as strict pydantic models: JSON types must match exactly
(``max_tokens: true`` is a 400), integers are bounded, and an unknown field is refused by name.
They are also the OpenAPI schema that clients and the fuzz tests read."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from autocurricula.engine.sampling import INT32_MAX, SEED_MAX

MAX_CHAT_MESSAGES = 4096  # the schema's bound; create_app's max_chat_messages may be lower


def valid_unicode(text: str) -> str:
    """``text`` unchanged; ValueError when it holds a lone surrogate (it could not be encoded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate {ascii(text[exc.start])} at character {exc.start}; send valid "
                         "Unicode text (a surrogate must be half of a pair)") from None
    return text


# Strings that can be encoded (and echoed back in errors): a lone surrogate is the sender's fault.
Text = Annotated[StrictStr, AfterValidator(valid_unicode)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class StrictModel(BaseModel):
    # strict: no coercion (true is not 1, "yes" is not true); forbid: an unknown field is named
    model_config = ConfigDict(strict=True, extra="forbid")


class SamplingFields(StrictModel):
    # the fields completions and chat completions share (no docstring: it would enter the schema)
    model: Text | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=100)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1, le=INT32_MAX)] | None = None
    stop: Text | list[Text] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=SEED_MAX)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = 1
    stream: StrictBool = False
    ignore_eos: StrictBool = False
    return_token_ids: StrictBool = False
    # not implemented: accepted only at the neutral value (validation.NEUTRAL), refused by name otherwise
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] | None = None
    logit_bias: dict[str, Number] | None = None
    # harmless bookkeeping: accepted and ignored (usage is always in the last stream chunk)
    user: Text | None = None
    metadata: dict[str, Text] | None = None
    store: StrictBool | None = None
    service_tier: Text | None = None
    stream_options: dict[str, StrictBool] | None = None


class CompletionRequest(SamplingFields):
    prompt: Text | list[StrictInt] | list[Text] | list[list[StrictInt]]
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    echo: StrictBool = False
    best_of: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    suffix: Text | None = None


class BatchCompletionRequest(StrictModel):
    requests: list[CompletionRequest] = Field(min_length=1, max_length=4096)


class Message(StrictModel):
    """One chat message: text only (no tools, images or names)."""

    role: Literal["system", "user", "assistant"]
    content: Text | list[dict[str, Any]]


class ChatRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    tools: list[Any] | None = None
    tool_choice: Text | None = None
    parallel_tool_calls: StrictBool | None = None


class LoraRequest(StrictModel):
    lora_name: Text
    lora_path: Text | None = None  # required by load_lora_adapter


class MixtureRequest(StrictModel):
    mixture_name: Text
    mixture_path: Text | None = None  # required by load_mixture
