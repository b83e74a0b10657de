"""branch_advantage="moves": every legal move is forced in branches of its own, and the policy is
regressed toward a bounded softmax of the moves' values. The maths by hand, a forced answer in a
replay, values with known odds on a game without a model, the errors, and (slow) a tiny model that
learns card-dependent Kuhn play against a fixed opponent."""

import asyncio
import importlib.util
import json
import math
import shutil
import sys
import types
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from autocurricula import SelfPlayConfig
from autocurricula.arena.arena import Arena, GameRecord, Generation
from autocurricula.loop.config import GRPOConfig
from autocurricula.credit import (BranchCredit, MirrorCredit, game_moves, make_credit, mirror_distribution,
                                  move_advantages, move_distribution, pool_values)
from autocurricula.arena.game import as_play
from autocurricula.games import kuhn_poker
from autocurricula.arena.replay import Replayer

from helpers import example_module


def best_reply_module():
    """examples/best_reply_credit.py: BranchCredit with greedy continuations, reply search, cross-entropy."""
    path = Path(__file__).resolve().parent.parent / "examples" / "best_reply_credit.py"
    spec = importlib.util.spec_from_file_location("best_reply_credit", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BestReplyCredit = best_reply_module().BestReplyCredit
variants = example_module("credit_variants")  # examples/credit_variants.py: catch-up steps, the table iterate
MirrorVariantCredit, catch_up_step, table_average = variants.MirrorVariantCredit, variants.catch_up_step, \
    variants.table_average


class CharTokenizer:
    eos_token_id = 3

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


class DigitEngine:
    """No model: every call answers a uniform digit from its sampling seed; ``logits`` favour one
    digit by ``bias`` nats, so the scored log-probabilities are known."""

    def __init__(self, bias: dict | None = None):
        self.tokenizer = CharTokenizer()
        self.bias = bias or {}
        self.scored = []  # (player, pairs, temperature) per scoring call

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))

    def submit_many(self, requests):
        return [self.submit(*r) for r in requests]

    def submit(self, ids, adapter, params):
        text = str(int(np.random.default_rng(params.seed).integers(10)))
        fut = Future()
        fut.set_result(types.SimpleNamespace(text=text, token_ids=[ord(text)], logprobs=[-2.3], prompt_ids=list(ids),
                                             finish_reason="stop", adapter_version=1))
        return fut

    def completion_logprobs(self, pairs, player=None, temperature=1.0):
        self.scored.append((player, len(pairs), temperature))
        logits = np.zeros(128)
        for digit, nats in self.bias.items():
            logits[ord(digit)] += nats
        logp = logits - np.log(np.exp(logits).sum())
        return [float(sum(logp[t] for t in c)) for _, c in pairs]


def listing(play, moves):
    """The play callable of a two-player Game object whose ``play`` is ``play`` and which lists
    ``moves(prompt)`` (``autocurricula.arena.game.as_play``)."""
    class Listed:
        NUM_PLAYERS, ZERO_SUM = 2, True

        async def play(self, players, model, tokenizer=None):
            return await play(players, model, tokenizer)

        def moves(self, prompt):
            return moves(prompt)

        def random_policy(self, prompt, rng=None):
            return moves(prompt)[0]

    Listed.__name__ = play.__name__
    return as_play(Listed())


def digits(prompt):
    return list("0123456789")


async def _dice(players, model, tokenizer=None):
    """Seat 0 says a digit d, seat 1 a digit e; the higher digit wins. Seat 0's value after saying d
    is (2d - 9) / 10 against a uniform seat 1."""
    d = int((await model.generate(players[0], "roll", max_tokens=1)).text)
    e = int((await model.generate(players[1], f"beat {d}", max_tokens=1)).text)
    return [1.0, -1.0] if d > e else [-1.0, 1.0] if e > d else [0.0, 0.0]


dice = listing(_dice, digits)


def logged(arena, play, n, prefix="g"):
    games = [(play, [{"id": "p0"}, {"id": "p1"}], GameRecord(f"{prefix}{i}", [{"id": "p0"}, {"id": "p1"}], calls=[]),
              "game") for i in range(n)]
    records = asyncio.run(arena.run(games))
    for r in records:
        for t in r.turns:
            t.reward = r.rewards[t.seat]
    return records


# ---------------------------------------------------------------------- maths
def test_move_advantages_by_hand():
    # call loses 2 chips, fold 1: centred values -0.5 / +0.5, over tau 0.25: -2 / +2
    lp = [math.log(0.9), math.log(0.1)]
    adv = move_advantages([-2.0, -1.0], lp, 0.25)
    gap = (lp[0] - lp[1]) / 2
    assert adv == pytest.approx([-2.0 - gap, 2.0 + gap])
    # at the fixed point (log-probs = the bounded targets, up to a constant) nothing is pushed
    assert move_advantages([-2.0, -1.0], [-2.0 - 7, 2.0 - 7], 0.25) == pytest.approx([0.0, 0.0])
    # the bound: a clearly better move pulls to +-c, not to (Q - mean Q) / tau
    assert move_advantages([3.0, -3.0], [0.0, 0.0], 0.25, max_logit=2.0) == pytest.approx([2.0, -2.0])
    assert move_advantages([3.0, -3.0], [0.0, 0.0], 0.25) == pytest.approx([12.0, -12.0])
    # residuals sum to zero: the update moves probability between moves, not onto every move
    assert sum(move_advantages([0.3, -1.0, 2.0], [-0.1, -2.0, -3.0], 0.5, 1.0)) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="temperature"):
        move_advantages([1.0], [0.0], 0.0)
    with pytest.raises(ValueError, match="one value"):
        move_advantages([1.0, 2.0], [0.0], 1.0)


def test_move_distribution_by_hand():
    # centred values -0.5 / +0.5 over tau 0.25: logits -2 / +2
    assert move_distribution([-2.0, -1.0], 0.25) == pytest.approx([1 / (1 + math.e ** 4), 1 / (1 + math.e ** -4)])
    assert move_distribution([3.0, -3.0], 0.25, max_logit=1.0) == pytest.approx(
        [math.e / (math.e + 1 / math.e), (1 / math.e) / (math.e + 1 / math.e)])  # the bound
    assert sum(move_distribution([0.3, -1.0, 2.0], 0.5, 1.0)) == pytest.approx(1.0)
    assert move_distribution([1.0, 1.0, 1.0], 0.1) == pytest.approx([1 / 3] * 3)
    with pytest.raises(ValueError, match="temperature"):
        move_distribution([1.0], 0.0)


def test_mirror_distribution_by_hand():
    # values 1 / 0 over tau 0.5: y = +1 / -1; from a uniform policy a step of 0.25 goes to logits +-0.25
    assert mirror_distribution([1.0, 0.0], [math.log(0.5)] * 2, 0.5, step=0.25) == pytest.approx(
        [1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(0.5))])
    # the log-probabilities need not be normalised over the moves: only their differences count
    assert mirror_distribution([1.0, 0.0], [-7.0, -7.0], 0.5, step=0.25) == pytest.approx(
        mirror_distribution([1.0, 0.0], [0.0, 0.0], 0.5, step=0.25))
    values, logp = [0.3, -1.0, 2.0], [math.log(0.2), math.log(0.5), math.log(0.3)]
    assert mirror_distribution(values, logp, 0.5, 1.0, step=1.0) == pytest.approx(move_distribution(values, 0.5, 1.0))
    target = move_distribution(values, 0.5, 1.0)  # the fixed point: a policy at its target stays there
    assert mirror_distribution(values, [math.log(p) for p in target], 0.5, 1.0, step=0.1) == pytest.approx(target)
    pi = [0.2, 0.5, 0.3]  # k steps from pi: log pi_k = (1 - w)^k log pi + (1 - (1 - w)^k) y, normalised
    for _ in range(5):
        pi = mirror_distribution(values, [math.log(p) for p in pi], 0.5, 1.0, step=0.3)
    want = np.exp(0.7 ** 5 * np.log([0.2, 0.5, 0.3]) + (1 - 0.7 ** 5) * np.log(target))
    assert pi == pytest.approx(list(want / want.sum()))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="step"):
            mirror_distribution(values, logp, 0.5, step=bad)
    for bad in (-math.inf, math.nan):
        with pytest.raises(ValueError, match="finite log-probability"):
            mirror_distribution([1.0, 0.0], [0.0, bad], 0.5, step=1.0)
    with pytest.raises(ValueError, match="one value"):
        mirror_distribution([1.0, 2.0], [0.0], 0.5, step=0.5)


def test_cross_entropy_moves_keep_the_mass_on_the_listed_moves(tiny_model_path):
    """The two move losses share a fixed point, but only the cross-entropy raises the probability of
    the listed moves together; the residuals sum to zero and move the differences between them."""
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.records import Turn
    from autocurricula.training import Updater

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4))
    try:
        spec = LoraSpec(r=4, lora_alpha=8, target_modules="all-linear")
        dims = {p: eng.linear_dims[p] for p in spec.resolve(eng.linear_dims)}
        for name in ("residual", "cross_entropy"):
            eng.load_adapter(name, AdapterWeights.random(dims, spec, seed=0, b_std=0.0))
        prompt = eng.encode("pick a cell:")
        moves = [eng.encode(m) + [eng.tokenizer.eos_token_id] for m in ("1", "2", "3")]
        q = [1.0, 0.0, -1.0]

        def listed_mass(name):
            return sum(math.exp(lp) for lp in eng.completion_logprobs([(prompt, m) for m in moves], name))

        before = listed_mass("residual")
        for name in ("residual", "cross_entropy"):
            up = Updater(eng, GRPOConfig(learning_rate=1e-2, loss_type="grpo"))
            for _ in range(5):
                lp = eng.completion_logprobs([(prompt, m) for m in moves], name)
                adv = move_advantages(q, lp, 0.5, 2.0) if name == "residual" else move_distribution(q, 0.5, 2.0)
                up.step([Turn(name, "g", "X", prompt, m, [0.0] * len(m), reward=0.0, advantage=a, target=True)
                         for m, a in zip(moves, adv)])
        assert before < 1e-3  # a random model rarely says these
        assert listed_mass("cross_entropy") > 0.9  # 5 steps put nearly all of it on the moves
        assert listed_mass("residual") < 0.01  # the differences moved, the mass hardly
    finally:
        eng.close()


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_move_targets_settle_at_their_shares_whatever_the_moves_token_counts(tiny_model_path, loss_type):
    """Cross-entropy toward a 50/50 target over a one-token and a longer move ends near 50/50 under
    every loss type. Under "grpo" a row's tokens are averaged; were each target row divided by its own
    length, the short move's fixed point would be the long one's length over both (2 and 8 tokens: 0.8;
    0.75 after these 40 steps, measured), not 0.5."""
    from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec
    from autocurricula.records import Turn
    from autocurricula.training import Updater

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=4))
    try:
        spec = LoraSpec(r=4, lora_alpha=8, target_modules="all-linear")
        dims = {p: eng.linear_dims[p] for p in spec.resolve(eng.linear_dims)}
        eng.load_adapter("p", AdapterWeights.random(dims, spec, seed=0, b_std=0.0))
        prompt = eng.encode("your move:")
        eos = eng.tokenizer.eos_token_id
        short, long = eng.encode("1") + [eos], eng.encode("1 2 3 4") + [eos]
        assert len(long) >= 2 * len(short)  # lengths far enough apart for the bias to show
        up = Updater(eng, GRPOConfig(learning_rate=1e-2, loss_type=loss_type))
        for _ in range(40):
            up.step([Turn("p", "g", "X", prompt, m, [0.0] * len(m), reward=0.0, advantage=0.5, target=True)
                     for m in (short, long)])
        p_short, p_long = (math.exp(lp) for lp in eng.completion_logprobs([(prompt, short), (prompt, long)], "p"))
        assert p_short + p_long > 0.9  # the targets' mass is on the two moves
        assert p_short / (p_short + p_long) == pytest.approx(0.5, abs=0.08)
    finally:
        eng.close()


def test_engine_scores_completions_as_its_full_logits_do(tiny_model_path):
    from autocurricula.engine import AdapterWeights, Engine, LoraSpec

    eng = Engine(tiny_model_path)
    try:
        eng.load_adapter("p", AdapterWeights.random(eng.linear_dims, LoraSpec(r=4, lora_alpha=8), seed=1, b_std=0.5))
        pairs = [([1, 5, 9, 4], [7, 2]), ([3, 8], [6]), ([1, 5, 9, 4, 11, 12, 13], [2, 2, 5])]  # ragged: padding
        pairs = pairs * 25  # 75 rows: more than one batch of 64
        for player, temperature in ((None, 1.0), ("p", 1.0), ("p", 0.7)):
            got = eng.completion_logprobs(pairs, player, temperature)
            assert len(got) == len(pairs)
            for (prompt, comp), g in list(zip(pairs, got))[:3] + list(zip(pairs, got))[-3:]:
                full = np.asarray(eng.logits(prompt + comp, player), dtype=np.float64) / temperature
                rows = full[len(prompt) - 1:len(prompt) - 1 + len(comp)]
                lse = np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1)) + rows.max(1)
                assert g == pytest.approx(float(sum(rows[i, t] - lse[i] for i, t in enumerate(comp))), abs=1e-4)
        with pytest.raises(ValueError, match="empty"):
            eng.completion_logprobs([([1], [])])
    finally:
        eng.close()


def test_move_settings_are_checked():
    assert BranchCredit(advantage="moves").move_clip == 2.0
    assert BranchCredit(move_clip=math.inf).move_clip == math.inf  # no bound
    for bad in (dict(move_temperature=0.0), dict(move_clip=-1.0), dict(move_temperature="x"),
                dict(move_temperature=math.inf)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            BranchCredit(advantage="moves", **bad)


def test_kuhn_lists_its_legal_moves():
    for history, legal in (((), ["check", "bet"]), (("check",), ["check", "bet"]), (("bet",), ["call", "fold"]),
                           (("check", "bet"), ["call", "fold"])):
        prompt = kuhn_poker.render_prompt("Q", history, len(history) % 2)
        assert kuhn_poker.moves(prompt) == legal and game_moves(kuhn_poker.play)(prompt) == legal


def test_tictactoe_lists_its_free_cells():
    from autocurricula.games import tictactoe

    prompt = tictactoe.render_prompt("X.O..X...", "O")
    assert tictactoe.moves(prompt) == ["2", "4", "5", "7", "8", "9"] and game_moves(tictactoe.play) == tictactoe.moves


# ---------------------------------------------------------------------- replay with a forced answer
def test_a_branch_can_answer_the_state_with_a_chosen_move():
    arena = Arena(DigitEngine(), seed=0)
    rec, = logged(arena, dice, 1)
    ids = rec.calls[0][2]
    nine = Generation("9", [ord("9")], [0.0], ids, "stop", 1, "p0")
    per_move, = Replayer(arena, dice).branch_moves([(rec, 0, [nine])], 30)
    games, = per_move
    assert len(games) == 30 and all(g.error is None for g in games)
    assert all(g.rewards[0] >= 0 for g in games)  # seat 0 said 9: it never loses
    assert all(not g.turns or g.turns[0].prompt_ids != ids for g in games)  # the forced move is no turn
    assert len({tuple(g.turns[0].completion_ids) for g in games}) > 3  # seat 1 answers afresh in each


# ---------------------------------------------------------------------- values with known odds
def test_move_targets_match_known_values():
    eng = DigitEngine(bias={"9": 1.0})
    arena = Arena(eng, seed=3)
    records = logged(arena, dice, 2)
    credit = BranchCredit(samples=300, advantage="moves", move_temperature=0.5, move_clip=1.5, turns_per_game=1)
    credit.see_round(records, Replayer(arena, dice))
    turns = [t for r in records for t in r.turns]
    adv = credit.advantages(turns)
    targets = credit.extra_turns(turns)
    assert credit.metrics()["credit/branched_turns"] == 2 and len(targets) == 2 * 10
    assert credit.metrics()["credit/branch_games"] == 2 * 10 * 300
    branched = {t.player for t in targets}
    assert sorted(p for p, _, _ in eng.scored) == sorted(branched)  # one scoring call per player, all its moves
    assert sum(n for _, n, _ in eng.scored) == 2 * 10 and {T for _, _, T in eng.scored} == {1.0}
    for t in targets:  # a move turn is the branched turn's player, prompt and seat, with the move's ids
        twin = next(x for r in records for x in r.turns if x.game_id == t.game_id and x.player == t.player)
        assert (t.prompt_ids, t.seat, t.role) == (twin.prompt_ids, twin.seat, twin.role)
    assert all(t.target and t.logprobs == [0.0] * len(t.completion_ids) for t in targets)
    # seat 0's move d is worth (2d - 9) / 10; seat 1's move e after d is worth sign(e - d)
    for rec in records:
        group = [t for t in targets if t.game_id == rec.game_id]
        seat = group[0].seat
        d = int(rec.calls[0][3].text)
        q = [(2 * m - 9) / 10 if seat == 0 else float(np.sign(m - d)) for m in range(10)]
        lp = [1.0 if m == 9 else 0.0 for m in range(10)]  # + a constant: log-softmax of the biased logits
        want = move_advantages(q, lp, 0.5, 1.5)
        got = [t.advantage for t in sorted(group, key=lambda t: t.completion_ids)]
        assert [chr(t.completion_ids[0]) for t in sorted(group, key=lambda t: t.completion_ids)] == list("0123456789")
        assert all(t.completion_ids[-1] == 3 for t in group)  # the move, then eos
        tol = 0.25 / 0.5 if seat == 0 else 0.35 / 0.5  # ~4 standard errors of 300 returns, over tau
        assert np.allclose(got, want, atol=tol), (seat, got, want)
    # a branched turn whose reply is a legal move gets 0: its state's move turns carry the update
    assert sum(a == 0.0 for a in adv) >= 2
    assert credit.extra_turns(turns) == []  # targets serve their round once


def test_pool_values_by_hand():
    returns = {1: [[1.0, -1.0], [0.0]], 2: [[1.0], [2.0, None]], 3: [[5.0], [6.0]], 4: [[7.0], [8.0], [9.0]]}
    keys = {1: ("a", (1, 2)), 2: ("a", (1, 2)), 3: ("b", (1, 2)), 4: ("a", (1, 2))}
    pooled = pool_values(returns, keys)
    assert pooled[1] == pooled[2] == [[1.0, -1.0, 1.0], [0.0, 2.0, None]]  # one player's prompt: all its visits
    assert pooled[3] == [[5.0], [6.0]]  # another player's turns stay apart
    assert pooled[4] == [[7.0], [8.0], [9.0]]  # another list of moves: apart
    assert returns[1] == [[1.0, -1.0], [0.0]]  # the input is left as it was


def seat0_targets(credit, seed: int, games: int, engine=None) -> list[list[float]]:
    """The advantages of seat 0's move turns in each of ``games`` dice games, after one round."""
    arena = Arena(engine or DigitEngine(), seed=seed)
    records = logged(arena, dice, games)
    credit.see_round(records, Replayer(arena, dice))
    turns = [t for r in records for t in r.turns]
    credit.advantages(turns)
    out = {}
    for t in credit.extra_turns(turns):
        if t.seat == 0:
            out.setdefault(t.game_id, []).append(t.advantage)
    return list(out.values())


def state_targets(credit, arena, records) -> dict:
    """One round of dice ``records``: the advantages of the move turns by (seat, prompt ids)."""
    credit.see_round(records, Replayer(arena, dice))
    turns = [t for r in records for t in r.turns]
    credit.advantages(turns)
    out = {}
    for t in credit.extra_turns(turns):
        out.setdefault((t.seat, tuple(t.prompt_ids)), []).append(t.advantage)
    return out


def test_pooled_states_share_one_target_per_prompt():
    """Seat 0's prompt is the same in every dice game: pooled, its turns get one set of targets, from
    all their branches (so closer to the true values than one visit's); unpooled, each visit its own."""
    def targets(pool):
        credit = BranchCredit(samples=60, advantage="moves", move_temperature=0.5, move_clip=1.5, pool_states=pool)
        return seat0_targets(credit, 5, 4)

    pooled, apart = targets(True), targets(False)
    assert len(pooled) == len(apart) == 4
    assert all(g == pooled[0] for g in pooled) and not all(g == apart[0] for g in apart)
    want = np.array(move_advantages([(2 * m - 9) / 10 for m in range(10)], [0.0] * 10, 0.5, 1.5))
    # a move's value from 240 returns has a standard error of at most 1 / sqrt(240) = 0.065: 5 of them, over tau
    assert np.allclose(pooled[0], want, atol=5 * 0.065 / 0.5)
    error = lambda g: np.abs(np.array(g) - want).mean()  # noqa: E731
    assert error(pooled[0]) < np.mean([error(g) for g in apart])  # four visits' branches beat one's
    for bad in (dict(pool_states="yes"), dict(pool_states=True, advantage="return")):
        with pytest.raises(ValueError, match="pool_states"):
            BranchCredit(**{"advantage": "moves", **bad})


@pytest.mark.parametrize("replies", [False, True])
def test_pooled_cross_entropy_targets_are_one_distribution_per_prompt(replies):
    """The pooled recipe of the PSRO examples (``BestReplyCredit(move_loss="cross_entropy",
    pool_states=True)``): seat 0's move turns carry one target distribution over its ten moves,
    the same in every game, with or without the reply search."""
    credit = BestReplyCredit(samples=20, advantage="moves", move_loss="cross_entropy", move_temperature=0.1,
                             move_clip=3.0, pool_states=True, replies=replies)
    groups = seat0_targets(credit, 6, 3)
    assert len(groups) == 3 and all(g == groups[0] for g in groups)
    assert sum(groups[0]) == pytest.approx(1.0) and min(groups[0]) > 0  # a distribution over the moves
    # 9 wins most and 0 least, whether seat 1 replies at random or at best (the bound makes ties at the ends)
    assert groups[0][9] == max(groups[0]) > groups[0][0] == min(groups[0])


async def _share(players, model, tokenizer=None):
    """``dice``'s moves, but both seats get (d + e) / 18: the replier's best reply is the mover's too."""
    d = int((await model.generate(players[0], "roll", max_tokens=1)).text)
    e = int((await model.generate(players[1], f"beat {d}", max_tokens=1)).text)
    return [(d + e) / 18, (d + e) / 18]


share = listing(_share, digits)


async def _judged(players, model, tokenizer=None):
    """``dice`` with the replier asked as a judge (trainable=False) before its move: the reply search
    must answer the move, not the judge call."""
    d = int((await model.generate(players[0], "roll", max_tokens=1)).text)
    await model.generate(players[1], f"judge {d}", max_tokens=1, trainable=False)
    e = int((await model.generate(players[1], f"beat {d}", max_tokens=1)).text)
    return [1.0, -1.0] if d > e else [-1.0, 1.0] if e > d else [0.0, 0.0]


judged = listing(_judged, digits)


@pytest.mark.parametrize("game", [dice, share, judged])
def test_reply_search_values_each_move_after_the_repliers_best_answer(game):
    """With replies=True a move's value is its return after the reply best for the replier's own seat:
    in ``dice`` (zero-sum) seat 1 answers 9, so every d < 9 loses and 9 draws; in ``share`` the
    replier also answers 9, which is now the mover's best case. The game ends after seat 1's move,
    so its values stand as they are. Exact with one branch each: nothing is left to chance."""
    eng = DigitEngine()
    arena = Arena(eng, seed=4)
    records = logged(arena, game, 3)
    credit = BestReplyCredit(samples=1, advantage="moves", move_temperature=0.5, move_clip=1.5, replies=True)
    credit.see_round(records, Replayer(arena, game))
    turns = [t for r in records for t in r.turns]
    credit.advantages(turns)
    targets = credit.extra_turns(turns)
    lp = [0.0] * 10  # the engine's scores: uniform digits
    for rec in records:
        d, e = int(rec.calls[0][3].text), int(rec.calls[-1][3].text)
        assert [c.seat for c in rec.calls] == ([0, -1, 1] if game is judged else [0, 1])
        if game is not share:
            q0 = [0.0 if m == 9 else -1.0 for m in range(10)]
            q1 = [float(np.sign(m - d)) for m in range(10)]
        else:
            q0 = [(m + 9) / 18 for m in range(10)]
            q1 = [(d + m) / 18 for m in range(10)]
        for seat, q in ((0, q0), (1, q1)):
            group = sorted((t for t in targets if t.game_id == rec.game_id and t.seat == seat),
                           key=lambda t: t.completion_ids)
            assert [t.advantage for t in group] == pytest.approx(move_advantages(q, lp, 0.5, 1.5)), (seat, d, e)
    # per game: 10 moves of seat 0 and 10 of seat 1 played out once, then 10 replies to each of seat 0's moves
    assert credit.metrics()["credit/branch_games"] == 3 * (10 + 10 + 10 * 10)
    without = BranchCredit(samples=1, advantage="moves", move_temperature=0.5, move_clip=1.5)
    without.see_round(records, Replayer(arena, game))
    assert without.metrics()["credit/branch_games"] == 3 * 20


def test_greedy_memo_leaves_best_reply_targets_unchanged(tiny_model_path):
    """Best-reply branch credit with greedy continuations on a real model: the replayer's memo
    answers repeated greedy calls without the engine, and the targets come out the same."""
    from autocurricula.engine import Engine, EngineConfig
    from autocurricula.games import tictactoe

    eng = Engine(str(tiny_model_path), config=EngineConfig(max_slots=2))
    try:
        arena = Arena(eng, seed=1, max_tokens=2)
        play = as_play(tictactoe.with_options(opening_moves=(0, 1)))  # X or O to move first
        seats = [{"id": "a", "adapter": None, "seat": 0}, {"id": "a", "adapter": None, "seat": 1}]
        games = [(play, seats, GameRecord(f"g{i}", seats, calls=[]), "t") for i in range(4)]
        records = asyncio.run(arena.run(games))
        assert {r.calls[0].seat for r in records} == {0, 1}  # one player in both seats, told apart
        for r in records:
            for t in r.turns:
                t.reward = r.rewards[t.seat]
        turns = [t for r in records for t in r.turns]
        got, asked = {}, {}
        for memo in (True, False):
            calls = []
            real = eng.submit_many
            eng.submit_many = lambda reqs, real=real: calls.append(len(reqs)) or real(reqs)
            try:
                credit = BestReplyCredit(samples=1, advantage="moves", continuation_temperature=0.0, replies=True,
                                         move_loss="cross_entropy")
                replayer = Replayer(arena, play)
                if not memo:
                    replayer.greedy_memo = None
                credit.see_round(records, replayer)
            finally:
                eng.submit_many = real
            got[memo], asked[memo] = [t.advantage for t in credit.extra_turns(turns)], sum(calls)
        assert got[True] == got[False] and got[True]
        assert asked[True] < asked[False]
    finally:
        eng.close()


def test_reply_search_needs_moves():
    with pytest.raises(ValueError, match="advantage='moves'"):
        BestReplyCredit(advantage="return", replies=True)
    assert BestReplyCredit(advantage="moves", replies=True).replies


def test_mirror_credit_targets_are_one_step_from_the_policy_toward_the_pooled_target():
    """The policy favours the digit 9 by one nat (the engine's scored log-probabilities; the games
    themselves are drawn alike): a step w of mirror descent gives ∝ pi^(1 - w) * plain^w, where
    plain is the cross-entropy target softmax(y) on the same branches (one arena seed: the same games)."""
    plain = seat0_targets(BestReplyCredit(samples=20, advantage="moves", move_loss="cross_entropy",
                                          move_temperature=0.5, move_clip=1.5, pool_states=True), 6, 3)[0]
    mirror = MirrorCredit(samples=20, move_temperature=0.5, move_clip=1.5, step=0.25)
    assert mirror.pool_states and mirror.scores_moves()  # the step needs log pi
    stepped = seat0_targets(mirror, 6, 3, DigitEngine(bias={"9": 1.0}))[0]
    logpi = np.array([0.0] * 9 + [1.0])
    want = np.exp(0.75 * logpi + 0.25 * np.log(plain))
    assert stepped == pytest.approx(list(want / want.sum()))
    assert seat0_targets(MirrorCredit(samples=20, move_temperature=0.5, move_clip=1.5, step=1.0), 6, 3,
                         DigitEngine(bias={"9": 1.0}))[0] == pytest.approx(plain)  # step 1: the target itself
    for bad in (0, 1.5, True, "half"):
        with pytest.raises(ValueError, match="step"):
            MirrorCredit(step=bad)
    with pytest.raises(TypeError, match="advantage"):
        MirrorCredit(advantage="return")  # always the listed moves
    assert type(make_credit("mirror", GRPOConfig(), 0)) is MirrorCredit
    assert (MirrorCredit().samples, MirrorCredit().step) == (2, 0.045)


def test_catch_up_step_is_the_missed_steps_at_once():
    """k mirror steps toward one target compose to one step of 1 - (1 - w)^k; one missed round is w itself."""
    values, logpi = [0.3, -0.2, 0.9], list(np.log([0.5, 0.3, 0.2]))
    for k in (1, 2, 7):
        pi = logpi
        for _ in range(k):
            pi = list(np.log(mirror_distribution(values, pi, 0.15, step=0.045)))
        assert mirror_distribution(values, logpi, 0.15, step=catch_up_step(0.045, k)) == pytest.approx(np.exp(pi))
    assert catch_up_step(0.045, 1) == 0.045
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="missed"):
            catch_up_step(0.045, bad)


def test_mirror_catch_up_steps_a_state_by_the_rounds_it_missed():
    """Dice, two rounds of three games: seat 1's prompt ("beat d") is met in some rounds only. In
    round 2 a prompt also met in round 1 takes the step w, one met first in round 2 the two steps
    it missed (the targets of catch_up=False at catch_up_step(w, 2), on the same games); seat 0's
    prompt, met every round, takes w. A checkpointed credit continues alike."""
    def targets(credit, played):
        return state_targets(credit, *played)

    rounds = []
    for seed in (11, 12):
        arena = Arena(DigitEngine(bias={"7": 1.0}), seed=seed)
        rounds.append((arena, logged(arena, dice, 3, prefix=f"r{seed}-")))
    credit = MirrorVariantCredit(samples=4, step=0.25, catch_up=True)
    first = targets(credit, rounds[0])
    state = json.loads(json.dumps(credit.state_dict()))
    second = targets(credit, rounds[1])
    assert credit.metrics()["credit/met_states"] == len({k for k in second})
    plain = {k: targets(MirrorCredit(samples=4, step=catch_up_step(0.25, k)), rounds[1])
             for k in (1, 2)}
    seen_before = {key for key in first}
    new = [key for key in second if key not in seen_before]
    old = [key for key in second if key in seen_before]
    assert new and old and any(seat == 0 for seat, _ in old)  # both kinds of state occur
    for key in old:
        assert second[key] == pytest.approx(plain[1][key])
    for key in new:
        assert second[key] == pytest.approx(plain[2][key]) and second[key] != pytest.approx(plain[1][key])
    assert credit.metrics()["credit/caught_up_states"] == len({k for k in new})
    resumed = MirrorVariantCredit(samples=4, step=0.25, catch_up=True)
    resumed.load_state_dict(state)
    assert targets(resumed, rounds[1]) == second
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match="catch_up"):
            MirrorVariantCredit(catch_up=bad)


def test_mirror_rounds_missed_counts_each_players_rounds():
    """A state met in rounds 1 and 3 of its player missed one: k = 2; a player that starts later counts
    its own rounds; a state dropped from the bounded table counts from the latest round dropped; the
    table survives a JSON checkpoint with its order; off, nothing is counted."""
    def met(credit, *states):  # one round in which ``states`` have targets, each asked twice
        credit.start_round()
        out = {state: credit.rounds_missed(state) for state in states}
        assert {state: credit.rounds_missed(state) for state in states} == out  # once per round
        return out

    a, b, c = ("p", "g", (1,)), ("p", "g", (2,)), ("p", "g", (3,))
    credit = MirrorVariantCredit(catch_up=True, max_states=3)
    assert met(credit, a, b) == {a: 1, b: 1}
    assert met(credit, a) == {a: 1}
    assert met(credit, b, ("q", "g", (1,))) == {b: 2, ("q", "g", (1,)): 1}  # q's first round
    saved = json.loads(json.dumps(credit.state_dict()))
    assert met(credit, c) == {c: 4}  # first met in p's 4th round; the table drops a (last met in 2)
    assert met(credit, a) == {a: 3}  # counted from round 2, the latest dropped
    resumed = MirrorVariantCredit(catch_up=True, max_states=3)
    resumed.load_state_dict(saved)
    assert met(resumed, c) == {c: 4} and met(resumed, a) == {a: 3}
    assert met(MirrorVariantCredit(), a, b) == {a: 1, b: 1}  # off: every state one step


def table_round(credit, values: dict) -> dict:
    """One round of ``iterate="table"`` in which each state of ``values`` has these move values."""
    credit.start_round()
    return {state: credit.table_values(state, q) for state, q in values.items()}


def test_mirror_table_averages_each_states_values_and_targets_their_softmax():
    """iterate="table": a state's n-th round moves its values by max(1/n, step) toward the round's (the
    running mean while 1/n > step), the target is softmax(table / tau), and the model's log-probabilities
    are not needed; the table is bounded, drops the least recently met state first, restarts a state that
    lists other moves and survives a JSON checkpoint."""
    a, b = ("p", "g", (1,)), ("p", "g", (2,))
    credit = MirrorVariantCredit(iterate="table", step=0.25, move_temperature=0.5, max_states=2)
    assert not credit.scores_moves()
    v1, v2, v3, v4 = [1.0, 0.0, -1.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0, -1.0]
    assert table_round(credit, {a: v1}) == {a: v1}  # first met: the round's values
    assert table_round(credit, {a: v2, b: v3})[a] == pytest.approx([0.5, 0.5, -0.5])  # w = 1/2
    third = table_round(credit, {a: v4})[a]  # w = max(1/3, 1/4)
    assert third == pytest.approx([0.5 + (1.0 - 0.5) / 3, 0.5 + 0.5 / 3, -0.5 - 0.5 / 3])
    fourth = table_round(credit, {a: v4})[a]  # w = max(1/4, 1/4)
    assert fourth == pytest.approx([t + 0.25 * (v - t) for t, v in zip(third, v4)])
    # the round's targets: softmax of the table after its one step, whatever the visit
    assert credit.move_targets(v4, None, a) == pytest.approx(move_distribution(fourth, 0.5))
    assert credit.metrics()["credit/table_states"] == 2
    saved = json.loads(json.dumps(credit.state_dict()))
    resumed = MirrorVariantCredit(iterate="table", step=0.25, move_temperature=0.5, max_states=2)
    resumed.load_state_dict(saved)
    c = ("p", "g", (3,))
    for table in (credit, resumed):  # c joins alone: b (met before a) is dropped, a keeps its values
        assert table_round(table, {c: v3}) == {c: v3}
        fifth = table_round(table, {a: v1})[a]
        assert fifth == pytest.approx([t + 0.25 * (v - t) for t, v in zip(fourth, v1)])
        assert table_round(table, {b: v1}) == {b: v1}
    assert table_round(credit, {a: [0.0, 1.0]}) == {a: [0.0, 1.0]}  # other moves listed: a new state
    assert table_round(credit, {a: v1}) == {a: v1}
    with pytest.raises(ValueError, match="iterate"):
        MirrorVariantCredit(iterate="model")
    with pytest.raises(ValueError, match="pool_states=True"):
        MirrorVariantCredit(iterate="table", pool_states=False)


def test_mirror_table_with_catch_up_weighs_a_return_by_the_rounds_missed():
    """iterate="table" with catch_up: a state met again after k of its player's rounds averages with
    weight max(1/n, 1 - (1 - step)^k); without catch_up the rounds missed do not count."""
    a, b = ("p", "g", (1,)), ("p", "g", (2,))
    v1, v2, v3 = [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]
    for catch_up, w in ((True, 1 - 0.75 ** 3), (False, 0.5)):  # 1 - 0.75^3 = 0.578 > 1/2
        credit = MirrorVariantCredit(iterate="table", step=0.25, catch_up=catch_up)
        table_round(credit, {a: v1})  # p's round 1
        for _ in range(2):  # p's rounds 2 and 3 meet only b
            table_round(credit, {b: v3})
        second = table_round(credit, {a: v2})[a]
        assert credit.rounds_missed(a) == (3 if catch_up else 1)  # off, the rounds missed do not count
        assert second == pytest.approx([1 - w, w])
        third = table_round(credit, {a: v3})[a]  # the next round: max(1/3, step)
        assert third == pytest.approx([t + (v - t) / 3 for t, v in zip(second, v3)])


def test_mirror_table_is_the_policy_step_when_the_fit_is_exact():
    """Self-play on a matrix game with exact values and exact fits: playing softmax(Q_table / tau) of the
    averaged values is the mirror step from the policy with step max(1/t, w) in round t (the module
    docstring's claim), round by round."""
    from autocurricula.games.matrix import random_game

    payoff, tau, w = np.array(random_game(5).payoff), 0.15, 0.045
    m, n = payoff.shape
    x, y = np.full(m, 1 / m), np.full(n, 1 / n)
    tx, ty, qx, qy = x, y, None, None
    for t in range(1, 41):
        qx, qy = table_average(qx, list(payoff @ ty), t, w), table_average(qy, list(-(tx @ payoff)), t, w)
        tx, ty = np.array(move_distribution(qx, tau)), np.array(move_distribution(qy, tau))
        step = max(1 / t, w)
        x, y = (np.array(mirror_distribution(list(payoff @ y), list(np.log(x)), tau, step=step)),
                np.array(mirror_distribution(list(-(x @ payoff)), list(np.log(y)), tau, step=step)))
        assert tx == pytest.approx(x, rel=1e-9, abs=1e-12) and ty == pytest.approx(y, rel=1e-9, abs=1e-12), t
    with pytest.raises(ValueError, match="met"):
        table_average([0.0], [1.0], 0, w)
    with pytest.raises(ValueError, match="one kept value per move"):
        table_average([0.0], [1.0, 2.0], 2, w)


def test_mirror_table_targets_follow_the_pooled_values_over_rounds():
    """Dice, two rounds: round 1's targets are the pooled cross-entropy targets themselves (whatever the
    policy), and no move is scored under the model; round 2's are softmax of the mean of the two rounds'
    pooled values at a prompt met in both, as a credit that saw both rounds' branches pooled at once."""
    def targets(credit, engine, seed):
        arena = Arena(engine, seed=seed)
        records = logged(arena, dice, 3, prefix=f"r{seed}-")
        return state_targets(credit, arena, records), records

    def plain():
        return BestReplyCredit(samples=20, advantage="moves", move_loss="cross_entropy", move_temperature=0.5,
                               move_clip=math.inf, pool_states=True)

    engine = DigitEngine(bias={"9": 1.0})
    table = MirrorVariantCredit(samples=20, move_temperature=0.5, iterate="table")  # unbounded: values = tau log p
    first, _ = targets(table, engine, 21)
    assert engine.scored == []
    want, _ = targets(plain(), DigitEngine(), 21)
    assert first == pytest.approx(want)
    second, records = targets(table, engine, 22)
    seat0 = next(key for key in second if key[0] == 0)  # seat 0's prompt is the same in every game
    # the values behind each round's targets, recovered from the targets: tau * log p, centred
    def values(p):
        y = 0.5 * np.log(np.array(p))
        return y - y.mean()
    r1, r2 = values(first[seat0][:10]), values(targets(plain(), DigitEngine(), 22)[0][seat0][:10])
    assert values(second[seat0][:10]) == pytest.approx(list((r1 + r2) / 2 - ((r1 + r2) / 2).mean()), abs=1e-9)


def test_mirror_table_in_a_trainer_keeps_each_prompts_rounds_and_resumes(tiny_model_path, tmp_path):
    """Self-play on a matrix game with iterate="table": each seat's one prompt is a state met every
    round, so after two rounds the table holds two states met twice, and a run resumed from the
    first epoch's checkpoint has the same table after its second round."""
    from autocurricula import SelfPlayTrainer
    from autocurricula.games.matrix import random_game

    def run(out, resume=False):
        config = SelfPlayConfig(credit=MirrorVariantCredit(iterate="table", samples=1),
                                rules={"past_share": 0.0, "games_per_round": 4}, epochs=2, rounds=1,
                                output_dir=str(out), seed=0, progress=False, overwrite_output_dir=not resume)
        trainer = SelfPlayTrainer(config)
        trainer.train(tiny_model_path, random_game(0), grpo_config={"learning_rate": 1e-3},
                      resume_from_checkpoint=resume)
        trainer.engine.close()
        return trainer.credit.state_dict()["mirror"]["table"]

    table = run(tmp_path / "run")
    assert sorted(n for *_, n, _ in table) == [2, 2] and all(len(q) >= 2 for *_, q in table)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert max(r.get("credit/table_states", 0) for r in rows) == 2
    shutil.rmtree(tmp_path / "run" / "checkpoint-1")  # resumed from epoch 0's: epoch 1 is played again
    assert run(tmp_path / "run", resume=True) == table


def test_best_reply_options_are_refused_where_nothing_would_use_them():
    with pytest.raises(ValueError, match="move_loss='residual'"):
        BestReplyCredit(advantage="return", move_loss="cross_entropy")
    with pytest.raises(ValueError, match="move_loss"):
        BestReplyCredit(advantage="moves", move_loss="hinge")
    for bad in (-0.5, math.nan, True):
        with pytest.raises(ValueError, match="continuation_temperature"):
            BestReplyCredit(continuation_temperature=bad)
    assert BestReplyCredit(advantage="moves", move_loss="cross_entropy",
                           continuation_temperature=0.0).continuation_temperature == 0.0
    assert BestReplyCredit(continuation_temperature=0.5).branch_temperature() == 0.5  # any advantage


def test_best_reply_credit_is_registered_and_binds_like_branch_credit():
    from autocurricula.credit import CREDIT_METHODS

    assert CREDIT_METHODS["best_reply"] is BestReplyCredit
    credit = make_credit(BestReplyCredit(advantage="moves", replies=True), GRPOConfig(temperature=0.5), 9)
    assert (credit.seed, credit.sampling_temperature, credit.replays) == (9, 0.5, True)


def test_moves_needs_the_game_to_list_them():
    async def no_moves(players, model, tokenizer=None):
        return await dice(players, model, tokenizer)

    arena = Arena(DigitEngine(), seed=0)
    records = logged(arena, no_moves, 1)
    with pytest.raises(ValueError, match="moves\\(prompt\\)"):
        BranchCredit(samples=2, advantage="moves").see_round(records, Replayer(arena, no_moves))


def test_moves_needs_an_engine_that_scores():
    class NoLogits(DigitEngine):
        completion_logprobs = None

    arena = Arena(NoLogits(), seed=0)
    records = logged(arena, dice, 1)
    with pytest.raises(ValueError, match="Engine.completion_logprobs"):
        BranchCredit(samples=2, advantage="moves").see_round(records, Replayer(arena, dice))
    # the games may play where nothing scores (servers) when the replayer is given an engine that does:
    # the trainer passes its in-process engine, which holds every adapter
    scorer = DigitEngine()
    credit = BranchCredit(samples=2, advantage="moves")
    credit.see_round(records, Replayer(arena, dice, scorer=scorer))
    assert len(credit.extra_turns(records[0].turns)) == 2 * 10 == sum(n for _, n, _ in scorer.scored)


def test_trainer_refuses_moves_for_a_game_without_them_before_playing(tiny_model_path, tmp_path):
    from autocurricula import SelfPlayTrainer
    from toy_games import digits

    trainer = SelfPlayTrainer(SelfPlayConfig(credit=BranchCredit(advantage="moves"), epochs=1, rounds=1,
                                             rules={"games_per_round": 2}, output_dir=str(tmp_path), progress=False,
                                             game_name="digits", ratings={"bt_bootstrap": 0}))
    with pytest.raises(ValueError, match="moves\\(prompt\\)"):
        trainer.train(str(tiny_model_path), digits)
    assert getattr(trainer, "engine", None) is None  # refused before the model is even loaded


def test_moves_credit_through_a_server_equals_in_process(tiny_model_path, tmp_path):
    """Games on a server, moves scored by the trainer's own engine: the same games and the same
    adapters as a run entirely in process (lockstep)."""
    from autocurricula import SelfPlayTrainer
    from test_remote import start_all

    def run(out, servers=None):
        t = SelfPlayTrainer(SelfPlayConfig(credit=BranchCredit(advantage="moves", samples=1), epochs=1, rounds=2,
                                           rules={"games_per_round": 4, "past_share": 0.0}, output_dir=str(out),
                                           progress=False, game_name="kuhn_poker", ratings={"bt_bootstrap": 0},
                                           max_tokens=2, save_total_limit=1))
        t.train(str(tiny_model_path), kuhn_poker.play, servers=servers, api_key=KEY if servers else None)
        learner = next(p["id"] for p in t.players if not p["frozen"])
        out = (t.match_history, t.engine.adapter_weights(learner), t.credit.metrics())
        t.engine.close()
        return out

    from test_remote import KEY

    (tmp_path / "serve-logs").mkdir()
    (srv,) = start_all(tiny_model_path, tmp_path / "serve-logs", 1)
    try:
        remote = run(tmp_path / "remote", [srv.url])
    finally:
        srv.kill()
    local = run(tmp_path / "local")
    assert remote[2]["credit/branched_turns"] > 0 and remote[2]["credit/branch_games"] > 0
    assert [(g["game_id"], g["rewards"]) for g in remote[0]] == [(g["game_id"], g["rewards"]) for g in local[0]]
    for path, (a, b) in local[1].modules.items():
        np.testing.assert_allclose(remote[1].modules[path][0], a, atol=1e-6, err_msg=path)
        np.testing.assert_allclose(remote[1].modules[path][1], b, atol=1e-6, err_msg=path)


# ---------------------------------------------------------------------- learning (slow)
@pytest.mark.slow
def test_kuhn_learner_separates_its_cards_against_a_fixed_opponent(tmp_path):
    """Against uniform random, a jack facing a bet must fold (calling always loses 2, folding 1) and a
    king must call: two states that differ only in the card, pushed in opposite directions."""
    from autocurricula import GRPOConfig, LeagueConfig, LeagueTrainer
    from autocurricula.engine import Engine, LoraSpec
    from autocurricula.eval.kuhn import read_strategy
    from autocurricula.eval.players import main_agent
    from autocurricula.engine.tiny import build_tiny_model
    from autocurricula.training.warmup import sft_warmup

    base = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=16, intermediate_size=128,
                            seed=0)
    warm = sft_warmup(base, tmp_path / "warm", kuhn_poker.warmup_examples(4000, 0, (0.05, 0.95)), steps=120,
                      batch_size=64, learning_rate=3e-3, seed=0)
    engine = Engine(str(warm), name=str(warm))
    try:
        cfg = LeagueConfig(rules={"main_agents": 1, "main_exploiters": 0, "league_exploiters": 0,
                                  "games_per_learner": 64, "anchor_share": 1.0}, epochs=1, rounds=30,
                           output_dir=str(tmp_path / "run"), seed=0, max_tokens=3,
                           # move_temperature in normalised units: 0.25 chips over Kuhn's [-2, 2] range
                           credit=BranchCredit(samples=2, advantage="moves", move_temperature=0.125),
                           game_name="kuhn_poker",
                           arena={"max_concurrent_games": 128}, ratings={"bt_bootstrap": 0}, progress=False,
                           save_total_limit=1)
        trainer = LeagueTrainer(cfg, opponents=[{"id": "random", "role": "random",
                                                 "policy": kuhn_poker.random_policy}])
        trainer.train(engine, kuhn_poker.play, lora_config=LoraSpec(r=8, lora_alpha=16, target_modules="all-linear"),
                      grpo_config=GRPOConfig(learning_rate=3e-3, loss_type="grpo", temperature=1.0))
        s = read_strategy(engine, main_agent(trainer))
    finally:
        engine.close()
    assert s["J:bet"] < 0.25 and s["K:bet"] > 0.75, s


def test_moves_listed_with_other_tokens_than_the_model_writes_are_named():
    # the engine answers "7"; a game listing " 7" would train replies the model never writes
    spaced = listing(_dice, lambda prompt: [" " + d for d in "0123456789"])
    arena = Arena(DigitEngine(), seed=4)
    records = logged(arena, spaced, 3)
    credit = BranchCredit(samples=1, advantage="moves", turns_per_game=1)
    with pytest.warns(UserWarning, match="other tokens"):
        credit.see_round(records, Replayer(arena, spaced))
    assert credit.metrics()["credit/respelled_moves"] == 3
    plain = BranchCredit(samples=1, advantage="moves", turns_per_game=1)
    plain.see_round(logged(arena, dice, 3, prefix="h"), Replayer(arena, dice))
    assert plain.metrics()["credit/respelled_moves"] == 0
