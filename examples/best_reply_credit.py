"""Best-reply branch credit: a research variant of ``BranchCredit(advantage="moves")`` for the pure
tic-tac-toe league (``examples/tictactoe_league.py --pure --credit branch --branch-replies ...``).

Three options on top of the core method, each through one of its hooks:

- ``continuation_temperature`` samples the branches' own calls (the players', not judges') at
  another temperature; at 0 they are greedy, so in a game without chance one branch per move gives
  the exact value of greedy play after it, and the regression's fixed point is then minimax play
  wherever states are visited (backward induction: once the greedy policy is right after a state,
  the values at that state are the minimax values).
- ``replies=True`` searches one ply further: the next seated call after each move is answered with
  every move the game lists for it, and the replier keeps the replies best for its own seat, so a
  move that leaves the opponent a win or a fork is valued as such even while the players' own
  continuation would miss it. It assumes perfect information (the replier picks knowing the whole
  branch). Cost: about as many games per move as the replier has moves.
- ``move_loss="cross_entropy"``: each move's advantage is its target probability ``softmax(y)_m``
  (``move_distribution``) instead of the residual: the update is then the cross-entropy toward that
  target, with the same fixed point (the update weighs every move's row alike whatever its token
  count, under every ``loss_type``: ``autocurricula.training.loss.token_weights``), and it also
  raises the listed moves' total probability, which the
  residuals (they sum to zero) leave free to drift toward replies that are none of the moves.

Mirror-descent steps toward the cross-entropy target are the core ``MirrorCredit`` (``credit="mirror"``);
the TD advantage, catch-up steps and a table of move values are in ``examples/credit_variants.py``.

Importing this module registers it as ``credit="best_reply"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autocurricula.credit import (BranchCredit, branch_value, check_replays, game_moves, listed_moves,
                                  move_distribution, register_credit)

MOVE_LOSSES = ("residual", "cross_entropy")


@dataclass
class BestReplyCredit(BranchCredit):
    """:class:`~autocurricula.credit.BranchCredit` with greedy or tempered continuations
    (``continuation_temperature``; None = as the game asks), a one-ply reply search (``replies``,
    needs ``advantage="moves"``) and the cross-entropy move loss (``move_loss``)."""

    continuation_temperature: float | None = None
    replies: bool = False
    move_loss: str = "residual"
    name = "best_reply"

    def __post_init__(self):
        super().__post_init__()
        t = self.continuation_temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0):
            raise ValueError(f"continuation_temperature must be None (the game's sampling) or a finite number >= 0 "
                             f"(0 = greedy continuations), got {t!r}")
        if self.move_loss not in MOVE_LOSSES:
            raise ValueError(f"move_loss must be one of {MOVE_LOSSES}, got {self.move_loss!r}")
        if (self.replies or self.move_loss != "residual") and self.advantage != "moves":
            raise ValueError("replies and move_loss shape the listed moves' values and targets: they need "
                             "advantage='moves' (or leave replies=False, move_loss='residual')")

    def branch_temperature(self) -> float | None:
        return self.continuation_temperature

    def scores_moves(self) -> bool:
        return self.move_loss == "residual"  # the residuals need log pi; the cross-entropy target does not

    def move_targets(self, values, logprobs, state=None):
        if self.move_loss == "residual":
            return super().move_targets(values, logprobs, state)
        return move_distribution(values, self.move_temperature, self.move_clip)

    def branch_moves(self, asked, replayer, tok):
        if not self.replies:
            return super().branch_moves(asked, replayer, tok)
        branches = replayer.branch_moves(asked, self.samples, temperature=self.continuation_temperature,
                                         log=True) if asked else []
        games = [b for per in branches for bs in per for b in bs]
        check_replays(games)
        branches, reply_games, reply_errors = self._search_replies(asked, branches, replayer, tok)
        counts = {"credit/branch_games": len(games) + reply_games, "credit/reply_games": reply_games}
        return branches, counts, sum(b.error is not None for b in games) + reply_errors

    def _search_replies(self, asked, branches, replayer, tok) -> tuple[list, int, int]:
        """The next seated call after each move (at the move's level) is answered with every reply the
        game lists for it, in K branches each, from the move's first branch; the replier keeps the
        replies best for its own seat (their branches together stand in for the move's). Returns the
        new branches per move, and the number of reply games played and failed."""
        requests, where = [], []  # (branch game, reply position, replies); (request, move, replier's seat)
        moves_of = game_moves(replayer.play)
        for i, (rec, p, _) in enumerate(asked):
            level = rec.calls[p].key[0]
            for j, games in enumerate(branches[i]):
                first = games[0]
                if first.error is not None or first.calls is None:
                    continue
                q = next((k for k in range(p + 1, len(first.calls))
                          if first.calls[k].seat >= 0 and first.calls[k].key[0] == level), None)
                if q is None:
                    continue  # the game ended after the move: its branches stand
                replies = listed_moves(first.calls[q], moves_of, tok)
                if replies:
                    requests.append((first, q, replies))
                    where.append((i, j, first.calls[q].seat))
        out = replayer.branch_moves(requests, self.samples, tag="r", temperature=self.continuation_temperature) \
            if requests else []
        check_replays([b for per in out for bs in per for b in bs])
        searched = [list(per) for per in branches]
        for (i, j, seat), per_reply in zip(where, out):
            scores = [branch_value([g.rewards[seat] for g in games if g.error is None]) for games in per_reply]
            if all(v is None for v in scores):
                continue
            best = max(v for v in scores if v is not None)
            searched[i][j] = [g for v, games in zip(scores, per_reply) if v == best for g in games]
        return (searched, sum(len(games) for per in out for games in per),
                sum(g.error is not None for per in out for games in per for g in games))


register_credit("best_reply", BestReplyCredit)
