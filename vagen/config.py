"""The run configuration: nested dataclasses, loaded from YAML plus dotted command-line overrides.

    cfg = load_config("configs/frozenlake_tiny.yaml", ["algo.adv=bilevel_gae", "trainer.steps=50"])

Every field has a default and a one-line help (`metadata["help"]`). An unknown key, a value of the
wrong type, a missing required value or an inconsistent setting stops at start with one `ConfigError`
line naming the key (and the nearest valid key for a typo). Sizes derived from the config (rows per
rank, micro-batches per optimizer step, ...) are computed in one place, `derived_sizes`.
"""

import difflib
import math
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from vagen.algo import ADVANTAGE_ESTIMATORS, GROUP_FILTERS, KL_ESTIMATORS, LOSS_AGGREGATIONS
from vagen.perception import PerceptionConfig
from vagen.rollout.config import EnvConfig, RolloutConfig
from vagen.sft import WARM_START_TEACHERS, SFTConfig

ALARM_POLICIES = ("warn", "stop", "rollback")
DTYPES = ("float32", "bfloat16")
CRITIC_KINDS = ("model", "state")
STATE_CRITIC_INPUTS = ("text", "features")
TURN_LEVEL_ESTIMATORS = ("turn_gae", "bilevel_gae")  # credit over turns: a value per turn suffices
POLICY_UPDATES = ("ppo", "mpo")
LR_DECAYS = ("constant", "linear")


class ConfigError(ValueError):
    """A configuration problem, described in one line that names the offending key."""


@dataclass
class LoraConfig:
    """Optional LoRA adapters on the actor (peft); the reference is then the actor without them."""

    rank: int = field(default=0, metadata={"help": "LoRA rank r; 0 = full fine-tuning, no adapter"})
    alpha: float = field(default=16.0, metadata={"help": "LoRA scaling alpha (update scaled by alpha / r)"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the LoRA input"})
    target_modules: list[str] | None = field(
        default=None, metadata={"help": "module names with adapters; None = the language model's projections"}
    )


@dataclass
class ModelConfig:
    """Which checkpoint plays the policy (actor), the reference and the critic, and how to load it."""

    path: str = field(
        default="tiny-vlm", metadata={"help": "'tiny-vlm', 'tiny-text' or a local save_pretrained directory"}
    )
    critic_path: str | None = field(
        default=None, metadata={"help": "critic backbone checkpoint; None = the policy's checkpoint"}
    )
    dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16 (weights and DeepSpeed)"})
    attn_implementation: str = field(default="sdpa", metadata={"help": "sdpa | eager | flash_attention_2"})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward"}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "allow code shipped with the checkpoint"}
    )
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapters (rank 0 = off)"})
    warm_start: str = field(
        default="none",
        metadata={
            "help": "none | format | grounded | grid | solver: fine-tune the start by vagen.sft (cached), "
            "see `sft`"
        },
    )


@dataclass
class FilterConfig:
    """StarPO-S rollout filtering: keep the groups whose raw returns vary most."""

    rule: str = field(
        default="top_std_fraction",
        metadata={"help": "top_std_fraction (by in-group return std) | top_p_variance (share of variance)"},
    )
    keep: float = field(
        default=1.0,
        metadata={"help": "fraction of groups (top_std_fraction) or of variance (top_p_variance)"},
    )
    drop_zero_std: bool = field(
        default=False, metadata={"help": "also drop groups whose returns are all equal"}
    )


@dataclass
class AlgoConfig:
    """Advantages, losses and the PPO update schedule."""

    adv: str = field(
        default="gae",
        metadata={"help": "advantage estimator: gae | turn_gae | bilevel_gae | grpo | rloo | gigpo"},
    )
    policy_loss: str = field(
        default="ppo",
        metadata={
            "help": "ppo: PPO's clipped surrogate on each sampled token's advantage (algo.adv) | mpo: at "
            "each turn's action token, cross-entropy to pi_old * exp((Q - V) / mpo_eta) over ALL actions, "
            "from a privileged Q(s, a) critic (critic=state; algo.adv unused; one action per turn), "
            "vagen/algo/mpo.py"
        },
    )
    gamma: float = field(default=1.0, metadata={"help": "discount of gae, turn_gae and mpo's Q"})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda of gae and turn_gae"})
    gamma_turn: float = field(default=0.95, metadata={"help": "bilevel_gae: discount between turns"})
    lam_turn: float = field(default=1.0, metadata={"help": "bilevel_gae: lambda between turns"})
    gamma_token: float = field(default=1.0, metadata={"help": "bilevel_gae: discount within a turn"})
    lam_token: float = field(default=1.0, metadata={"help": "bilevel_gae: lambda within a turn"})
    grpo_scale_by_std: bool = field(default=True, metadata={"help": "grpo: divide by the group std"})
    whiten_advantages: bool = field(
        default=False, metadata={"help": "whiten token advantages over the whole batch (all ranks)"}
    )
    ppo_epochs: int = field(default=1, metadata={"help": "passes over each rollout batch"})
    mini_batches: int = field(
        default=2, metadata={"help": "optimizer steps per epoch (fixed whatever the filter keeps)"}
    )
    clip_low: float = field(default=0.2, metadata={"help": "PPO ratio clip below 1"})
    clip_high: float = field(default=0.2, metadata={"help": "PPO ratio clip above 1 (clip-higher if larger)"})
    dual_clip: float | None = field(
        default=None, metadata={"help": "dual-clip bound c > 1 for A < 0; None = off"}
    )
    loss_agg: str = field(
        default="token-mean", metadata={"help": "token-mean | seq-mean-token-sum | seq-mean-token-mean"}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus weight in the actor loss"})
    kl_coef: float = field(
        default=0.001, metadata={"help": "weight of KL(actor || reference); 0 = no reference"}
    )
    kl_kind: str = field(default="k3", metadata={"help": "KL estimator: k1 | k2 | k3 | abs"})
    kl_in_reward: bool = field(
        default=False, metadata={"help": "KL as a per-token reward penalty (True) or as an actor loss term"}
    )
    vf_clip: float = field(default=0.5, metadata={"help": "value clip around the rollout-time values"})
    critic: str = field(
        default="model",
        metadata={
            "help": "critic of gae / turn_gae / bilevel_gae: model (a value head on the policy's backbone, "
            "reading the same tokens) | state (an MLP on the env's text state, a privileged input the "
            "policy never sees: asymmetric actor-critic; turn_gae / bilevel_gae only)"
        },
    )
    state_critic_steps: int = field(
        default=20, metadata={"help": "critic=state: full-batch regression steps on each rollout"}
    )
    state_critic_max_bytes: int = field(
        default=256, metadata={"help": "critic=state: longest state string (UTF-8 bytes) it reads"}
    )
    state_critic_input: str = field(
        default="text",
        metadata={
            "help": "critic=state: what the MLP reads: text (the env's text grid, as bytes) | features "
            "(the env's state_features(): one-hot planes of each cell's tile and of the player; FrozenLake's "
            "env_kwargs.state_view=egocentric gives the map seen from the player instead)"
        },
    )
    mpo_eta: float = field(
        default=1.0, metadata={"help": "mpo: temperature of exp((Q - V) / eta), in reward units"}
    )
    mpo_uniform_mix: float = field(
        default=0.1, metadata={"help": "mpo: share of the uniform policy mixed into pi_old in the target"}
    )
    mpo_mass_coef: float = field(
        default=1.0,
        metadata={
            "help": "mpo: weight of -log(mass of the action tokens) beside the cross-entropy of the policy "
            "over the actions; 1 = the full-vocabulary cross-entropy, 0 = the actions' logits alone"
        },
    )
    mpo_mass_floor: float = field(
        default=1.0,
        metadata={
            "help": "mpo: the mass term pulls only on turns whose action-token mass is below this floor, as "
            "mass_coef * max(log floor - log mass, 0); 1 = on every turn (-mass_coef * log mass)"
        },
    )
    filter: FilterConfig = field(default_factory=FilterConfig, metadata={"help": "StarPO-S group filter"})


@dataclass
class OptimConfig:
    """AdamW (a torch optimizer handed to DeepSpeed) with linear warm-up, and the gradient guards."""

    actor_lr: float = field(default=1e-5, metadata={"help": "actor peak learning rate"})
    critic_lr: float = field(default=1e-5, metadata={"help": "critic peak learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW decoupled weight decay"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"})
    eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    warmup_steps: int = field(default=0, metadata={"help": "optimizer steps of linear LR warm-up from 0"})
    lr_decay: str = field(
        default="constant",
        metadata={"help": "constant | linear (to 0 at the last of trainer.steps' optimizer steps)"},
    )
    grad_clip: float = field(default=1.0, metadata={"help": "clip the gradient norm to this (DeepSpeed)"})
    max_grad_norm: float = field(
        default=1000.0,
        metadata={"help": "skip (never apply) a step whose gradient norm is above this or NaN"},
    )


@dataclass
class AlarmConfig:
    """Collapse alarms (vagen.algo.diagnostics.CollapseDetector per watched metric); what to do on one."""

    policy: str = field(
        default="warn", metadata={"help": "warn | stop (end the run) | rollback (last checkpoint)"}
    )
    window: int = field(default=20, metadata={"help": "steps of history behind the running median"})
    spike_factor: float = field(
        default=3.0, metadata={"help": "a value over factor x its running median spikes"}
    )
    drop_fraction: float = field(
        default=0.5,
        metadata={"help": "a value under fraction x its running max for drop_patience steps drops"},
    )
    drop_patience: int = field(default=5, metadata={"help": "steps a drop must last before it alarms"})
    min_history: int = field(default=5, metadata={"help": "steps of history before a spike can fire"})
    max_rollbacks: int = field(default=2, metadata={"help": "rollbacks allowed before the run stops"})


@dataclass
class LoggingConfig:
    """Where metrics go besides the console and metrics.jsonl."""

    wandb: bool = field(default=False, metadata={"help": "log to Weights & Biases"})
    wandb_project: str = field(default="vagen", metadata={"help": "wandb project"})
    wandb_mode: str = field(default="offline", metadata={"help": "offline | online (WANDB_MODE wins if set)"})


@dataclass
class TrainerConfig:
    """The loop: length, batch shapes, DeepSpeed, checkpoints, validation and GIFs."""

    steps: int = field(default=20, metadata={"help": "iterations (rollout + update) to run"})
    run_dir: str = field(default="", metadata={"help": "output folder; '' = runs/<config file name>"})
    seed: int = field(default=0, metadata={"help": "seed of torch, numpy, random and the rollouts"})
    deepspeed: str = field(
        default="configs/deepspeed/zero1.json", metadata={"help": "DeepSpeed JSON config (ZeRO stage, ...)"}
    )
    micro_batch_size: int = field(default=4, metadata={"help": "rows per forward/backward in the update"})
    score_micro_batch_size: int = field(default=16, metadata={"help": "rows per forward when scoring"})
    rollout_reuse: int = field(
        default=1, metadata={"help": "iterations fed by one rollout batch (1 = always fresh rollouts)"}
    )
    save_every: int = field(default=0, metadata={"help": "checkpoint every N steps (0 = only at the end)"})
    keep_last: int = field(default=2, metadata={"help": "checkpoints kept on disk"})
    resume: str = field(
        default="none", metadata={"help": "none | auto (newest checkpoint in run_dir) | a path"}
    )
    val_every: int = field(default=0, metadata={"help": "validate every N steps (0 = before and after only)"})
    val_groups: int = field(default=32, metadata={"help": "validation levels (fixed seeds)"})
    val_group_size: int = field(default=1, metadata={"help": "episodes per validation level"})
    val_temperature: float = field(
        default=0.0, metadata={"help": "sampling temperature of validation (0 = greedy)"}
    )
    viz_every: int = field(default=0, metadata={"help": "write rollout GIFs + HTML every N steps (0 = off)"})
    viz_episodes: int = field(default=4, metadata={"help": "episodes rendered each time"})


@dataclass
class RunConfig:
    """One training run."""

    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "checkpoints"})
    env: EnvConfig = field(default_factory=EnvConfig, metadata={"help": "environment"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "StarPO rollout"})
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={"help": "RL algorithm"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "optimizer"})
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "the loop"})
    alarms: AlarmConfig = field(default_factory=AlarmConfig, metadata={"help": "collapse alarms"})
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata={"help": "metric sinks"})
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "warm start (model.warm_start)"})
    perception: PerceptionConfig = field(
        default_factory=PerceptionConfig,
        metadata={"help": "pretraining to read the images (vagen.perception)"},
    )


def valid_keys(schema: type = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, e.g. 'algo.filter.keep'."""
    keys = []
    for f in fields(schema):
        key = prefix + f.name
        keys.append(key)
        if is_dataclass(f.default_factory):
            keys += valid_keys(f.default_factory, key + ".")
    return keys


def _nearest_key_hint(key: str) -> str:
    matches = difflib.get_close_matches(key, valid_keys(), n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""


def _config_error(err: OmegaConfBaseException, section: str = "") -> ConfigError:
    """One line naming the key behind an OmegaConf error."""
    key = ".".join(k for k in (section, str(getattr(err, "full_key", "") or "")) if k)
    if isinstance(err, ConfigKeyError):
        return ConfigError(f"unknown config key '{key}'{_nearest_key_hint(key)}")
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(f"missing required config value '{key}'")
    if isinstance(err, ValidationError):
        message = str(getattr(err, "msg", err)).splitlines()[0]
        return ConfigError(f"bad value for config key '{key}': {message}")
    return ConfigError(f"config error at '{key}': {str(getattr(err, 'msg', err)).splitlines()[0]}")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Schema defaults <- YAML file <- `key=value` overrides; typed, validated RunConfig.

    `trainer.run_dir` defaults to runs/<YAML file stem> (runs/default without a file).
    """
    schema = OmegaConf.structured(RunConfig)
    layers: list[DictConfig] = []
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        loaded = OmegaConf.load(path)
        if not isinstance(loaded, DictConfig):
            raise ConfigError(f"{path} must hold a mapping of sections (model, env, rollout, algo, ...)")
        layers.append(loaded)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like key=value, e.g. trainer.steps=50")
        layers.append(OmegaConf.from_dotlist([item]))
    merged = schema
    for layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            raise _config_error(err) from None
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ConfigError(f"missing required config value '{missing[0]}'")
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _config_error(err) from None
    except ValueError as err:  # a section's own __post_init__ check
        raise ConfigError(str(err).splitlines()[0]) from None
    if not cfg.trainer.run_dir:
        cfg.trainer.run_dir = str(Path("runs") / (path.stem if path is not None else "default"))
    validate(cfg)
    return cfg


def load_config_or_exit(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """load_config for command lines: a bad config ends the process with one `config error: ...` line."""
    try:
        return load_config(path, overrides)
    except ConfigError as err:
        sys.exit(f"config error: {err}")


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"bad value for config key '{key}': {message}")


def validate(cfg: RunConfig) -> None:
    """Checks across fields that types alone cannot express; raises ConfigError on the first problem."""
    algo, optim, trainer = cfg.algo, cfg.optim, cfg.trainer
    _require(
        algo.adv in ADVANTAGE_ESTIMATORS,
        "algo.adv",
        f"'{algo.adv}' is not one of {sorted(ADVANTAGE_ESTIMATORS)}",
    )
    _require(
        algo.loss_agg in LOSS_AGGREGATIONS,
        "algo.loss_agg",
        f"'{algo.loss_agg}' not in {sorted(LOSS_AGGREGATIONS)}",
    )
    _require(
        algo.kl_kind in KL_ESTIMATORS, "algo.kl_kind", f"'{algo.kl_kind}' not in {sorted(KL_ESTIMATORS)}"
    )
    _require(
        algo.filter.rule in GROUP_FILTERS,
        "algo.filter.rule",
        f"'{algo.filter.rule}' not in {sorted(GROUP_FILTERS)}",
    )
    _require(
        not algo.kl_in_reward or needs_critic(cfg),
        "algo.kl_in_reward",
        f"a per-token KL reward needs a critic-based estimator, not '{algo.adv}' (use the KL loss term)",
    )
    _require(algo.critic in CRITIC_KINDS, "algo.critic", f"'{algo.critic}' not in {CRITIC_KINDS}")
    _require(
        algo.policy_loss in POLICY_UPDATES,
        "algo.policy_loss",
        f"'{algo.policy_loss}' not in {POLICY_UPDATES}",
    )
    mpo = algo.policy_loss == "mpo"
    _require(
        algo.critic == "model" or algo.adv in TURN_LEVEL_ESTIMATORS or mpo,
        "algo.critic",
        f"critic=state gives one value per turn; use it with {TURN_LEVEL_ESTIMATORS}, not '{algo.adv}'",
    )
    _require(
        not mpo or algo.critic == "state",
        "algo.critic",
        "policy_loss=mpo needs Q(s, a) of every action: set algo.critic=state",
    )
    _require(
        not mpo or cfg.env.max_actions_per_turn == 1,
        "env.max_actions_per_turn",
        f"policy_loss=mpo grades one action per turn: set it to 1, not {cfg.env.max_actions_per_turn}",
    )
    group_size = cfg.rollout.group_size
    _require(
        mpo or ADVANTAGE_ESTIMATORS[algo.adv].uses_critic or group_size >= 2,
        "rollout.group_size",
        f"algo.adv={algo.adv} compares the episodes of a group, so a group of {group_size} gets no "
        "advantage: play groups of >= 2 on one level (e.g. rollout.num_groups=32 rollout.group_size=8)",
    )
    _require(
        algo.filter.keep == 1.0 or group_size >= 2,
        "rollout.group_size",
        f"the group filter (algo.filter.keep={algo.filter.keep}) ranks groups by the spread of their "
        f"returns, which a group of {group_size} does not have: set rollout.group_size >= 2",
    )
    _require(algo.mpo_eta > 0.0, "algo.mpo_eta", f"must be > 0, got {algo.mpo_eta}")
    _require(algo.mpo_mass_coef >= 0.0, "algo.mpo_mass_coef", f"must be >= 0, got {algo.mpo_mass_coef}")
    _require(
        0.0 < algo.mpo_mass_floor <= 1.0,
        "algo.mpo_mass_floor",
        f"must lie in (0, 1], got {algo.mpo_mass_floor}",
    )
    _require(
        0.0 <= algo.mpo_uniform_mix < 1.0,
        "algo.mpo_uniform_mix",
        f"must lie in [0, 1), got {algo.mpo_uniform_mix}",
    )
    _require(algo.state_critic_steps >= 1, "algo.state_critic_steps", "must be >= 1")
    _require(algo.state_critic_max_bytes >= 1, "algo.state_critic_max_bytes", "must be >= 1")
    _require(
        algo.state_critic_input in STATE_CRITIC_INPUTS,
        "algo.state_critic_input",
        f"must be one of {STATE_CRITIC_INPUTS}, got {algo.state_critic_input!r}",
    )
    _require(0.0 < algo.filter.keep <= 1.0, "algo.filter.keep", f"must be in (0, 1], got {algo.filter.keep}")
    _require(algo.kl_coef >= 0.0, "algo.kl_coef", f"must be >= 0, got {algo.kl_coef}")
    _require(algo.ppo_epochs >= 1, "algo.ppo_epochs", f"must be >= 1, got {algo.ppo_epochs}")
    _require(algo.mini_batches >= 1, "algo.mini_batches", f"must be >= 1, got {algo.mini_batches}")
    _require(
        algo.dual_clip is None or algo.dual_clip > 1.0,
        "algo.dual_clip",
        f"must be > 1 or null, got {algo.dual_clip}",
    )
    _require(cfg.model.dtype in DTYPES, "model.dtype", f"'{cfg.model.dtype}' not in {DTYPES}")
    warm_starts = ("none", *WARM_START_TEACHERS)
    _require(
        cfg.model.warm_start in warm_starts,
        "model.warm_start",
        f"'{cfg.model.warm_start}' not in {warm_starts}",
    )
    _require(len(optim.betas) == 2, "optim.betas", f"needs two values, got {optim.betas}")
    _require(optim.max_grad_norm > 0.0, "optim.max_grad_norm", f"must be > 0, got {optim.max_grad_norm}")
    _require(optim.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {optim.warmup_steps}")
    _require(
        optim.lr_decay in LR_DECAYS, "optim.lr_decay", f"must be one of {LR_DECAYS}, got {optim.lr_decay!r}"
    )
    _require(trainer.steps >= 1, "trainer.steps", f"must be >= 1, got {trainer.steps}")
    _require(trainer.micro_batch_size >= 1, "trainer.micro_batch_size", "must be >= 1")
    _require(trainer.score_micro_batch_size >= 1, "trainer.score_micro_batch_size", "must be >= 1")
    _require(
        trainer.rollout_reuse >= 1, "trainer.rollout_reuse", f"must be >= 1, got {trainer.rollout_reuse}"
    )
    _require(trainer.keep_last >= 1, "trainer.keep_last", f"must be >= 1, got {trainer.keep_last}")
    for key in ("save_every", "val_every", "viz_every"):
        _require(getattr(trainer, key) >= 0, f"trainer.{key}", "must be >= 0")
    _require(
        trainer.resume in ("none", "auto") or Path(trainer.resume).is_dir(),
        "trainer.resume",
        f"'{trainer.resume}' is neither none, auto nor an existing checkpoint folder",
    )
    _require(Path(trainer.deepspeed).is_file(), "trainer.deepspeed", f"file not found: {trainer.deepspeed}")
    _require(
        cfg.alarms.policy in ALARM_POLICIES, "alarms.policy", f"'{cfg.alarms.policy}' not in {ALARM_POLICIES}"
    )
    _require(
        cfg.logging.wandb_mode in ("offline", "online"), "logging.wandb_mode", "must be offline or online"
    )


def needs_critic(cfg: RunConfig) -> bool:
    """Critic-based estimators (GAE family) and the mpo update train a critic; group-based ones do not."""
    return cfg.algo.policy_loss == "mpo" or ADVANTAGE_ESTIMATORS[cfg.algo.adv].uses_critic


@dataclass
class DerivedSizes:
    """Batch shapes computed once from the config and the world size, printed at start-up."""

    world_size: int
    groups_per_rank: int  # G / world: each rank rolls out its own share of the groups
    rows_per_rank: int  # groups_per_rank * n (one row per episode without a window)
    optimizer_steps_per_iteration: int  # ppo_epochs * mini_batches, whatever the filter keeps
    micro_batches_per_step: int  # gradient accumulation steps, equal on every rank

    def describe(self) -> str:
        return (
            f"world {self.world_size}: {self.groups_per_rank} groups = {self.rows_per_rank} rows per rank, "
            f"{self.optimizer_steps_per_iteration} optimizer steps per iteration, "
            f"{self.micro_batches_per_step} micro-batches per step"
        )


def derived_sizes(cfg: RunConfig, world_size: int) -> DerivedSizes:
    """Per-rank shares and the gradient-accumulation count that keeps every rank in lock-step.

    A mini-batch of one rank holds at most ceil(rows_per_rank / mini_batches) rows (fewer after the
    filter), so ceil(that / micro_batch_size) micro-batches always suffice; ranks with fewer rows pad
    with zero-weight micro-batches.
    """
    groups = cfg.rollout.num_groups
    if groups % world_size:
        raise ConfigError(
            f"bad value for config key 'rollout.num_groups': {groups} groups do not split over "
            f"{world_size} ranks"
        )
    rows = groups // world_size * cfg.rollout.group_size
    # with a context window an episode spans up to max_turns rows
    if cfg.rollout.window is not None:
        rows *= cfg.rollout.max_turns
    rows_per_mini_batch = math.ceil(rows / cfg.algo.mini_batches)
    return DerivedSizes(
        world_size=world_size,
        groups_per_rank=groups // world_size,
        rows_per_rank=rows,
        optimizer_steps_per_iteration=cfg.algo.ppo_epochs * cfg.algo.mini_batches,
        micro_batches_per_step=math.ceil(rows_per_mini_batch / cfg.trainer.micro_batch_size),
    )


def to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML (saved in the run folder)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def as_dict(cfg: RunConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg))
