"""Perception pretraining (vagen.pretrain.perception): states, caption rows, accuracy, training reads."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vagen.config import EnvConfig, PerceptionConfig, RolloutConfig, SupervisedOptim
from vagen.models.loading import load_policy
from vagen.pretrain.perception import (
    caption_batch,
    grid_accuracy,
    pretrain_perception,
    shuffle_cells,
    walk_states,
)
from vagen.pretrain.supervised import REPORT_FILE, train_supervised
from vagen.rollout.assembly import ChatCodec

ENV = EnvConfig(env_id="envs_visual/FrozenLake-v0", env_kwargs={"size": 4, "tile_style": "flat"})


def test_walks_never_end_the_episode_and_the_grid_matches_the_image():
    states = list(walk_states(ENV, list(range(40)), max_walk=10, seed=0))
    players = set()
    for image, grid in states:
        rows = [row.split(" ") for row in grid.split("\n")]
        assert len(rows) == 4 and all(len(row) == 4 for row in rows)
        (player,) = [(r, c) for r in range(4) for c in range(4) if rows[r][c] == "P"]
        players.add(player)
        cell = image[player[0] * 28 + 14, player[1] * 28 + 14]
        assert tuple(cell) == (230, 30, 30)  # the flat style's player, alive (never in a hole, at the goal)
    assert len(players) >= 6  # the walks spread the player over the map


def test_shuffled_cells_keep_each_tile_with_its_character():
    (image, grid), *_ = walk_states(ENV, [5], max_walk=3, seed=0)
    shuffled, shuffled_grid = shuffle_cells(image, grid, np.random.default_rng(1))
    assert shuffled_grid != grid and sorted(shuffled_grid.split()) == sorted(grid.split())
    tiles = {}  # character -> the tiles drawn for it in the real state
    for r, row in enumerate(grid.split("\n")):
        for c, char in enumerate(row.split(" ")):
            tiles.setdefault(char, []).append(image[r * 28 : (r + 1) * 28, c * 28 : (c + 1) * 28])
    for r, row in enumerate(shuffled_grid.split("\n")):
        for c, char in enumerate(row.split(" ")):
            tile = shuffled[r * 28 : (r + 1) * 28, c * 28 : (c + 1) * 28]
            assert any(np.array_equal(tile, t) for t in tiles[char]), (r, c, char)
    with pytest.raises(ValueError, match="not 4 x 4 square cells"):
        shuffle_cells(image[:, :100], grid, np.random.default_rng(1))


def test_caption_rows_train_only_the_grid_and_training_reads_it(tiny_vlm_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_vlm_path)
    codec = ChatCodec(processor)
    states = list(walk_states(ENV, list(range(8)), max_walk=10, seed=0))
    data = caption_batch(codec, "You play.", states)
    for row, (_, grid) in enumerate(states):
        reply = codec.decode(data.input_ids[row][data.loss_mask[row]].tolist())
        assert reply.startswith(grid) and reply.count("<|image_pad|>") == 0
    before = grid_accuracy(model, data)
    optim = SupervisedOptim(steps=60, batch_size=8, lr=3e-3, warmup_steps=5)
    train_supervised(model, data, optim, seed=0, log=lambda _: None)
    after = grid_accuracy(model, data)
    assert before["token_accuracy"] < 0.2 and after["token_accuracy"] > 0.8  # spaces, rows, letters


def test_pretrain_perception_writes_a_loadable_model(tiny_vlm_path, tmp_path):
    cfg = PerceptionConfig(samples=4, eval_samples=2, optim=SupervisedOptim(steps=1, batch_size=4))
    text_only = EnvConfig(env_id=ENV.env_id, env_kwargs=ENV.env_kwargs, text_only=True)
    with pytest.raises(ValueError, match="text_only"):
        pretrain_perception(str(tiny_vlm_path), text_only, RolloutConfig(), cfg, str(tmp_path / "no"))
    report = pretrain_perception(
        str(tiny_vlm_path), ENV, RolloutConfig(), cfg, str(tmp_path / "seeing"), log=print
    )
    assert set(report["after"]) == {"token_accuracy", "grid_exact"}
    model, _ = load_policy(tmp_path / "seeing")
    assert np.isfinite(sum(p.sum().item() for p in model.parameters()))


def test_perception_cache_key_follows_images_and_levels_not_rewards(tiny_vlm_path):
    import dataclasses

    from vagen.pretrain.perception import perception_dir

    cfg = PerceptionConfig()
    rollout = RolloutConfig()
    key = perception_dir(str(tiny_vlm_path), ENV, rollout, cfg)
    same = [
        dataclasses.replace(ENV, format_reward=0.5, prompt_format="grounding"),
        dataclasses.replace(ENV, max_actions_per_turn=1),
    ]
    for env in same:
        assert perception_dir(str(tiny_vlm_path), env, rollout, cfg) == key
    assert perception_dir(str(tiny_vlm_path), ENV, rollout, dataclasses.replace(cfg, enabled=True)) == key
    sprites = dataclasses.replace(ENV, env_kwargs={"size": 4})
    changed = [
        perception_dir(str(tiny_vlm_path), sprites, rollout, cfg),
        perception_dir(
            str(tiny_vlm_path), ENV, RolloutConfig(chat_template="assets/tiny/chat_template.jinja"), cfg
        ),
        perception_dir(
            str(tiny_vlm_path), ENV, rollout, dataclasses.replace(cfg, optim=SupervisedOptim(steps=10))
        ),
        perception_dir(str(tiny_vlm_path), ENV, rollout, dataclasses.replace(cfg, seed=1)),
        perception_dir(str(tiny_vlm_path), ENV, rollout, dataclasses.replace(cfg, shuffle_cells=0.5)),
    ]
    assert len({key, *changed}) == 6


def test_warm_start_builds_on_the_perception_model_when_enabled(tiny_vlm_path, tmp_path, monkeypatch):
    from vagen.config import load_config
    from vagen.pretrain import start_model, warm_start_model

    monkeypatch.setenv("VAGEN_CACHE", str(tmp_path))
    overrides = [
        f"model.path={tiny_vlm_path}",
        "warm_start.teacher=format",
        "env.env_kwargs.tile_style=flat",
        "rollout.max_turns=1",
        "rollout.max_new_tokens=4",
        "perception.samples=4",
        "perception.optim.steps=1",
        "perception.optim.batch_size=4",
        "perception.eval_samples=2",
        "warm_start.episodes=2",
        "warm_start.optim.steps=1",
        "warm_start.optim.batch_size=2",
        "warm_start.eval_levels=1",
    ]
    cfg = load_config("configs/frozenlake_tiny.yaml", overrides)
    assert start_model(cfg) == str(tiny_vlm_path)  # perception off: the base itself
    cfg = load_config("configs/frozenlake_tiny.yaml", [*overrides, "perception.enabled=true"])
    messages = []
    seeing = start_model(cfg, log=messages.append)
    assert seeing.startswith(str(tmp_path / "perception"))
    assert messages[0].startswith("perception pretraining")
    warm = warm_start_model(cfg, log=messages.append)
    assert any(m == f"perception pretraining cached: {seeing}" for m in messages)  # built once, then reused
    report = json.loads((Path(warm) / REPORT_FILE).read_text())
    assert report["base_model"] == seeing
