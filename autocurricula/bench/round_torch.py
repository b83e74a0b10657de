"""The torch + peft worker of ``autocurricula bench round``: the update of the assemble-it-yourself round.

Runs by path (``python -c "...runpy.run_path(this file)" SIDE SPEC``) so it imports nothing of
``autocurricula`` (whose BLAS preload slows torch about 2x, see ``peers_torch``). One peft model
holds every learner's adapter, trainable, with one ``torch.optim.AdamW`` per learner, kept across
rounds as a user's trainer keeps them. Its ``run`` (protocol: :func:`peers_torch.serve`) takes
``{"op": "update", "turns": [...], "out": folder}``: one GRPO step of every learner with turns
(:func:`peers_torch.grpo_step`: the loss, per-player clipping and AdamW of
``autocurricula.training``), then each learner's adapter saved as a peft folder ``out/<name>``
(``save_pretrained``), for vLLM to load. Answers ``{"step_s", "save_s", "loss", "adapters"}``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

SIDE = "torch_peft_round"


def setup_torch_peft_round(spec: dict):
    from peers_torch import _device, peft_model, _sync, _torch, grpo_rows, grpo_step

    torch = _torch()
    device = _device(spec)
    names = spec["learners"]
    model = peft_model({"model": spec["model"], "player_names": names,
                         "adapters": {n: {"peft": spec["adapters"][n]} for n in names}}, trainable=True, device=device)
    torch.set_num_threads(spec["torch_threads"])  # after _torch(), which sets every core; --torch-threads
    cfg = spec["grpo"]
    params = {n: [p for k, p in model.named_parameters() if f".{n}." in k and "lora_" in k] for n in names}
    optims = {n: torch.optim.AdamW(params[n], lr=cfg["learning_rate"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
              for n in names}

    def run(req: dict) -> dict:
        turns = req["turns"]
        present = [n for n in names if any(t["player"] == n for t in turns)]
        t0 = time.perf_counter()
        m = grpo_step(model, grpo_rows(turns, present, device), optims, params, cfg)
        _sync(device)
        t1 = time.perf_counter()
        model.save_pretrained(req["out"], selected_adapters=present)  # out/<name>: one peft folder each
        return {"step_s": t1 - t0, "save_s": time.perf_counter() - t1, "loss": m["loss"],
                "adapters": {n: str(Path(req["out"]) / n) for n in present}}

    return run, {"torch_device": device, "torch_threads": torch.get_num_threads()}


SETUPS = {SIDE: setup_torch_peft_round}

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers_torch, without the package
    from peers_torch import serve

    serve(sys.argv[1], sys.argv[2], SETUPS)
