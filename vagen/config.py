"""The run configuration: nested dataclasses, loaded from YAML plus dotted command-line overrides.

    cfg = load_config("configs/frozenlake_tiny.yaml", ["algo.adv=bilevel_gae", "trainer.steps=50"])

Every schema of the project lives here, and this module imports no other part of vagen (nor torch):
`python -c "import vagen.config"` is cheap. Every field has a default and a one-line help; its metadata
may also name its `choices` and its range (`ge`, `gt`, `le`, `lt`, and `length` for a list), which
`validate` checks for every field in one loop. Float values must be finite. An unknown key, a removed
key (named with its replacement), a value of the wrong type or out of range stops at start with one
`ConfigError` line naming the key. Checks that need the registries (estimator x update x critic), the
model or the env run at start-up before any work (vagen.startup). The batch sizes derived from the
config are computed in one place, vagen.batching.derived_sizes.
"""

import difflib
import importlib.util
import math
import sys
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

# Names owned by other modules, repeated so that loading a config imports none of them (tests check).
ADVANTAGE_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae", "grpo", "rloo", "gigpo")
POLICY_UPDATES = ("ppo", "mpo")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "episode-mean")
KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
GROUP_FILTERS = ("top_std_fraction", "top_p_variance")
CRITICS = ("model", "state")
STATE_CRITIC_INPUTS = ("text", "features")
TEACHERS = ("format", "grounded", "grid", "solver", "planner")
PROMPT_FORMATS = ("no_think", "free_think", "grounding", "worldmodeling", "grounding_worldmodeling")
INSTRUCTION_STYLES = ("full", "brief")
SPAN_NAMES = ("think", "observation", "reasoning", "prediction", "answer", "action")
ENGINES = ("hf", "vllm")
SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("float32", "bfloat16")
KL_TOKENS = ("loss", "rest", "non_action")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
ALARM_POLICIES = ("warn", "stop", "rollback")

# Keys of older recipes: a config that sets one stops with this replacement in its one-line error.
REMOVED_KEYS = {
    "model.warm_start": "use warm_start.teacher (format | grounded | grid | solver | planner)",
    "model.critic_path": "removed: the critic starts from the policy's checkpoint",
    "sft": "use warm_start (its optimizer settings under warm_start.optim)",
    "sft.teacher": "use warm_start.teacher (random -> format, describe -> grounded)",
    "sft.cache_dir": "removed: set VAGEN_CACHE",
    "perception.cache_dir": "removed: set VAGEN_CACHE",
    "algo.gamma_turn": "use algo.gamma (bilevel_gae's turn-level discount)",
    "algo.lam_turn": "use algo.lam (bilevel_gae's turn-level lambda)",
    "algo.mpo_mass_floor": "removed (a negative result: docs/research/probe-log.md)",
    "algo.filter.drop_zero_std": "removed (a negative result: docs/research/probe-log.md)",
    "optim.lr_decay": "use optim.schedule (constant | linear | cosine)",
    "optim.max_grad_norm": "use optim.skip_grad_norm (optim.grad_clip clips)",
    "optim.eps": "removed: AdamW's epsilon is 1e-8",
    "trainer.rollout_reuse": "removed: every iteration rolls out afresh",
    "rollout.seed": "use trainer.seed (one seed for the whole run)",
    "rollout.train_seed_start": "removed: training and validation levels are split by layout hash",
    "rollout.val_seed_start": "removed: training and validation levels are split by layout hash",
    "rollout.holdout_val_layouts": "removed: validation layouts are always held out",
    "rollout.val_layout_share": "removed: 20% of the layouts are held out",
    "env.template_penalty": "removed: a constant of vagen/rollout/reasoning.py",
    "env.template_score_threshold": "removed: a constant of vagen/rollout/reasoning.py",
    "logging.wandb_project": "use the WANDB_PROJECT environment variable",
    "logging.wandb_mode": "use the WANDB_MODE environment variable",
    **{
        f"alarms.{k}": "removed: a constant of vagen/metrics.py"
        for k in ("window", "spike_factor", "drop_fraction", "drop_patience", "min_history")
    },  # fmt: skip
}


class ConfigError(ValueError):
    """A configuration problem, described in one line that names the offending key."""


def option(default: Any, help: str, **checks: Any) -> Any:
    """A schema field: its default, its help, and the checks `validate` runs on it (choices=, ge=, gt=,
    le=, lt=, length=). Lists and dicts get a fresh copy per instance."""
    metadata = {"help": help, **checks}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(schema: type, help: str, **defaults: Any) -> Any:
    """A nested section field, with its own defaults overridden by `defaults`."""
    return field(default_factory=lambda: schema(**defaults), metadata={"help": help})


@dataclass
class LoraConfig:
    """Optional LoRA adapters on the actor (peft); the reference is then the actor without them."""

    rank: int = option(0, "LoRA rank r; 0 = full fine-tuning, no adapter", ge=0)
    alpha: float = option(16.0, "LoRA scaling alpha (update scaled by alpha / r)", gt=0)
    dropout: float = option(0.0, "dropout on the LoRA input", ge=0, lt=1)
    target_modules: list[str] | None = option(
        None, "module names with adapters; None = the language model's projections"
    )


@dataclass
class ModelConfig:
    """The checkpoint the policy (actor), the reference and a model critic start from, and how to load it."""

    path: str = option("tiny-vlm", "'tiny-vlm', 'tiny-text' or a local save_pretrained directory")
    dtype: str = option("float32", "weights and DeepSpeed precision", choices=DTYPES)
    attn_implementation: str = option("sdpa", "attention kernel", choices=ATTENTION)
    gradient_checkpointing: bool = option(False, "recompute activations in backward")
    trust_remote_code: bool = option(False, "allow code shipped with the checkpoint")
    lora: LoraConfig = section(LoraConfig, "LoRA adapters (rank 0 = off)")


@dataclass
class SupervisedOptim:
    """AdamW steps of a supervised run (warm start, perception): linear warm-up, then the schedule.
    AdamW's betas (0.9, 0.98), weight decay 0.01 and gradient clip 1.0 are fixed (vagen.pretrain)."""

    steps: int = option(400, "optimizer steps", ge=1)
    batch_size: int = option(16, "rows per optimizer step", ge=1)
    lr: float = option(2e-3, "peak learning rate", gt=0)
    warmup_steps: int = option(20, "optimizer steps of linear warm-up", ge=0)
    schedule: str = option("cosine", "after warm-up: constant | linear | cosine", choices=SCHEDULES)
    min_lr_ratio: float = option(0.1, "final learning rate as a fraction of the peak", ge=0, le=1)


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning on teacher-played episodes before RL (vagen.pretrain.sft; cached)."""

    teacher: str = option(
        "none",
        "teacher imitated before RL: none | format | grounded | grid | solver | planner (pretrain.teachers)",
        choices=("none", *TEACHERS),
    )
    episodes: int = option(256, "teacher-played episodes (training levels)", ge=1)
    eval_levels: int = option(64, "validation levels evaluated after training", ge=1)
    seed: int = option(0, "seed of the teacher, its levels, the data order and torch (not the RL seed)")
    optim: SupervisedOptim = section(SupervisedOptim, "its AdamW steps")


@dataclass
class PerceptionConfig:
    """Captioning pretraining on the env's images before the warm start (vagen.pretrain.perception)."""

    enabled: bool = option(False, "pretrain `model.path` to read the images first (cached)")
    samples: int = option(8192, "(image, grid) training samples", ge=1)
    max_walk: int = option(10, "random steps from the reset, at most", ge=0)
    shuffle_cells: float = option(0.0, "share of training captions with their cells shuffled", ge=0, le=1)
    eval_samples: int = option(512, "validation samples scored after training", ge=1)
    seed: int = option(0, "seed of the levels, walks, data order and torch")
    optim: SupervisedOptim = section(
        SupervisedOptim, "AdamW steps", steps=3000, batch_size=64, lr=1e-3, warmup_steps=50, min_lr_ratio=0.3
    )


@dataclass
class EnvConfig:
    """One environment family played through the language layer (envs_visual.language.LanguageEnv)."""

    env_id: str = option("envs_visual/FrozenLake-v0", "gymnasium id, e.g. envs_visual/Sokoban-v0")
    env_kwargs: dict[str, Any] = option({}, "keyword arguments of gymnasium.make (size, boxes, ...)")
    prompt_format: str = option("free_think", "what the reply holds besides <answer>", choices=PROMPT_FORMATS)
    max_actions_per_turn: int = option(3, "actions executed at most per reply", ge=1)
    format_reward: float = option(0.5, "reward for a well-formed reply")
    format_penalty: float = option(0.0, "reward for a malformed reply (RAGEN uses -0.1)", le=0)
    text_only: bool = option(False, "text observations (the grid as text), no images")
    cell_separator: str = option(
        "", "text_only: between a row's cells (' ' keeps one BPE token per cell; Sokoban: '|')"
    )
    instructions: str = option(
        "full",
        "full (rules, legend, actions, format, an example) | brief (one sentence, ~5x fewer tokens)",
        choices=INSTRUCTION_STYLES,
    )
    instructions_in_system: bool = option(
        False, "task instructions in the system prompt, not the first message"
    )
    action_feedback: bool = option(
        True, "open each message with what the last reply did ('Executed actions: Up.')"
    )
    grounding_reward_weight: float = option(0.0, "weight of the F1 of <observation> vs the true state", ge=0)
    worldmodel_reward_weight: float = option(
        0.0, "weight of the F1 of <prediction> vs the true next state", ge=0
    )
    remote: str | None = option(None, "URL of an env server (docs/env-service.md); None = envs in process")
    remote_timeout_s: float = option(30.0, "env.remote: seconds a request may take before a retry", gt=0)
    remote_retries: int = option(2, "env.remote: retries of a failed request, then its episode ends", ge=0)


@dataclass
class RolloutConfig:
    """StarPO rollout: groups of episodes, turn and context budgets, sampling, masking by span."""

    num_groups: int = option(8, "G: groups per rollout; a group shares one level", ge=1)
    group_size: int = option(4, "n: episodes per group (same level, own dynamics)", ge=1)
    max_turns: int = option(5, "turns (replies) per episode at most", ge=1)
    max_actions_per_episode: int = option(20, "actions executed per episode at most", ge=1)
    window: int | None = option(
        None,
        "earlier turns kept in the context besides the first; None = the full history (one row per episode)",
        ge=0,
    )
    max_context_tokens: int = option(
        4096, "an episode ends before a turn whose prompt + reply could exceed this", ge=1
    )
    random_start: float = option(
        0.0,
        "exploring starts: share of training episodes that start off the level's start (a solvable state)",
        ge=0,
        le=1,
    )
    temperature: float = option(1.0, "sampling temperature (0 = greedy)", ge=0)
    top_p: float = option(1.0, "nucleus sampling threshold (1 = off)", gt=0, le=1)
    top_k: int = option(0, "top-k sampling (0 = off)", ge=0)
    max_new_tokens: int = option(128, "tokens sampled per reply at most", ge=1)
    engine: str = option(
        "auto",
        "generation engine: hf | vllm | auto (vllm if installed, else hf: bench/results/rollout_bench.txt)",
        choices=(*ENGINES, "auto"),
    )
    chat_template: str | None = option(None, "a jinja chat template file overriding the processor's own")
    loss_spans: str | list[str] = option(
        "all",
        "tokens with policy loss: 'all' sampled tokens or a list of " + ", ".join(SPAN_NAMES),
        choices=("all", *SPAN_NAMES),
    )
    adv_spans: str | list[str] = option(
        "all", "tokens the advantage recursion visits: 'all' or span names", choices=("all", *SPAN_NAMES)
    )

    def __post_init__(self) -> None:
        if self.engine == "auto":
            self.engine = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"

    @property
    def max_images_per_prompt(self) -> int:
        """Images one prompt can hold: one per kept turn (all turns, or the first + `window` + current)."""
        return self.max_turns if self.window is None else min(self.max_turns, self.window + 2)


@dataclass
class FilterConfig:
    """StarPO-S rollout filtering: keep the groups whose raw returns vary most."""

    rule: str = option(
        "top_std_fraction",
        "top_std_fraction (by in-group return std) | top_p_variance (share of variance)",
        choices=GROUP_FILTERS,
    )
    keep: float = option(
        1.0, "fraction of groups (top_std_fraction) or of variance (top_p_variance)", gt=0, le=1
    )


@dataclass
class AlgoConfig:
    """Advantages, the policy update, its losses and schedule (formulas: docs/algorithms.md)."""

    adv: str = option(
        "gae", "advantage estimator of the ppo update (unused by mpo)", choices=ADVANTAGE_ESTIMATORS
    )
    policy_loss: str = option(
        "ppo",
        "ppo: the clipped surrogate on each sampled token's advantage | mpo: at each turn's action token, "
        "cross-entropy to pi_old * exp((Q - V) / mpo_eta) over all actions, from a Q(s, a) state critic",
        choices=POLICY_UPDATES,
    )
    gamma: float = option(
        1.0, "discount: per token (gae), per turn (turn_gae, bilevel_gae, gigpo, mpo's Q)", ge=0, le=1
    )
    lam: float = option(1.0, "GAE lambda: per token (gae), per turn (turn_gae, bilevel_gae)", ge=0, le=1)
    gamma_token: float = option(1.0, "bilevel_gae: discount within a turn", ge=0, le=1)
    lam_token: float = option(1.0, "bilevel_gae: lambda within a turn", ge=0, le=1)
    grpo_scale_by_std: bool = option(True, "grpo, gigpo: divide by the group std")
    whiten_advantages: bool = option(False, "whiten token advantages over the whole batch (all ranks)")
    ppo_epochs: int = option(1, "passes over each rollout batch", ge=1)
    mini_batches: int = option(2, "optimizer steps per epoch (fixed whatever the filter keeps)", ge=1)
    clip_low: float = option(0.2, "PPO ratio clip below 1", gt=0, lt=1)
    clip_high: float = option(0.2, "PPO ratio clip above 1 (clip-higher if larger)", gt=0)
    dual_clip: float | None = option(None, "dual-clip bound c > 1 for A < 0; None = off", gt=1)
    loss_agg: str = option(
        "auto",
        "how token losses are averaged; auto: episode-mean for grpo, rloo, gigpo, else token-mean",
        choices=("auto", *LOSS_AGGREGATIONS),
    )
    entropy_coef: float = option(0.0, "entropy bonus weight in the actor loss", ge=0)
    kl_coef: float = option(0.001, "weight of KL(actor || reference); 0 = no reference", ge=0)
    kl_kind: str = option("k3", "KL estimator", choices=KL_ESTIMATORS)
    kl_in_reward: bool = option(False, "KL as a per-token reward penalty (True) or as an actor loss term")
    kl_tokens: str = option("loss", "ppo: the KL anchor's and entropy's tokens: loss (with policy loss) | "
        "rest (sampled, without it) | non_action (sampled, but the action's)", choices=KL_TOKENS)  # fmt: skip
    vf_clip: float = option(0.5, "value clip around the rollout-time values", gt=0)
    critic: str = option(
        "model",
        "model (a value head on the policy's backbone) | state (an MLP on the env's true state: V(s_t) on "
        "every token of turn t, or mpo's Q(s, a))",
        choices=CRITICS,
    )
    state_critic_steps: int = option(20, "critic=state: full-batch regression steps per rollout", ge=1)
    state_critic_max_bytes: int = option(
        256, "critic=state, input text: longest state string (UTF-8 bytes) it reads", ge=1
    )
    state_critic_input: str = option(
        "text",
        "critic=state: text (the env's text grid, as bytes) | features (the env's state_features())",
        choices=STATE_CRITIC_INPUTS,
    )
    mpo_eta: float = option(1.0, "mpo: temperature of exp((Q - V) / eta), in reward units", gt=0)
    mpo_uniform_mix: float = option(0.1, "mpo: share of the uniform policy mixed into pi_old", ge=0, lt=1)
    mpo_mass_coef: float = option(
        1.0,
        "mpo: weight of -log(mass of the action tokens) beside the cross-entropy over the actions (1 = the "
        "full-vocabulary cross-entropy, 0 = the actions' logits alone)",
        ge=0,
    )
    filter: FilterConfig = section(FilterConfig, "StarPO-S group filter")


@dataclass
class OptimConfig:
    """AdamW (a torch optimizer handed to DeepSpeed), its LR schedule, and the gradient guards."""

    actor_lr: float = option(1e-5, "actor peak learning rate", gt=0)
    critic_lr: float = option(1e-5, "critic peak learning rate (model or state critic)", gt=0)
    betas: list[float] = option([0.9, 0.999], "AdamW betas", ge=0, lt=1, length=2)
    weight_decay: float = option(0.0, "AdamW decoupled weight decay", ge=0)
    warmup_steps: int = option(0, "optimizer steps of linear LR warm-up", ge=0)
    schedule: str = option(
        "constant", "after warm-up, towards the last of trainer.steps' optimizer steps", choices=SCHEDULES
    )
    min_lr_ratio: float = option(
        0.0, "linear / cosine: the last step's lr as a fraction of the peak", ge=0, le=1
    )
    grad_clip: float = option(1.0, "clip the gradient norm to this (DeepSpeed)", gt=0)
    skip_grad_norm: float = option(
        1000.0, "skip (never apply) a step whose gradient norm is above this or not finite", gt=0
    )


@dataclass
class TrainerConfig:
    """The loop: length, batch shapes, DeepSpeed, checkpoints, validation and GIFs."""

    steps: int = option(20, "iterations (rollout + update) to run", ge=1)
    run_dir: str = option("", "output folder; '' = runs/<config file name>")
    seed: int = option(0, "seed of torch, numpy, random, the rollouts' sampling and env dynamics", ge=0)
    deepspeed: str = option("configs/deepspeed/zero1.json", "DeepSpeed JSON config (ZeRO stage, ...)")
    micro_batch_size: int = option(4, "rows per forward/backward in the update", ge=1)
    score_micro_batch_size: int = option(16, "rows per forward when scoring", ge=1)
    gpu_memory_gb: float = option(0.0, "warn if the memory estimate exceeds this many GB/GPU (0 = off)", ge=0)
    save_every: int = option(0, "checkpoint every N steps (0 = only at the end)", ge=0)
    keep_last: int = option(2, "checkpoints kept on disk", ge=1)
    resume: str = option("none", "none | auto (newest checkpoint in run_dir) | a checkpoint folder")
    val_every: int = option(0, "validate every N steps (0 = before and after only)", ge=0)
    val_groups: int = option(32, "validation levels (fixed, held-out layouts)", ge=1)
    val_group_size: int = option(1, "episodes per validation level", ge=1)
    val_temperature: float = option(0.0, "sampling temperature of validation (0 = greedy)", ge=0)
    viz_every: int = option(0, "write rollout GIFs + HTML every N steps (0 = off)", ge=0)
    viz_episodes: int = option(4, "episodes rendered each time", ge=1)


@dataclass
class AlarmConfig:
    """What a collapse alarm does (detectors: vagen.metrics.Alarms)."""

    policy: str = option(
        "warn", "warn | stop (end the run) | rollback (to the last checkpoint)", choices=ALARM_POLICIES
    )
    max_rollbacks: int = option(2, "rollbacks allowed before the run stops", ge=0)


@dataclass
class LoggingConfig:
    """Where metrics go besides the console and metrics.jsonl."""

    wandb: bool = option(False, "log to Weights & Biases (WANDB_MODE, offline by default; WANDB_PROJECT)")


@dataclass
class RunConfig:
    """One training run."""

    model: ModelConfig = section(ModelConfig, "the checkpoint")
    env: EnvConfig = section(EnvConfig, "environment")
    rollout: RolloutConfig = section(RolloutConfig, "StarPO rollout")
    algo: AlgoConfig = section(AlgoConfig, "RL algorithm")
    optim: OptimConfig = section(OptimConfig, "RL optimizer")
    trainer: TrainerConfig = section(TrainerConfig, "the loop")
    alarms: AlarmConfig = section(AlarmConfig, "collapse alarms")
    logging: LoggingConfig = section(LoggingConfig, "metric sinks")
    warm_start: WarmStartConfig = section(WarmStartConfig, "supervised warm start before RL")
    perception: PerceptionConfig = section(PerceptionConfig, "pretraining to read the images")


def valid_keys(schema: type = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, e.g. 'algo.filter.keep'."""
    keys = []
    for f in fields(schema):
        key = prefix + f.name
        keys.append(key)
        if f.default_factory is not MISSING and is_dataclass(sub := f.default_factory()):
            keys += valid_keys(type(sub), key + ".")
    return keys


def _unknown_key_error(key: str) -> ConfigError:
    for old, replacement in REMOVED_KEYS.items():
        if key == old or key.startswith(old + "."):
            return ConfigError(f"unknown config key '{key}': {replacement}")
    matches = difflib.get_close_matches(key, valid_keys(), n=1, cutoff=0.6)
    hint = f" (did you mean '{matches[0]}'?)" if matches else ""
    return ConfigError(f"unknown config key '{key}'{hint}")


def _dotted_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key set in a YAML / override layer."""
    if not isinstance(node, DictConfig):
        return [prefix.rstrip(".")] if prefix else []
    return [k for name in node for k in _dotted_keys(node._get_node(name), f"{prefix}{name}.")]


def _check_removed(layer: DictConfig) -> None:
    """A key of an older recipe stops with its replacement, named with the full key the user wrote."""
    for key in _dotted_keys(layer):
        if not key.startswith("env.env_kwargs.") and any(
            key == old or key.startswith(old + ".") for old in REMOVED_KEYS
        ):
            raise _unknown_key_error(key)


def _first_line(err: Exception) -> str:
    lines = str(getattr(err, "msg", err)).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _config_error(err: OmegaConfBaseException) -> ConfigError:
    """One line naming the key behind an OmegaConf error."""
    key = str(getattr(err, "full_key", "") or "")
    if isinstance(err, ConfigKeyError):
        return _unknown_key_error(key)
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(f"missing required config value '{key}'")
    if isinstance(err, ValidationError):
        return ConfigError(f"bad value for config key '{key}': {_first_line(err)}")
    return ConfigError(f"config error at '{key}': {_first_line(err)}")


def _parse_override(item: str) -> DictConfig:
    if "=" not in item:
        raise ConfigError(f"override '{item}' must look like key=value, e.g. trainer.steps=50")
    try:
        return OmegaConf.from_dotlist([item])
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(f"cannot parse override '{item}': {_first_line(err)}") from None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Schema defaults <- YAML file <- `key=value` overrides; typed, validated RunConfig.

    `trainer.run_dir` defaults to runs/<YAML file stem> (runs/default without a file).
    """
    layers: list[tuple[str, DictConfig]] = []  # (where it comes from, its keys)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = OmegaConf.load(path)
        except (yaml.YAMLError, OmegaConfBaseException) as err:
            raise ConfigError(f"cannot parse {path}: {_first_line(err)}") from None
        if not isinstance(loaded, DictConfig):
            raise ConfigError(f"{path} must hold a mapping of sections (model, env, rollout, algo, ...)")
        layers.append((str(path), loaded))
    layers += [(f"override '{item}'", _parse_override(item)) for item in overrides]
    merged = OmegaConf.structured(RunConfig)
    for _, layer in layers:
        _check_removed(layer)
    try:
        for source, layer in layers:
            try:
                merged = OmegaConf.merge(merged, layer)
            except OmegaConfBaseException:
                raise
            except (TypeError, ValueError) as err:  # e.g. a list where a section or mapping belongs
                raise ConfigError(f"cannot apply {source}: {_first_line(err)}") from None
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"missing required config value '{missing[0]}'")
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _config_error(err) from None
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


RANGE_CHECKS = {
    "ge": (lambda v, b: v >= b, ">="),
    "gt": (lambda v, b: v > b, ">"),
    "le": (lambda v, b: v <= b, "<="),
    "lt": (lambda v, b: v < b, "<"),
}


def _check_value(key: str, value: Any, metadata: dict) -> None:
    """Finite numbers (also inside dicts and lists), and the field's declared choices and range."""
    if isinstance(value, dict):
        for name, item in value.items():
            _check_value(f"{key}.{name}", item, {})
        return
    if isinstance(value, list):
        _require("length" not in metadata or len(value) == metadata["length"], key,
                 f"needs {metadata.get('length')} values, got {value}")  # fmt: skip
        for item in value:
            _check_value(key, item, {k: v for k, v in metadata.items() if k != "length"})
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, float):
        _require(math.isfinite(value), key, f"must be a finite number, got {value}")
    if "choices" in metadata:
        _require(value in metadata["choices"], key, f"'{value}' is not one of {metadata['choices']}")
    for check, (holds, symbol) in RANGE_CHECKS.items():
        if check in metadata:
            _require(holds(value, metadata[check]), key, f"must be {symbol} {metadata[check]}, got {value}")


def check_fields(section: Any, prefix: str = "") -> None:
    """Every field of `section` (recursively) against its metadata: one loop for all choices and ranges."""
    for f in fields(section):
        value = getattr(section, f.name)
        if is_dataclass(value):
            check_fields(value, f"{prefix}{f.name}.")
        else:
            _check_value(prefix + f.name, value, f.metadata)


def validate(cfg: RunConfig) -> None:
    """Field checks from metadata, then the few checks across fields that need no registry."""
    check_fields(cfg)
    rollout, trainer = cfg.rollout, cfg.trainer
    for key in ("loss_spans", "adv_spans"):
        spans = getattr(rollout, key)
        _require(
            spans == "all" or (isinstance(spans, list) and spans and "all" not in spans),
            f"rollout.{key}",
            f"must be 'all' or a non-empty list of {SPAN_NAMES}, got {spans!r}",
        )
    _require(
        cfg.algo.filter.keep == 1.0 or rollout.group_size >= 2,
        "rollout.group_size",
        f"the group filter (algo.filter.keep={cfg.algo.filter.keep}) ranks groups by the spread of their "
        f"returns, which a group of {rollout.group_size} does not have: set rollout.group_size >= 2",
    )
    _require(
        rollout.chat_template is None or Path(rollout.chat_template).is_file(),
        "rollout.chat_template",
        f"file not found: {rollout.chat_template}",
    )
    _require(
        trainer.resume in ("none", "auto") or Path(trainer.resume).is_dir(),
        "trainer.resume",
        f"'{trainer.resume}' is neither none, auto nor an existing checkpoint folder",
    )
    _require(Path(trainer.deepspeed).is_file(), "trainer.deepspeed", f"file not found: {trainer.deepspeed}")
    _require(
        not (cfg.env.text_only and cfg.perception.enabled),
        "perception.enabled",
        "perception pretraining reads the env's images, but env.text_only is true",
    )


def to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML (saved in the run folder)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def as_dict(cfg: RunConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg))
