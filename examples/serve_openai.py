"""Serve players over HTTP and talk to them with the official `openai` client.

    python examples/serve_openai.py

Starts `autocurricula serve` on the built-in tiny model (loopback only), uploads a player's
adapter through our client, then asks the base model and the player the same question with the
`openai` package: the request's `model` names the player. The tiny model's weights are random,
so the words are noise; the player's adapter changes them.
"""

import socket
import subprocess
import sys
import time

import httpx
from openai import OpenAI

import autocurricula  # noqa: F401  (picks a fast BLAS before mlx loads)
from autocurricula import build_tiny_model
from autocurricula.fleet.client import Client
from autocurricula.engine import AdapterWeights, LoraSpec

base = str(build_tiny_model("runs/serve-openai/tiny-llama"))
with socket.socket() as s:  # a free port on this machine
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen([sys.executable, "-m", "autocurricula.cli", "serve", "--model", base, "--port", str(port)])
try:
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):  # wait up to a minute for the model to load
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)

    # A player is a LoRA adapter with a name; here a random one (a trained player's folder works too).
    spec = LoraSpec(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    dims = {f"model.layers.{i}.self_attn.{m}": (256, 256) for i in range(4) for m in ("q_proj", "v_proj")}
    print(Client(url).upload_adapter("alice", AdapterWeights.random(dims, spec, seed=1, b_std=0.05)))

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    print("models:", [m.id for m in client.models.list().data])
    for model in (base, "alice"):
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Your move?"}],
                                             max_tokens=8, temperature=0)
        print(f"{model}: {out.choices[0].message.content!r}")
finally:
    server.terminate()
    server.wait(30)
