"""Log-probabilities of completion tokens under a model: the one computation that sampling's
logprobs, branch scoring and the policy update must agree on, so the engine owns it."""

from __future__ import annotations

import inspect

import mlx.core as mx

from autocurricula.engine.models.tree import TreeCache

__all__ = ["completion_logprobs", "tree_logprobs"]


def _body_and_head(model):
    """(hidden-state function, LM head) for mlx-lm models, so logits are computed only at
    completion positions; ``None`` falls back to the full forward."""
    inner = getattr(model, "model", None)
    if inner is None or not callable(inner):
        return None
    body = _without_cache(inner)
    if getattr(model, "lm_head", None) is not None:
        return body, model.lm_head
    embed = getattr(inner, "embed_tokens", None)
    if embed is not None and hasattr(embed, "as_linear"):
        return body, embed.as_linear
    return None


def _without_cache(inner):
    """``inner`` called on the tokens alone: some mlx-lm bodies (StableLM, Phi-2, RWKV-7) take
    ``cache`` as a required argument, which their ``Model`` passes (None here: no cache)."""
    try:
        params = list(inspect.signature(inner.__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        return inner
    if any(p.name == "cache" and p.default is p.empty for p in params):
        return lambda ids: inner(ids, cache=None)
    return inner


def completion_logprobs(model, ids: mx.array, pos: mx.array, tgt: mx.array, temperature: float,
                        entropy: bool = False):
    """Log-probabilities (rows, T) of tokens ``tgt`` predicted from positions ``pos`` of ``ids``;
    with ``entropy``, also the entropy (rows, T) of each predicted distribution."""
    split = _body_and_head(model)
    if split is None:
        logits = mx.take_along_axis(model(ids), pos[..., None], axis=1)
    else:
        body, head = split
        hidden = mx.take_along_axis(body(ids), pos[..., None], axis=1)
        logits = head(hidden)
    return _from_logits(logits, tgt, temperature, entropy)


def tree_logprobs(model, ids: mx.array, positions: mx.array, tin: mx.array, tout: mx.array, pick: mx.array,
                  tgt: mx.array, temperature: float, entropy: bool = False):
    """The same as :func:`completion_logprobs` for rows packed as prefix trees: ``ids``,
    ``positions``, ``tin``, ``tout`` (trees, N) are each tree's tokens, their depths and their
    depth-first entry and exit indices; ``pick`` (rows, T) indexes the flattened (trees x N) output
    at the token that predicts each ``tgt``. One forward of every tree, each token computed once."""
    caches = [TreeCache(positions, tin, tout)] * len(model.layers)
    split = _body_and_head(model)
    if split is None:
        out = model(ids, cache=caches)
        logits = out.reshape(-1, out.shape[-1])[pick]
    else:
        hidden = model.model(ids, cache=caches)
        logits = split[1](hidden.reshape(-1, hidden.shape[-1])[pick])
    return _from_logits(logits, tgt, temperature, entropy)


def _from_logits(logits: mx.array, tgt: mx.array, temperature: float, entropy: bool):
    logits = logits.astype(mx.float32) / temperature
    lse = mx.logsumexp(logits, axis=-1)
    logp = mx.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0] - lse
    if not entropy:
        return logp
    log_probs = logits - lse[..., None]
    return logp, -(mx.exp(log_probs) * log_probs).sum(axis=-1)
