"""Tic-tac-toe between two players, as in SPIRAL (Liu et al., arXiv 2506.24119), with a compact prompt.

Rules: the standard 3x3 game. ``players[0]`` is X and moves first, ``players[1]`` is O. Cells are
numbered 1-9 row-major; a reply's move is its first digit 1-9. Three in a row wins (+1 / -1), a full
board without a line is a draw (0 / 0). A reply without a digit 1-9 or naming an occupied cell is an
invalid move: the offender gets ``invalid_penalty[0]`` (default -1.5), the other player
``invalid_penalty[1]`` (default +0.5), and the game ends.

Boards are 9-character strings, ``"."`` for an empty cell, e.g. ``"X.O.X...O"``. The prompt shows
each free cell as its number, so the legal moves are written on the board::

    X2O
    4X6
    78O
    you are O, move:

Why this shape: a llama knows positions only through RoPE, so a token's value says *what* it is, not
*where*; a numbered free cell carries its location in its value. The prompt is short because
attention cost grows with its square (19 tokens here).

The perfect-play helpers (``minimax_values``, ``optimal_moves``) are memoised over all positions.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from collections.abc import Callable
from typing import Any

from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, PromptStyle, TurnGame, answer_moves, check_penalty,
                                         check_players, choice, drive, drive_sync, make_rng)
from autocurricula.games._common import with_options as _with_options
from autocurricula.records import GameFacts

__all__ = ["FACTS", "EMPTY_BOARD", "NUM_PLAYERS", "ZERO_SUM", "TicTacToe", "apply_move", "legal_moves", "minimax_policy",
           "minimax_value", "minimax_values", "moves", "optimal_moves", "parse_move", "parse_prompt", "play",
           "play_out", "random_opening", "random_policy", "reachable_positions", "render_prompt", "tactic", "to_move",
           "winner", "with_options"]

NUM_PLAYERS = 2
ZERO_SUM = True
# win +1, draw 0, loss -1; the board is the whole state; random openings (opening_moves) are off by default
FACTS = GameFacts(2, "zero_sum", "perfect", "sequential", chance=False, payoff_range=(-1.0, 1.0))
EMPTY_BOARD = "." * 9
MARKS = ("X", "O")
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
RULES = ("You are playing tic-tac-toe on a 3x3 board. X moves first; three in a row wins. The board shows "
         "each free cell as its number 1-9; your move is the number of a free cell.")
_PROMPT_RE = re.compile(r"([XO1-9]{3})\n([XO1-9]{3})\n([XO1-9]{3})\nyou are ([XO]), move:")


def _check_board(board: str) -> str:
    if len(board) != 9 or set(board) - {"X", "O", "."}:
        raise ValueError(f"a board is 9 characters of 'X', 'O' and '.', got {board!r}")
    return board


def other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def legal_moves(board: str) -> list[int]:
    """Empty cells, numbered 1-9 (empty once the game is over)."""
    _check_board(board)
    if winner(board) is not None:
        return []
    return [i + 1 for i, c in enumerate(board) if c == "."]


def winner(board: str) -> str | None:
    """"X" or "O" for three in a row, "draw" for a full board without one, None while in play."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if "." not in board else None


def to_move(board: str) -> str:
    """The mark to move in a position reached by alternating play with X first."""
    return "X" if board.count("X") == board.count("O") else "O"


def apply_move(board: str, move: int, mark: str) -> str:
    if not 1 <= move <= 9 or board[move - 1] != ".":
        raise ValueError(f"cell {move} is not free on {board!r}")
    return board[:move - 1] + mark + board[move:]


def render_prompt(board: str, mark: str) -> str:
    """The prompt for ``mark`` to move on ``board``: the rows with free cells as their numbers."""
    cells = "".join(c if c != "." else str(i + 1) for i, c in enumerate(_check_board(board)))
    return f"{cells[0:3]}\n{cells[3:6]}\n{cells[6:9]}\nyou are {mark}, move:"


def parse_prompt(prompt: str) -> tuple[str, str]:
    """(board, mark) back from a prompt made by ``render_prompt`` (the last one in the text)."""
    found = _PROMPT_RE.findall(prompt)
    if not found:
        raise ValueError("not a tic-tac-toe prompt (no board found)")
    *rows, mark = found[-1]
    cells = "".join(rows)
    if any(c.isdigit() and c != str(i + 1) for i, c in enumerate(cells)):
        raise ValueError(f"not a tic-tac-toe board: free cell numbers out of place in {cells!r}")
    return "".join("." if c.isdigit() else c for c in cells), mark


def parse_move(text: str) -> int | None:
    """The first digit 1-9 in the reply, or None."""
    m = re.search(r"[1-9]", text)
    return int(m.group()) if m else None


@cache
def minimax_value(board: str, mark: str) -> int:
    """Perfect-play value of ``board`` for ``mark`` to move: +1 win, 0 draw, -1 loss."""
    w = winner(board)
    if w == "draw":
        return 0
    if w is not None:
        return 1 if w == mark else -1
    return max(-minimax_value(apply_move(board, m, mark), other(mark)) for m in legal_moves(board))


def minimax_values(board: str, mark: str) -> dict[int, int]:
    """Perfect-play value for ``mark`` of each legal move."""
    return {m: -minimax_value(apply_move(board, m, mark), other(mark)) for m in legal_moves(board)}


@cache
def _optimal(board: str, mark: str) -> frozenset[int]:
    values = minimax_values(board, mark)
    best = max(values.values())
    return frozenset(m for m, v in values.items() if v == best)


def optimal_moves(board: str, mark: str) -> set[int]:
    """Moves that keep the best perfect-play value (empty for a finished board)."""
    _check_board(board)
    return set(_optimal(board, mark)) if legal_moves(board) else set()


def reachable_positions() -> list[tuple[str, str]]:
    """Every non-terminal (board, mark to move) reachable from the empty board, X first (4,520)."""
    seen: set[str] = set()
    stack = [EMPTY_BOARD]
    while stack:
        board = stack.pop()
        if board in seen or winner(board) is not None:
            continue
        seen.add(board)
        mark = to_move(board)
        stack.extend(apply_move(board, m, mark) for m in legal_moves(board))
    return sorted((b, to_move(b)) for b in seen)


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player: a uniformly random legal move."""
    board, _ = parse_prompt(prompt)
    return str(choice(rng, legal_moves(board)))


def minimax_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player: perfect play, uniform among the optimal moves."""
    board, mark = parse_prompt(prompt)
    return str(choice(rng, sorted(optimal_moves(board, mark))))


class TicTacToe(TurnGame):
    def __init__(self, board: str = EMPTY_BOARD):
        super().__init__()
        self.board = _check_board(board)
        self.moves: list[int] = []
        self.to_move = MARKS.index(to_move(board))
        self.done = winner(board) is not None

    @property
    def mark(self) -> str:
        return MARKS[self.to_move]

    def prompt(self) -> str:
        return render_prompt(self.board, self.mark)

    def step(self, reply: str) -> None:
        move = parse_move(reply)
        if move is None or self.board[move - 1] != ".":
            return self.mark_invalid()
        self.board = apply_move(self.board, move, self.mark)
        self.moves.append(move)
        if winner(self.board) is not None:
            self.done = True
        else:
            self.to_move = 1 - self.to_move

    @property
    def result(self) -> str:
        """"X", "O" or "draw"; an invalid move loses."""
        if self.invalid_by is not None:
            return MARKS[1 - self.invalid_by]
        return winner(self.board)

    def outcome(self) -> list[float]:
        w = winner(self.board)
        return [0.0, 0.0] if w == "draw" else ([1.0, -1.0] if w == "X" else [-1.0, 1.0])


def random_opening(n: int, rng) -> str:
    """``n`` uniformly random alternating moves from the empty board, never ending the game."""
    if not 0 <= n <= 8:
        raise ValueError(f"opening_moves must be in [0, 8], got {n}")
    board = EMPTY_BOARD
    for _ in range(n):
        mark = to_move(board)
        safe = [m for m in legal_moves(board) if winner(apply_move(board, m, mark)) is None]
        if not safe:
            break
        board = apply_move(board, choice(rng, safe), mark)
    return board


def play_out(policy_x: Callable, policy_o: Callable, rng: Any = None, *, opening_moves: int = 0) -> str:
    """Scripted game without a model; returns "X", "O" or "draw" (an invalid move loses)."""
    rng = make_rng(rng=rng)
    game = TicTacToe(random_opening(opening_moves, rng))
    return drive_sync(game, [policy_x, policy_o], rng).result


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=DEFAULT_INVALID_PENALTY,
               max_tokens: int = 2, temperature: float | None = None, opening_moves: int | tuple[int, int] = 0,
               seed: int | None = None, rng: Any = None, stop=None, chat: bool = False, reasoning: bool = False,
               thinking_tokens: int = 256) -> list[float]:
    """One game; ``players[0]`` is X (moves first). ``opening_moves`` random moves (an int, or a
    ``(lo, hi)`` range drawn per game) are played for them first to diversify positions; the
    randomness comes from ``rng``, else ``seed``, else the league's per-game seed (``model.seed``).
    Returns [reward X, reward O].

    ``chat=True`` sends the rules as a system message and the position as a user message through
    the model's chat template; ``reasoning=True`` lets the player think (up to ``thinking_tokens``
    tokens) before ``<answer>MOVE</answer>``, of which only the answer is parsed (see
    :class:`~autocurricula.games._common.PromptStyle`)."""
    check_players(players, 2, "tic-tac-toe")
    check_penalty(invalid_penalty)
    style = PromptStyle(chat, reasoning, thinking_tokens)
    rng = make_rng(seed if seed is not None else getattr(model, "seed", None), rng)
    if isinstance(opening_moves, (tuple, list)):
        lo, hi = opening_moves
        if not 0 <= lo <= hi <= 8:
            raise ValueError(f"opening_moves range must satisfy 0 <= lo <= hi <= 8, got {opening_moves!r}")
        opening_moves = rng.randint(lo, hi)
    game = TicTacToe(random_opening(opening_moves, rng))
    await drive(game, players, model, max_tokens=max_tokens, temperature=temperature, stop=stop, style=style,
                rules=RULES)
    return game.rewards(invalid_penalty)


def moves(prompt: str) -> list[str]:
    """The legal replies at a prompt made by ``render_prompt`` (the Game protocol's ``moves``:
    branch credit's ``advantage="moves"`` branches each of them), in answer tags when the prompt
    asks for the reasoning format."""
    return answer_moves(prompt, [str(m) for m in legal_moves(parse_prompt(prompt)[0])])


def with_options(**options):
    """Tic-tac-toe played with ``options`` of :func:`play` (e.g. ``chat=True, reasoning=True``), as a
    Game object that keeps the game's name and ``moves`` (a ``functools.partial`` of ``play`` loses them)."""
    return _with_options(sys.modules[__name__], **options)



def evaluate_table(table: dict, *, games: int = 4000, seed: int = 0) -> dict:
    """Figures of a greedy policy table: ``vs_random`` (win rate, half the games as X, half as O),
    ``vs_minimax_draw_or_win``, ``optimal_move_rate`` and ``legal_move_rate`` (over all 4,520
    reachable positions), ``win_now_rate`` (share of the positions with an immediate win where the
    move wins) and ``block_rate`` (share of those where one cell must be blocked, see ``tactic``,
    where the move blocks). An illegal or unparseable move loses the game."""
    rng = make_rng(seed)

    def learner(prompt, _rng=None):
        move = table.get(parse_prompt(prompt))
        return "" if move is None else str(move)

    results = {}
    for name, opponent in (("random", random_policy), ("minimax", minimax_policy)):
        wins = draws = 0
        for i in range(games):
            as_x = i % 2 == 0
            w = play_out(learner, opponent, rng) if as_x else play_out(opponent, learner, rng)
            mine = "X" if as_x else "O"
            wins += w == mine
            draws += w == "draw"
        results[name] = (wins / games, (wins + draws) / games)
    legal = sum(mv is not None and b[mv - 1] == "." for (b, _), mv in table.items())
    optimal = sum(mv is not None and mv in optimal_moves(b, m) for (b, m), mv in table.items())
    win_now, block = [], []
    for (b, m), mv in table.items():
        kind, cells = tactic(b, m)
        (win_now if kind == "win" else block if kind == "block" else []).append(mv in cells)
    return {"vs_random": results["random"][0], "vs_minimax_draw_or_win": results["minimax"][1],
            "optimal_move_rate": optimal / len(table), "legal_move_rate": legal / len(table),
            "win_now_rate": sum(win_now) / max(len(win_now), 1), "block_rate": sum(block) / max(len(block), 1)}


def tactic(board: str, mark: str) -> tuple[str | None, set[int]]:
    """("win", cells that win at once) when ``mark`` can win now; else ("block", {cell}) when one
    cell stops the opponent's immediate win and blocking it does not lose anyway; else (None, set())."""
    moves = legal_moves(board)
    wins = {mv for mv in moves if winner(apply_move(board, mv, mark)) == mark}
    if wins:
        return "win", wins
    threats = {mv for mv in moves if winner(apply_move(board, mv, other(mark))) == other(mark)}
    if len(threats) == 1 and minimax_values(board, mark)[min(threats)] > -1:
        return "block", threats
    return None, set()


def warmup_examples(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, move) pairs from random legal games: they teach the format and legality, no strategy."""
    rng = make_rng(seed)
    positions = reachable_positions()
    out = []
    for _ in range(n):
        board, mark = positions[rng.randrange(len(positions))]
        out.append((render_prompt(board, mark), str(choice(rng, legal_moves(board)))))
    return out

