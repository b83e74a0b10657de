"""Adversarial evaluation: each game's strongest honest measure, and the league's meta-strategy.

* ``autocurricula.eval.tictactoe``: the exact best response to a player's greedy policy (worst case
  as X and as O, value-losing positions) and a per-epoch callback.
* ``autocurricula.eval.kuhn``: Kuhn poker exploitability (OpenSpiel, or exact pure Python), the
  information-state mapping, a policy read off the model's token probabilities, mixtures of
  policies, and a per-epoch callback.
* ``autocurricula.eval.meta``: the Nash mixture over a league's payoff matrix (exact LP) and
  replicator dynamics.
"""

import importlib

_LAZY = {
    "exploitability": "autocurricula.eval.kuhn", "exploitability_callback": "autocurricula.eval.kuhn",
    "mixture_strategy": "autocurricula.eval.kuhn", "read_strategy": "autocurricula.eval.kuhn",
    "nash_mixture": "autocurricula.eval.meta", "replicator_dynamics": "autocurricula.eval.meta",
    "zero_sum_nash": "autocurricula.eval.meta",
    "adversarial_figures": "autocurricula.eval.tictactoe", "best_response": "autocurricula.eval.tictactoe",
    "best_response_callback": "autocurricula.eval.tictactoe",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    # lazy, so the ratings can use eval.meta (numpy) without loading the evaluators' mlx
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
