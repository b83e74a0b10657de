"""Proposer/Solver: the proposer writes a problem, nested solver attempts score it (Monte Carlo).

Players: ``[proposer, solver]`` (the same player may sit in both seats). The proposer writes a
problem of a verifiable kind; the built-in kind is an arithmetic expression (``12+7*3``), checked by
a safe evaluator (:func:`safe_eval`, no ``eval``). Any other kind plugs in as a ``checker`` (see
:class:`Arithmetic` for the three methods it needs). ``attempts`` solver attempts then run as
nested games (siblings: one GRPO group per problem), trained or not (``solver_trainable``).

Rewards:
- each solver attempt (a nested game): 1.0 if its answer is right, 0.0 if wrong, and
  ``invalid_penalty[0]`` if it holds no answer at all;
- the proposer: the "goldilocks" score ``1 - 2 * abs(pass_rate - 0.5)`` of its problem's pass rate
  (1 at 50 %, 0 at 0 % or 100 %): problems at the edge of the solver's ability pay most;
- the solver's seat in the outer game: the pass rate (for Elo and logs; its turns are the attempts').
A problem that does not parse: ``invalid_penalty`` with the proposer as offender. If no attempt
gave an answer at all, the solver is the offender. Not zero-sum.

Curriculum: with a :class:`ArtifactStore` (``store=``), a problem whose pass rate lies strictly
between 0 and 1 is accepted with its goldilocks score as weight, and each game also runs
``replay_attempts`` solver attempts on a problem sampled from the store by weight (the seeds'
ArtifactStore). :class:`ProposerSolver` binds a store to ``play`` and checkpoints it through its
``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import ast
import asyncio
import operator
from typing import Any

from autocurricula.arena.arena import GameResult
from autocurricula.arena.artifacts import ArtifactStore
from autocurricula.games._common import (DEFAULT_INVALID_PENALTY, ask, check_penalty, check_players, invalid_rewards,
                                         make_rng)
from autocurricula.games.dataset import first_int
from autocurricula.records import GameFacts

__all__ = ["FACTS", "NUM_PLAYERS", "ZERO_SUM", "Arithmetic", "ArtifactStore", "ProposerSolver", "goldilocks", "play",
           "random_policy", "safe_eval"]

NUM_PLAYERS = 2
ZERO_SUM = False
# the proposer's goldilocks score and the solver's pass rate, each in [0, 1]
FACTS = GameFacts(2, "general_sum", "imperfect", "sequential", chance=True, payoff_range=(0.0, 1.0))
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def safe_eval(expr: str, *, max_chars: int = 40, max_abs: int = 10**6) -> int:
    """The value of an integer expression of ``+ - *``, unary minus and parentheses; ValueError for
    anything else (names, calls, powers, floats), for over-long input and for huge values."""
    expr = expr.strip()
    if not expr or len(expr) > max_chars:
        raise ValueError(f"expected an expression of 1 to {max_chars} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expr!r}") from None

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            out = -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            out = _OPS[type(node.op)](value(node.left), value(node.right))
        else:
            raise ValueError(f"only integers, + - * and parentheses are allowed: {expr!r}")
        if abs(out) > max_abs:
            raise ValueError(f"a value beyond {max_abs} in {expr!r}")
        return out

    return value(tree.body)


class Arithmetic:
    """The built-in checker. A checker turns the proposer's reply into a problem (or None), says
    what to ask a solver, and judges an answer (None: no answer at all)."""

    propose_prompt = "Write a short arithmetic problem using integers and + - * (for example 3+4*2).\nProblem:"

    def parse(self, reply: str) -> str | None:
        line = reply.strip().splitlines()[0].strip().rstrip("=").strip() if reply.strip() else ""
        try:
            safe_eval(line)
        except ValueError:
            return None
        return line

    def solve_prompt(self, problem: str) -> str:
        return f"Solve: {problem} =\nAnswer:"

    def check(self, problem: str, answer: str) -> bool | None:
        got = first_int(answer)
        return None if got is None else got == safe_eval(problem)


def goldilocks(pass_rate: float) -> float:
    """1 at a 50 % pass rate, 0 at 0 % or 100 %."""
    return 1.0 - 2.0 * abs(pass_rate - 0.5)


def random_policy(prompt: str, rng: Any = None) -> str:
    """Scripted player for both seats: a random ``a+b`` as proposer; as solver, the right answer
    half of the time (else a near miss)."""
    rng = make_rng(rng=rng)
    if prompt.rstrip().endswith("Problem:"):
        return f"{rng.randint(0, 9)}{rng.choice('+-*')}{rng.randint(0, 9)}"
    problem = prompt.split("Solve:", 1)[-1].split("=", 1)[0]
    try:
        right = safe_eval(problem)
    except ValueError:
        return str(rng.randint(0, 9))
    return str(right if rng.random() < 0.5 else right + rng.choice([-2, -1, 1, 2]))


async def solve(players, model, tokenizer=None, *, problem: str, checker, max_tokens: int, temperature,
                invalid_penalty):
    """One solver attempt, played as a nested game: [1.0] right, [0.0] wrong, penalty: no answer."""
    reply = await ask(model, players[0], checker.solve_prompt(problem), max_tokens=max_tokens,
                      temperature=temperature, stop=("\n",))
    ok = checker.check(problem, reply)
    return GameResult([invalid_penalty[0] if ok is None else float(ok)], {"answered": ok is not None})


async def play(players: list[dict], model, tokenizer=None, *, attempts: int = 4, solver_trainable: bool = True,
               checker=None, store: ArtifactStore | None = None, replay_attempts: int = 2, max_tokens: int = 12,
               temperature: float | None = None, invalid_penalty=DEFAULT_INVALID_PENALTY, seed: int | None = None,
               rng: Any = None) -> GameResult:
    """One problem and its Monte-Carlo score (module docstring); extras: ``problem``, ``pass_rate``,
    ``accepted``, and ``replayed`` (the store's problem, if any)."""
    check_players(players, 2, "proposer/solver")
    penalty = check_penalty(invalid_penalty)
    if attempts < 1 or replay_attempts < 0:
        raise ValueError(f"attempts must be >= 1 and replay_attempts >= 0, got {attempts} and {replay_attempts}")
    checker = checker or Arithmetic()
    rng = make_rng(seed if seed is not None else getattr(model, "seed", None), rng)
    proposer, solver = players
    problem = checker.parse(await ask(model, proposer, checker.propose_prompt, max_tokens=max_tokens,
                                      temperature=temperature, stop=("\n",)))
    if problem is None:
        return GameResult(invalid_rewards(2, [0], penalty), {"problem": None, "pass_rate": None, "accepted": False})
    opts = dict(checker=checker, max_tokens=max_tokens, temperature=temperature, invalid_penalty=penalty)
    replayed = store.sample(rng) if store is not None and len(store) and replay_attempts else None
    calls = [model.play(solve, [solver], group=f"problem:{problem}", trainable=solver_trainable, problem=problem,
                        **opts) for _ in range(attempts)]
    calls += [model.play(solve, [solver], group=f"replay:{replayed}", problem=replayed, **opts)
              for _ in range(replay_attempts if replayed is not None else 0)]
    results = await asyncio.gather(*calls)  # issued together: the engine batches them
    own = results[:attempts]
    if not any(r.extras["answered"] for r in own):
        return GameResult(invalid_rewards(2, [1], penalty), {"problem": problem, "pass_rate": None, "accepted": False})
    pass_rate = sum(r[0] > 0 for r in own) / attempts
    score = goldilocks(pass_rate)
    accepted = 0 < pass_rate < 1
    if store is not None and accepted:
        store.add(problem, score)
    return GameResult([score, pass_rate], {"problem": problem, "pass_rate": pass_rate, "accepted": accepted,
                                           "replayed": replayed})


class ProposerSolver:
    """``play`` with its own artifact store: ``game = ProposerSolver(attempts=8)``, then
    ``trainer.train(model, game)``; ``game.store`` holds the accepted problems and
    ``state_dict`` / ``load_state_dict`` carry it through checkpoints."""

    def __init__(self, store: ArtifactStore | None = None, **options):
        self.store = store if store is not None else ArtifactStore()
        self.options = options
        self.pass_rates: list[float] = []  # of every scored problem, in order (for logs; not checkpointed)
        self.__name__ = "proposer_solver"
        self.__module__ = __name__

    async def __call__(self, players, model, tokenizer=None, **options):
        out = await play(players, model, tokenizer, store=self.store, **{**self.options, **options})
        if out.extras.get("pass_rate") is not None:
            self.pass_rates.append(out.extras["pass_rate"])
        return out

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])
