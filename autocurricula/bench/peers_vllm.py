"""The vLLM side of ``autocurricula bench peers``: vLLM offline with multi-LoRA on the same turns.

Runs in vLLM's own virtual environment (``--vllm-python``), by path, so it imports nothing of
``autocurricula`` (which that environment need not have); the worker protocol is
:func:`peers_torch.serve`. One ``vllm.LLM(model, enable_lora=True)`` holds every player's
``export_peft`` adapter (``max_loras`` = players); each run is one ``LLM.generate`` over the
round's turns with one ``LoRARequest`` per turn: temperature 1, exactly ``new_tokens`` tokens
(``ignore_eos``), token ids in and out (no tokenizer), prefix caching on, float32.

When ready it also reports its greedy tokens of the warm-up turns, with each turn's adapter and
with none, for the parent to compare with the engine's. vLLM's CPU backend binds its OpenMP
threads itself (``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_NUM_OF_RESERVED_CPU``): the ready line
names the settings in force and torch's thread count, and the parent measures the cores used.

On the multi-turn workload (``spec["workload"] == "multiturn"``, see ``peers_multiturn``) a run is
one greedy ``LLM.generate`` per turn level, and the outputs' ``num_cached_tokens`` are its
prefix-cache hits. ``AUTOCURRICULA_VLLM_BLOCK_SIZE`` sets vLLM's KV block size (its CPU default
is 128 tokens; prefixes are reused in whole blocks).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

SIDE = "vllm"
IMPORT = "vllm"  # what the named python must import for this side to run
CPU_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
           "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")
BLOCK_ENV = "AUTOCURRICULA_VLLM_BLOCK_SIZE"


def _greedy(llm, prompts, requests, n_new) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True, detokenize=False)
    outs = llm.generate(prompts, params, lora_request=requests, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _llm(spec: dict, longest: int):
    """One ``vllm.LLM`` holding every player's adapter, and each player's ``LoRARequest``.
    ``AUTOCURRICULA_VLLM_BLOCK_SIZE`` sets its KV block size (default: vLLM's own)."""
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    names = spec["player_names"]
    block = {"block_size": int(os.environ[BLOCK_ENV])} if os.environ.get(BLOCK_ENV) else {}
    llm = LLM(model=spec["model"], enable_lora=True, max_loras=len(names), max_lora_rank=spec["rank"],
              dtype="float32", skip_tokenizer_init=True, enable_prefix_caching=True, seed=0,
              max_model_len=max(64, longest), max_num_seqs=max(256, len(spec["order"])), **block)
    return llm, {n: LoRARequest(n, i + 1, spec["adapters"][n]["peft"]) for i, n in enumerate(names)}


def _ready_info(llm) -> dict:
    import torch
    import vllm

    return {"version": vllm.__version__, "torch_threads": torch.get_num_threads(),
            "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
            "env": {k: os.environ.get(k) for k in CPU_ENV + (BLOCK_ENV,)}}


def setup_vllm_multiturn(spec: dict):
    """vLLM on the multi-turn workload: one greedy ``LLM.generate`` per turn level, one
    ``LoRARequest`` per row; its prefix-cache hits are the outputs' ``num_cached_tokens``."""
    from vllm import SamplingParams

    from peers_multiturn import play  # by path, as __main__ puts this folder on sys.path

    llm, lora = _llm(spec, spec["max_len"])
    greedy = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True, detokenize=False)

    def generate(prompts, players):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy,
                            lora_request=[lora[n] for n in players], use_tqdm=False)
        cached = [o.num_cached_tokens for o in outs]
        return [list(o.outputs[0].token_ids) for o in outs], None if None in cached else sum(cached)

    def run(r: int):
        return play(spec["conversations"][r], generate)

    run(0)  # warm-up: loads every adapter
    return run, _ready_info(llm)


def setup_vllm(spec: dict):
    from vllm import SamplingParams

    if spec.get("workload") == "multiturn":
        return setup_vllm_multiturn(spec)
    names, n_new = spec["player_names"], spec["new_tokens"]
    llm, lora = _llm(spec, max(len(p) for rnd in spec["round_prompts"] for p in rnd) + n_new)
    requests = [lora[o] for o in spec["order"]]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=n_new, ignore_eos=True,
                              detokenize=False)

    def run(r: int):
        prompts = [{"prompt_token_ids": p} for p in spec["round_prompts"][r]]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sampling, lora_request=requests, use_tqdm=False)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}

    run(0)  # warm-up: loads every adapter
    warm = [{"prompt_token_ids": p} for p in spec["round_prompts"][0]]
    greedy = {"lora": _greedy(llm, warm, requests, n_new), "base": _greedy(llm, warm, None, n_new)}
    return run, {"greedy": greedy, **_ready_info(llm)}


SETUPS = {SIDE: setup_vllm}

if __name__ == "__main__":  # vLLM's engine core starts by spawn: only this block must not rerun in it
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the protocol, without the package
    from peers_torch import serve

    serve(sys.argv[1], sys.argv[2], SETUPS)
