"""Supervised warm-up: teach a (tiny) base model a game's format before league training.

A random tiny model does not know that a tic-tac-toe prompt wants one digit; RL from there
mostly learns the penalty for unparseable replies. ``sft_warmup`` fully fine-tunes the base on
(prompt, completion) pairs -- e.g. random *legal* moves, which teach the format and legality but
no strategy -- and writes a new model folder in Hugging Face format that loads through the same
code path as any model. The result is cached by its arguments (and built atomically).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from tqdm.auto import tqdm

from autocurricula.engine.models import load

MARKER = "autocurricula_warmup.json"


def sft_warmup(base: str | Path, out: str | Path, examples: list[tuple[str, str]], *, steps: int = 300,
               batch_size: int = 64, learning_rate: float = 1e-3, seed: int = 0, log_every: int = 0,
               progress: bool = False) -> Path:
    """Fine-tune every weight of ``base`` on ``examples`` (loss on completion tokens, eos appended)
    and save to ``out``; returns ``out``. Re-running with the same arguments reuses the folder.
    ``progress``: a tqdm bar over the steps, with their rate, the time left and the loss."""
    out = Path(out)
    key = hashlib.sha256(json.dumps([str(base), examples, steps, batch_size, learning_rate, seed]).encode()).hexdigest()
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("key") == key:
        return out
    model, tok = load(str(base))
    eos = tok.eos_token_id
    rows = []
    for prompt, completion in examples:
        p = tok.encode(prompt)
        c = tok.encode(completion, add_special_tokens=False) + [eos]
        rows.append((p, c))
    rng = np.random.default_rng(seed)
    mx.random.seed(seed)

    def loss_fn(model, ids, mask):
        logits = model(ids[:, :-1]).astype(mx.float32)
        ce = nn.losses.cross_entropy(logits, ids[:, 1:], reduction="none")
        return (ce * mask).sum() / mask.sum()

    step_fn = nn.value_and_grad(model, loss_fn)
    opt = optim.AdamW(learning_rate=learning_rate, weight_decay=0.0, bias_correction=True)
    bar = tqdm(total=steps, desc=f"warm-up of {Path(base).name}", unit="step", disable=not progress)
    for step in range(steps):
        batch = [rows[i] for i in rng.integers(0, len(rows), batch_size)]
        width = max(len(p) + len(c) for p, c in batch)
        ids = np.zeros((len(batch), width), np.int32)
        mask = np.zeros((len(batch), width - 1), np.float32)
        for i, (p, c) in enumerate(batch):
            ids[i, : len(p) + len(c)] = p + c
            mask[i, len(p) - 1 : len(p) - 1 + len(c)] = 1  # positions that predict completion tokens
        loss, grads = step_fn(model, mx.array(ids), mx.array(mask))
        opt.update(model, grads)
        mx.eval(loss, model.parameters(), opt.state)
        if log_every and step % log_every == 0:
            print(f"warm-up step {step}: loss {loss.item():.3f}")
        if progress:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            bar.update(1)
    bar.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for f in Path(base).iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (MARKER, "model.safetensors.index.json"):
                shutil.copyfile(f, tmp / f.name)
        weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "pt"})
        (tmp / MARKER).write_text(json.dumps({"key": key, "base": str(base), "steps": steps, "examples": len(examples)}))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
