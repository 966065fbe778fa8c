"""Run config: YAML + dotted overrides, one-line errors naming the key, DeepSpeed JSON filling."""

import json
from pathlib import Path

import pytest

from vagen.config import ConfigError, derived_sizes, load_config, to_yaml, valid_keys
from vagen.trainer import deepspeed_config

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # configs name their DeepSpeed JSON relative to the repository


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_shipped_recipes_load_and_validate(recipe):
    cfg = load_config(recipe)
    assert cfg.trainer.run_dir == f"runs/{recipe.stem}"
    assert derived_sizes(cfg, world_size=1).micro_batches_per_step >= 1


def test_yaml_then_overrides_in_order(tmp_path):
    path = write_yaml(tmp_path, "algo:\n  adv: grpo\n  filter: {keep: 0.5}\ntrainer:\n  steps: 7\n")
    cfg = load_config(path, ["trainer.steps=3", "rollout.loss_spans=[answer]"])
    assert (cfg.algo.adv, cfg.algo.filter.keep, cfg.trainer.steps) == ("grpo", 0.5, 3)
    assert cfg.rollout.loss_spans == ["answer"]
    assert cfg.trainer.run_dir == "runs/run"
    # the saved YAML reloads to the same config
    again = load_config(write_yaml(tmp_path, to_yaml(cfg)))
    assert again == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.advv=gae"], "unknown config key 'algo.advv' (did you mean 'algo.adv'?)"),
        (["trainer.stesp=3"], "unknown config key 'trainer.stesp' (did you mean 'trainer.steps'?)"),
        (["trainer.steps=many"], "bad value for config key 'trainer.steps'"),
        (["algo.adv=ppo2"], "bad value for config key 'algo.adv': 'ppo2' is not one of"),
        (["algo.filter.keep=0"], "bad value for config key 'algo.filter.keep'"),
        (["trainer.deepspeed=configs/deepspeed/zero9.json"], "file not found"),
        (["algo.adv=grpo", "algo.kl_in_reward=true"], "bad value for config key 'algo.kl_in_reward'"),
        (["rollout.window=-2"], "rollout.window must be None or >= 0"),
        (["algo.critic=oracle"], "bad value for config key 'algo.critic': 'oracle' not in"),
        (["algo.adv=gae", "algo.critic=state"], "critic=state gives one value per turn"),
        (["rollout.random_start=1.5"], "rollout.random_start must lie in [0, 1]"),
        (["algo.policy_loss=a2c"], "bad value for config key 'algo.policy_loss': 'a2c' not in"),
        (["algo.policy_loss=mpo"], "policy_loss=mpo needs Q(s, a) of every action: set algo.critic=state"),
        (
            ["algo.policy_loss=mpo", "algo.critic=state", "env.max_actions_per_turn=2"],
            "policy_loss=mpo grades one action per turn",
        ),
        (["env.instructions=short"], "env.instructions must be one of"),
        (["algo.state_critic_input=pixels"], "'algo.state_critic_input': must be one of ('text', 'feat"),
        (["trainer.steps"], "override 'trainer.steps' must look like key=value"),
        (
            ["algo.adv=grpo", "rollout.group_size=1"],
            "algo.adv=grpo compares the episodes of a group, so a group of 1 gets no advantage",
        ),
        (["algo.adv=gigpo", "rollout.group_size=1"], "'rollout.group_size'"),
        (
            ["algo.adv=gae", "rollout.group_size=1", "algo.filter.keep=0.5"],
            "the group filter (algo.filter.keep=0.5) ranks groups by the spread of their returns",
        ),
    ],
)
def test_bad_overrides_stop_with_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_nested_yaml_key_and_null_value(tmp_path):
    with pytest.raises(ConfigError, match=r"'algo.filter.kep' \(did you mean 'algo.filter.keep'\?\)"):
        load_config(write_yaml(tmp_path, "algo:\n  filter:\n    kep: 0.5\n"))
    with pytest.raises(ConfigError, match="bad value for config key 'model.path'"):
        load_config(write_yaml(tmp_path, "model:\n  path: null\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_every_schema_field_has_help():
    from dataclasses import fields, is_dataclass

    from vagen.config import RunConfig

    def walk(schema):
        for f in fields(schema):
            assert f.metadata.get("help"), f"{schema.__name__}.{f.name} has no help"
            if is_dataclass(f.default_factory):
                walk(f.default_factory)

    walk(RunConfig)
    assert "algo.filter.keep" in valid_keys()


def test_derived_sizes_and_deepspeed_auto_values():
    cfg = load_config(None, ["rollout.num_groups=4", "rollout.group_size=3", "algo.mini_batches=2"])
    cfg.trainer.micro_batch_size = 2
    sizes = derived_sizes(cfg, world_size=2)
    # 2 groups x 3 = 6 rows per rank; 3 rows per mini-batch -> 2 micro-batches of <= 2 rows
    assert (sizes.groups_per_rank, sizes.rows_per_rank, sizes.micro_batches_per_step) == (2, 6, 2)
    ds = deepspeed_config(cfg, sizes)
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 2 * 2 * 2
    assert ds["gradient_clipping"] == cfg.optim.grad_clip
    assert ds["bf16"]["enabled"] is False
    with pytest.raises(ConfigError, match="do not split over 3 ranks"):
        derived_sizes(cfg, world_size=3)


def test_deepspeed_file_conflicts_are_refused(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"train_micro_batch_size_per_gpu": 99, "zero_optimization": {"stage": 1}}))
    cfg = load_config(None, [f"trainer.deepspeed={bad}"])
    with pytest.raises(ConfigError, match="'train_micro_batch_size_per_gpu' is 99"):
        deepspeed_config(cfg, derived_sizes(cfg, 1))
    bad.write_text(json.dumps({"optimizer": {"type": "AdamW"}}))
    with pytest.raises(ConfigError, match="defines 'optimizer'"):
        deepspeed_config(cfg, derived_sizes(cfg, 1))


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero3_offload"])
def test_deepspeed_files_fill_for_every_stage(name):
    cfg = load_config(None, [f"trainer.deepspeed=configs/deepspeed/{name}.json", "model.dtype=bfloat16"])
    ds = deepspeed_config(cfg, derived_sizes(cfg, 1))
    assert "auto" not in json.dumps(ds)
    assert ds["bf16"]["enabled"] is True
    assert ds["zero_optimization"]["stage"] == (1 if name == "zero1" else 2 if name == "zero2" else 3)


def test_train_entry_reports_a_bad_key_in_one_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "vagen/train.py", "--config", "configs/frozenlake_tiny.yaml", "trainer.setps=3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == "config error: unknown config key 'trainer.setps' (did you mean 'trainer.steps'?)"
