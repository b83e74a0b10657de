"""Repeat issue 32's attacks on the server (items 3, 4, 7 and 8) and print status, time and the
server's memory peak for each: run once against a tree without the limits and once with them.

    .venv/bin/python research/server_attacks.py --tree ../other-checkout --model /tmp/tiny-llama
    .venv/bin/python research/server_attacks.py --tree . --model ... -- --header-timeout 5 --body-timeout 5
    .venv/bin/python research/server_attacks.py --tree . --model ... --only adapters -- --adapter-root /tmp/root

Arguments after ``--`` go to ``autocurricula serve``. The server binds 127.0.0.1 only. Sizes are
scaled down from the issue's (a loaded 2-core machine): the amplification per byte is what counts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
from safetensors.numpy import save


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak since the last reset) resident memory of ``pid`` in MiB."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def adapter_bytes(rank: int, seed: int, pad: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(4):
        for m in ("q_proj", "v_proj"):
            p = f"model.layers.{i}.self_attn.{m}"
            tensors[f"{p}.lora_a"] = rng.normal(0, 0.05, (256, rank)).astype(np.float32)
            tensors[f"{p}.lora_b"] = rng.normal(0, 0.05, (rank, 256)).astype(np.float32)
    return save(tensors, metadata={"scale": "2.0"}) + b"\0" * pad


def header_bomb(total: int) -> bytes:
    entry = '"t{i}": {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
    parts, size, i = [], 2, 0
    while size < total:
        parts.append(entry.format(i=i))
        size += len(parts[-1]) + 2
        i += 1
    raw = ("{" + ", ".join(parts) + "}").encode()
    return len(raw).to_bytes(8, "little") + raw


class Server:
    def __init__(self, tree: str, model: str, port: int, extra: list[str]):
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        # the venv's editable install would win over PYTHONPATH: drop its finder so ``tree`` is imported
        boot = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
                "import autocurricula; assert autocurricula.__file__.startswith("
                f"{os.path.abspath(tree)!r}), autocurricula.__file__; "
                "from autocurricula.cli import main; main(sys.argv[1:])")
        cmd = [sys.executable, "-c", boot,
               "serve", "--model", model, "--port", str(port), "--threads", "1", *extra]
        self.log = f"/tmp/server-attacks-{port}.log"
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
                                     cwd="/tmp")  # not the checkout: its package would be imported
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise RuntimeError(open(self.log).read()[-2000:])

    def close(self):
        self.proc.terminate()
        self.proc.wait(20)


def measure(server: Server, name: str, fn):
    if ONLY[0] not in name:
        return
    time.sleep(0.5)
    base, _ = rss_mib(server.proc.pid)
    reset_peak(server.proc.pid)
    start = time.monotonic()
    try:
        outcome = fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is what we report
        outcome = f"{type(exc).__name__}: {exc}"[:160]
    took = time.monotonic() - start
    now, peak = rss_mib(server.proc.pid)
    print(json.dumps({"attack": name, "outcome": outcome, "seconds": round(took, 2),
                      "peak_over_start_mib": round(peak - base, 1), "held_after_mib": round(now - base, 1)}),
          flush=True)


ONLY = [""]


def put(url, name, data, timeout=300):
    r = httpx.put(f"{url}/v1/adapters/{name}", content=data, timeout=timeout,
                  headers={"Content-Type": "application/octet-stream"})
    return r.status_code, r.text[:120]


def victim_latency(url: str, limit: float) -> str:
    start = time.monotonic()
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=limit)
        return f"victim {r.status_code} after {time.monotonic() - start:.1f} s"
    except httpx.TimeoutException:
        return f"victim got nothing within {limit:.0f} s"


def open_socket(url: str, first: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    if first:
        s.sendall(first)
    return s


def closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.5)
    try:
        return s.recv(1 << 16) == b"" or True  # an answer (408/400) or EOF: the server acted
    except socket.timeout:
        return False
    except OSError:
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--wait", type=float, default=40.0, help="seconds to hold the slow sockets")
    ap.add_argument("--only", default="", help="run only the attacks whose name contains this")
    args, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    ONLY[0] = args.only
    srv = Server(args.tree, args.model, args.port, extra)
    url = srv.url
    try:
        bomb = header_bomb(16 << 20)
        measure(srv, "header bomb, 16 MiB", lambda: put(url, "bomb", bomb))
        del bomb
        bomb = header_bomb((4 << 20) - 64)  # just under the header cap: the tensor count refuses it
        measure(srv, "header bomb, 4 MiB", lambda: put(url, "bomb", bomb))
        del bomb
        padded = [adapter_bytes(8, i, pad=64 << 20) for i in range(4)]
        measure(srv, "4 rank-8 adapters padded with 64 MiB", lambda: [put(url, f"pad{i}", d)[0]
                                                                      for i, d in enumerate(padded)])
        del padded
        invalid = (16).to_bytes(8, "little") + b'{"x": 1}        ' + b"\0" * (256 << 20)
        measure(srv, "invalid 256 MiB upload", lambda: put(url, "invalid", invalid))
        del invalid
        many = [adapter_bytes(64, 100 + i) for i in range(300)]

        def many_adapters():
            greedy = {"prompt": "hi", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            statuses = [put(url, "many0", many[0])[0]]
            first = httpx.post(f"{url}/v1/completions", json={"model": "many0", **greedy}, timeout=60).json()
            statuses += [put(url, f"many{i}", d)[0] for i, d in enumerate(many) if i]
            listed = httpx.get(f"{url}/v1/adapters", timeout=60).json()["data"]
            in_memory = sum(not d.get("spilled", False) for d in listed)
            again = httpx.post(f"{url}/v1/completions", json={"model": "many0", **greedy}, timeout=60).json()
            counts = dict(zip(*np.unique(statuses, return_counts=True)))
            return (f"statuses {({int(k): int(v) for k, v in counts.items()})}; loaded {len(listed)}, in memory "
                    f"{in_memory}; many0 answers the same after the others: "
                    f"{first['choices'][0]['text'] == again['choices'][0]['text']}")
        measure(srv, "300 distinct rank-64 adapters", many_adapters)
        for i in range(300):  # free them for what follows
            httpx.delete(f"{url}/v1/adapters/many{i}", timeout=60)
        chat = {"messages": [{"role": "user", "content": ""}] * 200_000, "max_tokens": 2}
        measure(srv, "chat with 200k empty messages", lambda: httpx.post(
            f"{url}/v1/chat/completions", json=chat, timeout=300).status_code)

        def batch_then_victim(n: int, client_timeout: float, victim_s: float, join_s: float) -> str:
            """A batch of ``n`` requests x 2,000 tokens, then a 2-token request from another client."""
            big = {"requests": [{"prompt": "go", "max_tokens": 2000, "ignore_eos": True}] * n}
            out = {}

            def send():
                try:
                    out["status"] = httpx.post(f"{url}/v1/batch/completions", json=big,
                                               timeout=client_timeout).status_code
                except httpx.TimeoutException:
                    pass
            t = threading.Thread(target=send, daemon=True)
            t.start()
            time.sleep(3)
            victim = victim_latency(url, victim_s)
            t.join(join_s)
            return f"batch {out.get('status', 'still running (client gave up)')}; {victim}"
        measure(srv, "batch 4096 x 2000 tokens, then a 2-token request", lambda: batch_then_victim(4096, 25, 20, 30))
        time.sleep(2)
        # within the default budget: every row for 2,000 tokens
        measure(srv, "batch 64 x 2000 tokens, then a 2-token request", lambda: batch_then_victim(64, 600, 200, 600))

        def slow_sockets():
            socks = {"idle": open_socket(url, b""), "partial headers": open_socket(url, b"GET /health HTTP/1.1\r\n"),
                     "slow body": open_socket(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                                   b"application/json\r\nContent-Length: 100\r\n\r\n{")}
            time.sleep(args.wait)
            return {k: ("closed or answered" if closed_by_server(s) else f"open after {args.wait:.0f} s")
                    for k, s in socks.items()}
        measure(srv, "idle, partial-header and slow-body sockets", slow_sockets)
        measure(srv, "name 'bob\\n'", lambda: (put(url, "bob%0A", adapter_bytes(8, 7))[0],
                                                 httpx.get(f"{url}/v1/adapters/bob%0A").status_code))
        measure(srv, "GET /v1/adapters", lambda: (lambda r: (r.status_code, r.text[:80]))(
            httpx.get(f"{url}/v1/adapters", follow_redirects=True)))
    finally:
        srv.close()


if __name__ == "__main__":
    main()
