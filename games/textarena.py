"""Adapter: any two-player TextArena environment (Guertler et al. 2025, https://github.com/LeonGuertler/TextArena,
``pip install "autocurricula[games]"``, tested with textarena 0.7.4) as an async ``play``.

SPIRAL (arXiv 2506.24119) trains on TicTacToe-v0, KuhnPoker-v1 and SimpleNegotiation-v1 of an
earlier TextArena; 0.7.x registers TicTacToe-v0, KuhnPoker-v0 (3 hands) and SimpleNegotiation-v0.

Seats: ``players[i]`` is TextArena player ``i`` (in TicTacToe-v0 player 0 is "O" and moves first).
Each turn the current player gets the environment's observation as its prompt (or
``prompt_fn(observation, player_id)``) and its reply, after ``action_fn`` (default: strip), is the
action. Rewards are the environment's, except after an invalid move: TextArena flags the offender
in ``game_info`` and we give it ``invalid_penalty[0]`` (default -1.5) and the other player
``invalid_penalty[1]`` (default +0.5). ``retries`` (default 0) sets TextArena's ``error_allowance``
(invalid moves forgiven, with a message, before one ends the game). A game still running after
``max_steps`` steps ends with 0 / 0.

Randomness: TextArena seeds and draws from the global ``random`` module; every environment call
here runs on the game's own saved ``random`` state (from ``seed`` / ``rng``), so games are
reproducible, concurrent games do not disturb each other and the caller's global state is kept.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Callable
from typing import Any

from autocurricula.games._common import DEFAULT_INVALID_PENALTY, ask, check_penalty, check_players, choice, make_rng
from autocurricula.records import GameFacts

__all__ = ["FACTS", "NUM_PLAYERS", "ZERO_SUM", "make_play", "play", "random_policy", "run_env"]

NUM_PLAYERS = 2
ZERO_SUM = True  # for the two-player win/loss environments (TicTacToe, KuhnPoker); check others
FACTS = GameFacts(2, "zero_sum", None, "sequential")  # the rest depends on the environment
INSTALL_HINT = 'textarena is not installed; install it with: pip install "autocurricula[games]"'


def _textarena():
    try:
        import textarena as ta
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return ta


def _check_env_id(ta, env_id: str) -> None:
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=5, cutoff=0.6)
        version = getattr(ta, "__version__", "?")
        raise ValueError(f"{env_id!r} is not registered in textarena {version}"
                         + (f"; similar: {', '.join(close)}" if close else ""))


class _OwnRandom:
    """Runs a block on a private ``random`` state, restoring the caller's global state after it."""

    def __init__(self, seed: int):
        self.state = random.Random(seed).getstate()

    def __enter__(self):
        self.outer = random.getstate()
        random.setstate(self.state)

    def __exit__(self, *exc):
        self.state = random.getstate()
        random.setstate(self.outer)


def _as_text(observation) -> str:
    if isinstance(observation, str):
        return observation
    if isinstance(observation, (list, tuple)):  # raw environments: (sender, message, type) tuples
        return "\n".join(str(m[1]) if isinstance(m, (list, tuple)) and len(m) > 1 else str(m) for m in observation)
    return str(observation)


def _final(close_out) -> tuple[dict, dict]:
    # 0.7.x: close() -> (rewards, game_info); older: rewards only
    if isinstance(close_out, tuple) and len(close_out) == 2 and isinstance(close_out[1], dict):
        rewards, info = close_out
    else:
        rewards, info = close_out, {}
    return dict(rewards or {}), dict(info or {})


def _offenders(game_info: dict, n: int) -> list[int]:
    return [pid for pid in range(n) if isinstance(game_info.get(pid), dict) and game_info[pid].get("invalid_move")]


async def run_env(env_id: str, players: list[dict], model, *, seed: int | None = None, rng: Any = None,
                  invalid_penalty=DEFAULT_INVALID_PENALTY, max_tokens: int = 8, temperature: float | None = None,
                  stop=None, retries: int = 0, max_steps: int = 200, prompt_fn: Callable | None = None,
                  action_fn: Callable[[str], str] | None = None, env_kwargs: dict | None = None) -> dict:
    """Play one game; returns {"rewards", "invalid_by", "raw_rewards", "game_info", "steps"}."""
    ta = _textarena()
    _check_env_id(ta, env_id)
    check_penalty(invalid_penalty)
    check_players(players, 2, env_id)
    n = len(players)
    seed = seed if seed is not None else getattr(model, "seed", None)  # the league's per-game seed
    game_seed = make_rng(seed, rng).randrange(2**31)
    own = _OwnRandom(game_seed)
    with own:
        env = ta.make(env_id, **(env_kwargs or {}))
        env.reset(num_players=n, seed=game_seed)
        state = getattr(env, "state", None)
        if state is not None and hasattr(state, "error_allowance"):
            state.error_allowance = int(retries)
    done, steps = False, 0
    while not done and steps < max_steps:
        with own:
            pid, observation = env.get_observation()
        text = _as_text(observation)
        prompt = prompt_fn(text, pid) if prompt_fn is not None else text
        reply = await ask(model, players[pid], prompt, max_tokens=max_tokens, temperature=temperature, stop=stop)
        action = action_fn(reply) if action_fn is not None else reply.strip()
        with own:
            done, _info = env.step(action=action)
        steps += 1
    with own:
        raw, game_info = _final(env.close())
    offenders = _offenders(game_info, n) if done else []
    if offenders:
        off, other = check_penalty(invalid_penalty)
        rewards = [off if i in offenders else other for i in range(n)]
    elif done:
        rewards = [float(raw.get(i, 0.0)) for i in range(n)]
    else:
        rewards = [0.0] * n  # cut at max_steps
    return {"rewards": rewards, "invalid_by": offenders, "raw_rewards": raw, "game_info": game_info, "steps": steps}


def make_play(env_id: str, *, invalid_penalty=DEFAULT_INVALID_PENALTY, max_tokens: int = 8,
              temperature: float | None = None, stop=None, retries: int = 0, max_steps: int = 200,
              prompt_fn: Callable | None = None, action_fn: Callable[[str], str] | None = None, **env_kwargs):
    """An async ``play(players, model, tokenizer, *, seed=None, rng=None, **overrides)`` for
    ``env_id`` (``overrides``: any of the options here, per call); ``env_kwargs`` go to
    ``textarena.make``. Fails early if textarena or the id is missing."""
    ta = _textarena()
    _check_env_id(ta, env_id)
    check_penalty(invalid_penalty)
    options = {"invalid_penalty": invalid_penalty, "max_tokens": max_tokens, "temperature": temperature,
               "stop": stop, "retries": retries, "max_steps": max_steps, "prompt_fn": prompt_fn,
               "action_fn": action_fn, "env_kwargs": env_kwargs}

    async def play(players: list[dict], model, tokenizer=None, *, seed: int | None = None, rng: Any = None,
                   **overrides) -> list[float]:
        unknown = set(overrides) - set(options)
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {sorted(options)}, seed, rng")
        return (await run_env(env_id, players, model, seed=seed, rng=rng, **{**options, **overrides}))["rewards"]

    play.__name__ = play.__qualname__ = f"play_{re.sub(r'[^0-9A-Za-z_]', '_', env_id)}"
    play.env_id = env_id
    return play


async def play(players: list[dict], model, tokenizer=None, *, env_id: str = "TicTacToe-v0",
               invalid_penalty=DEFAULT_INVALID_PENALTY, max_tokens: int = 8, temperature: float | None = None,
               seed: int | None = None, rng: Any = None, stop=None, retries: int = 0, max_steps: int = 200,
               prompt_fn: Callable | None = None, action_fn: Callable[[str], str] | None = None,
               env_kwargs: dict | None = None) -> list[float]:
    """One game of ``env_id`` (default TicTacToe-v0); the same as ``make_play(env_id, ...)``."""
    out = await run_env(env_id, players, model, seed=seed, rng=rng, invalid_penalty=invalid_penalty,
                        max_tokens=max_tokens, temperature=temperature, stop=stop, retries=retries,
                        max_steps=max_steps, prompt_fn=prompt_fn, action_fn=action_fn, env_kwargs=env_kwargs)
    return out["rewards"]


_OPTIONS_RE = re.compile(r"\[([^\[\]]+)\]")


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player for environments that list their options in brackets on an "available"
    line (TicTacToe-v0: "Available Moves: '[0]', ...", KuhnPoker-v0: "Your available actions are:
    '[check]', '[bet]'"): a uniformly random one of the last such line."""
    for line in reversed(prompt.splitlines()):
        at = line.lower().find("available")
        if at >= 0:
            options = _OPTIONS_RE.findall(line[at:])  # not the "[GAME]" sender tag before it
            if options:
                return f"[{choice(rng, options)}]"
    raise ValueError("no line listing available moves in brackets")
