"""Every registered env meets the env contract (envs_visual.contract), and the checker catches breaks."""

import gymnasium
import pytest

import envs_visual
from envs_visual.contract import ContractError, check_contract
from envs_visual.minigrid import MiniGridEnv

ALL_FEATURES = {"facts", "state_features", "layout_key"}


@pytest.mark.parametrize("env_id", sorted(envs_visual.ENV_IDS))
def test_every_registered_env_meets_the_contract(env_id):
    features = check_contract(gymnasium.make(env_id))
    assert ALL_FEATURES | {"solver"} <= features


def test_optional_features_are_reported_as_offered():
    assert "planner" in check_contract(gymnasium.make("envs_visual/FrozenLake-v0"))
    assert "random_start" in check_contract(gymnasium.make("envs_visual/Sokoban-v0"))
    assert "random_start" in check_contract(gymnasium.make("envs_visual/MiniGrid-v0"))

    class FixedStarts(MiniGridEnv):
        supports_random_start = False

    assert "random_start" not in check_contract(FixedStarts())


def test_a_missing_attribute_or_a_stale_text_is_named():
    class Unlabelled(MiniGridEnv):
        image_legend = property(lambda self: self.missing)  # reading it raises AttributeError

    with pytest.raises(ContractError, match="Unlabelled: needs image_legend"):
        check_contract(Unlabelled())

    class StaleText(MiniGridEnv):
        def _observation(self):
            return {"image": self.render(), "text": "W"}

    with pytest.raises(ContractError, match="text_grid"):
        check_contract(StaleText())


def test_facts_outside_the_vocabulary_are_refused():
    env = gymnasium.make("envs_visual/MiniGrid-v0").unwrapped
    env.describe_state = lambda: [("dragon", "above")]
    with pytest.raises(ContractError, match="dragon"):
        check_contract(env)
