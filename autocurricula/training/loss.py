"""The clipped policy-gradient loss of GRPO and its variants, as trl computes it, in MLX.

Per token: ``ratio = exp(logp - old_logp)`` (or, with ``importance_sampling_level="sequence"``,
GSPO's length-normalised sequence ratio, arXiv 2507.18071), ``loss = -min(ratio * A,
clip(ratio, 1 - eps, 1 + eps_high) * A)`` plus ``beta * KL`` with trl's k3 estimator
``exp(ref - logp) - (ref - logp) - 1``. The loss-type normalisations (grpo, bnpo, dr_grpo, dapo)
are folded into per-token weights (``token_weights``) computed once per player over its whole
batch, so splitting a batch into micro-batches, or many players into one fused pass, gives the
same gradients as one pass per player.

When another program samples the turns (vLLM), its logprobs and the update's differ for the same
weights (kernels, precision, sampling settings). :func:`truncated_is_weights` is the truncated
importance sampling (TIS) correction of Yao, Liu et al., "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training" (2025): each token's policy-gradient term is multiplied by
``min(pi_learner_old / pi_sampler, C)``, where ``pi_learner_old`` is the learner's probability of
the token before the update (and the clipped PPO ratio is taken against it, not against the
sampler's). :func:`mismatch_sums` measures the gap (absolute log-ratio per token).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def token_weights(lengths: list[int], masked: list[bool], loss_type: str, max_completion_length: int,
                  targets: list[bool] | None = None) -> list[float]:
    """Weight of each token of each sequence (one value per sequence: all its tokens share it).

    ``masked`` sequences (e.g. truncated ones under ``mask_truncated_completions``) get 0 but still
    count where trl counts them (grpo and dr_grpo average over all rows). ``targets`` marks target
    turns, rows a credit built for whole moves rather than samples (a cross-entropy target per listed
    move, residuals, a best move): under "grpo" they share the mean length of the live target rows in
    place of their own. Divided by its own token count, a cross-entropy target would be fitted at its
    odds times the inverse length ratio (Kuhn poker's "call", 3 tokens with the end token, at 4/3 of
    its target odds against "fold", 4). The other loss types weigh every row alike already.
    """
    if targets is not None and len(targets) != len(lengths):
        raise ValueError(f"one target flag per sequence: {len(targets)} flags for {len(lengths)} sequences")
    n_seq = len(lengths)
    live_tokens = sum(n for n, m in zip(lengths, masked) if not m)
    targets = targets or [False] * n_seq
    target_lengths = [n for n, m, t in zip(lengths, masked, targets) if t and not m and n]
    target_length = sum(target_lengths) / len(target_lengths) if target_lengths else 0.0
    out = []
    for n, m, t in zip(lengths, masked, targets):
        if m or n == 0:
            out.append(0.0)
        elif loss_type == "grpo":
            out.append(1.0 / (n_seq * (target_length if t else n)))
        elif loss_type in ("bnpo", "dapo"):
            out.append(1.0 / max(1, live_tokens))
        elif loss_type == "dr_grpo":
            out.append(1.0 / (n_seq * max_completion_length))
        else:
            raise ValueError(f"unknown loss_type {loss_type!r}")
    return out


def truncated_is_weights(learner_logp: mx.array, sampler_logp: mx.array, cap: float) -> mx.array:
    """The TIS weight of each token (Yao, Liu et al., 2025, see the module docstring):
    ``min(exp(learner_logp - sampler_logp), cap)``, with no gradient. ``learner_logp``: the
    learner's logprobs of the sampled tokens before the update (the first pass's, or one no-grad
    forward when later passes or slices have moved the weights); ``sampler_logp``: the sampler's
    (``Turn.logprobs``). Padding positions get whatever their inputs give: the loss masks them."""
    if not (isinstance(cap, (int, float)) and cap > 0):
        raise ValueError(f"the importance-sampling cap must be a number > 0, got {cap!r}")
    log_ratio = mx.stop_gradient(learner_logp) - mx.stop_gradient(sampler_logp)
    return mx.minimum(mx.exp(log_ratio), float(cap))


def mismatch_sums(learner_logp: mx.array, sampler_logp: mx.array, mask: mx.array) -> dict:
    """The sampler/learner gap over the masked tokens, in sums that add up over micro-batches:
    ``{"abs_log_ratio_sum", "abs_log_ratio_max", "abs_log_ratio_tokens"}`` (``|learner - sampler|``
    per token; ``mask`` 0 on padding and on turns no sampler made, such as a credit's targets).
    :func:`mismatch_metrics` turns the totals into a round's metrics."""
    gap = mx.abs(mx.stop_gradient(learner_logp) - mx.stop_gradient(sampler_logp)) * mask
    return {"abs_log_ratio_sum": gap.sum(), "abs_log_ratio_max": gap.max(), "abs_log_ratio_tokens": mask.sum()}


MISMATCH_KEYS = ("mismatch/mean_abs_log_ratio", "mismatch/max_abs_log_ratio")


def mismatch_metrics(abs_sum: float, abs_max: float, tokens: float) -> dict:
    """The round's metrics from the summed :func:`mismatch_sums`: the mean and the maximum absolute
    sampler/learner log-ratio per token (``MISMATCH_KEYS``); empty without tokens."""
    if not tokens:
        return {}
    return {MISMATCH_KEYS[0]: float(abs_sum) / float(tokens), MISMATCH_KEYS[1]: float(abs_max)}


def policy_loss(logp: mx.array, old_logp: mx.array, adv: mx.array, weights: mx.array, mask: mx.array,
                epsilon: float, epsilon_high: float, beta: float = 0.0, ref_logp: mx.array | None = None,
                sequence_level: bool = False, entropy: mx.array | None = None,
                entropy_coef: float = 0.0, is_weights: mx.array | None = None) -> tuple[mx.array, dict]:
    """Weighted clipped loss over (rows, T) token arrays; ``adv`` is (rows,), ``weights`` (rows, T)
    already include the mask and the loss-type normalisation; ``entropy`` (rows, T) with
    ``entropy_coef`` subtracts an entropy bonus per token. ``is_weights`` (rows, T), e.g.
    :func:`truncated_is_weights`, multiply each token's clipped policy-gradient term (not the KL
    or entropy terms); with them, ``old_logp`` is the learner's own before the update. Returns
    (loss, metrics)."""
    log_ratio = logp - old_logp
    if sequence_level:
        n = mx.maximum(mask.sum(axis=-1, keepdims=True), 1.0)
        log_ratio = (log_ratio * mask).sum(axis=-1, keepdims=True) / n
    coef_1 = mx.exp(log_ratio)
    coef_2 = mx.clip(coef_1, 1 - epsilon, 1 + epsilon_high)
    a = adv[:, None]
    per_token = -mx.minimum(coef_1 * a, coef_2 * a)
    if is_weights is not None:
        per_token = per_token * mx.stop_gradient(is_weights)
    kl = None
    if beta:
        d = ref_logp - logp
        kl = mx.exp(d) - d - 1
        per_token = per_token + beta * kl
    if entropy is not None and entropy_coef:
        per_token = per_token - entropy_coef * entropy
    loss = (per_token * weights).sum()
    clipped = ((coef_1 < 1 - epsilon) & (a < 0)) | ((coef_1 > 1 + epsilon_high) & (a > 0))
    metrics = {"clip_ratio": (clipped * mask).sum(), "tokens": mask.sum(),
               "row_loss": mx.stop_gradient(per_token * weights).sum(axis=-1)}  # each row's share of the loss
    if kl is not None:
        metrics["kl_sum"] = (kl * mask).sum()
    if entropy is not None:
        metrics["entropy_sum"] = (mx.stop_gradient(entropy) * mask).sum()
    return loss, metrics


def policy_loss_reference(logp, old_logp, adv, mask, lengths_mask_type, epsilon, epsilon_high, beta=0.0,
                          ref_logp=None, sequence_level=False, max_completion_length=None, is_weights=None) -> float:
    """NumPy transcription of trl's ``compute_loss`` for one player's batch (tests compare to it);
    ``is_weights`` multiply the clipped term per token, as trl's vLLM importance-sampling correction."""
    logp, old_logp, mask = np.asarray(logp, np.float64), np.asarray(old_logp, np.float64), np.asarray(mask, np.float64)
    adv = np.asarray(adv, np.float64)[:, None]
    log_ratio = logp - old_logp
    if sequence_level:
        log_ratio = ((log_ratio * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0))[:, None]
    coef_1 = np.exp(log_ratio)
    coef_2 = np.clip(coef_1, 1 - epsilon, 1 + epsilon_high)
    ptl = -np.minimum(coef_1 * adv, coef_2 * adv)
    if is_weights is not None:
        ptl = ptl * np.asarray(is_weights, np.float64)
    if beta:
        d = np.asarray(ref_logp, np.float64) - logp
        ptl = ptl + beta * (np.exp(d) - d - 1)
    ptl = np.broadcast_to(ptl, mask.shape)
    if lengths_mask_type == "grpo":
        return float(((ptl * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0)).mean())
    if lengths_mask_type in ("bnpo", "dapo"):
        return float((ptl * mask).sum() / max(mask.sum(), 1.0))
    if lengths_mask_type == "dr_grpo":
        return float((ptl * mask).sum() / (mask.shape[0] * max_completion_length))
    raise ValueError(lengths_mask_type)
