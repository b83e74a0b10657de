"""Examples run offline; the fictitious-GAN example is the seed README's snippet verbatim."""

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import example_module, load_script as _load

ROOT = Path(__file__).resolve().parents[1]


# sha256 of the fictitious-GAN snippet in the seed README (from its
# `class FictitiousGANConfig` to the last line of `match`): the example must hold it unchanged.
SEED_SNIPPET_SHA256 = "25cca707b8c7345d7f7e452f25dee30e57697ae09e2e072892d61bb82529a504"


def test_fictitious_gan_snippet_is_verbatim():
    text = (ROOT / "examples" / "fictitious_gan.py").read_text()
    snippet = re.search(r"(class FictitiousGANConfig.*?return \[\(latest_g, d\) for d in ds\] \+ \[\(latest_d, g\) for g in gs\])",
                        text, re.S).group(1)
    assert hashlib.sha256(snippet.encode()).hexdigest() == SEED_SNIPPET_SHA256


def test_the_fictitious_gan_snippet_trains_as_written(tmp_path):
    """The snippet's classes, called as the seed calls them (``FictitiousGANTrainer()``, then
    ``train(model, play)``), on a small tiny model: one new generator and discriminator per epoch,
    the latest of each against every player of the other kind."""
    from autocurricula import build_tiny_model

    gan = _load(ROOT / "examples" / "fictitious_gan.py", "fictitious_gan")
    base = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
    trainer = gan.FictitiousGANTrainer()
    trainer.config.output_dir = str(tmp_path / "run")
    trainer.train(str(base), gan.play)
    trainer.engine.close()
    epochs, rounds = trainer.config.epochs, trainer.config.rounds
    assert (epochs, rounds) == (4, 2)  # the snippet's defaults
    assert [p["id"] for p in trainer.players] == [f"{r}-{e}" for e in range(epochs) for r in ("generator",
                                                                                              "discriminator")]
    history = list(trainer.match_history)
    assert len(history) == sum(2 * (e + 1) * rounds for e in range(epochs))  # latest G vs every D, latest D vs every G
    assert all({"generator", "discriminator"} == set(row["roles"]) for row in history)
    assert (tmp_path / "run" / f"checkpoint-{epochs - 1}" / "COMPLETE").is_file()
    # each new player continues its own role's latest one; the first discriminator starts from the base
    parents = {p["id"]: p["parent"] for p in trainer.players}
    assert parents["generator-0"] is None and parents["discriminator-0"] is None
    assert parents["generator-2"] == "generator-1" and parents["discriminator-3"] == "discriminator-2"


@pytest.mark.slow
def test_fictitious_gan_example_runs():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "fictitious_gan.py")], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "generator-3" in out.stdout and "discriminator-3" in out.stdout


@pytest.mark.slow  # subprocesses: warm-up, one epoch and the evaluation of each example
@pytest.mark.parametrize("script,games,extra", [("tictactoe_league.py", "--games-per-learner",
                                                 ["--credit", "value", "--main-exploiters", "0", "--anchor-share", "0.5",
                                                  "--exploiter-games", "4", "--anchors", "random,minimax"]),
                                                ("tictactoe_selfplay.py", "--games-per-round",
                                                 ["--credit", "q", "--openings", "0-3", "--num-iterations", "2"]),
                                                ("tictactoe_selfplay.py", "--games-per-round",
                                                 ["--credit", "mirror", "--openings", "0-2", "--branch-samples", "1",
                                                  "--num-iterations", "2"])])
def test_tictactoe_examples_run_and_report(script, games, extra, tmp_path):
    import json
    import os

    args = [sys.executable, str(ROOT / "examples" / script), "--epochs", "1", "--rounds", "1", games, "8",
            "--hidden", "32", "--layers", "1", "--heads", "8", "--warmup-steps", "50", "--eval-games", "100", *extra,
            "--output-dir", str(tmp_path / "run")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"vs_random", "vs_minimax_draw_or_win", "optimal_move_rate", "legal_move_rate", "win_now_rate",
            "block_rate", "epochs", "minutes", "warm_base"} <= set(summary)
    assert summary["epochs"] == 1 and (tmp_path / "run" / "checkpoint-0" / "COMPLETE").exists()
    # the settings the run used, so that runs can be told apart from their output
    passes = int(extra[extra.index("--num-iterations") + 1]) if "--num-iterations" in extra else 1
    assert (summary["credit"], summary["num_iterations"]) == (extra[1], passes)
    assert summary["branch_samples"] == {"mirror": 1, "value": None, "q": None}[extra[1]]
    config = json.loads((tmp_path / "cache" / "tiny-h32-l1-a8-ttt-warm50" / "config.json").read_text())
    assert config["num_attention_heads"] == 8  # --heads reaches the model
    if "--anchors" in extra:  # the leaderboard's rows: both scripted players are in the pool
        assert {"random", "minimax"} <= leaderboard_ids(out.stdout)
        assert summary["scripted"] == ["random", "minimax"]


def leaderboard_ids(stdout: str) -> set[str]:
    """The player ids in a printed leaderboard's rows (rank, then id)."""
    return {m.group(1) for m in re.finditer(r"^\s+\d+\s+(\S+)\s", stdout, re.M)}




def test_warmup_teaches_the_format_and_is_cached(tmp_path):
    from autocurricula.engine import Engine
    from autocurricula.games import tictactoe
    from autocurricula.engine.tiny import build_tiny_model
    from autocurricula.training.warmup import sft_warmup

    base = build_tiny_model(tmp_path / "base", hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128)
    examples = tictactoe.warmup_examples(2000, seed=0)
    out = sft_warmup(base, tmp_path / "warm", examples, steps=120, batch_size=32, learning_rate=3e-3)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert sft_warmup(base, tmp_path / "warm", examples, steps=120, batch_size=32, learning_rate=3e-3) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # cached, not retrained

    from autocurricula.eval.tictactoe import greedy_table

    def legal(path):
        with Engine(str(path)) as engine:
            return tictactoe.evaluate_table(greedy_table(engine, None), games=50)["legal_move_rate"]

    assert legal(base) < 0.2 < 0.6 < legal(out)  # 120 steps on a 1-layer model: most moves already legal


@pytest.mark.slow
def test_league_example_smoke(tmp_path):
    """The league example at its default model size (the warm-up included), one short epoch."""
    import os

    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tictactoe_league.py"), "--epochs", "1", "--rounds", "1",
                          "--games-per-learner", "4", "--eval-games", "200", "--output-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=900, cwd=ROOT,
                         env={**os.environ, "AUTOCURRICULA_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"vs_random", "vs_minimax_draw_or_win", "optimal_move_rate", "legal_move_rate", "epochs", "minutes"} <= set(summary)
    ids = leaderboard_ids(out.stdout)  # the default pool's one scripted player: the random one, no solver
    assert "random" in ids and "minimax" not in ids, ids
    assert summary["scripted"] == ["random"]
    state = json.loads((tmp_path / "run" / "checkpoint-0" / "state.json").read_text())
    assert state["values"]["backup"] == "minimax" and state["values"]["children"]  # the default: minimax backup


def run_example(name: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True, text=True, timeout=600,
                         cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_custom_league_example(tmp_path):
    out = run_example("custom_league.py", tmp_path)
    assert re.search(r"^\s+1\s+(red|blue)-\d", out, re.M)  # the leaderboard
    freqs = [eval(line.split(" ", 1)[1]) for line in out.splitlines() if re.match(r"(red|blue)-0 \{", line)]
    assert len(freqs) == 2 and all(abs(sum(f.values()) - 1) < 0.05 for f in freqs)  # the warm-up taught the format


@pytest.mark.slow
def test_export_peft_example(tmp_path):
    out = run_example("export_peft.py", tmp_path)
    diff = float(re.search(r"max \|logit diff\| = (\S+)", out).group(1))
    assert diff <= 1e-4 and (tmp_path / "runs" / "export-peft" / "adapter" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_serve_openai_example(tmp_path):
    out = run_example("serve_openai.py", tmp_path)
    assert "{'name': 'alice', 'version': 1}" in out and "'alice']" in out and re.search(r"^alice: '", out, re.M)


def test_publish_example_pushes_every_player(tmp_path, hub, monkeypatch):
    calls, commits = hub
    module = _load(ROOT / "examples" / "publish_to_hub.py", "publish_to_hub")
    module.main("me/league", output_dir=str(tmp_path), token="hf_test", endpoint="https://hub.test")
    paths = {op["value"]["path"] for op in commits[-1] if op.get("key") == "file"}
    assert {"README.md", "main-0/adapter_model.safetensors", "main-0/adapter_config.json", "main-0/README.md"} <= paths


@pytest.mark.slow
def test_continue_with_trl_example(tmp_path):
    """The exported player continued by trl's GRPOTrainer under `accelerate launch`: both rewards
    are printed and the saved adapter loads in peft and back into the engine."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from autocurricula.publish.export import import_peft

    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          str(ROOT / "examples" / "continue_with_trl.py"), "--steps", "4", "--rounds", "1",
                          "--output-dir", str(run)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rewards = re.search(r"before ([+-]\d\.\d{3})\s+after ([+-]\d\.\d{3})", out.stdout)
    assert rewards and all(-1 <= float(r) <= 1 for r in rewards.groups())
    continued = run / "continued-player"
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(run / "tiny-llama-warm", dtype=torch.float32),
                                      str(continued))
    assert any("lora_A" in name for name, _ in model.named_parameters())
    assert import_peft(continued).modules  # and autocurricula takes it back as a player


def test_mirror_settings_of_the_tictactoe_selfplay_example(monkeypatch, capsys):
    """``tictactoe_selfplay.py --credit mirror`` is the PSRO examples' mirror configuration: the same
    credit, no past or scripted players, the last third's iterates deployed, their rate and LoRA; the
    league example and the update flags it fixes are refused by name."""
    from autocurricula.credit import MirrorCredit

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    MirrorVariantCredit = example_module("credit_variants").MirrorVariantCredit
    ttt = _load(ROOT / "examples" / "ttt_common.py", "ttt_common")
    selfplay = _load(ROOT / "examples" / "tictactoe_selfplay.py", "ttt_selfplay")
    psro = _load(ROOT / "examples" / "psro_matrix_games.py", "psro_matrix")
    argv = ["--credit", "mirror", "--steps-per-generation", "4", "--epochs", "12"]
    args = ttt.parse_args("", "--games-per-round", 320, "out", argv=argv, mirror=True)
    own, opponents, lora, grpo = selfplay.settings(args)
    want = psro.parse_args(["--credit", "mirror", "--steps-per-generation", "4"])
    assert own == psro.credit_settings("selfplay", want)["rules"]
    assert (opponents, lora) == (None, None) and grpo == psro.grpo_settings(want, psro.LEARNING_RATE)
    assert ttt.credit_method(args) == psro.credit_settings("selfplay", want)["credit"] == MirrorCredit()
    one = ttt.parse_args("", "--games-per-round", 320, "out", argv=argv + ["--branch-samples", "1"], mirror=True)
    assert ttt.credit_method(one) == MirrorCredit(samples=1)
    caught = ttt.parse_args("", "--games-per-round", 320, "out", argv=argv + ["--catch-up"], mirror=True)
    assert ttt.credit_method(caught) == MirrorVariantCredit(catch_up=True) != MirrorCredit()
    assert ttt.credit_method(caught) == psro.credit_settings("selfplay", psro.parse_args(
        ["--credit", "mirror", "--steps-per-generation", "4", "--catch-up"]))["credit"]
    with pytest.raises(SystemExit):
        ttt.parse_args("", "--games-per-round", 320, "out", argv=["--credit", "branch", "--catch-up"])
    assert "--catch-up and --mirror-iterate change --credit mirror" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        psro.parse_args(["--catch-up"])
    assert "--catch-up and --mirror-iterate change --credit mirror" in capsys.readouterr().err
    table = ttt.parse_args("", "--games-per-round", 320, "out", argv=argv + ["--mirror-iterate", "table"], mirror=True)
    table_psro = psro.parse_args(["--credit", "mirror", "--steps-per-generation", "4", "--mirror-iterate", "table"])
    assert ttt.credit_method(table) == psro.credit_settings("selfplay", table_psro)["credit"] \
        == MirrorVariantCredit(iterate="table") != MirrorCredit()
    assert selfplay.settings(table)[3] == psro.grpo_settings(table_psro, psro.LEARNING_RATE)
    assert selfplay.settings(table)[3]["learning_rate"] == psro.LEARNING_RATE  # the table form keeps the rate
    for refused in (["--mirror-iterate", "table"], ["--credit", "q", "--mirror-iterate", "table"]):
        with pytest.raises(SystemExit):
            ttt.parse_args("", "--games-per-round", 320, "out", argv=refused)
        assert "--mirror-iterate change --credit mirror" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        psro.parse_args(["--mirror-iterate", "table"])
    assert "--mirror-iterate change --credit mirror" in capsys.readouterr().err
    two = ttt.parse_args("", "--games-per-round", 320, "out", argv=argv + ["--num-iterations", "2"], mirror=True)
    assert selfplay.settings(two)[3] == psro.grpo_settings(psro.parse_args(
        ["--credit", "mirror", "--steps-per-generation", "4", "--num-iterations", "2"]), psro.LEARNING_RATE)
    assert selfplay.settings(two)[3]["num_iterations"] == 2
    branch = ttt.parse_args("", "--games-per-round", 320, "out", argv=["--credit", "branch"])
    assert ttt.credit_method(branch).samples == 4  # --credit branch keeps the example's own default
    plain_own, plain_opponents, _, _ = selfplay.settings(ttt.parse_args("", "--games-per-round", 320, "out", argv=[]))
    assert plain_own == {"past_share": 0.5} and len(plain_opponents) == 2
    for refused, names in ((["--credit", "mirror"], "tictactoe_selfplay.py"),
                           (["--credit", "mirror", "--learning-rate", "1e-3"], "--learning-rate"),
                           (["--branch-samples", "2"], "--credit branch or mirror"),  # credit q has no branches
                           (["--credit", "mirror", "--branch-samples", "0"], "at least 1"),
                           (["--credit", "mirror", "--num-iterations", "0"], "--num-iterations and")):
        with pytest.raises(SystemExit):
            ttt.parse_args("", "--games-per-round", 320, "out", argv=refused, mirror=refused != ["--credit", "mirror"])
        assert names in capsys.readouterr().err


def test_branch_advantage_td_of_the_examples(monkeypatch):
    """``--branch-advantage td`` builds examples/credit_variants.py's ``TDBranchCredit`` with the
    example's branch settings (and ``--branch-temperature``); the listed moves' options are refused."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    TDBranchCredit = example_module("credit_variants").TDBranchCredit
    ttt = _load(ROOT / "examples" / "ttt_common.py", "ttt_common")

    def credit(*flags):
        return ttt.credit_method(ttt.parse_args("", "--games-per-learner", 64, "out",
                                                argv=["--credit", "branch", "--branch-advantage", "td", *flags]))

    assert credit("--branch-turns", "1", "--branch-temperature", "0") == TDBranchCredit(
        samples=4, turns_per_game=1, move_temperature=0.25, move_clip=2.0, continuation_temperature=0.0)
    assert credit().branch_temperature() is None
    for flags in (["--branch-replies"], ["--move-loss", "cross_entropy"]):
        with pytest.raises(ValueError, match="--branch-advantage moves"):
            credit(*flags)
    kuhn = _load(ROOT / "examples" / "kuhn_league.py", "kuhn_league_td")
    assert kuhn.credit_of(kuhn.parse_args(["--branch-advantage", "td"])) == TDBranchCredit(samples=2)


def test_mirror_settings_of_the_psro_examples(monkeypatch, capsys):
    """``--credit mirror``: self-play plays no past snapshot and deploys its last third of epochs'
    iterates, and every trainer learns at 0.3 times the shared rate; other credits keep the rate."""
    from autocurricula.credit import MirrorCredit

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    MirrorVariantCredit = example_module("credit_variants").MirrorVariantCredit
    mod = _load(ROOT / "examples" / "psro_matrix_games.py", "psro_matrix_settings")
    mirror = mod.parse_args(["--credit", "mirror", "--steps-per-generation", "4"])
    own = mod.credit_settings("selfplay", mirror)
    assert (own["rules"]["past_share"], own["rules"]["average_last"], own["credit"].step) == (0.0, 4, 0.045)
    assert mod.config_for("selfplay", mirror, "out").rules.average_last == 4
    assert mod.grpo_settings(mirror, 1e-2) == {"learning_rate": pytest.approx(3e-3), "steps_per_generation": 4,
                                               "num_iterations": 1}
    passes = mod.parse_args(["--credit", "mirror", "--num-iterations", "2"])
    assert mod.grpo_settings(passes, 1e-2)["num_iterations"] == mod.run_settings(passes)["num_iterations"] == 2
    assert "average_last" not in mod.credit_settings("psro", mirror)["rules"]
    assert mod.credit_settings("selfplay", mod.parse_args(["--credit", "mirror", "--epochs", "2"]))["rules"][
        "average_last"] == 1
    assert mod.grpo_settings(mod.parse_args(["--credit", "pooled"]), 1e-2)["learning_rate"] == 1e-2
    table = mod.parse_args(["--credit", "mirror", "--mirror-iterate", "table"])
    assert mod.grpo_settings(table, 1e-2)["learning_rate"] == 1e-2  # the steps are kept in the table
    assert mod.credit_settings("selfplay", table)["credit"] == MirrorVariantCredit(iterate="table")
    assert mod.run_settings(table)["mirror_iterate"] == "table" and mod.run_settings(mirror)["mirror_iterate"] == "policy"
    # --branch-samples and --games-per-round reach the credit and the trainers' configs
    wide = mod.parse_args(["--credit", "mirror", "--branch-samples", "1", "--games-per-round", "256"])
    assert mod.credit_settings("selfplay", wide)["credit"] == MirrorCredit(samples=1)
    assert mod.config_for("selfplay", wide, "out").rules.games_per_round == 256
    assert mod.config_for("fictitious", wide, "out").rules.games_per_round == 256
    assert mod.credit_settings("selfplay", mirror)["credit"] == MirrorCredit()
    moves = mod.parse_args(["--credit", "moves", "--branch-samples", "3"])
    assert mod.credit_settings("psro", moves)["credit"].samples == 3 and mod.run_settings(moves)["branch_samples"] == 3
    pooled = mod.parse_args(["--credit", "pooled", "--branch-samples", "3"])
    assert mod.credit_settings("psro", pooled)["credit"].samples == 3
    assert mod.run_settings(mirror)["branch_samples"] == 2 and mod.run_settings(mod.parse_args([]))["branch_samples"] is None
    for argv, message in ((["--branch-samples", "1"], "pick one of them"),
                          (["--credit", "mirror", "--branch-samples", "0"], "at least 1"),
                          (["--games-per-round", "0"], "at least 1"),
                          (["--num-iterations", "0"], "at least 1"),
                          (["--trainers", "psro", "--games-per-round", "64"], "add --trainers selfplay")):
        with pytest.raises(SystemExit):
            mod.parse_args(argv)
        assert message in capsys.readouterr().err
