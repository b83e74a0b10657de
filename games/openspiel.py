"""Adapter: any two-player OpenSpiel game as a :class:`~autocurricula.arena.game.Game`
(``pip install "autocurricula[openspiel]"``, tested with open_spiel 2.0).

    from autocurricula.games import openspiel
    game = openspiel.load("goofspiel(num_cards=4)")
    trainer.train(model, game)                    # or autocurricula.train(model, game)

The prompt of a seat is the game's name, the player's information-state string (its observation
string where the game provides no information state) and the legal moves::

    goofspiel(num_cards=4), you are player 1.
    Point card sequence: 3
    P0 hand: 1 2 3 4
    P1 hand: 1 2 3 4
    Win sequence:
    Points: 0 0
    your move ([P1]Bid: 1/[P1]Bid: 2/[P1]Bid: 3/[P1]Bid: 4):

A move is one of the state's ``action_to_string`` words, written after a space as the warm-up
teaches it (``moves(prompt)`` lists them: ``" [P1]Bid: 1"``); a reply is legal when, stripped, it
is exactly one of them. Anything else forfeits: the offender gets the game's lowest payoff
(``min_utility``) and the other player the rest of the game's utility sum (``-min_utility`` in a
zero-sum game), so the game stays zero-sum and nonsense never pays better than the worst legal
outcome; both players of a simultaneous move forfeiting split the utility sum. ``invalid_penalty``
replaces the rule. Chance outcomes are drawn from the game's seed (``model.seed``), with their
probabilities; simultaneous moves are asked of both seats at once.

The game's facts (:class:`~autocurricula.records.GameFacts`) are read from its ``GameType`` and
``GameInfo``: players, utility, information, dynamics, chance mode, and the payoff range
``[min_utility, max_utility]``. A game that is small enough lists its information sets
(:meth:`OpenSpielGame.information_sets`), which the exact exploitability of a model's policy as
played (``autocurricula.eval.openspiel``, OpenSpiel's own best response on the game extended by
a forfeit move) and the format warm-up (:meth:`OpenSpielGame.warmup_examples`) read.

The module itself is a Game too: its ``play`` is OpenSpiel's ``kuhn_poker`` through the adapter.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass
from typing import Any

from autocurricula.games._common import ask, check_penalty, check_players, choice, invalid_rewards
from autocurricula.records import GameFacts

__all__ = ["DEFAULT", "FACTS", "INSTALL_HINT", "NUM_PLAYERS", "ZERO_SUM", "InfoSet", "OpenSpielGame",
           "check_tokenizer", "load", "moves", "play", "random_policy", "warmup_examples"]

INSTALL_HINT = "OpenSpiel is not installed; install it with: pip install \"autocurricula[openspiel]\" (open_spiel)"
DEFAULT = "kuhn_poker"  # the module's own play
NUM_PLAYERS = 2
ZERO_SUM = True
FACTS = GameFacts(2, "zero_sum", "imperfect", "sequential", chance=True, payoff_range=(-2.0, 2.0))  # kuhn_poker's
MAX_STATES = 2_000_000  # information_sets() refuses a game tree larger than this


def _pyspiel():
    try:
        import pyspiel  # open_spiel: optional (extra openspiel)
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return pyspiel


@dataclass(frozen=True)
class InfoSet:
    """One information set of one player: its prompt, legal actions and their moves (as the model
    writes them), and ``parent``: the player's own previous ``(information set key, action)``, None
    at its first decision (perfect recall makes it the same from every state of the set)."""

    player: int
    key: str
    prompt: str
    actions: tuple[int, ...]
    moves: tuple[str, ...]
    parent: tuple[tuple[int, str], int] | None


class OpenSpielGame:
    """A two-player pyspiel game as a Game object (module docstring). ``name``: its name in turns and
    prompts (default: the game's string, e.g. ``goofspiel(num_cards=4)``); ``invalid_penalty``:
    ``(offender, other)`` in place of the forfeit; ``max_tokens``: the reply's token budget (default:
    the longest move's tokens plus one for the end token, once the game meets a tokenizer, else 8)."""

    NUM_PLAYERS = 2

    def __init__(self, game, *, name: str | None = None, invalid_penalty=None, max_tokens: int | None = None):
        pyspiel = _pyspiel()
        if isinstance(game, str):
            game = pyspiel.load_game(game)
        self.game = game
        gtype = game.get_type()
        if game.num_players() != 2:
            raise ValueError(f"{game}: the adapter plays two-player games, this one has {game.num_players()}")
        if not (gtype.provides_information_state_string or gtype.provides_observation_string):
            raise ValueError(f"{game} provides neither information-state nor observation strings: nothing to "
                             "prompt a player with")
        self.uses_information_state = bool(gtype.provides_information_state_string)
        self.name = name or str(game).removesuffix("()")
        utility = {pyspiel.GameType.Utility.ZERO_SUM: "zero_sum", pyspiel.GameType.Utility.CONSTANT_SUM: "constant_sum",
                   pyspiel.GameType.Utility.GENERAL_SUM: "general_sum",
                   pyspiel.GameType.Utility.IDENTICAL: "identical"}[gtype.utility]
        information = {pyspiel.GameType.Information.PERFECT_INFORMATION: "perfect",
                       pyspiel.GameType.Information.IMPERFECT_INFORMATION: "imperfect",
                       pyspiel.GameType.Information.ONE_SHOT: "one_shot"}[gtype.information]
        dynamics = "simultaneous" if gtype.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS else "sequential"
        chance = gtype.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC
        lo, hi = float(game.min_utility()), float(game.max_utility())
        self.facts = GameFacts(2, utility, information, dynamics, chance, payoff_range=(lo, hi))
        self.ZERO_SUM = self.facts.zero_sum
        total = float(game.utility_sum()) if self.ZERO_SUM else 0.0
        self.utility_sum = total
        # the forfeit: the offender's worst payoff, the other player the rest of the sum (zero-sum stays so)
        self.forfeit = (lo, total - lo) if self.ZERO_SUM else (lo, 0.0)
        if invalid_penalty is not None:
            invalid_penalty = check_penalty(invalid_penalty)
        self.invalid_penalty = invalid_penalty
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._prompts: dict[str, tuple[str, ...]] = {}  # prompt -> its moves
        self._sets: dict[tuple[int, str], InfoSet] | None = None
        self._checked: set[int] = set()

    # ------------------------------------------------------------------ prompts and moves
    def info_string(self, state, player: int) -> str:
        return state.information_state_string(player) if self.uses_information_state else state.observation_string(player)

    def legal(self, state, player: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The legal actions of ``player`` at ``state`` and their moves (``" " + action_to_string``)."""
        actions = tuple(state.legal_actions(player))
        words = tuple(" " + state.action_to_string(player, a).strip() for a in actions)
        if len(set(words)) != len(words):
            raise ValueError(f"{self.name}: two legal actions share the move text {words}: replies cannot tell them "
                             f"apart")
        return actions, words

    def prompt(self, state, player: int) -> str:
        """The prompt of ``player`` at ``state`` (a decision node of that player)."""
        _, words = self.legal(state, player)
        info = self.info_string(state, player).strip()
        text = (f"{self.name}, you are player {player}.\n{info}\n"
                f"your move ({'/'.join(w.strip() for w in words)}):")
        self._prompts.setdefault(text, words)
        return text

    def moves(self, prompt: str) -> list[str]:
        """The legal replies at one of the game's prompts, as the warm-up teaches them (the move after a space)."""
        words = self._prompts.get(prompt)
        if words is None and self._sets is None and self.small_enough():
            self.information_sets()
            words = self._prompts.get(prompt)
        if words is None:
            raise ValueError(f"not a prompt of {self.name} (or one never rendered in this process): {prompt[:200]!r}")
        return list(words)

    def action(self, state, player: int, reply: str) -> int | None:
        """The action a reply names (stripped, exactly one legal move), None for an invalid reply."""
        actions, words = self.legal(state, player)
        text = reply.strip()
        for a, w in zip(actions, words):
            if w.strip() == text:
                return a
        return None

    def random_policy(self, prompt: str, rng: Any = None) -> str:
        return choice(rng, self.moves(prompt))

    # ------------------------------------------------------------------ the game
    def forfeit_rewards(self, offenders: list[int], invalid_penalty=None) -> list[float]:
        """The rewards when ``offenders`` gave invalid replies (``invalid_penalty`` replaces the rule)."""
        penalty = invalid_penalty if invalid_penalty is not None else self.invalid_penalty
        if penalty is not None:
            return invalid_rewards(2, offenders, penalty)
        if len(offenders) == 2:
            return [self.utility_sum / 2] * 2
        out = [self.forfeit[1]] * 2
        out[offenders[0]] = self.forfeit[0]
        return out

    def check_tokenizer(self, tokenizer) -> None:
        """Set the reply budget from ``tokenizer``: the longest move's tokens plus the end token (unless
        ``max_tokens`` was given)."""
        if tokenizer is None or id(tokenizer) in self._checked:
            return
        if self.max_tokens is None:
            words = {w for s in self.information_sets().values() for w in s.moves} if self.small_enough() \
                else {w for _, ws in self._sample_prompts(200, 0) for w in ws}
            self.max_tokens = max(len(tokenizer.encode(w, add_special_tokens=False)) for w in words) + 1
        self._checked.add(id(tokenizer))

    async def play(self, players: list[dict], model, tokenizer=None, *, invalid_penalty=None,
                   seed: int | None = None) -> list[float]:
        """One game; ``players[i]`` is OpenSpiel's player ``i``. Chance draws come from ``seed``, else
        the league's per-game seed (``model.seed``). Returns the game's returns (or the forfeit)."""
        check_players(players, 2, self.name)
        if invalid_penalty is not None:
            check_penalty(invalid_penalty)
        if tokenizer is not None and id(tokenizer) not in self._checked and hasattr(tokenizer, "encode"):
            self.check_tokenizer(tokenizer)
        seed = seed if seed is not None else getattr(model, "seed", None)
        rng = random.Random(seed)
        budget = self.max_tokens or 8
        state = self.game.new_initial_state()
        while not state.is_terminal():
            if state.is_chance_node():
                outcomes = state.chance_outcomes()
                state.apply_action(_draw(outcomes, rng))
            elif state.is_simultaneous_node():
                seats = [p for p in range(2) if state.legal_actions(p)]
                replies = await asyncio.gather(*(ask(model, players[p], self.prompt(state, p), max_tokens=budget)
                                                 for p in seats))
                actions = [0, 0]
                for p in range(2):
                    actions[p] = state.legal_actions(p)[0] if p not in seats else None
                bad = []
                for p, reply in zip(seats, replies):
                    actions[p] = self.action(state, p, reply)
                    if actions[p] is None:
                        bad.append(p)
                if bad:
                    return self.forfeit_rewards(bad, invalid_penalty)
                state.apply_actions(actions)
            else:
                p = state.current_player()
                reply = await ask(model, players[p], self.prompt(state, p), max_tokens=budget)
                a = self.action(state, p, reply)
                if a is None:
                    return self.forfeit_rewards([p], invalid_penalty)
                state.apply_action(a)
        return [float(r) for r in state.returns()]

    # ------------------------------------------------------------------ information sets
    def small_enough(self) -> bool:
        """Whether :meth:`information_sets` can list the game (its tree has at most ``MAX_STATES`` states)."""
        if self._sets is not None:
            return True
        try:
            self.information_sets()
        except OverflowError:
            return False
        return True

    def information_sets(self) -> dict[tuple[int, str], InfoSet]:
        """Every information set of both players, keyed ``(player, information-state string)``, by a walk
        of the whole tree (cached). ``OverflowError`` for a tree of more than ``MAX_STATES`` states."""
        if self._sets is not None:
            return self._sets
        if not self.uses_information_state:
            raise ValueError(f"{self.name} provides no information-state strings: its sets cannot be listed")
        sets: dict[tuple[int, str], InfoSet] = {}
        seen = [0]

        def visit(key, state, player, last):
            if key not in sets:
                actions, words = self.legal(state, player)
                sets[key] = InfoSet(player, key[1], self.prompt(state, player), actions, words, last[player])

        def walk(state, last):
            seen[0] += 1
            if seen[0] > MAX_STATES:
                raise OverflowError(f"{self.name} has more than {MAX_STATES} states: too large to list")
            if state.is_terminal():
                return
            if state.is_chance_node():
                for a, _ in state.chance_outcomes():
                    walk(state.child(a), last)
                return
            if state.is_simultaneous_node():
                keys = {}
                for p in range(2):
                    if state.legal_actions(p):
                        keys[p] = (p, self.info_string(state, p))
                        visit(keys[p], state, p, last)
                for joint in itertools.product(*(state.legal_actions(p) or [None] for p in range(2))):
                    child = state.clone()
                    child.apply_actions([a if a is not None else 0 for a in joint])
                    walk(child, tuple((keys[p], joint[p]) if p in keys else last[p] for p in range(2)))
                return
            p = state.current_player()
            key = (p, self.info_string(state, p))
            visit(key, state, p, last)
            for a in state.legal_actions(p):
                walk(state.child(a), tuple((key, a) if q == p else last[q] for q in range(2)))

        walk(self.game.new_initial_state(), (None, None))
        self._sets = sets
        return sets

    def _sample_prompts(self, games: int, seed: int) -> list[tuple[str, tuple[str, ...]]]:
        """(prompt, moves) of every decision in ``games`` uniformly random games."""
        rng = random.Random(seed)
        out = []
        for _ in range(games):
            state = self.game.new_initial_state()
            while not state.is_terminal():
                if state.is_chance_node():
                    state.apply_action(_draw(state.chance_outcomes(), rng))
                    continue
                seats = [p for p in range(2) if state.legal_actions(p)] if state.is_simultaneous_node() \
                    else [state.current_player()]
                picks = {}
                for p in seats:
                    prompt = self.prompt(state, p)
                    out.append((prompt, self._prompts[prompt]))
                    picks[p] = rng.choice(state.legal_actions(p))
                if state.is_simultaneous_node():
                    state.apply_actions([picks.get(p, 0) for p in range(2)])
                else:
                    state.apply_action(picks[seats[0]])
        return out

    def warmup_examples(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` (prompt, move) pairs: information sets drawn uniformly (the prompts random play
        reaches, for a game too large to list), each with a uniformly drawn legal move: the format
        and the legal moves, no strategy."""
        rng = random.Random(seed)
        if self.small_enough():
            sets = sorted(self.information_sets().values(), key=lambda s: (s.player, s.key))
            picks = (sets[rng.randrange(len(sets))] for _ in range(n))
            return [(s.prompt, rng.choice(s.moves)) for s in picks]
        pool = self._sample_prompts(max(1, n // 4), seed)
        return [(p, rng.choice(ws)) for p, ws in (pool[rng.randrange(len(pool))] for _ in range(n))]

    def __repr__(self) -> str:
        return f"OpenSpielGame({self.name})"


def _draw(outcomes, rng: random.Random) -> int:
    """One chance outcome by its probability."""
    x, acc = rng.random(), 0.0
    for a, p in outcomes:
        acc += p
        if x < acc:
            return a
    return outcomes[-1][0]


_LOADED: dict[str, OpenSpielGame] = {}


def load(game, **options) -> OpenSpielGame:
    """The two-player OpenSpiel game ``game`` (a name such as ``"goofspiel(num_cards=4)"`` or a
    ``pyspiel.Game``) as a Game object (:class:`OpenSpielGame`; ``options``: its keyword arguments)."""
    return OpenSpielGame(game, **options)


def _default() -> OpenSpielGame:
    if DEFAULT not in _LOADED:
        _LOADED[DEFAULT] = load(DEFAULT)
    return _LOADED[DEFAULT]


async def play(players: list[dict], model, tokenizer=None, *, invalid_penalty=None, seed: int | None = None) -> list[float]:
    """One game of OpenSpiel's ``kuhn_poker`` through the adapter (:func:`load` another game)."""
    return await _default().play(players, model, tokenizer, invalid_penalty=invalid_penalty, seed=seed)


def moves(prompt: str) -> list[str]:
    return _default().moves(prompt)


def random_policy(prompt: str, rng: Any = None) -> str:
    return _default().random_policy(prompt, rng)


def warmup_examples(n: int, seed: int = 0) -> list[tuple[str, str]]:
    return _default().warmup_examples(n, seed)


def check_tokenizer(tokenizer) -> None:
    _default().check_tokenizer(tokenizer)
