"""Which league player an evaluation callback scores by default."""

from __future__ import annotations

from autocurricula.records import is_scripted

__all__ = ["main_agent"]


def main_agent(trainer) -> str:
    """Id of the trainable main agent with the highest Elo (else the best-rated model player)."""
    learners = [p for p in trainer.players if not is_scripted(p)]
    if not learners:
        raise ValueError("the league has no model player to evaluate; add a learner or pass player=")
    return max(learners, key=lambda p: (not p.frozen and p.role in ("main_agent", "main"),
                                        trainer.standings.elo.rating(p.id))).id
