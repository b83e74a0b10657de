"""A two-raylet Ray cluster on one machine, started as docs/cluster.md says (``ray start --head``,
then ``ray start --address=HEAD:PORT`` with the same ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN``), every Ray process on 127.0.0.1 only (``ray_loopback.py`` keeps Ray from
replacing 127.0.0.1 with the machine's outward address): a node with another token is refused,
the league trains through one rollout actor on each node, and no Ray process listens beyond
loopback. Slow (``pytest -m slow tests/test_ray_cluster.py``); skipped without Ray or psutil."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from ray_loopback import LOOPBACK, members  # noqa: E402

HERE = Path(__file__).parent
SCRIPT = str(HERE / "ray_loopback.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Raylets:
    """The Ray processes this test starts, each command in its own process group; stopped by group and
    descendants only, never with ``ray stop`` (it stops every Ray process of the machine)."""

    def __init__(self, token: str):
        # a short root: Ray's unix sockets live under it, and their paths are limited to 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix="ray-"))
        self.pgids: list[int] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0")

    def popen(self, args: list[str], env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, SCRIPT, *args], env=env or self.env, cwd=HERE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.pgids.append(proc.pid)
        return proc

    def ray_start(self, name: str, *args: str, env: dict | None = None, timeout: float = 90) -> tuple[int, str]:
        """``ray start`` for one node (its own temp dir, 1 CPU, no dashboard, a small object store)."""
        proc = self.popen(["ray", "start", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
                           f"--temp-dir={self.root / name}", "--object-store-memory=100000000", *args], env)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to each process group and its descendants, SIGKILL to whatever is left after ``grace`` s."""
        procs = members(set(self.pgids))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for g in self.pgids:
                try:
                    os.killpg(g, sig)
                except ProcessLookupError:
                    pass
            for p in procs:  # a descendant in a group of its own
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
            deadline = time.monotonic() + grace
            while self.alive(procs) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.alive(procs):
                break
        shutil.rmtree(self.root, ignore_errors=True)

    def alive(self, procs: list | None = None) -> list[int]:
        """The pids of this cluster's processes still running (zombies excluded)."""
        out = []
        for p in members(set(self.pgids)) + list(procs or []):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return sorted(set(out))


@pytest.mark.slow  # two raylets, a refused node (about 20 s) and 2 rounds of a league: about 1.5 minutes
def test_two_raylets_on_loopback_with_a_token_train_a_league(tiny_model_path, tmp_path):
    port = _free_port()
    head = f"127.0.0.1:{port}"
    cluster = Raylets(secrets.token_hex(16))
    try:
        rc, out = cluster.ray_start("head", "--head", f"--port={port}", "--include-dashboard=false")
        assert rc == 0, out
        # a node with another token is refused (the failure of a launch that leaves the token out)
        rc, out = cluster.ray_start("stranger", f"--address={head}", env={**cluster.env, "RAY_AUTH_TOKEN": "0" * 32})
        assert rc != 0 and "InvalidAuthToken" in out, out
        rc, out = cluster.ray_start("second", f"--address={head}")
        assert rc == 0, out

        pgids = ",".join(map(str, cluster.pgids))
        driver = cluster.popen(["drive", str(tiny_model_path), head, str(tmp_path / "run"), pgids])
        out, _ = driver.communicate(timeout=150)
        assert driver.returncode == 0, out
        got = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])

        # two live nodes, both announced on loopback, each running one rollout actor
        assert [(n["ip"], n["alive"], n["cpus"]) for n in got["nodes"]] == [("127.0.0.1", True, 1.0)] * 2
        assert sorted(got["actor_nodes"]) == sorted(n["id"] for n in got["nodes"])
        assert got["driver_ip"] == "127.0.0.1"
        # the league played every game through the actors; each actor answers for the player it holds
        assert got["games"] == 2 * 4 and got["stats"]["completions"] > 0 and got["stats"]["failed"] == 0
        assert sorted(p["actor"] for p in got["probes"].values()) == [0, 1]
        assert all(p["version"] == 3 for p in got["probes"].values())

        # every socket a Ray process of this cluster listens on (driver and actors included) is on loopback
        sockets = got["sockets"]
        names = {s["name"] for s in sockets}
        assert {"gcs_server", "raylet"} <= names and sum(s["name"] == "raylet" for s in sockets) >= 4, sockets
        assert sum("RolloutActor" in s["name"] for s in sockets) >= 2, sockets
        assert [s for s in sockets if s["ip"] not in LOOPBACK] == [], sockets
    finally:
        cluster.stop()
    assert cluster.alive() == []
