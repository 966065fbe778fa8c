"""Greedy success of a slippery SFT model on the first N TRAINING levels (those it was trained on), and the
optimum there: `python train_map_eval.py CONFIG MODEL_DIR N [overrides]`."""

import sys

import gymnasium as gym
import numpy as np
import torch

import envs_visual  # noqa: F401
from vagen.config import load_config
from vagen.models.loading import load_policy
from vagen.rollout.engines.base import make_engine
from vagen.rollout.manager import RolloutManager, seed_schedule

config, model_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = load_config(config, sys.argv[4:] + ["model.warm_start=none", "perception.enabled=false"])
torch.manual_seed(0)
model, processor = load_policy(model_dir)
model.eval()
manager = RolloutManager(
    cfg.env,
    cfg.rollout,
    make_engine(cfg.rollout.engine, model, processor, **cfg.rollout.engine_options()),
    processor,
)
train = seed_schedule(cfg.env, cfg.rollout).next_train(n, 1)
records = []
for i in range(0, n, 128):
    records += manager.play_episodes(train[i : i + 128], temperature=0.0)
env = gym.make("envs_visual/FrozenLake-v0", size=4, is_slippery=True, max_steps=16).unwrapped
opt = []
for s in train:
    env.reset(seed=s.level)
    opt.append(env.optimal_plan(16).success[16, env.start_state])
print(
    f"{model_dir}: training levels {n}: greedy success {np.mean([r.success for r in records]):.3f}, "
    f"optimum {np.mean(opt):.3f}"
)
