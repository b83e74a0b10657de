"""``autocurricula check-model``: does the engine serve, batch, train and export this model?

Each check loads nothing twice: one engine serves the model, transformers (when the folder holds
weights it reads) is the reference for greedy tokens and for the exported peft adapter, and
mlx-lm loads the exported mlx adapter. docs/models.md holds the table for every family.

A model that does not load is an answer too: a ``load`` row that names the cause and the fix
(:class:`ModelLoadError`), never a traceback. :func:`inspect_model_folder` runs the cheap part of
that (config.json, family, weights) before anything is loaded; :func:`explain_load_error` turns
what mlx-lm raises while loading into the same kind of message.
"""

from __future__ import annotations

import glob
import json
import math
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
from autocurricula.engine.models import UnsupportedModelError, WeightsMismatchError, check_supported, register
from autocurricula.engine.models.config import check_against_weights, weight_shapes
from autocurricula.publish.export import export_mlx, export_peft
from autocurricula.publish.hub import ModelNotFoundError, check_model_source, fetch_failure, fetch_model
from autocurricula.records import Turn
from autocurricula.training import Updater
from autocurricula.training.config import GRPOConfig
from autocurricula.training.trie import pack

CHECKS = ("load", "generate", "multi-lora", "prefix cache", "update", "tree update", "peft export", "mlx export")
PLAYERS = 4
PEFT_TOLERANCE = 1e-4  # max |logit difference| of the peft adapter in transformers vs the engine
MLX_TOLERANCE = 1e-3  # mlx-lm's LoRA layers add the adapter in another order than the engine's
_PROMPT = "The player moves first, then the board turns: who wins the game? Think, then answer."
_LONG_PROMPT = " ".join([_PROMPT] * 4)  # several prefix-cache blocks


@dataclass
class CheckResult:
    """One row of the table: ``ok`` is True (passed), False (failed) or None (not run)."""

    name: str
    ok: bool | None
    detail: str = ""
    seconds: float = 0.0
    error: BaseException | None = field(default=None, repr=False, compare=False)  # what failed (--debug)


class ModelLoadError(ValueError):
    """A model folder the engine cannot load. ``cause`` says why, ``fix`` what to do; the message
    is both, in one or two sentences."""

    def __init__(self, model, cause: str, fix: str):
        self.model, self.cause, self.fix = str(model), cause, fix
        super().__init__(f"model {self.model!r} cannot be loaded: {cause.rstrip('.')}. {fix}")


_FOLDER = ("give the folder that holds the model's config.json, tokenizer and *.safetensors weights (a Hub "
           "download, or `save_pretrained` of transformers), or build one with `autocurricula tiny-model PATH`")
_FAMILIES = "Use a checkpoint of a family the engine serves: docs/models.md lists them"


def resolve(model: str | Path) -> Path:
    """The local folder of a model folder or Hub id (downloaded as ``mlx_lm.load`` does, or found
    in the Hugging Face cache); :class:`~autocurricula.publish.hub.ModelNotFoundError`, with the
    offline options, when it is neither."""
    source = check_model_source(model)
    path = Path(source)
    return path if path.exists() else fetch_model(source)


def inspect_model_folder(folder: str | Path) -> dict:
    """The ``config.json`` of a model folder, after the checks that need no weights loaded: the
    folder holds a readable config.json naming a ``model_type``, a family the engine serves
    (:class:`UnsupportedModelError` for a refused one) and defines, and safetensors weights whose
    headers agree with the config's sizes (block count, hidden size, vocabulary).
    Anything else is a :class:`ModelLoadError` naming the cause and the fix."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(folder, "it is a file, not a model folder" if folder.exists() else "no such folder",
                             _FOLDER[0].upper() + _FOLDER[1:])
    path = folder / "config.json"
    if not path.is_file():
        found = sorted(p.name for p in folder.iterdir())
        held = f"it holds {', '.join(found[:6])}{', ...' if len(found) > 6 else ''}" if found else "it is empty"
        raise ModelLoadError(folder, f"the folder has no config.json ({held}), so it is not a model folder",
                             _FOLDER[0].upper() + _FOLDER[1:])
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ModelLoadError(folder, f"its config.json is not valid JSON ({exc})",
                             "Restore config.json from the model's source (download it again, or write it with "
                             "transformers' `save_pretrained`)") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise ModelLoadError(folder, "its config.json names no model_type, so the model's family is unknown",
                             "Use the config.json that transformers' `save_pretrained` writes: it names the "
                             "family in \"model_type\" (e.g. \"llama\")")
    check_supported(config)
    _check_family(folder, config)
    _check_weights(folder)
    try:  # its sizes against the weights' headers, before anything is built (load checks them again)
        check_against_weights(config, weight_shapes(folder))
    except WeightsMismatchError as exc:
        raise ModelLoadError(folder, exc.cause, exc.fix) from None
    return config


def _check_family(folder: Path, config: dict) -> None:
    """A ``model_type`` for which neither mlx-lm nor this package has a definition is refused by name."""
    if config.get("model_file"):  # a custom module: mlx-lm's own refusal says what to do
        return
    try:
        from mlx_lm.utils import _get_classes  # mlx_lm imports transformers: not on import
    except ImportError:
        return
    register()
    try:
        _get_classes(config)
    except ValueError:
        raise ModelLoadError(folder, f"model_type {config['model_type']!r} is not a family the engine defines "
                             "(neither mlx-lm nor autocurricula has a definition of it)", _FAMILIES) from None


def _check_weights(folder: Path) -> None:
    if glob.glob(str(folder / "model*.safetensors")):
        return
    other = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".safetensors", ".gguf", ".pt", ".pth"))
    cause = (f"it holds no model*.safetensors weights (only {', '.join(other[:4])})" if other else
             "it holds no weights (no model*.safetensors file next to config.json)")
    raise ModelLoadError(folder, cause, "Write the weights as safetensors: "
                         "`AutoModelForCausalLM.from_pretrained(FOLDER).save_pretrained(NEW_FOLDER)` (transformers), "
                         "or `mlx_lm.convert`; a Hub download of the model has them")


_ADD_KEY = ("Add it with the value of the model's source (transformers 5 moves some config keys, e.g. under "
            "rope_parameters or text_config); docs/models.md, Known gaps")
_MISSING_ARG = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.+)$")


def explain_load_error(exc: BaseException, model) -> BaseException:
    """What a failure to load ``model`` (a folder or Hub id) means: the project's own errors as they
    are, anything mlx-lm or transformers raised while reading the folder as a
    :class:`ModelLoadError` naming the cause and the fix (chained to ``exc``)."""
    if isinstance(exc, (ModelLoadError, UnsupportedModelError, ModelNotFoundError)):
        return exc
    text = str(exc).strip()
    first = " ".join(text.split())  # mlx-lm lists missing parameters one a line
    first = first if len(first) <= 300 else first[:297] + "..."
    where = Path(str(model)).expanduser()
    if not where.exists():  # a Hub id (or not even that): the download failed, or the name is no model's
        try:
            check_model_source(model)
        except ModelNotFoundError as named:
            return named
        if type(exc).__module__.split(".")[0] in ("huggingface_hub", "httpx", "requests"):
            return fetch_failure(str(model), exc)
    if where.is_dir() and ((isinstance(exc, FileNotFoundError) and "config.json" in text)
                           or "No safetensors found" in text):
        try:  # the folder's own checks name it better than mlx-lm's message
            inspect_model_folder(where)
        except (ModelLoadError, UnsupportedModelError) as named:
            return named
    if isinstance(exc, ValueError) and ("Missing" in text and "parameters" in text or "not in model" in text
                                        or "Expected shape" in text):
        err = ModelLoadError(model, f"the weights do not match config.json ({first})",
                             "Take config.json and the *.safetensors from the same checkpoint (download it "
                             "again, or write both with `save_pretrained`); for a folder written by transformers "
                             "5 whose weight names the engine does not read, see docs/models.md (Known gaps)")
    elif isinstance(exc, ValueError) and text.startswith("Model type"):
        err = ModelLoadError(model, f"{first.rstrip('.')}: no definition of this family", _FAMILIES)
    elif isinstance(exc, TypeError) and _MISSING_ARG.search(first):
        err = ModelLoadError(model, f"its config.json lacks {_MISSING_ARG.search(first).group(1)}, which the "
                             f"family's definition needs ({type(exc).__name__}: {first})", _ADD_KEY)
    elif isinstance(exc, KeyError):
        err = ModelLoadError(model, f"the family's definition reads {first}, which config.json or the weights lack "
                             f"(KeyError)", _ADD_KEY)
    elif _raised_in(exc, "tokenizer_utils.py") or _raised_in(exc, "tokenization_"):
        err = ModelLoadError(model, f"its tokenizer cannot be loaded ({type(exc).__name__}: {first})",
                             "Put the model's tokenizer files (tokenizer.json, tokenizer_config.json) in the folder, "
                             "e.g. with `AutoTokenizer.from_pretrained(SOURCE).save_pretrained(FOLDER)`")
    else:
        err = ModelLoadError(model, f"{type(exc).__name__}: {first}",
                             "docs/models.md lists the families the engine serves and the known gaps of their "
                             "folders; `autocurricula --debug ...` shows the traceback")
    err.__cause__ = exc
    return err


def _raised_in(exc: BaseException, name: str) -> bool:
    """Whether one of the frames ``exc`` passed through lies in a file whose name contains ``name``."""
    tb = exc.__traceback__
    while tb is not None:
        if name in Path(tb.tb_frame.f_code.co_filename).name:
            return True
        tb = tb.tb_next
    return False


# (file, function) whose failure means the model folder could not be read: mlx-lm's loader, and
# the engine's (autocurricula/engine/models/__init__.py: load)
_LOADERS = {("utils.py", "load"), ("utils.py", "load_model"), ("utils.py", "load_config"),
            ("utils.py", "_get_classes"), ("utils.py", "_download"), ("tokenizer_utils.py", "load"),
            ("tokenizer_utils.py", "load_tokenizer")}


def raised_while_loading(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a model folder was read: it passed through mlx-lm's loader
    or ``autocurricula.engine.models.load`` (also on the engine's thread: the
    :class:`~autocurricula.engine.Engine` constructor raises its load error again, frames kept)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        parts = Path(code.co_filename).parts
        if len(parts) > 1 and parts[-2] == "mlx_lm" and (parts[-1], code.co_name) in _LOADERS:
            return True
        if parts[-3:] == ("engine", "models", "__init__.py") and code.co_name == "load":
            return True
        tb = tb.tb_next
    return False


def check_model(model: str | Path, *, max_tokens: int = 12, work_dir: str | Path | None = None,
                engine_config: EngineConfig | None = None) -> list[CheckResult]:
    """Run every check of :data:`CHECKS` on a model folder or Hub id and return one result each.

    A model that does not load (no such folder or Hub id, no config.json, a family the engine
    refuses or does not define, no weights, weights that do not match the config...) fails
    ``load`` with the cause and the fix, and the other checks are not run; nothing is raised. A
    check that raises fails with the error, and the following checks still run when they can.
    Each failed row keeps its exception in ``error``.
    """
    start = time.perf_counter()
    try:
        folder = resolve(model)
        inspect_model_folder(folder)
    except (ModelNotFoundError, ModelLoadError, UnsupportedModelError) as exc:
        return _not_loaded(exc, exc, time.perf_counter() - start)
    results: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="check-model-", dir=work_dir) as tmp:
        try:
            engine = Engine(str(folder), config=engine_config or EngineConfig(max_slots=PLAYERS + 2))
        except Exception as exc:  # noqa: BLE001 - a model that does not load is a row of the table
            return _not_loaded(explain_load_error(exc, folder), exc, time.perf_counter() - start)
        results.append(CheckResult("load", True, _describe(engine), time.perf_counter() - start))
        try:
            try:
                run = _Checks(engine, folder, Path(tmp), max_tokens)
            except Exception as exc:  # noqa: BLE001 - e.g. no linear layer to adapt: a row, not a crash
                detail = _short(exc)
                return results + [CheckResult(CHECKS[1], False, f"cannot set up the checks: {detail}", error=exc)] \
                    + [CheckResult(n, None, "not run: the checks could not be set up") for n in CHECKS[2:]]
            for name, fn in (("generate", run.generate), ("multi-lora", run.multi_lora),
                             ("prefix cache", run.prefix_cache), ("update", run.update), ("tree update", run.tree_update),
                             ("peft export", run.peft_export), ("mlx export", run.mlx_export)):
                start = time.perf_counter()
                try:
                    ok, detail = fn()
                except Exception as exc:  # noqa: BLE001 - a failed check is a row of the table
                    ok, detail, error = False, _short(exc), exc
                else:
                    error = None
                results.append(CheckResult(name, ok, detail, time.perf_counter() - start, error))
        finally:
            engine.close()
    return results


def _short(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300]


def _not_loaded(exc: BaseException, error: BaseException, seconds: float) -> list[CheckResult]:
    """The table of a model that does not load: ``load`` fails with the cause and the fix."""
    if isinstance(exc, UnsupportedModelError):
        return [CheckResult("load", False, f"refused: {exc}", seconds, error)] + \
            [CheckResult(n, None, "not run: the model is refused") for n in CHECKS[1:]]
    return [CheckResult("load", False, str(exc), seconds, error)] + \
        [CheckResult(n, None, "not run: the model did not load") for n in CHECKS[1:]]


def _describe(engine) -> str:
    return f"{len(engine.linear_dims)} linear layers, vocabulary {engine.vocab_size}"


class _Checks:
    """The checks after ``load``, sharing one engine and the players they install."""

    def __init__(self, engine, folder: Path, tmp: Path, max_tokens: int):
        self.engine, self.folder, self.tmp, self.max_tokens = engine, folder, tmp, max_tokens
        self.spec = LoraSpec(r=8, lora_alpha=16, target_modules="all-linear")
        self.paths = self.spec.resolve(engine.linear_dims)
        self.players = [f"player-{i}" for i in range(PLAYERS)]
        self.prompt = engine.encode(_PROMPT)
        # transformers' model of the folder; when it cannot be had, why (ok, detail) for the rows that need it
        self.reference, self.no_reference = None, (None, "not run: no transformers weights (MLX-quantized folder)")
        try:
            self.reference = _load_reference(folder)
        except ImportError as exc:  # torch / transformers: optional (extra hf)
            self.no_reference = (None, f"not run: no transformers to compare with ({exc}; pip install "
                                       "'autocurricula[hf]')")
        except Exception as exc:  # noqa: BLE001 - the engine serves it, transformers does not read it
            self.no_reference = (False, f"transformers cannot load this folder ({_short(exc)}), so neither can "
                                        "the peft adapters exported for it")

    def _greedy(self, player=None, prompt=None) -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True)
        return self.engine.generate(prompt or self.prompt, player, params).token_ids

    def _install(self) -> None:
        if self.players[0] in self.engine.players():
            return
        dims = {p: self.engine.linear_dims[p] for p in self.paths}
        for i, name in enumerate(self.players):
            # b_std 0.05 moves the logits by O(1): each player's greedy tokens are its own
            self.engine.install(name, AdapterWeights.random(dims, self.spec, seed=i + 1, b_std=0.05))

    def generate(self):
        """Greedy tokens after a short prompt and a long one (past a small sliding window), and
        the logits over the long one: greedy tokens alone can agree while a window is ignored."""
        prompts = [self.prompt, self.engine.encode(_LONG_PROMPT)]
        tokens = [self._greedy(prompt=p) for p in prompts]
        if self.reference is None:
            if self.no_reference[0] is False:
                return self.no_reference
            why = self.no_reference[1].removeprefix("not run: ")
            return all(tokens), f"{len(tokens[0])} tokens ({why}; not compared)"
        for got, prompt in zip(tokens, prompts):
            want = _torch_greedy(self.reference, prompt, self.max_tokens)
            if got != want:
                return False, f"engine {got} != transformers {want} after a {len(prompt)}-token prompt"
        import torch  # torch: optional (extra hf); here only with a transformers reference

        with torch.no_grad():
            theirs = self.reference(torch.tensor([prompts[1]])).logits[0].float().numpy()
        gap = float(np.abs(theirs - self.engine.logits(prompts[1])).max())
        if not gap <= PEFT_TOLERANCE * max(1.0, float(np.abs(theirs).max())):
            return False, f"logits over the {len(prompts[1])}-token prompt differ from transformers' by {gap:.3g}"
        return True, (f"{len(tokens[0])} greedy tokens equal transformers' (prompts of "
                      f"{' and '.join(str(len(p)) for p in prompts)} tokens), logits within {gap:.2g}")

    def multi_lora(self):
        self._install()
        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True)
        batch = [f.result() for f in self.engine.submit_many([(self.prompt, p, params) for p in self.players])]
        alone = [self.engine.generate(self.prompt, p, params) for p in self.players]
        bad = [p for p, b, a in zip(self.players, batch, alone) if b.token_ids != a.token_ids]
        if bad:
            return False, f"batched tokens differ from each player alone for {bad}"
        # each player's own log-probabilities, even where two players' greedy tokens agree
        gap = max(float(np.abs(np.subtract(b.logprobs, a.logprobs)).max()) for b, a in zip(batch, alone))
        if not gap <= PEFT_TOLERANCE:
            return False, f"batched log-probabilities differ from each player alone by {gap:.3g}"
        distinct = len({tuple(a.token_ids) for a in alone})
        return True, f"{PLAYERS} players batched == alone ({distinct} distinct outputs, log-probs within {gap:.1g})"

    def prefix_cache(self):
        self._install()
        if self.engine.prefix_cache is None:
            return None, "not run: the engine's prefix cache is off"
        prompt = self.engine.encode(_LONG_PROMPT)
        first = self._greedy(self.players[0], prompt)
        hits = self.engine.stats["prefix_hit_tokens"]
        again = self._greedy(self.players[0], prompt)
        reused = self.engine.stats["prefix_hit_tokens"] - hits
        if reused <= 0:
            return False, f"no prompt token was reused ({len(prompt)}-token prompt)"
        if again != first:
            return False, f"tokens with {reused} reused prompt tokens {again} != without {first}"
        return True, f"{reused} of {len(prompt)} prompt tokens reused, same tokens"

    def update(self):
        self._install()
        name = self.players[0]
        before = self.engine.logits(self.prompt, name)
        turns = []
        for i, adv in enumerate((1.0, -1.0)):
            c = self.engine.generate(self.prompt, name, SamplingParams(temperature=1.0, max_tokens=self.max_tokens,
                                                                       seed=i))
            turns.append(Turn(name, f"check-{i}", "player", list(c.prompt_ids), list(c.token_ids), list(c.logprobs),
                              version=c.adapter_version, reward=adv, group="check", advantage=adv))
        metrics = Updater(self.engine, GRPOConfig(learning_rate=1e-3)).step(turns)
        moved = float(np.abs(self.engine.logits(self.prompt, name) - before).max())
        if not moved > 0:
            return False, "the update left the player's logits unchanged"
        return True, f"loss {metrics.get('loss', float('nan')):.4f}, logits moved by up to {moved:.3g}"

    def tree_update(self):
        """The default tree-packed update against the per-row one on two players' turns sharing
        prefixes (a group of completions of one prompt, and a conversation whose turns extend each
        other): the same loss and adapter gradients, to float32 rounding (16 u sqrt(n) (layers + 1),
        n the largest tree's tokens)."""
        why = self.engine.tree_fallback()
        if why is not None:
            return None, f"not run: updated per row ({why})"
        self._install()
        turns = []
        for player in self.players[:2]:
            prompt = list(self.prompt)
            for i in range(3):
                c = self.engine.generate(prompt, player, SamplingParams(temperature=1.0, max_tokens=self.max_tokens,
                                                                         seed=i))
                for j, adv in enumerate((1.0, -1.0)):  # a pair of completions of each prompt, and a chain
                    d = c if j == 0 else self.engine.generate(prompt, player, SamplingParams(
                        temperature=1.0, max_tokens=self.max_tokens, seed=100 + i))
                    turns.append(Turn(player, f"tree-{i}-{j}", "player", list(d.prompt_ids), list(d.token_ids),
                                      list(d.logprobs), reward=adv, group=f"tree-{i}", advantage=adv))
                prompt = prompt + list(c.token_ids) + self.engine.encode(" Your turn.")
        rows_m, rows_g = Updater(self.engine, GRPOConfig(packing="rows")).gradients(turns)
        tree_m, tree_g = Updater(self.engine, GRPOConfig(packing="tree")).gradients(turns)
        n = max(len(pack([t.prompt_ids + t.completion_ids for t in turns if t.player == p])) for p in self.players[:2])
        tol = 16 * 2.0 ** -24 * math.sqrt(n) * (self.engine.num_layers + 1)
        if not abs(tree_m["loss"] - rows_m["loss"]) <= tol * max(1.0, abs(rows_m["loss"])):
            return False, f"loss {tree_m['loss']:.6g} tree-packed != {rows_m['loss']:.6g} per row"
        worst = 0.0
        for player, modules in rows_g.items():
            for path, pair in modules.items():
                for want, got in zip(pair, tree_g[player][path]):
                    worst = max(worst, float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30))
        if not worst <= tol:
            return False, f"adapter gradients differ from the per-row update's by {worst:.3g} (relative; within {tol:.2g} expected)"
        return True, (f"{tree_m['computed_tokens']} of {rows_m['computed_tokens']} tokens computed, loss and gradients "
                      f"equal per-row to {worst:.2g} (relative)")

    def peft_export(self):
        if self.reference is None:
            return self.no_reference
        # torch and peft: optional (extra hf)
        import torch
        from peft import PeftModel

        self._install()
        name = self.players[1]
        out = export_peft(self.engine.adapter_weights(name), self.tmp / "peft", str(self.folder))
        model = PeftModel.from_pretrained(self.reference, str(out))
        try:
            with torch.no_grad():
                theirs = model(torch.tensor([self.prompt])).logits[0].float().numpy()
        finally:
            model.unload()
        diff = float(np.abs(theirs - self.engine.logits(self.prompt, name)).max())
        if not diff <= PEFT_TOLERANCE:
            return False, f"PeftModel logits differ by {diff:.3g} (> {PEFT_TOLERANCE:g})"
        return True, f"PeftModel logits within {diff:.2g}"

    def mlx_export(self):
        # mlx_lm.load with the config read as the engine reads it (transformers 5's rope_parameters,
        # renamed keys; autocurricula/engine/models/config.py): mlx-lm alone misreads such folders
        from autocurricula.engine.models import load

        self._install()
        name = self.players[2]
        out = export_mlx(self.engine.adapter_weights(name), self.tmp / "mlx", base_model=self.folder)
        register()
        model, _ = load(str(self.folder), adapter_path=str(out))
        theirs = np.array(model(mx.array([self.prompt]))[0].astype(mx.float32))
        diff = float(np.abs(theirs - self.engine.logits(self.prompt, name)).max())
        if not diff <= MLX_TOLERANCE * max(1.0, float(np.abs(theirs).max())):
            return False, f"mlx_lm.load(adapter_path=...) logits differ by {diff:.3g}"
        if not np.abs(theirs - self.engine.logits(self.prompt)).max() > 10 * diff:
            return False, "mlx_lm.load(adapter_path=...) gave the base model's logits: the adapter was not applied"
        return True, f"mlx_lm.load(adapter_path=...) logits within {diff:.2g}"


def _load_reference(folder: Path):
    """transformers' float32 model of the folder, or None when it holds only MLX-quantized weights."""
    config = json.loads((folder / "config.json").read_text())
    if "quantization" in config:
        return None
    # torch (extra hf) and transformers: only for a reference on unquantized weights
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def _torch_greedy(model, prompt: list[int], steps: int) -> list[int]:
    import torch  # torch: optional (extra hf)

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def format_table(model: str | Path, results: list[CheckResult]) -> str:
    """A Markdown table of ``results`` (what ``autocurricula check-model`` prints)."""
    mark = {True: "pass", False: "FAIL", None: "-"}
    lines = [f"check-model {model}", "", "| check | result | seconds | detail |", "|---|---|---|---|"]
    for r in results:
        detail = " ".join(r.detail.split()).replace("|", "\\|")  # one line a row
        lines.append(f"| {r.name} | {mark[r.ok]} | {r.seconds:.1f} | {detail} |")
    return "\n".join(lines)


def passed(results: list[CheckResult]) -> bool:
    """True when no check failed (checks not run do not count)."""
    return not any(r.ok is False for r in results)
