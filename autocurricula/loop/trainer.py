"""AutocurriculumTrainer: the league loop, readable top to bottom.

for each epoch:   entry() returns new players' specs; the pool adds them (new ones inherit their
                  parent's adapter; a snapshot spec freezes a copy)
  for each round: play    -- match() says who plays whom; every game runs concurrently in the arena
                  rate    -- the standings (Elo, payoff, match history) take the results
                  credit  -- the credit method turns rewards into advantages (plus extra turns)
                  update  -- one fused update trains every learner
                  league  -- on_round_end() may return more specs (snapshots), added in order
  checkpoint

With ``max_staleness >= 1`` the same loop looks one round ahead: round r+1's games are matched
and started as soon as round r's end, by the adapters from before round r's update.

Subclasses override ``entry(self)`` and ``match(self)`` (and optionally ``play`` and
``on_round_end``), reading ``self.players``, ``self.current_epoch``, ``self.current_round`` and
``self.rng``. Player specs are plain dicts; the pool makes each a :class:`~autocurricula.records.Player`
(``player_class``), and :func:`autocurricula.loop.pool.snapshot_spec` makes the spec of a frozen copy.
What ``train`` builds is one typed :class:`~autocurricula.loop.run.Run`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from autocurricula.loop import checkpoint as ckpt
from autocurricula.engine.blas import threads_during
from autocurricula.files import atomic_write
from autocurricula.arena.arena import Arena, run_async
from autocurricula.views.callbacks import MetricsFile, Plots, Progress, Trackers, Transcripts, callback_list, run_banner
from autocurricula.loop.config import AutocurriculumConfig, coerce_grpo_config, coerce_lora_spec
from autocurricula.credit import make_credit
from autocurricula.engine import RolloutEngine
from autocurricula.arena.game import Game, Stateful, as_play, check_tokenizer, game_facts, game_name
from autocurricula.credit.scale import RewardScale
from autocurricula.loop.pool import Pool
from autocurricula.records import Deal, GameRecord, Player, Turn, is_scripted
from autocurricula.arena.replay import Replayer
from autocurricula.loop.rounds import (ErrorGate, GameError, Played, SilenceWatch, check_advantages, drop_stale, fresh_turns,
                                  learner_roles, match_games, rewarded_turns, rollout_metrics, silent_learners,
                                  update_metrics)
from autocurricula.loop.signals import graceful_stop
from autocurricula.loop.standings import Leaderboard, Standings
from autocurricula.loop.run import Run
from autocurricula.publish.export import export_player
from autocurricula.publish.hub import check_hub_access, league_card, push_league
from autocurricula.publish.mixture import MIXTURE_FILE, mixture_document
from autocurricula.loop.startup import explain_pipeline, explain_schedule, load_engine, open_rollout
from autocurricula.views.tracking import make_trackers
from autocurricula.training import Updater
from autocurricula.training.optim import round_rates

__all__ = ["AutocurriculumTrainer", "GameError", "Leaderboard", "drop_stale", "run_async"]

log = logging.getLogger(__name__)
_SHADOWED: set[str] = set()  # metric names already warned about by _log (once per process)


class AutocurriculumTrainer:
    """Base trainer: override :meth:`entry` and :meth:`match` (see module docstring)."""

    config_class = AutocurriculumConfig
    # what the pool makes of each spec: a ``@dataclass`` subclass of Player declares more fields
    player_class: type[Player] = Player

    def __init__(self, ac_config: AutocurriculumConfig | None = None, opponents: list[dict] | None = None,
                 **overrides):
        # ``opponents``: fixed (e.g. scripted) player dicts that the built-in leagues add to their pool
        self.opponents = list(opponents or [])
        Player.check_class(self.player_class)  # a subclass's fields must be declared, before any run
        config = ac_config if ac_config is not None else self.config_class()
        self.config = replace(config, **overrides) if overrides else config
        self.current_epoch = self.current_round = self.step = 0
        self.run: Run | None = None  # what train() builds
        self.stop_requested: str | None = None  # why the run stops after this round (a signal's name)
        self.metrics_log: list[dict] = []
        self.rng = np.random.default_rng(self.config.seed)  # schedules, seats and adapter init

    # ------------------------------------------------------------------ the user's API
    @property
    def players(self) -> list[Player]:
        return list(self.run.pool.players) if self.run is not None else []

    # the run's parts that league rules, evaluators and users read
    @property
    def engine(self):
        return self.run.engine

    @property
    def pool(self) -> Pool:
        return self.run.pool

    @property
    def standings(self) -> Standings:
        return self.run.standings

    @property
    def credit(self):
        return self.run.credit

    @property
    def payoff(self):
        return self.run.standings.payoff

    def entry(self) -> list[dict]:
        """Specs of the players joining at ``self.current_epoch`` (default: one learner at epoch 0).
        The trainer adds them in order; ``snapshot_spec(player)`` is a frozen copy, and a spec may
        name an earlier spec of the same list as its ``parent`` (see ``Pool.add_all``)."""
        return [{"role": "player"}] if self.current_epoch == 0 else []

    def match(self) -> list[tuple]:
        """Tuples of players to play this round (each played ``config.matches`` times)."""
        raise NotImplementedError("override match(self) to return a list of tuples of players")

    def on_round_end(self, records: list[GameRecord]):
        """After each round's update: an iterable of specs of players to add now (e.g. snapshots), or
        None. The trainer adds each spec as it comes, so a generator's later decisions see the earlier
        ones in the pool. An override that extends a league's passes those on:
        ``yield from super().on_round_end(records)``."""
        return ()

    def learning_rate_of(self, player_id: str) -> float:
        """A learner's peak learning rate, before the schedule: ``GRPOConfig.learning_rate``; a league
        may set it per role."""
        return self.run.grpo.learning_rate

    def random_seats(self, player: Player, opponent: Player) -> tuple[Player, Player]:
        """``(player, opponent)`` or ``(opponent, player)``, by a fair coin from ``self.rng``."""
        return (player, opponent) if self.rng.random() < 0.5 else (opponent, player)

    def mirrored(self, player: Player, opponent: Player, key: str) -> list[Deal]:
        """A duplicate pair: ``player`` against ``opponent`` in both seat orders on one deal, so that
        what the deal hands one seat, each of them holds once (``key`` names the deal in the round)."""
        return [Deal((player, opponent), key), Deal((opponent, player), key)]

    def meta_opponent(self, candidates: list[Player]) -> Player:
        """One of ``candidates``, drawn by its weight in the meta-strategy over them (the standings'
        relative payoffs at their lower confidence bounds): the opponent of a best response to the
        mixture, as PSRO trains one."""
        weights = self.standings.meta_strategy([c.id for c in candidates])
        p = np.array([weights[c.id] for c in candidates], dtype=np.float64)
        return candidates[int(self.rng.choice(len(candidates), p=p / p.sum()))]

    @property
    def leaderboard(self) -> Leaderboard:
        return self.standings.leaderboard(self.players, self.meta_population(), deploy=self.deployable_mixture())

    @property
    def match_history(self):
        """Every game played: a ``datasets.Dataset`` (players, roles, rewards, epoch, versions)."""
        return self.standings.match_history()

    def train(self, model, play: Callable | Game | None = None, *, lora_config=None, grpo_config=None,
              resume_from_checkpoint: bool | str | None = None, policies: dict | None = None,
              callbacks: list | None = None, servers: str | list[str] | RolloutEngine | None = None,
              api_key: str | None = None):
        """Train the league. ``model``: Hub id, local folder, an :class:`~autocurricula.engine.Engine`, or
        an already loaded ``(model, tokenizer)`` pair from ``mlx_lm.load``.
        ``play``: the game's play function, or a :class:`~autocurricula.arena.game.Game` module or object
        (``autocurricula.games.tictactoe``); defaults to ``self.play``. ``lora_config``: a ``peft.LoraConfig`` (or ours);
        ``grpo_config``: a ``trl.GRPOConfig`` (or ours). ``resume_from_checkpoint``: True (latest
        complete checkpoint in ``output_dir`` that passes verification) or a path. ``policies``:
        ``{player id: callable}`` for scripted players on resume that are not in ``opponents``.
        ``callbacks``: :class:`~autocurricula.views.callbacks.TrainerCallback` objects, or functions
        ``fn(trainer) -> dict`` called after every epoch whose metrics are logged. ``servers``: URLs
        of running ``autocurricula serve`` servers of the same base model (``api_key`` for them), or a
        :class:`~autocurricula.engine.RolloutEngine` such as a ``RayEngine``: games are then played
        there, while updates run on this process's own copy of the weights and every changed adapter
        is pushed to them before the next round.

        A fresh run refuses an ``output_dir`` that holds another run unless ``overwrite_output_dir``.
        SIGINT and SIGTERM finish the round, save a checkpoint and return (a second one stops at once)."""
        if play is None and type(self).play is AutocurriculumTrainer.play:
            raise ValueError("train(model, play) needs a play function or a Game (or override play in the trainer)")
        play = as_play(play) if play is not None else self.play
        cfg = self.config
        if not resume_from_checkpoint:  # before anything slow: refuse (or clear) another run's files
            ckpt.prepare_output_dir(cfg.output_dir, cfg.overwrite_output_dir)
        if cfg.push_to_hub:  # fail now, not after all of training
            check_hub_access(cfg.hub_model_id, private=cfg.hub_private_repo)
        self.run = run = self._setup(model, lora_config, grpo_config, play, servers, api_key, callbacks)
        start, first_round = self._resume(resume_from_checkpoint, policies)
        if cfg.progress:  # where everything goes, before the first bar
            print(run_banner(cfg.output_dir, run.model_name), file=sys.stderr, flush=True)
        self.stop_requested = None
        try:
            with graceful_stop(self.request_stop), threads_during(cfg.threads):
                self._loop(play, start, first_round)
        finally:
            for cb in run.callbacks:
                cb.on_train_end(self)
            if run.plays_elsewhere and run.rollout is not servers:
                run.rollout.close()  # the servers' connections it opened; an engine object passed in stays open
        if cfg.push_to_hub and not self.stop_requested:
            self.push_to_hub(cfg.hub_model_id, private=cfg.hub_private_repo)
        return self

    def play(self, players, model, tokenizer):
        """The game, when ``train`` is given none: override it, or pass ``play`` to ``train``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the loop
    def _loop(self, play, start: int, first_round: int = 0) -> None:
        cfg = self.config
        for epoch in tqdm(range(start, cfg.epochs), desc="epochs", disable=not cfg.progress):
            self.current_epoch = epoch
            rounds = range(first_round if epoch == start else 0, cfg.rounds)
            if rounds.start == 0:  # a run resumed mid-epoch had its entries already
                self.run.pool.add_all(self.entry() or [], epoch)
            self._rounds(play, rounds)
            metrics = {}
            for cb in self.run.callbacks:
                metrics.update(cb.on_epoch_end(self) or {})
            if metrics:
                self._log(metrics)
            if cfg.save_strategy == "epoch" or self.stop_requested:
                ckpt.save_checkpoint(self.run, epoch, self.state_dict(), self.config_dict())
                self.run.engine.clear_prefix_cache()  # a resume from here starts with an empty cache too
            if self.stop_requested:
                log.warning("%s: saved checkpoint-%d (epoch %d, round %d) and stopped", self.stop_requested, epoch,
                            epoch, self.current_round)
                break

    def _rounds(self, play, rounds: range) -> None:
        """The rounds of one epoch. With ``max_staleness >= 1`` the next round's games are matched and
        started as soon as this round's end, before its update (in the background when they play
        elsewhere, see :meth:`Run.overlaps`); the look-ahead drains at the end of the epoch and on a stop
        signal, so checkpoints never hold half a round."""
        run, ahead = self.run, self.config.max_staleness > 0
        background = ThreadPoolExecutor(1, thread_name_prefix="autocurricula-rollout") \
            if ahead and run.overlaps() else None
        pending, clock = None, time.perf_counter()
        try:
            for rnd in rounds:
                self.current_round = rnd
                t_wait = time.perf_counter()
                played = (pending or self._start_play(play, rnd, None)).result()
                waited, pending = time.perf_counter() - t_wait, None
                self._results(played)
                if ahead and rnd + 1 < rounds.stop and not self.stop_requested:
                    pending = self._start_play(play, rnd + 1, background)
                rating = self._rate(played.records)
                turns, credit = self._credit(played.turns, played.records)
                metrics = {**played.metrics, **credit, **self._update(turns)}
                # the players on_round_end() adds (snapshots), each joining before the next is decided
                run.pool.add_all(self.on_round_end(played.records) or (), self.current_epoch)
                if not ahead:
                    run.sync_rollout()  # servers serve the new versions as soon as they exist
                now = time.perf_counter()
                metrics.update({"engine/occupancy": run.rollout.occupancy, "time/round_s": now - clock,
                                "time/rollout_s": played.seconds})
                if ahead:
                    metrics["time/rollout_wait_s"] = waited if background is not None else 0.0
                metrics.update(rating)
                clock = now
                self.step += 1
                if self.step % self.config.logging_steps == 0:
                    self._log(metrics)
                if self.stop_requested and pending is None:
                    break
        finally:
            if background is not None:  # after an error: the next round's games end before the servers close
                background.shutdown(wait=True)
        if ahead:
            run.sync_rollout()  # drained: the servers hold the epoch's last versions

    def _start_play(self, play, rnd: int, background: ThreadPoolExecutor | None) -> Future:
        """Push the changed adapters, match round ``rnd``'s games and play them: in ``background``
        when given, else now. A future of :class:`~autocurricula.loop.rounds.Played`."""
        run = self.run
        retried = run.sync_rollout()
        # match() reads the round it matches (a look-ahead matches the next one before this one's update)
        playing, self.current_round = self.current_round, rnd
        try:
            matched = self.match() or []
        finally:
            self.current_round = playing
        games = match_games(matched, play, run.game_name, self.current_epoch, rnd, self.config.matches,
                            run.credit.replays)

        def play_round() -> Played:
            t0 = time.perf_counter()
            records = run_async(run.arena.run(games, self.config.arena.max_concurrent_games,
                                              timeout_s=self.config.arena.game_timeout_s))
            return Played(records, time.perf_counter() - t0, retried)

        if background is not None:
            return background.submit(play_round)
        done = Future()
        done.set_result(play_round())
        return done

    def _results(self, played: Played) -> None:
        """A played round's turns (with rewards) and metrics; too many failed games stop here."""
        run = self.run
        failed_elsewhere = run.plays_elsewhere and any(r.error for r in played.records)
        self.errors.check(played.records, f"epoch {self.current_epoch}, round {self.current_round}",
                          run.rollout.health() if failed_elsewhere else None)
        played.turns = rewarded_turns(played.records)
        played.metrics = rollout_metrics(played.records, played.turns, self.players, run.arena.is_trainable)
        if played.retried_before is not None:  # requests a failed server left, served by another
            played.metrics["rollout/retried"] = run.rollout.stats["retried"] - played.retried_before

    def _rate(self, records: list[GameRecord]) -> dict:
        """The standings take the games and callbacks see them (transcripts); the players' Elo after them."""
        standings = self.run.standings
        standings.record(records, epoch=self.current_epoch, round_=self.current_round, step=self.step,
                         frozen=self.run.frozen_ids())
        for cb in self.run.callbacks:
            cb.on_games(self, records)
        return {f"rating/elo/{p.id}": standings.elo.rating(p.id) for p in self.players}

    def _credit(self, turns: list[Turn], records: list[GameRecord]) -> tuple[list[Turn], dict]:
        """Advantages for every turn, plus the credit method's extra turns for the learners. A method
        that replays games first sees the round's games and a replayer of them."""
        if not turns:
            return turns, {}
        run, credit = self.run, self.run.credit
        frozen = run.frozen_ids()
        run.scale.see(turns, records)  # credit sees each reward as a share of its seat's range
        with run.scale.normalised(turns, records):
            if credit.replays:
                arena = self.config.arena
                credit.see_round(records, Replayer(run.arena, run.game, run.game_name,
                                                   max_concurrent=arena.max_concurrent_games,
                                                   timeout_s=arena.game_timeout_s, scorer=run.engine,
                                                   rewards=run.scale.record_rewards))
            credit.assign(turns)
            turns = turns + credit.extra_turns([t for t in turns if t.player not in frozen])
        check_advantages(turns, credit.name)
        silent = silent_learners(turns, frozen)
        self.silence.see(silent)
        return turns, {**credit.metrics(), "credit/silent_learners": len(silent)}

    def _update(self, turns: list[Turn]) -> dict:
        """One fused update of every learner on its turns (frozen players' turns are skipped). With
        ``max_staleness`` k >= 1, turns more than k versions behind their player are dropped first."""
        if not turns:
            return {}
        run = self.run
        versions = {p.id: run.engine.adapter_info(p.id)["version"] for p in self.players
                    if not p.frozen and not is_scripted(p)} if self.config.max_staleness else {}
        turns, stale = fresh_turns(turns, versions, self.config.max_staleness)
        if not turns:
            return stale
        cfg = self.config  # the schedule runs over epochs x rounds; a resumed run continues it
        lr, lr_metric = round_rates(run.grpo, {t.player: self.learning_rate_of(t.player) for t in turns},
                                    self.current_epoch * cfg.rounds + self.current_round, cfg.epochs * cfg.rounds)
        t0 = time.perf_counter()
        out = run.updater.step(turns, lr=lr, skip=run.frozen_ids())
        for cb in run.callbacks:
            cb.on_update(self, turns, out)
        run.pool.refresh_versions()
        roles = learner_roles(self.players, run.arena.is_trainable)
        return {**update_metrics(out, time.perf_counter() - t0, lr_metric, roles), **stale}

    def _log(self, metrics: dict) -> None:
        """One row of metrics.jsonl: the trainer's own ``step`` and ``epoch``, then ``metrics``; a
        ``step`` or ``epoch`` in ``metrics`` (a callback's ``on_epoch_end`` dict) cannot replace them."""
        row = {"step": self.step, "epoch": self.current_epoch}
        shadowed = sorted(k for k in metrics if k in row)
        if shadowed and not _SHADOWED.issuperset(shadowed):
            _SHADOWED.update(shadowed)
            log.warning("metrics named %s were dropped: metrics.jsonl's %s are the trainer's own; rename them "
                        "(e.g. 'custom/step')", shadowed, " and ".join(row))
        row.update((k, v) for k, v in metrics.items() if k not in row)
        self.metrics_log.append(row)
        for cb in self.run.callbacks:
            cb.on_log(self, row)

    # ------------------------------------------------------------------ setup
    def _setup(self, model, lora_config, grpo_config, play, servers, api_key, callbacks) -> Run:
        cfg = self.config
        lora, grpo = coerce_lora_spec(lora_config), coerce_grpo_config(grpo_config)
        credit = make_credit(cfg.credit, grpo, cfg.seed)
        credit.check_game(play)  # e.g. moves credit needs the game's moves: say so before the model loads
        explain_schedule(grpo, cfg.epochs * cfg.rounds)
        engine, model_name = load_engine(model, cfg, lora)
        try:
            check_tokenizer(play, engine.tokenizer)  # e.g. a matrix game's words, one token each
        except Exception:
            if engine is not model:  # an engine this call opened
                engine.close()
            raise
        rollout, elsewhere = open_rollout(servers, engine, api_key)
        name = cfg.game_name or game_name(play)
        standings = Standings(cfg.ratings, cfg.output_dir, cfg.seed)
        self.errors, self.silence = ErrorGate(cfg.arena.max_game_error_rate, name), SilenceWatch()
        arena = Arena(rollout, seed=cfg.seed, temperature=grpo.temperature, max_tokens=cfg.max_tokens,
                      lockstep=cfg.arena.lockstep)
        updater = rollout.make_updater(engine, grpo) or Updater(engine, grpo)
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        shown = [Progress()] if cfg.progress else []
        run = Run(config=cfg, grpo=grpo, lora=lora, model_name=model_name, engine=engine, rollout=rollout,
                  plays_elsewhere=elsewhere, game=play, game_name=name,
                  pool=Pool(engine, lora, self.rng, self.player_class),
                  updater=updater, standings=standings, credit=credit, rng=self.rng, arena=arena,
                  callbacks=[*callback_list(callbacks), *shown, Plots(), Transcripts(), MetricsFile()],
                  scale=RewardScale(game_facts(play), name))
        self.run = run
        trackers = make_trackers(cfg.report_to, "autocurricula", cfg.run_name, self.config_dict(), cfg.output_dir)
        run.callbacks.append(Trackers(trackers))
        explain_pipeline(cfg.max_staleness, grpo.num_iterations, not elsewhere, credit.replays, credit.name)
        return run

    def _resume(self, resume_from_checkpoint, policies: dict | None) -> tuple[int, int]:
        """``(epoch, round)`` where training starts: after the checkpoint resumed from, else ``(0, 0)``."""
        path = ckpt.resume(self.run, resume_from_checkpoint, self.load_state_dict, policies, self.opponents)
        if path is None:
            return 0, 0
        start, first_round = self.current_epoch, self.current_round + 1
        if first_round >= self.config.rounds:  # saved at the end of its epoch
            start, first_round = start + 1, 0
        log.info("resumed from %s at epoch %d, round %d", path, start, first_round)
        return start, first_round

    def request_stop(self, reason: str = "stop requested") -> bool:
        """Finish the running round, save a checkpoint and return from ``train`` (what SIGINT and
        SIGTERM do). Whether a stop had been requested already."""
        already = self.stop_requested is not None
        self.stop_requested = self.stop_requested or reason
        return already

    # ------------------------------------------------------------------ state and publishing
    def config_dict(self) -> dict:
        """The run's settings as JSON: trainer, model, config, credit, GRPO and LoRA."""
        run = self.run
        out = {"trainer": type(self).__name__, "model": run.model_name, "config": asdict(self.config),
               "credit": run.credit.name, "grpo": asdict(run.grpo), "lora": asdict(run.lora)}
        return json.loads(json.dumps(out, default=str))

    def state_dict(self) -> dict:
        """The run's position, standings, credit state, subclass state and game state (JSON-able)."""
        run = self.run
        game = run.game.state_dict() if isinstance(run.game, Stateful) else None
        return {"epoch": self.current_epoch, "round": self.current_round, "step": self.step,
                "updater_steps": run.updater.steps, **run.standings.state_dict(), **run.credit.state_dict(),
                "reward_scale": run.scale.state_dict(), "extra": self.extra_state(), "game": game}

    def load_state_dict(self, state: dict) -> None:
        """Back to what :meth:`state_dict` returned (the adapters and optimizers load beside it)."""
        run = self.run
        self.current_epoch, self.current_round, self.step = state["epoch"], state["round"], state["step"]
        run.updater.steps = state["updater_steps"]
        run.standings.load_state_dict(state)
        run.credit.load_state_dict(state)
        run.scale.load_state_dict(state.get("reward_scale") or {})
        self.load_extra_state(state.get("extra") or {})
        if state.get("game") is not None and isinstance(run.game, Stateful):
            run.game.load_state_dict(state["game"])

    def extra_state(self) -> dict:
        """Subclass state to checkpoint (JSON-able)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def reset_player(self, player: Player) -> None:
        """Back to the base model; its optimizer state is dropped."""
        self.run.pool.reset(player)
        self.run.updater.optim.pop(player.id, None)

    def export(self, player_id: str, folder: str | Path, format: str = "peft") -> Path:
        """Write a trained player's adapter: ``"peft"`` (``PeftModel.from_pretrained``) or ``"mlx"``
        (``mlx_lm.load(base, adapter_path=folder)``). Returns the folder."""
        return export_player(self.run, player_id, folder, format)

    def meta_population(self) -> list[Player]:
        """The players of the league's meta-game, whose mixture the leaderboard and
        :meth:`deployable_mixture` give: every player; a league may narrow it (PSRO: its frozen population)."""
        return self.players

    def deployable_mixture(self) -> dict[str, float]:
        """The policy to deploy: ``{player id: weight}`` over the meta-game's players that have an adapter, the
        league's meta-strategy among them (relative payoffs, each entry at its lower confidence
        bound; :meth:`~autocurricula.loop.standings.Standings.meta_strategy`). Draw one adapter per game
        by these weights. Players with weight 0 are left out."""
        weights = self.standings.meta_strategy([p.id for p in self.meta_population() if not is_scripted(p)])
        return {pid: w for pid, w in weights.items() if w > 0}

    def export_mixture(self, folder: str | Path, format: str = "peft") -> Path:
        """Write the deployable mixture: each adapter with weight > 0 in ``folder/<player id>``
        (``format`` as :meth:`export`) and ``folder/mixture.json``, ``{"weights": {id: weight},
        "base_model": ...}``, written last, so a folder with it is complete. Returns the folder."""
        folder = Path(folder)
        weights = self.deployable_mixture()
        for pid in weights:
            self.export(pid, folder / pid, format)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / MIXTURE_FILE, mixture_document(weights, str(self.run.model_name), format,
                                                             self.run.game_name))
        return folder

    def push_to_hub(self, repo_id: str, *, private: bool = False, token: str | None = None,
                    revision: str | None = None, endpoint: str | None = None) -> str:
        """Every player as a peft adapter (a folder each, with its card) plus the league card,
        match history and plots, in one commit. The repo is a mixture folder (``mixture.json``
        beside the players' folders): the card's "Deployable mixture" section gives the
        ``autocurricula serve --mixture`` command that serves it."""
        board, mixture = self.leaderboard, self.deployable_mixture()
        card = league_card(self.run, board, mixture, self.config_dict(), type(self).__name__, self.current_epoch + 1,
                           repo_id=repo_id)
        return push_league(self.run, repo_id, board, card, mixture, private=private, token=token,
                           revision=revision, endpoint=endpoint)
