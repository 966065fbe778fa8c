"""Configuration of the environments and of the StarPO rollout (composed into vagen/config.py)."""

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from envs_visual.language import INSTRUCTION_STYLES

SPAN_NAMES = ("think", "observation", "reasoning", "prediction", "answer")


@dataclass
class EnvConfig:
    """One environment family played through the language layer (envs_visual.language.LanguageEnv)."""

    env_id: str = field(
        default="envs_visual/FrozenLake-v0",
        metadata={"help": "gymnasium id, e.g. envs_visual/Sokoban-v0 or envs_visual/FrozenLake-v0"},
    )
    env_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "keyword arguments for gymnasium.make (size, boxes, ...)"}
    )
    prompt_format: str = field(
        default="free_think",
        metadata={"help": "no_think | free_think | grounding | worldmodeling | grounding_worldmodeling"},
    )
    max_actions_per_turn: int = field(default=3, metadata={"help": "actions executed at most per reply"})
    format_reward: float = field(default=0.5, metadata={"help": "reward for a well-formed reply"})
    format_penalty: float = field(
        default=0.0, metadata={"help": "reward (<= 0) for a malformed reply; RAGEN uses -0.1"}
    )
    text_only: bool = field(default=False, metadata={"help": "text observations (grid as text), no images"})
    cell_separator: str = field(
        default="",
        metadata={
            "help": "text_only: written between a row's cells (' ' keeps one BPE token per cell; "
            "Sokoban's floor is ' ', so use e.g. '|' there)"
        },
    )
    instructions: str = field(
        default="full",
        metadata={
            "help": "full (rules, legend, actions, reply format, an example) | brief (one sentence: the "
            "game, the actions, the reply format; with instructions_in_system it is the whole system "
            "prompt): ~5x fewer prompt tokens, for models that cannot read English, like the tiny ones"
        },
    )
    instructions_in_system: bool = field(
        default=False,
        metadata={
            "help": "task instructions in the system prompt instead of the first message: with "
            "rollout.window the context then keeps only the last `window` turns (window 0: the current "
            "observation alone)"
        },
    )
    action_feedback: bool = field(
        default=True,
        metadata={
            "help": "open each turn's message with what the last reply did ('Executed actions: Up.', or "
            "why nothing ran); false: the message is the observation alone, so with rollout.window 0 "
            "the context is a function of the state (the policy cannot key its move on the last one)"
        },
    )
    grounding_reward_weight: float = field(
        default=0.0, metadata={"help": "weight of the F1 of <observation> against the true state"}
    )
    worldmodel_reward_weight: float = field(
        default=0.0, metadata={"help": "weight of the F1 of <prediction> against the true next state"}
    )
    template_penalty: float = field(
        default=0.1,
        metadata={"help": "penalty for repeating, within an episode, an identical low-scoring description"},
    )
    template_score_threshold: float = field(
        default=0.5, metadata={"help": "a repeated description scoring below this F1 is penalised"}
    )

    def __post_init__(self) -> None:
        if self.instructions not in INSTRUCTION_STYLES:
            styles, got = INSTRUCTION_STYLES, self.instructions
            raise ValueError(f"env.instructions must be one of {styles}, got {got!r}")


@dataclass
class RolloutConfig:
    """StarPO rollout: groups of episodes, turn and context budgets, sampling, masking by span."""

    num_groups: int = field(default=8, metadata={"help": "G: groups per rollout; a group shares one level"})
    group_size: int = field(default=4, metadata={"help": "n: episodes per group (same level, own dynamics)"})
    max_turns: int = field(default=5, metadata={"help": "turns (replies) per episode at most"})
    max_actions_per_episode: int = field(
        default=20, metadata={"help": "total actions executed per episode at most (action budget)"}
    )
    window: int | None = field(
        default=None,
        metadata={
            "help": "earlier turns kept in the context besides the first (it holds the task instructions "
            "unless env.instructions_in_system); None = full history (one row per episode)"
        },
    )
    max_context_tokens: int = field(
        default=4096,
        metadata={"help": "an episode ends before a turn whose prompt + reply could exceed this"},
    )
    random_start: float = field(
        default=0.0,
        metadata={
            "help": "exploring starts: share of training levels whose episodes start off the level's "
            "start (FrozenLake: a random cell that can reach the goal; Sokoban: a state on a shortest "
            "solution); validation always starts on the level's start"
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling threshold (1 = off)"})
    top_k: int = field(default=0, metadata={"help": "top-k sampling (0 = off)"})
    max_new_tokens: int = field(default=128, metadata={"help": "tokens sampled per reply at most"})
    engine: str = field(
        default="auto",
        metadata={
            "help": "generation engine: hf | vllm | auto (vllm where installed, else hf: vllm is the faster "
            "CPU engine once histories hold several images, bench/results/rollout_bench.txt)"
        },
    )
    chat_template: str | None = field(
        default=None, metadata={"help": "path to a jinja chat template overriding the processor's own"}
    )
    loss_spans: str | list[str] = field(
        default="all",
        metadata={
            "help": "tokens with policy loss: 'all' sampled tokens or a subset of " + ", ".join(SPAN_NAMES)
        },
    )
    adv_spans: str | list[str] = field(
        default="all", metadata={"help": "tokens visited by the advantage recursion: 'all' or span names"}
    )
    train_seed_start: int = field(default=0, metadata={"help": "first training level seed"})
    val_seed_start: int = field(
        default=10**9, metadata={"help": "first validation level seed; training seeds stay below it"}
    )
    holdout_val_layouts: bool = field(
        default=True,
        metadata={
            "help": "a hash of each level's layout (env.layout_key) assigns it to validation or training: "
            "no training level shows a validation map; False = plain disjoint seed ranges"
        },
    )
    val_layout_share: float = field(
        default=0.2,
        metadata={
            "help": "share of the layouts held out for validation (by hash, so both sides keep "
            "the generator's distribution of maps)"
        },
    )
    seed: int = field(default=0, metadata={"help": "base seed of sampling and env dynamics"})

    def __post_init__(self) -> None:
        if self.engine == "auto":
            self.engine = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"rollout.engine must be hf, vllm or auto, got {self.engine!r}")
        for name in ("loss_spans", "adv_spans"):
            spans = getattr(self, name)
            if spans != "all" and (isinstance(spans, str) or not set(spans) <= set(SPAN_NAMES) or not spans):
                raise ValueError(
                    f"rollout.{name} must be 'all' or a non-empty subset of {SPAN_NAMES}: {spans!r}"
                )
        if self.window is not None and self.window < 0:
            raise ValueError(f"rollout.window must be None or >= 0, got {self.window}")
        if not 0.0 <= self.random_start <= 1.0:
            raise ValueError(f"rollout.random_start must lie in [0, 1], got {self.random_start}")
        if not 0.0 < self.val_layout_share < 1.0:
            raise ValueError(f"rollout.val_layout_share must lie in (0, 1), got {self.val_layout_share}")
        if self.train_seed_start >= self.val_seed_start:
            raise ValueError(
                "rollout.train_seed_start must be below rollout.val_seed_start (disjoint ranges)"
            )
        for name in (
            "num_groups",
            "group_size",
            "max_turns",
            "max_actions_per_episode",
            "max_new_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def max_images_per_prompt(self) -> int:
        """Images one prompt can hold: one per kept turn (all turns, or the first + `window` + current)."""
        return self.max_turns if self.window is None else min(self.max_turns, self.window + 2)

    def engine_options(self) -> dict[str, int]:
        """Options of `make_engine(self.engine, ...)` that follow from these budgets: vLLM sizes its
        context and its per-prompt image limit up front; the HF engine needs none."""
        if self.engine != "vllm":
            return {}
        return {"max_model_len": self.max_context_tokens, "max_images_per_prompt": self.max_images_per_prompt}
