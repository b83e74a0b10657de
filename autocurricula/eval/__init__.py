"""Adversarial evaluation: each game's strongest honest measure, and the league's meta-strategy.

* ``autocurricula.eval.tictactoe``: the exact best response to a player's greedy policy (worst case
  as X and as O, value-losing positions) and a per-epoch callback.
* ``autocurricula.eval.kuhn``: Kuhn poker exploitability (OpenSpiel, or exact pure Python), the
  information-state mapping, a policy read off the model's token probabilities, mixtures of
  policies, and a per-epoch callback.
* ``autocurricula.eval.meta``: the Nash mixture over a league's payoff matrix (exact LP) and
  replicator dynamics.
"""

from autocurricula.eval import kuhn, meta, tictactoe
from autocurricula.eval.kuhn import exploitability, exploitability_callback, mixture_strategy, read_strategy
from autocurricula.eval.meta import nash_mixture, replicator_dynamics, zero_sum_nash
from autocurricula.eval.tictactoe import adversarial_figures, best_response, best_response_callback

__all__ = ["adversarial_figures", "best_response", "best_response_callback", "exploitability",
           "exploitability_callback", "kuhn", "meta", "mixture_strategy", "nash_mixture", "read_strategy",
           "replicator_dynamics", "tictactoe", "zero_sum_nash"]
