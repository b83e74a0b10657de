"""The server's request checks, adapter bookkeeping and response shaping, called directly: no
HTTP client, no sockets, and a stand-in for the engine where one is needed."""

import asyncio
import json
import struct
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request

from autocurricula.engine import EngineDeadError, UnknownPlayerError
from autocurricula.engine.adapters import AdapterError, AdapterWeights, check_name
from autocurricula.engine.scheduler import QueueTimeoutError
from autocurricula.serve import adapter_store, generation, responses, validation
from autocurricula.serve.adapter_routes import sent_name
from autocurricula.serve.adapter_upload import read_upload, upload
from autocurricula.serve.errors import (CLOSE, PARSE_ERROR, RETRY_LATER, APIError, failure_body, failure_status,
                                        http_error_response, validation_message)
from autocurricula.serve.middleware import AuthMiddleware, BodyLimit
from autocurricula.serve.operation_routes import health_body, stats_body
from autocurricula.serve.request_models import ChatRequest, CompletionRequest, LoraRequest, Message
from autocurricula.serve.state import ServerState, check_limits


# ------------------------------------------------------------------ a stand-in engine
class FakeTokenizer:
    def __init__(self, vocab=("a", "bcd")):
        self.vocab = vocab

    def get_vocab(self):
        return {t: i for i, t in enumerate(self.vocab)}

    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


class FakeEngine:
    """The public engine API the server uses, recording what it is asked to do."""

    name, max_context = "base", 100

    def __init__(self, players=(), busy=()):
        self.config = SimpleNamespace(max_batch=4, preempt_after_steps=16)
        self.tokenizer = FakeTokenizer()
        self.spilled = {p: False for p in players}
        self.busy = set(busy)  # players a queued or running request uses: they cannot be spilled
        self.spill_calls, self.cancelled, self.encoded, self.submitted, self.loaded = [], [], [], [], []
        self.load_error: Exception | None = None
        self.spill_errors: dict[str, Exception] = {}
        self.ok = True
        self.stats = {"paused": 3, "tokens": 7}
        self.occupancy = 0.5

    def players(self):
        return sorted(self.spilled)

    def adapter_info(self, name):
        if name not in self.spilled:
            raise UnknownPlayerError(f"unknown player {name!r}")
        return {"name": name, "spilled": self.spilled[name]}

    def spill_adapter(self, name, folder):
        self.spill_calls.append((name, folder))
        if name in self.spill_errors:
            raise self.spill_errors[name]
        if name in self.busy:
            return False
        self.spilled[name] = True
        return True

    def load_adapter(self, name, source, version=None):
        if self.load_error is not None:
            raise self.load_error
        self.loaded.append((name, source, version))
        self.spilled[name] = False
        return version or 1

    def unload_adapter(self, name):
        del self.spilled[name]

    def encode(self, text):
        self.encoded.append(text)
        return [0] * len(text)  # a token per character: the worst case check_fits guards against

    def submit(self, prompt, player, params, **kw):
        if prompt == "boom":
            raise ValueError("prompt is empty; give at least one token")
        self.submitted.append((prompt, player, params, kw))
        return Future()

    def cancel(self, rid):
        self.cancelled.append(rid)

    def health(self):
        return {"ok": self.ok, "queued": 2, "running": 1}


def state_for(engine=None, **kw) -> ServerState:
    return ServerState(engine or FakeEngine(), max_tokens=kw.pop("max_tokens", 50),
                       max_batch_tokens=kw.pop("max_batch_tokens", 100), **kw)


def weights(n_bytes_per_matrix: int = 32) -> AdapterWeights:
    k = n_bytes_per_matrix // 8  # float32 (k, 2) and (2, k)
    return AdapterWeights({"m": (np.zeros((k, 2), np.float32), np.zeros((2, k), np.float32))}, 1.0)


def refused(fn, *args, status=400, param="unset", match=""):
    """Call ``fn``; it must raise APIError with this status (and param, when given)."""
    with pytest.raises(APIError) as info:
        fn(*args)
    assert info.value.status == status, info.value.message
    if param != "unset":
        assert info.value.param == param
    assert match in info.value.message, info.value.message
    return info.value


# ------------------------------------------------------------------ errors
def test_validation_message_names_fields_and_unknown_ones():
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "x", "max_tokens": True, "wizardry": 1})
    msg = validation_message(info.value.errors())
    assert msg.startswith("invalid request: ") and "max_tokens:" in msg
    assert "wizardry: not supported by this server; omit it" in msg
    # FastAPI's locations start with "body": it is dropped, and a bare body is named "body"
    errs = [{"type": "missing", "loc": ("body", "prompt"), "msg": "Field required"},
            {"type": "missing", "loc": ("body",), "msg": "Field required"}]
    assert validation_message(errs).startswith("invalid request: prompt: Field required; body: Field required (")


def test_validation_message_dedups_caps_and_short_circuits_bad_json():
    same = [{"type": "int_type", "loc": ("body", "n"), "msg": "bad"}] * 3
    assert validation_message(same).count("n: bad") == 1
    many = [{"type": "x", "loc": ("body", f"f{i}"), "msg": "bad"} for i in range(10)]
    assert validation_message(many).count(": bad") == 6
    mixed = [*many, {"type": "json_invalid", "loc": ("body", 3), "msg": "JSON decode error"}]
    assert validation_message(mixed).startswith("request body is not valid JSON")


def test_engine_failures_map_to_statuses():
    assert failure_status(EngineDeadError("dead")) == 503
    assert failure_status(UnknownPlayerError("nobody")) == 404
    assert failure_status(RuntimeError("x")) == 500
    body = failure_body(QueueTimeoutError("waited 2 s"))["error"]
    assert body["code"] == 503 and "--max-queue-s" in body["message"] and body["type"] == "service_unavailable"
    assert failure_body(UnknownPlayerError("no such player"))["error"] == {
        "message": "no such player", "type": "not_found_error", "param": None, "code": 404}


def test_http_errors_explain_body_decoding_failures():
    def parse_failure(cause):
        exc = HTTPException(400, PARSE_ERROR)
        exc.__cause__ = cause
        return json.loads(http_error_response(exc).body)["error"]["message"]

    assert "not valid UTF-8 (byte 5)" in parse_failure(UnicodeDecodeError("utf-8", b"abcde\xff", 5, 6, "bad"))
    assert "nested too deeply" in parse_failure(RecursionError())
    assert "(ValueError)" in parse_failure(ValueError())
    plain = http_error_response(HTTPException(405, "Method Not Allowed"))
    assert plain.status_code == 405 and json.loads(plain.body)["error"]["message"] == "Method Not Allowed"


# ------------------------------------------------------------------ request models
@pytest.mark.parametrize("body", [{"prompt": "x", "max_tokens": True}, {"prompt": "x", "stream": "yes"},
                                  {"prompt": "x", "temperature": float("nan")}, {"prompt": "x", "top_p": 0},
                                  {"prompt": "a\ud800b"}, {"prompt": "x", "response_format": {}}])
def test_completion_schema_is_strict(body):
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate(body)


def test_chat_schema_refuses_unknown_roles():
    with pytest.raises(ValidationError):
        ChatRequest.model_validate({"messages": [{"role": "wizard", "content": "hi"}]})
    assert ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]}).n == 1


# ------------------------------------------------------------------ sampling parameters
def test_sampling_params_defaults_and_mapping():
    p = validation.sampling_params(CompletionRequest(prompt="x"), 7, 50)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.stop, p.seed, p.ignore_eos) == (7, 1.0, 1.0, 0, [], None,
                                                                                              False)
    body = CompletionRequest(prompt="x", temperature=0.0, top_p=0.5, top_k=-1, stop="END", seed=3, ignore_eos=True)
    p = validation.sampling_params(body, 50, 50)
    # temperature 0 is greedy, not "unset"; top_k -1 means off, as 0
    assert (p.temperature, p.top_p, p.top_k, p.stop, p.seed, p.ignore_eos) == (0.0, 0.5, 0, ["END"], 3, True)


def test_sampling_params_refuses_what_it_cannot_honour():
    at_neutral = CompletionRequest(prompt="x", presence_penalty=0, best_of=1, logit_bias={}, min_tokens=0)
    assert validation.sampling_params(at_neutral, 1, 50).max_tokens == 1
    refused(validation.sampling_params, CompletionRequest(prompt="x", presence_penalty=0.5), 1, 50,
            param="presence_penalty", match="not supported")
    refused(validation.sampling_params, ChatRequest(messages=[{"role": "user", "content": "x"}],
                                                    tool_choice="auto"), 1, 50, param="tool_choice")
    refused(validation.sampling_params, CompletionRequest(prompt="x", n=2), 1, 50, param="n", match="only n=1")
    refused(validation.sampling_params, CompletionRequest(prompt="x"), 51, 50, param="max_tokens",
            match="max_tokens=51 exceeds this server's limit of 50")
    # the engine's own checks become 400s
    refused(validation.sampling_params, CompletionRequest(prompt="x", stop=[""]), 1, 50, match="stop must be")


# ------------------------------------------------------------------ completion and batch requests
def test_completion_input_unwraps_one_prompt():
    assert validation.completion_input(CompletionRequest(prompt=["hello"])) == ("hello", 16)
    assert validation.completion_input(CompletionRequest(prompt=[[1, 2]], max_tokens=3)) == ([1, 2], 3)
    assert validation.completion_input(CompletionRequest(prompt=[5, 6])) == ([5, 6], 16)  # token ids stay
    refused(validation.completion_input, CompletionRequest(prompt=["a", "b"]), param="prompt",
            match="only one prompt per request")
    refused(validation.completion_input, CompletionRequest(prompt="a", echo=True), param="echo")


def test_batch_items_name_their_place():
    fitted = []
    fits = lambda text, param: fitted.append((text, param))  # noqa: E731
    prompt, params = validation.batch_item_input(CompletionRequest(prompt=["hi"], max_tokens=4), "requests[0]", 50,
                                                 fits)
    assert (prompt, params.max_tokens, fitted) == ("hi", 4, [("hi", "requests[0]")])
    validation.batch_item_input(CompletionRequest(prompt=[1, 2]), "requests[1]", 50, fits)
    assert len(fitted) == 1  # token ids need no context check by characters
    item = lambda **kw: CompletionRequest(prompt="x", **kw)  # noqa: E731
    refused(validation.batch_item_input, item(stream=True), "requests[2]", 50, fits, param="requests[2]",
            match="requests[2].stream")
    refused(validation.batch_item_input, item(echo=True), "requests[3]", 50, fits, match="requests[3].echo")
    err = refused(validation.batch_item_input, item(max_tokens=60), "requests[4]", 50, fits, param="requests[4]")
    assert err.message.startswith("requests[4]: max_tokens=60")
    refused(validation.batch_item_input, CompletionRequest(prompt=["a", "b"]), "requests[5]", 50, fits,
            match="requests[5].prompt: one prompt per request")

    def too_long(text, param):
        raise APIError(400, f"{param} is too long", param)

    err = refused(validation.batch_item_input, item(), "requests[6]", 50, too_long, param="requests[6]")
    assert err.message == "requests[6]: requests[6] is too long"


def test_batch_token_budget():
    ps = [validation.sampling_params(CompletionRequest(prompt="x"), n, 100) for n in (40, 60)]
    validation.check_batch_tokens(ps, 100)
    refused(validation.check_batch_tokens, ps, 99, param="requests", match="asks for 100 tokens")


# ------------------------------------------------------------------ chat requests
def test_chat_messages_join_text_parts():
    msgs = [Message(role="system", content="be brief"),
            Message(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])]
    assert validation.chat_messages(msgs, 10) == [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": "ab"}]
    refused(validation.chat_messages, msgs, 1, param="messages", match="2 messages, more than this server's limit of 1")


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": "x"}, {"type": "text", "text": 3},
                                  {"type": "text", "text": "a", "name": "n"}])
def test_chat_messages_refuse_other_parts(part):
    msgs = [Message(role="user", content="ok"), Message(role="user", content=[part])]
    refused(validation.chat_messages, msgs, 10, param="messages", match="messages[1].content: only text parts")


def test_chat_messages_refuse_a_lone_surrogate_in_a_part():
    msgs = [Message(role="user", content=[{"type": "text", "text": "a\ud800"}])]
    refused(validation.chat_messages, msgs, 10, match="messages[0].content contains a lone surrogate")


def test_chat_max_tokens():
    chat = lambda **kw: ChatRequest(messages=[{"role": "user", "content": "x"}], **kw)  # noqa: E731
    assert validation.chat_max_tokens(chat(max_tokens=5, max_completion_tokens=9), 10, 50, 100) == 5
    assert validation.chat_max_tokens(chat(max_completion_tokens=9), 10, 50, 100) == 9
    assert validation.chat_max_tokens(chat(), 70, 50, 100) == 30  # what the context leaves
    assert validation.chat_max_tokens(chat(), 10, 50, 100) == 50  # capped by the server's limit
    refused(validation.chat_max_tokens, chat(), 100, 50, 100, param="messages", match="fills the context")
    refused(validation.check_chat, chat(top_logprobs=2), param="top_logprobs")
    validation.check_chat(chat(top_logprobs=0))


# ------------------------------------------------------------------ the context check
def test_check_fits_bounds_by_characters_then_probes_a_prefix():
    calls = []
    encode = lambda text: calls.append(text) or [0] * len(text)  # noqa: E731
    validation.check_fits("x" * 40, "prompt", 10, 4, encode)
    assert calls == []  # within 4 * context characters: nothing tokenized here
    refused(validation.check_fits, "x" * 41, "prompt", 10, 4, encode, param="prompt", match="at most 40")
    twice = lambda text: calls.append(text) or [0] * (2 * len(text))  # noqa: E731
    validation.check_fits("x" * 41, "messages", 10, 8, encode)  # 40 tokens: within context + 64
    refused(validation.check_fits, "x" * 41, "messages", 10, 8, twice, param="messages",
            match="its first 40 characters alone are 80 tokens")
    assert calls == ["x" * 40] * 2  # only the prefix is tokenized
    validation.check_fits("x" * 41, "prompt", 10, 8, lambda text: [0] * 74)  # up to context + 64: a cut last word


def test_state_check_fits_measures_the_vocabulary_once():
    state = state_for()
    state.engine.tokenizer.vocab = ("a", "abcdefgh")
    state.check_fits("x" * 400, "prompt")  # 100 tokens of 8 characters fit 800
    assert state.token_chars == 8
    state.engine.tokenizer.vocab = ("a",)
    refused(state.check_fits, "x" * 801, "prompt", match="at most 800")  # still the first measurement
    assert validation.longest_token_chars(object()) == 256  # no get_vocab: a generous bound


# ------------------------------------------------------------------ adapter requests
def test_lora_folder_stays_inside_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "good").mkdir(parents=True)
    (root / "file").write_text("x")
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    r = str(root)
    assert validation.lora_folder(r, "good") == str(root / "good")
    refused(validation.lora_folder, None, "good", status=403, param="lora_path", match="--adapter-root")
    refused(validation.lora_folder, r, None, param="lora_path", match="lora_path is required")
    refused(validation.lora_folder, r, "a\x00b", match="NUL")
    refused(validation.lora_folder, r, "../outside", status=403, match="outside the server's adapter root")
    refused(validation.lora_folder, r, "escape", status=403, match="outside")
    refused(validation.lora_folder, r, str(tmp_path / "outside"), status=403, match="outside")
    refused(validation.lora_folder, r, "file", match="is not a folder")
    refused(validation.lora_folder, r, "missing", match="is not a folder")


def test_upload_length_checks_headers_and_query():
    ok = lambda ctype="", length=None, scale=None, version=None: validation.upload_length(  # noqa: E731
        ctype, length, scale, version, 1000)
    assert ok() is None and ok(length="1000") == 1000 and ok(length="12x") is None
    assert ok("Application/Octet-Stream; charset=binary", "10") == 10 and ok("application/x-safetensors") is None
    refused(ok, "application/json", status=415, match="'application/json' is not accepted")
    refused(ok, "", None, 1e39, param="scale", match="float32")
    refused(ok, "", None, None, 0, param="version")
    refused(ok, "", None, None, 2**31, param="version")
    assert ok(version=2**31 - 1) is None
    err = refused(ok, "", "1001", status=413, match="1001 bytes exceeds the limit of 1000")
    assert err.headers == CLOSE


def test_adapter_names_are_taken_exactly_as_sent():
    request = Request({"type": "http", "method": "GET", "path": "/v1/adapters/bob\n", "headers": []})
    assert sent_name(request) == "bob\n"  # not "bob": the route's pattern would match before the newline
    with pytest.raises(AdapterError, match="invalid adapter name"):
        check_name(sent_name(request))
    assert LoraRequest(lora_name="bob").lora_path is None


# ------------------------------------------------------------------ the state object
def test_state_books():
    state = state_for(FakeEngine(players=["p"]), adapter_root="/r", spill_dir="/r/.spilled/x")
    assert state.player_of(None) is None and state.player_of("base") is None and state.player_of("p") == "p"
    state.touch(None)
    state.touch("p")
    state.touch("q")
    assert state.last_use == {"p": 0, "q": 1}
    state.sizes["p"], state.folders["p"] = 10, "/r/p"
    state.forget("p")
    assert "p" not in state.last_use and "p" not in state.sizes and "p" not in state.folders
    limits = state.limits()
    assert (limits["max_tokens"], limits["max_batch_tokens"], limits["preempt_after_steps"]) == (50, 100, 16)
    assert state_for().instance != state_for().instance


def test_check_limits():
    check_limits({"a": 1}, {"s": 0.5}, optional=("b",))
    check_limits({"b": None}, {}, optional=("b",))
    for counts, seconds in (({"a": 0}, {}), ({"a": True}, {}), ({"a": 1.5}, {}), ({}, {"s": float("inf")}),
                            ({"a": None}, {})):
        with pytest.raises(ValueError, match="must be a positive"):
            check_limits(counts, seconds)


# ------------------------------------------------------------------ adapter bookkeeping
def test_check_room_without_spilling():
    state = state_for(FakeEngine(players=["a", "b"]), max_cpu_adapters=2)
    adapter_store.check_room(state, "a")  # a hot-swap needs no new room
    refused(adapter_store.check_room, state, "c", status=507, match="holds 2 adapters, its limit")
    adapter_store.check_room(state_for(FakeEngine(players=["a", "b"]), max_cpu_adapters=2, spill_dir="/s"), "c")
    adapter_store.check_room(state_for(FakeEngine(players=["a", "b"]), max_cpu_adapters=None), "c")


def test_make_room_spills_least_recently_used_idle_players():
    engine = FakeEngine(players=["old", "busy", "new"], busy=["busy"])
    state = state_for(engine, max_cpu_adapters=3, spill_dir="/spill")
    for name in ("busy", "old", "new"):  # "busy" least recently used, but a request holds it
        state.touch(name)
    asyncio.run(adapter_store.make_room(state, "incoming", 0))
    # room for one more: "busy" is tried first and refuses, then "old" goes
    assert engine.spill_calls == [("busy", "/spill"), ("old", "/spill")]
    assert engine.spilled == {"old": True, "busy": False, "new": False}


def test_make_room_says_why_it_cannot():
    engine = FakeEngine(players=["a", "b"], busy=["a", "b"])
    state = state_for(engine, max_cpu_adapters=2, spill_dir="/spill")
    with pytest.raises(APIError) as info:
        asyncio.run(adapter_store.make_room(state, "c", 0))
    assert info.value.status == 507 and "in use by a queued or running request" in info.value.message
    assert info.value.headers == RETRY_LATER
    state = state_for(FakeEngine(), max_cpu_adapter_bytes=100)
    with pytest.raises(APIError, match="take 101 bytes, more than this server holds"):
        asyncio.run(adapter_store.make_room(state, "c", 101))


def test_make_room_counts_a_player_deleted_meanwhile_as_room_and_reports_disk_errors():
    engine = FakeEngine(players=["gone", "b"])
    engine.spill_errors["gone"] = UnknownPlayerError("gone")
    state = state_for(engine, max_cpu_adapters=2, spill_dir="/spill")
    state.touch("gone")
    state.touch("b")
    asyncio.run(adapter_store.make_room(state, "c", 0))
    assert engine.spill_calls == [("gone", "/spill")]  # its room is free: "b" stays in memory
    engine.spill_errors["gone"] = OSError("disk full")
    with pytest.raises(APIError) as info:
        asyncio.run(adapter_store.make_room(state, "c", 0))
    assert info.value.status == 507 and "cannot spill adapter 'gone' to /spill (disk full)" in info.value.message


def test_make_room_counts_bytes():
    engine = FakeEngine(players=["a", "b"])
    state = state_for(engine, max_cpu_adapter_bytes=100, spill_dir="/spill")
    state.sizes.update(a=60, b=30)
    state.touch("b")
    state.touch("a")  # "b" is the least recently used
    asyncio.run(adapter_store.make_room(state, "c", 10))  # 60 + 30 + 10 fits exactly
    assert engine.spill_calls == []
    asyncio.run(adapter_store.make_room(state, "c", 40))  # spilling "b" (30 bytes) makes room
    assert engine.spill_calls == [("b", "/spill")]


def test_install_books_the_adapter_and_maps_engine_refusals():
    engine = FakeEngine()
    state = state_for(engine)
    w = weights(32)
    assert asyncio.run(adapter_store.install(state, "p", w, 5)) == 5
    assert engine.loaded == [("p", w, 5)] and state.sizes == {"p": 64} and "p" in state.last_use
    engine.load_error = ValueError("version 5 is not newer than 5")
    with pytest.raises(APIError) as info:
        asyncio.run(adapter_store.install(state, "p", w, 5))
    assert (info.value.status, info.value.param) == (409, "version")
    with pytest.raises(APIError) as info:
        asyncio.run(adapter_store.install(state, "p", w))
    assert info.value.status == 400 and "cannot load adapter 'p'" in info.value.message
    engine.load_error = AdapterError("wrong shapes")
    with pytest.raises(AdapterError):  # answered 400 by its own handler, unchanged
        asyncio.run(adapter_store.install(state, "p", w))
    with pytest.raises(AdapterError, match="invalid adapter name"):
        asyncio.run(adapter_store.install(state, "../p", w))


def test_remove_forgets_the_player():
    engine = FakeEngine(players=["p"])
    state = state_for(engine)
    state.touch("p")
    state.sizes["p"], state.folders["p"] = 1, "/f"
    asyncio.run(adapter_store.remove(state, "p"))
    assert engine.players() == [] and (state.last_use, state.sizes, state.folders) == ({}, {}, {})


def test_preload_refuses_more_than_the_cap():
    with pytest.raises(ValueError, match="2 adapters to preload exceed max_cpu_adapters=1"):
        adapter_store.preload(state_for(max_cpu_adapters=1), {"a": "/x", "b": "/y"})


# ------------------------------------------------------------------ uploads
def safetensors_file(extra: bytes = b"") -> bytes:
    header = json.dumps({"m.lora_a": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]},
                         "m.lora_b": {"dtype": "F32", "shape": [1, 2], "data_offsets": [8, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(16) + extra


def receiver(body: bytes, chunk: int = 7):
    messages = [{"type": "http.request", "body": body[i:i + chunk], "more_body": i + chunk < len(body)}
                for i in range(0, len(body), chunk)]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


def test_read_upload_refuses_malformed_bodies():
    good = safetensors_file()
    run = lambda body, declared=None, limit=10_000: asyncio.run(  # noqa: E731
        read_upload(receiver(body), declared, None, limit, 5.0, None))
    with pytest.raises(AdapterError, match="runs past the body's 20 bytes"):
        run(good, declared=20)
    with pytest.raises(AdapterError, match=f"the body has {len(good) + 1} bytes"):
        run(good, declared=len(good) + 1)
    with pytest.raises(AdapterError, match="bytes follow"):
        run(safetensors_file(b"junk"))
    with pytest.raises(APIError) as info:
        run(good, limit=len(good) - 1)
    assert info.value.status == 413


def test_upload_waits_for_a_slot_and_frees_it():
    state = state_for(max_concurrent_uploads=1, body_timeout_s=0.05)

    async def main():
        await state.upload_slots.acquire()  # another upload holds the only slot
        with pytest.raises(APIError) as info:
            await upload(state, "p", receiver(safetensors_file()), None, None, None)
        assert info.value.status == 429 and info.value.headers == RETRY_LATER
        state.upload_slots.release()
        with pytest.raises(APIError) as info:  # a refused body closes the connection and frees its slot
            await upload(state, "p", receiver(safetensors_file(b"junk")), None, None, None)
        assert info.value.status == 400 and info.value.headers == CLOSE
        assert not state.upload_slots.locked()

    asyncio.run(main())


# ------------------------------------------------------------------ generation
def test_submit_checks_and_books_the_request():
    engine = FakeEngine()
    state = state_for(engine, max_queue_s=7.0)
    params = validation.sampling_params(CompletionRequest(prompt="x"), 1, 50)
    generation.submit(state, "hi", "p", params, None, "cmpl-1")
    prompt, player, _, kw = engine.submitted[0]
    assert (prompt, player, kw["request_id"], kw["queue_timeout_s"]) == ("hi", "p", "cmpl-1", 7.0)
    assert kw["group"] == "cmpl-1"  # each HTTP request is one group of the fair queue
    assert "p" in state.last_use
    refused(generation.submit, state, "boom", None, params, None, "cmpl-2", param="prompt", match="prompt is empty")
    refused(generation.submit, state, "x" * 301, None, params, None, "cmpl-3", param="prompt")  # 100 tokens * 3 chars


def test_settle_cancels_everything_when_the_client_leaves():
    engine = FakeEngine()
    done, pending = Future(), Future()
    done.set_result("ok")

    async def gone():
        return True

    with pytest.raises(APIError) as info:
        asyncio.run(generation.settle(engine, gone, [done, pending], ["r1", "r2"]))
    assert info.value.status == 499 and engine.cancelled == ["r1", "r2"]

    async def here():
        return False

    other = Future()
    other.set_result("fine")
    waiters = asyncio.run(generation.settle(engine, here, [done, other], ["r3", "r4"]))
    assert [w.result() for w in waiters] == ["ok", "fine"] and engine.cancelled == ["r1", "r2"]


def completion(**kw):
    base = dict(text="hi", token_ids=[5, 6], logprobs=[-0.5, -1.0], finish_reason="stop", prompt_ids=[1, 2, 3],
                adapter_version=2, version_spans=[(0, 2, 2)])
    return SimpleNamespace(**{**base, **kw})


async def collect(gen) -> list[str]:
    return [chunk async for chunk in gen]


def test_stream_events_end_with_usage_then_done():
    engine = FakeEngine()

    async def main():
        events: asyncio.Queue = asyncio.Queue()
        events.put_nowait(SimpleNamespace(text="h", token_id=5, logprob=-0.5, version=2))
        fut = Future()
        fut.set_result(completion())
        events.put_nowait(fut)
        return await collect(generation.stream_events(engine, True, "chatcmpl-1", "p", events, True, True))

    chunks = asyncio.run(main())
    assert chunks[-1] == "data: [DONE]\n\n" and all(c.startswith("data: ") for c in chunks)
    first, token, last = (json.loads(c[6:]) for c in chunks[:3])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert token["adapter_version"] == 2 and token["choices"][0]["token_ids"] == [5]
    assert token["choices"][0]["logprobs"]["content"][0]["token"] == "<5>"
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert last["choices"][0]["finish_reason"] == "stop" and last["version_spans"] == [[0, 2, 2]]
    assert engine.cancelled == []


def test_stream_events_report_a_failure_in_band_and_cancel_when_abandoned():
    engine = FakeEngine()

    async def failed():
        events: asyncio.Queue = asyncio.Queue()
        fut = Future()
        fut.set_exception(EngineDeadError("engine thread died"))
        events.put_nowait(fut)
        return await collect(generation.stream_events(engine, False, "cmpl-1", "base", events, False, False))

    chunks = asyncio.run(failed())
    assert json.loads(chunks[0][6:])["error"]["code"] == 503 and chunks[1] == "data: [DONE]\n\n"

    async def abandoned():
        events: asyncio.Queue = asyncio.Queue()
        events.put_nowait(SimpleNamespace(text="h", token_id=5, logprob=-0.5, version=None))
        gen = generation.stream_events(engine, False, "cmpl-2", "base", events, False, False)
        await gen.__anext__()
        await gen.aclose()  # the client went away mid-stream

    asyncio.run(abandoned())
    assert engine.cancelled == ["cmpl-2"]


def test_chat_prompt_maps_template_errors():
    engine = FakeEngine()
    engine.tokenizer.apply_chat_template = lambda *a, **k: (_ for _ in ()).throw(ValueError("no template"))
    msgs = [Message(role="user", content="hi")]
    refused(generation.chat_prompt, state_for(engine), msgs, param="messages",
            match="cannot apply the chat template: no template")


# ------------------------------------------------------------------ responses
def test_logprobs_bodies():
    text = responses.logprobs_body(False, ["ab", "c"], [-1.0, -2.0])
    assert text == {"tokens": ["ab", "c"], "token_logprobs": [-1.0, -2.0],
                    "top_logprobs": [{"ab": -1.0}, {"c": -2.0}], "text_offset": [0, 2]}
    chat = responses.logprobs_body(True, ["é"], [-1.0])
    assert chat["content"][0]["bytes"] == [195, 169] and chat["refusal"] is None
    assert responses.logprobs_body(True, [], []) is None


def test_completion_choice_shows_ids_only_when_asked():
    decode = FakeTokenizer().decode
    plain = responses.completion_choice(False, completion(), decode, False, False)
    assert plain == {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}
    chat = responses.completion_choice(True, completion(), decode, True, True)
    assert chat["message"] == {"role": "assistant", "content": "hi"}
    assert chat["token_ids"] == [5, 6] and chat["prompt_token_ids"] == [1, 2, 3]
    assert [t["token"] for t in chat["logprobs"]["content"]] == ["<5>", "<6>"]
    last = responses.last_choice(False, completion(), True)
    assert last["token_ids"] == [] and last["prompt_token_ids"] == [1, 2, 3] and last["text"] == ""


def test_models_body_lists_players_under_the_base():
    body = responses.models_body("base", ["p", "q"], {"p": "/root/p"}, 100)
    assert [(m["id"], m["root"], m["parent"], m["max_model_len"]) for m in body["data"]] == [
        ("base", "base", None, 100), ("p", "/root/p", "base", 100), ("q", "q", "base", 100)]


# ------------------------------------------------------------------ operations
def test_health_and_stats_bodies():
    engine = FakeEngine(players=["p"])
    state = state_for(engine)
    body, status = health_body(state)
    assert status == 200 and body["status"] == "ok" and body["instance"] == state.instance
    engine.ok = False
    body, status = health_body(state)
    assert status == 503 and body["status"] == "unhealthy"
    stats = stats_body(state)
    assert stats["queue"] == {"waiting": 2, "running": 1, "paused": 3} and stats["players"] == ["p"]
    assert stats["limits"] == state.limits()


# ------------------------------------------------------------------ middleware
def run_asgi(app, scope, body_messages):
    sent = []

    async def receive():
        return body_messages.pop(0) if body_messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_body_limit_counts_bytes_and_replays_the_body():
    seen = []

    async def inner(scope, receive, send):
        seen.append(await receive())

    limit = BodyLimit(inner, limit=10, timeout=5.0, exempt=lambda scope: False)
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    chunks = lambda *parts: [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}  # noqa: E731
                             for i, p in enumerate(parts)]
    run_asgi(limit, scope, chunks(b"12345", b"67890"))
    assert seen == [{"type": "http.request", "body": b"1234567890", "more_body": False}]
    sent = run_asgi(limit, scope, chunks(b"123456", b"78901"))
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"] and len(seen) == 1
    sent = run_asgi(limit, {**scope, "headers": [(b"content-length", b"11")]}, [])
    assert sent[0]["status"] == 413
    exempt = BodyLimit(inner, limit=1, timeout=5.0, exempt=lambda scope: True)
    run_asgi(exempt, scope, chunks(b"far too long"))
    assert seen[-1]["body"] == b"far too long"


def test_auth_middleware_spares_only_health():
    reached = []

    async def inner(scope, receive, send):
        reached.append(scope["path"])

    auth = AuthMiddleware(inner, api_key="k")
    scope = lambda path, key=None: {"type": "http", "method": "GET", "path": path,  # noqa: E731
                                    "headers": [(b"authorization", key)] if key else []}
    assert run_asgi(auth, scope("/v1/models"), [])[0]["status"] == 401
    assert run_asgi(auth, scope("/v1/models", b"Bearer wrong"), [])[0]["status"] == 401
    run_asgi(auth, scope("/v1/models", b"Bearer k"), [])
    run_asgi(auth, scope("/health"), [])
    assert reached == ["/v1/models", "/health"]
