"""The update's settings (``GRPOConfig``) and the LoRA spec. Field names follow trl's
``GRPOConfig`` and peft's ``LoraConfig``, so users can pass those objects directly
(``coerce_grpo_config`` / ``coerce_lora_spec``).

trl fields with no effect here: a ``trl.GRPOConfig`` (or a dict) may name ``num_generations``
(GRPO groups are formed by key, see ``autocurricula.credit``; a dataset game takes its own
``num_generations``), ``gradient_accumulation_steps`` (micro-batches
come from ``max_tokens_per_microbatch`` and are always accumulated into one step) and ``seed`` (the
league's ``AutocurriculumConfig.seed`` seeds everything); ``coerce_grpo_config`` ignores them, with
one exception: trl counts ``steps_per_generation`` in micro-steps, so a ``trl.GRPOConfig``'s is
divided by its ``gradient_accumulation_steps`` (a dict's counts optimizer steps, as ours does). A
trl config brings its ``lr_scheduler_type`` (trl's default is 'linear'); a learning-rate warm-up is
refused with an error."""

from __future__ import annotations

from dataclasses import dataclass, fields

from autocurricula.engine.adapters import LoraSpec
from autocurricula.records import help_field

__all__ = ["GRPOConfig", "LoraSpec", "coerce_grpo_config", "coerce_lora_spec", "help_field"]

_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
_LR_SCHEDULES = ("constant", "linear", "cosine", "warmup_stable_decay")
_TRL_IGNORED = ("num_generations", "gradient_accumulation_steps", "seed")  # see the module docstring
_TIS_SWITCH = "vllm_importance_sampling_correction"  # trl's switch of the cap: False means a cap of None


@dataclass
class GRPOConfig:
    """Policy-update settings, named as in ``trl.GRPOConfig`` (our own copy so trl is optional)."""

    learning_rate: float = help_field("AdamW learning rate of every player (per-player overrides via "
                                 "Updater.step(lr={player: lr})). trl's 1e-6 targets full fine-tuning; "
                                 "LoRA players usually want 1e-5..5e-4", 1e-4)
    lr_scheduler_type: str = help_field("learning-rate schedule over a trainer's epochs x rounds (transformers' "
                                   "names): 'constant', 'linear' or 'cosine', falling from learning_rate at the "
                                   "first round toward learning_rate * min_lr_ratio after the last, or "
                                   "'warmup_stable_decay' (constant, then a decay over the last lr_decay_ratio "
                                   "of the rounds); applied by the trainers (a bare Updater takes "
                                   "Updater.step(lr=...))", "constant")
    min_lr_ratio: float = help_field("floor of a decaying schedule, as a fraction of learning_rate", 0.0)
    lr_decay_ratio: float | None = help_field("'warmup_stable_decay' (transformers' WSD, without the warm-up): the share "
                                         "of the rounds, at the end of the run, over which the rate falls along a "
                                         "half cosine to learning_rate * min_lr_ratio; constant before. Required "
                                         "by that schedule, refused by the others", None)
    loss_type: str = help_field("'grpo' (mean over tokens per sequence, then over sequences; a credit's target "
                           "turns share the mean length of the target turns, so a move's weight does not "
                           "fall with its token count), 'bnpo' (mean over "
                           "the tokens of the batch), 'dr_grpo' (sum / (sequences * max_completion_length)), "
                           "'dapo' (sum / tokens of the whole generation batch; trl's default)", "dapo")
    epsilon: float = help_field("lower clip range: ratio >= 1 - epsilon", 0.2)
    epsilon_high: float | None = help_field("upper clip range: ratio <= 1 + epsilon_high (DAPO's clip-higher); "
                                       "None = epsilon", None)
    beta: float = help_field("KL coefficient to the base model (the same weights with the adapter off); 0 = no KL "
                        "term and no extra forward pass", 0.0)
    entropy_coef: float = help_field("entropy bonus per completion token (verl's entropy_coeff; not in trl): "
                                "keeps sampling moves the policy is giving up on; 0 = off", 0.0)
    importance_sampling_level: str = help_field("'token' (PPO/GRPO ratio per token) or 'sequence' (GSPO: one "
                                           "length-normalised ratio per sequence)", "token")
    scale_rewards: str = help_field("GRPO advantage scaling: 'group', 'batch' or 'none'", "group")
    max_completion_length: int = help_field("completion token limit; also dr_grpo's normaliser", 512)
    mask_truncated_completions: bool = help_field("drop completions cut by the token limit from the loss "
                                             "(their reward is not about their text)", False)
    temperature: float = help_field("sampling temperature; logprobs are computed at this temperature", 1.0)
    max_grad_norm: float | None = help_field("clip each player's gradient to this global norm (None/0 = off)", 1.0)
    weight_decay: float = help_field("AdamW decoupled weight decay", 0.0)
    adam_beta1: float = help_field("AdamW beta1", 0.9)
    adam_beta2: float = help_field("AdamW beta2", 0.999)
    adam_epsilon: float = help_field("AdamW epsilon", 1e-8)
    num_iterations: int = help_field("optimizer steps over the same turns per update (trl's num_iterations, GRPO's "
                                "mu); after the first, the clipped ratio against the sampler keeps them on-policy", 1)
    steps_per_generation: int = help_field("optimizer steps per update: each round's turns are split into this many "
                                      "slices, a player's games dealt round-robin so that a game stays in one "
                                      "slice, and each slice is one step (more steps per round at the same "
                                      "compute; the clipped ratio against the sampler covers the later slices). "
                                      "trl counts micro-steps: a trl.GRPOConfig gives steps_per_generation // "
                                      "gradient_accumulation_steps", 1)
    max_tokens_per_microbatch: int = help_field("padded tokens (rows x length) per forward/backward pass; bounds "
                                           "activation memory whatever the number of players (2048 measured fastest "
                                           "on a 2-core CPU; raise it on a GPU)", 2048)
    drop_zero_advantage: bool = help_field("skip turns whose advantage is exactly 0 (no gradient signal)", True)
    packing: str = help_field("how the update lays out its rows: 'tree' packs each player's rows as prefix trees, "
                              "so tokens shared by rows (a group's prompt, a conversation's earlier turns) are "
                              "computed once, with the same loss and gradients; 'rows' computes every row on its "
                              "own. Families that cannot be tree-packed exactly (recurrent layers, GPT-2) use "
                              "'rows' and say so", "tree")
    vllm_importance_sampling_cap: float | None = help_field(
        "turns sampled by vLLM (servers=['vllm+http://...']) are corrected for the sampler/learner mismatch with "
        "truncated importance sampling: each token's policy-gradient term times min(p_learner / p_vllm, cap), the "
        "PPO ratio then taken against the learner's own logprobs (Yao, Liu et al. 2025; trl's option of this "
        "name). None turns it off (a trl.GRPOConfig's vllm_importance_sampling_correction=False does too); "
        "turns our own engine sampled are never corrected", 2.0)

    def __post_init__(self):
        if self.loss_type not in _LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {_LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError("importance_sampling_level must be 'token' or 'sequence'")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError("scale_rewards must be 'group', 'batch' or 'none'")
        if self.lr_scheduler_type not in _LR_SCHEDULES:
            raise ValueError(f"lr_scheduler_type must be one of {_LR_SCHEDULES}, got {self.lr_scheduler_type!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (a fraction of learning_rate), got {self.min_lr_ratio}")
        if self.min_lr_ratio and self.lr_scheduler_type == "constant":
            raise ValueError("min_lr_ratio is the floor of a decaying schedule: set lr_scheduler_type='linear', "
                             "'cosine' or 'warmup_stable_decay', or leave min_lr_ratio at 0")
        wsd = self.lr_scheduler_type == "warmup_stable_decay"
        if wsd and not (isinstance(self.lr_decay_ratio, (int, float)) and not isinstance(self.lr_decay_ratio, bool)
                        and 0 < self.lr_decay_ratio <= 1):
            raise ValueError(f"lr_scheduler_type='warmup_stable_decay' needs lr_decay_ratio in (0, 1], the share of "
                             f"the rounds at the end over which the rate decays (e.g. 0.25), got {self.lr_decay_ratio!r}")
        if not wsd and self.lr_decay_ratio is not None:
            raise ValueError(f"lr_decay_ratio belongs to lr_scheduler_type='warmup_stable_decay', not "
                             f"{self.lr_scheduler_type!r}: set that schedule or leave lr_decay_ratio at None")
        if self.learning_rate < 0 or not self.epsilon > 0:
            raise ValueError("learning_rate must be >= 0 and epsilon > 0")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            raise ValueError("epsilon_high must be > 0 (or None to use epsilon)")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 for training (logprobs divide by it)")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0 (a bonus), got {self.entropy_coef}")
        if self.packing not in ("tree", "rows"):
            raise ValueError(f"packing must be 'tree' (shared prefixes computed once) or 'rows' (each row on its own), "
                             f"got {self.packing!r}")
        if self.max_tokens_per_microbatch <= 0 or self.max_completion_length <= 0:
            raise ValueError("max_tokens_per_microbatch and max_completion_length must be positive")
        if not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ValueError("num_iterations must be an integer >= 1")
        cap = self.vllm_importance_sampling_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 1
                                or cap == float("inf")):
            raise ValueError(f"vllm_importance_sampling_cap must be a finite number >= 1 (the largest weight of a "
                             f"token, e.g. 2.0; below 1 every token would be down-weighted) or None (no correction), "
                             f"got {cap!r}")
        if not isinstance(self.steps_per_generation, int) or isinstance(self.steps_per_generation, bool) \
                or self.steps_per_generation < 1:
            raise ValueError(f"steps_per_generation must be an integer >= 1 (optimizer steps per round), "
                             f"got {self.steps_per_generation!r}")

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def sampler_cap(self, sampled_by_vllm: bool) -> float | None:
        """The truncated importance-sampling cap to apply to turns sampled by vLLM
        (``sampled_by_vllm``), or None: no correction (our own engine's turns, or the correction off)."""
        cap = self.vllm_importance_sampling_cap
        return float(cap) if sampled_by_vllm and cap is not None else None


def coerce_grpo_config(cfg) -> GRPOConfig:
    """Our ``GRPOConfig`` from ``None``, ours, a ``trl.GRPOConfig`` or a dict with the same names
    (trl's fields without an effect here are ignored: see the module docstring)."""
    if cfg is None:
        return GRPOConfig()
    if isinstance(cfg, GRPOConfig):
        return cfg
    names = {f.name for f in fields(GRPOConfig)}
    if isinstance(cfg, dict):
        unknown = set(cfg) - names - set(_TRL_IGNORED) - {_TIS_SWITCH}
        if unknown:
            raise ValueError(f"unknown GRPO settings {sorted(unknown)}; known: {sorted(names)}")
        values = {k: v for k, v in cfg.items() if k in names}
        if cfg.get(_TIS_SWITCH, True) is False:
            values["vllm_importance_sampling_cap"] = None
        return GRPOConfig(**values)
    values = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    if getattr(cfg, _TIS_SWITCH, True) is False:
        values["vllm_importance_sampling_cap"] = None
    if values.get("steps_per_generation") is not None:  # trl counts micro-steps: optimizer steps = these / accumulation
        values["steps_per_generation"] = max(1, values["steps_per_generation"]
                                             // max(1, getattr(cfg, "gradient_accumulation_steps", 1) or 1))
    else:
        values.pop("steps_per_generation", None)
    if isinstance(values.get("scale_rewards"), bool):  # older trl used a bool
        values["scale_rewards"] = "group" if values["scale_rewards"] else "none"
    schedule = values.get("lr_scheduler_type")
    if schedule is not None:  # transformers' SchedulerType is a str enum
        values["lr_scheduler_type"] = str(getattr(schedule, "value", schedule))
        if values["lr_scheduler_type"] not in _LR_SCHEDULES:
            raise ValueError(f"lr_scheduler_type {values['lr_scheduler_type']!r} from {type(cfg).__name__} is not "
                             f"supported here; use one of {_LR_SCHEDULES}")
        if values["lr_scheduler_type"] == "warmup_stable_decay":
            raise ValueError(f"'warmup_stable_decay' from {type(cfg).__name__} cannot carry its decay share here: "
                             f"pass our GRPOConfig(lr_scheduler_type='warmup_stable_decay', lr_decay_ratio=...) "
                             f"instead (the share of the rounds at the end over which the rate decays)")
    if getattr(cfg, "lr_scheduler_kwargs", None):
        raise ValueError(f"{type(cfg).__name__}.lr_scheduler_kwargs is not supported here (schedules take no "
                         f"arguments but min_lr_ratio, and lr_decay_ratio for 'warmup_stable_decay', which "
                         f"count in rounds: pass our GRPOConfig for those); leave it empty")
    if getattr(cfg, "warmup_steps", 0) or getattr(cfg, "warmup_ratio", 0):
        raise ValueError(f"{type(cfg).__name__} asks for a learning-rate warm-up, which is not supported here; "
                         "set warmup_steps=0 (and warmup_ratio=0)")
    if values.get("loss_type") not in _LOSS_TYPES:
        raise ValueError(f"loss_type {values.get('loss_type')!r} from {type(cfg).__name__} is not supported here; "
                         f"use one of {_LOSS_TYPES}")
    return GRPOConfig(**values)


def coerce_lora_spec(cfg) -> LoraSpec:
    """``LoraSpec`` from ``None``, a ``LoraSpec``, a ``peft.LoraConfig`` or a dict with its names.

    Without ``target_modules`` (``None``, the default, as in peft) the targets are the model
    family's defaults, resolved against the model once it is loaded (``LoraSpec.resolve`` with its
    ``model_type``: ``c_attn`` for GPT-2, ``query_key_value`` for GPT-NeoX, ``qkv_proj`` for Phi-3,
    ``q_proj``/``v_proj`` for Llama-like families); given ``target_modules`` always win."""
    if cfg is None:
        return LoraSpec()
    if isinstance(cfg, LoraSpec):
        return cfg
    unsupported = []
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    kind = get("peft_type")
    kind = getattr(kind, "value", kind)  # peft's PeftType enum or its string
    if kind is not None and str(kind).upper() != "LORA":
        raise ValueError(f"lora_config is a {type(cfg).__name__} (peft_type {kind}); only LoRA is supported: pass a "
                         "peft.LoraConfig (r, lora_alpha, target_modules, use_rslora) or a LoraSpec")
    if get("use_dora"):
        unsupported.append("use_dora")
    if get("modules_to_save"):
        unsupported.append("modules_to_save")
    if get("bias", "none") != "none":
        unsupported.append(f"bias={get('bias')!r}")
    if get("rank_pattern") or get("alpha_pattern"):
        unsupported.append("rank_pattern/alpha_pattern")
    if unsupported:
        raise ValueError(f"unsupported LoraConfig settings: {', '.join(unsupported)} (plain LoRA only)")
    return LoraSpec.from_peft(cfg)
