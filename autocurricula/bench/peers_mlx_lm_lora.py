"""The mlx-lm-lora side of ``autocurricula bench peers``: its GRPO step on the update's rows.

Runs in mlx-lm-lora's own virtual environment (``--mlx-lm-lora-python``), by path, so it imports
nothing of ``autocurricula``; the worker protocol is :func:`peers_torch.serve`. Before MLX loads,
it preloads the BLAS library our MLX sides use (``spec["blas"]``), so both sides run the same
GEMM.

mlx-lm-lora trains one adapter per model: the model is loaded once with ``mlx_lm.load(model,
adapter_path=...)`` (LoRA layers on every linear, only ``lora_a`` / ``lora_b`` trainable), and
a step of the 8 players swaps in each player's adapter weights and AdamW state, then runs what
its ``train_grpo`` runs per batch: ``nn.value_and_grad(model, grpo_loss)`` over the player's rows
(``grpo_loss_type="bnpo"``: the mean over the player's completion tokens, ``beta=0``: no
reference model) and ``optimizer.update``. Its loss is on-policy only (the ratio is
``exp(logp - stop_gradient(logp)) = 1``, with no clipping by ratio and no gradient clipping), so
the first step's loss and gradient norms equal ours only on rows whose sampler logprobs are the
model's own; the parent gives it such rows.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

SIDE = "mlx_lm_lora_update"
IMPORT = "mlx_lm_lora"  # what the named python must import for this side to run


def _rows(spec: dict) -> dict[str, list[dict]]:
    import json

    turns = json.loads(Path(spec["turns"]).read_text())
    return {n: [t for t in turns if t["player"] == n] for n in spec["player_names"]}


def setup_mlx_lm_lora_update(spec: dict):
    if spec.get("blas"):  # before mlx.core, so MLX's cblas calls resolve to it
        ctypes.CDLL(spec["blas"], mode=ctypes.RTLD_GLOBAL)
    from importlib.metadata import version

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm import load
    from mlx_lm_lora.trainer.grpo_trainer import grpo_loss

    names, g = spec["player_names"], spec["grpo"]
    model, _ = load(spec["model"], adapter_path=spec["adapters"][names[0]]["mlx"])
    model.freeze()
    model.unfreeze(keys=["lora_a", "lora_b"], strict=False)
    model.train()
    weights = {n: list(mx.load(str(Path(spec["adapters"][n]["mlx"]) / "adapters.safetensors")).items())
               for n in names}
    optims = {n: optim.AdamW(learning_rate=g["learning_rate"], betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0)
              for n in names}
    value_and_grad = nn.value_and_grad(model, grpo_loss)
    batches, by_player = {}, _rows(spec)
    for n, rows in by_player.items():
        prompts = [r["prompt_ids"] for r in rows]
        batches[n] = dict(batch=(prompts, [[] for _ in rows], [""] * len(rows), [""] * len(rows), None),
                          completions=[mx.array(r["completion_ids"]) for r in rows],
                          completion_texts=[""] * len(rows), batch_indices=list(range(len(rows))),
                          advantages=mx.array([r["advantage"] for r in rows], dtype=mx.float32))
    tokens = sum(len(r["completion_ids"]) for rows in by_player.values() for r in rows)

    def step() -> dict:
        total, norms = 0.0, {}
        for n in names:
            model.update(tree_unflatten(weights[n]))
            (loss, _, _), grad = value_and_grad(
                model, ref_model=None, beta=0.0, epsilon=g["epsilon"], epsilon_high=g["epsilon_high"],
                grpo_loss_type="bnpo", importance_sampling_level="token", max_tokens=spec["new_tokens"],
                **batches[n])
            norm = mx.sqrt(sum(mx.sum(v * v) for _, v in tree_flatten(grad)))
            optims[n].update(model, grad)
            mx.eval(loss, norm, model.trainable_parameters(), optims[n].state)
            weights[n] = tree_flatten(model.trainable_parameters())
            total += loss.item()
            norms[n] = norm.item()
        return {"loss": total, "grad_norms": norms}

    def run(r: int):  # the same rows every round
        t0 = time.perf_counter()
        m = step()
        return {"seconds": time.perf_counter() - t0, "tokens": tokens, "loss": m["loss"]}

    first = step()  # the first step (also the warm-up) is compared with ours
    return run, {"first_loss": first["loss"], "first_grad_norms": first["grad_norms"],
                 "version": version("mlx-lm-lora"), "mlx_device": str(mx.default_device()),
                 "blas": spec.get("blas")}


SETUPS = {SIDE: setup_mlx_lm_lora_update}

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the protocol, without the package
    from peers_torch import serve

    serve(sys.argv[1], sys.argv[2], SETUPS)
