"""``autocurricula dashboard OUTPUT_DIR``: one read-only page for a league run's output folder.

It reads only what a trainer writes, so it works on a finished run and on one still training
(the page polls ``/api/summary`` and reloads its panels when a file changed):

* leaderboard: Elo and Bradley-Terry ratings with bootstrap intervals, replayed from
  ``match_history.jsonl`` with the run's rating settings (the same numbers as
  ``trainer.leaderboard``), players without games last as unrated, and two Nash mixtures of the
  payoff: over the players with an adapter (``deploy``, the mixture to deploy) and over every
  player (``nash``, the league's meta-strategy);
* learning curves: every ``eval/*`` figure, the reward, win rate, loss, KL, entropy, skipped
  updates and exploitability that ``metrics.jsonl`` holds, over rounds or games played; reward, win
  rate and loss per role (and per player where a role has several learners) with a filter by role;
  a panel whose every series holds one value collapses to one line ("KL to the base: 0 throughout");
* Elo over time: the ``rating/elo/<player>`` series of ``metrics.jsonl``, with each player's role
  and whether it still trains;
* payoff heatmap: win rates (draws count half) replayed from ``match_history.jsonl`` with the
  run's ``payoff_decay``, as the league's PFSP sees them, ordered by role and then Elo;
* lineage: parents, snapshots and resets from ``players.json`` of the latest checkpoint;
* transcripts: ``transcripts.jsonl`` (the last games of each pair, see
  :mod:`autocurricula.views.transcripts`);
* adapters: each player's peft folder in the latest checkpoint, file by file or zipped.

JSON endpoints: ``/api/summary``, ``/api/leaderboard``, ``/api/curves``, ``/api/elo``, ``/api/payoff``,
``/api/lineage``, ``/api/transcripts``, ``/api/adapters``; files: ``/files/<path inside
OUTPUT_DIR>`` and ``/adapters/<player>.zip``. Nothing outside OUTPUT_DIR is ever served or read: every
file and folder a route reads goes through :meth:`RunView.inside`, which refuses a symbolic link
anywhere below OUTPUT_DIR (a trainer writes none) and anything that resolves outside it; the zip
reads each file through a descriptor opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import stat
import threading
import time
import zipfile
from pathlib import Path
from urllib.parse import quote

from autocurricula.serve.dashboard_page import render_page
from autocurricula.loop.checkpoint import list_checkpoints
from autocurricula.loop.rating import Elo, Payoff, RelativePayoff, bradley_terry_bootstrap, leaderboard_rows, meta_weights
from autocurricula.views.transcripts import FILENAME as TRANSCRIPTS, pair_key, read_transcripts

log = logging.getLogger(__name__)
HISTORY, METRICS = "match_history.jsonl", "metrics.jsonl"
_RATING_KEYS = ("elo_k", "elo_scale", "elo_initial", "payoff_decay", "bt_bootstrap", "meta_z", "seed")
_ELO_PREFIX = "rating/elo/"
# the learning curves' panels: (title, whether a metric's name belongs to it), in page order
CURVES = (("evaluation", lambda k: k.startswith("eval/") and "exploitability" not in k),
          ("exploitability", lambda k: "exploitability" in k),
          ("reward", lambda k: k.startswith(("rollout/reward", "reward/"))),
          ("win rate", lambda k: k.startswith("win_rate/")),
          ("loss", lambda k: k == "train/loss" or k.startswith("loss/")),
          ("KL to the base", lambda k: k == "train/kl"),
          ("entropy", lambda k: k == "train/entropy"),
          ("skipped updates", lambda k: k.startswith("train/skipped_")),
          ("sampler mismatch", lambda k: k.startswith("mismatch/")))  # |log p_learner - log p_sampler| per token
# the series of the whole league in a panel that also has series per role
_LEAGUE_WIDE = {"rollout/reward_mean": "all learners", "train/loss": "all learners (sum)"}

class RunView:
    """An output folder seen through the trainer's files; every method returns JSON-able data.

    Results are cached per file state (size and mtime), so polling an idle run costs a few stats."""

    def __init__(self, output_dir: str | Path):
        self.root = Path(output_dir).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"{output_dir} is not a folder: pass the output_dir of a training run "
                                    "(the folder holding metrics.jsonl, match_history.jsonl and checkpoint-*)")
        self._lock = threading.RLock()  # a computation may read other cached files
        self._cache: dict = {}

    # ------------------------------------------------------------------ files
    def _stamp(self, path: Path):
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _memo(self, key: str, stamp, compute):
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == stamp:
                return hit[1]
            value = compute()
            self._cache[key] = (stamp, value)
            return value

    def inside(self, path: Path) -> Path | None:
        """``path`` if it lies in the output folder with no symbolic link on the way (its real path is
        itself: no link, no ``..``), else None. Every file and folder the dashboard reads passes here."""
        try:
            absolute = Path(os.path.abspath(path))
            real = Path(os.path.realpath(path))
        except (OSError, ValueError):  # a NUL byte, a loop of links
            return None
        if real != absolute or not real.is_relative_to(self.root):
            return None
        return real

    def _jsonl(self, name: str) -> list[dict]:
        path = self.inside(self.root / name)
        if path is None:
            return []
        if name == HISTORY:  # a game the ratings cannot take (non-finite rewards, no players) is left out
            return self._memo(name, self._stamp(path), lambda: [r for r in _read_jsonl(path) if _rateable(r)])
        return self._memo(name, self._stamp(path), lambda: _read_jsonl(path))

    def checkpoint(self) -> Path | None:
        """The latest complete checkpoint folder (``COMPLETE`` marker), or None before the first;
        a checkpoint that is a link (or holds its marker through one) is not the run's."""
        found = [c for c in list_checkpoints(self.root) if self.inside(c / "COMPLETE") is not None]
        return found[-1] if found else None

    def _ckpt_json(self, name: str):
        ckpt = self.checkpoint()
        if ckpt is None:
            return None
        path = self.inside(ckpt / name)
        if path is None:
            return None
        try:
            return self._memo(f"{ckpt.name}/{name}", self._stamp(path), lambda: json.loads(path.read_text()))
        except (OSError, ValueError):  # pruned by save_total_limit in between, or not written by this version
            return None

    def settings(self) -> dict:
        """The run's rating settings: its checkpoint's config, else the defaults."""
        saved = (self._ckpt_json("config.json") or {}).get("config") or {}
        if isinstance(saved.get("ratings"), dict):  # the rating settings' group, beside the seed
            saved = {**saved["ratings"], "seed": saved.get("seed")}
        if all(k in saved for k in _RATING_KEYS):
            return {k: saved[k] for k in _RATING_KEYS}
        from autocurricula.loop.config import AutocurriculumConfig  # defaults (imports mlx: only when needed)

        default = AutocurriculumConfig()
        defaults = {**vars(default.ratings), "seed": default.seed}
        return {k: saved.get(k, defaults[k]) for k in _RATING_KEYS}

    def registry(self) -> list[dict]:
        """Players of the latest checkpoint, then ids seen in games since (new entrants), in order."""
        ckpt = self.checkpoint()  # the stamp is taken before the files are read: never newer than the data
        stamp = (ckpt.name if ckpt else None, ckpt and self._stamp(ckpt / "players.json"),
                 self._stamp(self.root / HISTORY))

        def compute():
            players = [dict(p) for p in self._ckpt_json("players.json") or [] if isinstance(p, dict) and "id" in p]
            known = {p["id"] for p in players}
            for row in self._jsonl(HISTORY):
                for i, pid in enumerate(row.get("players") or []):
                    if pid not in known:
                        known.add(pid)
                        roles = row.get("roles") or []
                        players.append({"id": pid, "role": roles[i] if i < len(roles) else None,
                                        "epoch": row.get("epoch"), "unsaved": True})
            return players

        return self._memo("registry", stamp, compute)

    def fingerprint(self) -> str:
        """Changes whenever a file the panels read changes."""
        ckpt = self.checkpoint()
        stamps = [self._stamp(self.root / n) for n in (HISTORY, METRICS, TRANSCRIPTS)]
        return json.dumps([ckpt.name if ckpt else None, stamps])

    # ------------------------------------------------------------------ panels
    def summary(self) -> dict:
        history, metrics, ckpt = self._jsonl(HISTORY), self._jsonl(METRICS), self.checkpoint()
        last = metrics[-1] if metrics else {}
        mtimes = [s[2] for s in (self._stamp(self.root / n) for n in (HISTORY, METRICS)) if s]
        return {"output_dir": str(self.root), "fingerprint": self.fingerprint(),
                "checkpoint": ckpt.name if ckpt else None, "games": len(history),
                "players": len(self.registry()), "step": _strict_json(last.get("step")),
                "epoch": _strict_json(last.get("epoch", history[-1].get("epoch") if history else None)),
                "updated": max(mtimes) / 1e9 if mtimes else None, "now": time.time()}

    def _replay(self):
        s, stamp = self.settings(), self._stamp(self.root / HISTORY)

        def compute():
            history = self._jsonl(HISTORY)
            # the trainer's own rule (Trainer._record): multi-player games rate; pairs add BT records
            elo, payoff, records = Elo(k=s["elo_k"], scale=s["elo_scale"], initial=s["elo_initial"]), \
                Payoff(s["payoff_decay"]), []
            relative, frozen = RelativePayoff(s["payoff_decay"]), {p["id"] for p in self.registry() if p.get("frozen")}
            games, current = [], None  # a round's games: the relative payoffs take them as the trainer did
            for row in history:
                ids, rewards = row.get("players") or [], row.get("rewards") or []
                if (row.get("epoch"), row.get("round")) != current:
                    relative.update_games(games, frozen)
                    games, current = [], (row.get("epoch"), row.get("round"))
                if len(set(ids)) > 1 and len(ids) == len(rewards):
                    elo.update(ids, rewards)
                    payoff.update_match(ids, rewards)
                    games.append((ids, rewards, row.get("deal")))
                    if len(ids) == 2:
                        a, b = rewards
                        records.append((ids[0], ids[1], 1.0 if a > b else 0.0 if a < b else 0.5))
            relative.update_games(games, frozen)
            bt = None
            if records and s["bt_bootstrap"]:
                bt = bradley_terry_bootstrap(records, rounds=s["bt_bootstrap"], seed=s["seed"])
            return elo, payoff, relative, bt

        return self._memo("replay", (stamp, json.dumps(s)), compute)

    def leaderboard(self) -> dict:
        """Rows, players with games best Elo first, then the unrated: rank, id, role, epoch, frozen,
        elo, bt, bt_low, bt_high, games, deploy (weight in the Nash mixture over the players with an
        adapter), nash (over every player), scripted."""
        elo, _, relative, bt = self._replay()
        players = self.registry()
        scripted = {p["id"] for p in players if "scripted" in p}
        ids, z = [p["id"] for p in players], self.settings()["meta_z"]
        rows = leaderboard_rows(players, elo, bt, nash=meta_weights(relative, ids, z),
                                deploy=meta_weights(relative, [i for i in ids if i not in scripted], z))
        for r in rows:
            r["scripted"] = r["id"] in scripted
        return {"rows": rows, "ci": 0.95 if bt else None, "bootstrap": self.settings()["bt_bootstrap"]}

    def curves(self) -> dict:
        """The learning curves of ``metrics.jsonl`` over rounds (the trainer's ``step`` counts rounds):
        ``{"panels": [...], "roles": [...], "games": [[round, games played by its end], ...]}``.

        Each panel (see :data:`CURVES`; those without a logged value left out) is ``{"title",
        "series": {metric: [[round, value], ...]}, "info": {metric: {"label", "role", "level"}},
        "flat"}``: ``level`` is ``"league"`` (all learners), ``"role"`` (``<group>/role/<role>``),
        ``"player"`` (``<group>/player/<id>``, its role from the registry) or None (a figure without
        roles); ``flat`` is one line of text when every series of the panel holds one value
        throughout (KL 0), else None. ``roles``: the roles the series name, for the page's filter.
        ``games`` maps rounds to games played (:meth:`games_by_round`)."""
        series: dict[str, list] = {}
        for row in self._jsonl(METRICS):
            step = _number(row.get("step"))
            if step is None:  # a row without a numeric step has no place on the x axis
                continue
            for key, value in row.items():
                # a verdict such as eval/loses_to_best_response_as_x is a bool: drawn as 0 / 1
                if isinstance(value, (int, float)) and math.isfinite(value) and any(b(key) for _, b in CURVES):
                    series.setdefault(key, []).append([step, float(value)])
        roles_of = {p["id"]: p.get("role") for p in self.registry()}
        panels, roles = [], []
        for title, belongs in CURVES:
            mine = {k: v for k, v in series.items() if belongs(k)}
            if not mine:
                continue
            info = {k: _series_info(k, roles_of) for k in mine}
            roles += [i["role"] for i in info.values() if i["role"] is not None]
            panels.append({"title": title, "series": mine, "info": info, "flat": _flat(title, mine, info)})
        games = self.games_by_round(p[0] for points in series.values() for p in points)
        return {"panels": panels, "roles": list(dict.fromkeys(roles)), "games": games}

    def games_by_round(self, steps) -> list[list]:
        """``[[round, games played by its end], ...]`` for the rounds ``steps``, from
        ``match_history.jsonl`` (games that failed are not in it). A round's number is
        ``epoch * rounds + round + 1``, the trainer's ``step``; empty when the history has rows
        without an epoch and round, or spans epochs while the number of rounds per epoch is unknown."""
        steps = sorted(set(steps))
        history = self._jsonl(HISTORY)
        if not steps or not history:
            return []
        at = [(row.get("epoch"), row.get("round")) for row in history]
        if not all(isinstance(e, int) and isinstance(r, int) and e >= 0 and r >= 0 for e, r in at):
            return []
        last_epoch = max(e for e, _ in at)
        saved = self._ckpt_json("config.json")
        saved = saved.get("config") if isinstance(saved, dict) else None
        per_epoch = saved.get("rounds") if isinstance(saved, dict) else None
        if not isinstance(per_epoch, int) or isinstance(per_epoch, bool) or per_epoch < 1:
            done = [r for e, r in at if e < last_epoch]  # a finished epoch shows how many rounds one has
            per_epoch = max(done) + 1 if done else None
        if last_epoch > 0 and per_epoch is None:
            return []
        rounds = sorted(e * (per_epoch or 0) + r + 1 for e, r in at)
        out, k = [], 0
        for step in steps:
            while k < len(rounds) and rounds[k] <= step:
                k += 1
            out.append([step, k])
        return out

    def elo(self) -> dict:
        """``{"series": {player: [[step, elo], ...]}, "roles": {player: role}, "current": [...]}``
        from the logged ``rating/elo/<player>`` values; ``current``: the players that still train."""
        series: dict[str, list] = {}
        for row in self._jsonl(METRICS):
            step = _number(row.get("step"))
            if step is None:
                continue
            for key, value in row.items():
                if key.startswith(_ELO_PREFIX) and _number(value) is not None:
                    series.setdefault(key[len(_ELO_PREFIX):], []).append([step, value])
        players = self.registry()
        current = [p["id"] for p in players if not p.get("frozen") and "scripted" not in p and p["id"] in series]
        return {"series": series, "roles": {p["id"]: p.get("role") for p in players}, "current": current}

    def payoff(self) -> dict:
        """Win rate of each row player against each column player (draws half; None = never met),
        the players ordered by role (in order of first entry) and then by Elo, best first."""
        elo, payoff, _, _ = self._replay()
        seen = set(payoff.players)
        registry = [p for p in self.registry() if p["id"] in seen]
        roles = list(dict.fromkeys(str(p.get("role")) for p in registry))
        registry.sort(key=lambda p: (roles.index(str(p.get("role"))), -elo.rating(p["id"]), str(p["id"])))
        ids = [p["id"] for p in registry]
        ids += sorted(seen - set(ids))
        games = [[payoff.games(a, b) for b in ids] for a in ids]
        rates = [[payoff.win_rate(a, b) if games[i][j] > 0 else None for j, b in enumerate(ids)]
                 for i, a in enumerate(ids)]
        role = {p["id"]: p.get("role") for p in registry}
        return {"players": ids, "roles": [role.get(i) for i in ids], "win_rate": rates, "games": games,
                "decay": payoff.decay}

    def lineage(self) -> dict:
        """Nodes (players) and edges parent -> child, kind 'snapshot' (a frozen copy) or 'inherit'."""
        nodes, edges = [], []
        for p in self.registry():
            nodes.append({k: p.get(k) for k in ("id", "role", "epoch", "parent", "frozen", "snapshot_of", "version")}
                         | {"resets": p.get("resets", 0), "scripted": p.get("scripted"),
                            "unsaved": bool(p.get("unsaved"))})
            if p.get("parent"):
                kind = "snapshot" if p.get("snapshot_of") else "inherit"
                edges.append({"from": p["parent"], "to": p["id"], "kind": kind})
        ckpt = self.checkpoint()
        return {"nodes": nodes, "edges": edges, "checkpoint": ckpt.name if ckpt else None}

    def transcripts(self, pair: str | None = None) -> dict:
        """``{"pairs": [{"pair", "games": [...]}]}``, the most recently played pair first, each pair's
        games newest first."""
        path = self.inside(self.root / TRANSCRIPTS)
        entries = [] if path is None else self._memo(TRANSCRIPTS, self._stamp(path), lambda: read_transcripts(path))
        groups: dict[str, list] = {}
        for e in entries:  # the file is in play order: a pair's last game comes last
            key = pair_key(e["players"])
            groups[key] = groups.pop(key, []) + [e]
        pairs = [{"pair": k, "games": g[::-1]} for k, g in reversed(groups.items()) if pair is None or k == pair]
        return {"pairs": pairs}

    def adapters(self) -> dict:
        """Each player's peft adapter folder in the latest checkpoint, with download links."""
        ckpt = self.checkpoint()
        out = []
        folder = self.inside(ckpt / "adapters") if ckpt else None
        roles = {p["id"]: p.get("role") for p in self.registry()}
        try:
            for d in sorted(folder.iterdir(), key=lambda d: d.name) if folder is not None and folder.is_dir() else []:
                if self.inside(d) is None or not d.is_dir():  # a link to a folder elsewhere is not the run's
                    continue
                files = [{"name": f.name, "bytes": f.stat().st_size,
                          "url": "/files/" + quote(f.relative_to(self.root).as_posix())}
                         for f in self._files_of(d)]
                out.append({"id": d.name, "role": roles.get(d.name), "checkpoint": ckpt.name, "path": str(d),
                            "files": files, "zip": f"/adapters/{quote(d.name, safe='')}.zip"})
        except OSError:  # save_total_limit pruned the checkpoint while we listed it: the next poll has the new one
            out = []
        return {"checkpoint": ckpt.name if ckpt else None, "adapters": out}

    # ------------------------------------------------------------------ downloads
    def _files_of(self, folder: Path) -> list[Path]:
        """The regular files directly in ``folder`` that :meth:`inside` accepts, by name."""
        return [f for f in sorted(folder.iterdir()) if self.inside(f) is not None and f.is_file()]

    def file(self, relative: str) -> Path | None:
        """The regular file at ``relative`` inside the output folder, or None: absolute paths, ``..``
        out of it and symbolic links (wherever they lead) are refused, as in :meth:`adapter_zip`."""
        if not relative or "\x00" in relative or relative.startswith(("/", "\\")):
            return None
        path = self.inside(self.root / relative)
        try:
            if path is None or not path.is_file():
                return None
        except OSError:  # a name longer than the file system allows (ENAMETOOLONG): no such file
            return None
        return path

    def adapter_zip(self, player_id: str) -> bytes | None:
        """The latest checkpoint's adapter folder of ``player_id`` as a zip, or None; the files are
        those :meth:`file` serves (no link, nothing outside the run), each read through a descriptor
        opened with ``O_NOFOLLOW`` so that a link swapped in after the check is not followed."""
        for a in self.adapters()["adapters"]:
            if a["id"] == player_id:  # only listed names: the id never becomes a path by itself
                folder = self.inside(Path(a["path"]))
                if folder is None:
                    return None
                buf = io.BytesIO()
                with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                    for f in self._files_of(folder):
                        data = _read_no_follow(f)
                        if data is not None:
                            zf.writestr(f"{player_id}/{f.name}", data)
                return buf.getvalue()
        return None


def _series_info(key: str, roles_of: dict) -> dict:
    """How the page names and filters a curve: ``reward/role/main_agent`` is the role main_agent's,
    ``reward/player/main_agent-1`` that player's (its role from the registry), ``rollout/reward_mean``
    the whole league's, ``eval/vs_random`` a figure without roles (named without its group)."""
    if key in _LEAGUE_WIDE:
        return {"label": _LEAGUE_WIDE[key], "role": None, "level": "league"}
    parts = key.split("/", 2)
    if len(parts) == 3 and parts[1] == "role" and parts[2]:
        return {"label": parts[2], "role": parts[2], "level": "role"}
    if len(parts) == 3 and parts[1] == "player" and parts[2]:
        role = roles_of.get(parts[2])
        return {"label": parts[2], "role": None if role is None else str(role), "level": "player"}
    return {"label": key.split("/", 1)[-1], "role": None, "level": None}


def _flat(title: str, series: dict, info: dict) -> str | None:
    """``"KL to the base: 0 throughout (rounds 1–12)"`` when every series of a panel holds one value
    all along (several values: each series named), else None: such a panel says more as a line."""
    values = {k: {v for _, v in points} for k, points in series.items()}
    if any(len(v) != 1 for v in values.values()):
        return None
    steps = sorted({p[0] for points in series.values() for p in points})
    when = f"(round {_figure(steps[0])})" if len(steps) == 1 else \
        f"throughout (rounds {_figure(steps[0])}–{_figure(steps[-1])})"
    distinct = {next(iter(v)) for v in values.values()}
    if len(distinct) == 1:
        return f"{title}: {_figure(distinct.pop())} {when}"
    each = ", ".join(f"{info[k]['label']} {_figure(next(iter(v)))}" for k, v in values.items())
    return f"{title}: {each} {when}"


def _figure(v: float) -> str:
    """A number as a reader writes it: 0, 12, 0.25, 1.5e-05 (no "0.00", no "-0")."""
    text = f"{v:.4g}"
    return "0" if text in ("-0", "0") else text


def _number(value) -> int | float | None:
    """``value`` if it is a finite number (not a bool, not a string), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _strict_json(value):
    """``value`` if strict JSON can carry it, else None: a NaN or an infinity read from a file
    (Python's json writes them) would make the answer invalid JSON, and the server answer 500."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return None
    return value


def _open_no_follow(path: Path):
    """The regular file at ``path`` opened for reading, or None if it is a link by now
    (``O_NOFOLLOW``), or not a regular file (``O_NONBLOCK``: a FIFO does not hang the open)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        return None
    return fh


def _read_no_follow(path: Path) -> bytes | None:
    """The bytes of the regular file at ``path`` (see :func:`_open_no_follow`), or None."""
    fh = _open_no_follow(path)
    if fh is None:
        return None
    with fh:
        return fh.read()


def _read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a torn last line (a writer mid-append) is skipped."""
    if not path.is_file():
        return []
    rows = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:  # NaN and Infinity (Python's json writes them) read as null: the page gets strict JSON
                row = json.loads(line, parse_constant=lambda name: None)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _rateable(row: dict) -> bool:
    players, rewards = row.get("players"), row.get("rewards")
    return (isinstance(players, list) and isinstance(rewards, list) and len(players) == len(rewards)
            and all(isinstance(p, str) for p in players)
            and all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in rewards)
            and (row.get("epoch") is None or isinstance(row.get("epoch"), int)))


def create_app(output_dir: str | Path, poll_seconds: float = 3.0):
    """The dashboard's FastAPI app over ``output_dir`` (read-only)."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

    view = RunView(output_dir)
    app = FastAPI(title="autocurricula dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.view = view

    panels = {"summary": view.summary, "leaderboard": view.leaderboard, "curves": view.curves, "elo": view.elo,
              "payoff": view.payoff,
              "lineage": view.lineage, "transcripts": view.transcripts, "adapters": view.adapters}

    @app.get("/", response_class=HTMLResponse)
    def page():
        """The page, with every panel's data inlined so it renders before the first poll."""
        data = {name: fn() for name, fn in panels.items()}
        return HTMLResponse(render_page(data, poll_seconds), headers={"Cache-Control": "no-store"})

    for name, panel in panels.items():  # GET /api/<panel>: its JSON (transcripts takes ?pair=)
        app.add_api_route(f"/api/{name}", panel, methods=["GET"], name=name)

    @app.get("/files/{relative:path}")
    def files(relative: str):
        """A file inside OUTPUT_DIR (404 for anything else); text and images inline, the rest as
        a download, never as HTML."""
        path = view.file(relative)
        fh = None if path is None else _open_no_follow(path)  # a link swapped in since the check: refused too
        if fh is None:
            raise HTTPException(404, f"no file {relative!r} in the output folder")
        kind = _MEDIA.get(path.suffix.lower())
        size = os.fstat(fh.fileno()).st_size
        headers = {"X-Content-Type-Options": "nosniff", "Content-Length": str(size)}
        if kind is None:
            headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(path.name)}"
        return StreamingResponse(_chunks(fh, size), media_type=kind or "application/octet-stream", headers=headers)

    @app.get("/adapters/{player_id}.zip")
    def adapter_zip(player_id: str):
        body = view.adapter_zip(player_id)
        if body is None:
            raise HTTPException(404, f"no adapter of {player_id!r} in the latest checkpoint")
        return Response(body, media_type="application/zip",
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(player_id)}.zip"})

    @app.exception_handler(HTTPException)
    async def not_found(request, exc):
        return JSONResponse({"error": {"message": exc.detail, "code": exc.status_code}}, status_code=exc.status_code)

    return app


def _chunks(fh, size: int, chunk: int = 1 << 20):
    """The open file's first ``size`` bytes (its size when opened: a log that grows meanwhile still
    matches the Content-Length), ``chunk`` at a time; closes it at the end or when the client leaves."""
    with fh:
        while size > 0 and (data := fh.read(min(chunk, size))):
            size -= len(data)
            yield data


_MEDIA = {".json": "text/plain; charset=utf-8", ".jsonl": "text/plain; charset=utf-8",
          ".txt": "text/plain; charset=utf-8", ".md": "text/plain; charset=utf-8", ".png": "image/png"}


def run_dashboard(output_dir: str | Path, host: str = "127.0.0.1", port: int = 8050, poll_seconds: float = 3.0) -> None:
    """Serve the dashboard with uvicorn until stopped (loopback by default: it has no login)."""
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("dashboard on %s without a login: anyone who can reach it can read the run's files", host)
    app = create_app(output_dir, poll_seconds)
    print(f"autocurricula dashboard for {Path(output_dir).resolve()} on http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


__all__ = ["RunView", "create_app", "run_dashboard"]
