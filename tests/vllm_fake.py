"""A fake vLLM OpenAI server (FastAPI) for the vLLM worker's protocol tests: the routes, bodies
and error messages of vLLM 0.32's server (measured against it), with deterministic completions and
a record of every call. ``VLLMFake.app`` serves it; ``running_server(fake.app)`` runs it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from safetensors import safe_open

# what vLLM's llama supports LoRA on (its message lists them as a set)
LLAMA_MODULES = {"o_proj", "embed_tokens", "q_proj", "up_proj", "lm_head", "v_proj", "down_proj", "gate_proj", "k_proj"}


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


class VLLMFake:
    """``model``: the folder /v1/models names as the base's root. ``encode(text, add_special_tokens)``:
    its tokenizer. ``max_lora_rank`` and ``modules`` as vLLM's ``--max-lora-rank`` and its model's
    LoRA modules. ``delay``: seconds each completion takes. ``down``: every route answers 503."""

    def __init__(self, model: str, encode: Callable[[str, bool], list[int]], max_lora_rank: int = 8,
                 modules: set[str] = LLAMA_MODULES, delay: float = 0.0):
        self.model, self.encode = str(model), encode
        self.max_lora_rank, self.modules, self.delay = max_lora_rank, set(modules), delay
        self.loras: dict[str, str] = {}  # served name -> path
        self.calls: list[tuple[str, dict]] = []  # (route, body) of every POST
        self.down = False
        self.started = time.time()
        self.app = self._build()

    def restart(self) -> None:
        """As a restarted server: no adapter, a new process start time."""
        self.loras.clear()
        self.started += 1.0

    def completions(self, model: str | None = None) -> list[dict]:
        return [b for r, b in self.calls if r == "completions" and (model is None or b.get("model") == model)]

    def _load(self, name: str, path: str) -> JSONResponse | PlainTextResponse:
        if name in self.loras:
            return _error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                               "in place, set 'load_inplace' to True.", "InvalidUserInput")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            return _error(404, f"Loading lora {name} failed: No adapter found for <path>", "NotFoundError")
        cfg = json.loads((folder / "adapter_config.json").read_text())
        if cfg["r"] > self.max_lora_rank:
            return _error(500, f"Call to add_lora method failed: Worker failed with error 'LoRA rank {cfg['r']} is "
                               f"greater than max_lora_rank {self.max_lora_rank}.', please check the stack trace above "
                               "for the root cause", "InternalServerError")
        with safe_open(str(folder / "adapter_model.safetensors"), "np") as f:
            paths = sorted({k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in f.keys()})
        unexpected = [p for p in paths if p.rsplit(".", 1)[-1] not in self.modules]
        if unexpected:
            return _error(500, "Call to add_lora method failed: Worker failed with error 'While loading <path>, "
                               f"expected target modules in {self.modules} but received {unexpected}. Please verify "
                               "that the loaded LoRA module is correct', please check the stack trace above for the "
                               "root cause", "InternalServerError")
        self.loras[name] = str(folder)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    def _complete(self, body: dict) -> JSONResponse:
        model = body.get("model")
        if model not in (self.model, *self.loras):
            return _error(404, f"The model `{model}` does not exist. Valid aliases: <path>", "NotFoundError")
        prompt = list(body["prompt"])
        n = int(body.get("max_tokens", 16))
        salt = sum(map(ord, model))
        ids = [3 + (sum(prompt) + 31 * i + salt) % 900 for i in range(n)]
        lps = [-0.05 * (i + 1) - (salt % 7) / 10 for i in range(n)]
        choice = {"index": 0, "text": "".join(f"<{t}>" for t in ids), "finish_reason": "length", "stop_reason": None,
                  "token_ids": ids, "prompt_token_ids": prompt,
                  "logprobs": {"token_logprobs": lps, "tokens": [str(t) for t in ids], "top_logprobs": None}}
        return JSONResponse({"id": "cmpl-fake", "object": "text_completion", "model": model, "choices": [choice]})

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def when_down(request: Request, call_next):
            if self.down:
                return _error(503, "the fake server is down", "ServiceUnavailable")
            return await call_next(request)

        @app.get("/health")
        async def health():
            return PlainTextResponse("")

        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse(f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {self.started}\n")

        @app.get("/v1/models")
        async def models():
            data = [{"id": self.model, "object": "model", "root": self.model, "parent": None}]
            data += [{"id": n, "object": "model", "root": p, "parent": self.model} for n, p in self.loras.items()]
            return {"object": "list", "data": data}

        @app.post("/tokenize")
        async def tokenize(request: Request):
            body = await request.json()
            self.calls.append(("tokenize", body))
            ids = list(self.encode(body["prompt"], body.get("add_special_tokens", True)))
            return {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}

        @app.post("/v1/load_lora_adapter")
        async def load(request: Request):
            body = await request.json()
            self.calls.append(("load", body))
            return self._load(body["lora_name"], body["lora_path"])

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request):
            body = await request.json()
            self.calls.append(("unload", body))
            if self.loras.pop(body["lora_name"], None) is None:
                return _error(404, f"The lora adapter '{body['lora_name']}' cannot be found.", "NotFoundError")
            return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.calls.append(("completions", body))
            if self.delay:
                await asyncio.sleep(self.delay)
                if self.down:
                    return _error(503, "the fake server is down", "ServiceUnavailable")
            return self._complete(body)

        return app
