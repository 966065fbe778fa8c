"""Greedy success of a slippery SFT model on the first N TRAINING levels (those it was trained on), and the
optimum there: `python train_map_eval.py CONFIG MODEL_DIR N [overrides]`."""

import sys

import gymnasium as gym
import numpy as np
import torch

import envs_visual  # noqa: F401
from vagen.config import load_config
from vagen.eval import evaluation_manager

config, model_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
overrides = [f"model.path={model_dir}", "model.warm_start=none", "perception.enabled=false"]
cfg = load_config(config, sys.argv[4:] + overrides)
torch.manual_seed(0)
manager = evaluation_manager(cfg)
train = manager.seeds.next_train(n, 1)
records = manager.play_episodes(train, temperature=0.0)
env = gym.make("envs_visual/FrozenLake-v0", size=4, is_slippery=True, max_steps=16).unwrapped
opt = []
for s in train:
    env.reset(seed=s.level)
    opt.append(env.optimal_plan(16).success[16, env.start_state])
print(
    f"{model_dir}: training levels {n}: greedy success {np.mean([r.success for r in records]):.3f}, "
    f"optimum {np.mean(opt):.3f}"
)
