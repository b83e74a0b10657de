"""The OpenSpiel adapter (games.openspiel) and the exact exploitability as played (eval.openspiel) on
four games: facts from GameType, play with forfeits, OpenSpiel's exploitability on the forfeit-extended
game checked against OpenSpiel's own figure and against sampled play, and training through it."""

import asyncio
import random

import numpy as np
import pytest

pytest.importorskip("pyspiel", reason="the OpenSpiel adapter needs open_spiel: pip install 'autocurricula[openspiel]'")

import pyspiel  # noqa: E402
from open_spiel.python import policy as os_policy  # noqa: E402
from open_spiel.python.algorithms import exploitability as os_exploitability  # noqa: E402
from open_spiel.python.algorithms.best_response import BestResponsePolicy  # noqa: E402

from autocurricula.arena.game import game_facts, game_moves  # noqa: E402
from autocurricula.eval import openspiel as ev  # noqa: E402
from autocurricula.games import openspiel  # noqa: E402
from autocurricula.leagues.default import MIRROR_SELFPLAY, choose  # noqa: E402

GAMES = ["kuhn_poker", "leduc_poker", "goofspiel(num_cards=4)", "liars_dice(dice_sides=3)"]
SMALL = ["kuhn_poker", "liars_dice(dice_sides=3)"]  # quick enough for sampled play


@pytest.fixture(scope="module")
def loaded():
    return {name: openspiel.load(name) for name in GAMES}


class Scripted:
    """The ``model`` handle of a game between scripted players: replies from their policies."""

    def __init__(self, seed):
        self.seed, self.rng = seed, random.Random(f"replies-{seed}")  # not the deal's stream

    async def generate(self, player, prompt, **sampling):
        from types import SimpleNamespace

        return SimpleNamespace(text=player["policy"](prompt, self.rng))


def play(game, policies, seed, **options):
    players = [{"id": f"p{i}", "policy": p} for i, p in enumerate(policies)]
    return asyncio.run(game.play(players, Scripted(seed), None, **options))


@pytest.mark.parametrize("name, facts", [
    ("kuhn_poker", ("zero_sum", "imperfect", "sequential", True, (-2.0, 2.0))),
    ("leduc_poker", ("zero_sum", "imperfect", "sequential", True, (-13.0, 13.0))),
    ("goofspiel(num_cards=4)", ("zero_sum", "perfect", "simultaneous", True, (-1.0, 1.0))),
    ("liars_dice(dice_sides=3)", ("zero_sum", "imperfect", "sequential", True, (-1.0, 1.0))),
    ("tic_tac_toe", ("zero_sum", "perfect", "sequential", False, (-1.0, 1.0))),
    ("matrix_rps", ("zero_sum", "one_shot", "simultaneous", False, (-1.0, 1.0))),
])
def test_facts_come_from_the_game_type(name, facts):
    game = openspiel.load(name)
    f = game_facts(game)
    assert (f.num_players, f.utility, f.information, f.dynamics, f.chance, f.payoff_range) == (2, *facts)
    assert game.ZERO_SUM and game_moves(game) == game.moves
    # the default reads them: the league for a deterministic perfect-information game, mirror self-play else
    assert choose(game).name == ("the tic-tac-toe league" if name == "tic_tac_toe" else MIRROR_SELFPLAY.name)


def test_only_two_player_games_with_prompts():
    with pytest.raises(ValueError, match="two-player"):
        openspiel.load("kuhn_poker(players=3)")


@pytest.mark.parametrize("name", GAMES)
def test_prompts_moves_and_play(loaded, name):
    game = loaded[name]
    sets = game.information_sets()
    assert sets and all(s.moves and all(m.startswith(" ") for m in s.moves) for s in sets.values())
    for s in list(sets.values())[:50]:
        assert game.moves(s.prompt) == list(s.moves) and f"you are player {s.player}." in s.prompt
    lo, hi = game.facts.payoff_range
    for seed in range(20):
        rewards = play(game, [game.random_policy] * 2, seed)
        assert len(rewards) == 2 and lo <= rewards[0] <= hi and abs(sum(rewards)) < 1e-9
        assert play(game, [game.random_policy] * 2, seed) == rewards  # chance comes from the seed
    # an invalid reply forfeits: the offender gets the lowest payoff, the other its negation
    assert play(game, [lambda p, rng: "fold?", game.random_policy], 0) == [lo, -lo]
    second = play(game, [game.random_policy, lambda p, rng: ""], 3)
    assert second == [-lo, lo] or (game.facts.dynamics == "sequential" and second[1] != lo)  # if seat 1 moved
    assert play(game, [lambda p, rng: "?"] * 2, 1, invalid_penalty=(-5, 1)) == [-5.0, 1.0] or \
        game.facts.dynamics == "simultaneous"


def test_both_seats_forfeiting_a_simultaneous_move_split_the_sum(loaded):
    game = loaded["goofspiel(num_cards=4)"]
    assert play(game, [lambda p, rng: "?"] * 2, 0) == [0.0, 0.0]


@pytest.mark.parametrize("name", GAMES)
def test_exploitability_without_forfeits_is_openspiels(loaded, name):
    """The uniform policy (no forfeit mass) scored on the extended game gives OpenSpiel's own figure."""
    game = loaded[name]
    os_game = game.game if game.facts.dynamics == "sequential" else pyspiel.convert_to_turn_based(game.game)
    want = os_exploitability.exploitability(os_game, os_policy.TabularPolicy(os_game))
    assert ev.exploitability(game, ev.uniform_policy(game)) == pytest.approx(want, abs=1e-9)


def test_kuhn_poker_through_the_adapter_is_the_hand_written_game():
    """The adapter's Kuhn poker scores as the hand-written evaluator does (equilibrium 0, uniform 0.458)."""
    from autocurricula.eval.kuhn import exploitability as kuhn_exploitability
    from autocurricula.games.kuhn_poker import equilibrium_strategy

    game = openspiel.load("kuhn_poker")
    nash = equilibrium_strategy(1 / 3)
    cards = "JQK"
    policy = {}
    for (player, key), s in game.information_sets().items():
        history = " ".join({"p": ("check" if i == 0 or key[i] == "p" and "b" not in key[1:i] else "fold"),
                            "b": ("bet" if "b" not in key[1:i] else "call")}[c] for i, c in enumerate(key[1:], 1))
        p_bet = nash[f"{cards[int(key[0])]}:{history}"]
        policy[(player, key)] = (np.array([1 - p_bet, p_bet]), 0.0)
    assert ev.exploitability(game, policy) == pytest.approx(kuhn_exploitability(nash, backend="python"), abs=1e-9)
    assert ev.exploitability(game, policy) == pytest.approx(0.0, abs=1e-9)
    assert ev.exploitability(game, ev.uniform_policy(game)) == pytest.approx(0.458333, abs=1e-6)


def random_policy_with_forfeits(game, seed, forfeit=0.15):
    rng = np.random.default_rng(seed)
    out = {}
    for key, s in game.information_sets().items():
        f = forfeit * rng.random()
        p = rng.dirichlet(np.ones(len(s.actions))) * (1 - f)
        out[key] = (p, float(1 - p.sum()))
    return out


def mean_return(game, policies, games, seat):
    values = [play(game, policies, seed)[seat] for seed in range(games)]
    return float(np.mean(values)), float(np.std(values) / np.sqrt(len(values)))


@pytest.mark.parametrize("name", SMALL)
def test_forfeits_are_scored_as_sampled_play_scores_them(loaded, name):
    """A policy with forfeit mass at every set, sampled in play (a forfeit is a reply that is no move):
    its value against another such policy, and an exact best response's value against it, agree with
    the mean returns of sampled games, within four standard errors."""
    game = loaded[name]
    pol = [random_policy_with_forfeits(game, 1), random_policy_with_forfeits(game, 2)]
    exact = ev.policy_values(game, pol)
    got, se = mean_return(game, [ev.sampled_policy(game, p) for p in pol], 3000, 0)
    assert abs(got - exact[0]) < 4 * se + 1e-9, (got, exact, se)
    assert ev.forfeit_rate(game, pol[0]) > 0.05
    # the best response to pol[0] in seat 1, played: its mean return is what exploitability counts
    extended = ev.ForfeitGame(game)
    br = BestResponsePolicy(extended, 1, ev.ForfeitPolicy(extended, pol[0]))
    by_prompt = {s.prompt: s for s in game.information_sets().values()}

    def br_reply(prompt, rng):
        s = by_prompt[prompt]
        action = br.best_response_action(s.key)
        assert action != extended.forfeit_action  # forfeiting never pays
        return s.moves[s.actions.index(action)]

    got, se = mean_return(game, [ev.sampled_policy(game, pol[0]), br_reply], 3000, 1)
    assert abs(got - br.value(extended.new_initial_state())) < 4 * se + 1e-9
    # renormalising the forfeit away would score the policy as less exploitable than it plays
    renormalised = {k: (p / p.sum(), 0.0) for k, (p, _) in pol[0].items()}
    assert ev.exploitability(game, pol[0]) > ev.exploitability(game, renormalised)


def test_mixture_is_the_policy_of_drawing_one_player_per_game(loaded):
    game = loaded["liars_dice(dice_sides=3)"]
    a, b = random_policy_with_forfeits(game, 3), random_policy_with_forfeits(game, 4)
    mix = ev.mixture(game, [a, b], [0.25, 0.75])
    opponent = [random_policy_with_forfeits(game, 5)]
    for seat in (0, 1):
        pair = [None, None]
        pair[1 - seat] = opponent[0]
        drawn = 0.0
        for w, pol in ((0.25, a), (0.75, b)):
            pair[seat] = pol
            drawn += w * ev.policy_values(game, pair)[seat]
        pair[seat] = mix
        assert ev.policy_values(game, pair)[seat] == pytest.approx(drawn, abs=1e-9)


def test_a_models_policy_as_played_and_training_through_the_adapter(tiny_model_path, tmp_path):
    from autocurricula.leagues.default import train

    game = openspiel.load("liars_dice(dice_sides=3)")
    lines = []
    trainer = train(tiny_model_path, game, epochs=1, rounds=1, output_dir=tmp_path / "ld", warmup=False,
                    progress=False, printer=lines.append, rules={"games_per_round": 4})
    try:
        assert "mirror self-play for liars_dice(dice_sides=3)" in lines[0]
        assert game.max_tokens is not None and game.max_tokens >= 2  # set from the tokenizer
        policy = ev.read_policy(trainer.engine, "main-0", game)
        for key, (probs, forfeit) in policy.items():
            assert np.all(probs >= 0) and 0 <= forfeit <= 1 and probs.sum() + forfeit == pytest.approx(1.0)
        figures = ev.figures(game, {"main-0": policy}, trainer.deployable_mixture())
        # the untrained tiny model answers nonsense: nearly all forfeit, and a best response takes it all
        assert figures["invalid_rate"] > 0.5 and figures["exploitability"] > 0.5
        assert 0 <= figures["exploitability_share"] <= 1
    finally:
        trainer.engine.close()
