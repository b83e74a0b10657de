"""Experiment trackers behind one tiny interface: ``report_to`` = "wandb" | "trackio" | "none".

A tracker that fails to start or to log is disabled with a warning: tracking never blocks or
ends training. wandb runs offline unless ``WANDB_MODE`` or an API key says otherwise.
"""

from __future__ import annotations

import logging
import os
import warnings

log = logging.getLogger(__name__)

METRICS = {
    "train/loss": "policy loss of the round's update (sum over players)",
    "train/kl": "mean per-token KL to the base model (beta > 0)",
    "train/clip_ratio": "share of tokens whose ratio was clipped",
    "train/tokens": "completion tokens trained on",
    "update/tokens": "tokens the update's forward computed (each prefix tree's tokens once; GRPOConfig.packing)",
    "update/row_tokens": "tokens of the update's rows (prompt + completion), each row on its own",
    "update/tree_ratio": "update/tokens / update/row_tokens: the share of per-row work the update did",
    "update/tree_tokens": "tokens of each learner's whole prefix trie of those rows (the least a tree update reads)",
    "mismatch/mean_abs_log_ratio": "mean |learner - sampler| logprob per sampled token, before the update",
    "mismatch/max_abs_log_ratio": "largest |learner - sampler| logprob of a sampled token, before the update",
    "update/padded_tokens": "tokens the update's micro-batches fed (batch rows x width, padding included)",
    "rollout/reward_mean": "mean reward of trainable players' seats",
    "reward/role/<role>": "mean reward of the seats of the role's learners",
    "win_rate/role/<role>": "win rate of the role's learners' seats against the other seats (draws count half)",
    "loss/role/<role>": "policy loss of the role's learners, summed (from an updater that reports loss/<player>)",
    "reward/player/<player>": "reward/role/ for one learner, where its role has several learners",
    "win_rate/player/<player>": "win_rate/role/ for one learner, where its role has several learners",
    "loss/player/<player>": "loss/role/ for one learner, where its role has several learners",
    "rollout/games": "games played this round",
    "rollout/errors": "games whose play raised or ran past game_timeout_s (no turns kept)",
    "rollout/turns": "turns recorded for training",
    "rating/elo/<player>": "online Elo of each player",
    "pool/size": "players in the pool",
    "pool/learners": "trainable players",
    "engine/occupancy": "mean rows per decode step / max_batch since start",
    "time/round_s": "wall time of the round",
    "time/rollout_s": "of which playing the games (engine and game code)",
    "time/update_s": "of which the optimizer step (credit and bookkeeping are the rest)",
    "credit/states": "credit='value' or 'q': positions in the value table",
    "credit/state_moves": "credit='q': (position, move) pairs in the action-value table",
    "credit/targets": "QCredit(target_coef > 0): target turns (best known moves) added to the update",
    "credit/silent_learners": "learners that made turns but got no non-zero advantage this round (no signal)",
    "train/skipped_nonfinite": "updates skipped because their loss, gradients or result were not finite",
}


class _Tracker:
    name = "none"

    def __init__(self, module):
        self.module = module

    def log(self, metrics: dict, step: int) -> None:
        try:
            self.module.log(metrics, step=step)
        except Exception as exc:  # noqa: BLE001 - never let a tracker stop training
            warnings.warn(f"{self.name} logging failed ({exc}); disabling it")
            self.module = None

    def finish(self) -> None:
        try:
            if self.module is not None:
                self.module.finish()
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"{self.name} finish failed: {exc}")


def make_trackers(report_to: list[str], project: str, run_name: str | None, config: dict, output_dir: str) -> list:
    trackers = []
    for name in report_to:
        try:
            if name == "wandb":
                import wandb  # wandb: optional (extra wandb)

                if "WANDB_MODE" not in os.environ and not os.environ.get("WANDB_API_KEY"):
                    os.environ["WANDB_MODE"] = "offline"  # no key: log locally, never prompt or wait
                wandb.init(project=project, name=run_name, config=config, dir=output_dir)
                t = _Tracker(wandb)
            elif name == "trackio":
                import trackio  # trackio: optional, not a dependency

                trackio.init(project=project, name=run_name, config=config)
                t = _Tracker(trackio)
            else:
                continue
            t.name = name
            trackers.append(t)
        except Exception as exc:  # noqa: BLE001 - ImportError or a failed init
            warnings.warn(f"report_to={name!r} disabled: {exc}")
    return trackers
