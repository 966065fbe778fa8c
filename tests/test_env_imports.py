"""envs_visual stays free of torch and vagen (checked in a fresh interpreter)."""

import subprocess
import sys

# Compares sys.modules before and after: site hooks (the torchvision shim's .pth) load at start-up.
SCRIPT = """
import sys
before = set(sys.modules)
import gymnasium
import envs_visual, envs_visual.language, envs_visual.facts
env = gymnasium.make("envs_visual/Sokoban-v0")
env.reset(seed=0)
gymnasium.make("envs_visual/FrozenLake-v0").reset(seed=0)
gymnasium.make("envs_visual/MiniGrid-v0").reset(seed=0)
import envs_visual.contract
loaded = sorted(name for name in set(sys.modules) - before if name.split(".")[0] in ("torch", "vagen"))
print(",".join(loaded))
"""


def test_envs_visual_imports_neither_torch_nor_vagen():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
