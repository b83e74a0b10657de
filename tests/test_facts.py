"""Game facts (what a game declares, what is inferred), the default configuration chosen from them
(and the line it prints), the package's format warm-up, and a matrix game's words against a tokenizer."""

import pytest

import autocurricula  # noqa: F401
from autocurricula.arena.game import check_tokenizer, game_facts
from autocurricula.games import kuhn_poker, leduc_poker, negotiation, tictactoe
from autocurricula.games.matrix import BIASED_RPS, MatrixGame, random_game
from autocurricula.leagues.default import MIRROR_SELFPLAY, PLAIN_SELFPLAY, TICTACTOE_LEAGUE, choose, model_rate, train
from autocurricula.records import GameFacts


def test_inferred_facts_are_the_safe_ones():
    class Bare:
        NUM_PLAYERS, ZERO_SUM = 2, True

        async def play(self, players, model, tokenizer=None):
            return [0.0, 0.0]

        def random_policy(self, prompt, rng=None):
            return "x"

    facts = game_facts(Bare())
    assert facts == GameFacts(2, "zero_sum")  # nothing else guessed
    assert facts.information is None and facts.payoff_range is None

    async def play(players, model, tokenizer=None):
        return [0.0, 0.0]

    assert game_facts(play) == GameFacts(num_players=None)  # a bare play function declares nothing


def test_a_matrix_game_infers_its_facts_from_its_matrix():
    game = MatrixGame([[3, -1, 0], [-2, 1, 2]])
    facts = game_facts(game)
    assert (facts.num_players, facts.utility, facts.dynamics, facts.information, facts.chance) == \
        (2, "zero_sum", "simultaneous", "one_shot", False)
    assert facts.seat_ranges == ((-2.0, 3.0), (-3.0, 2.0)) and facts.payoff_range == (-3.0, 3.0)
    assert game_facts(game.play) == facts and game_facts(BIASED_RPS).payoff_range == (-2.0, 2.0)


def test_bad_facts_are_refused():
    with pytest.raises(ValueError, match="utility"):
        GameFacts(2, "zerosum")
    with pytest.raises(ValueError, match="payoff_range"):
        GameFacts(2, payoff_range=(1, -1))
    with pytest.raises(ValueError, match="one range per seat"):
        GameFacts(2, seat_ranges=((0, 1),))

    class Wrong:
        NUM_PLAYERS, ZERO_SUM, facts = 2, True, {"num_players": 2}

        def play(self, players, model, tokenizer=None):
            return [0.0, 0.0]

        def random_policy(self, prompt, rng=None):
            return "x"

    with pytest.raises(TypeError, match="GameFacts"):
        game_facts(Wrong())


@pytest.mark.parametrize("game, recipe", [(tictactoe, TICTACTOE_LEAGUE), (kuhn_poker, MIRROR_SELFPLAY),
                                          (leduc_poker, MIRROR_SELFPLAY), (random_game(3), MIRROR_SELFPLAY),
                                          (BIASED_RPS, MIRROR_SELFPLAY)])
def test_the_default_is_chosen_from_the_facts(game, recipe):
    assert choose(game) is recipe
    assert choose(getattr(game, "play")) is recipe  # the play of a Game reaches its facts


def test_what_the_default_does_without_a_measured_configuration():
    assert choose(negotiation).trainer is PLAIN_SELFPLAY.trainer  # no move list: no per-move targets
    assert "lists no moves" in choose(negotiation).reason
    with pytest.raises(ValueError, match="two-player"):
        choose(autocurricula.games.dataset if hasattr(autocurricula.games, "dataset") else
               __import__("autocurricula.games.dataset", fromlist=["x"]))


def test_rates_are_relative_to_the_models_own(tiny_model_path, tmp_path):
    assert model_rate(tiny_model_path) == 1e-2
    assert model_rate("Qwen/Qwen3-0.6B") == 1e-4
    assert model_rate(tmp_path) == 1e-4


def test_train_prints_its_choice_and_trains_it(tiny_model_path, tmp_path):
    lines = []
    trainer = train(tiny_model_path, random_game(2), epochs=1, rounds=1, seed=1, output_dir=tmp_path / "run",
                    warmup=False, progress=False, printer=lines.append, rules={"games_per_round": 8})
    try:
        assert len(lines) == 1
        line = lines[0]
        for part in ("mirror self-play for random-2", "2 players, zero-sum, one-shot information, simultaneous",
                     "SelfPlayTrainer(games_per_round=8, past_share=0.0, average_last=1)", "credit=MirrorCredit()",
                     "learning rate 0.3 x 0.01 = 0.003", "4 optimizer steps a round", "no warm-up"):
            assert part in line, (part, line)
        assert type(trainer).__name__ == "SelfPlayTrainer" and trainer.run.grpo.learning_rate == pytest.approx(3e-3)
        assert trainer.run.grpo.steps_per_generation == 4 and trainer.credit.name == "mirror"
        assert trainer.config.rules.past_share == 0.0 and len(trainer.match_history) == 8
    finally:
        trainer.engine.close()


def test_the_league_recipe_anchors_the_random_player(tiny_model_path, tmp_path):
    lines = []
    trainer = train(tiny_model_path, tictactoe, epochs=1, rounds=1, output_dir=tmp_path / "ttt", warmup=False,
                    progress=False, printer=lines.append, rules={"games_per_learner": 4, "exploiter_games": 2})
    try:
        assert "the tic-tac-toe league for tictactoe" in lines[0] and "0.2 x 0.01 = 0.002" in lines[0]
        assert any(p.id == "random" for p in trainer.players) and trainer.config.rules.anchor_share == 0.5
        assert trainer.credit.name == "q" and trainer.run.grpo.lr_scheduler_type == "warmup_stable_decay"
    finally:
        trainer.engine.close()


def test_the_format_warmup_is_a_package_function(tiny_model_path, tmp_path):
    from autocurricula.games import highest_string
    from autocurricula.loop.bases import format_warmup, warmup_examples

    own = warmup_examples(kuhn_poker, 5, seed=1)
    assert own == kuhn_poker.warmup_examples(5, 1)  # a game's own examples when it has them
    generic = warmup_examples(highest_string, 50, seed=0)  # else the prompts random play reaches
    assert len(generic) == 50 and all(p == highest_string.PROMPT for p, _ in generic)
    game = random_game(5)
    for prompt, reply in warmup_examples(game, 40):
        assert reply in game.moves(prompt)
    out = format_warmup(tiny_model_path, game, steps=2, examples=64, out=tmp_path / "warm")
    assert (out / "config.json").is_file() and format_warmup(tiny_model_path, game, steps=2, examples=64,
                                                             out=tmp_path / "warm") == out


def test_a_matrix_game_refuses_a_word_the_tokenizer_splits(tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    random_game(7).check_tokenizer(tok)  # the built-in words are one token each
    game = MatrixGame([[1, -1], [-1, 1]], words=["red", "zebra"])
    with pytest.raises(ValueError, match=r"'zebra' \(rows\) is \d tokens \[.*'ra'\]"):
        check_tokenizer(game, tok)
    import asyncio

    with pytest.raises(ValueError, match="zebra"):  # play checks it too, on the tokenizer it is given
        asyncio.run(game.play([{"id": "a", "policy": lambda p: "red"}, {"id": "b", "policy": lambda p: "up"}],
                              None, tok))
    MatrixGame([[1, -1], [-1, 1]], words=["red", "zebra"], max_tokens=8).check_tokenizer(tok)


def test_training_stops_before_the_first_round_on_a_split_word(tiny_model_path, tmp_path):
    from autocurricula import SelfPlayConfig, SelfPlayTrainer

    game = MatrixGame([[1, -1], [-1, 1]], words=["zebra", "red"])
    trainer = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=1, output_dir=str(tmp_path / "z"), progress=False))
    with pytest.raises(ValueError, match="zebra"):
        trainer.train(str(tiny_model_path), game)
    if trainer.run is not None:
        trainer.engine.close()


def test_the_cli_trains_the_default_when_no_league_is_named(monkeypatch, tmp_path, capsys):
    """`autocurricula train` with no --league trains what the facts choose and prints why; the YAML's
    settings go over the recipe's, and a 'grpo:' rate (which the recipe sets) is refused by name."""
    from autocurricula import cli
    from autocurricula.loop.trainer import AutocurriculumTrainer

    seen = {}

    class Stop(Exception):
        pass

    def fake_train(self, model, play, **kw):
        seen.update(trainer=self, **kw)
        raise Stop  # before any model loads

    monkeypatch.setattr(AutocurriculumTrainer, "train", fake_train)
    config = tmp_path / "c.yaml"
    config.write_text("rules:\n  games_per_round: 16\ngrpo:\n  beta: 0.01\n")
    with pytest.raises(Stop):
        cli.main(["train", "--model", "someone/some-model", "--game", "kuhn_poker", "--epochs", "2", "--config",
                  str(config), "--output-dir", str(tmp_path / "run")])
    line = capsys.readouterr().out
    assert "autocurricula: mirror self-play for kuhn_poker" in line and "learning rate 0.3 x 0.0001" in line
    trainer = seen["trainer"]
    assert type(trainer).__name__ == "SelfPlayTrainer" and trainer.config.epochs == 2
    assert trainer.config.output_dir == str(tmp_path / "run") and trainer.config.seed == 0
    assert trainer.config.rules.games_per_round == 16 and trainer.config.rules.past_share == 0.0
    assert seen["grpo_config"] == {"steps_per_generation": 4, "beta": 0.01, "learning_rate": pytest.approx(3e-5)}

    with pytest.raises(Stop):
        cli.main(["train", "--model", "someone/some-model", "--game", "tictactoe", "--output-dir", str(tmp_path / "t")])
    assert "the tic-tac-toe league for tictactoe" in capsys.readouterr().out
    assert [o["id"] for o in seen["trainer"].opponents] == ["random"]

    config.write_text("grpo:\n  learning_rate: 0.1\n")
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", "--model", "someone/some-model", "--game", "kuhn_poker", "--config", str(config)])
    assert "drop 'learning_rate'" in str(stop.value.code) + capsys.readouterr().err
