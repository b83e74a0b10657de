"""Tic-tac-toe's strongest honest measure: the exact best response to a greedy policy, which finds
the forcing lines a minimax opponent picking uniformly among value-keeping moves rarely plays.

A *policy* is deterministic: ``fn(board, mark) -> move`` (a cell 1-9, ``None``: unparseable) or a
table ``{(board, mark): move}`` as ``greedy_table(engine, player)`` returns; an illegal or missing
move loses, as in play. *Value-losing positions*: those the policy meets against any opponent where
its move is illegal or below the position's perfect-play value (``games.tictactoe.optimal_moves``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autocurricula.eval.players import main_agent
from autocurricula.engine import SamplingParams
from autocurricula.games.tictactoe import (EMPTY_BOARD, apply_move, evaluate_table, legal_moves, optimal_moves,
                                            parse_move, reachable_positions, render_prompt, to_move, winner)

__all__ = ["BestResponse", "greedy_table", "EpochEvaluator", "adversarial_figures", "best_response", "best_response_callback", "policy_fn"]

OUTCOMES = {1: "win", 0: "draw", -1: "loss"}


def policy_fn(policy: Callable | Mapping) -> Callable[[str, str], int | None]:
    """``fn(board, mark) -> move`` from a callable or a ``{(board, mark): move}`` table."""
    if isinstance(policy, Mapping):
        table = policy

        def from_table(board: str, mark: str) -> int | None:
            if (board, mark) not in table:
                raise KeyError(f"the policy table has no move for board {board!r} with {mark} to move; "
                               "build it over every reachable position (greedy_table)")
            return table[(board, mark)]

        return from_table
    if not callable(policy):
        raise TypeError(f"a policy is fn(board, mark) -> move or a {{(board, mark): move}} table, "
                        f"got {type(policy).__name__}")
    return policy


def greedy_table(engine, player: str | None, *, max_tokens: int = 2) -> dict[tuple[str, str], int | None]:
    """The player's greedy move in every reachable position (``None`` = unparseable), decoded in
    full batches. Greedy decoding is deterministic, so this table *is* the greedy policy."""
    positions = reachable_positions()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [engine.submit(render_prompt(b, m), player, params) for b, m in positions]
    return {pos: parse_move(f.result().text) for pos, f in zip(positions, futures)}


def _legal(board: str, move) -> bool:
    return isinstance(move, int) and not isinstance(move, bool) and 1 <= move <= 9 and board[move - 1] == "."


@dataclass
class BestResponse:
    """Result of ``best_response``: the policy's worst-case outcome playing ``mark``."""

    mark: str
    value: int  # +1 win, 0 draw, -1 loss, for the policy, against the best response
    line: list[int]  # moves from the empty board (both sides) of one game reaching that outcome
    positions: int  # positions where the policy is to move, reachable under any opponent play
    value_losing: list[tuple[str, str, int | None]] = field(default_factory=list)  # (board, mark, move)

    @property
    def outcome(self) -> str:
        return OUTCOMES[self.value]

    @property
    def value_losing_share(self) -> float:
        return len(self.value_losing) / self.positions if self.positions else 0.0


def best_response(policy: Callable | Mapping, mark: str) -> BestResponse:
    """Exact best response to ``policy`` playing ``mark`` ("X" moves first): the policy's worst case
    ("win", "draw", "loss"), the line that forces it, and its value-losing positions."""
    if mark not in ("X", "O"):
        raise ValueError(f"mark must be 'X' or 'O', got {mark!r}")
    move_of = policy_fn(policy)
    memo: dict[str, tuple[int, int, int | None]] = {}  # board -> (value, plies left, best move)
    losing: list[tuple[str, str, int | None]] = []

    def search(board: str) -> tuple[int, int, int | None]:
        if board in memo:
            return memo[board]
        w = winner(board)
        if w is not None:
            memo[board] = (0 if w == "draw" else 1 if w == mark else -1, 0, None)
            return memo[board]
        if to_move(board) == mark:
            move = move_of(board, mark)
            if not _legal(board, move):
                losing.append((board, mark, move))
                memo[board] = (-1, 1, move)
                return memo[board]
            if move not in optimal_moves(board, mark):
                losing.append((board, mark, move))
            value, plies, _ = search(apply_move(board, move, mark))
            memo[board] = (value, plies + 1, move)
            return memo[board]
        best = None
        for move in legal_moves(board):
            value, plies, _ = search(apply_move(board, move, to_move(board)))
            # the opponent wants the lowest value; with it, a win as soon as possible, a loss as late
            key = (value, plies if value <= 0 else -plies)
            if best is None or key < best[0]:
                best = (key, value, plies + 1, move)
        memo[board] = best[1:]
        return memo[board]

    value = search(EMPTY_BOARD)[0]
    line, board = [], EMPTY_BOARD
    while winner(board) is None:
        move = memo[board][2]
        line.append(move)
        if not _legal(board, move):
            break
        board = apply_move(board, move, to_move(board))
    positions = sum(1 for b in memo if winner(b) is None and to_move(b) == mark)
    return BestResponse(mark, value, line, positions, sorted(losing, key=lambda r: r[0]))


def adversarial_figures(policy: Callable | Mapping) -> dict:
    """JSON-ready :func:`best_response` figures as X and as O, ``value_losing_share`` pooled and per side."""
    out: dict = {}
    sides = {m: best_response(policy, m) for m in ("X", "O")}
    for m, br in sides.items():
        s = m.lower()
        out[f"worst_case_as_{s}"] = br.outcome
        out[f"loses_to_best_response_as_{s}"] = br.value < 0
        out[f"best_response_line_as_{s}"] = br.line
        out[f"value_losing_share_as_{s}"] = br.value_losing_share
    positions = sum(br.positions for br in sides.values())
    out["value_losing_share"] = sum(len(br.value_losing) for br in sides.values()) / max(positions, 1)
    return out


def best_response_callback(player: str | Callable | None = None, *, prefix: str = "eval/",
                           max_tokens: int = 2) -> Callable:
    """A ``train(..., callbacks=[...])`` callback: each epoch, ``player``'s greedy policy (an id,
    ``fn(trainer) -> id``, default the top-Elo trainable main agent) met by its exact best response.
    Returns ``{prefix}loses_to_best_response_as_x/o`` (1/0), ``..._worst_case_value_as_x/o`` (+1/0/-1)
    and ``..._value_losing_share``."""

    def callback(trainer) -> dict:
        pid = player(trainer) if callable(player) else player or main_agent(trainer)
        table = greedy_table(trainer.engine, pid, max_tokens=max_tokens)
        sides = [best_response(table, m) for m in ("X", "O")]
        out = {}
        for br in sides:
            out[f"{prefix}loses_to_best_response_as_{br.mark.lower()}"] = float(br.value < 0)
            out[f"{prefix}worst_case_value_as_{br.mark.lower()}"] = float(br.value)
        losing, positions = sum(len(br.value_losing) for br in sides), sum(br.positions for br in sides)
        out[f"{prefix}value_losing_share"] = losing / max(positions, 1)
        return out

    return callback


class EpochEvaluator:
    """A ``train(..., callbacks=[...])`` callback: each epoch, the top-Elo main agent's greedy policy
    against random and minimax (``games`` each), over all reachable positions, and against its best
    response; one JSON row printed per epoch, ``eval/*`` metrics, ``summary()`` for a final report."""

    SUMMARY_KEYS = ("vs_random", "vs_minimax_draw_or_win", "optimal_move_rate", "legal_move_rate", "win_now_rate",
                    "block_rate", "loses_to_best_response_as_x", "loses_to_best_response_as_o", "value_losing_share")

    def __init__(self, games: int = 2000, *, printer: Callable | None = print):
        self.games, self.printer, self.start, self.rows = games, printer, time.time(), []

    def __call__(self, trainer) -> dict:
        player = main_agent(trainer)
        table = greedy_table(trainer.engine, player)
        figures = evaluate_table(table, games=self.games)
        adversarial = adversarial_figures(table)
        losses = {k: adversarial[k] for k in ("loses_to_best_response_as_x", "loses_to_best_response_as_o")}
        row = {"epoch": trainer.current_epoch, "minutes": round((time.time() - self.start) / 60, 2), "player": player,
               **{k: round(v, 3) for k, v in figures.items()}, **losses,
               "value_losing_share": round(adversarial["value_losing_share"], 4)}
        self.rows.append(row)
        if self.printer is not None:
            self.printer(json.dumps(row), flush=True)
        return {**{f"eval/{k}": v for k, v in figures.items()}, **{f"eval/{k}": float(v) for k, v in losses.items()},
                "eval/value_losing_share": adversarial["value_losing_share"]}

    def summary(self, trainer, base_figures: dict | None = None) -> dict:
        """The last epoch's figures, the run's minutes and the peak against random."""
        if not self.rows:
            raise ValueError("no epoch was evaluated: pass the evaluator in train(..., callbacks=[evaluator])")
        last = self.rows[-1]
        peak = max(self.rows, key=lambda r: r["vs_random"])
        return {**{k: last[k] for k in self.SUMMARY_KEYS}, "epochs": trainer.config.epochs,
                "minutes": round((time.time() - self.start) / 60, 2), "best_player": last["player"],
                "warm_base": base_figures, "peak_vs_random": peak["vs_random"], "peak_epoch": peak["epoch"]}
