"""Run config: YAML + dotted overrides, checks from field metadata, one-line errors naming the key."""

import math
import random
import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from vagen import config
from vagen.batching import derived_sizes
from vagen.config import REMOVED_KEYS, ConfigError, RunConfig, load_config, to_yaml, valid_keys

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # configs name their DeepSpeed JSON relative to the repository


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def leaf_fields(schema: type = RunConfig, prefix: str = "") -> dict[str, object]:
    """Every leaf field of the schema by dotted key."""
    leaves = {}
    for f in fields(schema):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            leaves |= leaf_fields(type(default), f"{prefix}{f.name}.")
        else:
            leaves[prefix + f.name] = f
    return leaves


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
        (["algo.filter.keep=0"], "bad value for config key 'algo.filter.keep': must be > 0, got 0.0"),
        (["trainer.deepspeed=configs/deepspeed/zero9.json"], "file not found"),
        (["rollout.window=-2"], "bad value for config key 'rollout.window': must be >= 0, got -2"),
        (["algo.critic=oracle"], "bad value for config key 'algo.critic': 'oracle' is not one of"),
        (["rollout.random_start=1.5"], "'rollout.random_start': must be <= 1, got 1.5"),
        (["algo.policy_loss=a2c"], "bad value for config key 'algo.policy_loss': 'a2c' is not one of"),
        (["env.instructions=short"], "'env.instructions': 'short' is not one of ('full', 'brief')"),
        (["algo.state_critic_input=pixels"], "'algo.state_critic_input': 'pixels' is not one of"),
        (["trainer.steps"], "override 'trainer.steps' must look like key=value"),
        (
            ["algo.adv=gae", "rollout.group_size=1", "algo.filter.keep=0.5"],
            "the group filter (algo.filter.keep=0.5) ranks groups by the spread of their returns",
        ),
        # what a user mistyping would write: non-finite, out of range, malformed
        (["algo.gamma=nan"], "bad value for config key 'algo.gamma': must be a finite number, got nan"),
        (["rollout.temperature=-0.5"], "'rollout.temperature': must be >= 0, got -0.5"),
        (["optim.grad_clip=nan"], "'optim.grad_clip': must be a finite number"),
        (["perception.optim.lr=inf"], "'perception.optim.lr': must be a finite number, got inf"),
        (["model.lora.dropout=-1"], "'model.lora.dropout': must be >= 0"),
        (["env.max_actions_per_turn=-1"], "'env.max_actions_per_turn': must be >= 1, got -1"),
        (["algo.gamma=1.5"], "'algo.gamma': must be <= 1, got 1.5"),
        (["optim.betas=[0.9]"], "'optim.betas': needs 2 values"),
        (["optim.betas=[0.9,1.5]"], "'optim.betas': must be < 1, got 1.5"),
        (["env.env_kwargs.size=.inf"], "'env.env_kwargs.size': must be a finite number"),  # YAML's inf
        (["algo.dual_clip=0.5"], "'algo.dual_clip': must be > 1, got 0.5"),
        (["rollout.loss_spans=[]"], "'rollout.loss_spans': must be 'all' or a non-empty list"),
        (["rollout.adv_spans=[answer,bogus]"], "'rollout.adv_spans': 'bogus' is not one of"),
        (["algo.kl_kind={"], "cannot parse override 'algo.kl_kind={'"),
        (["trainer.steps=[["], "cannot parse override 'trainer.steps=[['"),
        (["rollout.chat_template=nope.jinja"], "'rollout.chat_template': file not found: nope.jinja"),
        (["env.text_only=true", "perception.enabled=true"], "'perception.enabled': perception pretraining"),
    ],
)
def test_bad_overrides_stop_with_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("key", "replacement"),
    [
        ("model.warm_start=format", "use warm_start.teacher"),
        ("sft.optim.steps=3", "use warm_start (its optimizer settings under warm_start.optim)"),
        ("optim.max_grad_norm=10", "use optim.skip_grad_norm"),
        ("optim.lr_decay=linear", "use optim.schedule"),
        ("algo.gamma_turn=0.9", "use algo.gamma"),
        ("rollout.seed=3", "use trainer.seed"),
        ("algo.mpo_mass_floor=0.9", "removed (a negative result"),
        ("logging.wandb_mode=online", "WANDB_MODE"),
    ],
)
def test_removed_keys_name_their_replacement(key, replacement):
    with pytest.raises(ConfigError) as err:
        load_config(None, [key])
    assert str(err.value).startswith(f"unknown config key '{key.split('=')[0]}': ")
    assert replacement in str(err.value) and "\n" not in str(err.value)


def test_unknown_nested_yaml_key_null_value_and_broken_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"'algo.filter.kep' \(did you mean 'algo.filter.keep'\?\)"):
        load_config(write_yaml(tmp_path, "algo:\n  filter:\n    kep: 0.5\n"))
    with pytest.raises(ConfigError, match="bad value for config key 'model.path'"):
        load_config(write_yaml(tmp_path, "model:\n  path: null\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="cannot parse .*run.yaml"):
        load_config(write_yaml(tmp_path, "algo: {adv: [gae\n"))
    with pytest.raises(
        ConfigError, match="unknown config key .sft.steps.: use warm_start"
    ):  # a removed section
        load_config(write_yaml(tmp_path, "sft:\n  steps: 3\n"))


def test_every_field_has_help_and_numbers_declare_a_range():
    leaves = leaf_fields()
    # the redesign's 113 + env.remote (3), algo.kl_tokens, trainer.gpu_memory_gb, perception.shuffle_cells
    assert len(leaves) <= 119
    for key, f in leaves.items():
        assert f.metadata.get("help"), f"{key} has no help"
    numeric = {k for k, f in leaves.items() if f.type in (int, float, int | None, float | None, list[float])}
    bounded = {k for k in numeric if {"ge", "gt", "le", "lt"} & set(leaves[k].metadata)}
    # any finite value is meaningful for these: rewards, and seeds that only name a stream
    assert numeric - bounded == {"env.format_reward", "warm_start.seed", "perception.seed"}
    assert "algo.filter.keep" in valid_keys()


def test_choices_are_the_registries_keys():
    from envs_visual.language import INSTRUCTION_STYLES, PROMPT_FORMATS, SPAN_NAMES
    from vagen.algo import ADVANTAGE_ESTIMATORS, GROUP_FILTERS, KL_ESTIMATORS, LOSS_AGGREGATIONS
    from vagen.critics import STATE_CRITICS
    from vagen.models.build import CRITIC_BUILDERS
    from vagen.pretrain.teachers import TEACHERS
    from vagen.rollout.engines import ENGINES
    from vagen.updates import POLICY_UPDATES
    from vagen.updates.ppo import KL_TOKEN_MASKS

    assert config.ADVANTAGE_ESTIMATORS == tuple(ADVANTAGE_ESTIMATORS)
    assert config.POLICY_UPDATES == tuple(POLICY_UPDATES)
    assert config.LOSS_AGGREGATIONS == tuple(LOSS_AGGREGATIONS)
    assert config.KL_ESTIMATORS == tuple(KL_ESTIMATORS)
    assert config.KL_TOKENS == tuple(KL_TOKEN_MASKS)
    assert config.GROUP_FILTERS == tuple(GROUP_FILTERS)
    assert config.CRITICS == tuple(CRITIC_BUILDERS)
    assert config.STATE_CRITIC_INPUTS == tuple(STATE_CRITICS)
    assert config.TEACHERS == tuple(TEACHERS)
    assert config.PROMPT_FORMATS == tuple(PROMPT_FORMATS)
    assert config.INSTRUCTION_STYLES == INSTRUCTION_STYLES
    assert config.SPAN_NAMES == SPAN_NAMES
    assert config.ENGINES == tuple(ENGINES)


def test_removed_keys_are_not_valid_keys():
    assert not set(REMOVED_KEYS) & set(valid_keys())


# values a hurried user might type, of every kind
FUZZ_VALUES = [
    "nan", "inf", "-inf", "-1", "0", "1", "2", "-0.5", "0.5", "1e30", "-1e30", "1.5", "abc", "''", "null",
    "true", "[]", "[1,2]", "[nan]", "{", "[[", "{a: 1}", "answer", "[answer]", "all", "hf", "mpo", "state",
]  # fmt: skip


def accepted_values_are_valid(cfg: RunConfig) -> None:
    """Every float is finite and every number inside its declared range (independently of `validate`)."""
    leaves = leaf_fields()
    for key, f in leaves.items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, float):
                assert math.isfinite(item), (key, item)
            if isinstance(item, int | float) and not isinstance(item, bool):
                m = f.metadata
                assert "ge" not in m or item >= m["ge"], (key, item)
                assert "gt" not in m or item > m["gt"], (key, item)
                assert "le" not in m or item <= m["le"], (key, item)
                assert "lt" not in m or item < m["lt"], (key, item)
            if "choices" in f.metadata and isinstance(item, str):
                assert item in f.metadata["choices"], (key, item)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_fuzzed_overrides_are_accepted_valid_or_rejected_in_one_line(recipe):
    """Random key=value overrides on every recipe: load_config never raises anything but a one-line
    ConfigError, and never accepts a non-finite or out-of-range value."""
    rng = random.Random(f"{recipe.name}")
    keys = [k for k in leaf_fields() if k not in ("trainer.run_dir", "trainer.resume", "trainer.deepspeed")]
    keys += ["env.env_kwargs.size", "algo.filter", "nonsense.key"]
    accepted = 0
    for _ in range(100):  # 1-2 overrides, enough tries that some draws hold only valid ones
        overrides = [f"{rng.choice(keys)}={rng.choice(FUZZ_VALUES)}" for _ in range(rng.randint(1, 2))]
        try:
            cfg = load_config(recipe, overrides)
        except ConfigError as err:
            assert "\n" not in str(err) and str(err), overrides
            continue
        accepted += 1
        accepted_values_are_valid(cfg)
    assert accepted > 0  # the fuzzer also reaches valid configs, not only errors


def test_import_vagen_config_loads_neither_torch_nor_transformers():
    code = "import sys, vagen.config; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_train_entry_reports_a_bad_key_in_one_line():
    done = subprocess.run(
        [sys.executable, "vagen/train.py", "--config", "configs/frozenlake_tiny.yaml", "trainer.setps=3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == "config error: unknown config key 'trainer.setps' (did you mean 'trainer.steps'?)"
