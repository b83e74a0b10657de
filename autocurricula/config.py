"""Configuration dataclasses. Field names follow trl's ``GRPOConfig`` and peft's ``LoraConfig`` so
users can pass those objects directly (``coerce_grpo_config`` / ``LoraSpec.from_peft``).

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

import math
from dataclasses import dataclass, field, fields

from autocurricula.credit import CREDIT_METHODS
from autocurricula.engine.adapters import LoraSpec

__all__ = ["GRPOConfig", "LoraSpec", "coerce_grpo_config", "coerce_lora_spec"]

_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
_LR_SCHEDULES = ("constant", "linear", "cosine", "warmup_stable_decay")
_TRL_IGNORED = ("num_generations", "gradient_accumulation_steps", "seed")  # see the module docstring


def _help(text: str, default):
    return field(default=default, metadata={"help": text})


@dataclass
class GRPOConfig:
    """Policy-update settings, named as in ``trl.GRPOConfig`` (our own copy so trl is optional)."""

    learning_rate: float = _help("AdamW learning rate of every player (per-player overrides via "
                                 "Updater.step(lr={player: lr})). trl's 1e-6 targets full fine-tuning; "
                                 "LoRA players usually want 1e-5..5e-4", 1e-4)
    lr_scheduler_type: str = _help("learning-rate schedule over a trainer's epochs x rounds (transformers' "
                                   "names): 'constant', 'linear' or 'cosine', falling from learning_rate at the "
                                   "first round toward learning_rate * min_lr_ratio after the last, or "
                                   "'warmup_stable_decay' (constant, then a decay over the last lr_decay_ratio "
                                   "of the rounds); applied by the trainers (a bare Updater takes "
                                   "Updater.step(lr=...))", "constant")
    min_lr_ratio: float = _help("floor of a decaying schedule, as a fraction of learning_rate", 0.0)
    lr_decay_ratio: float | None = _help("'warmup_stable_decay' (transformers' WSD, without the warm-up): the share "
                                         "of the rounds, at the end of the run, over which the rate falls along a "
                                         "half cosine to learning_rate * min_lr_ratio; constant before. Required "
                                         "by that schedule, refused by the others", None)
    loss_type: str = _help("'grpo' (mean over tokens per sequence, then over sequences), 'bnpo' (mean over "
                           "the tokens of the batch), 'dr_grpo' (sum / (sequences * max_completion_length)), "
                           "'dapo' (sum / tokens of the whole generation batch; trl's default)", "dapo")
    epsilon: float = _help("lower clip range: ratio >= 1 - epsilon", 0.2)
    epsilon_high: float | None = _help("upper clip range: ratio <= 1 + epsilon_high (DAPO's clip-higher); "
                                       "None = epsilon", None)
    beta: float = _help("KL coefficient to the base model (the same weights with the adapter off); 0 = no KL "
                        "term and no extra forward pass", 0.0)
    entropy_coef: float = _help("entropy bonus per completion token (verl's entropy_coeff; not in trl): "
                                "keeps sampling moves the policy is giving up on; 0 = off", 0.0)
    importance_sampling_level: str = _help("'token' (PPO/GRPO ratio per token) or 'sequence' (GSPO: one "
                                           "length-normalised ratio per sequence)", "token")
    scale_rewards: str = _help("GRPO advantage scaling: 'group', 'batch' or 'none'", "group")
    max_completion_length: int = _help("completion token limit; also dr_grpo's normaliser", 512)
    mask_truncated_completions: bool = _help("drop completions cut by the token limit from the loss "
                                             "(their reward is not about their text)", False)
    temperature: float = _help("sampling temperature; logprobs are computed at this temperature", 1.0)
    max_grad_norm: float | None = _help("clip each player's gradient to this global norm (None/0 = off)", 1.0)
    weight_decay: float = _help("AdamW decoupled weight decay", 0.0)
    adam_beta1: float = _help("AdamW beta1", 0.9)
    adam_beta2: float = _help("AdamW beta2", 0.999)
    adam_epsilon: float = _help("AdamW epsilon", 1e-8)
    num_iterations: int = _help("optimizer steps over the same turns per update (trl's num_iterations, GRPO's "
                                "mu); after the first, the clipped ratio against the sampler keeps them on-policy", 1)
    steps_per_generation: int = _help("optimizer steps per update: each round's turns are split into this many "
                                      "slices, a player's games dealt round-robin so that a game stays in one "
                                      "slice, and each slice is one step (more steps per round at the same "
                                      "compute; the clipped ratio against the sampler covers the later slices). "
                                      "trl counts micro-steps: a trl.GRPOConfig gives steps_per_generation // "
                                      "gradient_accumulation_steps", 1)
    max_tokens_per_microbatch: int = _help("padded tokens (rows x length) per forward/backward pass; bounds "
                                           "activation memory whatever the number of players (2048 measured fastest "
                                           "on a 2-core CPU; raise it on a GPU)", 2048)
    drop_zero_advantage: bool = _help("skip turns whose advantage is exactly 0 (no gradient signal)", True)

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
        if self.max_tokens_per_microbatch <= 0 or self.max_completion_length <= 0:
            raise ValueError("max_tokens_per_microbatch and max_completion_length must be positive")
        if not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ValueError("num_iterations must be an integer >= 1")
        if not isinstance(self.steps_per_generation, int) or isinstance(self.steps_per_generation, bool) \
                or self.steps_per_generation < 1:
            raise ValueError(f"steps_per_generation must be an integer >= 1 (optimizer steps per round), "
                             f"got {self.steps_per_generation!r}")

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def coerce_grpo_config(cfg) -> GRPOConfig:
    """Our ``GRPOConfig`` from ``None``, ours, a ``trl.GRPOConfig`` or a dict with the same names
    (trl's fields without an effect here are ignored: see the module docstring)."""
    if cfg is None:
        return GRPOConfig()
    if isinstance(cfg, GRPOConfig):
        return cfg
    names = {f.name for f in fields(GRPOConfig)}
    if isinstance(cfg, dict):
        unknown = set(cfg) - names - set(_TRL_IGNORED)
        if unknown:
            raise ValueError(f"unknown GRPO settings {sorted(unknown)}; known: {sorted(names)}")
        return GRPOConfig(**{k: v for k, v in cfg.items() if k in names})
    values = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
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
    """``LoraSpec`` from ``None``, a ``LoraSpec``, a ``peft.LoraConfig`` or a dict with its names."""
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


@dataclass
class AutocurriculumConfig:
    """The league loop's settings. ``epochs``, ``rounds`` and ``matches`` keep the original
    autocurricula meaning; the rest use ``transformers.TrainingArguments`` names where they overlap."""

    epochs: int = _help("epochs; entry() adds players at the start of each", 4)
    rounds: int = _help("rounds per epoch; each round plays match()'s games, then updates every learner once", 2)
    matches: int = _help("games played per tuple that match() returns, per round", 1)
    output_dir: str = _help("checkpoints, plots, match history and logs go here", "autocurricula-output")
    seed: int = _help("seed of schedules, seats, sampling and adapter init", 42)
    logging_steps: int = _help("log metrics every this many rounds", 1)
    save_strategy: str = _help("'epoch' (a checkpoint after every epoch) or 'no'", "epoch")
    save_total_limit: int | None = _help("keep at most this many checkpoints (oldest deleted); None = all", 2)
    report_to: list[str] | str = _help("'none', 'wandb', 'trackio' or a list of them", "none")
    run_name: str | None = _help("run name for trackers", None)
    push_to_hub: bool = _help("push every player and the league card at the end of train()", False)
    hub_model_id: str | None = _help("repo id for push_to_hub", None)
    hub_private_repo: bool = _help("create the Hub repo as private", False)
    credit: str = _help("'rae' (SPIRAL role baselines), 'value' (per-move credit from a per-state value "
                        "table; for games whose states repeat), 'q' ('value' plus a (state, move) table: "
                        "A = Q - V), 'branch' (per-move credit from branch rollouts: A = G - V(s), V the mean "
                        "return of branch_samples replays of the game from s; no table, any replayable game), "
                        "'grpo' (group-normalised), 'constant', or a name given to "
                        "autocurricula.credit.register_credit", "rae")
    rae_alpha: float = _help("RAE baseline EMA factor", 0.95)
    rae_per_player: bool = _help("one RAE baseline per (game, role, player) instead of per (game, role)", False)
    value_lambda: float = _help("credit='value' or 'q': lambda of the lambda-return (1 = Monte-Carlo return "
                                "minus the state's value, 0 = TD(0): the value of the next state)", 1.0)
    value_max_states: int = _help("credit='value' or 'q': most states (and state-move pairs) kept in the tables "
                                  "(least recently updated dropped first)", 200_000)
    q_target_coef: float = _help("credit='q': each round, every position a learner visited also trains toward "
                                 "its best known move (highest Q shrunk toward V by one visit = score) with "
                                 "advantage coef * (score - V), unclipped on every pass: policy improvement from "
                                 "the critic, not only from the sampled move; 0 = off", 0.0)
    q_target_min_visits: int = _help("credit='q': visits a move needs before it can be a target", 2)
    branch_samples: int = _help("credit='branch': K, the branch games played from each branched state; V(s) is "
                                "the mean return of the K (cost: K extra games per branched turn, per round)", 4)
    branch_turns_per_game: int = _help("credit='branch': learner turns branched per game, drawn at random (the "
                                       "others get the RAE advantage); 0 = every top-level turn", 0)
    branch_advantage: str = _help("credit='branch': 'return' (A = G - V(s_t)), 'td' (VinePPO: A = V(s_t+1) - "
                                  "V(s_t), the value after the move from branches too; up to twice the games) or "
                                  "'moves' (games with play.moves: every legal move is branched K times and each "
                                  "state's policy is regressed toward a bounded softmax of the moves' values; "
                                  "K x moves games per branched turn)",
                                  "return")
    branch_move_temperature: float = _help("credit='branch', branch_advantage='moves': tau; each branched state's "
                                           "policy is regressed toward softmax(Q / tau) over its legal moves (Q in "
                                           "reward units: smaller = nearer a best response)", 0.25)
    branch_move_clip: float = _help("credit='branch', branch_advantage='moves': bound c on each move's target "
                                    "centred logit (Q - mean Q) / tau, so a state stops pulling once its better "
                                    "move is about e^(2c) times as likely (math.inf: no bound)", 2.0)
    branch_temperature: float | None = _help("credit='branch': sampling temperature of the players' calls in the "
                                             "branch continuations (after the branched move); None = as in the "
                                             "games. 0 = greedy continuations: in a game without chance, one "
                                             "branch per move (branch_samples=1) gives the exact value of greedy "
                                             "play from there, and 'moves' then regresses each state toward "
                                             "the move that is best if both sides play on greedily (its fixed "
                                             "point is minimax play where every state is visited)", None)
    branch_move_loss: str = _help("credit='branch', branch_advantage='moves': how each state's move turns pull the "
                                  "policy toward softmax(y). 'residual': advantages y - (log pi - mean log pi) "
                                  "centred, a regression of the log-probability differences between the moves; "
                                  "it leaves the probability of replies that are none of the moves free, so "
                                  "many updates can drift it up (an illegal reply). 'cross_entropy': "
                                  "advantages softmax(y) (the loss is the cross-entropy toward the target): the "
                                  "same fixed point, and it keeps the mass on the listed moves", "residual")
    branch_replies: bool = _help("credit='branch', branch_advantage='moves': a one-ply search over the answer to "
                                 "each move: the next seated call is branched with every reply the game lists "
                                 "(play.moves), K branches each, and the replier's best reply for its own seat "
                                 "gives the move's value (for two players in a zero-sum game, the reply worst for "
                                 "the mover). For games of perfect information: the replier chooses knowing "
                                 "everything the branch knows. Cost: about as many games per move as it has "
                                 "replies", False)
    game_name: str | None = _help("name of the game in turns and cards (default: play's module name)", None)
    max_concurrent_games: int = _help("games in flight at once (their calls share the engine's batches)", 64)
    lockstep: bool = _help("batch the calls of all running games in a fixed order: full batches and "
                           "bit-identical reruns (async play); off = pure continuous batching", True)
    max_tokens: int = _help("default completion limit of model.generate in play (sampling temperature: "
                            "grpo_config.temperature, which the update uses too)", 64)
    max_slots: int = _help("adapter slots in the engine (more players are LRU-evicted)", 64)
    max_batch: int = _help("rows per decode step", 64)
    prefix_cache_mb: float = _help("memory of the engine's prefix cache: KV rows of earlier prompts reused per "
                                   "adapter version when a prompt starts the same way (chat histories); 0 = off", 64.0)
    elo_k: float = _help("Elo K factor", 20.0)
    elo_scale: float = _help("Elo scale", 400.0)
    elo_initial: float = _help("Elo of a new player", 1000.0)
    payoff_decay: float = _help("payoff-matrix decay per update (AlphaStar: 0.99)", 0.99)
    bt_bootstrap: int = _help("bootstrap rounds of the Bradley-Terry confidence intervals (0 = off)", 100)
    transcripts_per_pair: int = _help("keep the text of the last N games of each pair of players in "
                                      "output_dir/transcripts.jsonl (for `autocurricula dashboard`); 0 = off", 4)
    progress: bool = _help("show progress bars", True)
    overwrite_output_dir: bool = _help("start a fresh run in an output_dir that holds another run's checkpoints, "
                                       "metrics.jsonl or match_history.jsonl, deleting those files (as in "
                                       "transformers); without it such a run is refused unless it resumes", False)
    max_game_error_rate: float = _help("stop training with the first traceback when more than this share of a "
                                       "round's games raise or time out; a round where every game fails always "
                                       "stops (nothing to learn from); 1.0 = stop only then", 0.5)
    game_timeout_s: float | None = _help("wall-clock limit of one game (its whole play call, waiting for batches "
                                         "included); a game past it is cancelled and counted as an error. A sync "
                                         "play cannot be killed: its next model.generate raises and the round goes "
                                         "on without it. Also bounds how long SIGINT/SIGTERM wait. None = no limit",
                                         None)
    threads: int | None = _help("CPU backend on Linux: threads of this process's BLAS matmuls during train() "
                                "(None = OpenBLAS's default, every core). When `autocurricula serve` runs on the "
                                "same machine, split the cores: e.g. serve --threads 1 and threads=1 on 2 cores, so "
                                "a round overlapping an update (max_staleness >= 1) does not oversubscribe them",
                                None)
    max_staleness: int = _help("rollouts overlapping updates: 0 = the serial loop (play a round, update, play the "
                               "next); k >= 1 = round r+1 is played while round r's update runs, by the adapters "
                               "from before that update (one update behind), and a turn sampled more than k adapter "
                               "versions behind its player's current one is dropped from the update "
                               "(rollout/stale_dropped). An update adds num_iterations versions, so k >= "
                               "num_iterations keeps the overlapped turns. Overlaps in time only when games are "
                               "played elsewhere (train(servers=...)); in-process the same schedule runs serially",
                               0)

    def __post_init__(self):
        for name in ("epochs", "rounds", "matches", "logging_steps", "max_concurrent_games", "max_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.transcripts_per_pair, int) or self.transcripts_per_pair < 0:
            raise ValueError(f"transcripts_per_pair must be an integer >= 0 (0 = no transcripts), "
                             f"got {self.transcripts_per_pair!r}")
        if self.save_strategy not in ("epoch", "no"):
            raise ValueError("save_strategy must be 'epoch' or 'no'")
        if self.credit not in CREDIT_METHODS:
            raise ValueError(f"credit must be one of {sorted(CREDIT_METHODS)}, got {self.credit!r} (a method of your "
                             f"own: autocurricula.credit.register_credit(name, factory) before the config)")
        if not 0 <= self.value_lambda <= 1:
            raise ValueError(f"value_lambda must be in [0, 1], got {self.value_lambda}")
        if not math.isfinite(self.q_target_coef) or self.q_target_coef < 0:
            raise ValueError(f"q_target_coef must be a finite number >= 0 (0 = off), got {self.q_target_coef}")
        if not isinstance(self.q_target_min_visits, int) or self.q_target_min_visits < 1:
            raise ValueError(f"q_target_min_visits must be an integer >= 1, got {self.q_target_min_visits!r}")
        for name in ("branch_samples", "branch_turns_per_game"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "branch_samples" else 0):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'branch_samples' else 0}, got {v!r}")
        for name in ("branch_move_temperature", "branch_move_clip"):
            v = getattr(self, name)
            inf_ok = name == "branch_move_clip"  # no bound
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or \
                    (not inf_ok and not math.isfinite(v)):
                raise ValueError(f"{name} must be a {'' if inf_ok else 'finite '}number > 0, got {v!r}")
        t = self.branch_temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0):
            raise ValueError(f"branch_temperature must be None (the games' sampling) or a finite number >= 0 "
                             f"(0 = greedy continuations), got {t!r}")
        if self.branch_move_loss not in ("residual", "cross_entropy"):
            raise ValueError(f"branch_move_loss must be 'residual' or 'cross_entropy', got {self.branch_move_loss!r}")
        if self.branch_move_loss != "residual" and (self.credit != "branch" or self.branch_advantage != "moves"):
            raise ValueError("branch_move_loss chooses the loss of the listed moves' target turns: set credit='branch' "
                             "and branch_advantage='moves', or leave branch_move_loss='residual'")
        if self.branch_temperature is not None and self.credit != "branch":
            raise ValueError("branch_temperature samples branch continuations: set credit='branch', or leave "
                             "branch_temperature=None")
        if self.branch_replies and (self.credit != "branch" or self.branch_advantage != "moves"):
            raise ValueError("branch_replies searches the replies to every listed move: set credit='branch' and "
                             "branch_advantage='moves', or branch_replies=False")
        if self.branch_advantage not in ("return", "td", "moves"):
            raise ValueError(f"branch_advantage must be 'return' (A = G - V), 'td' (A = V(next) - V) or 'moves' "
                             f"(A = Q(s, m) - mean Q for every legal move), got {self.branch_advantage!r}")
        if self.q_target_coef and self.credit != "q":
            raise ValueError(f"q_target_coef needs credit='q' (the (state, move) table), got credit={self.credit!r}")
        targets = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        unknown = set(targets) - {"none", "wandb", "trackio"}
        if unknown:
            raise ValueError(f"report_to {sorted(unknown)} not supported; use 'none', 'wandb' or 'trackio'")
        self.report_to = [t for t in targets if t != "none"]
        if not (isinstance(self.max_game_error_rate, (int, float)) and 0 <= self.max_game_error_rate <= 1):
            raise ValueError(f"max_game_error_rate must be in [0, 1] (1.0 = stop only when every game of a round "
                             f"fails), got {self.max_game_error_rate!r}")
        if self.game_timeout_s is not None and not (isinstance(self.game_timeout_s, (int, float))
                                                    and math.isfinite(self.game_timeout_s) and self.game_timeout_s > 0):
            raise ValueError(f"game_timeout_s must be a positive number of seconds or None (no limit), "
                             f"got {self.game_timeout_s!r}")
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0 = serial rounds, k >= 1 = play the next round "
                             f"while the update runs, dropping turns more than k versions old), "
                             f"got {self.max_staleness!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads < 1):
            raise ValueError(f"threads must be a positive integer (BLAS threads of this process) or None for every "
                             f"core, got {self.threads!r}")
        if isinstance(self.prefix_cache_mb, bool) or not isinstance(self.prefix_cache_mb, (int, float)) \
                or not self.prefix_cache_mb >= 0:
            raise ValueError(f"prefix_cache_mb must be a number of megabytes >= 0 (0 turns prefix caching off), "
                             f"got {self.prefix_cache_mb!r}")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub=True needs hub_model_id='owner/name'")
