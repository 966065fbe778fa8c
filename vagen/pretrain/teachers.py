"""Teachers: scripted players whose episodes the warm start imitates (vagen.pretrain.sft).

A teacher writes a reply for the current state of an env: actions and the texts of the prompt format's
<think> parts. `warm_start.teacher` names one of TEACHERS:
- `format`: 1..K random valid actions, generic reasoning text and, in the grounding / world-modeling
  formats, state facts with random content (the sentence form only). It teaches the reply format and
  nothing about the game.
- `grounded`: the same random actions, with the TRUE state facts in <observation> / <prediction>: it can
  say what it sees, not how to play.
- `grid`: the same random actions, with the TRUE state written as the env's text grid (cells spaced
  apart: `cell_grid`) in <think> (free_think) or <observation> / <prediction>.
- `solver`: the env's optimal actions from the current state (`env.unwrapped.optimal_actions`: BFS on
  FrozenLake and MiniGrid, the Sokoban solver), with the true state facts. An imitation baseline.
- `planner`: where moves are random, the env's `planned_action()` (slippery FrozenLake: one move of the
  optimal policy for the whole step budget, by value iteration); elsewhere the solver's.
`TEACHER_NEEDS` names the env method (docs/envs.md) each teacher calls.
`play_teacher_episodes` plays them with the RL rollout's own budgets, template, window and masks.
"""

from __future__ import annotations

import copy

import numpy as np

from envs_visual.facts import RELATIONS, facts_to_sentence
from envs_visual.language import PROMPT_FORMATS, LanguageEnv, separate_cells
from vagen.config import EnvConfig, RolloutConfig
from vagen.rollout.assembly import ChatCodec, Segment
from vagen.rollout.batch import EpisodeRecord
from vagen.rollout.manager import episode_assembler, make_language_env
from vagen.rollout.seeds import EpisodeSeeds

# Generic text of the format teacher's <reasoning> (and the solver's fallback when a state has no
# facts): one fixed sentence, which says nothing about any game state.
GENERIC_REASONING = "Let me decide my next moves."
GENERIC_OBSERVATION = "I look at the current state of the game."
GENERIC_PREDICTION = "After my moves the state will change."


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


def format_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
    """Random actions, generic reasoning, and random (not true) state facts in <observation> /
    <prediction>: the format warm start teaches how to answer, not what is true."""
    actions = random_actions(game, max_actions, rng)
    return actions, {
        "observation": random_facts(game, rng),
        "reasoning": GENERIC_REASONING,
        "prediction": random_facts(game, rng),
    }


def grounded_teacher(game, max_actions: int, rng: np.random.Generator) -> tuple[list[int], dict[str, str]]:
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
    """Where the env's moves are random (slippery ice), its `planned_action()`: one move of the optimal
    policy for the episode's whole step budget (it may step away from a hole instead of along the shortest
    path), with the true state facts; elsewhere (`planned_action` missing or None) the solver's moves,
    optimal when moves are deterministic."""
    planned_action = getattr(game, "planned_action", None)
    action = None if planned_action is None else planned_action()
    if action is None:
        return solver_teacher(game, max_actions, rng)
    return [action], {
        "observation": facts_to_sentence(game.describe_state()) or GENERIC_OBSERVATION,
        "reasoning": "I take the move most likely to reach my goal in time.",
        "prediction": facts_to_sentence(predicted_facts(game, [action])) or GENERIC_PREDICTION,
    }


# teacher -> the optional env method it calls (envs_visual.contract); teachers not named need none
TEACHER_NEEDS = {"grounded": "describe_state", "solver": "optimal_actions", "planner": "optimal_actions"}
TEACHERS = {
    "format": format_teacher,
    "grounded": grounded_teacher,
    "grid": grid_teacher,
    "solver": solver_teacher,
    "planner": planner_teacher,
}


def teacher_available(game, teacher: str) -> bool:
    """Whether the unwrapped env offers what `teacher` calls (TEACHER_NEEDS)."""
    need = TEACHER_NEEDS.get(teacher)
    return need is None or hasattr(game, need)


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
) -> tuple[list[EpisodeRecord], list[list[Segment]]]:
    """One teacher-played episode per entry with the rollout's action budget and episode ends; with a
    codec, each is also assembled like RolloutManager.collect (same template and window), the replies
    tokenised from the teacher's text and every reply token in the loss: the warm start imitates the whole
    reply, whichever spans `rollout.loss_spans` gives RL. Returns the episodes and their rows (segments)."""
    rng = np.random.default_rng(seed)
    env = make_language_env(env_cfg, local=True)
    records, segments = [], []
    for seeds in episode_seeds:
        assembler = episode_assembler(codec, env, rollout_cfg.window)
        record = EpisodeRecord(seeds.group, seeds.member, seeds.level, seeds.dynamics)
        observation, _ = env.reset(seed=seeds.level, options={"dynamics_seed": seeds.dynamics})
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
                assembler.finish_turn(reward, {}, "all", "all")
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
    """Mean over the levels of the optimal policy's success within the action budget (the env's
    `optimal_success(horizon)`, e.g. value iteration on slippery FrozenLake's true model); None for envs
    without one."""
    env = make_language_env(env_cfg, local=True).env
    if not hasattr(env.unwrapped, "optimal_success"):
        return None
    horizon = min(rollout_cfg.max_actions_per_episode, env.unwrapped.max_steps)
    rates = []
    for level in sorted({s.level for s in seeds}):
        env.reset(seed=level)
        rates.append(env.unwrapped.optimal_success(horizon))
    return float(np.mean(rates))
