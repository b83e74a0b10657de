"""League schedules for autocurricula: one module per schedule (entry/match rules)."""
