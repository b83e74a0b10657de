"""``autocurricula bench``'s arguments, checked before anything runs (as ``train`` and ``serve``
check theirs): every count a whole number in a bounded range (:data:`LIMITS`, through argparse's
``type=``), and the engine bench's model, KV cache and adapters estimated from ``--hidden``,
``--layers``, ``--batch`` and ``--new-tokens`` and refused above a share of the machine's memory
(:func:`memory_problem`). Either way argparse answers: the flag, the allowed range, exit status 2
and no traceback. Light: argparse and os only (the CLI builds its parser from it)."""

from __future__ import annotations

import argparse
import os

# flag -> (lowest, highest, step): the values a bench can run with. Sizes beyond these are no
# benchmark of this project's use (a league's LoRA players on one machine).
LIMITS = {
    "--hidden": (8, 16384, 8),  # 4 attention heads of an even head size: a multiple of 8
    "--layers": (1, 256, 1),
    "--batch": (1, 4096, 1),
    "--new-tokens": (1, 2048, 1),
    "--repeats": (1, 100, 1),
    "--games": (1, 4096, 1),
    "--torch-threads": (1, 1024, 1),
    "--seeds": (0, 2**31 - 1, 1),
    "--epochs": (1, 1000, 1),
    "--rounds": (1, 1000, 1),
    "--games-per-round": (2, 4096, 1),
    "--warmup-steps": (0, 100_000, 1),
    "--matrix-games": (1, 1000, 1),
}
VOCAB, HEADS, RANK, TARGETS, PROMPT_TOKENS = 1024, 4, 8, 2, 64  # the engine bench's fixed shape (bench/engine.py)
MEMORY_SHARE = 0.5  # of the machine's memory, at most, for the engine bench's estimate


def count(flag: str, low: int | None = None):
    """The ``type=`` of a count flag: a whole number in :data:`LIMITS`'s range for ``flag``; argparse
    prefixes its message with the flag (``argument --batch: must be ...``)."""
    lowest, high, step = LIMITS[flag]
    low = lowest if low is None else low

    def parse(text: str) -> int:
        what = f"a whole number from {low} to {high}" + (f", a multiple of {step}" if step > 1 else "")
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if not low <= value <= high or value % step:
            raise argparse.ArgumentTypeError(f"must be {what}, not {value}")
        return value

    parse.__name__ = flag.lstrip("-").replace("-", "_")  # argparse names the type in some messages
    return parse


def games(text: str):
    """``--games``: a whole number (``bench round``'s games per round, in :data:`LIMITS`' range) or
    the names of ``bench learn``'s games (letters, digits and ``_ : , ( ) = . -``)."""
    stripped = text.strip()
    if stripped.lstrip("+-").isdigit():
        return count("--games")(stripped)
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:,()=.- ")
    if not stripped or set(stripped) - allowed:
        raise argparse.ArgumentTypeError(f"must be a whole number (round) or game names (learn), not {text!r}")
    return stripped


games.__name__ = "games"


def games_problem(args: argparse.Namespace) -> str | None:
    """Why ``--games`` does not fit the bench it is given to, or None."""
    value, what = getattr(args, "games", None), getattr(args, "what", None)
    if what == "learn" and not isinstance(value, int):
        from importlib import import_module

        return import_module("autocurricula.bench.learn").check(args)
    if value is None:
        return None
    if what == "learn" and isinstance(value, int):
        return (f"argument --games: bench learn takes game names (matrix, matrix:N, kuhn, leduc, goofspiel, "
                f"liars_dice), not {value}")
    if what != "learn" and isinstance(value, str):
        low, high, _ = LIMITS["--games"]
        return f"argument --games: must be a whole number from {low} to {high}, not {value!r}"
    return None


def machine_memory() -> int | None:
    """Bytes of physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def engine_bytes(hidden: int, layers: int, batch: int, new_tokens: int, vocab: int = VOCAB) -> dict:
    """What ``bench engine`` holds at once, in bytes (float32): the model three times (its weights
    built on disk, the engine's copy, mlx-lm's reload baseline), the KV cache of ``batch`` rows of
    prompt plus twice ``new_tokens`` (the hot-swap run), and ``batch`` adapters."""
    params = 2 * vocab * hidden + layers * 10 * hidden * hidden  # embeddings + head; q,k,v,o + MLP of 2x
    model = 3 * 4 * params
    kv = 4 * batch * (PROMPT_TOKENS + 2 * new_tokens) * layers * 2 * hidden
    adapters = 4 * batch * layers * TARGETS * RANK * 2 * hidden
    return {"model": model, "kv_cache": kv, "adapters": adapters, "total": model + kv + adapters}


def memory_problem(args: argparse.Namespace, memory: int | None = None) -> str | None:
    """Why ``bench engine`` with these arguments cannot fit this machine, or None. Only the engine
    bench builds a model of ``--hidden`` / ``--layers`` (and only without ``--model``)."""
    if getattr(args, "what", None) != "engine" or getattr(args, "model", None) is not None:
        return None
    memory = machine_memory() if memory is None else memory
    if not memory:
        return None
    need = engine_bytes(args.hidden, args.layers, args.batch, args.new_tokens)
    if need["total"] <= MEMORY_SHARE * memory:
        return None
    gib = 2**30
    return (f"--hidden {args.hidden} --layers {args.layers} --batch {args.batch} --new-tokens {args.new_tokens} "
            f"need about {need['total'] / gib:,.1f} GiB (model x3 {need['model'] / gib:,.1f}, KV cache "
            f"{need['kv_cache'] / gib:,.1f}, adapters {need['adapters'] / gib:,.1f}), more than "
            f"{MEMORY_SHARE:.0%} of this machine's {memory / gib:,.1f} GiB: lower --hidden, --layers, --batch or "
            "--new-tokens (defaults 256, 4, 64, 48)")


__all__ = ["LIMITS", "count", "engine_bytes", "games", "games_problem", "machine_memory", "memory_problem"]
