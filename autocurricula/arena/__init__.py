"""Games played: the turn loop, game protocol, replay and per-game artifacts."""
