"""Machine load and a worker's CPU use, read by ``bench peers`` around each timed run.

A side's work may run in child processes (vLLM runs its engine core in one), so a worker's use is
that of its whole process tree: CPU seconds (user + system) and threads, from ``/proc``. Where
``/proc`` or ``os.getloadavg`` is missing (not Linux) the readings are None.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def load_now() -> float | None:
    """The machine's 1-minute load average, None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def parse_stat(text: str) -> dict:
    """``ppid``, ``cpu_s`` (user + system seconds) and ``threads`` from one ``/proc/PID/stat`` line.

    The command name may hold spaces and parentheses, so fields are counted after its last ``)``."""
    rest = text[text.rindex(")") + 2:].split()
    return {"ppid": int(rest[1]), "cpu_s": (int(rest[11]) + int(rest[12])) / _TICK, "threads": int(rest[17])}


def _stats(proc: Path) -> dict[int, dict]:
    out = {}
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = parse_stat((d / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # a process that ended while the table was read
    return out


def tree_usage(pid: int, proc: Path = Path("/proc")) -> dict | None:
    """``{"cpu_s", "threads", "processes"}`` summed over ``pid`` and its live descendants; None
    without ``/proc`` or once ``pid`` has ended."""
    if not proc.is_dir():
        return None
    stats = _stats(proc)
    if pid not in stats:
        return None
    children: dict[int, list[int]] = {}
    for p, s in stats.items():
        children.setdefault(s["ppid"], []).append(p)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return {"cpu_s": sum(stats[p]["cpu_s"] for p in tree), "threads": sum(stats[p]["threads"] for p in tree),
            "processes": len(tree)}


def cores_used(before: dict | None, after: dict | None, seconds: float) -> float | None:
    """Average cores a process tree kept busy over ``seconds`` of wall time (CPU seconds / wall)."""
    if before is None or after is None or seconds <= 0:
        return None
    return round((after["cpu_s"] - before["cpu_s"]) / seconds, 2)
