"""Games for autocurricula: one module per game, each exports ``play(players, model, tokenizer)``."""
