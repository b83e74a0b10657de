"""The vLLM worker's protocol against fake vLLM servers on 127.0.0.1 (tests/vllm_fake.py, vLLM
0.32's routes, bodies and messages): what a completion request carries and brings back,
adapters loaded per version under versioned names and unloaded once unused, failover through the
same Fleet, and the refusals at start-up. The real server: tests/test_vllm_server.py (slow)."""

import contextlib
import functools
import json
import random
import shutil
import threading
import time

import pytest

import autocurricula  # noqa: F401
from autocurricula import AutocurriculumConfig, AutocurriculumTrainer
from autocurricula.engine import AdapterWeights, Engine, LoraSpec, SamplingParams
from autocurricula.engine.fingerprint import BaseModelMismatchError
from autocurricula.fleet.vllm import (VLLMEngine, VLLMModuleError, VLLMRankError, served_name, vllm_urls)
from autocurricula.loop.startup import open_rollout
from autocurricula.publish.export import export_peft
from autocurricula.views.callbacks import TrainerCallback

from helpers import running_server
from vllm_fake import VLLMFake


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    e = Engine(str(tiny_model_path))
    yield e
    e.close()


def _encode(engine):
    return lambda text, special: engine.tokenizer.encode(text, add_special_tokens=special)


class CountingWriter:
    """export_peft, counting the folders written."""

    def __init__(self, engine):
        self.written: list[str] = []
        self._export = functools.partial(export_peft, base_model_name_or_path=engine.name)
        self._lock = threading.Lock()

    def __call__(self, weights, folder):
        with self._lock:
            self.written.append(str(folder))
        return self._export(weights, folder)


def _fleet(urls, engine, **kw):
    kw.setdefault("write_adapter", CountingWriter(engine))
    return VLLMEngine(urls, base=engine, poll_s=0.1, connect_timeout=30.0, **kw)


@contextlib.contextmanager
def _servers(engine, n=1, **fake):
    fakes = [VLLMFake(engine.name, _encode(engine), **fake) for _ in range(n)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running_server(f.app)) for f in fakes]
        yield fakes, urls


def _weights(engine, seed=0, r=8, paths=None):
    """A random adapter of every linear, or of the modules whose names end with ``paths``."""
    dims = {p: d for p, d in engine.linear_dims.items() if paths is None or p.endswith(tuple(paths))}
    return AdapterWeights.random(dims, LoraSpec(r=r), seed=seed)


def test_vllm_urls_are_named_with_their_scheme_and_a_fleet_never_mixes_kinds():
    assert vllm_urls(["vllm+http://127.0.0.1:8000", "vllm+https://h:1"]) == ["http://127.0.0.1:8000", "https://h:1"]
    assert vllm_urls("vllm+http://127.0.0.1:8000") == ["http://127.0.0.1:8000"]
    assert vllm_urls(["http://127.0.0.1:8000"]) is None and vllm_urls(None) is None
    with pytest.raises(ValueError, match="mixes vLLM servers"):
        vllm_urls(["vllm+http://127.0.0.1:8000", "http://127.0.0.1:8001"])
    with pytest.raises(ValueError, match=r"vllm\+http://host:port"):
        vllm_urls(["vllm+ftp://x"])
    assert served_name("a@v1", 2) == "a@v1@v2" and served_name("a@v1", 2).rpartition("@v") == ("a@v1", "@v", "2")


def test_train_servers_open_a_vllm_fleet_that_carries_ids_logprobs_and_the_versioned_name(engine):
    with _servers(engine) as (fakes, urls):
        rollout, elsewhere = open_rollout([f"vllm+{urls[0]}"], engine, None)
        try:
            assert elsewhere and isinstance(rollout, VLLMEngine)
            engine.load_adapter("alice", _weights(engine))
            version = engine.adapter_info("alice")["version"]
            assert rollout.sync_from(engine) == {"pushed": ["alice"], "dropped": []}
            prompt = engine.encode("Say something long:")
            c = rollout.submit(prompt, "alice", SamplingParams(max_tokens=3, temperature=0.7, seed=5)).result(30)
            body = fakes[0].completions()[-1]
            assert body["model"] == served_name("alice", version) and body["prompt"] == prompt
            assert body["logprobs"] == 0 and body["return_token_ids"] is True
            assert body["max_tokens"] == 3 and body["temperature"] == 0.7 and body["seed"] == 5
            want = fakes[0]._complete(body).body
            choice = json.loads(want)["choices"][0]
            assert c.prompt_ids == prompt and c.token_ids == choice["token_ids"]
            assert c.logprobs == pytest.approx(choice["logprobs"]["token_logprobs"])
            assert c.adapter_version == version and c.version_spans == [(0, 3, version)]
            base = rollout.submit(prompt, None, SamplingParams(max_tokens=2)).result(30)
            assert fakes[0].completions()[-1]["model"] == engine.name and base.adapter_version is None
        finally:
            rollout.close()
            engine.unload_adapter("alice")


def test_each_version_is_written_once_loaded_by_name_on_every_server_and_the_old_one_unloaded(engine):
    with _servers(engine, n=2) as (fakes, urls):
        writer = CountingWriter(engine)
        with _fleet(urls, engine, write_adapter=writer) as fleet:
            for seed, version in ((0, 1), (1, 2), (2, 3)):
                fleet.load_adapter("bob", _weights(engine, seed), version=version)
                for i in range(2):  # a request on each server: both hold the version
                    fleet.servers[i].current.get("bob") or fleet.submit([5, 6], "bob").result(30)
                    asyncio_run(fleet, fleet.servers[i], "bob")
            folder = fleet.folder
            assert writer.written == [str(folder.path("bob", v)) for v in (1, 2, 3)]  # once per version
            for f in fakes:
                loads = [b["lora_name"] for r, b in f.calls if r == "load"]
                unloads = [b["lora_name"] for r, b in f.calls if r == "unload"]
                assert loads == ["bob@v1", "bob@v2", "bob@v3"] and unloads == ["bob@v1", "bob@v2"], (loads, unloads)
                assert set(f.loras) == {"bob@v3"}
                assert [b["lora_path"] for r, b in f.calls if r == "load"] == \
                    [str(folder.path("bob", v)) for v in (1, 2, 3)]
            assert not folder.path("bob", 1).exists() and not folder.path("bob", 2).exists()
            assert (folder.path("bob", 3) / "adapter_config.json").is_file()
            fleet.unload_adapter("bob")
            assert all(not f.loras for f in fakes)
            root = folder.root
        assert not root.exists()  # a temporary adapter folder goes with the fleet


def asyncio_run(fleet, worker, player):
    """Make ``worker`` hold the player's current version (as the fleet does before a request)."""
    member = next(m for m in fleet._members if m.worker is worker)
    fleet._call(fleet._ensure(member, player)).result(30)


def test_the_previous_version_stays_loaded_until_its_last_request_ends(engine):
    with _servers(engine, delay=1.0) as (fakes, urls):
        with _fleet(urls, engine) as fleet:
            fleet.load_adapter("carol", _weights(engine, 0), version=1)
            slow = fleet.submit([5, 6, 7], "carol", SamplingParams(max_tokens=2))
            deadline = time.monotonic() + 10
            while not fakes[0].completions("carol@v1") and time.monotonic() < deadline:
                time.sleep(0.01)
            fleet.load_adapter("carol", _weights(engine, 1), version=2)  # while v1's request runs
            unloads = lambda: [b["lora_name"] for r, b in fakes[0].calls if r == "unload"]  # noqa: E731
            assert "carol@v1" in fakes[0].loras and unloads() == []
            c = slow.result(30)
            assert c.adapter_version == 1 and c.version_spans == [(0, 2, 1)]  # one version per turn
            deadline = time.monotonic() + 10
            while unloads() != ["carol@v1"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert unloads() == ["carol@v1"] and set(fakes[0].loras) == {"carol@v2"}
            assert fleet.generate([5, 6], "carol", max_tokens=1).adapter_version == 2


def test_a_server_that_fails_mid_request_loses_its_requests_to_the_other_each_answered_once(engine):
    with _servers(engine, n=2, delay=0.5) as (fakes, urls):
        with _fleet(urls, engine, down_timeout=10.0) as fleet:
            for i, name in enumerate(("p0", "p1", "p2", "p3")):
                fleet.load_adapter(name, _weights(engine, i), version=1)
            placed = {n: fleet.placement(n) for n in ("p0", "p1", "p2", "p3")}
            assert set(placed.values()) == set(urls)  # players spread over both servers
            futs = fleet.submit_many([([5, i], f"p{i % 4}", SamplingParams(max_tokens=2)) for i in range(16)])
            time.sleep(0.2)
            fakes[0].down = True  # its in-flight requests answer 503, then every route does
            outs = [f.result(60) for f in futs]
            assert len(outs) == 16 and all(o.adapter_version == 1 for o in outs)
            assert fleet.stats["retried"] >= 1 and fleet.stats["failed"] == 0
            assert [o.prompt_ids for o in outs] == [[5, i] for i in range(16)]
            answered = [b["prompt"] for b in fakes[1].completions()]
            # every request of the dead server was sent again to the other one, once
            assert sorted(map(tuple, answered)) == sorted({tuple(p) for p in answered}), "a request answered twice"
            assert not fleet.health()["servers"][0]["up"]
            fakes[0].down = False
            fakes[0].restart()  # came back without its adapters: the poll re-installs what it held
            assert fleet.wait_until_up(urls[0], 10)
            mine = [n for n, u in placed.items() if u == urls[0]]
            assert fleet.generate([9], mine[0], max_tokens=1).adapter_version == 1


def test_a_server_that_lost_its_adapters_between_polls_gets_them_again(engine):
    with _servers(engine) as (fakes, urls):
        with _fleet(urls, engine) as fleet:
            fleet.load_adapter("dave", _weights(engine), version=1)
            fakes[0].loras.clear()  # restarted between two polls, same process start time
            assert fleet.generate([5], "dave", max_tokens=1).adapter_version == 1
            assert [b["lora_name"] for r, b in fakes[0].calls if r == "load"] == ["dave@v1", "dave@v1"]


def test_an_adapter_above_the_servers_max_lora_rank_is_refused_by_name(engine):
    with _servers(engine, max_lora_rank=4) as (fakes, urls):
        with _fleet(urls, engine) as fleet:
            with pytest.raises(VLLMRankError, match=r"rank 8 is above the server's --max-lora-rank 4") as exc:
                fleet.load_adapter("erin", _weights(engine, r=8), version=1)
            assert "--max-lora-rank 8" in str(exc.value) and "erin" in str(exc.value)
            assert fleet.players() == [] and not fakes[0].loras


def test_an_adapter_on_a_module_the_servers_model_cannot_adapt_is_refused_by_name(engine):
    with _servers(engine, modules={"q_proj", "v_proj"}) as (fakes, urls):
        with _fleet(urls, engine) as fleet:
            with pytest.raises(VLLMModuleError, match=r"supports LoRA only on \['q_proj', 'v_proj'\], and the adapter "
                                                      r"adapts \['k_proj'\]. Train with target_modules") as exc:
                fleet.load_adapter("finn", _weights(engine, paths=("q_proj", "k_proj")), version=1)
            assert "finn" in str(exc.value) and not fakes[0].loras
            fleet.load_adapter("finn", _weights(engine, paths=("q_proj", "v_proj")), version=2)
            assert fleet.generate([5], "finn", max_tokens=1).adapter_version == 2


def test_a_trainer_refuses_at_start_up_what_vllm_cannot_serve(engine, tmp_path):
    class Duel(AutocurriculumTrainer):
        def entry(self):
            return [{"role": "learner"}, {"role": "base", "frozen": True}] if self.current_epoch == 0 else []

        def match(self):
            return [tuple(self.players[:2])]

    async def play(players, model, tokenizer):
        for p in players:
            await model.generate(p, "Say", max_tokens=1)
        return [0.0, 0.0]

    with _servers(engine, max_lora_rank=4) as (fakes, urls):
        t = Duel(AutocurriculumConfig(epochs=1, rounds=1, matches=2, output_dir=str(tmp_path), progress=False))
        with pytest.raises(VLLMRankError, match="--max-lora-rank"):
            t.train(engine.name, play, lora_config={"r": 8}, servers=[f"vllm+{urls[0]}"])
        assert not fakes[0].completions(), "no game may start before the refusal"


def test_a_server_on_another_base_model_is_refused_before_any_request(engine, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(engine.name, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(cfg))
    fake = VLLMFake(str(other), _encode(engine))
    with running_server(fake.app) as url:
        with pytest.raises(BaseModelMismatchError, match="config differ"):
            _fleet([url], engine)
    shifted = VLLMFake(engine.name, lambda text, special: [t + 1 for t in engine.tokenizer.encode(
        text, add_special_tokens=special)])
    with running_server(shifted.app) as url:
        with pytest.raises(BaseModelMismatchError, match="tokenizer differ"):
            _fleet([url], engine)
    elsewhere = VLLMFake("/nowhere/on/this/machine", _encode(engine))
    with running_server(elsewhere.app) as url:
        with pytest.raises(BaseModelMismatchError, match="cannot check the base model.*check_base=False"):
            _fleet([url], engine)
        with _fleet([url], engine, check_base=False) as fleet:  # the user vouches for it
            assert fleet.health()["ok"]
    assert not [c for c in fake.calls + shifted.calls if c[0] in ("load", "completions")]


class GoDownAfterFirstUpdate(TrainerCallback):
    def __init__(self, fake):
        self.fake, self.done = fake, False

    def on_update(self, trainer, turns, result):
        if not self.done:
            self.fake.down = True
            self.done = True


def test_a_league_trains_through_two_fake_vllm_servers_one_failing_mid_run(engine, tmp_path):
    class Duel(AutocurriculumTrainer):
        def entry(self):
            return [{"role": "learner"}, {"role": "base", "frozen": True}] if self.current_epoch == 0 else []

        def match(self):
            return [tuple(self.players[:2])]

    async def play(players, model, tokenizer):
        for p in players:
            await model.generate(p, "Say something long:", max_tokens=2)
        first = random.Random(model.seed).choice([1.0, -1.0])  # rewards that differ between games
        return [first, -first]

    with _servers(engine, n=2, delay=0.05) as (fakes, urls):
        t = Duel(AutocurriculumConfig(epochs=1, rounds=3, matches=8, max_tokens=2, output_dir=str(tmp_path),
                                      progress=False, ratings={"bt_bootstrap": 0}))
        t.train(engine.name, play, servers=[f"vllm+{u}" for u in urls],
                callbacks=[GoDownAfterFirstUpdate(fakes[0])])
        history = t.match_history
        assert len(history) == 3 * 8, "each game counted once"
        assert not any(r.get("rollout/errors") for r in t.metrics_log)
        assert sum(len(f.completions()) for f in fakes) >= 3 * 8 * 2
        learner_requests = [b for b in fakes[1].completions() if b["model"].startswith("learner-0@v")]
        assert {b["model"] for b in learner_requests} >= {"learner-0@v2", "learner-0@v3"}  # later rounds on the other


def test_the_dashboard_draws_the_sampler_mismatch_per_round(tmp_path):
    from autocurricula.serve.dashboard import RunView
    from autocurricula.training.loss import MISMATCH_KEYS

    rows = [{"step": s, "epoch": 0, MISMATCH_KEYS[0]: 1e-3 * s, MISMATCH_KEYS[1]: 0.01 * s} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    panels = {p["title"]: p["series"] for p in RunView(tmp_path).curves()["panels"]}
    assert panels == {"sampler mismatch": {MISMATCH_KEYS[0]: [[1, 1e-3], [2, 2e-3]],
                                           MISMATCH_KEYS[1]: [[1, 0.01], [2, 0.02]]}}
