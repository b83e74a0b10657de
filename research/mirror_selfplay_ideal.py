"""Self-play by mirror-descent move targets with exact values and no model: what a learner that
fits every round's target exactly would reach on Kuhn poker and on the random matrix games (and,
with ``--tictactoe``, on tic-tac-toe, also with sampled positions and values).

    python research/mirror_selfplay_ideal.py                          # tau 0.15, steps 1, 0.1 and 0.045
    python research/mirror_selfplay_ideal.py --tau 0.1 0.15 0.2 --step 0.02 0.045 0.1 --rounds 200
    python research/mirror_selfplay_ideal.py --step 0.045 --tictactoe --seed 1
    python research/mirror_selfplay_ideal.py --step 0.045 --tictactoe --variants 256_games_1_sample --games 2
    python research/mirror_selfplay_ideal.py --step 0.045 --tictactoe --from-warm-base --games 2
    python research/mirror_selfplay_ideal.py --step 0.045 --kuhn-explore 0.25
    python research/mirror_selfplay_ideal.py --step 0.045 --iterate table --tictactoe --from-warm-base
    python research/mirror_selfplay_ideal.py --step 0.045 0.2 0.45 --average-last 1 32

Each round both seats of one policy move, at every information set (Kuhn) or seat (matrix), to
``mirror_distribution(Q, log pi, tau, step=w)``: ``pi_new ∝ pi^(1 - w) softmax(Q / tau)^w``, with
``Q`` the exact values of the moves under the current policy (Kuhn: valued per information set,
as ``pool_states=True`` pools a round's visits). ``step 1`` jumps to the smoothed best response
every round, the target ``BranchCredit(advantage="moves")`` trains toward; ``step < 1`` is magnetic
mirror descent with a uniform magnet, whose fixed point is ``softmax(Q / tau)`` play (a quantal
response equilibrium). Kuhn starts from the warm base's played strategy (seed 0), the matrix games
from uniform play. One JSON line per setting: Kuhn's exploitability (chips per hand) after rounds
24, 48, 72 and 96, after the last and its range over the last 24 rounds (a cycle shows there), and
the matrix games' median and worst exploitability as a share of the payoff range after the last
round; with ``--tictactoe``, tic-tac-toe from uniform legal play (``tictactoe_summary``): every
position stepped each round with exact values, only the positions of 128 sampled games a round
with exact values, and those with the values of 2 sampled playouts per move and visit (what
``MirrorCredit`` sees in the example's training games, with no model in the way), or the
``--variants`` named in ``TICTACTOE_VARIANTS``; ``--from-warm-base`` starts them from the policy the
examples' warm base of ``--seed`` plays (read off the model), as the trained runs start. Each
variant also reports its value-losing share after every 8th round (the trained examples' epoch and
figure). ``--average-last N`` also scores the uniform mixture of the last N iterates on Kuhn and
the matrix games. ``--kuhn-explore E`` weights Kuhn's deals as if a
share E of the games' moves were uniform (the values stay the policy's). The paper's
guarantee needs a step ``w / (1 - w) <= (tau / L)^2`` for payoffs of scale L; larger steps may
converge or cycle, which is what this measures. These are the floors and speeds
a trained run can at best reach on the same budget of rounds (``examples/psro_kuhn.py --trainers
selfplay --credit mirror`` plays 96 rounds).
"""

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # credit_variants

import numpy as np  # noqa: E402

from autocurricula.credit import mirror_distribution, move_distribution  # noqa: E402
from credit_variants import catch_up_step, table_average  # noqa: E402
from autocurricula.eval.kuhn import INFOSETS, exploitability, mixture_strategy  # noqa: E402
from autocurricula.games.matrix import random_game  # noqa: E402
from kuhn_moves_fixed_point import move_values  # noqa: E402
from kuhn_psro_ideal import WARM_BASE  # noqa: E402

SHOWN = (24, 48, 72, 96)


def kuhn_curve(tau: float, step: float, rounds: int, start: dict[str, float] = WARM_BASE,
               explore: float = 0.0, iterate: str = "policy") -> list[float]:
    """Kuhn's exploitability after each round of exact mirror steps (P(bet or call) per set).
    ``explore``: the share of the games' moves drawn uniformly, which weights the deals that reach a
    set (the values stay the policy's), as pooled values of exploring games would be. ``iterate``:
    "policy" steps from the policy, "table" plays softmax(Q / tau) of each set's averaged values
    (``table_average``, ``MirrorVariantCredit(iterate="table")`` in examples/credit_variants.py)."""
    return [exploitability(p, backend="python") for p in kuhn_iterates(tau, step, rounds, start, explore, iterate)]


def kuhn_iterates(tau: float, step: float, rounds: int, start: dict[str, float] = WARM_BASE,
                  explore: float = 0.0, iterate: str = "policy") -> list[dict[str, float]]:
    """The policy after each round of :func:`kuhn_curve` (P(bet or call) per set)."""
    if not 0 <= explore < 1:
        raise ValueError(f"explore is the share of uniformly drawn moves, in [0, 1): got {explore}")
    policy, out, table = dict(start), [], {}
    for t in range(1, rounds + 1):
        reach = {k: (1 - explore) * p + explore / 2 for k, p in policy.items()}
        values = move_values(policy, reach)  # (aggressive, passive) per set, under the current policy
        if iterate == "table":
            table = {k: table_average(table.get(k), list(values[k]), t, step) for k in INFOSETS}
            policy = {k: move_distribution(table[k], tau)[0] for k in INFOSETS}
        else:
            policy = {k: mirror_distribution(list(values[k]), [math.log(policy[k]), math.log(1 - policy[k])],
                                             tau, step=step)[0] for k in INFOSETS}
        out.append(policy)
    return out


def kuhn_average_exploitability(iterates: list[dict[str, float]], last: int) -> float:
    """Exploitability of drawing one of the ``last`` iterates uniformly per hand (``mixture_strategy``):
    what deploying their average, as ``SelfPlayRules.average_last`` does, would give."""
    if not 1 <= last <= len(iterates):
        raise ValueError(f"average over the last 1 to {len(iterates)} rounds: got {last}")
    return exploitability(mixture_strategy(iterates[-last:], [1.0] * last), backend="python")


def matrix_curve(payoff: np.ndarray, tau: float, step: float, rounds: int, iterate: str = "policy",
                 average_last: int = 1) -> list[float]:
    """A matrix game's exploitability as a share of its payoff range after each of ``rounds``
    exact steps from uniform play (``iterate`` as in :func:`kuhn_curve`); with ``average_last``,
    that of the mean of the last ``average_last`` iterates (fewer in the first rounds)."""
    iterates = matrix_iterates(payoff, tau, step, rounds, iterate)
    return [matrix_average_exploitability(payoff, iterates[:t], average_last) for t in range(1, rounds + 1)]


def matrix_iterates(payoff: np.ndarray, tau: float, step: float, rounds: int,
                    iterate: str = "policy") -> list[tuple[np.ndarray, np.ndarray]]:
    """The row and column strategies after each round of :func:`matrix_curve`."""
    m, n = payoff.shape
    x, y, out = np.full(m, 1 / m), np.full(n, 1 / n), []
    qx = qy = None
    for t in range(1, rounds + 1):
        if iterate == "table":
            qx, qy = table_average(qx, list(payoff @ y), t, step), table_average(qy, list(-(x @ payoff)), t, step)
            x, y = np.array(move_distribution(qx, tau)), np.array(move_distribution(qy, tau))
        else:
            x, y = (np.array(mirror_distribution(list(payoff @ y), list(np.log(x)), tau, step=step)),
                    np.array(mirror_distribution(list(-(x @ payoff)), list(np.log(y)), tau, step=step)))
        out.append((x, y))
    return out


def matrix_average_exploitability(payoff: np.ndarray, iterates: list[tuple[np.ndarray, np.ndarray]],
                                  last: int) -> float:
    """Exploitability, as a share of the payoff range, of the mean of the last ``last`` iterates
    (all of them where there are fewer)."""
    if last < 1:
        raise ValueError(f"average_last counts iterates, at least 1: got {last}")
    x, y = (np.mean([it[k] for it in iterates[-last:]], axis=0) for k in (0, 1))
    return float(((payoff @ y).max() - (x @ payoff).min()) / 2 / np.ptp(payoff))


def tictactoe_curve(tau: float, step: float, rounds: int, games: int | None = None, samples: int | None = None,
                    seed: int = 0, minimax: bool = False, greedy_playouts: bool = False,
                    explore: float = 0.0, start: dict[str, np.ndarray] | None = None,
                    catch_up: bool = False, iterate: str = "policy") -> list[dict]:
    """Tic-tac-toe from uniform legal play, or ``start`` (board -> probabilities of its legal moves, in
    ``legal_moves`` order, e.g. ``model_policy``'s), both seats one policy. Each round steps every reachable
    position (``games=None``) or only those the learner meets in ``games`` self-play games after 0 to
    4 random opening moves (as the example's training games), with the exact values of its moves
    under the current policy (``samples=None``) or the mean result of ``samples`` sampled playouts
    per move and visit (pooled over a round's visits, as ``MirrorCredit`` does). With sampled values,
    one of: ``minimax`` values a move by its worst known outcome over every game and playout so far
    (``QCredit(backup="minimax")``'s table, fed by the playouts too); ``greedy_playouts`` plays the
    policy's most likely moves after the move (no sampling noise; ties go to the first free cell).
    With ``games``: ``explore`` draws that share of the training games' moves uniformly (more
    positions met, the values still the policy's); ``catch_up`` steps a position met again after k
    rounds (k = rounds so far on its first visit) by ``catch_up_step(step, k)``: k steps at once,
    this round's and the k - 1 it missed (``MirrorVariantCredit(catch_up=True)``). ``iterate="table"``: a
    position met plays softmax(Q / tau) of its values averaged over the rounds it was met
    (``table_average``; with catch_up, at the step of the rounds it missed). After each round:
    whether the policy's greedy moves lose to the exact best response as X / O, their value-losing
    share (``eval.tictactoe``'s, both seats pooled, as the trained examples report it), and the sampled
    policy's expected result against the best response (+1 win, -1 loss) as X / O."""
    from autocurricula.eval.tictactoe import best_response
    from autocurricula.games.tictactoe import apply_move, legal_moves, random_opening, reachable_positions, winner

    if (minimax or greedy_playouts) and samples is None:
        raise ValueError("minimax and greedy_playouts change sampled values: give samples too")
    if minimax and greedy_playouts:
        raise ValueError("minimax and greedy_playouts are two diagnoses: pick one")
    if not 0 <= explore < 1:
        raise ValueError(f"explore is the share of uniformly drawn moves, in [0, 1): got {explore}")
    if explore and games is None:
        raise ValueError("explore draws the training games' moves: give games too")
    positions = dict(reachable_positions())  # board -> mark to move
    policy = {b: np.full(len(legal_moves(b)), 1 / len(legal_moves(b))) if start is None
              else np.asarray(start[b], float) / np.sum(start[b]) for b in positions}
    rng, openings = np.random.default_rng(seed), random.Random(seed)

    graph: dict[str, set] = {}  # board -> the boards played after it, in any game or playout so far

    def sample(board: str, greedy: bool = False, explore: float = 0.0) -> tuple[list[str], float]:
        """The non-terminal boards of one sampled game from ``board`` (``greedy``: the policy's most
        likely moves), and its result for the player to move at ``board``."""
        seen, first = [], board
        while winner(board) is None:
            seen.append(board)
            moves = legal_moves(board)
            p = (1 - explore) * policy[board] + explore / len(moves)
            pick = int(np.argmax(policy[board])) if greedy else int(rng.choice(len(moves), p=p))
            after = apply_move(board, moves[pick], positions[board])
            graph.setdefault(board, set()).add(after)
            board = after
        end = winner(board)
        return seen, 0.0 if end == "draw" else 1.0 if end == positions[first] else -1.0

    def playout(after: str) -> float:
        """One sampled result, for the player who just moved, of the game from ``after``."""
        end = winner(after)
        if end is not None:
            return 0.0 if end == "draw" else 1.0  # only the mover can have completed a line
        return -sample(after, greedy_playouts)[1]

    def sampled_values(visits: dict[str, int]) -> dict[str, list[float]]:
        """Each move's mean over ``samples`` playouts per visit of the round (pooled per position)."""
        out = {board: [float(np.mean([playout(apply_move(board, m, positions[board])) for _ in range(n * samples)]))
                       for m in legal_moves(board)] for board, n in visits.items()}
        if not minimax:
            return out
        # minimax: the playouts above only fill the graph; every valued move gets its next board
        for board in visits:
            graph.setdefault(board, set()).update(apply_move(board, m, positions[board]) for m in legal_moves(board))
        known: dict[str, float] = {}
        return {board: [worst_known(apply_move(board, m, positions[board]), graph, known) for m in legal_moves(board)]
                for board in visits}

    out, last, table = [], {}, {}  # catch_up: board -> the round it was last stepped; board -> (met, values)
    for t in range(rounds):
        if games is None:
            visits = dict.fromkeys(positions, 1)
        else:
            visits = {}
            for _ in range(games):
                for board in sample(random_opening(openings.randint(0, 4), openings), explore=explore)[0]:
                    visits[board] = visits.get(board, 0) + 1
        if samples is None:
            q = exact_move_values(policy, positions, visits)
        else:
            q = sampled_values(visits)
        steps = {b: catch_up_step(step, t - last.get(b, -1)) if catch_up else step for b in visits}
        if iterate == "table":
            for b in visits:
                met, kept = table.get(b, (0, None))
                table[b] = (met + 1, table_average(kept, list(q[b]), met + 1, steps[b]))
                policy[b] = np.array(move_distribution(table[b][1], tau))
        else:
            policy.update({b: np.array(mirror_distribution(q[b], list(np.log(policy[b])), tau, step=steps[b]))
                           for b in visits})
        last.update(dict.fromkeys(visits, t))
        greedy = {(b, mark): legal_moves(b)[int(np.argmax(policy[b]))] for b, mark in positions.items()}
        sides = [best_response(greedy, mark) for mark in ("X", "O")]
        out.append({"loses_as_x": sides[0].value < 0, "loses_as_o": sides[1].value < 0,
                    "value_losing_share": sum(len(s.value_losing) for s in sides) / sum(s.positions for s in sides),
                    "sampled_vs_best_response_as_x": _sampled_worst(policy, positions, "X"),
                    "sampled_vs_best_response_as_o": _sampled_worst(policy, positions, "O")})
    return out


def exact_move_values(policy: dict[str, np.ndarray], positions: dict[str, str],
                      boards) -> dict[str, list[float]]:
    """The exact value of every legal move (``legal_moves`` order) at each of ``boards``, for the
    player to move, when both seats play ``policy`` afterwards (+1 win, 0 draw, -1 loss)."""
    from autocurricula.games.tictactoe import apply_move, legal_moves, winner

    value: dict[str, float] = {}  # board -> expected result for the player to move

    def v(board: str) -> float:
        if board not in value:
            end = winner(board)
            if end is not None:  # the last mover won or drew: the player to move lost or drew
                value[board] = 0.0 if end == "draw" else -1.0
            else:
                mark = positions[board]
                value[board] = float(policy[board] @ [-v(apply_move(board, m, mark)) for m in legal_moves(board)])
        return value[board]

    v("." * 9)
    return {b: [-v(apply_move(b, m, positions[b])) for m in legal_moves(b)] for b in boards}


def engine_policy(engine, player: str | None = None, temperature: float = 1.0,
                  boards: list[str] | None = None) -> tuple[dict[str, np.ndarray], dict[tuple, str]]:
    """``model_policy`` read through an open engine, and each position's prompt (token ids) -> board."""
    from autocurricula.games.tictactoe import legal_moves, reachable_positions, render_prompt

    tok, read, pairs, prompts = engine.tokenizer, [], [], {}
    wanted = None if boards is None else set(boards)
    for board, mark in reachable_positions():
        if wanted is not None and board not in wanted:
            continue
        prompt = engine.encode(render_prompt(board, mark))
        prompts[tuple(prompt)] = board
        read.append((board, len(legal_moves(board))))
        pairs += [(prompt, list(tok.encode(str(m), add_special_tokens=False)) + [tok.eos_token_id])
                  for m in legal_moves(board)]
    logps, out, i = engine.completion_logprobs(pairs, player, temperature), {}, 0
    for board, n in read:
        p = np.exp(np.array(logps[i:i + n]) - max(logps[i:i + n]))
        out[board], i = p / p.sum(), i + n
    return out, prompts


def model_policy(base: str, player: str | None = None, temperature: float = 1.0,
                 boards: list[str] | None = None) -> dict[str, np.ndarray]:
    """A model's policy at every reachable tic-tac-toe position (or only ``boards``): its
    probabilities of the legal moves (``legal_moves`` order), scored as branch credit scores them
    (the move's tokens and end of sequence, at ``temperature``) and renormalised over them."""
    from autocurricula.engine import Engine

    engine = Engine(base, name=base)
    try:
        return engine_policy(engine, player, temperature, boards)[0]
    finally:
        engine.close()


def worst_known(after: str, graph: dict[str, set], memo: dict[str, float] | None = None) -> float:
    """The worst known result of a tic-tac-toe board for the player who just moved (+1 win, 0 draw,
    -1 loss): minimax over the boards played after it (``graph``: board -> next boards seen), the
    opponent taking its best known reply. Every unfinished board reached must have an entry. With
    every reply in the graph, the exact minimax value."""
    from autocurricula.games.tictactoe import winner

    memo = {} if memo is None else memo
    if after not in memo:
        end = winner(after)
        memo[after] = (0.0 if end == "draw" else 1.0) if end is not None else \
            -max(worst_known(c, graph, memo) for c in graph[after])
    return memo[after]


def _sampled_worst(policy: dict, positions: dict, mark: str) -> float:
    """The expected result for ``mark`` of sampling ``policy`` against its exact best response."""
    from autocurricula.games.tictactoe import apply_move, legal_moves, winner

    memo: dict[str, float] = {}

    def w(board: str) -> float:
        if board not in memo:
            end = winner(board)
            if end is not None:
                memo[board] = 0.0 if end == "draw" else 1.0 if end == mark else -1.0
            else:
                mover = positions[board]
                after = [w(apply_move(board, m, mover)) for m in legal_moves(board)]
                memo[board] = float(policy[board] @ after) if mover == mark else min(after)
        return memo[board]

    return w("." * 9)


TICTACTOE_VARIANTS = {  # tictactoe_curve's options; the first three are --tictactoe's default
    "every_position_exact": {}, "128_games_exact": {"games": 128}, "128_games_2_samples": {"games": 128, "samples": 2},
    "128_games_2_samples_minimax_table": {"games": 128, "samples": 2, "minimax": True},
    "128_games_greedy_playouts": {"games": 128, "samples": 1, "greedy_playouts": True},
    "128_games_exact_explore_0.25": {"games": 128, "explore": 0.25},
    "128_games_2_samples_explore_0.25": {"games": 128, "samples": 2, "explore": 0.25},
    "128_games_8_samples": {"games": 128, "samples": 8},
    "32_games_8_samples": {"games": 32, "samples": 8}, "256_games_1_sample": {"games": 256, "samples": 1},
    "128_games_exact_catch_up": {"games": 128, "catch_up": True},
    "128_games_2_samples_catch_up": {"games": 128, "samples": 2, "catch_up": True}}


def tictactoe_summary(tau: float, step: float, rounds: int, **options) -> dict:
    """``tictactoe_curve(tau, step, rounds, **options)`` in brief: the first round from which the
    greedy policy never loses to the best response again (None: it still does), the value-losing
    share after every 8th round (an epoch of the examples' 8 rounds), and the last round's sampled
    results."""
    curve = tictactoe_curve(tau, step, rounds, **options)
    losing = [i for i, r in enumerate(curve) if r["loses_as_x"] or r["loses_as_o"]]
    unbeaten_from = (losing[-1] + 2 if losing else 1) if not losing or losing[-1] < rounds - 1 else None
    return {"greedy_unbeaten_from_round": unbeaten_from,
            "value_losing_share_every_8_rounds": [round(r["value_losing_share"], 3) for r in curve[7::8]],
            "sampled_vs_best_response_as_x": round(curve[-1]["sampled_vs_best_response_as_x"], 4),
            "sampled_vs_best_response_as_o": round(curve[-1]["sampled_vs_best_response_as_o"], 4)}


def tictactoe_variant(name: str, tau: float, step: float, rounds: int, seed: int, start,
                      iterate: str = "policy") -> dict:
    """``tictactoe_summary`` of one ``TICTACTOE_VARIANTS`` entry, saying on stderr what runs (minutes)."""
    print(f"tic-tac-toe {name}, tau {tau}, step {step}: {rounds} rounds, about 1 - 3 s each ...",
          file=sys.stderr, flush=True)
    return tictactoe_summary(tau, step, rounds, seed=seed, start=start, iterate=iterate, **TICTACTOE_VARIANTS[name])


def _median_worst(shares: list[float]) -> dict[str, float]:
    return {"median": round(float(np.median(shares)), 4), "worst": round(max(shares), 4)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tau", type=float, nargs="+", default=[0.15])
    parser.add_argument("--step", type=float, nargs="+", default=[1.0, 0.1, 0.045])
    parser.add_argument("--rounds", type=int, default=96)
    parser.add_argument("--games", type=int, default=20, help="matrix games random-0 ... random-(N-1)")
    parser.add_argument("--tictactoe", action="store_true", help="also tic-tac-toe from uniform legal play (or "
                        "the warm base's policy: --from-warm-base), in the --variants (about 1 - 4 minutes each): "
                        "the round from which the greedy policy stays unbeaten as X and O, its value-losing share "
                        "after every 8th round, and the sampled policy's result against its best response after "
                        "the last round")
    parser.add_argument("--variants", nargs="+", choices=list(TICTACTOE_VARIANTS), metavar="NAME",
                        default=None, help="with --tictactoe: any of "
                        f"{', '.join(TICTACTOE_VARIANTS)} (default: the first three)")
    parser.add_argument("--seed", type=int, default=0, help="with --tictactoe: the sampled games' and playouts' seed")
    parser.add_argument("--from-warm-base", action="store_true", help="with --tictactoe: start from the policy of "
                        "the tic-tac-toe examples' warm base of --seed (built and cached if missing), not uniform play")
    parser.add_argument("--kuhn-explore", type=float, default=0.0, help="Kuhn's deals weighted as if this share "
                        "of the games' moves were drawn uniformly (kuhn_curve's explore)")
    parser.add_argument("--iterate", choices=["policy", "table"], default="policy", help="each step from the "
                        "policy, or from a table of each state's averaged move values "
                        "(MirrorVariantCredit(iterate=...))")
    parser.add_argument("--average-last", type=int, nargs="+", default=[], metavar="N",
                        help="also the exploitability of the uniform mixture of the last N rounds' iterates "
                        "(Kuhn and the matrix games): what deploying an average of iterates would give")
    args = parser.parse_args(argv)
    if any(not 1 <= n <= args.rounds for n in args.average_last):
        parser.error(f"--average-last N averages the last N of --rounds {args.rounds} iterates: give 1 to {args.rounds}")
    if args.variants is not None and not args.tictactoe:
        parser.error("--variants runs tic-tac-toe settings: add --tictactoe")
    if args.from_warm_base and not args.tictactoe:
        parser.error("--from-warm-base starts tic-tac-toe from a model's policy: add --tictactoe")
    variants = args.variants or list(TICTACTOE_VARIANTS)[:3]
    start = None
    if args.from_warm_base:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
        from ttt_common import warm_base

        base = warm_base(seed=args.seed, progress=True)
        print(f"reading {base.name}'s policy at the 4,520 positions (about a minute) ...", file=sys.stderr, flush=True)
        start = model_policy(str(base))
    for tau in args.tau:
        for step in args.step:
            iterates = kuhn_iterates(tau, step, args.rounds, explore=args.kuhn_explore, iterate=args.iterate)
            kuhn = [exploitability(p, backend="python") for p in iterates]
            payoffs = [np.array(random_game(g).payoff) for g in range(args.games)]
            played = [matrix_iterates(a, tau, step, args.rounds, args.iterate) for a in payoffs]
            shares = [matrix_average_exploitability(a, its, 1) for a, its in zip(payoffs, played)]
            averaged = {str(n): {"kuhn": round(kuhn_average_exploitability(iterates, n), 4),
                                 "matrix": _median_worst([matrix_average_exploitability(a, its, n)
                                                          for a, its in zip(payoffs, played)])}
                        for n in args.average_last}
            print(json.dumps({"tau": tau, "step": step, "rounds": args.rounds, "kuhn_explore": args.kuhn_explore,
                              "iterate": args.iterate,
                              "kuhn": {str(r): round(kuhn[r - 1], 4) for r in SHOWN if r <= args.rounds}
                              | {"last": round(kuhn[-1], 4), "last_24_min_max": [round(min(kuhn[-24:]), 4),
                                                                                  round(max(kuhn[-24:]), 4)]},
                              "matrix": _median_worst(shares),
                              **({"average_last": averaged} if averaged else {}),
                              **({"tictactoe": {name: tictactoe_variant(name, tau, step, args.rounds, args.seed, start,
                                                                  args.iterate)
                                                for name in variants}}
                                 if args.tictactoe else {})}),
                  flush=True)


if __name__ == "__main__":
    main()
