"""Visual grid environments (gymnasium API). Imports neither torch nor vagen.

`import envs_visual` registers:
  envs_visual/Sokoban-v0     -> envs_visual.sokoban.SokobanEnv
  envs_visual/FrozenLake-v0  -> envs_visual.frozenlake.VisualFrozenLakeEnv
Both observe {"image": uint8 (H, W, 3), "text": str grid} and act with ("Up", "Down", "Left", "Right").
The language layer for LLM agents is envs_visual.language.LanguageEnv.
"""

from gymnasium.envs.registration import register, registry

ENV_IDS = {
    "envs_visual/Sokoban-v0": "envs_visual.sokoban.env:SokobanEnv",
    "envs_visual/FrozenLake-v0": "envs_visual.frozenlake.env:VisualFrozenLakeEnv",
}

for env_id, entry_point in ENV_IDS.items():
    if env_id not in registry:
        # No max_episode_steps: the envs truncate themselves after `max_steps`.
        register(id=env_id, entry_point=entry_point, disable_env_checker=True)
