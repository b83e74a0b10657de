"""Credit: from game outcomes to per-turn advantages. Each method is a :class:`Credit` whose constructor
is its config: GRPO and constant (:mod:`.grpo`), SPIRAL's RAE (:mod:`.rae`), tabular critics
(:mod:`.values`), branch rollouts (:mod:`.branch`), mirror descent (:mod:`.mirror`). Every method sees
rewards as a share of their seat's range (:mod:`.scale`), so none depends on a game's units. The trainer's
``credit`` option takes one or a name: :func:`make_credit` builds it, :func:`register_credit` adds a name."""

from autocurricula.credit.base import Credit, episodes, game_moves, rewards
from autocurricula.credit.branch import (BranchCredit, MoveScorer, branch_advantage, branch_value, check_replays,
                                         listed_moves, mirror_distribution, move_advantages, move_distribution,
                                         pick_positions, pool_values, state_key)
from autocurricula.credit.grpo import ConstantCredit, GRPOCredit, constant_advantages, grpo_advantages
from autocurricula.credit.mirror import MirrorCredit
from autocurricula.credit.rae import RAE, RAECredit
from autocurricula.credit.registry import CREDIT_METHODS, make_credit, register_credit
from autocurricula.credit.scale import RewardScale
from autocurricula.credit.values import QCredit, StateValues, ValueCredit

__all__ = ["branch_advantage", "branch_value", "BranchCredit", "check_replays",
           "constant_advantages", "ConstantCredit", "Credit", "CREDIT_METHODS", "episodes",
           "game_moves", "grpo_advantages", "GRPOCredit", "listed_moves", "make_credit",
           "mirror_distribution", "MirrorCredit", "move_advantages", "move_distribution", "MoveScorer",
           "pick_positions", "pool_values", "QCredit", "RAE", "RAECredit", "register_credit", "RewardScale", "rewards", "state_key",
           "StateValues", "ValueCredit"]
