"""What a trainer keeps and hands out beyond its loop: the state a checkpoint saves and restores,
the run's settings as JSON, and the players' adapters for peft, mlx-lm and the Hub.
:class:`~autocurricula.trainer.AutocurriculumTrainer` is a :class:`RunState`."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path

from autocurricula.game import Stateful


class RunState:
    """The checkpointed state and the publishing of a trainer (its loop lives in the trainer)."""

    def config_dict(self) -> dict:
        """The run's settings as JSON: trainer, model, config, credit, GRPO and LoRA."""
        out = {"trainer": type(self).__name__, "model": self.model_name, "config": asdict(self.config),
               "credit": self.credit.name, "grpo": asdict(self.grpo), "lora": asdict(self.lora_spec)}
        return json.loads(json.dumps(out, default=str))

    def state_dict(self) -> dict:
        """The run's position, standings, credit state, subclass state and game state (JSON-able)."""
        game = self._game.state_dict() if isinstance(self._game, Stateful) else None
        return {"epoch": self.current_epoch, "round": self.current_round, "step": self.step,
                "updater_steps": self.updater.steps, **self.standings.state_dict(), **self.credit.state_dict(),
                "extra": self.extra_state(), "game": game}

    def load_state_dict(self, state: dict) -> None:
        """Back to what :meth:`state_dict` returned (the adapters and optimizers load beside it)."""
        self.current_epoch, self.current_round, self.step = state["epoch"], state["round"], state["step"]
        self.updater.steps = state["updater_steps"]
        self.standings.load_state_dict(state)
        self.credit.load_state_dict(state)
        self.load_extra_state(state.get("extra") or {})
        if state.get("game") is not None and isinstance(self._game, Stateful):
            self._game.load_state_dict(state["game"])

    def extra_state(self) -> dict:
        """Subclass state to checkpoint (JSON-able)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    @property
    def history_path(self) -> Path:
        return self.standings.history_path

    @property
    def values(self):
        """Deprecated: the tabular critic is ``trainer.credit.values`` (credit "value" or "q")."""
        warnings.warn("trainer.values has moved: use trainer.credit.values", DeprecationWarning, stacklevel=2)
        return self.credit.values

    def reset_player(self, player: dict) -> None:
        """Back to the base model; its optimizer state is dropped."""
        self.pool.reset(player)
        self.updater.optim.pop(player["id"], None)

    def export(self, player_id: str, folder: str | Path, format: str = "peft") -> Path:
        """Write a trained player's adapter: ``"peft"`` (``PeftModel.from_pretrained``) or ``"mlx"``
        (``mlx_lm.load(base, adapter_path=folder)``). Returns the folder."""
        from autocurricula.export import export_player

        return export_player(self, player_id, folder, format)

    def push_to_hub(self, repo_id: str, *, private: bool = False, token: str | None = None,
                    revision: str | None = None, endpoint: str | None = None) -> str:
        """Every player as a peft adapter (a folder each, with its card) plus the league card,
        match history and plots, in one commit."""
        from autocurricula.hub import push_league

        return push_league(self, repo_id, private=private, token=token, revision=revision, endpoint=endpoint)

