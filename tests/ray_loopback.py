"""Ray kept on 127.0.0.1 for the tests, and the listening sockets of its processes.

Ray's servers (GCS, raylets, workers, agents) listen on loopback only when the node's IP is
127.0.0.1, but ``ray start``, ``ray.init`` and a worker node's join replace a loopback address with
the machine's outward one (``ray._private.services.resolve_ip_for_localhost``), and then listen on
every interface. :func:`loopback_addresses` keeps the address as given: the only change made to
Ray here. Run as a script, it runs Ray's command line or a test driver with it:

    python ray_loopback.py ray start ...                      the ``ray`` command line
    python ray_loopback.py drive MODEL ADDRESS OUT PGID,...   join, train on 2 actors; prints JSON
"""

import json
import os
import sys
from contextlib import contextmanager

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


@contextmanager
def loopback_addresses():
    """Within it, Ray keeps 127.0.0.1 as a node's (and a cluster address's) IP."""
    from ray._private import services

    try:
        original = services.resolve_ip_for_localhost
    except AttributeError:
        raise RuntimeError("ray._private.services.resolve_ip_for_localhost is gone: this Ray version needs another "
                           "way to keep its nodes on 127.0.0.1 (tests/ray_loopback.py)") from None
    services.resolve_ip_for_localhost = _as_given
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = original


def _as_given(host: str) -> str:
    return host


def members(pgids: set[int]) -> list:
    """The processes of these process groups and all their descendants (Ray's workers start their own)."""
    import psutil

    found = {}
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids:
                found[proc.pid] = proc
                found.update((c.pid, c) for c in proc.children(recursive=True))
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return list(found.values())


def sockets(procs: list) -> list[dict]:
    """Every listening TCP socket and bound UDP socket of these processes."""
    import psutil

    out = []
    for proc in procs:
        try:
            name = proc.name()
            for c in proc.net_connections(kind="inet"):
                if c.laddr and c.status in (psutil.CONN_LISTEN, psutil.CONN_NONE):
                    out.append({"pid": proc.pid, "name": name, "ip": c.laddr.ip, "port": c.laddr.port})
        except psutil.NoSuchProcess:
            continue
    return out


def drive(model: str, address: str, out: str, pgids: str) -> dict:
    """Join the cluster and train 2 rounds on 2 rollout actors, one per node; what the test checks."""
    import ray

    from autocurricula import SelfPlayConfig, SelfPlayTrainer
    from autocurricula.fleet.cluster import RayEngine
    from autocurricula.engine import AdapterWeights, LoraSpec, SamplingParams
    from toy_games import digits

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    nodes = [{"id": n["NodeID"], "ip": n["NodeManagerAddress"], "alive": n["Alive"], "cpus": n["Resources"].get("CPU")}
             for n in ray.nodes()]
    # each node has one CPU and each actor takes one: Ray has to put one actor on each node
    rollout = RayEngine(model, num_actors=2, num_cpus=1, timeout=60, poll_s=0.5, connect_timeout=60)
    trainer = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 4, "past_share": 0.5},
                                             output_dir=out, progress=False, max_tokens=4, ratings={"bt_bootstrap": 0}))
    try:
        actor_nodes = [ray.get(a.handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()),
                               timeout=60) for a in rollout.actors]
        trainer.train(model, digits, servers=rollout)
        # two new players go to the two actors (the least loaded first); each answers on its node
        w = AdapterWeights.random(trainer.engine.linear_dims, LoraSpec(r=4), seed=1)
        probes = {}
        for name in ("probe-0", "probe-1"):
            rollout.load_adapter(name, w, version=3)
            done = rollout.submit("o", name, SamplingParams(max_tokens=2, temperature=0.0)).result(60)
            probes[name] = {"actor": rollout.placement(name), "version": done.adapter_version}
        # while every actor is up: the raylets' processes, this driver's and the actors'
        bound = sockets(members({int(g) for g in pgids.split(",")} | {os.getpgid(0)}))
        return {"nodes": nodes, "actor_nodes": actor_nodes, "games": len(trainer.match_history), "probes": probes,
                "stats": dict(rollout.stats), "driver_ip": ray.util.get_node_ip_address(), "sockets": bound}
    finally:
        rollout.close()
        trainer.engine.close()
        ray.shutdown()


if __name__ == "__main__":
    with loopback_addresses():
        if sys.argv[1] == "ray":
            from ray.scripts.scripts import main

            sys.argv = sys.argv[1:]
            sys.exit(main())
        print("RESULT " + json.dumps(drive(*sys.argv[2:6])), flush=True)
