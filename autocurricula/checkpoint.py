"""Checkpoints: ``output_dir/checkpoint-<epoch>/``, JSON and safetensors only, written atomically.

Contents: every player's adapter (peft format), optimizer states, RNG states, ratings, payoff
matrix, Bradley-Terry records, RAE baselines, the pool registry, counters and the config. The
folder is built under a temporary name and renamed; a ``COMPLETE`` marker is written last, and
resume only considers folders that have it, so a run killed mid-save never resumes from half a
checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path


MARKER = "COMPLETE"
_NAME = re.compile(r"^checkpoint-(\d+)$")


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


def save_checkpoint(trainer, tag: int) -> Path:
    """Write ``checkpoint-<tag>`` for ``trainer`` and prune to ``save_total_limit``."""
    from autocurricula.export import export_peft

    cfg = trainer.config
    root = Path(cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"checkpoint-{tag}"
    tmp = Path(tempfile.mkdtemp(prefix=f".checkpoint-{tag}.", suffix=".tmp", dir=root))
    try:
        for p in trainer.players:
            if "policy" in p:
                continue
            export_peft(trainer.engine.adapter_weights(p["id"]), tmp / "adapters" / p["id"], trainer.model_name,
                        use_rslora=trainer.lora_spec.use_rslora)
            opt = trainer.updater.optim.get(p["id"])
            if opt is not None:
                opt.save(tmp / "optimizer" / p["id"])
        _write_json(tmp / "players.json", trainer._pool.registry())
        _write_json(tmp / "state.json", trainer.state_dict())
        _write_json(tmp / "rng.json", {"numpy": trainer.rng.bit_generator.state,
                                       "python": _py_state(trainer.py_rng.getstate())})
        _write_json(tmp / "config.json", trainer.config_dict())
        if trainer.history_path.exists():
            shutil.copyfile(trainer.history_path, tmp / "match_history.jsonl")
        (tmp / MARKER).write_text("ok\n")
        if final.exists():  # same tag written again (e.g. a SIGTERM save): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    limit = cfg.save_total_limit
    if limit:
        for old in list_checkpoints(root)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(trainer, path: str | Path, policies: dict | None = None) -> None:
    """Restore ``trainer`` (already set up on the same base model) from ``path``."""
    from autocurricula.export import import_peft
    from autocurricula.training.optim import AdamWState

    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    registry = json.loads((path / "players.json").read_text())
    trainer._pool.restore(registry, policies)
    for p in trainer.players:
        if "policy" in p:
            continue
        trainer.engine.load_adapter(p["id"], import_peft(path / "adapters" / p["id"]), version=p.get("version"))
        opt = path / "optimizer" / p["id"]
        if opt.is_dir():
            trainer.updater.optim[p["id"]] = AdamWState.load(opt)
    trainer.load_state_dict(json.loads((path / "state.json").read_text()))
    rng = json.loads((path / "rng.json").read_text())
    trainer.rng.bit_generator.state = rng["numpy"]
    trainer.py_rng.setstate(_py_state_back(rng["python"]))
    if (path / "match_history.jsonl").is_file():
        shutil.copyfile(path / "match_history.jsonl", trainer.history_path)


def _py_state(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_state_back(state):
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


