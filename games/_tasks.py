"""Helpers of the language tasks (debate, red/blue, refine): prompts that read well as plain text and
as chat messages, and parsers of judges' verdicts. Not a game (the underscore keeps it out of
game discovery)."""

from __future__ import annotations

import re

_SCORE = re.compile(r"-?\d+(?:\.\d+)?")


def prompt(instructions: str, body: str, chat: bool = False):
    """Plain text (instructions, a blank line, the body) or, with ``chat``, messages: the instructions
    as the system message and the body as the user's, for the model's chat template."""
    if chat:
        return [{"role": "system", "content": instructions}, {"role": "user", "content": body}]
    return f"{instructions}\n\n{body}"


def verdict(reply: str, options=("A", "B")) -> str | None:
    """The option a judge named first (``"B"``, ``"Debater A"``, ``"a."``), or None."""
    found = re.search(r"\b(" + "|".join(map(re.escape, options)) + r")\b", reply.strip(), re.IGNORECASE)
    return found.group(1).upper() if found else None


def score(reply: str, low: float = 0.0, high: float = 10.0) -> float | None:
    """The first number of a judge's reply, clipped to [low, high], or None."""
    found = _SCORE.search(reply)
    return None if found is None else min(high, max(low, float(found.group())))
