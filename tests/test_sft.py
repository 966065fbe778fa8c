"""Warm starts (vagen.pretrain): teacher replies, RL-identical assembly, masked-loss training, cache."""

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import envs_visual  # noqa: F401
from envs_visual.language import PROMPT_FORMATS, LanguageEnv, parse_reply
from vagen.config import EnvConfig, RolloutConfig, SupervisedOptim, WarmStartConfig
from vagen.models.loading import load_policy
from vagen.pretrain import warm_start_model
from vagen.pretrain.sft import run_sft, warm_start_dir
from vagen.pretrain.supervised import masked_nll, shuffled_batches, train_supervised
from vagen.pretrain.teachers import (
    GENERIC_REASONING,
    optimal_success,
    play_teacher_episodes,
    teacher_reply,
    teacher_success,
)
from vagen.rollout.assembly import ChatCodec
from vagen.rollout.batch import build_batch
from vagen.rollout.seeds import SeedSchedule

ENV = EnvConfig(
    env_id="envs_visual/FrozenLake-v0", env_kwargs={"size": 4, "max_steps": 10}, max_actions_per_turn=2
)
ROLLOUT = RolloutConfig(max_turns=2, max_actions_per_episode=4, max_new_tokens=24)


def language_env(prompt_format):
    env = LanguageEnv(
        gym.make("envs_visual/FrozenLake-v0"), prompt_format=prompt_format, max_actions_per_turn=3
    )
    env.reset(seed=5)
    return env


def test_teacher_replies_are_well_formed_in_every_format():
    rng = np.random.default_rng(0)
    for prompt_format in PROMPT_FORMATS:
        env = language_env(prompt_format)
        for teacher in ("format", "grounded", "grid", "solver", "planner"):
            reply = teacher_reply(env, teacher, 3, rng)
            parse = parse_reply(reply, prompt_format, env.action_names, 3)
            assert parse.format_ok, (prompt_format, teacher, reply)
            if teacher == "solver":
                optimal = [env.action_names[a] for a in env.env.unwrapped.optimal_actions(3)]
                assert parse.actions == optimal
            if prompt_format == "grounding" and teacher != "grid":  # facts; grounded, solver true ones
                assert "the player" in parse.texts["observation"]


def test_grounded_teacher_states_the_truth_and_plays_at_random():
    """The grounded warm start's teacher: its <observation> is the env's true state (F1 = 1) on every
    state, its <prediction> the state after its own actions, and its actions do not follow the state."""
    from vagen.pretrain.teachers import predicted_facts
    from vagen.rollout.reasoning import fact_f1

    openings = set()
    for seed in range(8):
        env = language_env("grounding_worldmodeling")
        env.reset(seed=seed)
        game = env.env.unwrapped
        reply = teacher_reply(env, "grounded", 3, np.random.default_rng(0))
        parse = parse_reply(reply, "grounding_worldmodeling", env.action_names, 3)
        assert fact_f1(parse.texts["observation"], game.describe_state()) == 1.0
        actions = [env.action_names.index(name) for name in parse.actions]
        assert fact_f1(parse.texts["prediction"], predicted_facts(game, actions)) == 1.0
        openings.add(tuple(parse.actions))
    assert len(openings) == 1  # same rng, different states: the same random actions


def test_grid_teacher_writes_the_true_grid_and_plays_at_random():
    """The grid warm start's teacher: <think> (free_think) or <observation> is the env's text grid with
    spaced cells (no token spans two), <prediction> the grid after its own actions; its actions
    ignore the state."""
    from vagen.pretrain.teachers import cell_grid

    openings = set()
    for seed in range(6):
        env = language_env("free_think")
        env.reset(seed=seed)
        game = env.env.unwrapped
        think = parse_reply(
            teacher_reply(env, "grid", 3, np.random.default_rng(0)), "free_think", env.action_names, 3
        )
        rows = game.text_grid().split("\n")
        assert think.texts["think"].split("\n") == [" ".join(row) for row in rows]
        openings.add(tuple(think.actions))
    assert len(openings) == 1
    env = language_env("grounding_worldmodeling")
    env.reset(seed=2)
    game = env.env.unwrapped
    reply = teacher_reply(env, "grid", 1, np.random.default_rng(3))
    parse = parse_reply(reply, "grounding_worldmodeling", env.action_names, 1)
    assert parse.texts["observation"] == cell_grid(game)
    env.step(reply)
    assert parse.texts["prediction"] == cell_grid(game)  # deterministic ice: the prediction comes true
    tokenizer = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "assets" / "tiny")
    pieces = [tokenizer.decode([token]) for token in tokenizer.encode(cell_grid(game))]
    assert all(len(piece.strip()) <= 1 for piece in pieces)  # no token merges two cells


def test_format_teacher_reply_does_not_depend_on_the_state():
    """Seeded alike, the format teacher writes the same reply on every state: its actions
    and its facts carry no information about the game."""
    for prompt_format in PROMPT_FORMATS:
        replies = set()
        for seed in range(5):
            env = language_env(prompt_format)
            env.reset(seed=seed)
            replies.add(teacher_reply(env, "format", 3, np.random.default_rng(0)))
        assert len(replies) == 1, prompt_format
    env = language_env("free_think")
    reply = teacher_reply(env, "format", 3, np.random.default_rng(1))
    think = parse_reply(reply, "free_think", env.action_names, 3)
    assert think.texts["think"] == GENERIC_REASONING


def test_sft_data_masks_only_the_replies_and_training_lowers_the_masked_loss(tiny_vlm_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_vlm_path)
    codec = ChatCodec(processor)
    seeds = SeedSchedule(0, 0, 10**6).next_train(4, 1)
    # RL's selective spans do not narrow the imitation: the warm start learns the whole reply, tags included
    selective = dataclasses.replace(ROLLOUT, loss_spans=["action"], adv_spans=["action"])
    records, segments = play_teacher_episodes(ENV, selective, codec, seeds, "solver", seed=0)
    data = build_batch(segments, records, codec.pad_token_id)
    assert all(record.success or record.num_actions == 4 for record in records)
    end = codec.stop_token_ids[0]
    for row in range(len(data)):
        masked = data.input_ids[row][data.loss_mask[row]].tolist()
        text = codec.decode(masked)
        assert text.count("<answer>") == text.count("</answer>") == masked.count(end) >= 1
        assert "<|image_pad|>" not in text and "user" not in text  # observations are never trained on
    with torch.no_grad():
        before = masked_nll(model, data).item()
    optim = SupervisedOptim(steps=4, batch_size=4, warmup_steps=1, lr=2e-3)
    losses = train_supervised(model, data, optim, seed=0, log=lambda _: None)
    with torch.no_grad():
        after = masked_nll(model, data).item()
    assert len(losses) == 4 and after < before - 0.5


def test_shuffled_batches_are_uniform_samples_and_use_every_row_once_per_epoch():
    generator = np.random.default_rng(0)
    epochs = [shuffled_batches(64, 8, generator) for _ in range(2)]
    for batches in epochs:
        assert sorted(row for batch in batches for row in batch) == list(range(64))
        # a batch is not a run of consecutive rows (one episode's turns in a row)
        assert not any(sorted(batch) == list(range(min(batch), min(batch) + 8)) for batch in batches)
    assert epochs[0] != epochs[1]  # drawn afresh each epoch
    # rows of two lengths (replies choosing `Left` and the longer `Forward`) share batches: over 200
    # epochs the long rows' share per batch averages 1/2 and is rarely all-or-nothing
    long_rows = set(range(32))
    shares = [len(long_rows & set(b)) / 8 for _ in range(200) for b in shuffled_batches(64, 8, generator)]
    assert abs(np.mean(shares) - 0.5) < 0.02 and np.mean([s in (0.0, 1.0) for s in shares]) < 0.02


def tiny_warm_start(**changes) -> WarmStartConfig:
    return WarmStartConfig(
        teacher="format", episodes=2, eval_levels=1, optim=SupervisedOptim(steps=1, batch_size=2), **changes
    )


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh $VAGEN_CACHE (the only place caches live)."""
    monkeypatch.setenv("VAGEN_CACHE", str(tmp_path))
    return tmp_path


def test_run_sft_writes_a_loadable_model_and_caches_it(tiny_vlm_path, cache):
    cfg = tiny_warm_start()
    rollout = RolloutConfig(max_turns=1, max_new_tokens=4)
    messages = []
    result = run_sft(str(tiny_vlm_path), ENV, rollout, cfg, log=messages.append)
    assert result.model_dir == warm_start_dir(str(tiny_vlm_path), ENV, rollout, cfg)
    assert result.model_dir.parent == cache / "sft" and result.model_dir.name.startswith("format-")
    assert set(result.report["after"]) >= {"success", "success_ci", "format_ok"}
    model, _ = load_policy(result.model_dir)
    assert sum(p.numel() for p in model.parameters()) > 0
    again = run_sft(str(tiny_vlm_path), ENV, rollout, cfg, log=messages.append)
    assert again.model_dir == result.model_dir and messages[-1].startswith("warm start cached")


def test_cache_key_changes_with_every_input(tiny_vlm_path):
    base = WarmStartConfig(teacher="format")
    key = warm_start_dir(str(tiny_vlm_path), ENV, ROLLOUT, base)
    assert key == warm_start_dir(str(tiny_vlm_path), ENV, ROLLOUT, WarmStartConfig(teacher="format"))
    other_env = EnvConfig(env_id=ENV.env_id, env_kwargs={"size": 4, "is_slippery": True})
    changed = [
        warm_start_dir(
            str(tiny_vlm_path), ENV, ROLLOUT, dataclasses.replace(base, optim=SupervisedOptim(steps=7))
        ),
        warm_start_dir(str(tiny_vlm_path), ENV, ROLLOUT, WarmStartConfig(teacher="solver")),
        warm_start_dir(str(tiny_vlm_path), ENV, ROLLOUT, dataclasses.replace(base, seed=1)),
        warm_start_dir(str(tiny_vlm_path), other_env, ROLLOUT, base),
        warm_start_dir(str(tiny_vlm_path), ENV, RolloutConfig(max_turns=4), base),
        warm_start_dir("tiny-text", ENV, ROLLOUT, base),
    ]
    assert len({key, *changed}) == 7
    # reward weights and the RL engine / batch shape / exploring starts (the teacher starts on the level's
    # start) / loss spans change neither the conversations nor the training
    reward_only = dataclasses.replace(
        ENV, format_reward=0.0, format_penalty=-1.0, grounding_reward_weight=2.0
    )
    engine_only = dataclasses.replace(
        ROLLOUT,
        engine="hf" if ROLLOUT.engine == "vllm" else "vllm",
        num_groups=3,
        random_start=1.0,
        loss_spans=["answer"],
        adv_spans=["action"],
    )
    assert warm_start_dir(str(tiny_vlm_path), reward_only, engine_only, base) == key


def test_cache_key_changes_with_the_training_procedure(tiny_vlm_path, monkeypatch):
    base = WarmStartConfig(teacher="format")
    before = warm_start_dir(str(tiny_vlm_path), ENV, ROLLOUT, base)
    monkeypatch.setattr("vagen.pretrain.supervised.TRAINING_PROCEDURE", -1)  # a model cached by another one
    assert warm_start_dir(str(tiny_vlm_path), ENV, ROLLOUT, base) != before


def test_references_format_solver_and_value_iteration_optimum():
    rollout = RolloutConfig(max_turns=3, max_actions_per_episode=6)
    seeds = SeedSchedule(0, 0, 10**6).validation(16, 1)
    assert teacher_success(ENV, rollout, seeds, "solver") == optimal_success(ENV, rollout, seeds) == 1.0
    assert teacher_success(ENV, rollout, seeds, "format") < 0.2
    slippery = EnvConfig(env_id=ENV.env_id, env_kwargs={"size": 4, "is_slippery": True, "max_steps": 10})
    assert 0.0 < optimal_success(slippery, rollout, seeds) < 1.0
    assert teacher_success(ENV, rollout, seeds, "planner") == 1.0


def test_planner_teacher_plays_the_value_iteration_policy_on_slippery_ice():
    env = LanguageEnv(
        gym.make("envs_visual/FrozenLake-v0", is_slippery=True, max_steps=10), prompt_format="no_think"
    )
    game = env.env.unwrapped
    rng = np.random.default_rng(0)
    # S H F F / F F H H / F F F F / F F F G: the shortest path starts Down, and a slip Right drops into
    # the hole at (0, 1); Left into the wall can only stay or slip Up (stay) or Down: never a hole
    env.reset(seed=0, options={"map": ["SHFF", "FFHH", "FFFF", "FFFG"]})
    assert game.optimal_actions(1) == [1]  # action ids: Up, Down, Left, Right
    planned = game.optimal_plan(10).action(0, 10)
    assert planned == 2
    reply = teacher_reply(env, "planner", 1, rng)
    assert parse_reply(reply, "no_think", env.action_names, 1).actions == ["Left"]
    for _ in range(6):  # from wherever the slips go: the same policy, whatever the steps left
        game.step(planned)
        row, col = game.player
        if game.desc[row][col] in "GH":
            break
        planned = game.optimal_plan(10).action(row * 4 + col, 10)
        again = teacher_reply(env, "planner", 1, rng)
        assert parse_reply(again, "no_think", env.action_names, 1).actions == [env.action_names[planned]]
    # over held-out levels it does better than the shortest path and reaches the optimum's level
    rollout = RolloutConfig(max_turns=10, max_actions_per_episode=10)
    slippery = EnvConfig(env_id=ENV.env_id, env_kwargs={"size": 4, "is_slippery": True, "max_steps": 10})
    seeds = SeedSchedule(0, 0, 10**6).validation(128, 1)
    planner = teacher_success(slippery, rollout, seeds, "planner")
    assert planner > teacher_success(slippery, rollout, seeds, "solver")
    assert abs(planner - optimal_success(slippery, rollout, seeds)) < 0.08


def test_warm_start_model_follows_the_run_config(cache):
    from vagen.config import load_config

    tiny = ["warm_start.episodes=2", "warm_start.optim.steps=1", "warm_start.optim.batch_size=2"]
    tiny += ["warm_start.eval_levels=1", "rollout.max_turns=1", "rollout.max_new_tokens=4"]
    assert warm_start_model(load_config(None, tiny)) == "tiny-vlm"  # warm_start.teacher=none
    path = warm_start_model(load_config(None, [*tiny, "warm_start.teacher=solver"]), log=lambda _: None)
    assert path.startswith(str(cache / "sft" / "solver-")) and (Path(path) / "config.json").is_file()
