"""Game transcripts: the last few games of every pair of players, as text, for the dashboard.

``output_dir/transcripts.jsonl`` holds one game a line: ``game_id``, ``epoch``, ``round``,
``players``, ``roles``, ``rewards`` and ``turns`` (each ``player``, ``seat``, ``prompt`` and
``completion`` text). Only the turns the trainer records are there: the calls of trainable
players (a scripted or frozen opponent's moves show in the next prompt of the game's board).
The file stays bounded: after every round it is rewritten atomically with only the last
``per_pair`` games of each pair (``transcripts_per_pair``; 0 = no file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

from autocurricula.files import atomic_write

FILENAME = "transcripts.jsonl"
MAX_CHARS = 2000  # per prompt or completion: a runaway completion must not bloat the file
MAX_TURNS = 128  # per game (the first ones)


def pair_key(players: list[str]) -> str:
    """The pair (or group) a game belongs to, whatever the seat order."""
    return " vs ".join(sorted(players))


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + f"... [{len(text) - MAX_CHARS} more characters]"


def game_entry(record, decode: Callable[[list[int]], str], epoch: int, round_: int) -> dict:
    """One finished game (an arena ``GameRecord``) as a JSON-able transcript."""
    turns = [{"player": t.player, "seat": t.seat, "level": t.level, "prompt": _clip(decode(list(t.prompt_ids))),
              "completion": _clip(decode(list(t.completion_ids)))}
             for t in record.turns[:MAX_TURNS] if not t.target]
    return {"game_id": record.game_id, "epoch": epoch, "round": round_,
            "players": [p["id"] for p in record.players], "roles": [p.get("role") for p in record.players],
            "rewards": list(record.rewards), "turns": turns, "turns_total": len(record.turns)}


def keep_last(entries: Iterable[dict], per_pair: int) -> list[dict]:
    """The last ``per_pair`` entries of each pair, in their order; a later entry with the same
    ``game_id`` (a round replayed after a resume) replaces the earlier one."""
    by_id: dict[str, dict] = {}
    for e in entries:
        by_id.pop(e["game_id"], None)  # re-insert: the replayed game counts as the latest
        by_id[e["game_id"]] = e
    kept: dict[str, list[dict]] = {}
    for e in by_id.values():
        kept.setdefault(pair_key(e["players"]), []).append(e)
    last = {id(e) for group in kept.values() for e in group[-per_pair:]} if per_pair > 0 else set()
    return [e for e in by_id.values() if id(e) in last]


def read_transcripts(path: str | Path) -> list[dict]:
    """Entries of a transcripts file (missing file: none; a torn or foreign line is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and isinstance(e.get("game_id"), str) and isinstance(e.get("players"), list):
            out.append(e)
    return out


def update_transcripts(path: str | Path, new: list[dict], per_pair: int, fresh: bool = False) -> None:
    """Merge ``new`` entries into the file (``fresh``: drop what it held), keep the last
    ``per_pair`` per pair, replace atomically."""
    path = Path(path)
    entries = keep_last(([] if fresh else read_transcripts(path)) + list(new), per_pair)
    atomic_write(path, "".join(json.dumps(e) + "\n" for e in entries))


def write_transcripts(path: Path, per_pair: int, records, decode, epoch: int, round_: int, *, fresh: bool) -> None:
    """After each round: the text of the round's finished games into ``path``, the last
    ``per_pair`` of each pair (0 = off). ``fresh`` (a run's first round) drops an older run's games."""
    if not per_pair:
        return
    done = keep_last([{"game_id": r.game_id, "players": [p["id"] for p in r.players], "record": r}
                      for r in records if not r.error], per_pair)  # decode only what will be kept
    update_transcripts(path, [game_entry(e["record"], decode, epoch, round_) for e in done], per_pair, fresh=fresh)
