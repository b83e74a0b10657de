"""``autocurricula check-model``: does the engine serve, batch, train and export this model?

Each check loads nothing twice: one engine serves the model, transformers (when the folder holds
weights it reads) is the reference for greedy tokens and for the exported peft adapter, and
mlx-lm loads the exported mlx adapter. docs/models.md holds the table for every family.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams
from autocurricula.engine.models import UnsupportedModelError, register
from autocurricula.publish.export import export_mlx, export_peft
from autocurricula.publish.hub import check_model_source
from autocurricula.records import Turn
from autocurricula.training import Updater
from autocurricula.training.config import GRPOConfig

CHECKS = ("load", "generate", "multi-lora", "prefix cache", "update", "peft export", "mlx export")
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


def resolve(model: str | Path) -> Path:
    """The local folder of a model folder or Hub id (downloaded as ``mlx_lm.load`` does)."""
    from mlx_lm.utils import _download  # mlx_lm imports transformers: not on import

    return Path(_download(check_model_source(model)))


def check_model(model: str | Path, *, max_tokens: int = 12, work_dir: str | Path | None = None,
                engine_config: EngineConfig | None = None) -> list[CheckResult]:
    """Run every check of :data:`CHECKS` on a model folder or Hub id and return one result each.

    A refused family fails ``load`` with the engine's reason and skips the rest; a check that
    raises fails with the error, and the following checks still run when they can.
    """
    folder = resolve(model)
    results: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="check-model-", dir=work_dir) as tmp:
        start = time.perf_counter()
        try:
            engine = Engine(str(folder), config=engine_config or EngineConfig(max_slots=PLAYERS + 2))
        except UnsupportedModelError as exc:
            results.append(CheckResult("load", False, f"refused: {exc}", time.perf_counter() - start))
            return results + [CheckResult(n, None, "not run: the model is refused") for n in CHECKS[1:]]
        results.append(CheckResult("load", True, _describe(engine), time.perf_counter() - start))
        try:
            run = _Checks(engine, folder, Path(tmp), max_tokens)
            for name, fn in (("generate", run.generate), ("multi-lora", run.multi_lora),
                             ("prefix cache", run.prefix_cache), ("update", run.update),
                             ("peft export", run.peft_export), ("mlx export", run.mlx_export)):
                start = time.perf_counter()
                try:
                    ok, detail = fn()
                except Exception as exc:  # noqa: BLE001 - a failed check is a row of the table
                    ok, detail = False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                results.append(CheckResult(name, ok, detail, time.perf_counter() - start))
        finally:
            engine.close()
    return results


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
        self.reference = _load_reference(folder)

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
            return all(tokens), f"{len(tokens[0])} tokens (no transformers weights to compare: MLX-quantized)"
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

    def peft_export(self):
        if self.reference is None:
            return None, "not run: no transformers weights (MLX-quantized folder)"
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
        from mlx_lm import load  # mlx_lm imports transformers: not on import

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
        detail = r.detail.replace("|", "\\|")
        lines.append(f"| {r.name} | {mark[r.ok]} | {r.seconds:.1f} | {detail} |")
    return "\n".join(lines)


def passed(results: list[CheckResult]) -> bool:
    """True when no check failed (checks not run do not count)."""
    return not any(r.ok is False for r in results)
