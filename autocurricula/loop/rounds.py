"""The pieces of one round that are not the trainer's story: the arena's games for ``match()``,
what a played round hands on (:class:`Played`), its turns with rewards and its metrics, the check
of its advantages, the staleness filter, and the rules that stop a run whose games keep failing
(:class:`ErrorGate`) or name learners that get no signal (:class:`SilenceWatch`)."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from autocurricula.arena.game import FLOAT32_MAX
from autocurricula.loop.rating import outcome
from autocurricula.records import Deal, GameRecord, Player, Turn
from autocurricula.training.loss import MISMATCH_KEYS

log = logging.getLogger(__name__)


class GameError(RuntimeError):
    """Too many games of a round failed (see ``max_game_error_rate``); the message holds a traceback."""


@dataclass
class Played:
    """A round's games as played: the records, how long playing took, and the fleet's retry count
    before them (None when the games ran in this process)."""

    records: list[GameRecord]
    seconds: float
    retried_before: int | None
    turns: list[Turn] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


def rewarded_turns(records: list[GameRecord]) -> list[Turn]:
    """The round's turns, each with its reward: the arena's (a sub-game's) if it set one, else its
    seat's reward in the game; turns left without one are not trained."""
    turns = []
    for r in records:
        for t in r.turns:
            if t.reward is None and 0 <= t.seat < len(r.rewards):
                t.reward = r.rewards[t.seat]
            if t.reward is not None:
                turns.append(t)
    return turns


def rollout_metrics(records: list[GameRecord], turns: list[Turn], players: list[dict], is_trainable) -> dict:
    """The round's counts, the learners' mean reward, and their reward and win rate per role (and
    per player in a role of several learners, see :func:`by_role`)."""
    metrics = {"rollout/games": len(records), "rollout/errors": sum(r.error is not None for r in records),
               "rollout/turns": len(turns), "pool/size": len(players),
               "pool/learners": sum(not p["frozen"] for p in players)}
    learners = [(r, i) for r in records if not r.error for i, p in enumerate(r.players) if is_trainable(p)]
    if learners:
        metrics["rollout/reward_mean"] = float(np.mean([r.rewards[i] for r, i in learners]))
    roles = learner_roles(players, is_trainable)
    rewards: dict[str, list[float]] = {}
    wins: dict[str, list[float]] = {}
    for r, i in learners:
        pid = r.players[i]["id"]
        roles.setdefault(pid, role_of(r.players[i]))  # a seat a custom match() made outside the pool
        rewards.setdefault(pid, []).append(float(r.rewards[i]))
        others = [j for j in range(len(r.rewards)) if j != i]
        if others:  # draws count half, against every other seat: the payoff matrix's win rate
            wins.setdefault(pid, []).append(float(np.mean([outcome(r.rewards[i], r.rewards[j]) for j in others])))
    metrics.update(by_role("reward", rewards, roles, np.mean))
    metrics.update(by_role("win_rate", wins, roles, np.mean))
    return metrics


def role_of(player) -> str:
    """A player's role as metric names carry it (``"player"`` when it has none)."""
    role = player.get("role")
    return "player" if role is None else str(role)


def learner_roles(players, is_trainable) -> dict[str, str]:
    """``{player id: role}`` of the learners (trainable players) among ``players``."""
    return {p["id"]: role_of(p) for p in players if is_trainable(p)}


def by_role(name: str, values: dict[str, list[float]], roles: dict[str, str], combine) -> dict:
    """``{name}/role/<role>``: ``combine`` of the values of the role's learners, and
    ``{name}/player/<id>``: of each learner of a role that has several (in ``roles``), so the
    curves show the league per role and, where a role has several learners, per player.
    ``values``: ``{player id: [value, ...]}``; players without a role in ``roles`` are left out."""
    out: dict = {}
    members: dict[str, list[float]] = {}
    several = {r for r in roles.values() if sum(v == r for v in roles.values()) > 1}
    for pid, vs in values.items():
        role = roles.get(pid)
        if role is None or not vs:
            continue
        members.setdefault(role, []).extend(vs)
        if role in several:
            out[f"{name}/player/{pid}"] = float(combine(vs))
    for role, vs in members.items():
        out[f"{name}/role/{role}"] = float(combine(vs))
    return out


class ErrorGate:
    """Logs the first traceback of each distinct error; raises :class:`GameError` when all games,
    or more than ``max_rate`` of them, failed (a broken play must not "train" for hours)."""

    def __init__(self, max_rate: float, game_name: str):
        self.max_rate, self.game_name = max_rate, game_name
        self.seen: set[str] = set()

    def check(self, records: list[GameRecord], where: str, rollout_health: dict | None = None) -> None:
        """``rollout_health``: the health of the servers or actors the games ran on, if elsewhere."""
        failed = [r for r in records if r.error]
        if not failed:
            return
        if rollout_health is not None and not rollout_health.get("ok", True):
            raise GameError(f"{len(failed)} of {len(records)} games of {self.game_name!r} failed in {where} because "
                            f"no server or actor is reachable ({unreachable(rollout_health)}): start them again or "
                            f"check their addresses; the games themselves did not fail. First error: "
                            f"{failed[0].error}")
        for r in failed:
            if r.error not in self.seen and len(self.seen) < 20:
                self.seen.add(r.error)
                log.error("game %s of %s failed (each distinct error is shown once):\n%s", r.game_id, self.game_name,
                          r.traceback or r.error)
        if len(failed) == len(records) or len(failed) > self.max_rate * len(records):
            first = failed[0]
            raise GameError(f"{len(failed)} of {len(records)} games of {self.game_name!r} failed in {where} "
                            f"(max_game_error_rate={self.max_rate:g}): fix play, or raise max_game_error_rate to "
                            f"tolerate failing games. First failure, game {first.game_id}:\n"
                            f"{first.traceback or first.error}")
        log.warning("%d of %d games of %s failed in %s; first: %s", len(failed), len(records), self.game_name, where,
                    failed[0].error)


def seated(player, seat: int):
    """What a game gets for ``player`` at ``seat``: a copy of it as the round starts (its version then)
    with ``seat`` set; a :class:`Player` stays one (of its own class), a dict a custom ``match`` built
    stays a dict."""
    return dataclasses.replace(player, seat=seat) if isinstance(player, Player) else dict(player, seat=seat)


def match_games(tuples, play, game_name: str, epoch: int, rnd: int, repeat: int, log_calls: bool) -> list[tuple]:
    """The arena's games for match()'s ``tuples``, each played ``repeat`` times (ids
    ``e{epoch}-r{round}-m{match}-{k}``); ``log_calls`` keeps every call (for credit that replays).
    The k-th games of the :class:`~autocurricula.records.Deal` entries of one key share a deal."""
    games = []
    for mi, tup in enumerate(tuples):
        for k in range(repeat):
            seats = [seated(p, i) for i, p in enumerate(tup)]
            deal = f"e{epoch}-r{rnd}-d{tup.key}-{k}" if isinstance(tup, Deal) else None
            record = GameRecord(f"e{epoch}-r{rnd}-m{mi}-{k}", seats, calls=[] if log_calls else None, deal=deal)
            games.append((play, seats, record, game_name))
    return games


def update_metrics(out: dict, seconds: float, lr_metric: dict, roles: dict[str, str] | None = None) -> dict:
    """The logged figures of one update from the updater's result. ``roles``: ``{learner id: role}``;
    with it, an updater's per-player losses (``loss/<player id>``) are logged per role
    (``loss/role/<role>``, summed like ``train/loss``) and per player in a role of several learners
    (``loss/player/<player id>``)."""
    metrics = {"time/update_s": seconds, "train/loss": out.get("loss", 0.0), **lr_metric,
               "train/kl": out.get("kl", 0.0), "train/clip_ratio": out.get("clip_ratio", 0.0),
               "train/tokens": out.get("tokens", 0)}
    if "entropy" in out:
        metrics["train/entropy"] = out["entropy"]
    if out.get("row_tokens"):  # what the forward computed against per-row packing (docs/training.md)
        computed = out.get("computed_tokens", out["row_tokens"])
        metrics.update({"update/tokens": computed, "update/row_tokens": out["row_tokens"],
                        "update/tree_ratio": computed / out["row_tokens"],
                        "update/tree_tokens": out["tree_tokens"], "update/padded_tokens": out.get("padded_tokens", 0)})
    if "skipped_nonfinite" in out:
        metrics["train/skipped_nonfinite"] = out["skipped_nonfinite"]
    metrics.update({k: out[k] for k in MISMATCH_KEYS if k in out})  # the sampler/learner gap
    if roles:
        losses = {k[len(LOSS_PREFIX):]: [float(v)] for k, v in out.items() if k.startswith(LOSS_PREFIX)
                  and isinstance(v, (int, float)) and not isinstance(v, bool)}
        metrics.update(by_role("loss", losses, roles, sum))
    return metrics


LOSS_PREFIX = "loss/"  # an updater's per-player loss: ``loss/<player id>``


def check_advantages(turns: list[Turn], credit: str) -> None:
    """Every advantage is a finite float32: the loss is computed in float32, and one overflow would
    turn every adapter it touches into NaN."""
    for t in turns:
        a = t.advantage
        if a is not None and not (math.isfinite(a) and abs(a) <= FLOAT32_MAX):
            raise ValueError(f"credit {credit!r} gave turn of {t.player} in game {t.game_id} ({t.game}) the advantage "
                             f"{a!r} (reward {t.reward!r}), outside float32's range: the update runs in float32. "
                             f"Scale the game's rewards down")


def silent_learners(turns: list[Turn], frozen: set[str]) -> list[str]:
    """The learners that made turns this round yet got no non-zero advantage: nothing to learn from."""
    made, moved = set(), set()
    for t in turns:
        if t.player not in frozen:
            made.add(t.player)
            if t.advantage:
                moved.add(t.player)
    return sorted(made - moved)


class SilenceWatch:
    """Names, once a run, the learners that went ``rounds`` rounds in a row without any non-zero
    advantage: every reward they saw was the same, so nothing trains."""

    def __init__(self, rounds: int = 3):
        self.rounds, self.count, self.warned = rounds, 0, False

    def see(self, silent: list[str]) -> None:
        self.count = self.count + 1 if silent else 0
        if self.count >= self.rounds and not self.warned:
            self.warned = True
            log.warning("%s got no non-zero advantage for %d rounds in a row: every reward they saw was the same "
                        "(e.g. all games drawn, a judge whose replies never parse, equal rewards in every GRPO "
                        "group), so nothing trains. Check the rewards in match_history.jsonl", ", ".join(silent),
                        self.rounds)


def unreachable(health: dict) -> str:
    """The workers a fleet's health lists as down, with their last errors."""
    rows = [r for v in health.values() if isinstance(v, list) for r in v if isinstance(r, dict) and not r.get("up")]
    return "; ".join(f"{next(iter(r.values()))}: {r.get('error') or 'down'}" for r in rows) or "none is up"


def fresh_turns(turns: list[Turn], versions: dict[str, int], max_staleness: int) -> tuple[list[Turn], dict]:
    """:func:`drop_stale` with its figures as metrics (nothing dropped nor measured when 0)."""
    if not max_staleness:
        return turns, {}
    kept, dropped, worst = drop_stale(turns, versions, max_staleness)
    return kept, {"rollout/stale_dropped": dropped, "rollout/staleness_max": worst}


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
