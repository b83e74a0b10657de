"""AutocurriculumTrainer: the league loop, readable top to bottom.

for each epoch:   entry() returns new players' specs; the pool adds them (new ones inherit their
                  parent's adapter; a snapshot spec freezes a copy)
  for each round: rollout  -- match() says who plays whom; every game runs concurrently in the arena
                  rate     -- Elo, the payoff matrix and the match history take the results
                  credit   -- the credit method turns rewards into advantages (plus extra turns)
                  update   -- one fused update trains every learner
                  league   -- on_round_end() may return more specs (snapshots), added in order
  checkpoint

With ``max_staleness >= 1`` the rounds of an epoch overlap: round r+1's games are played while
round r is rated, credited and updated (see ``_pipelined_rounds``).

Subclasses override ``entry(self)`` and ``match(self)`` (and optionally ``play`` and
``on_round_end``), reading ``self.players``, ``self.current_epoch`` and ``self.rng``. Player specs
are plain dicts; :func:`autocurricula.pool.snapshot_spec` makes the spec of a frozen copy.

Compatibility layer: the API of the original autocurricula keeps working unchanged --
``ac_config`` (the constructor argument and attribute, same object as ``config``),
``entry``/``match`` returning lists, and in ``play`` the seed style ``set_player(model, player)``
followed by a synchronous ``model.generate(**inputs)`` (``autocurricula.arena``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np

from autocurricula.arena import Arena, run_async
from autocurricula.config import AutocurriculumConfig, coerce_grpo_config, coerce_lora_spec
from autocurricula.credit import LEGACY_CREDIT_FIELDS, Credit, credit_from_fields, make_credit
from autocurricula.records import GameRecord, Turn, is_scripted
from autocurricula.rating import (Elo, Payoff, bradley_terry_bootstrap, format_leaderboard, leaderboard_rows,
                                  nash_weights)

log = logging.getLogger(__name__)


class GameError(RuntimeError):
    """Too many games of a round failed (see ``max_game_error_rate``); the message holds a traceback."""


class Leaderboard:
    """Printable Elo table, best first; ``rows`` / ``to_dicts()`` for programs."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def to_dicts(self) -> list[dict]:
        return [dict(r) for r in self.rows]

    def __str__(self) -> str:
        return format_leaderboard(self.rows)

    __repr__ = __str__

    def __getitem__(self, i):
        return self.rows[i]

    def __len__(self):
        return len(self.rows)


def drop_stale(turns: list[Turn], versions: dict[str, int], max_staleness: int) -> tuple[list[Turn], int, int]:
    """``(kept, dropped, worst)``: the turns sampled at most ``max_staleness`` adapter versions behind
    their player's current version (``versions``), how many were dropped, and the largest lag seen.
    Turns without a version, of players not in ``versions``, or not sampled (``Turn.target``) are kept."""
    kept, dropped, worst = [], 0, 0
    for t in turns:
        now = versions.get(t.player)
        lag = now - t.version if now is not None and t.version is not None and not t.target else 0
        worst = max(worst, lag)
        if lag > max_staleness:
            dropped += 1
        else:
            kept.append(t)
    return kept, dropped, worst


class AutocurriculumTrainer:
    """Base trainer: override :meth:`entry` and :meth:`match` (see module docstring)."""

    config_class = AutocurriculumConfig

    def __init__(self, ac_config: AutocurriculumConfig | None = None, opponents: list[dict] | None = None,
                 **overrides):
        # ``opponents``: fixed (e.g. scripted) player dicts that the built-in leagues add to their pool
        self.opponents = list(opponents or [])
        config = ac_config if ac_config is not None else self.config_class()
        self.config = replace(config, **overrides) if overrides else config
        self.ac_config = self.config  # the original autocurricula's name (compatibility layer)
        self.current_epoch = 0
        self.current_round = 0
        self.engine = None
        self.rollout = None  # where games are played: the engine, or running servers (train(servers=...))
        self._pool = None
        self._stop_requested = False
        self._errors_seen: set[str] = set()
        self.metrics_log: list[dict] = []
        self.rng = np.random.default_rng(self.config.seed)  # schedules, seats and adapter init

    # ------------------------------------------------------------------ the user's API
    @property
    def players(self) -> list[dict]:
        return list(self._pool.players) if self._pool is not None else []

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

    def random_seats(self, player: dict, opponent: dict) -> tuple[dict, dict]:
        """``(player, opponent)`` or ``(opponent, player)``, by a fair coin from ``self.rng``."""
        return (player, opponent) if self.rng.random() < 0.5 else (opponent, player)

    @property
    def leaderboard(self) -> Leaderboard:
        bt = None
        if self.bt_records and self.config.bt_bootstrap:
            bt = bradley_terry_bootstrap(self.bt_records, rounds=self.config.bt_bootstrap, seed=self.config.seed)
        nash = nash_weights(self.payoff, [p["id"] for p in self.players])  # the league's meta-strategy
        return Leaderboard(leaderboard_rows(self.players, self.elo, bt, nash=nash))

    @property
    def match_history(self):
        """Every game played: a ``datasets.Dataset`` (players, roles, rewards, epoch, versions)."""
        rows = [json.loads(line) for line in self.history_path.read_text().splitlines()] if self.history_path.exists() else []
        try:
            from datasets import Dataset
        except ImportError:
            return rows
        return Dataset.from_list(rows)

    def train(self, model, play: Callable | None = None, *, lora_config=None, grpo_config=None,
              resume_from_checkpoint: bool | str | None = None, policies: dict | None = None,
              callbacks: list[Callable] | None = None, servers: str | list[str] | None = None,
              api_key: str | None = None):
        """Train the league. ``model``: Hub id, local folder, an :class:`~autocurricula.engine.Engine`, or
        an already loaded ``(model, tokenizer)`` pair from ``mlx_lm.load``.
        ``play`` defaults to ``self.play``. ``lora_config``: a ``peft.LoraConfig`` (or ours);
        ``grpo_config``: a ``trl.GRPOConfig`` (or ours). ``resume_from_checkpoint``: True (latest
        complete checkpoint in ``output_dir`` that passes verification) or a path. ``policies``:
        ``{player id: callable}`` for scripted players on resume that are not in ``opponents``
        (those get their policy from ``opponents``). ``callbacks``: ``fn(trainer) -> dict`` called
        after every epoch; returned metrics are logged. ``servers``: URLs of running ``autocurricula
        serve`` servers of the same base model (``api_key`` for them); games are then played there,
        while updates run on this process's own copy of the weights and every changed adapter is
        pushed to the servers before the next round. ``servers`` may also be an engine object with
        ``sync_from`` (a :class:`~autocurricula.cluster.RayEngine`, a ``RemoteEngine``), used as is.

        A fresh run refuses an ``output_dir`` that holds another run unless ``overwrite_output_dir``.
        SIGINT and SIGTERM finish the round, save a checkpoint and return (a second one stops at once)."""
        from autocurricula import checkpoint as ckpt

        play = play or getattr(self, "play", None)
        if play is None:
            raise ValueError("train(model, play) needs a play function (or override play in the trainer)")
        cfg = self.config
        if not resume_from_checkpoint:  # before anything slow: refuse (or clear) another run's files
            ckpt.prepare_output_dir(cfg.output_dir, cfg.overwrite_output_dir)
        if cfg.push_to_hub:  # fail now, not after all of training
            from autocurricula.hub import check_hub_access

            check_hub_access(cfg.hub_model_id, private=cfg.hub_private_repo)
        self._setup(model, lora_config, grpo_config, play, servers, api_key)
        ckpt.remove_partial_checkpoints(cfg.output_dir)
        start, first_round = 0, 0
        if resume_from_checkpoint:
            path = ckpt.resume_checkpoint(cfg.output_dir, resume_from_checkpoint)
            if path is not None:
                ckpt.load_checkpoint(self, path, self._scripted_policies(policies), self.opponents)
                start, first_round = self.current_epoch, self.current_round + 1
                if first_round >= cfg.rounds:  # saved at the end of its epoch
                    start, first_round = start + 1, 0
                log.info("resumed from %s at epoch %d, round %d", path, start, first_round)
            else:  # a run killed before its first checkpoint: its games and metrics are not kept
                log.warning("no complete checkpoint in %s: starting from scratch", cfg.output_dir)
                ckpt.clear_run_files(cfg.output_dir)
        self._stop_requested = False
        self._explain_pipeline()
        previous = self._install_signal_handlers()
        threads = self._set_threads(cfg.threads)
        try:
            self._loop(play, start, callbacks or [], first_round)
        finally:
            if threads is not None:
                self._set_threads(threads)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for t in self.trackers:
                t.finish()
            if self.rollout is not None and self.rollout is not self.engine and self.rollout is not servers:
                self.rollout.close()  # the servers' connections it opened; an engine object passed in stays open
        if cfg.push_to_hub and not self._stop_requested:
            self.push_to_hub(cfg.hub_model_id, private=cfg.hub_private_repo)
        return self

    def _scripted_policies(self, policies: dict | None) -> dict:
        # the opponents passed to the constructor bring their callables back; policies= adds the rest
        out = {o["id"]: o["policy"] for o in self.opponents if isinstance(o, dict) and "id" in o and is_scripted(o)}
        out.update(policies or {})
        return out

    # ------------------------------------------------------------------ the loop
    def _loop(self, play, start: int, callbacks, first_round: int = 0) -> None:
        from tqdm.auto import tqdm

        cfg = self.config
        epochs = tqdm(range(start, cfg.epochs), desc="epochs", disable=not cfg.progress)
        for epoch in epochs:
            self.current_epoch = epoch
            rounds = range(first_round if epoch == start else 0, cfg.rounds)
            if rounds.start == 0:  # a run resumed mid-epoch had its entries already
                self._pool.add_all(self.entry() or [], epoch)
            if cfg.max_staleness:
                self._pipelined_rounds(play, rounds)
            else:
                for rnd in rounds:
                    self.current_round = rnd
                    self._round(play)
                    if self._stop_requested:
                        break
            metrics = {}
            for cb in callbacks:
                metrics.update(cb(self) or {})
            if metrics:
                self._log(metrics)
            self._plots()
            self._checkpoint(epoch)
            if self._stop_requested:
                log.warning("%s: saved checkpoint-%d (epoch %d, round %d) and stopped", self._stop_requested, epoch,
                            epoch, self.current_round)
                break

    def _round(self, play) -> None:
        """One round; each stage returns its metrics."""
        t0 = time.perf_counter()
        records, turns, rollout = self._rollout(play)
        t_rollout = time.perf_counter() - t0
        rating = self._rate(records)
        turns, credit = self._credit(turns, records)
        update = self._update(turns)
        league = self._league_hooks(records)
        self._sync_rollout()  # servers serve the new versions as soon as they exist
        metrics = {**rollout, **credit, **update, **league, "engine/occupancy": self.rollout.occupancy,
                   "time/round_s": time.perf_counter() - t0, "time/rollout_s": t_rollout, **rating}
        self.step += 1
        if self.step % self.config.logging_steps == 0:
            self._log(metrics)

    def _pipelined_rounds(self, play, rounds: range) -> None:
        """The rounds of one epoch with ``max_staleness >= 1``. As soon as round r's games end, round
        r+1's are matched and started, by the adapters from before round r's update; round r is then
        rated, credited, updated and its league hooks run, in order, while they play. The next
        round's games start only after the changed adapters are pushed, so a turn is one update
        behind when it is trained on (more after a reset or with num_iterations > 1; see
        ``drop_stale``). Games played elsewhere (servers) overlap the update in time; with the
        in-process engine, whose thread runs both, the same schedule runs serially. The pipeline
        drains at the end of the epoch and on a stop signal: checkpoints never hold half a round."""
        if not rounds:
            return
        overlap = self._overlaps()
        background = ThreadPoolExecutor(1, thread_name_prefix="autocurricula-rollout") if overlap else None
        clock = time.perf_counter()
        try:
            pending = self._start_rollout(play, rounds.start, background)
            for rnd in rounds:
                self.current_round = rnd
                t_wait = time.perf_counter()
                records, t_rollout, retried = pending.result()
                waited = time.perf_counter() - t_wait
                records, turns, rollout = self._rollout_results(records, retried)
                pending = None
                if rnd + 1 < rounds.stop and not self._stop_requested:
                    pending = self._start_rollout(play, rnd + 1, background)
                    self.current_round = rnd
                rating = self._rate(records)
                turns, credit = self._credit(turns, records)
                update = self._update(turns)
                league = self._league_hooks(records)
                now = time.perf_counter()
                metrics = {**rollout, **credit, **update, **league, "engine/occupancy": self.rollout.occupancy,
                           "time/round_s": now - clock, "time/rollout_s": t_rollout,
                           "time/rollout_wait_s": waited if overlap else 0.0, **rating}
                clock = now
                self.step += 1
                if self.step % self.config.logging_steps == 0:
                    self._log(metrics)
                if pending is None:
                    break
        finally:
            if background is not None:  # after an error: the next round's games end before the servers close
                background.shutdown(wait=True)
        self._sync_rollout()  # drained: the servers hold the epoch's last versions

    @staticmethod
    def _set_threads(n: int | None) -> int | None:
        """Set this process's BLAS threads (``config.threads``); returns the previous count to restore."""
        if n is None:
            return None
        from autocurricula import _blas

        return _blas.use_threads(n)

    def _overlaps(self) -> bool:
        """Whether the next round's games can play while this round updates: only when they run
        elsewhere (this process's engine thread runs the update), and not while a credit method
        replays games through the same arena."""
        return self.rollout is not self.engine and not getattr(self.credit, "replays", False)

    def _explain_pipeline(self) -> None:
        cfg = self.config
        if not cfg.max_staleness:
            return
        if self.rollout is self.engine:
            log.warning("max_staleness=%d with the in-process engine: its one thread runs both the games and the "
                        "updates, so round r+1 is played before round r's update instead of during it (the same "
                        "games as through servers, no overlap in time); pass servers=[...] (a running "
                        "`autocurricula serve`) to overlap them", cfg.max_staleness)
        elif getattr(self.credit, "replays", False):
            log.warning("max_staleness=%d with credit %r: its replays share the arena with the games, so the "
                        "rounds run one after another (same schedule, no overlap in time)", cfg.max_staleness,
                        cfg.credit)
        if cfg.max_staleness < self.grpo.num_iterations:
            log.warning("max_staleness=%d < num_iterations=%d: an update adds %d adapter versions, so every turn "
                        "played during an update is dropped; set max_staleness >= num_iterations",
                        cfg.max_staleness, self.grpo.num_iterations, self.grpo.num_iterations)

    def _start_rollout(self, play, rnd: int, background: ThreadPoolExecutor | None) -> Future:
        """Push the changed adapters, match round ``rnd``'s games and play them: in ``background``
        when given, else now. A future of ``(records, seconds, retried count before)``."""
        retried = self._sync_rollout()
        self.current_round = rnd
        games = self._games(play)

        def run():
            t0 = time.perf_counter()
            records = run_async(self.arena.run(games, self.config.max_concurrent_games,
                                               timeout_s=self.config.game_timeout_s))
            return records, time.perf_counter() - t0, retried

        if background is not None:
            return background.submit(run)
        done = Future()
        done.set_result(run())
        return done

    def _rollout(self, play) -> tuple[list[GameRecord], list[Turn], dict]:
        """Play match()'s games; a failing round stops here. Each turn gets its reward: the arena's
        (a sub-game's) if it set one, else its seat's reward in the game."""
        cfg = self.config
        retried = self._sync_rollout()
        records = run_async(self.arena.run(self._games(play), cfg.max_concurrent_games, timeout_s=cfg.game_timeout_s))
        return self._rollout_results(records, retried)

    def _games(self, play) -> list[tuple]:
        """match()'s games of round ``self.current_round``, each tuple ``config.matches`` times."""
        cfg = self.config
        games = []
        for mi, tup in enumerate(self.match() or []):
            for k in range(cfg.matches):
                seats = [dict(p, seat=i) for i, p in enumerate(tup)]
                gid = f"e{self.current_epoch}-r{self.current_round}-m{mi}-{k}"
                calls = [] if getattr(self.credit, "replays", False) else None  # a method that replays games
                games.append((play, seats, GameRecord(gid, seats, calls=calls), self.game_name))
        return games

    def _rollout_results(self, records: list[GameRecord], retried: int | None) -> tuple[list[GameRecord], list[Turn],
                                                                                          dict]:
        """A played round's turns (with rewards) and metrics; too many failed games stop here."""
        self._check_errors(records)
        turns = []
        for r in records:
            for t in r.turns:
                if t.reward is None and 0 <= t.seat < len(r.rewards):
                    t.reward = r.rewards[t.seat]
                if t.reward is not None:
                    turns.append(t)
        metrics = {"rollout/games": len(records), "rollout/errors": sum(r.error is not None for r in records),
                   "rollout/turns": len(turns), "pool/size": len(self.players),
                   "pool/learners": sum(not p["frozen"] for p in self.players)}
        if retried is not None:  # requests a failed server left, served by another
            metrics["rollout/retried"] = self.rollout.stats["retried"] - retried
        learners = [(r, i) for r in records if not r.error for i, p in enumerate(r.players) if self.arena.is_trainable(p)]
        if learners:
            metrics["rollout/reward_mean"] = float(np.mean([r.rewards[i] for r, i in learners]))
        return records, turns, metrics

    def _sync_rollout(self) -> int | None:
        """With servers: push every adapter that changed since the last round (updates, new players,
        snapshots, resets) and drop removed players; returns the servers' retry count so far."""
        if self.rollout is None or self.rollout is self.engine:
            return None
        self.rollout.sync_from(self.engine)
        return self.rollout.stats["retried"]

    def _rate(self, records: list[GameRecord]) -> dict:
        """Elo, payoff and the match history take the games; the players' Elo after them."""
        self._record(records)
        return {f"rating/elo/{p['id']}": self.elo.rating(p["id"]) for p in self.players}

    def _credit(self, turns: list[Turn], records: list[GameRecord] = ()) -> tuple[list[Turn], dict]:
        """Advantages for every turn, plus the credit method's extra turns for the learners. A method
        with ``replays = True`` (branch credit) first sees the round's games and a replayer of them."""
        if not turns:
            return turns, {}
        if getattr(self.credit, "replays", False):
            from autocurricula.replay import Replayer

            self.credit.see_round(records, Replayer(self.arena, self._game, self.game_name,
                                                    max_concurrent=self.config.max_concurrent_games,
                                                    timeout_s=self.config.game_timeout_s, scorer=self.engine))
        self.credit.assign(turns)
        frozen = self._frozen_ids()
        extra = self.credit.extra_turns([t for t in turns if t.player not in frozen])
        return turns + extra, self.credit.metrics()

    def _update(self, turns: list[Turn]) -> dict:
        """One fused update of every learner on its turns (frozen players' turns are skipped). With
        ``max_staleness`` k >= 1, turns more than k versions behind their player are dropped first."""
        if not turns:
            return {}
        stale = {}
        if self.config.max_staleness:
            versions = {p["id"]: self.engine.adapter_info(p["id"])["version"] for p in self.players
                        if not p["frozen"] and not is_scripted(p)}
            turns, dropped, worst = drop_stale(turns, versions, self.config.max_staleness)
            stale = {"rollout/stale_dropped": dropped, "rollout/staleness_max": worst}
            if not turns:
                return stale
        lr, lr_metric = self._scheduled_lr(turns)
        t0 = time.perf_counter()
        out = self.updater.step(turns, lr=lr, skip=self._frozen_ids())
        metrics = {"time/update_s": time.perf_counter() - t0, "train/loss": out.get("loss", 0.0), **lr_metric,
                   "train/kl": out.get("kl", 0.0), "train/clip_ratio": out.get("clip_ratio", 0.0),
                   "train/tokens": out.get("tokens", 0)}
        if "entropy" in out:
            metrics["train/entropy"] = out["entropy"]
        self._pool.refresh_versions()
        return {**metrics, **stale}

    def _scheduled_lr(self, turns: list[Turn]) -> tuple[dict[str, float] | None, dict]:
        """Per-learner learning rates of this round under ``GRPOConfig.lr_scheduler_type`` (None when
        constant), by the rounds done so far out of ``epochs * rounds``; resumed runs continue it."""
        g, cfg = self.grpo, self.config
        peak = {t.player: self.learning_rate_of(t.player) for t in turns}
        if g.lr_scheduler_type == "constant" and all(v == g.learning_rate for v in peak.values()):
            return None, {}
        from autocurricula.training.optim import scheduled_lr

        done = self.current_epoch * cfg.rounds + self.current_round
        factor = scheduled_lr(1.0, g.lr_scheduler_type, done, cfg.epochs * cfg.rounds, g.min_lr_ratio,
                              g.lr_decay_ratio)
        return ({pid: v * factor for pid, v in peak.items()},
                {"train/learning_rate": g.learning_rate * factor})

    def learning_rate_of(self, player_id: str) -> float:
        """A learner's peak learning rate, before the schedule: ``GRPOConfig.learning_rate``; a league
        overrides it per role."""
        return self.grpo.learning_rate

    def _league_hooks(self, records: list[GameRecord]) -> dict:
        """The players on_round_end() adds (snapshots), each joining before the next is decided."""
        self._pool.add_all(self.on_round_end(records) or (), self.current_epoch)
        return {}

    def _checkpoint(self, epoch: int) -> None:
        """After every epoch (``save_strategy="epoch"``), and whenever a signal stops the run."""
        if self.config.save_strategy == "epoch" or self._stop_requested:
            from autocurricula.checkpoint import save_checkpoint

            save_checkpoint(self, epoch)
            self.engine.clear_prefix_cache()  # a resume from here starts with an empty cache too

    def _frozen_ids(self) -> set[str]:
        return {p["id"] for p in self.players if p["frozen"]}

    def _check_errors(self, records: list[GameRecord]) -> None:
        """Log the first traceback of each distinct error; stop when all games, or more than
        ``max_game_error_rate`` of them, failed (a broken play must not "train" for hours)."""
        failed = [r for r in records if r.error]
        if not failed:
            return
        for r in failed:
            if r.error not in self._errors_seen and len(self._errors_seen) < 20:
                self._errors_seen.add(r.error)
                log.error("game %s of %s failed (each distinct error is shown once):\n%s", r.game_id, self.game_name,
                          r.traceback or r.error)
        rate = self.config.max_game_error_rate
        where = f"epoch {self.current_epoch}, round {self.current_round}"
        if len(failed) == len(records) or len(failed) > rate * len(records):
            first = failed[0]
            raise GameError(f"{len(failed)} of {len(records)} games of {self.game_name!r} failed in {where} "
                            f"(max_game_error_rate={rate:g}): fix play, or raise max_game_error_rate to tolerate "
                            f"failing games. First failure, game {first.game_id}:\n{first.traceback or first.error}")
        log.warning("%d of %d games of %s failed in %s; first: %s", len(failed), len(records), self.game_name, where,
                    failed[0].error)

    def _record(self, records: list[GameRecord]) -> None:
        with self.history_path.open("a") as fh:
            for r in records:
                if r.error:
                    continue
                ids = [p["id"] for p in r.players]
                if len(set(ids)) > 1:
                    self.elo.update(ids, r.rewards, step=self.step)
                    self.payoff.update_match(ids, r.rewards)
                    if len(ids) == 2:
                        a, b = r.rewards
                        self.bt_records.append((ids[0], ids[1], 1.0 if a > b else 0.0 if a < b else 0.5))
                fh.write(json.dumps({"game_id": r.game_id, "epoch": self.current_epoch, "round": self.current_round,
                                     "players": ids, "roles": [p.get("role") for p in r.players],
                                     "rewards": r.rewards, "versions": [p.get("version") for p in r.players]}) + "\n")
        from autocurricula.transcripts import write_transcripts  # the dashboard's last games per pair

        write_transcripts(self, records)

    def _log(self, metrics: dict) -> None:
        row = {"step": self.step, "epoch": self.current_epoch, **metrics}
        self.metrics_log.append(row)
        for t in self.trackers:
            t.log(metrics, self.step)
        with (Path(self.config.output_dir) / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    def _plots(self) -> None:
        from autocurricula.plots import plot_elo, plot_payoff

        out = Path(self.config.output_dir)
        try:
            plot_elo(self.elo.history, out / "elo.png")
            ids = [p["id"] for p in self.players]
            plot_payoff(ids, self.payoff.matrix(ids), out / "payoff.png")
        except Exception as exc:  # noqa: BLE001 - a plot must never end training
            log.warning("plotting failed: %s", exc)

    # ------------------------------------------------------------------ setup and state
    def _setup(self, model, lora_config, grpo_config, play, servers=None, api_key=None) -> None:
        from autocurricula.engine import Engine, EngineConfig
        from autocurricula.pool import Pool
        from autocurricula.tracking import make_trackers
        from autocurricula.training import Updater

        cfg = self.config
        self.lora_spec = coerce_lora_spec(lora_config)
        self.grpo = coerce_grpo_config(grpo_config)
        spec = cfg.credit if isinstance(cfg.credit, Credit) else \
            credit_from_fields(cfg.credit, {f: getattr(cfg, f) for f in LEGACY_CREDIT_FIELDS})
        self.credit = make_credit(spec, self.grpo, cfg.seed, config=cfg)
        self.credit.check_game(play)  # e.g. moves credit needs play.moves: say so now
        if self.grpo.lr_scheduler_type != "constant":
            log.info("learning rate: %s schedule from %g to %g x that over %d rounds%s", self.grpo.lr_scheduler_type,
                     self.grpo.learning_rate, self.grpo.min_lr_ratio, cfg.epochs * cfg.rounds,
                     f" (decay over the last {self.grpo.lr_decay_ratio:g})" if self.grpo.lr_decay_ratio else "")
        if self.grpo.lr_decay_ratio and self.grpo.lr_decay_ratio * cfg.epochs * cfg.rounds < 2:
            log.warning("lr_decay_ratio=%g of %d rounds leaves fewer than 2 rounds to decay over, so the rate "
                        "barely falls: raise lr_decay_ratio or the rounds", self.grpo.lr_decay_ratio,
                        cfg.epochs * cfg.rounds)
        if isinstance(model, Engine):
            self.engine, self.model_name = model, model.name
        elif isinstance(model, tuple) and len(model) == 2:  # (model, tokenizer) from mlx_lm.load
            self.model_name = getattr(getattr(model[0], "args", None), "model_type", "model")
            self.engine = Engine(model[0], model[1], config=EngineConfig(
                max_slots=cfg.max_slots, max_batch=cfg.max_batch, initial_rank=self.lora_spec.r,
                prefix_cache_mb=cfg.prefix_cache_mb), name=self.model_name)
        else:
            from autocurricula.hub import check_model_source

            self.model_name = check_model_source(model)
            self.engine = Engine(self.model_name, config=EngineConfig(max_slots=cfg.max_slots, max_batch=cfg.max_batch,
                                                                      initial_rank=self.lora_spec.r,
                                                                      prefix_cache_mb=cfg.prefix_cache_mb))
        self.rollout = self.engine
        if servers is not None and hasattr(servers, "sync_from"):  # an engine object, e.g. cluster.RayEngine
            self.rollout = servers
        elif servers:
            from autocurricula.remote import RemoteEngine

            self.rollout = RemoteEngine(servers, base=self.engine, api_key=api_key)  # checks their base model
        self.game_name = cfg.game_name or getattr(play, "__module__", "game").rsplit(".", 1)[-1]
        self._game = play  # a play object with state_dict / load_state_dict (e.g. an artifact store) is checkpointed
        self._pool = Pool(self.engine, self.lora_spec, self.rng)
        make = getattr(servers, "make_updater", None)  # cluster.RayEngine(learners=N): updates on Ray learner actors
        self.updater = (make and make(self.engine, self.grpo)) or Updater(self.engine, self.grpo)
        self.elo = Elo(k=cfg.elo_k, scale=cfg.elo_scale, initial=cfg.elo_initial)
        self.payoff = Payoff(cfg.payoff_decay)
        self.bt_records: list[tuple] = []
        self.step = 0
        self.arena = Arena(self.rollout, seed=cfg.seed, temperature=self.grpo.temperature, max_tokens=cfg.max_tokens,
                           lockstep=cfg.lockstep)
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        self.history_path = Path(cfg.output_dir) / "match_history.jsonl"
        self.trackers = make_trackers(cfg.report_to, "autocurricula", cfg.run_name, self.config_dict(), cfg.output_dir)

    def config_dict(self) -> dict:
        out = {"trainer": type(self).__name__, "model": self.model_name,
               "config": asdict(self.config), "grpo": asdict(self.grpo), "lora": asdict(self.lora_spec)}
        return json.loads(json.dumps(out, default=str))

    def state_dict(self) -> dict:
        return {"epoch": self.current_epoch, "round": self.current_round, "step": self.step,
                "updater_steps": self.updater.steps, "elo": self.elo.state_dict(), "payoff": self.payoff.state_dict(),
                "bt_records": [list(r) for r in self.bt_records], **self.credit.state_dict(),
                "extra": self.extra_state(),
                "game": self._game.state_dict() if callable(getattr(self._game, "state_dict", None)) else None}

    def load_state_dict(self, state: dict) -> None:
        self.current_epoch, self.current_round, self.step = state["epoch"], state["round"], state["step"]
        self.updater.steps = state["updater_steps"]
        self.elo.load_state_dict(state["elo"])
        self.payoff.load_state_dict(state["payoff"])
        self.bt_records = [tuple(r) for r in state["bt_records"]]
        self.credit.load_state_dict(state)
        self.load_extra_state(state.get("extra") or {})
        if state.get("game") is not None and callable(getattr(self._game, "load_state_dict", None)):
            self._game.load_state_dict(state["game"])

    def extra_state(self) -> dict:
        """Subclass state to checkpoint (JSON-able)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def _install_signal_handlers(self) -> dict:
        """SIGINT/SIGTERM: finish the round (games are bounded by game_timeout_s), save, stop; a
        second signal stops at once without saving. Returns the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self._stop_requested:
                raise KeyboardInterrupt(f"second {name}: stopped without saving this round")
            self._stop_requested = name
            log.warning("%s: finishing this round, then saving a checkpoint and stopping (send it again to stop "
                        "at once, without saving)", name)

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    @property
    def values(self):
        """The tabular critic (``StateValues``) of credit "value" or "q"; None for other methods."""
        return getattr(getattr(self, "credit", None), "values", None)

    # ------------------------------------------------------------------ league rules
    def reset_player(self, player: dict) -> None:
        """Back to the base model; its optimizer state is dropped."""
        self._pool.reset(player)
        self.updater.optim.pop(player["id"], None)

    # ------------------------------------------------------------------ publishing
    def export(self, player_id: str, folder: str | Path, format: str = "peft") -> Path:
        """Write a trained player's adapter: ``"peft"`` (``PeftModel.from_pretrained``) or ``"mlx"``
        (``mlx_lm.load(base, adapter_path=folder)``). Returns the folder."""
        from autocurricula.export import export_mlx, export_peft, model_num_layers

        player = self._pool.get(player_id)
        if is_scripted(player):
            raise ValueError(f"{player_id} is a scripted player: it has no adapter to export")
        weights = self.engine.adapter_weights(player_id)
        if format == "peft":
            return export_peft(weights, folder, self.model_name, use_rslora=self.lora_spec.use_rslora,
                               num_model_layers=model_num_layers(self.engine.linear_dims))
        if format == "mlx":
            return export_mlx(weights, folder, model_num_layers(self.engine.linear_dims))
        raise ValueError(f"format must be 'peft' or 'mlx', got {format!r}")

    def push_to_hub(self, repo_id: str, *, private: bool = False, token: str | None = None,
                    revision: str | None = None, endpoint: str | None = None) -> str:
        """Every player as a peft adapter (a folder each, with its card) plus the league card,
        match history and plots, in one commit."""
        from autocurricula.hub import push_league

        return push_league(self, repo_id, private=private, token=token, revision=revision, endpoint=endpoint)
