"""Start-up checks (vagen.startup.check_run): what the registries, the model, DeepSpeed and the env need,
each one line, before the run folder is touched."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vagen.config import ConfigError, load_config
from vagen.pretrain import teachers
from vagen.startup import check_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("recipe", sorted((REPO / "configs").glob("*_tiny.yaml")), ids=lambda p: p.name)
def test_tiny_recipes_pass_the_start_up_checks(recipe):
    check_run(load_config(recipe))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.adv=grpo", "algo.kl_in_reward=true"], "'algo.kl_in_reward': a per-token KL reward needs"),
        (["algo.policy_loss=mpo"], "policy_loss=mpo needs Q(s, a) of every action: set algo.critic=state"),
        (
            ["algo.policy_loss=mpo", "algo.critic=state", "env.max_actions_per_turn=2"],
            "'env.max_actions_per_turn': policy_loss=mpo grades one action per turn",
        ),
        (
            ["algo.adv=grpo", "rollout.group_size=1"],
            "algo.adv=grpo compares the episodes of a group, so a group of 1 gets no advantage",
        ),
        (["algo.adv=gigpo", "rollout.group_size=1"], "'rollout.group_size'"),
        (["algo.kl_tokens=rest"], "'algo.kl_tokens': rest anchors the sampled tokens without policy loss"),
        (
            ["algo.policy_loss=mpo", "algo.critic=state", "env.max_actions_per_turn=1",
             "algo.kl_tokens=rest"],
            "'algo.kl_tokens': policy_loss=mpo always anchors the reply's tokens other than the action",
        ),
        (["model.path=/no/such/model"], "'model.path': '/no/such/model' is not a local directory"),
        (["model.path=configs"], "'model.path': model directory 'configs' is missing: config.json"),
        (["env.env_kwargs.size=-3"], "bad value for config key 'env': envs_visual/FrozenLake-v0 with"),
        (["env.env_kwargs.colour=red"], "bad value for config key 'env'"),
        (["env.env_id=envs_visual/Chess-v0"], "bad value for config key 'env'"),
    ],
)  # fmt: skip
def test_start_up_problems_are_one_line_config_errors(overrides, message):
    cfg = load_config(REPO / "configs/frozenlake_tiny.yaml", overrides)
    with pytest.raises(ConfigError) as err:
        check_run(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_mpo_on_actions_one_token_cannot_tell_apart_is_refused():
    """DoorKey's Forward and Pickup both start with `>` after `<answer` on the tiny tokenizer."""
    cfg = load_config(
        REPO / "configs/minigrid_lavagap_tiny.yaml", ["env.env_kwargs.task=MiniGrid-DoorKey-5x5-v0"]
    )
    with pytest.raises(ConfigError, match="'algo.policy_loss': mpo: the action names .* are not told apart"):
        check_run(cfg)


def test_a_contradicting_deepspeed_file_is_refused(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"train_micro_batch_size_per_gpu": 99}))
    with pytest.raises(ConfigError, match="'train_micro_batch_size_per_gpu' is 99"):
        check_run(load_config(REPO / "configs/frozenlake_tiny.yaml", [f"trainer.deepspeed={bad}"]))
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="'trainer.deepspeed': cannot read"):
        check_run(load_config(REPO / "configs/frozenlake_tiny.yaml", [f"trainer.deepspeed={bad}"]))


def test_the_cli_stops_on_a_bad_model_path_before_writing_anything(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "vagen/train.py", "--config", "configs/frozenlake_tiny.yaml",
         "model.path=/no/such/model", f"trainer.run_dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        done.stderr.strip().splitlines()[-1].startswith("config error: bad value for config key 'model.path'")
    )
    assert "Traceback" not in done.stderr
    assert not run_dir.exists()  # nothing written before the checks


def test_a_teacher_the_env_cannot_serve_is_refused(monkeypatch):
    """warm_start.teacher calls an optional env method (pretrain.teachers.TEACHER_NEEDS): an env without it
    fails at start-up, naming the key, not mid-way through the warm start."""
    monkeypatch.setitem(teachers.TEACHER_NEEDS, "solver", "solve_everything")
    with pytest.raises(ConfigError, match="'warm_start.teacher': solver needs the env's solve_everything"):
        check_run(load_config(REPO / "configs/frozenlake_tiny.yaml", ["warm_start.teacher=solver"]))
