"""Files the package replaces whole go through one helper that no planted link can redirect, and
the trainer's own step and epoch head every metrics row (issue 68, items 4 and 5)."""

import json
import logging
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from autocurricula.files import atomic_write, open_append

pytestmark = pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")


def plant(folder: Path, name: str, target: Path) -> Path:
    """A link named ``name`` in ``folder`` to ``target``, the attacker's file."""
    target.write_text("KEEP")
    link = folder / name
    link.symlink_to(target)
    return link


def test_atomic_write_never_writes_through_a_planted_link(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    plant(out, "data.json.tmp", victim)  # the old fixed temporary name
    plant(out, "data.json.part", tmp_path / "victim2.txt")
    atomic_write(out / "data.json", '{"a": 1}')
    assert victim.read_text() == "KEEP" and (tmp_path / "victim2.txt").read_text() == "KEEP"
    assert not (out / "data.json").is_symlink() and json.loads((out / "data.json").read_text()) == {"a": 1}
    assert stat.S_IMODE((out / "data.json").stat().st_mode) == 0o644
    # a link at the target itself is replaced, not written through
    plant(out, "other.bin", tmp_path / "victim3.txt")
    atomic_write(out / "other.bin", b"\x00\x01", mode=0o600)
    assert (tmp_path / "victim3.txt").read_text() == "KEEP" and not (out / "other.bin").is_symlink()
    assert (out / "other.bin").read_bytes() == b"\x00\x01" and stat.S_IMODE((out / "other.bin").stat().st_mode) == 0o600
    leftovers = sorted(p.name for p in out.iterdir())
    assert leftovers == ["data.json", "data.json.part", "data.json.tmp", "other.bin"]  # no temporary file left


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def broken(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_open_append_refuses_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    link = plant(tmp_path, "metrics.jsonl", victim)
    with pytest.raises(OSError):
        open_append(link)
    assert victim.read_text() == "KEEP"
    with open_append(tmp_path / "fresh.jsonl") as fh:
        fh.write("a\n")
    with open_append(tmp_path / "fresh.jsonl") as fh:
        fh.write("b\n")
    assert (tmp_path / "fresh.jsonl").read_text() == "a\nb\n"


def test_export_mixture_replaces_mixture_json_without_following_a_planted_link(tmp_path):
    from autocurricula.loop.trainer import AutocurriculumTrainer

    folder, victim = tmp_path / "deploy", tmp_path / "victim.json"
    folder.mkdir()
    plant(folder, "mixture.json.tmp", victim)
    trainer = SimpleNamespace(deployable_mixture=lambda: {}, export=None,
                              run=SimpleNamespace(model_name="base-model", game_name="digits"))
    assert AutocurriculumTrainer.export_mixture(trainer, folder) == folder
    assert victim.read_text() == "KEEP"
    mixture = folder / "mixture.json"
    assert not mixture.is_symlink() and json.loads(mixture.read_text()) == {
        "weights": {}, "base_model": "base-model", "format": "peft", "game": "digits"}


def test_truncated_metrics_and_transcripts_are_replaced_not_written_through_links(tmp_path):
    from autocurricula.loop.checkpoint import truncate_metrics
    from autocurricula.views.transcripts import update_transcripts

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(5)))
    plant(tmp_path, "metrics.jsonl.tmp", tmp_path / "victim.txt")
    truncate_metrics(metrics, 2)
    assert (tmp_path / "victim.txt").read_text() == "KEEP"
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [0, 1, 2]
    update_transcripts(tmp_path / "transcripts.jsonl", [{"game_id": "g", "players": ["a", "b"]}], 2)
    assert stat.S_IMODE((tmp_path / "transcripts.jsonl").stat().st_mode) == 0o644


def test_the_plots_are_replaced_not_written_through_links(tmp_path):
    from autocurricula.views.plots import plot_elo

    plant(tmp_path, "elo.png", tmp_path / "victim.txt")
    plot_elo({"a": [(0, 1000.0), (1, 1010.0)]}, tmp_path / "elo.png")
    assert (tmp_path / "victim.txt").read_text() == "KEEP"
    assert not (tmp_path / "elo.png").is_symlink() and (tmp_path / "elo.png").read_bytes()[:4] == b"\x89PNG"


def test_every_temp_then_rename_in_the_package_uses_the_helper():
    """No fixed temporary name next to its target: ``.tmp`` / ``.part`` files are made by mkstemp
    (atomic_write) or live in a folder made by mkdtemp."""
    root = Path(__file__).resolve().parent.parent / "autocurricula"
    found = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ('with_suffix(".tmp")' in line or 'name + ".tmp"' in line or 'name + ".part"' in line
                    or '.json.tmp"' in line):
                found.append(f"{path.relative_to(root.parent)}:{n}: {line.strip()}")
    assert not found, "fixed temporary names (use autocurricula.files.atomic_write):\n" + "\n".join(found)


def test_a_callbacks_step_or_epoch_cannot_replace_the_trainers(caplog):
    from autocurricula.loop import trainer as trainer_module
    from autocurricula.loop.trainer import AutocurriculumTrainer

    seen = []
    cb = SimpleNamespace(on_log=lambda trainer, row: seen.append(row))
    trainer = SimpleNamespace(step=7, current_epoch=2, metrics_log=[], run=SimpleNamespace(callbacks=[cb]))
    trainer_module._SHADOWED.clear()
    with caplog.at_level(logging.WARNING, logger="autocurricula.loop.trainer"):
        AutocurriculumTrainer._log(trainer, {"step": "<img src=x onerror=alert(1)>", "epoch": "x", "eval/score": 0.5})
        AutocurriculumTrainer._log(trainer, {"step": 99, "eval/score": 0.6})
    assert trainer.metrics_log[0] == {"step": 7, "epoch": 2, "eval/score": 0.5}
    assert trainer.metrics_log[1] == {"step": 7, "epoch": 2, "eval/score": 0.6}
    assert seen == trainer.metrics_log and list(seen[0]) == ["step", "epoch", "eval/score"]
    warned = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warned) == 1 and "['epoch', 'step']" in warned[0]  # once, naming them


def test_a_checkpoint_saved_again_under_its_tag_never_uses_a_planted_name(tmp_path):
    import numpy as np

    from autocurricula.loop.checkpoint import list_checkpoints, save_checkpoint

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("KEEP")
    (out / ".checkpoint-0.old.tmp").symlink_to(elsewhere, target_is_directory=True)  # the old fixed name
    run = SimpleNamespace(config=SimpleNamespace(output_dir=str(out), save_total_limit=None),
                          pool=SimpleNamespace(players=[], registry=lambda: []), rng=np.random.default_rng(0),
                          standings=SimpleNamespace(history_path=out / "match_history.jsonl"),
                          updater=SimpleNamespace(optim={}))
    save_checkpoint(run, 0, {"step": 1}, {})
    save_checkpoint(run, 0, {"step": 2}, {})  # the same tag again (a SIGTERM save): set aside, replaced
    assert list_checkpoints(out) == [out / "checkpoint-0"]
    assert json.loads((out / "checkpoint-0" / "state.json").read_text()) == {"step": 2}
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in out.iterdir()) == [".checkpoint-0.old.tmp", "checkpoint-0"]  # nothing left over
