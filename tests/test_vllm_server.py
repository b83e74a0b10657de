"""The README's Duel league trained through real vLLM servers (vLLM's CPU build in its own virtual
environment, named by ``--vllm-python`` or ``$AUTOCURRICULA_VLLM_PYTHON``; docs/benchmarks.md
shows the install): the reward climbs, each version is loaded under its name and the previous one
unloaded, the sampler's logprobs are the learner's, and a SIGKILL of one of two servers mid-round
loses no game and counts none twice. Slow: each server takes a minute or more to start on 2 cores."""

import contextlib
import functools
import os
import signal
import threading
import time

import numpy as np
import pytest

import autocurricula  # noqa: F401
from autocurricula import AutocurriculumConfig, AutocurriculumTrainer, GRPOConfig
from autocurricula.bench.vllm_server import vllm_server
from autocurricula.fleet.vllm import VLLMEngine
from autocurricula.publish.export import export_peft
from autocurricula.views.callbacks import TrainerCallback

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_python(request):
    from autocurricula.bench.peers import peer_python

    python, why = peer_python("vllm", request.config.getoption("--vllm-python"))
    if python is None:
        pytest.skip(f"no vLLM to run: {why}")
    return python


async def play(players, model, tokenizer):  # the README's game: the longer reply wins
    a, b = [len((await model.generate(p, "Say something long:", max_tokens=2)).text) for p in players]
    return [float((a > b) - (a < b)), float((b > a) - (b < a))]


class Duel(AutocurriculumTrainer):
    def entry(self):
        return [{"role": "learner"}, {"role": "base", "frozen": True}] if self.current_epoch == 0 else []

    def match(self):
        return [tuple(self.players[:2])]


class Mismatch(TrainerCallback):
    """Per round, before the update: the learner's logprobs of the tokens vLLM sampled, against vLLM's."""

    def __init__(self):
        self.rounds: list[tuple[float, float]] = []

    def on_games(self, trainer, records):
        engine, gaps = trainer.run.engine, []
        for t in (t for r in records for t in r.turns if t.player.startswith("learner")):
            sums = engine.completion_logprobs([(t.prompt_ids, t.completion_ids[:k])
                                               for k in range(1, len(t.completion_ids) + 1)], t.player)
            gaps += list(np.abs(np.diff([0.0, *sums]) - np.asarray(t.logprobs)))
        self.rounds.append((float(np.mean(gaps)), float(np.max(gaps))))


def _fleet(urls, model, **kw):
    write = functools.partial(export_peft, base_model_name_or_path=model)
    return VLLMEngine(urls, base=model, write_adapter=write, poll_s=0.5, **kw)


def test_the_readme_duel_trains_through_a_vllm_server(vllm_python, tmp_path):
    from autocurricula import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny-llama"))
    with vllm_server(vllm_python, model, tmp_path / "vllm.log") as (url, _):
        with _fleet([url], model) as fleet:
            mismatch = Mismatch()
            trainer = Duel(AutocurriculumConfig(epochs=2, rounds=5, matches=64, max_tokens=2, progress=False,
                                                output_dir=str(tmp_path / "run")))
            trainer.train(model, play, grpo_config=GRPOConfig(learning_rate=2e-2), servers=fleet,
                          callbacks=[mismatch])
            rewards = [r["rollout/reward_mean"] for r in trainer.metrics_log if "rollout/reward_mean" in r]
            worker = fleet.servers[0]
            version = trainer.run.engine.adapter_info("learner-0")["version"]
            learner_loads = [n for n in worker.loaded if n.startswith("learner-0@v")]
            learner_unloads = [n for n in worker.unloaded if n.startswith("learner-0@v")]
            listed = {m["id"] for m in __import__("httpx").get(f"{url}/v1/models").json()["data"]}
    assert len(rewards) == 10 and min(rewards[-3:]) >= 0.4 and np.mean(rewards[-3:]) >= rewards[0] + 0.3, rewards
    # every version the trainer made was loaded under its name, and every one but the last unloaded
    assert learner_loads == [f"learner-0@v{v}" for v in range(1, version + 1)], learner_loads
    assert learner_unloads == learner_loads[:-1] and f"learner-0@v{version}" in listed
    assert not any(n.startswith("learner-0@v") and n != f"learner-0@v{version}" for n in listed), listed
    # float32 on both sides: vLLM's logprobs of its sampled tokens are the learner's to rounding
    assert len(mismatch.rounds) == 10 and max(m for _, m in mismatch.rounds) < 1e-3, mismatch.rounds


class KillMidRound(TrainerCallback):
    """After the first update, SIGKILL the first server's process group as soon as requests of the
    next round are in flight on it (waits at most 120 s)."""

    def __init__(self, fleet, proc):
        self.fleet, self.proc, self.killed_inflight = fleet, proc, None
        self.thread = None

    def on_update(self, trainer, turns, result):
        if self.thread is None:
            self.thread = threading.Thread(target=self.kill, daemon=True)
            self.thread.start()

    def kill(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            inflight = self.fleet.health()["servers"][0]["inflight"]
            if inflight:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.killed_inflight = inflight
                return
            time.sleep(0.005)


def test_a_sigkilled_server_mid_round_loses_no_game_and_counts_none_twice(vllm_python, tmp_path):
    from autocurricula import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny-llama"))
    with contextlib.ExitStack() as stack:
        # one after the other: two starting at once fight over the cores
        a_url, a_proc = stack.enter_context(vllm_server(vllm_python, model, tmp_path / "a.log"))
        b_url, _ = stack.enter_context(vllm_server(vllm_python, model, tmp_path / "b.log"))
        with _fleet([a_url, b_url], model, down_timeout=60.0) as fleet:
            played: list[str] = []
            lock = threading.Lock()

            async def counted(players, m, tokenizer):
                rewards = await play(players, m, tokenizer)
                with lock:
                    played.append(m.seed)
                return rewards

            killer = KillMidRound(fleet, a_proc)
            trainer = Duel(AutocurriculumConfig(epochs=1, rounds=4, matches=64, max_tokens=2, progress=False,
                                                output_dir=str(tmp_path / "run")))
            trainer.train(model, counted, grpo_config=GRPOConfig(learning_rate=2e-2), servers=fleet,
                          callbacks=[killer])
            retried = sum(r.get("rollout/retried", 0) for r in trainer.metrics_log)
            health = fleet.health()
    assert killer.killed_inflight, "the server was to be killed with requests in flight"
    history = trainer.match_history
    assert len(history) == 4 * 64 and len(played) == 4 * 64, (len(history), len(played))
    assert not any(r.get("rollout/errors") for r in trainer.metrics_log)
    assert retried >= 1, "the killed server had requests in flight: they must have been sent again"
    assert not health["servers"][0]["up"] and health["servers"][1]["up"]
