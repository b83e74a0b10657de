"""Checkpoints: ``output_dir/checkpoint-<epoch>/``, JSON and safetensors only, written atomically.

Contents: every player's adapter (peft format), optimizer states, RNG states, ratings, payoff
matrix, Bradley-Terry records, RAE baselines, the pool registry, counters and the config. The
folder is built under a temporary name and renamed; ``manifest.json`` (size and sha256 of every
file) and then a ``COMPLETE`` marker are written last. Resume only considers folders with the
marker, verifies them against their manifest and falls back to the previous checkpoint when the
latest is damaged, so a run killed mid-save never resumes from half a checkpoint.

The run's other files in ``output_dir`` (``metrics.jsonl``, ``match_history.jsonl``, plots) are
cut back to the checkpoint on resume, and a fresh run refuses a used ``output_dir`` unless told
to overwrite it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

from autocurricula.files import atomic_write
from autocurricula.publish.export import export_peft, import_peft
from autocurricula.records import is_scripted

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
MANIFEST = "manifest.json"
RUN_FILES = ("metrics.jsonl", "match_history.jsonl", "transcripts.jsonl", "elo.png", "payoff.png")
_NAME = re.compile(r"^checkpoint-(\d+)$")
_PARTIAL = re.compile(r"^\.checkpoint-.*\.tmp$")


class CheckpointError(RuntimeError):
    """A checkpoint that fails verification or loading; the message names it."""


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True))


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / MARKER).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> dict:
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.name not in (MANIFEST, MARKER))
    return {f.relative_to(folder).as_posix(): {"size": f.stat().st_size, "sha256": _sha256(f)} for f in files}


def verify_checkpoint(path: str | Path) -> None:
    """Raise :class:`CheckpointError` (naming the checkpoint and the file) unless ``path`` is
    complete and every file matches its manifest. A checkpoint without a manifest cannot be
    verified, so it is refused too."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise CheckpointError(f"checkpoint {path} is not complete (no {MARKER} marker)")
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}, so its files cannot be verified (deleted or "
                              f"never written)")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        items = manifest["files"].items()
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST} ({exc})") from None
    for name, want in items:
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        if f.stat().st_size != want["size"]:
            raise CheckpointError(f"checkpoint {path}: {name} has {f.stat().st_size} bytes, the manifest says "
                                  f"{want['size']} (truncated or changed)")
        if _sha256(f) != want["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its sha256 in the manifest")


def resume_checkpoint(output_dir: str | Path, resume: bool | str | Path) -> Path | None:
    """The checkpoint to resume from: ``resume`` as a path (verified), or with ``True`` the newest
    one of ``output_dir`` that passes verification (damaged ones are skipped with a warning);
    ``None`` when there is none at all."""
    if resume is not True:
        verify_checkpoint(resume)
        return Path(resume)
    found = list_checkpoints(output_dir)
    for path in reversed(found):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as exc:
            log.warning("skipping a damaged checkpoint: %s; trying the one before", exc)
    if found:
        names = ", ".join(p.name for p in found)
        raise CheckpointError(f"every checkpoint in {output_dir} failed verification ({names}); see the warnings "
                              "above. Resume from a copy, or start afresh with overwrite_output_dir=True")
    return None


def _run_entries(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _NAME.match(p.name) or _PARTIAL.match(p.name) or p.name in RUN_FILES)


def prepare_output_dir(output_dir: str | Path, overwrite: bool) -> None:
    """Before a fresh run: refuse an ``output_dir`` that holds another run's checkpoints,
    ``metrics.jsonl`` or ``match_history.jsonl`` (they would mix, and ``save_total_limit`` would
    prune the new run's checkpoints), or delete those files when ``overwrite``."""
    root = Path(output_dir)
    found = _run_entries(root)
    if not any(p.name in ("metrics.jsonl", "match_history.jsonl") or _NAME.match(p.name) for p in found):
        return
    if not overwrite:
        names = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
        raise FileExistsError(f"output_dir {root} already holds a run ({names}). Set overwrite_output_dir=True "
                              "(--overwrite-output-dir) to delete it and start afresh, or resume_from_checkpoint=True "
                              "(--resume) to continue it; or choose another output_dir")
    log.warning("overwrite_output_dir: deleting the previous run in %s", root)
    for p in found:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def remove_partial_checkpoints(output_dir: str | Path) -> None:
    """Delete the ``.checkpoint-*.tmp`` folders of saves that a kill interrupted."""
    root = Path(output_dir)
    for p in root.iterdir() if root.is_dir() else []:
        if _PARTIAL.match(p.name) and p.is_dir():
            log.info("removing %s, left by an interrupted save", p)
            shutil.rmtree(p, ignore_errors=True)


def clear_run_files(output_dir: str | Path) -> None:
    """Delete metrics, match history and plots (a run that starts again from scratch)."""
    for name in RUN_FILES:
        (Path(output_dir) / name).unlink(missing_ok=True)


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the rows of ``metrics.jsonl`` up to ``step`` (those after it are replayed on resume)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            break  # a line cut by a kill: everything from here on is after the checkpoint anyway
    _atomic_text(path, "".join(x + "\n" for x in kept))


def _atomic_text(path: Path, text: str) -> None:
    atomic_write(path, text)  # a fresh temporary name: a planted metrics.jsonl.tmp link is never followed


def save_checkpoint(run, tag: int, state: dict, settings: dict) -> Path:
    """Write ``checkpoint-<tag>`` of ``run`` (a :class:`~autocurricula.loop.run.Run`) with the
    trainer's ``state`` and ``settings`` (JSON), and prune to ``save_total_limit``."""
    cfg = run.config
    root = Path(cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"checkpoint-{tag}"
    tmp = Path(tempfile.mkdtemp(prefix=f".checkpoint-{tag}.", suffix=".tmp", dir=root))
    try:
        for p in run.pool.players:
            if is_scripted(p):
                continue
            export_peft(run.engine.adapter_weights(p.id), tmp / "adapters" / p.id, run.model_name,
                        use_rslora=run.lora.use_rslora)
            opt = run.updater.optim.get(p.id)
            if opt is not None:
                opt.save(tmp / "optimizer" / p.id)
        _write_json(tmp / "players.json", run.pool.registry())
        _write_json(tmp / "state.json", state)
        _write_json(tmp / "rng.json", {"numpy": run.rng.bit_generator.state})
        _write_json(tmp / "config.json", settings)
        history = run.standings.history_path
        if history.exists():
            shutil.copyfile(history, tmp / "match_history.jsonl")
        _write_json(tmp / MANIFEST, {"files": _manifest(tmp)})
        (tmp / MARKER).write_text("ok\n")
        old = None
        if final.exists():  # same tag written again (e.g. a SIGTERM save): set aside, replace, delete
            # set aside in a fresh folder of its own (mkdtemp), never under a fixed name someone could plant
            old = Path(tempfile.mkdtemp(prefix=f".checkpoint-{tag}.", suffix=".old.tmp", dir=root))
            os.replace(final, old / "checkpoint")
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    limit = cfg.save_total_limit
    if limit:
        for old in list_checkpoints(root)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(run, path: str | Path, load_state: Callable[[dict], None], policies: dict | None = None,
                    opponents: list[dict] | None = None) -> None:
    """Restore ``run``'s pool, adapters, optimizers, RNG and match history (already set up on the
    same base model) from ``path``, and hand the trainer's saved state (``state.json``) to
    ``load_state``; a failure is a :class:`CheckpointError` naming the checkpoint. Cuts
    ``metrics.jsonl`` back to the checkpoint's step."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    try:
        state = _load(run, path, policies, opponents)
        load_state(state)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(exc).__name__}: {exc}") from exc
    truncate_metrics(Path(run.config.output_dir) / "metrics.jsonl", state["step"])


def _load(run, path: Path, policies: dict | None, opponents: list[dict] | None) -> dict:
    from autocurricula.training.optim import AdamWState  # mlx: the dashboard reads checkpoints without it

    registry = json.loads((path / "players.json").read_text())
    run.pool.restore(registry, policies, opponents)
    for p in run.pool.players:
        if is_scripted(p):
            continue
        run.engine.load_adapter(p.id, import_peft(path / "adapters" / p.id), version=p.version)
        opt = path / "optimizer" / p.id
        if opt.is_dir():
            run.updater.optim[p.id] = AdamWState.load(opt)
    state = json.loads((path / "state.json").read_text())
    rng = json.loads((path / "rng.json").read_text())
    run.rng.bit_generator.state = rng["numpy"]  # any other entry (e.g. "python") is ignored
    history = run.standings.history_path
    if (path / "match_history.jsonl").is_file():  # the games up to the checkpoint, none replayed after it
        shutil.copyfile(path / "match_history.jsonl", history)
    else:
        history.unlink(missing_ok=True)
    return state


def resume(run, resume_from_checkpoint, load_state: Callable[[dict], None], policies: dict | None = None,
           opponents: list[dict] | None = None) -> Path | None:
    """Restore ``run`` (and the trainer, through ``load_state``) from the latest good checkpoint, or
    the one named, when resuming; the checkpoint, or None for a fresh start. A run killed before its
    first checkpoint starts over."""
    output_dir = run.config.output_dir
    remove_partial_checkpoints(output_dir)
    if not resume_from_checkpoint:
        return None
    path = resume_checkpoint(output_dir, resume_from_checkpoint)
    if path is None:  # its games and metrics are not kept
        log.warning("no complete checkpoint in %s: starting from scratch", output_dir)
        clear_run_files(output_dir)
        return None
    opponents = opponents or []
    scripted = {o["id"]: o["policy"] for o in opponents if isinstance(o, Mapping) and "id" in o
                and is_scripted(o)}  # the constructor's opponents bring their callables back
    load_checkpoint(run, path, load_state, {**scripted, **(policies or {})}, opponents)
    return path
