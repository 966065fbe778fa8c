"""Warm starts by supervised fine-tuning on teacher-played conversations.

    python -m vagen.sft --config configs/frozenlake_tiny.yaml [--teacher TEACHER] [--out DIR]

TEACHER: random | describe | grid | solver | planner (below; default sft.teacher).

1. Play `episodes` LanguageEnv episodes on training levels (the run's seed schedule, seeded by
   sft.seed so that RL runs of any seed share the warm start; validation layouts stay held out) with a
   teacher writing the replies:
   - `random` (the FORMAT warm start): 1..K random valid actions, generic reasoning text and, in the
     grounding / world-modeling formats, state facts with random content (the sentence form only).
     It teaches the reply format and nothing about the game.
   - `describe` (the GROUNDED warm start): the same random actions, with the TRUE state facts in
     <observation> / <prediction> -- it can say what it sees, not how to play.
   - `grid` (the GRID warm start): the same random actions, with the TRUE state written as the env's
     text grid (cells spaced apart: `cell_grid`) in <think> (free_think) or <observation> /
     <prediction>: the policy then reads the state from its own text, as a text-mode policy would.
   - `solver`: the env's optimal actions from the current state (`env.unwrapped.optimal_actions`: BFS on
     FrozenLake, the Sokoban solver), with the true state facts (envs_visual.facts.facts_to_sentence) in
     <observation> / <prediction>. An imitation baseline.
   - `planner`: on slippery FrozenLake, one move of the optimal policy for the whole step budget (value
     iteration on the true transition model, `env.unwrapped.optimal_plan`); elsewhere the solver's.
     Imitating it shows what the policy can learn from the best possible targets on training levels.
2. Assemble them with the RL rollout's own code (vagen.rollout.assembly.EpisodeAssembler: same chat
   template, window, loss mask); the replies are tokenised from the teacher's text.
3. Train with AdamW on the masked token cross-entropy
       loss = - sum_{b,i} M^loss[b,i] log p(x[b,i] | x[b,<i]) / sum_{b,i} M^loss[b,i]
   over mini-batches of rows of similar length, redrawn every epoch (rows of one length are shuffled, so
   a batch does not hold one episode's consecutive turns). One process, no DeepSpeed: the tiny model's
   SFT takes minutes on a CPU; for a large checkpoint use the RL trainer's DeepSpeed stack instead.
4. Evaluate on the validation levels (success with a Wilson CI, reply-format rate), and write the
   model + processor (save_pretrained) to `$VAGEN_CACHE/sft/<teacher>-<key>`, the key hashing the base
   model, teacher, env and rollout config, this config (less NOT_IN_CACHE_KEY) and the training
   procedure's version (TRAINING_PROCEDURE): a second call with the same inputs is instant.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from envs_visual.facts import RELATIONS, facts_to_sentence
from envs_visual.language import PROMPT_FORMATS, LanguageEnv, separate_cells
from vagen.models.loading import load_policy
from vagen.models.scoring import token_logprobs
from vagen.models.tiny import cache_root, resolve_model_path
from vagen.rollout.assembly import ChatCodec, Segment
from vagen.rollout.batch import EpisodeRecord, RolloutBatch, build_batch
from vagen.rollout.config import EnvConfig, RolloutConfig
from vagen.rollout.engines.base import make_engine
from vagen.rollout.evaluate import EvalSummary, evaluate
from vagen.rollout.manager import (
    RolloutManager,
    check_random_start,
    episode_assembler,
    make_language_env,
    read_chat_template,
    seed_schedule,
)
from vagen.rollout.seeds import EpisodeSeeds

# model.warm_start -> teacher
WARM_START_TEACHERS = {"format": "random", "grounded": "describe", "grid": "grid", "solver": "solver"}
REPORT_FILE = "sft_report.json"
# Generic text of the format warm start's <reasoning> (and the solver's fallback when a state has no
# facts): one fixed sentence, which says nothing about any game state.
GENERIC_REASONING = "Let me decide my next moves."
GENERIC_OBSERVATION = "I look at the current state of the game."
GENERIC_PREDICTION = "After my moves the state will change."


@dataclass
class SFTConfig:
    """Supervised warm start: teacher, data size and the AdamW schedule.

    The defaults (measured on visual FrozenLake 4x4, configs/frozenlake_tiny.yaml, 2 idle CPU cores):
    the format warm start answers in format 0.99 of the turns when sampling at T=1, success 0/64 like
    the random policy, in ~100 s. 200 steps gave 0.95; lr 1e-3 with varied reasoning text 0.28.
    Imitating a decision (the `planner` on slippery FrozenLake, 768 episodes, 3,000 steps) needs
    sft.lr=1e-3: held-out greedy success 0.289 (optimum 0.307) where 2e-3 gives 0.168.
    """

    teacher: str = field(
        default="random",
        metadata={
            "help": "random (format warm start: random valid actions, generic text, random facts) | "
            "describe (the same with the true state facts) | grid (the same with the true text grid) | "
            "solver (optimal actions, true facts) | planner (slippery FrozenLake's optimal policy)"
        },
    )
    episodes: int = field(default=256, metadata={"help": "teacher-played episodes (training levels)"})
    steps: int = field(default=400, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=16, metadata={"help": "rows (conversations) per optimizer step"})
    lr: float = field(default=2e-3, metadata={"help": "AdamW peak learning rate"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98], metadata={"help": "AdamW betas"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW decoupled weight decay"})
    warmup_steps: int = field(default=20, metadata={"help": "linear LR warm-up steps, then cosine decay"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final LR as a fraction of the peak"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the gradient norm to this"})
    micro_batch_size: int = field(default=16, metadata={"help": "rows per forward/backward"})
    eval_levels: int = field(default=64, metadata={"help": "validation levels evaluated after training"})
    eval_before: bool = field(
        default=False,
        metadata={"help": "also evaluate the base model (slow when it rambles to max_new_tokens)"},
    )
    eval_temperature: float | None = field(
        default=None, metadata={"help": "sampling temperature of the evaluation; None = rollout.temperature"}
    )
    seed: int = field(
        default=0, metadata={"help": "seed of the teacher, its levels, the data order and torch"}
    )
    random_start: float = field(
        default=0.0,
        metadata={
            "help": "exploring starts: share of teacher episodes that start off the level's start (as "
            "rollout.random_start), for more varied states; evaluation starts on the level's start"
        },
    )
    cache_dir: str = field(default="", metadata={"help": "where warm starts are kept; '' = $VAGEN_CACHE/sft"})

    def __post_init__(self) -> None:
        if self.teacher not in TEACHERS:
            raise ValueError(f"sft.teacher must be one of {sorted(TEACHERS)}, got {self.teacher!r}")
        if not 0.0 <= self.random_start <= 1.0:
            raise ValueError(f"sft.random_start must lie in [0, 1], got {self.random_start}")
        for name in ("episodes", "steps", "batch_size", "micro_batch_size", "eval_levels"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class SFTResult:
    """Where the warm start is, and what it measured (rates over the validation levels)."""

    model_dir: Path
    report: dict


# ----------------------------------------------------------------------------------------------
# teachers


def random_facts(game, rng: np.random.Generator) -> str:
    """A state description in the facts' sentence form with random content: each of the game's objects
    (those of `example_facts`) with one or two random relations. Teaches the form, not the state."""
    objects = list(dict.fromkeys(name for name, _ in game.example_facts))
    facts = []
    for name in objects:
        count = int(rng.integers(1, 3))
        facts += [(name, RELATIONS[i]) for i in sorted(rng.choice(len(RELATIONS), count, replace=False))]
    return facts_to_sentence(facts)


def random_actions(game, max_actions: int, rng: np.random.Generator) -> list[int]:
    """1..max_actions uniformly random action ids."""
    return rng.integers(len(game.action_names), size=int(rng.integers(1, max_actions + 1))).tolist()


def random_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
    """Random actions, generic reasoning, and random (not true) state facts in <observation> /
    <prediction>: the format warm start teaches how to answer, not what is true."""
    actions = random_actions(game, max_actions, rng)
    return actions, {
        "observation": random_facts(game, rng),
        "reasoning": GENERIC_REASONING,
        "prediction": random_facts(game, rng),
    }


def describe_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
    """Random actions as the format teacher's, with the TRUE state facts in <observation> / <prediction>:
    a model that can say what it sees but has no idea how to play (the analogue of a pretrained VLM)."""
    actions = random_actions(game, max_actions, rng)
    return actions, {
        "observation": facts_to_sentence(game.describe_state()) or GENERIC_OBSERVATION,
        "reasoning": GENERIC_REASONING,
        "prediction": facts_to_sentence(predicted_facts(game, actions)) or GENERIC_PREDICTION,
    }


def cell_grid(game) -> str:
    """The env's text grid with the cells of a row separated by spaces (`P F F F`): no token of the
    shipped tokenizer spans two cells, whose merges ("FFFH") would otherwise hide the columns."""
    return separate_cells(game.text_grid(), " ")


def grid_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
    """Random actions, with the TRUE grid (`cell_grid`) as the whole <think> (free_think) or in
    <observation>, and the grid after the actions in <prediction>."""
    actions = random_actions(game, max_actions, rng)
    grid = cell_grid(game)
    return actions, {
        "think": grid,
        "observation": grid,
        "reasoning": GENERIC_REASONING,
        "prediction": cell_grid(played_copy(game, actions)),
    }


def solver_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
    """The env's optimal actions from the current state, and the true state facts before and after."""
    actions = game.optimal_actions(max_actions) or [int(rng.integers(len(game.action_names)))]  # stuck
    return actions, {
        "observation": facts_to_sentence(game.describe_state()) or GENERIC_OBSERVATION,
        "reasoning": "I follow the shortest path to my goal.",
        "prediction": facts_to_sentence(predicted_facts(game, actions)) or GENERIC_PREDICTION,
    }


def planner_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
    """On slippery ice, one move of the optimal policy for the episode's whole step budget (`optimal_plan`:
    value iteration on the true transition model; it may step away from a hole instead of along the
    shortest path), with the true state facts; elsewhere the solver's moves, optimal when moves are
    deterministic. The same move in a cell whatever the steps left: the image does not show them, and
    with few steps left the finite-horizon policy's ties (every move fails in time) are arbitrary."""
    if not getattr(game, "is_slippery", False):
        return solver_teacher(game, max_actions, rng)
    row, col = game.player
    action = game.optimal_plan(game.max_steps).action(row * game.size + col, game.max_steps)
    return [action], {
        "observation": facts_to_sentence(game.describe_state()) or GENERIC_OBSERVATION,
        "reasoning": "I take the move most likely to reach my goal in time.",
        "prediction": facts_to_sentence(predicted_facts(game, [action])) or GENERIC_PREDICTION,
    }


TEACHERS = {
    "random": random_teacher,
    "describe": describe_teacher,
    "grid": grid_teacher,
    "solver": solver_teacher,
    "planner": planner_teacher,
}


def teacher_reply(env: LanguageEnv, teacher: str, max_actions: int, rng: np.random.Generator) -> str:
    """The teacher's reply in the env's prompt format, with 1..`max_actions` actions."""
    actions, texts = TEACHERS[teacher](env.env.unwrapped, max_actions, rng)
    answer = f"<answer>{', '.join(env.action_names[a] for a in actions)}</answer>"
    think_parts = PROMPT_FORMATS[env.prompt_format].think_parts
    if think_parts is None:
        return answer
    if not think_parts:  # free_think: free text
        return f"<think>{texts.get('think', texts['reasoning'])}</think>{answer}"
    inner = "".join(f"<{tag}>{texts[tag]}</{tag}>" for tag in think_parts)
    return f"<think>{inner}</think>{answer}"


def played_copy(game, actions: list[int]):
    """A copy of the game after `actions` (until the episode ends; slips drawn from the copy's RNG)."""
    future = copy.deepcopy(game)
    for action in actions:
        _, _, terminated, truncated, _ = future.step(action)
        if terminated or truncated:
            break
    return future


def predicted_facts(game, actions: list[int]) -> list[tuple[str, str]]:
    """describe_state() after playing `actions` on a copy of the game."""
    return played_copy(game, actions).describe_state()


def play_teacher_episodes(
    env_cfg: EnvConfig,
    rollout_cfg: RolloutConfig,
    codec: ChatCodec | None,
    episode_seeds: list[EpisodeSeeds],
    teacher: str,
    seed: int,
    random_start: float = 0.0,
) -> tuple[list[EpisodeRecord], list[list[Segment]]]:
    """One teacher-played episode per entry with the rollout's action budget and episode ends; with a
    codec, each is also assembled like RolloutManager.collect (same template, window and masks), the
    replies tokenised from the teacher's text; `random_start` as the env's reset option. Returns the
    episodes and their rows (segments)."""
    rng = np.random.default_rng(seed)
    env = make_language_env(env_cfg)
    records, segments = [], []
    for seeds in episode_seeds:
        assembler = episode_assembler(codec, env, rollout_cfg.window)
        record = EpisodeRecord(seeds.group, seeds.member, seeds.level, seeds.dynamics)
        options = {"dynamics_seed": seeds.dynamics, "random_start": random_start}
        observation, _ = env.reset(seed=seeds.level, options=options)
        for _ in range(rollout_cfg.max_turns):
            if codec is not None:
                pending = assembler.prepare(observation.text, observation.images)
                if pending.prompt_length + rollout_cfg.max_new_tokens > rollout_cfg.max_context_tokens:
                    assembler.withdraw()
                    break
                assembler.commit(pending)
            budget = min(
                env_cfg.max_actions_per_turn, rollout_cfg.max_actions_per_episode - record.num_actions
            )
            env.max_actions_per_turn = budget
            reply = teacher_reply(env, teacher, budget, rng)
            observation, reward, terminated, truncated, info = env.step(reply)
            if codec is not None:
                token_ids = codec.tokenizer.encode(reply, add_special_tokens=False) + codec.stop_token_ids
                assembler.add_reply(token_ids, [0.0] * len(token_ids), stopped=True)
                spans = info["parse"].spans
                assembler.finish_turn(reward, spans, rollout_cfg.loss_spans, rollout_cfg.adv_spans)
            record.num_actions += len(info["actions_executed"])
            record.success = bool(info["success"])
            record.episode_return += reward
            if terminated or truncated or record.num_actions >= rollout_cfg.max_actions_per_episode:
                break
        records.append(record)
        segments.append(assembler.segments)
    return records, segments


def teacher_success(
    env_cfg: EnvConfig, rollout_cfg: RolloutConfig, seeds: list[EpisodeSeeds], teacher: str
) -> float:
    """Success rate of the teacher itself on the given levels (the random-policy / solver reference)."""
    records, _ = play_teacher_episodes(env_cfg, rollout_cfg, None, seeds, teacher, seed=1)
    return float(np.mean([record.success for record in records]))


def optimal_success(
    env_cfg: EnvConfig, rollout_cfg: RolloutConfig, seeds: list[EpisodeSeeds]
) -> float | None:
    """Mean over the levels of the optimal policy's success within the action budget (value iteration on
    the true slippery model, `optimal_plan`); None for envs without one (Sokoban is deterministic:
    its optimum is 1 on every generated level)."""
    env = make_language_env(env_cfg).env
    if not hasattr(env.unwrapped, "optimal_plan"):
        return None
    horizon = min(rollout_cfg.max_actions_per_episode, env.unwrapped.max_steps)
    rates = []
    for level in sorted({s.level for s in seeds}):
        env.reset(seed=level)
        rates.append(env.unwrapped.optimal_plan(horizon).success[horizon, env.unwrapped.start_state])
    return float(np.mean(rates))


# ----------------------------------------------------------------------------------------------
# training


def length_batches(lengths: list[int], batch_size: int, generator: np.random.Generator) -> list[list[int]]:
    """One epoch of row indices: shuffled, stably sorted by length (rows of equal length stay shuffled,
    so a batch does not hold one episode's consecutive turns), cut into batches of `batch_size` (the last
    may be smaller), the batches in random order."""
    shuffled = generator.permutation(len(lengths)).tolist()
    order = sorted(shuffled, key=lambda i: lengths[i])
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in generator.permutation(len(batches))]


def masked_nll(model, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """Mean negative log-likelihood of the loss-masked tokens (formula in the module docstring)."""
    logp, _ = token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.vision, micro_batch_size, with_entropy=False
    )  # (B, L)
    mask = batch.loss_mask.float()
    return -(logp * mask).sum() / mask.sum().clamp(min=1.0)


def lr_factor(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to 1, then cosine decay to `min_lr_ratio` at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def train_sft(model, data: RolloutBatch, cfg: SFTConfig, log=print) -> list[float]:
    """AdamW on the masked NLL; each step one length-bucketed mini-batch, every row once per epoch and
    the batches drawn afresh each epoch. Returns the loss of every step."""
    generator = np.random.default_rng(cfg.seed)
    lengths = data.attention_mask.sum(dim=1).tolist()
    epoch: list[list[int]] = []
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    model.train()
    losses = []
    for step in range(cfg.steps):
        if not epoch:
            epoch = length_batches(lengths, cfg.batch_size, generator)
        batch = data.select(epoch.pop())
        loss = masked_nll(model, batch, cfg.micro_batch_size)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == cfg.steps - 1:
            log(f"sft step {step:4d}  loss {loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}")
    model.eval()
    return losses


# ----------------------------------------------------------------------------------------------
# evaluation, cache and the whole warm start


def evaluate_policy(
    model, processor, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, sft_cfg: SFTConfig
) -> EvalSummary:
    """Success (Wilson CI) and format errors on the first `eval_levels` validation levels, one try each."""
    manager = RolloutManager(env_cfg, rollout_cfg, make_engine("hf", model, processor), processor)
    summary, _ = evaluate(manager, sft_cfg.eval_levels, 1, sft_cfg.eval_temperature)
    return summary


def describe(summary: EvalSummary) -> dict[str, float]:
    return {
        "success": summary.success_rate,
        "success_ci": [summary.success_ci_low, summary.success_ci_high],
        "format_ok": 1.0 - summary.format_error_rate,
        "invalid_action_rate": summary.invalid_action_rate,
        **({} if summary.grounding_f1 is None else {"grounding_f1": summary.grounding_f1}),
    }


# Fields that change neither the teacher's conversations nor the training: reward weights (the loss is
# cross-entropy; only the report's mean return is in the rewards of the run that built the cache), the
# RL rollout's engine and batch shape, and where the cache lives.
NOT_IN_CACHE_KEY = {
    "env": {
        "format_reward",
        "format_penalty",
        "grounding_reward_weight",
        "worldmodel_reward_weight",
        "template_penalty",
        "template_score_threshold",
    },
    # levels follow sft.seed (run_sft); teacher episodes take sft.random_start, not the RL run's
    "rollout": {"engine", "num_groups", "group_size", "seed", "random_start"},
    "sft": {"cache_dir"},
}


# Part of every cache key: bumped when train_sft's procedure changes, so that models cached by an older
# one are rebuilt. 2 (2026-12-04): mini-batches from shuffled rows, redrawn every epoch.
TRAINING_PROCEDURE = 2


def inputs_key(model_path: Path, configs: dict) -> str:
    """16 hex digits of sha256 over the base model (its path, config and weight files' names and sizes,
    not a report written beside them), `configs` (JSON-able, dataclass values as str) and
    TRAINING_PROCEDURE."""
    model_files = sorted(
        (p.name, p.stat().st_size) for p in model_path.iterdir() if p.is_file() and p.name != REPORT_FILE
    )
    payload = {
        **configs,
        "model": [str(model_path), (model_path / "config.json").read_text(), model_files],
        "training_procedure": TRAINING_PROCEDURE,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_key(model_path: Path, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, sft_cfg: SFTConfig) -> str:
    """inputs_key over the base model and the env, rollout and SFT configs, less NOT_IN_CACHE_KEY."""
    configs = {"env": env_cfg, "rollout": rollout_cfg, "sft": sft_cfg}
    return inputs_key(
        model_path,
        {
            name: {k: v for k, v in asdict(cfg).items() if k not in NOT_IN_CACHE_KEY[name]}
            for name, cfg in configs.items()
        },
    )


def cache_folder(sft_cfg: SFTConfig, key: str) -> Path:
    root = Path(sft_cfg.cache_dir) if sft_cfg.cache_dir else cache_root() / "sft"
    return root / f"{sft_cfg.teacher}-{key}"


def warm_start_dir(
    model_path: str, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, sft_cfg: SFTConfig
) -> Path:
    """The cache folder this warm start is (or will be) written to."""
    return cache_folder(sft_cfg, cache_key(resolve_model_path(model_path), env_cfg, rollout_cfg, sft_cfg))


def run_sft(
    model_path: str,
    env_cfg: EnvConfig,
    rollout_cfg: RolloutConfig,
    sft_cfg: SFTConfig,
    out_dir: str | Path | None = None,
    log=print,
) -> SFTResult:
    """The whole warm start (module docstring); returns the cached result when it exists."""
    # its levels and dynamics follow sft.seed, not the RL run's seed: RL seeds share one warm start
    rollout_cfg = replace(rollout_cfg, seed=sft_cfg.seed)
    check_random_start(env_cfg, sft_cfg.random_start, "sft.random_start")
    key = cache_key(resolve_model_path(model_path), env_cfg, rollout_cfg, sft_cfg)
    target = Path(out_dir) if out_dir is not None else cache_folder(sft_cfg, key)
    if (target / REPORT_FILE).is_file():
        report = json.loads((target / REPORT_FILE).read_text())
        if report.get("cache_key") == key:  # an --out folder may hold another warm start
            log(f"warm start cached: {target}")
            return SFTResult(target, report)
    started = time.perf_counter()
    torch.manual_seed(sft_cfg.seed)
    model, processor = load_policy(model_path)
    codec = ChatCodec(processor, read_chat_template(rollout_cfg.chat_template))
    seeds = seed_schedule(env_cfg, rollout_cfg)  # the run's seeds: validation layouts held out
    train_seeds = seeds.next_train(sft_cfg.episodes, 1)
    records, segments = play_teacher_episodes(
        env_cfg, rollout_cfg, codec, train_seeds, sft_cfg.teacher, sft_cfg.seed, sft_cfg.random_start
    )
    data = build_batch(segments, records, codec.pad_token_id)
    val_seeds = seeds.validation(sft_cfg.eval_levels, 1)
    references = {t: teacher_success(env_cfg, rollout_cfg, val_seeds, t) for t in TEACHERS}
    references["optimal"] = optimal_success(env_cfg, rollout_cfg, val_seeds)
    data_seconds = time.perf_counter() - started
    log(
        f"sft data: {len(data.episodes)} {sft_cfg.teacher}-teacher episodes, {len(data)} rows, "
        f"{int(data.loss_mask.sum())} loss tokens ({data_seconds:.1f}s); teacher success on validation: "
        + ", ".join(f"{t} {rate}" for t, rate in references.items())
    )
    before = (
        describe(evaluate_policy(model, processor, env_cfg, rollout_cfg, sft_cfg))
        if sft_cfg.eval_before
        else None
    )
    start_train = time.perf_counter()
    losses = train_sft(model, data, sft_cfg, log)
    train_seconds = time.perf_counter() - start_train
    after = describe(evaluate_policy(model, processor, env_cfg, rollout_cfg, sft_cfg))
    report = {
        "cache_key": key,
        "teacher": sft_cfg.teacher,
        "base_model": str(model_path),
        "before": before,
        "after": after,
        "teacher_success": references,
        "teacher_success_on_data": float(np.mean([record.success for record in records])),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": {"data": data_seconds, "train": train_seconds, "total": time.perf_counter() - started},
        "sft": asdict(sft_cfg),
    }
    log(f"sft before: {before}\nsft after:  {after}")
    save_atomically(model, processor, report, target)
    return SFTResult(target, report)


def save_atomically(model, processor, report: dict, target: Path) -> None:
    """save_pretrained into a temporary sibling folder, then rename (a half-written model never shows)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2))
        if target.exists():  # an --out folder without a finished warm start in it
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def start_model(cfg, log=print) -> str:
    """The base the warm start builds on: `cfg.model.path`, or its perception-pretrained copy (cached,
    vagen.perception) when `cfg.perception.enabled`."""
    if not cfg.perception.enabled:
        return cfg.model.path
    from vagen.perception import perception_model  # it imports this module

    return perception_model(cfg.model.path, cfg.env, cfg.rollout, cfg.perception, log)


def warm_start_model(cfg, log=print) -> str:
    """The policy checkpoint a run starts from: `start_model(cfg)` itself when `cfg.model.warm_start` is
    "none", else the (cached) warm start of it with teacher WARM_START_TEACHERS[warm_start] and `cfg.sft`.
    `cfg` is a vagen.config.RunConfig. With several ranks, call it on rank 0 first, then barrier, then
    on the others (they hit the cache)."""
    base = start_model(cfg, log)
    if cfg.model.warm_start == "none":
        return base
    sft_cfg = SFTConfig(**{**asdict(cfg.sft), "teacher": WARM_START_TEACHERS[cfg.model.warm_start]})
    return str(run_sft(base, cfg.env, cfg.rollout, sft_cfg, log=log).model_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML run config (configs/*.yaml)")
    parser.add_argument("--teacher", choices=sorted(TEACHERS), default=None, help="overrides sft.teacher")
    parser.add_argument("--out", default=None, help="write the model here instead of the cache")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.steps=300")
    args = parser.parse_args(argv)
    from vagen.config import load_config_or_exit  # here: vagen.config imports SFTConfig from us

    cfg = load_config_or_exit(args.config, args.overrides)
    sft_cfg = cfg.sft if args.teacher is None else SFTConfig(**{**asdict(cfg.sft), "teacher": args.teacher})
    result = run_sft(start_model(cfg), cfg.env, cfg.rollout, sft_cfg, args.out)
    print(json.dumps({"model_dir": str(result.model_dir), **result.report}, indent=2))


if __name__ == "__main__":
    main()
