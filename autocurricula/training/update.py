"""The fused multi-player update: one forward/backward over rows of many players.

Each step stacks the participating players' adapters (``A: (P, in, R)``, ``B: (P, R, out)``,
zero-padded to the largest rank) into the engine's multi-LoRA layers, routes every row to its
player's entry, and differentiates the weighted loss with respect to the stacks only (the base
weights are shared with inference and never copied). A player's gradient comes only from its own
rows, per-player clipping and AdamW follow, so the result equals one step per player; players
not in the step are not touched at all. The step runs as a job on the engine's MLX thread and the
new adapter versions are live for the next decode step; remote servers get them by upload.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from autocurricula.training.config import GRPOConfig, coerce_grpo_config
from autocurricula.records import Turn
from autocurricula.engine.adapters import AdapterWeights
from autocurricula.training.loss import (mismatch_metrics, mismatch_sums, policy_loss, token_weights,
                                        truncated_is_weights)
from autocurricula.training.optim import AdamWState, adamw
from autocurricula.training.packing import TreeChunk, row_microbatches, tree_chunks, tree_microbatches
from autocurricula.training.trie import completion_targets, token_counts

log = logging.getLogger(__name__)

MAX_NONFINITE_IN_A_ROW = 3  # updates skipped for non-finite values before training stops


class NonFiniteUpdateError(RuntimeError):
    """Several updates in a row had a non-finite loss, gradient or result; none was applied."""


@dataclass
class Row:
    """One turn as the update sees it: its learner's index, prompt + completion ids and weights."""
    player: int
    ids: list[int]
    start: int  # index of the first completion token in ids
    n: int
    adv: float
    old: list[float]
    weight: float
    fresh: bool = False  # a target turn: no sampler logprobs, the ratio is taken against the current ones
    learner: list[float] | None = None  # the learner's own logprobs before the update (sampler correction)
    key: int = 0  # id() of its turn


def split_turns(turns: list[Turn], parts: int) -> list[list[Turn]]:
    """``turns`` in ``parts`` slices for as many optimizer steps (trl's ``steps_per_generation``):
    each player's games are dealt round-robin in the order they first appear, so a game's turns
    (a state's move targets among them) stay in one slice and every player is in every slice it
    can fill. Empty slices are dropped."""
    if parts <= 1:
        return [turns]
    slot: dict[tuple[str, str], int] = {}
    dealt: dict[str, int] = {}
    out: list[list[Turn]] = [[] for _ in range(parts)]
    for t in turns:
        key = (t.player, t.game_id)
        if key not in slot:
            slot[key] = dealt.get(t.player, 0) % parts
            dealt[t.player] = dealt.get(t.player, 0) + 1
        out[slot[key]].append(t)
    return [part for part in out if part]


def merge_step_metrics(steps: list[dict]) -> dict:
    """One metrics dict for the optimizer steps of one pass: counts and losses summed, ratios
    token-weighted, per-player entries (grad norms, versions) from the last step that has them."""
    if len(steps) == 1:
        return steps[0]
    out: dict = {}
    for m in steps:
        out.update({k: v for k, v in m.items() if "/" in k and not k.startswith("loss/")})
    for k in {k for m in steps for k in m if k.startswith("loss/")}:  # a player's loss, summed like the total
        out[k] = sum(m.get(k, 0.0) for m in steps)
    tokens = sum(m.get("tokens", 0) for m in steps)
    for k in ("rows", "tokens", "loss", *(k for k in TOKEN_COUNTS if any(k in m for m in steps))):
        out[k] = sum(m.get(k, 0) for m in steps)
    if any("skipped_nonfinite" in m for m in steps):
        out["skipped_nonfinite"] = sum(m.get("skipped_nonfinite", 0) for m in steps)
    out["players"] = max(m.get("players", 0) for m in steps)
    for k in ("clip_ratio", "kl", "entropy"):
        if any(k in m for m in steps):
            out[k] = sum(m.get(k, 0.0) * m.get("tokens", 0) for m in steps) / max(1, tokens)
    return out


# what a step's forward reads, summed over its slices and learners: ``row_tokens`` the rows' ids
# (prompt + completion, each row on its own), ``tree_tokens`` the nodes of each player's prefix trie,
# ``computed_tokens`` the tokens the forward computed (tree nodes, or row inputs when packed per row),
# ``padded_tokens`` what the micro-batches fed (batch rows x width, padding included)
TOKEN_COUNTS = ("row_tokens", "tree_tokens", "computed_tokens", "padded_tokens")


def microbatches(rows: list[Row], budget: int) -> list[list[Row]]:
    """Rows in per-row micro-batches (:func:`~autocurricula.training.packing.row_microbatches`)."""
    return [[rows[i] for i in b] for b in row_microbatches([len(r.ids) for r in rows], [r.player for r in rows], budget)]


class Updater:
    """Policy updates of the players loaded in ``engine`` from their :class:`~autocurricula.records.Turn`s.

    ``remotes``: :class:`~autocurricula.fleet.client.Client`s of servers that also serve these players;
    every step uploads the new weights to them (hot-swap there too). ``sampled_by_vllm``: the turns
    come from vLLM, whose logprobs differ from the learner's: the update applies truncated
    importance sampling (``GRPOConfig.vllm_importance_sampling_cap``, :func:`truncated_is_weights`).
    Every update reports the sampler/learner gap (``mismatch/*``) either way.
    """

    def __init__(self, engine, config: GRPOConfig | None = None, remotes=(), sampled_by_vllm: bool = False):
        self.engine = engine
        self.config = coerce_grpo_config(config)
        self.sampler_cap = self.config.sampler_cap(sampled_by_vllm)
        self.remotes = list(remotes)
        self.optim: dict[str, AdamWState] = {}
        self.steps = 0
        self.nonfinite_in_a_row = 0
        self._fallback_said = False
        # MLX 0.32.4's CUDA gather_mm faulted ("misaligned address", a 16-byte read) in the backward at
        # widths 23 and 27, not 24: pad to a multiple of 4 there; exact (causal rows never see it)
        cuda = mx.default_device().type == mx.DeviceType.gpu and not mx.metal.is_available()
        self.width_multiple = 4 if cuda else 1

    # -------------------------------------------------------------- public (any thread but the engine's)
    def step(self, turns: list[Turn], lr: dict[str, float] | None = None, skip=()) -> dict:
        """One update of every player with turns (except those in ``skip``, e.g. frozen snapshots):
        ``num_iterations`` passes over ``steps_per_generation`` slices of the turns, one optimizer
        step per slice. ``lr`` overrides the learning rate per player. Returns metrics (``loss`` and
        ``clip_ratio`` of the last pass, summed and token-weighted over its slices)."""
        turns, lr, skip = list(turns), dict(lr or {}), set(skip)
        slices = split_turns(turns, self.config.steps_per_generation) or [turns]  # no turns: one empty step
        # the learner's logprobs before any step: the first pass's own, unless a later slice or pass
        # needs them after the weights moved (then one forward without gradients first)
        learner = self.engine.call(self._learner_logprobs, turns, skip).result() \
            if self.sampler_cap is not None and (self.config.num_iterations > 1 or len(slices) > 1) else None
        new: dict = {}
        gap = [0.0, 0.0, 0.0]  # the sampler/learner gap: |log-ratio| summed, its max, tokens
        for it in range(self.config.num_iterations):  # later passes see the ratio move away from 1 and clip
            passes = []
            for k, part in enumerate(slices):
                metrics, latest = self.engine.call(self._step, part, lr, skip, learner).result()
                new.update(latest)
                passes.append(metrics)
                if it == 0 and (learner is not None or k == 0):  # before the weights moved
                    gap = [gap[0] + metrics.get("gap_sum", 0.0), max(gap[1], metrics.get("gap_max", 0.0)),
                           gap[2] + metrics.get("gap_tokens", 0.0)]
            metrics = merge_step_metrics(passes)
        metrics = {k: v for k, v in metrics.items() if not k.startswith("gap_")}
        metrics.update(mismatch_metrics(*gap))
        for client in self.remotes:
            for name, weights in new.items():
                client.upload_adapter(name, weights)
        return metrics

    def gradients(self, turns: list[Turn]) -> tuple[dict, dict]:
        """One step's metrics and loss gradients, nothing applied (no clipping, no optimizer):
        ``{player: {module path: (dA, dB)}}`` as NumPy arrays of the player's rank. For comparing
        packings (``check-model``'s tree row) and for debugging a loss."""
        def job():
            names = sorted({t.player for t in turns})
            weights = {n: self.engine.adapter_weights(n) for n in names}
            paths = sorted({p for w in weights.values() for p in w.modules})
            rank = max(w.rank for w in weights.values())
            with self.engine.training_stacks(paths, rank) as stacks:
                metrics, _, grads = self._forward_backward(stacks, turns, names, weights, paths, rank)
            out = {n: {} for n in names}
            for p, g in (grads or {}).items():
                a, b = np.array(g["a"]), np.array(g["b"])
                for i, n in enumerate(names):
                    if p in weights[n].modules:
                        r = weights[n].modules[p][0].shape[1]
                        out[n][p] = (a[i, :, :r], b[i, :r, :])
            return metrics, out

        return self.engine.call(job).result()

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    # -------------------------------------------------------------- engine thread
    def _rows(self, turns: list[Turn], names: list[str], learner: dict | None = None) -> list[Row]:
        cfg = self.config
        index = {n: i for i, n in enumerate(names)}
        rows = []
        for name in names:
            mine = [t for t in turns if t.player == name]
            masked = [cfg.mask_truncated_completions and t.truncated for t in mine]
            weights = token_weights([len(t.completion_ids) for t in mine], masked, cfg.loss_type,
                                    cfg.max_completion_length, [t.target for t in mine])
            for t, w in zip(mine, weights):
                if t.advantage is None:
                    raise ValueError(f"turn of {name} in game {t.game_id} has no advantage; assign credit first (Credit.assign)")
                # zero weight, or zero advantage without a KL or entropy term, contributes nothing: skip it
                if w == 0 or (cfg.drop_zero_advantage and cfg.beta == 0 and not cfg.entropy_coef and t.advantage == 0):
                    continue
                rows.append(Row(index[name], list(t.prompt_ids) + list(t.completion_ids), len(t.prompt_ids),
                                 len(t.completion_ids), float(t.advantage), list(t.logprobs), w,
                                 t.target, None if learner is None else learner[id(t)], id(t)))
        return rows

    def _arrays(self, batch: list[Row]) -> dict:
        width = max(len(r.ids) for r in batch) - 1
        width = -(-width // self.width_multiple) * self.width_multiple
        t_max = max(r.n for r in batch)
        ids = np.zeros((len(batch), width), np.int32)
        pos = np.zeros((len(batch), t_max), np.int32)
        tgt = np.zeros((len(batch), t_max), np.int32)
        mask = np.zeros((len(batch), t_max), np.float32)
        old = np.zeros((len(batch), t_max), np.float32)
        for i, r in enumerate(batch):
            ids[i, : len(r.ids) - 1] = r.ids[:-1]
            pos[i, : r.n] = np.arange(r.start - 1, r.start - 1 + r.n)
            tgt[i, : r.n] = r.ids[r.start :]
            mask[i, : r.n] = 1
            old[i, : r.n] = r.old
        return {**self._learner_array(batch, t_max), "ids": mx.array(ids), "pos": mx.array(pos), "tgt": mx.array(tgt), "mask": mx.array(mask),
                "old": mx.array(old), "adv": mx.array([r.adv for r in batch], dtype=mx.float32),
                "w": mx.array(mask * np.array([[r.weight] for r in batch], np.float32)),
                "slots": mx.array([r.player for r in batch], dtype=mx.uint32),
                "fresh": mx.array([[r.fresh] for r in batch])}

    def _tree_arrays(self, batch: list[TreeChunk], rows: list[Row]) -> dict:
        """A micro-batch of tries: each trie is a batch row (tokens, depths, entry and exit indices;
        padding sees only itself), and the loss's per-row arrays read the flattened output at
        ``pick``, the token before each completion token on its row's path."""
        width = max(len(c.trie) for c in batch)
        width = -(-width // self.width_multiple) * self.width_multiple
        mine = [rows[i] for c in batch for i in c.rows]
        t_max = max(r.n for r in mine)
        ids = np.zeros((len(batch), width), np.int32)
        depth = np.zeros((len(batch), width), np.int32)
        tin = np.tile(np.arange(width, dtype=np.int32), (len(batch), 1))
        tout = tin + 1
        pick = np.zeros((len(mine), t_max), np.int32)
        tgt = np.zeros((len(mine), t_max), np.int32)
        mask = np.zeros((len(mine), t_max), np.float32)
        old = np.zeros((len(mine), t_max), np.float32)
        j = 0
        for b, c in enumerate(batch):
            n = len(c.trie)
            ids[b, :n], depth[b, :n] = c.trie.tokens, c.trie.positions
            tin[b, :n], tout[b, :n] = c.trie.tin, c.trie.tout
            pred, target, row = completion_targets(c.trie, [rows[i].start for i in c.rows])
            for k, i in enumerate(c.rows):
                sel = row == k
                r = rows[i]
                pick[j, : r.n] = b * width + pred[sel]
                tgt[j, : r.n] = target[sel]
                mask[j, : r.n] = 1
                old[j, : r.n] = r.old
                j += 1
        return {**self._learner_array(mine, t_max), "ids": mx.array(ids), "depth": mx.array(depth), "tin": mx.array(tin), "tout": mx.array(tout),
                "pick": mx.array(pick), "tgt": mx.array(tgt), "mask": mx.array(mask), "old": mx.array(old),
                "adv": mx.array([r.adv for r in mine], dtype=mx.float32),
                "w": mx.array(mask * np.array([[r.weight] for r in mine], np.float32)),
                "slots": mx.array([c.player for c in batch], dtype=mx.uint32),
                "fresh": mx.array([[r.fresh] for r in mine])}

    @staticmethod
    def _learner_array(rows: list[Row], t_max: int) -> dict:
        """``{"learner": (rows, T)}`` where the rows carry the learner's logprobs before the update."""
        if rows[0].learner is None:
            return {}
        out = np.zeros((len(rows), t_max), np.float32)
        for i, r in enumerate(rows):
            out[i, : r.n] = r.learner
        return {"learner": mx.array(out)}

    def _packing(self) -> str:
        """'tree' or 'rows': the configured packing, unless the model's family cannot be tree-packed
        exactly (said once, by name)."""
        if self.config.packing == "rows":
            return "rows"
        why = self.engine.tree_fallback()
        if why is None:
            return "tree"
        if not self._fallback_said:
            log.warning("the update packs rows one by one instead of as prefix trees: %s", why)
            self._fallback_said = True
        return "rows"

    def _learner_logprobs(self, turns: list[Turn], skip: set) -> dict:
        """``{id(turn): the learner's logprobs of its completion}`` under the current weights, no
        gradient: the sampler correction's reference when later slices or passes move the weights."""
        turns = [t for t in turns if t.player not in skip]
        names = sorted({t.player for t in turns})
        if not names:
            return {}
        weights = {n: self.engine.adapter_weights(n) for n in names}
        paths = sorted({p for w in weights.values() for p in w.modules})
        rank = max(w.rank for w in weights.values())
        params = self._stack_params(names, weights, paths, rank)
        scales = mx.array([weights[n].scale for n in names], dtype=mx.float32)[:, None, None]
        rows = self._rows(turns, names)
        out = {}
        with self.engine.training_stacks(paths, rank) as stacks:
            stacks.set({p: (params[p]["a"], params[p]["b"] * scales) for p in params}, len(names))
            for batch, order, _ in self._batches(rows):
                stacks.route(batch["slots"], sorted_entries=True)
                logp = np.array(self._logprobs(batch))
                for j, i in enumerate(order):
                    out[rows[i].key] = logp[j, : rows[i].n].tolist()
        return out

    def _logprobs(self, batch: dict, entropy: bool = False):
        if "pick" in batch:
            return self.engine.tree_logprobs(batch["ids"], batch["depth"], batch["tin"], batch["tout"], batch["pick"],
                                             batch["tgt"], self.config.temperature, entropy=entropy)
        return self.engine.token_logprobs(batch["ids"], batch["pos"], batch["tgt"], self.config.temperature,
                                          entropy=entropy)

    def _batches(self, rows: list[Row]):
        """``(arrays, the rows' indices in the arrays' order, tokens computed)`` per micro-batch:
        prefix trees (the default) or rows one by one (:meth:`_packing`)."""
        ids, players = [r.ids for r in rows], [r.player for r in rows]
        budget = self.config.max_tokens_per_microbatch
        if self._packing() == "tree" and rows:
            longest = max(len(x) for x in ids)
            plan = tree_microbatches(tree_chunks(ids, players, budget, self.engine.tree_pair_cost()), budget, longest)
            for mb in plan:
                yield self._tree_arrays(mb, rows), [i for c in mb for i in c.rows], sum(len(c.trie) for c in mb)
        else:
            for mb in row_microbatches([len(x) for x in ids], players, budget):
                yield self._arrays([rows[i] for i in mb]), mb, sum(len(rows[i].ids) - 1 for i in mb)

    def _step(self, turns: list[Turn], lr: dict, skip: set, learner: dict | None = None) -> tuple[dict, dict]:
        engine = self.engine
        turns = [t for t in turns if t.player not in skip]
        names = sorted({t.player for t in turns})
        weights = {}
        for n in names:
            try:
                weights[n] = engine.adapter_weights(n)
            except KeyError:  # UnknownPlayerError
                pass
        unknown = [n for n in names if n not in weights]
        if unknown:
            raise ValueError(f"turns of players with no adapter loaded: {unknown}")
        if not names:
            return {"players": 0, "rows": 0}, {}
        paths = sorted({p for w in weights.values() for p in w.modules})
        rank = max(w.rank for w in weights.values())
        with engine.training_stacks(paths, rank) as stacks:
            metrics, params, grads = self._forward_backward(stacks, turns, names, weights, paths, rank, learner)
        if grads is None:
            return metrics, {}
        norms = self._clip(grads)
        new = None if not (math.isfinite(metrics["loss"]) and np.isfinite(norms).all()) else \
            self._apply(names, weights, paths, params, grads, lr)
        if new is None or not all(np.isfinite(x).all() for w in new.values() for pair in w.modules.values() for x in pair):
            return self._skip_nonfinite(metrics, names, norms), {}
        self.nonfinite_in_a_row = 0
        metrics["skipped_nonfinite"] = 0
        for n in names:
            metrics[f"grad_norm/{n}"] = float(norms[names.index(n)])
            # the updater's own outputs fit the model by construction: no validation pass
            metrics[f"version/{n}"] = engine.install(n, new[n], validate=False)
        self.steps += 1
        return metrics, new

    def _skip_nonfinite(self, metrics: dict, names: list[str], norms) -> dict:
        """A step whose loss, gradients or new weights are not finite is not applied; too many in a
        row stop training (rewards far too large, or a learning rate that diverges)."""
        self.nonfinite_in_a_row += 1
        if self.nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
            raise NonFiniteUpdateError(
                f"{self.nonfinite_in_a_row} updates in a row had a non-finite loss, gradient or result (last loss "
                f"{metrics['loss']}, gradient norms {dict(zip(names, np.asarray(norms).tolist()))}); nothing was "
                f"applied. Check the rewards' scale and lower GRPOConfig.learning_rate")
        log.warning("update skipped: non-finite loss %s or gradient norms %s (%d in a row; training stops at %d)",
                    metrics["loss"], np.asarray(norms).tolist(), self.nonfinite_in_a_row, MAX_NONFINITE_IN_A_ROW)
        return {**metrics, "skipped_nonfinite": 1}

    def _forward_backward(self, stacks, turns, names, weights, paths, rank, learner: dict | None = None):
        """(metrics, the stacked parameters, their loss gradients summed over every microbatch or
        None without rows); runs inside :meth:`Engine.training_stacks`. ``learner``: the learner's
        logprobs before the update per turn (:meth:`_learner_logprobs`), else this pass's own."""
        cfg, cap = self.config, self.sampler_cap
        params = self._stack_params(names, weights, paths, rank)
        scales = mx.array([weights[n].scale for n in names], dtype=mx.float32)[:, None, None]
        rows = self._rows(turns, names, learner=learner)
        grads, totals = None, {"loss": 0.0, "tokens": 0.0, "clip": 0.0, "kl": 0.0, "entropy": 0.0}
        gap = {"abs_log_ratio_sum": 0.0, "abs_log_ratio_max": 0.0, "tokens": 0.0}

        def loss_fn(params, batch):
            # modules none of these players adapts get all-zero entries
            stacks.set({p: (params[p]["a"], params[p]["b"] * scales) for p in params}, len(names))
            stacks.route(batch["slots"], sorted_entries=True)
            out = self._logprobs(batch, entropy=bool(cfg.entropy_coef))
            logp, ent = out if cfg.entropy_coef else (out, None)
            sampler, fresh = batch["old"], batch["fresh"]
            learner_old = batch["learner"] if "learner" in batch else mx.stop_gradient(logp)
            is_w = None
            if cap is None:  # the clipped ratio against the sampler's logprobs (target turns: ratio 1)
                old = mx.where(fresh, mx.stop_gradient(logp), sampler)
            else:  # truncated importance sampling: the ratio against the learner, each token re-weighted
                old = mx.where(fresh, mx.stop_gradient(logp), learner_old)
                is_w = mx.where(fresh, 1.0, truncated_is_weights(learner_old, sampler, cap))
            loss, m = policy_loss(logp, old, batch["adv"], batch["w"], batch["mask"], cfg.epsilon,
                                  cfg.clip_high, cfg.beta, batch.get("ref"),
                                  cfg.importance_sampling_level == "sequence", entropy=ent,
                                  entropy_coef=cfg.entropy_coef, is_weights=is_w)
            sampled = batch["mask"] * (1 - fresh.astype(mx.float32))
            return loss, {**m, **{f"gap_{k}": v for k, v in mismatch_sums(learner_old, sampler, sampled).items()}}

        grad_fn = mx.value_and_grad(loss_fn)
        counts = {**token_counts([r.player for r in rows], [r.ids for r in rows]), "computed_tokens": 0,
                  "padded_tokens": 0}
        player_loss = np.zeros(len(names))
        for batch, order, computed in self._batches(rows):
            counts["padded_tokens"] += int(batch["ids"].size)
            counts["computed_tokens"] += computed
            if cfg.beta:
                stacks.route(None)  # the base model: same weights, adapter off
                batch["ref"] = mx.stop_gradient(self._logprobs(batch))
            (loss, m), g = grad_fn(params, batch)
            grads = g if grads is None else {p: {k: grads[p][k] + g[p][k] for k in ("a", "b")} for p in g}
            mx.eval(loss, m, grads)
            totals["loss"] += loss.item()
            totals["tokens"] += m["tokens"].item()
            totals["clip"] += m["clip_ratio"].item()
            totals["kl"] += m.get("kl_sum", mx.array(0.0)).item()
            totals["entropy"] += m.get("entropy_sum", mx.array(0.0)).item()
            np.add.at(player_loss, [rows[i].player for i in order], np.array(m["row_loss"]))
            gap["abs_log_ratio_sum"] += m["gap_abs_log_ratio_sum"].item()
            gap["abs_log_ratio_max"] = max(gap["abs_log_ratio_max"], m["gap_abs_log_ratio_max"].item())
            gap["tokens"] += m["gap_abs_log_ratio_tokens"].item()
        metrics = {"players": len(names), "rows": len(rows), "loss": totals["loss"], "tokens": int(totals["tokens"]),
                   "clip_ratio": totals["clip"] / max(1.0, totals["tokens"]),
                   "kl": totals["kl"] / max(1.0, totals["tokens"]) if cfg.beta else 0.0, **counts,
                   **{f"loss/{n}": float(player_loss[i]) for i, n in enumerate(names)},
                   "gap_sum": gap["abs_log_ratio_sum"], "gap_max": gap["abs_log_ratio_max"], "gap_tokens": gap["tokens"]}
        if cfg.entropy_coef:
            metrics["entropy"] = totals["entropy"] / max(1.0, totals["tokens"])
        return metrics, params, grads

    def _stack_params(self, names, weights, paths, rank) -> dict:
        params = {}
        for p in paths:
            din, dout = self.engine.linear_dims[p]
            a = np.zeros((len(names), din, rank), np.float32)
            b = np.zeros((len(names), rank, dout), np.float32)
            for i, n in enumerate(names):
                pair = weights[n].modules.get(p)
                if pair is not None:
                    r = pair[0].shape[1]
                    a[i, :, :r], b[i, :r, :] = pair
            params[p] = {"a": mx.array(a), "b": mx.array(b)}
        return params

    def _clip(self, grads: dict) -> np.ndarray:
        """Per-player global-norm clipping (torch's clip_grad_norm_ per player)."""
        sq = sum(mx.sum(mx.square(g[k]), axis=(1, 2)) for g in grads.values() for k in ("a", "b"))
        norms = mx.sqrt(sq)
        max_norm = self.config.max_grad_norm
        if max_norm:
            coef = mx.minimum(max_norm / (norms + 1e-6), 1.0)[:, None, None]
            for g in grads.values():
                g["a"], g["b"] = g["a"] * coef, g["b"] * coef
        return np.array(norms)

    def _apply(self, names, weights, paths, params, grads, lr) -> dict[str, AdapterWeights]:
        cfg = self.config
        for n in names:
            self.optim.setdefault(n, AdamWState())
        lrs = [lr.get(n, cfg.learning_rate) for n in names]
        steps = [self.optim[n].step + 1 for n in names]
        new_modules = {n: {} for n in names}
        for p in paths:
            for k, idx in (("a", 0), ("b", 2)):
                m = np.zeros(params[p][k].shape, np.float32)
                v = np.zeros(params[p][k].shape, np.float32)
                for i, n in enumerate(names):
                    st = self.optim[n].moments.get(p)
                    if st is not None:
                        sl = (i, slice(None), slice(0, st[idx].shape[1])) if k == "a" else (i, slice(0, st[idx].shape[0]))
                        m[sl], v[sl] = st[idx], st[idx + 1]
                p_new, m_new, v_new = adamw(params[p][k], grads[p][k], mx.array(m), mx.array(v), lrs, steps,
                                            cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon, cfg.weight_decay)
                mx.eval(p_new, m_new, v_new)
                p_np, m_np, v_np = np.array(p_new), np.array(m_new), np.array(v_new)
                for i, n in enumerate(names):
                    if p not in weights[n].modules:
                        continue
                    r = weights[n].modules[p][0].shape[1]
                    sl = (i, slice(None), slice(0, r)) if k == "a" else (i, slice(0, r))
                    new_modules[n].setdefault(p, [None] * 4)
                    new_modules[n][p][idx], new_modules[n][p][idx + 1] = m_np[sl].copy(), v_np[sl].copy()
                    new_modules[n].setdefault(("w", p), [None, None])[idx // 2] = p_np[sl].copy()
        out = {}
        for n in names:
            st = self.optim[n]
            st.step += 1
            st.moments = {p: tuple(v) for p, v in new_modules[n].items() if not isinstance(p, tuple)}
            mods = {p[1]: tuple(v) for p, v in new_modules[n].items() if isinstance(p, tuple)}
            out[n] = AdapterWeights(mods, weights[n].scale)
        return out
