"""What a trainer keeps and hands out beyond its loop: the state a checkpoint saves and restores,
the run's settings as JSON, and the players' adapters for peft, mlx-lm and the Hub.
:class:`~autocurricula.loop.trainer.AutocurriculumTrainer` is a :class:`RunState`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from autocurricula.arena.game import Stateful


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

    def reset_player(self, player: dict) -> None:
        """Back to the base model; its optimizer state is dropped."""
        self.pool.reset(player)
        self.updater.optim.pop(player["id"], None)

    def export(self, player_id: str, folder: str | Path, format: str = "peft") -> Path:
        """Write a trained player's adapter: ``"peft"`` (``PeftModel.from_pretrained``) or ``"mlx"``
        (``mlx_lm.load(base, adapter_path=folder)``). Returns the folder."""
        from autocurricula.publish.export import export_player

        return export_player(self, player_id, folder, format)

    def meta_population(self) -> list[dict]:
        """The players of the league's meta-game, whose mixture the leaderboard and
        :meth:`deployable_mixture` give: every player; a league may narrow it (PSRO: its frozen population)."""
        return self.players

    def deployable_mixture(self) -> dict[str, float]:
        """The policy to deploy: ``{player id: weight}`` over the meta-game's players that have an adapter, the
        league's meta-strategy among them (relative payoffs, each entry at its lower confidence
        bound; :meth:`~autocurricula.loop.standings.Standings.meta_strategy`). Draw one adapter per game
        by these weights. Players with weight 0 are left out."""
        from autocurricula.records import is_scripted

        weights = self.standings.meta_strategy([p["id"] for p in self.meta_population() if not is_scripted(p)])
        return {pid: w for pid, w in weights.items() if w > 0}

    def export_mixture(self, folder: str | Path, format: str = "peft") -> Path:
        """Write the deployable mixture: each adapter with weight > 0 in ``folder/<player id>``
        (``format`` as :meth:`export`) and ``folder/mixture.json``, ``{"weights": {id: weight},
        "base_model": ...}``, written last, so a folder with it is complete. Returns the folder."""
        folder = Path(folder)
        weights = self.deployable_mixture()
        for pid in weights:
            self.export(pid, folder / pid, format)
        tmp = folder / "mixture.json.tmp"
        tmp.write_text(json.dumps({"weights": weights, "base_model": str(self.model_name), "format": format,
                                   "game": self.game_name}, indent=2))
        os.replace(tmp, folder / "mixture.json")
        return folder

    def push_to_hub(self, repo_id: str, *, private: bool = False, token: str | None = None,
                    revision: str | None = None, endpoint: str | None = None) -> str:
        """Every player as a peft adapter (a folder each, with its card) plus the league card,
        match history and plots, in one commit."""
        from autocurricula.publish.hub import push_league

        return push_league(self, repo_id, private=private, token=token, revision=revision, endpoint=endpoint)

