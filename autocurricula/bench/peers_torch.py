"""The torch + peft sides of ``autocurricula bench peers``, and the worker protocol all sides share.

This module imports nothing of ``autocurricula``: ``import autocurricula`` preloads OpenBLAS with
``RTLD_GLOBAL``, which serves torch's BLAS calls too and slows torch about 2x. A torch worker runs
this file by path (``python -c "...runpy.run_path(this file)" SIDE SPEC``), so the package's
``__init__`` never runs in it. Sides:

- ``peft_mixed``: one ``generate(..., adapter_names=[player of each row])`` over all turns (peft's
  mixed-adapter batch inference);
- ``peft_set_adapter``: ``set_adapter(player)`` then one ``generate`` over that player's turns;
- ``torch_peft_update``: one GRPO step of every player (``set_adapter``, forward, backward, per-player
  gradient clipping and ``torch.optim.AdamW``), the same clipped loss as ``autocurricula.training``.

The sides run on ``resolve_device(spec["torch_device"], spec["mlx_gpu"], ...)``: by default the
torch counterpart of the device MLX runs on (CPU with MLX's CPU backend; CUDA or MPS with its GPU
backend), so both frameworks get the same kind of hardware. Timed runs synchronize the device. On
CUDA the float32 matmuls run as TF32 (``torch.set_float32_matmul_precision("high")``), as MLX's
CUDA backend runs them.

Protocol: the worker prints one JSON line on its original stdout when ready (after loading and a
warm-up on ``round_prompts[0]``), then answers each ``{"cmd": "run", "round": k}`` line on stdin
with one JSON line (``seconds``, ``tokens``) of a run over ``round_prompts[k]``, and exits on
``{"cmd": "quit"}``. Library output goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def serve(side: str, spec_path: str, setups: dict) -> None:
    """Run one worker: ``setups[side](spec)`` returns ``(run, ready_info)``; answer run commands."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stdout carries only protocol lines; prints of libraries land in the log

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        spec = json.loads(Path(spec_path).read_text())
        run, info = setups[side](spec)
        send({"ready": True, "autocurricula_imported": "autocurricula" in sys.modules, **info})
        for line in sys.stdin:
            if not line.strip():
                continue
            msg = json.loads(line)
            if msg.get("cmd") == "quit":
                break
            send(run(msg.get("round", 1)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        raise


# ---------------------------------------------------------------- torch sides
TORCH_DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(requested: str, mlx_gpu: bool, cuda: bool, mps: bool) -> str:
    """The torch device of the torch sides. ``auto``: ``cpu`` when MLX runs on its CPU backend,
    else the GPU torch sees (``cuda``, then ``mps``), else ``cpu``. A named device must exist."""
    if requested not in TORCH_DEVICES:
        raise ValueError(f"unknown torch device {requested!r}; choose one of {TORCH_DEVICES}")
    if requested == "auto":
        return "cuda" if mlx_gpu and cuda else "mps" if mlx_gpu and mps else "cpu"
    if (requested == "cuda" and not cuda) or (requested == "mps" and not mps):
        raise RuntimeError(f"--torch-device {requested}: torch sees no such device")
    return requested


def _torch():
    import torch

    torch.set_num_threads(os.cpu_count() or 1)  # every core, as the MLX sides use
    return torch


def _device(spec: dict) -> str:
    torch = _torch()
    mps = getattr(torch.backends, "mps", None)
    device = resolve_device(spec.get("torch_device", "cpu"), spec.get("mlx_gpu", False), torch.cuda.is_available(),
                            bool(mps and mps.is_available()))
    if device == "cuda":  # TF32 matmuls, as MLX's CUDA backend runs float32 matmuls
        torch.set_float32_matmul_precision("high")
    return device


def _sync(device: str) -> None:
    """Wait for the device's queued work, so a timed run ends when its last kernel does."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def peft_model(spec: dict, trainable: bool, device: str = "cpu"):
    torch = _torch()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).to(device)
    names = spec["player_names"]
    model = PeftModel.from_pretrained(base, spec["adapters"][names[0]]["peft"], adapter_name=names[0],
                                      is_trainable=trainable)
    for n in names[1:]:
        model.load_adapter(spec["adapters"][n]["peft"], adapter_name=n, is_trainable=trainable)
    model.to(device)  # the adapters' weights too
    if trainable:
        return model
    # no eos: exactly max_new_tokens per row, as the engine's ignore_eos (no min-length logits processor)
    model.get_base_model().generation_config.eos_token_id = None
    return model.eval()


def _generate(model, prompts, n_new, device: str = "cpu", **kw) -> int:
    import torch

    ids = torch.tensor(prompts, dtype=torch.long, device=device)  # equal-length prompts: no padding needed
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=n_new, pad_token_id=0, **kw)
    _sync(device)
    return int((out.shape[1] - ids.shape[1]) * ids.shape[0])


def _multiturn():
    """:mod:`peers_multiturn`, loaded by path (this worker does not import the package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import peers_multiturn

    return peers_multiturn


def setup_peft_mixed_multiturn(spec: dict):
    """peft's mixed-adapter ``generate`` on the multi-turn workload: one greedy ``generate`` per turn
    level (the level's prompts have one length); no prefix cache across calls."""
    import torch

    device = _device(spec)
    model = peft_model(spec, trainable=False, device=device)
    play = _multiturn().play

    def generate(prompts, players):
        ids = torch.tensor(prompts, dtype=torch.long, device=device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=spec["new_tokens"], pad_token_id=0, adapter_names=players)
        _sync(device)
        return out[:, ids.shape[1]:].tolist(), None

    def run(r: int):
        return play(spec["conversations"][r], generate)

    run(0)  # warm-up
    return run, {"torch_device": device}


def setup_peft_mixed(spec: dict):
    if spec.get("workload") == "multiturn":
        return setup_peft_mixed_multiturn(spec)
    device = _device(spec)
    model = peft_model(spec, trainable=False, device=device)
    order, n_new = spec["order"], spec["new_tokens"]

    def run(r: int, k: int | None = None):
        prompts = spec["round_prompts"][r][:k]
        t0 = time.perf_counter()
        tokens = _generate(model, prompts, n_new, device, adapter_names=order[: len(prompts)])
        return {"seconds": time.perf_counter() - t0, "tokens": tokens}

    run(0, 8)  # warm-up
    return run, {"torch_device": device}


def setup_peft_set_adapter(spec: dict):
    device = _device(spec)
    model = peft_model(spec, trainable=False, device=device)
    order, n_new = spec["order"], spec["new_tokens"]

    def run(r: int, players=spec["player_names"]):
        by_player = {n: [p for p, o in zip(spec["round_prompts"][r], order) if o == n] for n in players}
        t0, tokens = time.perf_counter(), 0
        for n in players:
            model.set_adapter(n)
            tokens += _generate(model, by_player[n], n_new, device)
        return {"seconds": time.perf_counter() - t0, "tokens": tokens}

    run(0, spec["player_names"][:1])  # warm-up
    return run, {"torch_device": device}


def grpo_rows(turns: list[dict], names: list[str], device: str = "cpu") -> dict:
    """Per player: tensors of its rows (``ids`` without the last token, left-padded, with their
    attention mask and positions; targets, sampler logprobs and a mask over the last ``T`` columns,
    ``T`` the longest completion; advantages) on ``device``. Left padding puts every completion
    at the end of its row, so ``logits_to_keep=T`` reads them all."""
    import torch

    out = {}
    for n in names:
        mine = [t for t in turns if t["player"] == n]
        width = max(len(t["prompt_ids"]) + len(t["completion_ids"]) - 1 for t in mine)
        t_max = max(len(t["completion_ids"]) for t in mine)
        ids = torch.zeros((len(mine), width), dtype=torch.long)
        attn = torch.zeros((len(mine), width), dtype=torch.long)
        tgt = torch.zeros((len(mine), t_max), dtype=torch.long)
        old = torch.zeros((len(mine), t_max), dtype=torch.float32)
        mask = torch.zeros((len(mine), t_max), dtype=torch.float32)
        for i, t in enumerate(mine):
            row = (t["prompt_ids"] + t["completion_ids"])[:-1]
            c = len(t["completion_ids"])
            ids[i, width - len(row):] = torch.tensor(row)
            attn[i, width - len(row):] = 1
            tgt[i, t_max - c:] = torch.tensor(t["completion_ids"])
            old[i, t_max - c:] = torch.tensor(t["logprobs"])
            mask[i, t_max - c:] = 1
        rows = {"ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "tgt": tgt,
                "old": old, "mask": mask, "adv": torch.tensor([t["advantage"] for t in mine], dtype=torch.float32)}
        out[n] = {k: v.to(device) for k, v in rows.items()}
    return out


def grpo_step(model, rows: dict, optims: dict, params: dict, cfg: dict) -> dict:
    """One GRPO step of every player, one player at a time (peft trains one active adapter).

    Per token ``-min(r A, clip(r, 1 - eps, 1 + eps_high) A)`` with ``r = exp(logp - old)``,
    averaged over the player's completion tokens (trl's 'dapo' / 'bnpo' for one batch); returns
    the loss summed over players and each player's gradient norm before clipping."""
    import torch

    total, norms = 0.0, {}
    for n, b in rows.items():
        model.set_adapter(n)  # peft: only this adapter's weights require grad
        t = b["tgt"].shape[1]
        logits = model(input_ids=b["ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                       logits_to_keep=t).logits.float() / cfg["temperature"]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, b["tgt"][..., None])[..., 0]
        ratio = torch.exp(logp - b["old"])
        adv = b["adv"][:, None]
        per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - cfg["epsilon"], 1 + cfg["epsilon_high"]) * adv)
        loss = (per_token * b["mask"]).sum() / b["mask"].sum()
        optims[n].zero_grad(set_to_none=True)
        loss.backward()
        norms[n] = float(torch.nn.utils.clip_grad_norm_(params[n], cfg["max_grad_norm"]))
        optims[n].step()
        total += float(loss.detach())
    return {"loss": total, "grad_norms": norms}


def setup_torch_peft_update(spec: dict):
    torch = _torch()
    device = _device(spec)
    if spec.get("torch_threads"):  # fewer threads than cores: fair on a shared machine (docs/benchmarks.md)
        torch.set_num_threads(spec["torch_threads"])
    model = peft_model(spec, trainable=True, device=device)
    cfg, names = spec["grpo"], spec["player_names"]
    turns = json.loads(Path(spec["turns"]).read_text())
    rows = grpo_rows(turns, names, device)
    params = {n: [p for k, p in model.named_parameters() if f".{n}." in k and "lora_" in k] for n in names}
    optims = {n: torch.optim.AdamW(params[n], lr=cfg["learning_rate"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
              for n in names}
    tokens = sum(int(b["mask"].sum()) for b in rows.values())

    def run(r: int):  # the same rows every round
        t0 = time.perf_counter()
        m = grpo_step(model, rows, optims, params, cfg)
        _sync(device)  # the last optimizer step too
        return {"seconds": time.perf_counter() - t0, "tokens": tokens, "loss": m["loss"]}

    first = grpo_step(model, rows, optims, params, cfg)  # the first step (also the warm-up) is compared
    return run, {"first_loss": first["loss"], "first_grad_norms": first["grad_norms"], "torch_device": device}


SETUPS = {"peft_mixed": setup_peft_mixed, "peft_set_adapter": setup_peft_set_adapter,
          "torch_peft_update": setup_torch_peft_update}

if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], SETUPS)
