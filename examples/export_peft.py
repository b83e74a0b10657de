"""Train a player, export it as a peft adapter, and load it in transformers.

    python examples/export_peft.py

A short self-play run on the built-in tiny model, then `trainer.export(player, folder)`: the folder
is a plain peft LoRA checkpoint, so `PeftModel.from_pretrained` loads it and gives the same next-token
logits as the MLX engine that trained it.
"""

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import autocurricula  # noqa: F401  (picks a fast BLAS before mlx loads)
from autocurricula import SelfPlayConfig, SelfPlayTrainer, build_tiny_model
from autocurricula.games import highest_string

base = str(build_tiny_model("runs/export-peft/tiny-llama"))
trainer = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=2, rules={"games_per_round": 16}, max_tokens=4,
                                         progress=False, output_dir="runs/export-peft/run", overwrite_output_dir=True))
trainer.train(base, highest_string.play)
player = trainer.players[0]["id"]
folder = trainer.export(player, "runs/export-peft/adapter")  # format="mlx" for mlx_lm.load(adapter_path=...)
print("exported", player, "to", folder, sorted(p.name for p in folder.iterdir()))

tokenizer = AutoTokenizer.from_pretrained(base)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), str(folder))
ids = tokenizer("Say a digit:")["input_ids"]
with torch.no_grad():
    peft_logits = model(torch.tensor([ids])).logits[0].numpy()
diff = np.abs(peft_logits - trainer.engine.logits(ids, player)).max()
print(f"transformers + peft vs the MLX engine: max |logit diff| = {diff:.1e}")
trainer.engine.close()
