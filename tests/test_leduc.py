"""Leduc poker: the rules (hand-checked and against OpenSpiel's ``leduc_poker``), exact
exploitability against OpenSpiel's, the as-played figures with invalid replies, mixtures, the
read-out of a model's replies, and the PSRO example on a tiny budget.

The game's conformance with the Game protocol is tests/test_games.py's suite, which discovers it."""

import asyncio
import copy
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from autocurricula.eval import leduc as ev
from autocurricula.games import leduc_poker as lp
from autocurricula.records import Player

PENALTY = lp.INVALID_PENALTY


def scripted(*texts_per_seat):
    """Two scripted players replying their texts in order."""
    its = [iter(t) for t in texts_per_seat]
    return [{"id": f"p{i}", "policy": (lambda it: lambda prompt: next(it))(it)} for i, it in enumerate(its)]


class FakeModel:
    def __init__(self):
        self.prompts = []

    async def generate(self, player, prompt, **sampling):
        self.prompts.append(prompt)
        return SimpleNamespace(text=player["policy"](prompt))


def play(texts1, texts2, cards, **kw):
    model = FakeModel()
    rewards = asyncio.run(lp.play(scripted(texts1, texts2), model, None, cards=cards, **kw))
    return rewards, model.prompts


def random_strategy(rng, invalid: float = 0.0):
    """A random strategy over every information set; ``invalid`` of each set's mass left to invalid replies."""
    out = {}
    for key, probs in ev.uniform_strategy().items():
        w = {a: rng.random() + 0.05 for a in probs}
        total = sum(w.values())
        out[key] = {a: (1 - invalid) * x / total for a, x in w.items()}
    return out


# -- rules -----------------------------------------------------------------------------------------
def test_hand_checked_payoffs_and_legal_words():
    assert lp.legal_actions([[]]) == ("check", "bet")
    assert lp.legal_actions([["bet"]]) == ("fold", "call", "raise")
    assert lp.legal_actions([["check", "bet", "raise"]]) == ("fold", "call")  # two bets a round at most
    assert lp.legal_actions([["bet", "call"], ["check"]]) == ("check", "bet")
    assert lp.contributions([["bet", "raise", "call"], ["bet", "raise"]]) == (9, 13)
    cases = [  # (cards: p1, p2, board), rounds, player 1's chips
        ("KQJ", [["bet", "fold"]], 1.0),  # p2 folds its ante
        ("KQJ", [["check", "bet", "fold"]], -1.0),
        ("JQK", [["bet", "raise", "fold"]], -3.0),  # p1 folds its ante and bet
        ("KQJ", [["check", "check"], ["check", "check"]], 1.0),  # high card
        ("QKQ", [["check", "check"], ["check", "check"]], 1.0),  # a pair beats a king
        ("JJQ", [["bet", "call"], ["check", "check"]], 0.0),  # equal cards split
        ("QJK", [["bet", "raise", "call"], ["bet", "raise", "call"]], 13.0),  # the largest pot
        ("QJK", [["bet", "raise", "call"], ["bet", "raise", "fold"]], -9.0),  # the largest fold
    ]
    for cards, rounds, want in cases:
        assert lp.payoff(cards, rounds) == (want, -want), (cards, rounds)
        texts = [[w for r in rounds for i, w in enumerate(r) if i % 2 == seat] for seat in (0, 1)]
        assert play(*texts, cards)[0] == [want, -want]
    assert lp.is_terminal([["bet", "fold"]]) and not lp.is_terminal([["bet", "call"]])
    with pytest.raises(ValueError, match="give round 2's words"):
        lp.legal_actions([["check", "check"]])
    for bad in ([["call"]], [["check", "raise"]], [["bet", "raise", "raise"]], [["bet", "fold"], []]):
        with pytest.raises(ValueError, match="not a Leduc poker history"):
            lp.legal_actions(bad)


def test_parsing_prompts_and_the_invalid_outcome():
    rewards, prompts = play(["bet", "I call", "check"], ["raise", "call"], "QKJ")
    assert rewards == [PENALTY[1], PENALTY[0]]  # "call" with no bet to face is illegal: player 2 forfeits
    assert prompts[0] == ("leduc poker, cards JJQQKK, ante 1, bets 2 then 4.\nyou are player 1, your card: Q, "
                          "board: ?\nround 1: none\nyour action (check/bet):")
    assert lp.parse_prompt(prompts[2]) == ("Q", None, (("bet", "raise"),), 0)
    assert lp.first_action("Fold then raise") == "fold" and lp.parse_action("hmm") is None
    assert lp.parse_action("check", ("fold", "call")) is None  # a word, but not legal here
    # the board shows from round 2 on, to both players
    _, prompts = play(["check", "check"], ["check", "check"], "QKJ")
    assert [lp.parse_prompt(p)[1] for p in prompts] == [None, None, "J", "J"]
    assert "board: J" in prompts[2] and "round 2: none" in prompts[2]
    for key in ev.INFOSETS[::17]:
        card, board, rounds = lp.parse_infoset(key)
        assert lp.parse_prompt(ev.prompt_of(key)) == (card, board, rounds, lp.to_move(rounds))
    assert play(["bet"], ["hmm"], "QKJ")[0] == [PENALTY[1], PENALTY[0]]
    assert play(["bet"], ["hmm"], "QKJ", invalid_penalty=(-3.0, 0.0))[0] == [0.0, -3.0]


def test_an_invalid_reply_never_pays_better_than_folding():
    folds = [lp.payoff("QJK", r)[0] for r in ([["bet", "fold"]], [["bet", "raise", "fold"]],
                                               [["bet", "raise", "call"], ["bet", "raise", "fold"]])]
    assert min(folds) == -9.0 and PENALTY[0] == min(folds) - 0.5  # as Kuhn poker's -1.5 against its fold of -1
    assert PENALTY[1] == -PENALTY[0]  # zero-sum: see test_invalid_replies_are_counted_not_renormalised


def test_deals_come_from_the_seed():
    assert lp.deal(random.Random(3)) == lp.deal(random.Random(3))
    deals = [lp.deal(random.Random(s)) for s in range(3000)]
    assert all(all(d.count(c) <= 2 for c in d) for d in deals)
    share = sum(d[0] == d[1] for d in deals) / len(deals)
    assert share == pytest.approx(1 / 5, abs=0.03)  # a pair of private cards: 1/5
    assert sum(lp.deal_odds("Q").values()) == pytest.approx(1.0) and lp.board_odds("QQ") == {"J": 0.5, "K": 0.5}


def test_warmup_covers_every_information_set_with_legal_words():
    examples = lp.warmup_examples(3000, seed=1)
    keys = set()
    for prompt, action in examples:
        card, board, rounds, seat = lp.parse_prompt(prompt)
        assert action in lp.legal_actions(rounds) and seat == lp.to_move(rounds)
        keys.add(lp.infoset(card, board, rounds))
    assert keys == set(ev.INFOSETS) and len(ev.INFOSETS) == 288
    strategy = lp.warmup_strategy(1)
    assert all(sum(p.values()) == pytest.approx(1.0) for p in strategy.values())
    assert lp.warmup_examples(50, seed=1) == examples[:50]


# -- against OpenSpiel -----------------------------------------------------------------------------
def _openspiel_walk(visit):
    """Calls ``visit(state, private ranks, board, rounds)`` at every state of OpenSpiel's game."""
    pyspiel = pytest.importorskip("pyspiel")
    game = pyspiel.load_game("leduc_poker")
    word = {1: ("check", "call"), 2: ("bet", "raise"), 0: ("fold",)}

    def walk(state, private, board, rounds):
        visit(state, private, board, rounds)
        if state.is_terminal():
            return
        if state.is_chance_node():
            for c, _ in state.chance_outcomes():
                rank = lp.RANKS[c // 2]
                if len(private) < 2:
                    walk(state.child(c), private + rank, board, rounds)
                else:
                    walk(state.child(c), private, rank, rounds + ((),))
            return
        legal = lp.legal_actions(rounds)
        assert sorted(ev.OPENSPIEL_ACTION[w] for w in legal) == sorted(state.legal_actions())
        for a in state.legal_actions():
            w = next(x for x in word[a] if x in legal)
            walk(state.child(a), private, board, rounds[:-1] + (rounds[-1] + (w,),))

    walk(game.new_initial_state(), "", None, ((),))
    return game


def test_rules_and_information_sets_match_openspiel():
    seen, keys = {}, set()

    def visit(state, private, board, rounds):
        if state.is_terminal():
            assert state.returns() == list(lp.payoff(private + board if board else private + "?", rounds))
        elif not state.is_chance_node():
            seat = state.current_player()
            key = lp.infoset(private[seat], board, rounds)
            assert seen.setdefault(state.information_state_string(), key) == key  # one of ours per OpenSpiel set
            keys.add(key)

    _openspiel_walk(visit)
    assert len(seen) == 936 and keys == set(ev.INFOSETS)


def test_exploitability_matches_openspiel():
    pytest.importorskip("pyspiel")
    uniform = ev.uniform_strategy()
    always_call = {k: {("check" if "check" in p else "call"): 1.0} for k, p in uniform.items()}
    rng = random.Random(0)
    for s in [uniform, always_call] + [random_strategy(rng) for _ in range(3)]:
        assert ev.exploitability(s, backend="python") == pytest.approx(ev.exploitability(s, backend="openspiel"),
                                                                       abs=1e-9)
    assert ev.exploitability(uniform, backend="python") == pytest.approx(2.373611111, abs=1e-8)  # NashConv 4.747
    with pytest.raises(ValueError, match="lacks 287"):
        ev.exploitability({"J:": {"check": 1.0}})
    with pytest.raises(ValueError, match="played_exploitability"):
        ev.exploitability(random_strategy(rng, invalid=0.1))


def test_exact_value_matches_openspiel():
    pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms.expected_game_score import policy_value

    import pyspiel

    s = random_strategy(random.Random(4))
    game = pyspiel.load_game("leduc_poker")
    pol = ev.openspiel_policy(s, game)
    assert ev.exact_value(s) == pytest.approx(policy_value(game.new_initial_state(), [pol, pol]), abs=1e-9)


def test_a_cfr_strategy_read_by_rank_scores_alike_on_both_backends():
    """OpenSpiel's CFR average policy, its suits averaged per rank, is scored alike by both
    backends, and far below uniform."""
    pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms import cfr

    game = _openspiel_walk(lambda *a: None)
    solver = cfr.CFRSolver(game)
    for _ in range(30):
        solver.evaluate_and_update_policy()
    avg = solver.average_policy()
    suited = {}  # our key -> the strategies of its suited OpenSpiel states

    def visit(state, private, board, rounds):
        if not state.is_terminal() and not state.is_chance_node():
            key = lp.infoset(private[state.current_player()], board, rounds)
            probs = avg.action_probabilities(state)
            legal = lp.legal_actions(rounds)
            suited.setdefault(key, {})[state.information_state_string()] = {
                w: float(probs[ev.OPENSPIEL_ACTION[w]]) for w in legal}

    _openspiel_walk(visit)
    mean = {k: {w: float(np.mean([p[w] for p in v.values()])) for w in next(iter(v.values()))}
            for k, v in suited.items()}
    mine = ev.exploitability(mean, backend="python")
    assert mine == pytest.approx(ev.exploitability(mean, backend="openspiel"), abs=1e-9)
    assert mine < 0.5 * ev.exploitability(ev.uniform_strategy(), backend="python")


# -- as played -------------------------------------------------------------------------------------
def _game_value(s0, s1, penalty=PENALTY) -> tuple[float, float]:
    """Both players' exact chips with ``s0`` in seat 0 and ``s1`` in seat 1, by stepping the game
    object itself over every deal and reply (an invalid reply is the text "hmm")."""
    def value(game, p) -> np.ndarray:
        if game.done:
            return p * np.array(game.rewards(penalty))
        card, board, rounds, seat = lp.parse_prompt(game.prompt())
        probs = (s0, s1)[seat][lp.infoset(card, board, rounds)]
        total = np.zeros(2)
        for reply, q in [*probs.items(), ("hmm", 1.0 - sum(probs.values()))]:
            if q > 0:
                g = copy.deepcopy(game)
                g.step(reply)
                total += value(g, p * q)
        return total

    out = np.zeros(2)
    for a in lp.RANKS:
        for b, pb in lp.deal_odds(a).items():
            for c, pc in lp.board_odds(a + b).items():
                out += value(lp.LeducPoker(a + b + c), lp.DECK.count(a) / 6 * pb * pc)
    return tuple(out)


def _seats(s0, s1):
    """One strategy playing ``s0``'s sets in seat 0 and ``s1``'s in seat 1."""
    return {k: (s0 if lp.to_move(lp.parse_infoset(k)[2]) == 0 else s1)[k] for k in ev.INFOSETS}


def test_played_values_and_best_responses_follow_the_game_with_forfeits():
    rng = random.Random(5)
    leaky, other = random_strategy(rng, invalid=0.2), random_strategy(rng)
    for penalty in (PENALTY, (-1.5, 0.5)):
        assert ev.exact_value(_seats(leaky, other), penalty) == pytest.approx(_game_value(leaky, other, penalty))
        assert ev.exact_value(_seats(other, leaky), penalty) == pytest.approx(_game_value(other, leaky, penalty))
    # a best response beats every fixed responder, and an exact one is attained by some pure responder
    br0, br1 = ev.best_response_value(leaky, 0), ev.best_response_value(leaky, 1)
    for _ in range(5):
        t = random_strategy(rng)
        assert br0 >= ev.exact_value(_seats(t, leaky))[0] - 1e-9
        assert br1 >= ev.exact_value(_seats(leaky, t))[1] - 1e-9
    assert ev.played_exploitability(leaky) == pytest.approx((br0 + br1) / 2)
    # never a legal word: the responder collects the forfeit every hand, in either seat
    silent = {k: {} for k in ev.INFOSETS}
    assert ev.played_exploitability(silent) == pytest.approx(PENALTY[1])
    assert ev.invalid_rate(silent) == 1.0 and ev.invalid_per_hand(silent) == pytest.approx(1.0)
    clean = random_strategy(rng)
    assert ev.played_exploitability(clean) == pytest.approx(ev.exploitability(clean, backend="python"), abs=1e-12)
    assert ev.invalid_rate(clean) == pytest.approx(0.0, abs=1e-12) and ev.invalid_per_hand(clean) < 1e-12


def test_invalid_replies_are_counted_not_renormalised():
    rng = random.Random(6)
    s = random_strategy(rng)
    leaky = {k: ({a: 0.5 * p for a, p in v.items()} if k.startswith("K") else v) for k, v in s.items()}
    assert ev.invalid_rate(leaky) == pytest.approx(0.5 * sum(k.startswith("K") for k in ev.INFOSETS) / 288)
    # the same strategy renormalised is s; as played, half of a king's hands end in a forfeit
    assert ev.played_exploitability(leaky) > ev.played_exploitability(s) + 0.3
    # a forfeit paying the other player less than the pot would let nonsense hide a losing hand
    assert ev.played_exploitability(leaky, (-9.5, 0.5)) < ev.played_exploitability(s)
    assert 0.1 < ev.invalid_per_hand(leaky) < 0.5


def test_played_mixture_is_drawing_one_player_per_hand():
    rng = random.Random(7)
    players = [random_strategy(rng, invalid=x) for x in (0.0, 0.1, 0.3)]
    weights = [0.5, 0.2, 0.3]
    mix = ev.played_mixture(players, weights)
    for _ in range(2):
        opp = random_strategy(rng)
        as_p1 = sum(w * np.array(ev.exact_value(_seats(s, opp))) for s, w in zip(players, weights))
        as_p2 = sum(w * np.array(ev.exact_value(_seats(opp, s))) for s, w in zip(players, weights))
        assert ev.exact_value(_seats(mix, opp)) == pytest.approx(tuple(as_p1), abs=1e-9)
        assert ev.exact_value(_seats(opp, mix)) == pytest.approx(tuple(as_p2), abs=1e-9)
    alone = ev.played_mixture([players[0]], [3.0])
    assert all(alone[k] == pytest.approx(players[0][k]) for k in ev.INFOSETS)
    with pytest.raises(ValueError, match="one weight per strategy"):
        ev.played_mixture(players, [1.0])
    with pytest.raises(ValueError, match="non-negative"):
        ev.played_mixture(players, [1.0, -1.0, 0.0])


class CharEngine:
    """A stand-in engine over characters: at each information set's prompt it replies each legal
    word, the illegal word "check" or "fold" where it is illegal, or junk, with known probabilities."""

    def __init__(self, targets):
        self.targets = targets
        self.tokenizer = SimpleNamespace(eos_token_id=0, decode=lambda ids, skip_special_tokens=True: "".join(
            chr(i) for i in ids if i != 0))
        self.prompts = {tuple(self.encode(ev.prompt_of(k))): k for k in targets}

    @staticmethod
    def encode(text):
        return [ord(c) for c in text]

    def logits(self, ids, player):
        n = next(len(p) for p in self.prompts if tuple(ids[:len(p)]) == p)
        words = self.targets[self.prompts[tuple(ids[:n])]]
        out = np.full((len(ids), 128), -50.0)
        prefix = "".join(map(chr, ids[n:]))
        mass = sum(m for w, m in words.items() if w.startswith(prefix))
        for c in {w[len(prefix)] for w in words if w.startswith(prefix) and len(w) > len(prefix)}:
            out[-1, ord(c)] = np.log(sum(m for w, m in words.items() if w.startswith(prefix + c)) / mass)
        if prefix in words:  # a finished reply: the end token
            out[-1, 0] = np.log(words[prefix] / mass)
        return out


def test_read_played_counts_illegal_words_and_junk_as_invalid():
    rng = random.Random(8)
    targets, want = {}, {}
    for key, probs in random_strategy(rng, invalid=0.3).items():
        legal = lp.legal_actions(lp.parse_infoset(key)[2])
        illegal = "fold" if "check" in legal else "check"
        targets[key] = {**probs, illegal: 0.2, "zz": 0.1}  # "zz" never names an action: invalid
        want[key] = probs
    engine = CharEngine(targets)
    played, unresolved = ev.read_played(engine, None, max_tokens=8, threshold=1e-12)
    assert unresolved < 1e-12
    for key in ev.INFOSETS:
        assert played[key] == pytest.approx(want[key], abs=1e-9)
    assert ev.invalid_rate(played) == pytest.approx(0.3, abs=1e-9)


# -- the example -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_psro_leduc_example_smoke(tmp_path):
    """The measurement command runs end to end on a tiny budget and prints its final line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "examples" / "psro_leduc.py"), "--smoke"], capture_output=True,
                         text=True, timeout=1200, cwd=root / "examples",
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(last["final"]) == {"psro", "selfplay", "fictitious"}
    for row in last["final"].values():
        assert row["exploitability"] >= 0 and 0 <= row["invalid_rate"] <= 1 and 0 <= row["invalid_per_hand"] <= 1


def test_mixture_figures_reads_frozen_players_once_and_scores_the_mixture():
    from autocurricula.eval.played import MixtureFigures

    rng = random.Random(9)
    strategies = {"a": random_strategy(rng, invalid=0.1), "b": random_strategy(rng)}
    reads = []

    def read(engine, player, temperature):
        reads.append((player, temperature))
        return strategies[player], 0.01

    trainer = SimpleNamespace(engine=None, run=SimpleNamespace(grpo=SimpleNamespace(temperature=0.7)), current_epoch=0,
                              players=[Player(id="a", frozen=True), Player(id="b", frozen=False)],
                              deployable_mixture=lambda: {"a": 0.25, "b": 0.75})
    lines = []
    figures = MixtureFigures(read, ev.played_mixture, lambda mix: {"exploitability": ev.played_exploitability(mix),
                                                                  "invalid_rate": ev.invalid_rate(mix)},
                             name="psro", seed=3, printer=lines.append)
    logged = figures(trainer)
    trainer.current_epoch = 1
    figures(trainer)
    assert reads == [("a", 0.7), ("b", 0.7), ("b", 0.7)]  # the frozen player once
    mix = ev.played_mixture([strategies["a"], strategies["b"]], [0.25, 0.75])
    assert logged == {"eval/exploitability_played": round(ev.played_exploitability(mix), 4),
                      "eval/invalid_rate": round(ev.invalid_rate(mix), 4)}
    row = json.loads(lines[-1])
    assert row["epoch"] == 1 and row["trainer"] == "psro" and row["seed"] == 3 and row["unresolved"] == 0.01
    assert row["mixture"] == {"a": 0.25, "b": 0.75} and figures.rows[-1] == row
