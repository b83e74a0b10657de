"""RemoteEngine against real `autocurricula serve` processes on loopback: same completions as the
in-process engine, base-model fingerprint check, API key, placement, hot-swap push, failover when a
server is SIGKILLed or hangs mid-batch, and re-sync of a server that comes back.

The tests with two server processes are marked slow (``pytest -m slow tests/test_remote.py``)."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from autocurricula.fleet.client import AuthError, Client, ConflictError, NotFoundError
from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams, UnknownPlayerError
from autocurricula.engine.fingerprint import BaseModelMismatchError, fingerprint_engine, fingerprint_folder
from autocurricula.engine.protocol import RolloutEngine
from autocurricula.fleet.remote import RemoteEngine

KEY = "remote-test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """One `autocurricula serve` process on a free 127.0.0.1 port (the same port on restart)."""

    def __init__(self, model, log_dir, api_key=KEY):
        self.model, self.api_key, self.port = str(model), api_key, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"serve-{self.port}.log"
        self.proc = None

    def start(self):
        cmd = [sys.executable, "-c", "from autocurricula.cli import main; main()", "serve", "--model", self.model,
               "--host", "127.0.0.1", "--port", str(self.port), "--api-key", self.api_key]
        with open(self.log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout=90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited early:\n{self.log.read_text()[-2000:]}"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve did not come up in {timeout} s:\n{self.log.read_text()[-2000:]}")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def client(self):
        return Client(self.url, api_key=self.api_key, max_retries=0, timeout=30)


def start_all(model, log_dir, n):
    servers = [Serve(model, log_dir).start() for _ in range(n)]
    try:
        return [s.wait() for s in servers]
    except BaseException:
        for s in servers:
            s.kill()
        raise


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=8))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    from autocurricula.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-other-seed", seed=1)


def weights(engine, seed):
    spec = LoraSpec(r=4, lora_alpha=8)
    dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
    return AdapterWeights.random(dims, spec, seed=seed, b_std=0.5)


PROMPTS = ["the player wins", "x o x", "once upon a time the board"]


def test_one_server_matches_the_in_process_engine(engine, tiny_model_path, other_model, tmp_path):
    (server,) = start_all(tiny_model_path, tmp_path, 1)
    try:
        remote = RemoteEngine([server.url], base=engine, api_key=KEY)
        try:
            assert isinstance(engine, RolloutEngine) and isinstance(remote, RolloutEngine)
            w = weights(engine, 7)
            engine.load_adapter("alice", w, version=5)
            assert remote.load_adapter("alice", w, version=5) == 5
            for player in (None, "alice"):
                for i, prompt in enumerate(PROMPTS):
                    for params in (SamplingParams(max_tokens=12, temperature=0.0),
                                   SamplingParams(max_tokens=12, temperature=1.0, seed=100 + i),
                                   SamplingParams(max_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=i)):
                        want = engine.submit(prompt, player, params).result(60)
                        got = remote.submit(prompt, player, params).result(60)
                        assert got.token_ids == want.token_ids and got.prompt_ids == want.prompt_ids
                        assert got.logprobs == want.logprobs
                        assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
                        assert got.adapter_version == want.adapter_version == (5 if player else None)
            # the server's version route: an upload that is not newer is a 409, which the remote absorbs
            with server.client() as c:
                with pytest.raises(ConflictError):
                    c.upload_adapter("alice", w, version=5)
                assert c.fingerprint()["weights"] == fingerprint_folder(tiny_model_path)["weights"]
            assert fingerprint_engine(engine) == fingerprint_folder(tiny_model_path)
            assert remote.stats["retried"] == 0 and remote.stats["uploads"] == 1
            # a lockstep tick: one batch call, admitted together, the in-process engine's batch
            tick = [(p, pl, SamplingParams(max_tokens=6, temperature=1.0, seed=40 + i))
                    for i, (p, pl) in enumerate((p, pl) for p in PROMPTS for pl in ("alice", None))]
            srv = remote.servers[0]
            one_by_one, srv.client.completions = srv.client.completions, None  # the batch route only
            got = [f.result(60) for f in remote.submit_many(tick)]
            srv.client.completions = one_by_one
            want = [f.result(60) for f in engine.submit_many(tick)]
            assert [g.token_ids for g in got] == [w.token_ids for w in want]
            assert [g.logprobs for g in got] == [w.logprobs for w in want]  # the same batch, bit for bit
            assert [g.adapter_version for g in got] == [w.adapter_version for w in want]
            with pytest.raises(UnknownPlayerError):
                remote.submit_many([("x", "alice", None), ("x", "nobody", None)])
            # the trainer's loop: update its own engine, then mirror the changes onto the servers
            engine.load_adapter("alice", weights(engine, 9))
            engine.load_adapter("bob", weights(engine, 8))
            assert remote.sync_from(engine) == {"pushed": ["alice", "bob"], "dropped": []}
            assert remote.sync_from(engine) == {"pushed": [], "dropped": []}
            with server.client() as c:
                assert c.adapter_info("alice")["version"] == 6  # pushed at once: alice lives there
            params = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
            for player in ("alice", "bob"):
                want = engine.submit("x o", player, params).result(60)
                got = remote.submit("x o", player, params).result(60)
                assert got.token_ids == want.token_ids and got.adapter_version == want.adapter_version
            engine.unload_adapter("bob")
            assert remote.sync_from(engine) == {"pushed": [], "dropped": ["bob"]} and remote.players() == ["alice"]
        finally:
            remote.close()
        # a new run against the same server: its alice is at 6 there, this run starts at 1
        with RemoteEngine(server.url, base=tiny_model_path, api_key=KEY) as rerun:
            rerun.load_adapter("alice", weights(engine, 1), version=1)
            assert rerun.generate("x o", "alice", max_tokens=2).adapter_version == 1
            assert rerun.load_adapter("alice", weights(engine, 2)) == 2
            assert rerun.generate("x o", "alice", max_tokens=2).adapter_version == 2
            with server.client() as c:
                assert c.adapter_info("alice")["version"] == 8  # 7 and 8 there are this run's 1 and 2
        with pytest.raises(BaseModelMismatchError, match="weights differ"):
            RemoteEngine([server.url], base=other_model, api_key=KEY)
        with pytest.raises(AuthError):
            RemoteEngine([server.url], base=tiny_model_path, api_key="wrong")
    finally:
        server.kill()


@pytest.fixture(scope="module")
def two_servers(tiny_model_path, tmp_path_factory):
    servers = start_all(tiny_model_path, tmp_path_factory.mktemp("serve-logs"), 2)
    yield servers
    for s in servers:
        s.kill()


def players_on(server):
    with server.client() as c:
        return set(c.stats()["players"])


@pytest.mark.slow  # two server processes: ~50 s together with the others below
def test_placement_is_sticky_and_least_loaded_and_updates_reach_holders(engine, tiny_model_path, two_servers):
    a, b = two_servers
    with RemoteEngine([a.url, b.url], base=tiny_model_path, api_key=KEY) as remote:
        names = [f"p{i}" for i in range(4)]
        for i, name in enumerate(names):
            remote.load_adapter(name, weights(engine, i))
        placed = {name: remote.placement(name) for name in names}  # placed and uploaded when pushed
        for name in names:
            remote.generate("x o x", name, max_tokens=2, temperature=0.0)
        assert {name: remote.placement(name) for name in names} == placed
        assert sorted(placed.values()) == sorted([a.url, a.url, b.url, b.url])  # least loaded: 2 and 2
        assert players_on(a) == {n for n in names if placed[n] == a.url}
        assert players_on(b) == {n for n in names if placed[n] == b.url}
        with a.client() as ca, b.client() as cb:
            before = {s.url: c.stats()["stats"]["completions"] for s, c in ((a, ca), (b, cb))}
            for _ in range(3):  # sticky: p0's requests all go where its adapter is
                remote.generate("x o x", "p0", max_tokens=2, temperature=0.0)
            after = {s.url: c.stats()["stats"]["completions"] for s, c in ((a, ca), (b, cb))}
            home = placed["p0"]
            assert after[home] - before[home] == 3 and sum(after.values()) - sum(before.values()) == 3
            # install pushes to the holder at once, with the version; completions report it
            assert remote.load_adapter("p0", weights(engine, 10)) == 2
            holder = ca if home == a.url else cb
            assert holder.adapter_info("p0")["version"] == 2
            assert remote.generate("x o x", "p0", max_tokens=2).adapter_version == 2
            remote.unload_adapter("p1")
            with pytest.raises(NotFoundError):
                (ca if placed["p1"] == a.url else cb).adapter_info("p1")
            assert "p1" not in remote.players()


@pytest.mark.slow
def test_sigkill_mid_batch_retries_elsewhere_and_the_server_is_resynced_on_return(engine, tiny_model_path,
                                                                                  two_servers):
    a, b = two_servers
    with RemoteEngine([a.url, b.url], base=tiny_model_path, api_key=KEY, poll_s=0.2, timeout=60) as remote:
        names = [f"q{i}" for i in range(4)]
        for i, name in enumerate(names):
            remote.load_adapter(name, weights(engine, 20 + i))
            remote.generate("o", name, max_tokens=1)
        on_b = [n for n in names if remote.placement(n) == b.url]
        assert len(on_b) == 2
        prompts = [[1 + i, 2 + i, 3 + i] for i in range(16)]
        params = SamplingParams(max_tokens=160, temperature=0.0, ignore_eos=True)
        # half one by one, half as one tick (one batch call per server)
        futures = [remote.submit(p, names[i % 4], params, request_id=f"r{i}") for i, p in enumerate(prompts[:8])]
        futures += remote.submit_many([(p, names[i % 4], params) for i, p in enumerate(prompts[8:])])
        with b.client() as cb:  # kill b while it is decoding some of the batch
            deadline = time.monotonic() + 30
            while cb.stats()["health"]["running"] == 0:
                assert time.monotonic() < deadline, "server b never got work"
                time.sleep(0.02)
        b.kill()
        results = [f.result(120) for f in futures]
        assert remote.stats["retried"] >= 1
        assert [r.request_id for r in results[:8]] == [f"r{i}" for i in range(8)]  # each once, none lost
        assert len({r.request_id for r in results}) == 16
        assert all(r.prompt_ids == p and len(r.token_ids) == 160 for r, p in zip(results, prompts))
        assert all(r.adapter_version == 1 for r in results)
        assert not next(s for s in remote.health()["servers"] if s["url"] == b.url)["up"]
        assert all(remote.placement(n) == a.url for n in names)  # moved, and sticky there now
        # a new version while b is down goes to a only; b gets it when it returns
        assert remote.load_adapter(on_b[0], weights(engine, 99)) == 2
        b.start().wait()
        assert remote.wait_until_up(b.url, timeout=30)
        with b.client() as cb:
            assert cb.adapter_info(on_b[0])["version"] == 2 and cb.adapter_info(on_b[1])["version"] == 1
            assert cb.stats()["stats"]["completions"] == 0  # re-synced before any work
        assert remote.stats["resyncs"] >= 1
        remote.load_adapter("fresh", weights(engine, 5))
        assert remote.generate("o", "fresh", max_tokens=1).adapter_version == 1
        assert remote.placement("fresh") == b.url  # the returned server has no players: least loaded


@pytest.mark.slow
def test_a_hung_server_times_out_and_is_taken_back_once_it_answers(engine, tiny_model_path, two_servers):
    a, b = two_servers
    with RemoteEngine([a.url, b.url], base=tiny_model_path, api_key=KEY, poll_s=0.2, timeout=3) as remote:
        for i, name in enumerate(("h0", "h1")):
            remote.load_adapter(name, weights(engine, 40 + i))
            remote.generate("o", name, max_tokens=1)
        hung = next(n for n in ("h0", "h1") if remote.placement(n) == b.url)
        os.kill(b.proc.pid, signal.SIGSTOP)  # alive but silent: only the timeout can tell
        try:
            futures = [remote.submit([5, 6, 7], hung, SamplingParams(max_tokens=8, temperature=0.0),
                                     request_id=f"h{i}") for i in range(4)]
            results = [f.result(60) for f in futures]
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        assert [r.request_id for r in results] == [f"h{i}" for i in range(4)]
        assert all(len(r.token_ids) >= 1 and r.adapter_version == 1 for r in results)
        assert remote.stats["retried"] >= 1 and remote.placement(hung) == a.url
        assert remote.wait_until_up(b.url, timeout=30)  # same instance: versions checked, nothing lost
        with b.client() as cb:
            assert cb.adapter_info(hung)["version"] == 1


@pytest.mark.slow
def test_a_server_restarted_between_polls_gets_the_adapter_again(engine, tiny_model_path, two_servers):
    a, b = two_servers
    with RemoteEngine([a.url, b.url], base=tiny_model_path, api_key=KEY, poll_s=600) as remote:  # no polls
        for i, name in enumerate(("s0", "s1")):
            remote.load_adapter(name, weights(engine, 60 + i))
            remote.generate("o", name, max_tokens=1)
        on_b = next(n for n in ("s0", "s1") if remote.placement(n) == b.url)
        uploads = remote.stats["uploads"]
        b.kill()
        b.start().wait()
        # b forgot its adapters; the 404 makes the remote upload again on the same server
        assert remote.generate("o", on_b, max_tokens=1).adapter_version == 1
        assert remote.stats["uploads"] == uploads + 1 and remote.placement(on_b) == b.url


@pytest.mark.slow
def test_with_every_server_down_a_request_waits_for_one_to_return(engine, tiny_model_path, two_servers):
    _, b = two_servers
    # down_timeout: the restart (a new process loading the model) may take longer than the default 30 s
    with RemoteEngine([b.url], base=tiny_model_path, api_key=KEY, poll_s=0.2, timeout=90, down_timeout=90) as remote:
        remote.load_adapter("w0", weights(engine, 80))
        remote.generate("o", "w0", max_tokens=1)
        b.kill()
        future = remote.submit("o", "w0", SamplingParams(max_tokens=4, temperature=0.0))
        b.start().wait()
        assert future.result(60).adapter_version == 1  # re-synced, then served
        assert remote.stats["retried"] >= 1 and remote.stats["failed"] == 0


def _selfplay(tiny_model_path, out, **train_kwargs):
    from autocurricula import SelfPlayConfig, SelfPlayTrainer
    from toy_games import digits

    t = SelfPlayTrainer(SelfPlayConfig(epochs=2, rounds=2, rules={"games_per_round": 6, "past_share": 0.5},
                                       output_dir=str(out), progress=False, ratings={"bt_bootstrap": 0}, max_tokens=4))
    t.train(str(tiny_model_path), digits, **train_kwargs)
    history = [(g["game_id"], g["players"], g["rewards"], g["versions"]) for g in t.match_history]
    adapters = {p["id"]: t.engine.adapter_weights(p["id"]) for p in t.players}
    metrics = [json_line for json_line in (out / "metrics.jsonl").read_text().splitlines()]
    t.engine.close()
    return t, history, adapters, metrics


def test_a_league_played_through_a_server_gives_the_in_process_games(tiny_model_path, tmp_path):
    """`train(model, play, servers=[...])`: games on the server, updates here, every changed adapter
    (updates and snapshots) pushed before the next round; the same seed gives the same games as
    in-process training (lockstep), the weights agree to float rounding (batches differ)."""
    import json

    import numpy as np

    local, local_history, local_adapters, _ = _selfplay(tiny_model_path, tmp_path / "local")
    (server,) = start_all(tiny_model_path, tmp_path, 1)
    try:
        with pytest.raises(Exception, match="[Aa]uth|key"):  # the servers' key is checked at connect
            _selfplay(tiny_model_path, tmp_path / "nokey", servers=[server.url], api_key="wrong")
        remote, history, adapters, metrics = _selfplay(tiny_model_path, tmp_path / "remote", servers=[server.url],
                                                       api_key=KEY)
        served = {pid: httpx.get(f"{server.url}/v1/adapters/{pid}", headers={"Authorization": f"Bearer {KEY}"},
                                 timeout=10).json() for pid in ("main-0", "main-1")}
    finally:
        server.kill()
    assert history == local_history  # the same games: players, rewards, adapter versions
    assert [p["id"] for p in remote.players] == ["main-0", "main-1"]  # the learner and its snapshot
    for pid, w in local_adapters.items():
        for path, (a, b) in w.modules.items():
            a2, b2 = adapters[pid].modules[path]
            np.testing.assert_allclose(a2, a, atol=1e-4)
            np.testing.assert_allclose(b2, b, atol=1e-4)
    rows = [json.loads(m) for m in metrics if '"rollout/retried"' in m]
    assert len(rows) == 4 and all(r["rollout/retried"] == 0 for r in rows)
    # the server holds the learner's last update and the snapshot, at the trainer's versions
    assert {pid: info["version"] for pid, info in served.items()} == {p["id"]: p["version"] for p in remote.players}


def test_cli_train_takes_servers_and_their_key(monkeypatch):
    from autocurricula import cli
    from autocurricula.loop.trainer import AutocurriculumTrainer

    seen = {}

    def train(self, model, play, **kw):
        seen.update(kw)
        raise KeyboardInterrupt  # stop before the CLI prints a leaderboard of a league that never ran

    monkeypatch.setattr(AutocurriculumTrainer, "train", train)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", "--model", "m", "--game", "tictactoe", "--server", "http://127.0.0.1:1", "--server",
                  "http://127.0.0.1:2", "--api-key", "k"])
    assert seen["servers"] == ["http://127.0.0.1:1", "http://127.0.0.1:2"] and seen["api_key"] == "k"


class HeldServer:
    """The adapter routes of a server that holds ``alice`` at version 12 from an earlier run."""

    def __init__(self):
        self.versions = {"alice": 12}

    async def upload_adapter(self, name, payload, version=None):
        held = self.versions.get(name, -1)
        if version is not None and version <= held:
            raise ConflictError(409, f"{name} is at version {held}", {})
        self.versions[name] = held + 1 if version is None else version
        return {"name": name, "version": self.versions[name]}

    async def adapter_info(self, name):
        if name not in self.versions:
            raise NotFoundError(404, f"unknown player {name!r}", {})
        return {"version": self.versions[name]}


def test_a_server_holding_a_player_at_a_newer_version_is_adopted_or_refused_explicitly():
    import asyncio

    from autocurricula.fleet.remote import HttpWorker, PlayerVersionConflict

    adopt = HttpWorker("http://127.0.0.1:9", known_players="adopt")
    adopt.client = HeldServer()
    asyncio.run(adopt.load("alice", b"w", 7))
    assert adopt.client.versions["alice"] == 13 and adopt.offset == {"alice": 6}  # its numbering, counted on
    assert asyncio.run(adopt.holding(["alice"])) == {"alice": 7}  # reported in the trainer's numbering
    asyncio.run(adopt.load("alice", b"w", 8))
    assert adopt.client.versions["alice"] == 14
    body = {"choices": [{"prompt_token_ids": [1], "token_ids": [2], "text": "x", "finish_reason": "length"}],
            "adapter_version": 14, "version_spans": [[0, 1, 14]]}
    c = adopt._completion(body, "r", "alice")
    assert c.adapter_version == 8 and c.version_spans == [(0, 1, 8)]

    refuse = HttpWorker("http://127.0.0.1:9", known_players="refuse")
    refuse.client = HeldServer()
    with pytest.raises(PlayerVersionConflict, match=r"(?s)holds player 'alice' at version 12, ahead of this "
                       r"trainer's version 7.*Restart that server.*DELETE http://127.0.0.1:9/v1/adapters/alice"
                       r".*known_players='adopt'"):
        asyncio.run(refuse.load("alice", b"w", 7))
    assert refuse.client.versions == {"alice": 12} and refuse.offset == {}  # nothing uploaded
    asyncio.run(refuse.load("bob", b"w", 0))  # a name the server never held is no conflict
    with pytest.raises(ValueError, match="known_players must be one of"):
        RemoteEngine(["http://127.0.0.1:9"], check_base=False, tokenizer=object(), known_players="ignore")
