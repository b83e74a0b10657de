"""The operations routes: health (for load balancers; never needs the key), the base model's
fingerprint, and the counters and limits."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from autocurricula.engine.fingerprint import fingerprint_engine
from autocurricula.serve.state import ServerState, StateDep


def health_body(state: ServerState) -> tuple[dict, int]:
    """The health answer and its status: 503 when the engine thread is dead or stuck."""
    h = state.engine.health()
    return {"status": "ok" if h["ok"] else "unhealthy", "instance": state.instance, **h}, 200 if h["ok"] else 503


def stats_body(state: ServerState) -> dict:
    engine = state.engine
    health = engine.health()
    return {"stats": dict(engine.stats), "occupancy": engine.occupancy, "health": health,
            "queue": {"waiting": health["queued"], "running": health["running"],
                      "paused": engine.stats["paused"]},  # rows paused so far to give another request a row
            "players": engine.players(), "limits": state.limits()}


async def health(state: StateDep):
    """200 while the engine thread runs and is not stuck, else 503."""
    body, status = health_body(state)
    return JSONResponse(body, status_code=status)


async def get_fingerprint(state: StateDep):
    """Hashes of the base model's config and weights: clients check them before playing."""
    if state.fingerprint is None:
        state.fingerprint = await run_in_threadpool(fingerprint_engine, state.engine)
    return {"model": state.engine.name, "instance": state.instance, **state.fingerprint}


async def stats(state: StateDep):
    """Engine counters, batch occupancy, health, queue depth, loaded players and the limits."""
    return stats_body(state)


# (method, path, handler), in the order the app matches them
ROUTES = (
    ("GET", "/health", health),
    ("GET", "/v1/fingerprint", get_fingerprint),
    ("GET", "/v1/stats", stats),
)
