"""The fleet's own bookkeeping, where a public call cannot reach the moment under test."""

from concurrent.futures import Future

import autocurricula  # noqa: F401
from autocurricula.engine import AdapterWeights, Engine, LoraSpec, SamplingParams, UnknownPlayerError
from autocurricula.fleet.remote import RemoteEngine
from autocurricula.serve.server import create_app

from helpers import running_server


def test_a_player_unloaded_between_the_check_and_the_batch_call_fails_only_its_requests(tiny_model_path):
    serving, local = Engine(str(tiny_model_path)), Engine(str(tiny_model_path))
    try:
        with running_server(create_app(serving)) as url, RemoteEngine([url], base=local) as fleet:
            for i, name in enumerate(("alice", "bob")):
                fleet.load_adapter(name, AdapterWeights.random(local.linear_dims, LoraSpec(r=4), seed=i), version=6)
            items = [fleet._prepare("x o", p, SamplingParams(max_tokens=2)) for p in ("alice", "bob", "alice")]
            gone = fleet._adapters.pop("bob")  # as an unload landing right after submit_many's check
            futs = [Future() for _ in items]
            fleet._call(fleet._complete_many(items, futs)).result(60)
            fleet._adapters["bob"] = gone
            assert isinstance(futs[1].exception(), UnknownPlayerError)
            assert [futs[i].result().adapter_version for i in (0, 2)] == [6, 6]
    finally:
        serving.close()
        local.close()
