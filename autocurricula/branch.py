"""Branch credit lives in :mod:`autocurricula.credit.branch`; its names answer here with a
DeprecationWarning that names the new place."""

from autocurricula._deprecation import moved

_NAMES = ("ADVANTAGES", "BranchCredit", "branch_advantage", "branch_value", "listed_moves", "move_advantages",
          "move_distribution", "pick_positions")

__getattr__ = moved("autocurricula.branch", {name: f"autocurricula.credit.branch:{name}" for name in _NAMES})
