"""Visual grid environments (gymnasium API). Imports neither torch nor vagen.

`import envs_visual` registers:
  envs_visual/Sokoban-v0     -> envs_visual.sokoban.SokobanEnv
  envs_visual/FrozenLake-v0  -> envs_visual.frozenlake.VisualFrozenLakeEnv
  envs_visual/MiniGrid-v0    -> envs_visual.minigrid.MiniGridEnv (task="MiniGrid-LavaGapS6-v0", ...)
Each observes {"image": uint8 (H, W, 3), "text": str grid} and names its actions in `action_names`; what
the trainer reads of an env is the contract in envs_visual.contract (docs/envs.md).
The language layer for LLM agents is envs_visual.language.LanguageEnv.
"""

from gymnasium.envs.registration import register, registry

ENV_IDS = {
    "envs_visual/Sokoban-v0": "envs_visual.sokoban.env:SokobanEnv",
    "envs_visual/FrozenLake-v0": "envs_visual.frozenlake.env:VisualFrozenLakeEnv",
    "envs_visual/MiniGrid-v0": "envs_visual.minigrid.env:MiniGridEnv",
}

for env_id, entry_point in ENV_IDS.items():
    if env_id not in registry:
        # No max_episode_steps: the envs truncate themselves after `max_steps`.
        register(id=env_id, entry_point=entry_point, disable_env_checker=True)
