"""The command line answers a bad model, or any error the project understands, with the cause and
the fix and no traceback (issue 66 item 6, issue 70 item 2); ``--debug`` shows the traceback.

``check-model`` on a model that does not load prints its table, whose ``load`` row names the cause
and the fix, and exits with status 1. No test reaches the network: the Hub id runs in a subprocess
with HF_HUB_OFFLINE=1 and an empty cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from autocurricula.cli import main, user_error
from autocurricula.publish.check_model import CHECKS, ModelLoadError, check_model, explain_load_error, \
    inspect_model_folder

HUB_ID = "mlx-community/Qwen2.5-0.5B-Instruct-4bit"


def _copy(src, dst, **config):
    """A copy of the tiny model whose config.json has ``config`` merged in (None: the key removed)."""
    shutil.copytree(src, dst)
    path = dst / "config.json"
    data = json.loads(path.read_text())
    for key, value in config.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return dst


@pytest.fixture(scope="module")
def bad(tiny_model_path, tmp_path_factory):
    """name -> (a model that does not load, a regex its ``load`` row must match: cause and fix)."""
    root = tmp_path_factory.mktemp("bad-models")
    llama = json.loads((tiny_model_path / "config.json").read_text())
    (root / "empty").mkdir()
    (root / "not-json").mkdir()
    (root / "not-json" / "config.json").write_text("{not json")
    (root / "no-type").mkdir()
    (root / "no-type" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (root / "no-weights").mkdir()
    (root / "no-weights" / "config.json").write_text(json.dumps(llama))
    (root / "torch-weights").mkdir()
    (root / "torch-weights" / "config.json").write_text(json.dumps(llama))
    (root / "torch-weights" / "pytorch_model.bin").write_bytes(b"\0")
    # Falcon (no definition in mlx-lm or here), with weights, as a real checkpoint has them
    _copy(tiny_model_path, root / "falcon", model_type="falcon", architectures=["FalconForCausalLM"])
    _copy(tiny_model_path, root / "made-up", model_type="made_up_lm")
    _copy(tiny_model_path, root / "refused", model_type="mamba")
    _copy(tiny_model_path, root / "more-layers", num_hidden_layers=llama["num_hidden_layers"] + 1)
    _copy(tiny_model_path, root / "wider-mlp", intermediate_size=llama["intermediate_size"] * 2)
    _copy(tiny_model_path, root / "no-hidden-size", hidden_size=None)
    notok = _copy(tiny_model_path, root / "no-tokenizer")
    for f in notok.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            f.unlink()
    (root / "a-file").write_text("weights?")
    fix_folder = r"Give the folder that holds the model's config\.json.*`autocurricula tiny-model PATH`"
    families = r"docs/models\.md lists them"
    return {
        "nonexistent": (str(root / "nonexistent"), r"no such folder, and not a Hub id; give an existing local model"),
        "a file": (str(root / "a-file"), r"it is a file, not a model folder\. " + fix_folder),
        "no config.json": (str(root / "empty"), r"has no config\.json \(it is empty\).*" + fix_folder),
        "config not JSON": (str(root / "not-json"), r"config\.json is not valid JSON \(.*\)\. Restore config\.json"),
        "no model_type": (str(root / "no-type"), r"names no model_type.*\"model_type\""),
        "no weights": (str(root / "no-weights"), r"holds no weights.*Write the weights as safetensors"),
        "torch weights": (str(root / "torch-weights"), r"only pytorch_model\.bin\).*save_pretrained"),
        "falcon": (str(root / "falcon"), r"model_type 'falcon' is not a family the engine defines.*" + families),
        "made-up type": (str(root / "made-up"), r"'made_up_lm' is not a family.*" + families),
        "refused family": (str(root / "refused"), r"refused: .*'mamba'.*docs/models\.md"),
        "missing tensors": (str(root / "more-layers"),
                            r"config\.json does not match its weights: num_hidden_layers=5, but its weights hold 4 "
                            r"blocks.*same checkpoint"),
        "tensor shapes": (str(root / "wider-mlp"), r"weights do not match config\.json \(Expected shape"),
        "config key": (str(root / "no-hidden-size"), r"config\.json lacks 'hidden_size'.*Add it"),
        "no tokenizer": (str(root / "no-tokenizer"), r"its tokenizer cannot be loaded.*tokenizer\.json"),
    }


CASES = ["nonexistent", "a file", "no config.json", "config not JSON", "no model_type", "no weights", "torch weights",
         "falcon", "made-up type", "refused family", "missing tensors", "tensor shapes", "config key", "no tokenizer"]


@pytest.mark.parametrize("case", CASES)
def test_check_model_answers_every_model_that_does_not_load_with_a_row(bad, case, capsys):
    model, cause = bad[case]
    results = check_model(model)  # never raises
    assert [r.name for r in results] == list(CHECKS)
    load = results[0]
    assert load.ok is False and load.error is not None
    assert all(r.ok is None and r.detail.startswith("not run") for r in results[1:])
    with pytest.raises(SystemExit) as info:
        main(["check-model", model])
    assert info.value.code == 1
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("| load |"))
    assert row.startswith("| load | FAIL |"), out
    assert re.search(cause, row), row
    assert "Traceback" not in out + err


def test_check_model_debug_adds_the_traceback_of_the_failed_row(bad, capsys):
    with pytest.raises(SystemExit):
        main(["--debug", "check-model", bad["missing tensors"][0]])
    out, err = capsys.readouterr()
    assert "| load | FAIL |" in out and "Traceback" in err and "num_hidden_layers=5" in err
    with pytest.raises(SystemExit):  # after the command too
        main(["check-model", bad["no config.json"][0], "--debug"])
    assert "Traceback" in capsys.readouterr().err


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "autocurricula.cli", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def test_a_hub_id_offline_and_not_cached_is_a_row_that_names_the_fix(tmp_path):
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
    out = _cli("check-model", HUB_ID, env=offline)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| load |"))
    assert "| FAIL |" in row and "offline mode is on (HF_HUB_OFFLINE=1)" in row and "HF_HUB_OFFLINE=0" in row
    assert "local model folder" in row and "`autocurricula tiny-model PATH`" in row
    train = _cli("train", "--model", HUB_ID, "--output-dir", str(tmp_path / "run"), env=offline)
    assert train.returncode == 1 and "Traceback" not in train.stderr, train.stderr[-2000:]
    assert train.stderr.strip().startswith("autocurricula train: model") and "HF_HUB_OFFLINE=0" in train.stderr
    debug = _cli("--debug", "check-model", HUB_ID, env=offline)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ModelNotFoundError" in debug.stderr


@pytest.mark.parametrize("case", ["nonexistent", "no config.json", "config not JSON", "falcon", "missing tensors",
                                  "config key", "no tokenizer"])
def test_train_with_a_bad_model_prints_the_cause_and_no_traceback(bad, case, tmp_path):
    model, cause = bad[case]
    cause = cause.replace("refused: ", "")
    with pytest.raises(SystemExit) as info:
        main(["train", "--model", model, "--epochs", "1", "--output-dir", str(tmp_path / "run")])
    message = str(info.value.code)
    assert message.startswith("autocurricula train: model ") and re.search(cause, message), message
    assert "\n" not in message


def test_train_and_serve_in_a_subprocess_print_one_line_and_debug_the_traceback(bad, tmp_path):
    out = _cli("train", "--model", bad["missing tensors"][0], "--epochs", "1", "--output-dir", str(tmp_path / "a"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "does not match its weights" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = _cli("serve", "--model", bad["config key"][0], "--port", "0")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.startswith("autocurricula serve: model") and "lacks 'hidden_size'" in out.stderr
    out = _cli("--debug", "train", "--model", bad["missing tensors"][0], "--output-dir", str(tmp_path / "b"))
    assert out.returncode == 1 and "Traceback" in out.stderr and "num_hidden_layers=5" in out.stderr


def test_train_settings_that_fail_validation_are_one_line(tiny_model_path, tmp_path):
    config = tmp_path / "c.yaml"
    for text, expect in (("epochs: [1\n", "not valid YAML"), ("grpo:\n  no_such_setting: 1\n", "'grpo:' section"),
                         ("lora:\n  peft_type: IA3\n", "'lora:' section.*only LoRA"),
                         ("epochs: -1\n", r"--config")):
        config.write_text(text)
        with pytest.raises(SystemExit) as info:
            main(["train", "--model", str(tiny_model_path), "--config", str(config), "--output-dir",
                  str(tmp_path / "run")])
        assert str(info.value.code).startswith("autocurricula train: ") and re.search(expect, str(info.value.code)), \
            info.value.code
        with pytest.raises(Exception) as debug:  # --debug: the exception itself, with its traceback
            main(["--debug", "train", "--model", str(tiny_model_path), "--config", str(config)])
        assert not isinstance(debug.value, SystemExit)


def test_other_commands_name_the_problem(tmp_path):
    with pytest.raises(SystemExit, match=r"^autocurricula dashboard: .*output_dir of a training run"):
        main(["dashboard", str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match=r"^autocurricula tiny-model: .*--hidden"):
        main(["tiny-model", str(tmp_path / "t"), "--hidden", "30"])
    with pytest.raises(SystemExit, match=r"^autocurricula check-model: --tiny-family nope: unknown family"):
        main(["check-model", str(tmp_path / "f"), "--tiny-family", "nope"])
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(SystemExit, match=r"^autocurricula tiny-model: .*exists"):
        main(["tiny-model", str(tmp_path / "taken")])
    with pytest.raises(SystemExit, match=r"^autocurricula bench: model .*no such folder, and not a Hub id"):
        main(["bench", "engine", "--model", str(tmp_path / "nope"), "--quick"])
    with pytest.raises(SystemExit, match=r"^autocurricula bench: model .*has no config\.json"):
        main(["bench", "engine", "--model", str(tmp_path / "taken"), "--quick"])


def test_only_the_users_problems_lose_their_traceback(bad):
    assert user_error(RuntimeError("a bug")) is None and user_error(KeyError("x")) is None
    assert user_error(FileNotFoundError(2, "No such file or directory", "x.yaml")).endswith("'x.yaml'")
    missing = ModuleNotFoundError("No module named 'ray'", name="ray")
    assert "pip install ray" in user_error(missing)
    assert user_error(ModuleNotFoundError("No module named 'autocurricula.x'", name="autocurricula.x")) is None
    from autocurricula.engine.adapters import AdapterError
    from autocurricula.loop.checkpoint import CheckpointError

    assert user_error(AdapterError("bad adapter: do this")) == "bad adapter: do this"
    assert user_error(CheckpointError("broken: do that")) == "broken: do that"
    with pytest.raises(ModelLoadError, match="no config.json"):
        inspect_model_folder(bad["no config.json"][0])
    plain = ValueError("Missing 2 parameters: \na.weight,\nb.weight.")
    explained = explain_load_error(plain, "m")
    assert isinstance(explained, ModelLoadError) and explained.__cause__ is plain
    assert "weights do not match config.json (Missing 2 parameters: a.weight, b.weight.)" in str(explained)
    from autocurricula.publish.hub import ModelNotFoundError

    # a loader that got a path that is no folder (bench, the engine itself): the same message as train's
    named = explain_load_error(ValueError("Repo id must use alphanumeric chars"), bad["nonexistent"][0])
    assert isinstance(named, ModelNotFoundError) and "no such folder, and not a Hub id" in str(named)


def test_every_listed_project_error_exists():
    import importlib

    from autocurricula.cli import PROJECT_ERRORS

    for module, names in PROJECT_ERRORS.items():
        mod = importlib.import_module(module)
        for name in names:
            assert issubclass(getattr(mod, name), Exception), (module, name)
