"""Continue one exported player with trl's GRPOTrainer, under accelerate.

    accelerate launch --cpu --num_processes 1 examples/continue_with_trl.py

The bridge from a league to a torch cluster: autocurricula trains a short tic-tac-toe self-play
league (MLX, on the built-in tiny model after a supervised warm-up on legal moves) and exports one
player as a peft adapter with ``trainer.export``. transformers + peft load that adapter as
trainable, and trl's ``GRPOTrainer`` continues it on the game turned into a dataset: every prompt
is a position, and the reward scores the parsed move (+1 optimal, 0 legal, -1 illegal or none).
The greedy reward on held-out positions is printed before and after, and the continued adapter is
saved as a peft folder that ``PeftModel.from_pretrained`` (and ``autocurricula.publish.export.import_peft``)
load. On a GPU cluster, drop ``--cpu`` and set ``--num_processes``; the league and the export run
once, on the main process. About a minute on 2 CPU cores.
"""

import argparse
import random
from pathlib import Path

import autocurricula  # noqa: F401  (picks a fast BLAS before mlx loads)
from autocurricula import SelfPlayConfig, SelfPlayTrainer, build_tiny_model
from autocurricula.games import tictactoe
from autocurricula.training.warmup import sft_warmup


def score(reply: str, board: str, mark: str) -> float:
    """+1 for an optimal move, 0 for another legal one, -1 for an illegal reply or none."""
    move = tictactoe.parse_move(reply)
    if move is None or move not in tictactoe.legal_moves(board):
        return -1.0
    return 1.0 if move in tictactoe.optimal_moves(board, mark) else 0.0


def move_reward(prompts, completions, board, mark, **kwargs) -> list[float]:
    """trl reward function: the dataset's ``board`` and ``mark`` columns arrive as keyword lists."""
    return [score(c, b, m) for c, b, m in zip(completions, board, mark)]


def position_rows(n_train: int, n_eval: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Disjoint train and held-out positions, each a prompt plus what the reward needs."""
    positions = tictactoe.reachable_positions()
    random.Random(seed).shuffle(positions)
    rows = [{"prompt": tictactoe.render_prompt(b, m), "board": b, "mark": m} for b, m in positions]
    return rows[:n_train], rows[n_train:n_train + n_eval]


def export_league_player(out: Path, rounds: int) -> tuple[Path, Path]:
    """A warm tiny base and one self-play player trained on it, exported as peft."""
    base = build_tiny_model(out / "tiny-llama", hidden_size=64, num_layers=1, num_heads=8, intermediate_size=128)
    warm = sft_warmup(base, out / "tiny-llama-warm", tictactoe.warmup_examples(4000, seed=0), steps=150,
                      batch_size=32, learning_rate=3e-3)
    adapter = out / "league-player"
    if not (adapter / "adapter_config.json").is_file():
        trainer = SelfPlayTrainer(SelfPlayConfig(epochs=1, rounds=rounds, rules={"games_per_round": 16},
                                                 max_tokens=2, progress=False, output_dir=str(out / "league"),
                                                 overwrite_output_dir=True))
        trainer.train(str(warm), tictactoe.play)
        player = trainer.players[-1]["id"]
        trainer.export(player, adapter)
        trainer.engine.close()
        print(f"exported league player {player} to {adapter}")
    return warm, adapter


def greedy_reward(model, tokenizer, rows: list[dict]) -> float:
    """Mean reward of the greedy reply over ``rows``."""
    import torch

    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True).to(model.device)
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    replies = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(score(text, r["board"], r["mark"]) for text, r in zip(replies, rows)) / len(rows)


def main(output_dir: str = "runs/continue-with-trl", steps: int = 60, rounds: int = 2) -> Path:
    import torch
    import trl
    from accelerate import PartialState
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(output_dir)
    state = PartialState()
    with state.main_process_first():  # the league and its export run once; other processes reuse them
        warm, adapter = export_league_player(out, rounds)

    tokenizer = AutoTokenizer.from_pretrained(warm, padding_side="left")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32), str(adapter),
                                      is_trainable=True)
    train_rows, eval_rows = position_rows(n_train=512, n_eval=256)
    before = greedy_reward(model, tokenizer, eval_rows)

    args = trl.GRPOConfig(output_dir=str(out / "grpo"), max_steps=steps, per_device_train_batch_size=32,
                          num_generations=8, max_completion_length=2, temperature=1.0, learning_rate=3e-3,
                          bf16=state.device.type != "cpu", logging_steps=10, save_strategy="no", report_to="none",
                          seed=0)
    grpo = trl.GRPOTrainer(model=model, reward_funcs=move_reward, args=args, processing_class=tokenizer,
                           train_dataset=Dataset.from_list(train_rows))
    grpo.train()
    continued = out / "continued-player"
    grpo.save_model(str(continued))  # adapter_config.json + adapter_model.safetensors

    after = greedy_reward(grpo.model, tokenizer, eval_rows)
    if state.is_main_process:
        print(f"greedy reward on {len(eval_rows)} held-out positions: before {before:+.3f}  after {after:+.3f}")
        print(f"continued adapter saved to {continued}")
    return continued


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/continue-with-trl")
    parser.add_argument("--steps", type=int, default=60, help="GRPO optimizer steps")
    parser.add_argument("--rounds", type=int, default=2, help="self-play rounds before the export")
    cli = parser.parse_args()
    main(cli.output_dir, cli.steps, cli.rounds)
