"""Soft targets for the (state, move) table's credit, and tic-tac-toe's league example run with them.

``SoftQCredit`` is ``QCredit`` whose target turns are a distribution, ``softmax(Q / tau)`` over a
state's known moves, instead of its best known move; ``targets_only`` also drops the played turns'
``A = Q - V``, as mirror credit does, so that the update's fixed point is the targets' own.
``research/league_config_elsewhere.py --soft-targets TAU`` runs it on Kuhn poker and the matrix
games (mean backup); this script runs ``examples/tictactoe_league.py`` with it (the example's
minimax backup), every other setting the example's. Both take ``--targets-only [--off-target]``,
``--listed`` and ``--round-step W``:

    python research/soft_targets.py --tau 0.15 --targets-only -- --seed 0   # after "--": the example's flags
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import autocurricula  # noqa: E402,F401  (fast BLAS before mlx)
from autocurricula.views.callbacks import TrainerCallback  # noqa: E402
from autocurricula.credit import QCredit  # noqa: E402
from credit_variants import table_average  # noqa: E402
from autocurricula.records import Turn, is_scripted  # noqa: E402


class SoftQCredit(QCredit):
    """``QCredit`` whose target turns are a distribution, not the best known move: when a visited
    state has two or more moves tried at least ``target_min_visits`` times, each gets a target turn with
    ``A = target_coef * softmax(Q / tau)[move]``, whose summed gradient is the cross-entropy toward
    that distribution. ``Q`` is the best-move targets' own score: with the mean backup shrunk toward
    ``V`` by one visit, with the minimax backup the backed-up value of the move (its completions as
    one, the most played completion as the target). The fixed point of the targets is
    ``softmax(Q / tau)`` play, where best-move targets keep pushing one move's logit
    (``research/anchor_bias_ideal.py``: soft against hard targets). ``targets_only``: the played
    turns get ``A = 0`` (the table still learns from them), so only the targets train the policy;
    with ``off_target`` only those whose move gets a target turn do, and a rarer move (an invalid
    word tried once) keeps its ``A = Q - V``. ``round_step``: each move's score is averaged over the
    rounds in which its state gets targets (a learner visited it and it has two or more known
    moves), with weight ``max(1 / n, round_step)`` at the n-th (``table_average``, as mirror credit's
    table iterate), so the targets take a mirror step a round, not the jump to this round's soft
    best response; a move first known later joins at its score of that round. The averages are
    not checkpointed. ``listed``: the targets cover
    only the moves the game lists (the ``ListedMoves`` callback gives them), as mirror credit's do,
    and a reply that is none of them is never a target, so it keeps its ``A = Q - V`` under
    ``off_target``: otherwise each spelling of an invalid reply is a move of its own in the softmax,
    and where the legal moves' values are near the forfeit, many of them take most of the weight.
    ``anchor_games``: with the mean backup, the turns of games with a scripted seat (the
    ``AnchorGames`` callback names them each round) neither enter the table nor get an advantage
    (their states still get target turns, valued by the table): a mean value is the value against
    the opponents met, and the anchor is no opponent the policy should answer; a minimax value
    holds against any line of play, so there they still enter it.
    Reads the table's per-state move index (``StateValues._moves``, ``_minimax_moves``): research only."""

    def __init__(self, tau: float, targets_only: bool = False, anchor_games: bool = False,
                 off_target: bool = False, round_step: float | None = None, listed: bool = False, **fields):
        super().__init__(**fields)
        if off_target and not targets_only:
            raise ValueError("off_target keeps some played turns' advantages that targets_only drops: "
                             "set targets_only=True with it")
        if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
            raise ValueError(f"soft targets need a finite tau > 0, got {tau!r}")
        if not self.target_coef:
            raise ValueError("soft targets are target turns: set target_coef > 0")
        self.tau, self.targets_only, self.anchor_games, self.anchored = tau, targets_only, anchor_games, set()
        if round_step is not None and (isinstance(round_step, bool) or not isinstance(round_step, (int, float))
                                       or not 0 < round_step <= 1):
            raise ValueError(f"round_step is a weight in (0, 1] (None: off), got {round_step!r}")
        self.off_target, self.round_step, self._met, self._kept = off_target, round_step, {}, {}
        self.listed, self.moves_of, self.decode, self._texts = listed, None, None, {}

    def advantages(self, turns):
        keep = [i for i, t in enumerate(turns)
                if not (self.anchor_games and self.backup == "mean" and t.game_id in self.anchored)]
        kept = super().advantages([turns[i] for i in keep])  # the table learns from these played turns
        out = [0.0] * len(turns)
        for i, a in zip(keep, kept):
            if not self.targets_only or (self.off_target and not self.targeted(turns[i])):
                out[i] = a
        return out

    def is_listed(self, prompt_ids, completion_ids) -> bool:
        """With ``listed``: whether the reply is one of the moves the game lists at the prompt."""
        if self.moves_of is None:
            raise RuntimeError("listed soft targets need the game's moves and the tokenizer: add the ListedMoves "
                               "callback")
        key = (tuple(prompt_ids), tuple(completion_ids))
        if key not in self._texts:
            moves = {m.strip() for m in self.moves_of(self.decode(list(prompt_ids), skip_special_tokens=True))}
            self._texts[key] = self.decode(list(completion_ids), skip_special_tokens=True).strip() in moves
        return self._texts[key]

    def targeted(self, turn: Turn) -> bool:
        """Whether ``turn``'s move gets a target turn: its state has two or more known moves and it is one."""
        known = self.known_moves(turn, self.values.key(turn))
        return len(known) >= 2 and any(self.values.action_key(turn) in keys for *_, keys in known)

    def known_moves(self, turn: Turn, state: str) -> list[tuple[float, list[int], bool, list[str]]]:
        """(score, completion ids, truncated, action keys) of each move of ``state`` tried
        ``target_min_visits`` times (a minimax move: its completions' visits summed, its most played
        completion, with ``listed`` its most played listed one, as the target)."""
        table, known = self.values, []
        if self.backup == "minimax":
            groups = table._minimax_moves(state)
        else:
            v, groups = table.value(turn), [[a] for a in sorted(table._moves.get(state, ()))]
        for group in groups:
            rows = [table.action_values[a] for a in group]
            n = sum(r[1] for r in rows)
            usable = [r for r in rows if r[2] and (not self.listed or self.is_listed(turn.prompt_ids, r[2]))]
            if n >= self.target_min_visits and usable:
                q, _, ids, truncated = max(usable, key=lambda r: r[1])
                known.append((q if self.backup == "minimax" else (q * n + v) / (n + 1), ids, truncated, group))
        return known

    def extra_turns(self, turns):
        out, seen = [], set()
        for t in turns:
            state = self.values.key(t)
            if (t.player, state) in seen:
                continue
            seen.add((t.player, state))
            known = self.known_moves(t, state)
            if len(known) < 2:
                continue
            if self.round_step is not None:  # each move's score averaged over the rounds its state is met
                met = self._met[(t.player, state)] = self._met.get((t.player, state), 0) + 1
                kept = self._kept.setdefault((t.player, state), {})  # action key -> its move's average
                before = [next((kept[a] for a in k[3] if a in kept), k[0]) for k in known]  # new: this round's
                scores = table_average(before, [k[0] for k in known], met, self.round_step)
                for q, k in zip(scores, known):
                    kept.update(dict.fromkeys(k[3], q))  # every completion of the move: groups merge
                known = [(q, *k[1:]) for q, k in zip(scores, known)]
            top = max(k[0] for k in known)
            weights = [math.exp((k[0] - top) / self.tau) for k in known]
            for (_, ids, truncated, _), w in zip(known, weights):
                out.append(Turn(player=t.player, game_id=t.game_id, role=t.role, prompt_ids=list(t.prompt_ids),
                                completion_ids=list(ids), logprobs=[0.0] * len(ids), version=t.version, game=t.game,
                                reward=t.reward, level=t.level, parent=t.parent, seat=t.seat, truncated=truncated,
                                advantage=self.target_coef * w / sum(weights), target=True))
        self._targets = len(out)
        return out


class ListedMoves(TrainerCallback):
    """Gives the trainer's ``SoftQCredit(listed=True)`` the game's ``moves(prompt)`` and the
    tokenizer, before the first round's credit."""

    def __init__(self, game):
        from autocurricula.arena.game import game_moves

        self.moves_of = game_moves(game)
        if self.moves_of is None:
            raise ValueError(f"listed soft targets need a game that lists its moves (moves(prompt)), got {game!r}")

    def on_games(self, trainer, records: list) -> None:
        if not isinstance(trainer.credit, SoftQCredit):
            raise TypeError(f"ListedMoves names the moves to a SoftQCredit, the trainer has {trainer.credit!r}")
        trainer.credit.moves_of, trainer.credit.decode = self.moves_of, trainer.engine.tokenizer.decode


class AnchorGames(TrainerCallback):
    """Names to the trainer's credit (its own copy of the config's), each round before it sees the
    turns, the games with a scripted seat."""

    def on_games(self, trainer, records: list) -> None:
        if not isinstance(trainer.credit, SoftQCredit):
            raise TypeError(f"AnchorGames names anchor games to a SoftQCredit, the trainer has {trainer.credit!r}")
        trainer.credit.anchored = {r.game_id for r in records if any(is_scripted(p) for p in r.players)}


def add_flags(p: argparse.ArgumentParser) -> None:
    """The credit's flags, shared with league_config_elsewhere.py (where they need --soft-targets)."""
    p.add_argument("--targets-only", action="store_true", help="the played turns' advantages set to 0, so only "
                   "the target turns train the policy (as mirror credit)")
    p.add_argument("--off-target", action="store_true", help="with --targets-only: a played move that gets no "
                   "target turn (tried fewer than twice, its state's only known move, or with --listed a reply "
                   "the game does not list) keeps its A = Q - V, so rare replies such as invalid words are still "
                   "pushed down (SoftQCredit.off_target)")
    p.add_argument("--round-step", type=float, default=None, metavar="W", help="each move's score averaged over "
                   "the rounds its state gets targets, with weight max(1/n, W) at the n-th, and the targets "
                   "softmax(average / TAU): mirror descent's step W on the table's values (SoftQCredit.round_step; "
                   "default off: this round's scores)")
    p.add_argument("--listed", action="store_true", help="targets over the moves the game lists only; a reply "
                   "that is none of them gets no target (SoftQCredit.listed, ListedMoves)")


def check_flags(p: argparse.ArgumentParser, args) -> None:
    """Stops with the flag to add, or the range, when one of :func:`add_flags`' flags would do nothing."""
    if args.off_target and not args.targets_only:
        p.error("--off-target keeps some of the played turns' advantages that --targets-only drops: add --targets-only")
    if args.round_step is not None and not 0 < args.round_step <= 1:
        p.error(f"--round-step takes a weight in (0, 1], got {args.round_step}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tau", type=float, default=0.15, help="the targets' temperature over the moves' Q")
    add_flags(p)
    p.add_argument("example", nargs="*", help="after '--': examples/tictactoe_league.py's flags")
    args = p.parse_args(argv)
    import tictactoe_league

    ttt = tictactoe_league.parse(args.example)  # checked here, before the example's warm-up
    if ttt.credit != "q" or not ttt.q_targets > 0:
        p.error("soft targets replace credit q's best-move targets: leave the example's --credit at q and "
                "--q-targets above 0")
    if not args.tau > 0:
        p.error(f"--tau must be above 0, got {args.tau}")
    check_flags(p, args)
    credit = SoftQCredit(args.tau, args.targets_only, off_target=args.off_target, round_step=args.round_step,
                         listed=args.listed, target_coef=ttt.q_targets, backup=ttt.q_backup)
    print(json.dumps({"soft_targets": args.tau, "targets_only": args.targets_only, "off_target": args.off_target,
                      "round_step": args.round_step, "listed": args.listed, "backup": ttt.q_backup,
                      "target_coef": ttt.q_targets}), flush=True)
    from autocurricula.games import tictactoe

    tictactoe_league.main(args.example, credit=credit, callbacks=[ListedMoves(tictactoe)] if args.listed else [])


if __name__ == "__main__":
    main()
