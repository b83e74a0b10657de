"""The vLLM worker of ``autocurricula bench round``: the rollouts of the assemble-it-yourself round.

Runs in vLLM's own virtual environment (``--vllm-python``), by path, so it imports nothing of
``autocurricula``; the worker protocol is :func:`peers_torch.serve`, whose ``run`` receives each
request's ``round`` field, here a dict:

- ``{"op": "generate", "prompts": [[ids]], "adapters": [name or None], "params": [[temperature,
  top_p, top_k, max_tokens]]}``: one ``LLM.generate`` over one lockstep tick of the games, one
  ``LoRARequest`` per row, exactly ``max_tokens`` tokens (``ignore_eos``) with the sampled
  token's logprob; answers ``{"seconds", "tokens", "logprobs"}``;
- ``{"op": "load", "adapters": {name: peft folder}}``: the round's new adapters, each as a new
  ``LoRARequest`` (new id and path) added to the engine at once, the old one removed; answers
  ``{"seconds"}``.

One ``vllm.LLM(model, enable_lora=True)`` holds the learners' adapters (``max_loras`` = learners),
float32, prefix caching on, token ids in and out (no tokenizer). The ready line names vLLM's
version, torch's thread count and the CPU settings in force.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

SIDE = "vllm_round"
IMPORT = "vllm"
CPU_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
           "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")


def setup_vllm_round(spec: dict):
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    names = spec["learners"]
    llm = LLM(model=spec["model"], enable_lora=True, max_loras=len(names), max_lora_rank=spec["rank"],
              dtype="float32", skip_tokenizer_init=True, enable_prefix_caching=True, seed=spec["seed"],
              max_model_len=spec["max_model_len"], max_num_seqs=spec["max_num_seqs"])
    ids = itertools.count(1)
    lora = {n: LoRARequest(n, next(ids), spec["adapters"][n]) for n in names}
    params: dict[tuple, SamplingParams] = {}

    def sampling(p) -> SamplingParams:
        key = tuple(p)
        if key not in params:
            temperature, top_p, top_k, max_tokens = key
            params[key] = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                                         ignore_eos=True, logprobs=0, detokenize=False)
        return params[key]

    def generate(req: dict) -> dict:
        prompts = [{"prompt_token_ids": p} for p in req["prompts"]]
        requests = [lora[a] if a is not None else None for a in req["adapters"]]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, [sampling(p) for p in req["params"]], lora_request=requests, use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        logprobs = [[float(lp[t].logprob) for t, lp in zip(tok, o.outputs[0].logprobs)] for tok, o in zip(tokens, outs)]
        return {"seconds": dt, "tokens": tokens, "logprobs": logprobs}

    def load(req: dict) -> dict:
        t0 = time.perf_counter()
        for name, path in req["adapters"].items():
            new = LoRARequest(f"{name}@{path}", next(ids), path)
            llm.llm_engine.add_lora(new)  # loads the weights now, not at the next generate
            llm.llm_engine.remove_lora(lora[name].lora_int_id)
            lora[name] = new
        return {"seconds": time.perf_counter() - t0}

    def run(req: dict) -> dict:
        return {"generate": generate, "load": load}[req["op"]](req)

    warm = spec["warmup"]  # one row per learner: every adapter loaded before the first round
    generate({"prompts": [warm] * len(names), "adapters": names, "params": [[1.0, 1.0, 0, 2]] * len(names)})
    return run, {"version": vllm.__version__, "torch_threads": torch.get_num_threads(),
                 "env": {k: os.environ.get(k) for k in CPU_ENV}}


SETUPS = {SIDE: setup_vllm_round}

if __name__ == "__main__":  # vLLM's engine core starts by spawn: only this block must not rerun in it
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the protocol, without the package
    from peers_torch import serve

    serve(sys.argv[1], sys.argv[2], SETUPS)
