"""What a run writes and reports, as callbacks of the trainer (in the manner of mlx-lm's
``TrainingCallback``): the metrics file, the experiment trackers, the plots and the transcripts.
A callback of your own subclasses :class:`TrainerCallback` and overrides the hooks it needs; a
plain function ``fn(trainer) -> dict`` given to ``train(callbacks=...)`` runs after every epoch
and its dict is logged."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from autocurricula.files import open_append
from autocurricula.views.plots import plot_elo, plot_payoff
from autocurricula.views.transcripts import FILENAME as TRANSCRIPTS, write_transcripts

log = logging.getLogger(__name__)


class TrainerCallback:
    """Hooks the trainer calls; each default does nothing."""

    def on_games(self, trainer, records: list) -> None:
        """After a round's games are rated (``records``: the round's ``GameRecord``s)."""

    def on_update(self, trainer, turns: list, result: dict) -> None:
        """After every update: the turns it trained on and the updater's result (loss, tokens...)."""

    def on_log(self, trainer, row: dict) -> None:
        """For every logged row of metrics (``row`` has ``step`` and ``epoch``)."""

    def on_epoch_end(self, trainer) -> dict | None:
        """After every epoch, before its checkpoint; a returned dict is logged."""

    def on_train_end(self, trainer) -> None:
        """When ``train`` returns or raises."""


class EpochFunction(TrainerCallback):
    """A plain ``fn(trainer) -> dict`` run after every epoch."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def on_epoch_end(self, trainer) -> dict | None:
        return self.fn(trainer)


class MetricsFile(TrainerCallback):
    """Every logged row as one JSON line of ``output_dir/metrics.jsonl``."""

    def on_log(self, trainer, row: dict) -> None:
        with open_append(Path(trainer.config.output_dir) / "metrics.jsonl") as fh:
            fh.write(json.dumps(row) + "\n")


class Trackers(TrainerCallback):
    """wandb / trackio, as ``config.report_to`` names them (see :mod:`autocurricula.views.tracking`)."""

    def __init__(self, trackers: list):
        self.trackers = trackers

    def on_log(self, trainer, row: dict) -> None:
        metrics = {k: v for k, v in row.items() if k not in ("step", "epoch")}
        for t in self.trackers:
            t.log(metrics, row["step"])

    def on_train_end(self, trainer) -> None:
        for t in self.trackers:
            t.finish()


class Plots(TrainerCallback):
    """``elo.png`` and ``payoff.png`` in ``output_dir`` after every epoch."""

    def on_epoch_end(self, trainer) -> None:
        out = Path(trainer.config.output_dir)
        try:
            plot_elo(trainer.standings.elo.history, out / "elo.png")
            ids = [p.id for p in trainer.players]
            plot_payoff(ids, trainer.standings.payoff.matrix(ids), out / "payoff.png")
        except Exception as exc:  # noqa: BLE001 - a plot must never end training
            log.warning("plotting failed: %s", exc)


class Transcripts(TrainerCallback):
    """The text of the last games of each pair, for ``autocurricula dashboard``."""

    def on_games(self, trainer, records: list) -> None:
        cfg = trainer.config
        write_transcripts(Path(cfg.output_dir) / TRANSCRIPTS, cfg.transcripts_per_pair, records, trainer.engine.decode,
                          trainer.current_epoch, trainer.current_round, fresh=trainer.step == 0)


class Progress(TrainerCallback):
    """A tqdm bar over each epoch's rounds, with its rate and time left, and the last round's mean
    reward and loss beside it (the trainer's own bar counts the epochs)."""

    def __init__(self):
        self.bar = None

    def on_log(self, trainer, row: dict) -> None:
        if "rollout/games" not in row:  # a round's row; the epoch's callbacks log their own
            return
        if self.bar is None:
            rounds = trainer.config.rounds
            self.bar = tqdm(total=rounds, initial=min(trainer.current_round, rounds), leave=False, unit="round",
                            desc=f"epoch {trainer.current_epoch} rounds")
        shown = {"reward": row.get("rollout/reward_mean"), "loss": row.get("train/loss"),
                 "tokens": row.get("update/tree_ratio")}  # the share of per-row work the update computed
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if isinstance(v, (int, float))}, refresh=False)
        self.bar.update(1)

    def on_epoch_end(self, trainer) -> None:
        self.close()

    def on_train_end(self, trainer) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_banner(output_dir, base_model) -> str:
    """The line to print when a run starts: where its files, its base model and its checkpoints
    go, and the command that opens the dashboard on them."""
    out = Path(output_dir).resolve()
    return (f"run: {out} (metrics.jsonl, match_history.jsonl; checkpoints in {out}/checkpoint-*) · base model: "
            f"{base_model} · dashboard: autocurricula dashboard {out}")


def callback_list(given) -> list[TrainerCallback]:
    """``train(callbacks=...)``'s entries as callbacks: objects as they are, functions wrapped."""
    out = []
    for cb in given or []:
        if isinstance(cb, TrainerCallback):
            out.append(cb)
        elif callable(cb):
            out.append(EpochFunction(cb))
        else:
            raise TypeError(f"a callback is a TrainerCallback or a function fn(trainer) -> dict, got "
                            f"{type(cb).__name__}")
    return out
