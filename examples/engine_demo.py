"""The engine alone, offline on the built-in tiny model: many LoRA players in shared batches.

Builds the tiny model, loads 8 LoRA players into a 4-slot engine (so LRU eviction happens),
decodes 32 requests of all players in shared batches, hot-swaps one player mid-generation and
prints what happened. Last line: one JSON object with the figures.
"""

import json
import threading
import time
from pathlib import Path

import autocurricula  # noqa: F401  (fast BLAS before mlx)
from autocurricula import build_tiny_model
from autocurricula.engine import AdapterWeights, Engine, EngineConfig, LoraSpec, SamplingParams

model_path = build_tiny_model(Path.home() / ".cache" / "autocurricula" / "tiny-llama")
engine = Engine(str(model_path), config=EngineConfig(max_slots=4, max_batch=32))
spec = LoraSpec(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
dims = {p: engine.linear_dims[p] for p in spec.resolve(engine.linear_dims)}
for i in range(8):
    engine.load_adapter(f"player-{i}", AdapterWeights.random(dims, spec, seed=i, b_std=0.3))

t0 = time.perf_counter()
futures = [engine.submit(f"Game {i}: X plays", f"player-{i % 8}", SamplingParams(max_tokens=24, temperature=0.8, seed=i))
           for i in range(32)]
# hot-swap player-0 while its rows are decoding: the next step uses the new weights
swap = threading.Timer(0.05, engine.update_adapter, ("player-0", AdapterWeights.random(dims, spec, seed=99, b_std=0.3)))
swap.start()
results = [f.result() for f in futures]
swap.join()
elapsed = time.perf_counter() - t0

for c in results[:8]:
    print(f"{c.player:<9} v{c.adapter_version} {c.finish_reason:<6} {c.text[:50]!r}")
tokens = sum(len(c.token_ids) for c in results)
summary = {"requests": len(results), "players": 8, "slots": 4, "tokens": tokens, "tok_s": round(tokens / elapsed, 1),
           "evictions": engine.slots.evictions, "swapped_mid_completion": sum(c.swapped for c in results),
           "player0_version": engine.adapter_info("player-0")["version"], "occupancy": round(engine.occupancy, 3),
           "blas": autocurricula.engine.blas.describe()}
engine.close()
print(json.dumps(summary))
