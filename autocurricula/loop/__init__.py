"""The league loop: the trainer, its config, pool, ratings, rounds and checkpoints."""
