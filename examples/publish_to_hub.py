"""Publish a trained league to the Hugging Face Hub: every player as a peft adapter with its card.

    HF_TOKEN=hf_... python examples/publish_to_hub.py me/ttt-league

Trains a short self-play league on the built-in tiny model, then `trainer.push_to_hub(repo_id)`
uploads, in one commit: a folder per player (adapter_config.json, adapter_model.safetensors and a
model card with role, parent, Elo and games), the league card (leaderboard, payoff matrix, lineage,
config), the match history and the plots. Needs the network and a token with write access.
"""

import sys

import autocurricula  # noqa: F401  (picks a fast BLAS before mlx loads)
from autocurricula import SelfPlayConfig, SelfPlayTrainer, build_tiny_model
from autocurricula.games import highest_string


def main(repo_id: str, output_dir: str = "runs/publish", **hub_kwargs) -> str:
    base = str(build_tiny_model(f"{output_dir}/tiny-llama"))
    trainer = SelfPlayTrainer(SelfPlayConfig(epochs=2, rounds=1, rules={"games_per_round": 8}, max_tokens=4,
                                             progress=False, output_dir=f"{output_dir}/run", overwrite_output_dir=True))
    trainer.train(base, highest_string.play)
    print(trainer.leaderboard)
    url = trainer.push_to_hub(repo_id, private=True, **hub_kwargs)  # token=, endpoint=, revision= as in huggingface_hub
    print("pushed", len(trainer.players), "players to", url)
    trainer.engine.close()
    return url


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/publish_to_hub.py OWNER/REPO   (with HF_TOKEN set)")
    main(sys.argv[1])
