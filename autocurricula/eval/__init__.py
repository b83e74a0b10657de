"""Adversarial evaluation: each game's strongest honest measure (exact best responses in
:mod:`.tictactoe`, exploitability in :mod:`.kuhn`, :mod:`.leduc`, :mod:`.matrix`) and the league's
meta-strategy (:mod:`.meta`)."""

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
