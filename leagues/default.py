"""The default configuration, chosen from what a game declares.

``autocurricula.train(model, game)`` names no league and no credit: :func:`choose` reads the
game's facts (:func:`autocurricula.arena.game.game_facts`) and picks the configuration measured
for games of that kind (docs/leagues.md, "The default, chosen from a game's facts"), prints one
line naming it and why, and trains:

=====================================================  ==============================================
facts                                                  configuration
=====================================================  ==============================================
2 players, zero- or constant-sum, perfect information, the tic-tac-toe league: ``LeagueTrainer`` with
sequential, no chance                                  a main agent, a main and a league exploiter,
                                                       the game's random player as an anchor for half
                                                       of the main agent's games,
                                                       ``QCredit(target_coef=1, backup="minimax")``,
                                                       0.2 x the model's rate, decayed over the last
                                                       quarter, 4 optimizer steps a round, LoRA on
                                                       every linear; 12 epochs x 30 rounds
2 players, zero- or constant-sum, anything else        mirror self-play: ``SelfPlayTrainer`` against
(hidden information, simultaneous moves, chance,       its current policy only, ``MirrorCredit()``,
unknown), the game lists its moves                     0.3 x the model's rate, 4 optimizer steps a
                                                       round, the average of the last third of the
                                                       epochs' iterates deployed; 12 epochs x 8
                                                       rounds of 128 games
any other game (more players, general-sum, identical   self-play with the framework's credit
payoffs, no list of moves)                             (``"rae"``): nothing was measured for it
=====================================================  ==============================================

Rates are relative to the model's own (:func:`model_rate`): 1e-2 for the built-in tiny models (the
rate the examples give plain GRPO on them), ``GRPOConfig``'s 1e-4 for any other model. On a tiny
model the game's format warm-up runs first (:func:`autocurricula.loop.bases.format_warmup`); a real
model is trained as it is unless ``warmup`` asks for one.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from autocurricula.arena.game import game_facts, game_moves, game_name
from autocurricula.credit import MirrorCredit, QCredit
from autocurricula.leagues.league import LeagueConfig, LeagueTrainer
from autocurricula.leagues.selfplay import SelfPlayConfig, SelfPlayTrainer
from autocurricula.loop.bases import format_warmup, is_tiny
from autocurricula.records import GameFacts
from autocurricula.training.config import GRPOConfig

__all__ = ["Recipe", "TINY_RATE", "choose", "model_rate", "train"]

TINY_RATE = 1e-2  # plain GRPO's rate for the built-in tiny models (the examples')


@dataclass(frozen=True)
class Recipe:
    """One measured configuration: the trainer class, its config fields (``rules``, ``credit``...), the
    learning rate as a share of the model's own, the other GRPO settings, LoRA, budget and warm-up,
    and why the game's facts chose it (``reason``) and where it was measured (``measured``)."""

    name: str
    reason: str
    trainer: type
    config: dict = field(default_factory=dict)
    rate_share: float = 1.0
    grpo: dict = field(default_factory=dict)
    lora: dict | None = None
    epochs: int = 12
    rounds: int = 8
    warmup_steps: int = 200
    warmup_rate: float = 2e-3
    anchor_random: bool = False  # the game's random player joins as a fixed opponent
    measured: str = ""

    def rules(self, epochs: int, rounds: int) -> dict:
        """The league's own settings at this budget (some scale with the epochs or the rounds)."""
        rules = dict(self.config.get("rules", {}))
        if self.trainer is SelfPlayTrainer and rules.get("past_share") == 0.0:
            rules["average_last"] = max(1, epochs // 3)  # the last third of the epochs' iterates
        if self.trainer is LeagueTrainer:
            rules.update(snapshot_min_rounds=max(4, rounds // 2), snapshot_max_rounds=max(8, rounds))
        return rules

    def line(self, game: str, facts: GameFacts, rate: float, epochs: int, rounds: int, warmup: int,
             rules: dict | None = None) -> str:
        """The one line ``train`` prints: the choice, its settings and why (``rules``: the league's
        settings as run, default the recipe's at this budget)."""
        rules = self.rules(epochs, rounds) if rules is None else rules
        own = ", ".join(f"{k}={v}" for k, v in rules.items())
        credit = self.config.get("credit", "rae")
        credit = credit if isinstance(credit, str) else _credit_text(credit)
        schedule = self.grpo.get("lr_scheduler_type", "constant")
        decay = f", {schedule} (last {self.grpo['lr_decay_ratio']:g} decayed)" if schedule != "constant" else ""
        steps = self.grpo.get("steps_per_generation", 1)
        return (f"autocurricula: {self.name} for {game} ({facts.describe()}): {self.reason}. "
                f"{self.trainer.__name__}({own}), credit={credit}, learning rate {self.rate_share:g} x {rate / self.rate_share:g}"
                f" = {rate:.3g}{decay}, {steps} optimizer step{'s' if steps != 1 else ''} a round, {epochs} epochs x "
                f"{rounds} rounds, "
                + (f"format warm-up {warmup} steps" if warmup else "no warm-up")
                + (f"; measured: {self.measured}" if self.measured else ""))


def _credit_text(credit) -> str:
    from dataclasses import fields, is_dataclass

    if not is_dataclass(credit):
        return type(credit).__name__
    default = type(credit)()
    changed = [f"{f.name}={getattr(credit, f.name)!r}" for f in fields(credit) if f.init
               and getattr(credit, f.name) != getattr(default, f.name)]
    return f"{type(credit).__name__}({', '.join(changed)})"


TICTACTOE_LEAGUE = Recipe(
    name="the tic-tac-toe league",
    reason="perfect information, sequential moves and no chance: a position's prompt is the whole state, so a move "
           "can be valued by its worst known outcome, and the equilibrium is pure",
    trainer=LeagueTrainer,
    config={"credit": QCredit(target_coef=1.0, backup="minimax"), "max_tokens": 2,
            "rules": {"games_per_learner": 256, "exploiter_games": 32, "main_agents": 1, "main_exploiters": 1,
                      "league_exploiters": 1, "anchor_share": 0.5},
            "arena": {"max_concurrent_games": 128}, "ratings": {"bt_bootstrap": 50}},
    rate_share=0.2,
    grpo={"steps_per_generation": 4, "lr_scheduler_type": "warmup_stable_decay", "lr_decay_ratio": 0.25,
          "beta": 0.0, "loss_type": "grpo"},
    lora={"r": 8, "lora_alpha": 16, "target_modules": "all-linear"},
    epochs=12, rounds=30, warmup_steps=400, warmup_rate=1e-3, anchor_random=True,
    measured="tic-tac-toe unbeaten by the exact best response as X and O, seeds 0-2 (docs/results.md)")

MIRROR_SELFPLAY = Recipe(
    name="mirror self-play",
    reason="hidden information, simultaneous moves or chance: the equilibrium may be mixed, and self-play against "
           "its current policy with small mirror-descent steps converges to it, where a best-response league cycles",
    trainer=SelfPlayTrainer,
    config={"credit": MirrorCredit(), "rules": {"games_per_round": 128, "past_share": 0.0}},
    rate_share=0.3,
    grpo={"steps_per_generation": 4},
    epochs=12, rounds=8, warmup_steps=200, warmup_rate=2e-3,
    measured="Kuhn poker 0.037-0.042 chips per hand (seeds 0-4), random matrix games median 0.025-0.027 "
             "(docs/results.md#mirror-descent-self-play)")

PLAIN_SELFPLAY = Recipe(
    name="plain self-play",
    reason="no configuration was measured for these facts (more than two players, general-sum or common payoffs, "
           "or no list of moves to branch on)",
    trainer=SelfPlayTrainer,
    config={"credit": "rae", "rules": {"games_per_round": 128}},
    rate_share=1.0, epochs=12, rounds=8, warmup_steps=200, warmup_rate=2e-3)


def choose(game) -> Recipe:
    """The recipe for ``game`` (a Game module or object, or a play callable), from its facts
    (:func:`~autocurricula.arena.game.game_facts`) and whether it lists its moves."""
    facts = game_facts(game)
    if facts.num_players not in (None, 2):
        raise ValueError(f"autocurricula.train chooses among two-player configurations, and this game has "
                         f"{facts.num_players} seats: pick a trainer whose match() fills them (docs/leagues.md, "
                         f"'Your own schedule')")
    if not (facts.num_players == 2 and facts.zero_sum):
        why = "payoffs not declared zero- or constant-sum" if not facts.zero_sum else "any number of players"
        return replace(PLAIN_SELFPLAY, reason=f"{why}: no configuration was measured for such games")
    if facts.information == "perfect" and facts.dynamics == "sequential" and facts.chance is False:
        return TICTACTOE_LEAGUE
    if game_moves(game) is None:
        return replace(PLAIN_SELFPLAY, reason="a two-player zero-sum game with a mixed equilibrium calls for mirror "
                       "self-play, but the game lists no moves (moves(prompt)) for its per-move targets")
    if facts.information is None or facts.dynamics is None or facts.chance is None:
        unknown = [n for n in ("information", "dynamics", "chance") if getattr(facts, n) is None]
        return replace(MIRROR_SELFPLAY, reason=f"{', '.join(unknown)} not declared, so the equilibrium may be mixed: "
                       + MIRROR_SELFPLAY.reason.split(": ", 1)[1])
    return MIRROR_SELFPLAY


def model_rate(model) -> float:
    """The learning rate plain GRPO would use for ``model``: 1e-2 for a built-in tiny model (or a
    warm-up of one), ``GRPOConfig``'s default (1e-4) for anything else."""
    return TINY_RATE if is_tiny(model) else GRPOConfig().learning_rate


def train(model, game, *, epochs: int | None = None, rounds: int | None = None, seed: int = 0,
          output_dir: str | Path = "autocurricula-output", warmup: bool | int | str = "auto",
          learning_rate: float | None = None, callbacks: list | None = None, progress: bool = True,
          printer: Callable[[str], Any] | None = None, recipe: Recipe | None = None,
          grpo_config: dict | None = None, lora_config: dict | None = None, servers=None, api_key: str | None = None,
          resume_from_checkpoint: bool | str | None = None, **config):
    """Train ``model`` on ``game`` with the configuration its facts choose (:func:`choose`, or
    ``recipe``), printing one line that names it and why; returns the trained trainer.

    ``model``: a folder or Hub id. ``epochs`` / ``rounds``: the budget (default: the recipe's).
    ``warmup``: "auto" (the format warm-up on a tiny model only), True / False, or a number of steps.
    ``learning_rate``: the model's own rate (default :func:`model_rate`), which the recipe scales.
    ``config``: more fields of the trainer's config (``overwrite_output_dir``, ``save_strategy``...);
    a ``rules`` dict updates the recipe's. ``printer``: where the line goes (default: stdout).
    ``grpo_config`` / ``lora_config``: mappings of GRPO / LoRA settings over the recipe's (the rate is set
    by ``learning_rate``, which the recipe scales). ``servers``, ``api_key`` and ``resume_from_checkpoint``
    go to the trainer's ``train``."""
    recipe = recipe or choose(game)
    for what, given in (("grpo_config", grpo_config), ("lora_config", lora_config)):
        if given is not None and not isinstance(given, dict):
            raise TypeError(f"{what} must be a mapping of settings over the recipe's, got {type(given).__name__}")
    if grpo_config and "learning_rate" in grpo_config:
        raise ValueError("the default's rate is its share of the model's own rate: pass learning_rate= (the model's "
                         "rate, which the recipe scales) instead of grpo_config['learning_rate'], or pick a league")
    facts = game_facts(game)
    epochs = recipe.epochs if epochs is None else int(epochs)
    rounds = recipe.rounds if rounds is None else int(rounds)
    base_rate = model_rate(model) if learning_rate is None else float(learning_rate)
    if not (math.isfinite(base_rate) and base_rate > 0):
        raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate!r}")
    steps = _warmup_steps(warmup, model, recipe)
    name = getattr(game, "name", None) or game_name(getattr(game, "play", game))
    rate = recipe.rate_share * base_rate
    rules = {**recipe.rules(epochs, rounds), **config.pop("rules", {})}
    (printer or (lambda line: print(line, flush=True)))(recipe.line(name, facts, rate, epochs, rounds, steps, rules))
    if steps:
        model = format_warmup(model, game, steps=steps, learning_rate=recipe.warmup_rate, seed=seed,
                              progress=progress)
    fields = {**{k: v for k, v in recipe.config.items() if k != "rules"}, **config}
    cfg = recipe.trainer.config_class(epochs=epochs, rounds=rounds, seed=seed, output_dir=str(output_dir),
                                      progress=progress, rules=rules, **fields)
    opponents = []
    if recipe.anchor_random:
        opponents = [{"id": "random", "role": "random", "policy": _random_policy(game)}]
    trainer = recipe.trainer(cfg, opponents=opponents)
    trainer.recipe = recipe
    grpo = {**recipe.grpo, **(grpo_config or {}), "learning_rate": rate}
    lora = recipe.lora if lora_config is None else lora_config
    trainer.train(str(model), game, lora_config=lora, grpo_config=grpo, callbacks=callbacks, servers=servers,
                  api_key=api_key, resume_from_checkpoint=resume_from_checkpoint)
    return trainer


def _warmup_steps(warmup, model, recipe: Recipe) -> int:
    if warmup == "auto":
        return recipe.warmup_steps if is_tiny(model) else 0
    if isinstance(warmup, bool):
        return recipe.warmup_steps if warmup else 0
    if isinstance(warmup, int) and warmup >= 0:
        return warmup
    raise ValueError(f"warmup must be 'auto', True, False or a number of steps >= 0, got {warmup!r}")


def _random_policy(game):
    policy = getattr(game, "random_policy", None)
    if policy is None:
        module = sys.modules.get(getattr(game, "__module__", "") or "")
        policy = getattr(module, "random_policy", None)
    if policy is None:
        raise ValueError(f"{game!r} declares no random_policy, which the league's anchor plays")
    return policy
