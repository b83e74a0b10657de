"""The update's log-probabilities apply the LM head only at the completion positions: at a real
vocabulary (151,936 rows for Qwen2.5) the head at every position would dominate the step."""

import mlx.core as mx
import numpy as np

from autocurricula.engine.logprobs import completion_logprobs


class _Model:
    """An mlx-lm-shaped model: ``model`` the body (hidden states), ``lm_head`` the head."""

    def __init__(self, vocab=11, hidden=4, seed=0):
        rng = np.random.default_rng(seed)
        self.emb = mx.array(rng.standard_normal((vocab, hidden)).astype(np.float32))
        self.w = mx.array(rng.standard_normal((hidden, vocab)).astype(np.float32))
        self.head_rows = []
        self.model = lambda ids: self.emb[ids]

    def lm_head(self, h):
        self.head_rows.append(h.shape[:-1])
        return h @ self.w

    def __call__(self, ids):  # the full forward: head at every position
        return self.lm_head(self.model(ids))


def test_head_only_at_completion_positions_and_same_values_as_the_full_forward():
    m = _Model()
    ids = mx.array([[1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9]])
    pos = mx.array([[5, 6], [6, 7]])
    tgt = mx.array([[6, 7], [8, 9]])
    logp = completion_logprobs(m, ids, pos, tgt, 0.7)
    assert m.head_rows == [(2, 2)]  # 4 positions, not 16
    full = np.array(m(ids)) / 0.7
    lse = np.log(np.exp(full).sum(-1))
    want = np.array([[full[r, p, t] - lse[r, p] for p, t in zip(np.array(pos[r]), np.array(tgt[r]))] for r in range(2)])
    np.testing.assert_allclose(np.array(logp), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
