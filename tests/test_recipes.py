"""Shipped recipes (configs/*.yaml): they load, their envs build, the tiny ones resolve to a model, and
the GPU ones keep the published settings their provenance comments name."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from vagen.batching import derived_sizes
from vagen.config import load_config
from vagen.memory import ZeroSetup, estimate_memory, model_shape
from vagen.models.loading import load_policy
from vagen.models.tiny import resolve_model_path
from vagen.optim import deepspeed_config
from vagen.pretrain.perception import pretraining_settings
from vagen.pretrain.sft import warm_start_dir
from vagen.pretrain.supervised import REPORT_FILE
from vagen.rollout.assembly import ChatCodec, action_token_ids
from vagen.rollout.manager import make_language_env
from vagen.updates import POLICY_UPDATES

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs").glob("*.yaml"))
TINY_RECIPES = sorted((REPO / "configs").glob("*_tiny.yaml"))
GPU_RECIPES = sorted(set(RECIPES) - set(TINY_RECIPES))
VAGEN_3B = ["sokoban_qwen2_5_vl_3b_trico", "sokoban_qwen2_5_vl_3b_ppo", "sokoban_qwen2_5_vl_3b_grpo"]
# one-GPU recipe -> the folder under assets/ with its model's public config.json
ONE_GPU_RECIPES = {
    "sokoban_qwen2_5_vl_3b_lora_24gb": "qwen2_5_vl_3b",
    "sokoban_qwen3_vl_2b_lora_24gb": "qwen3_vl_2b",
}
# text baseline -> the visual recipe whose env and rollout budgets it must share
TEXT_TWINS = {"frozenlake_text_tiny": "frozenlake_tiny", "sokoban_text_tiny": "sokoban_tiny"}


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name their DeepSpeed JSON relative to the repository


def recipe(name: str, overrides: list[str] = ()):
    return load_config(REPO / "configs" / f"{name}.yaml", list(overrides))


def test_the_recipe_set_is_complete():
    names = {path.stem for path in RECIPES}
    expected = {
        "frozenlake_tiny",
        "frozenlake_quickstart_tiny",
        "frozenlake_mpo_tiny",
        "frozenlake_text_mpo_tiny",
        "frozenlake_slippery_mpo_tiny",
        "sokoban_mpo_tiny",
        "frozenlake_slippery_tiny",
        "frozenlake_text_tiny",
        "sokoban_tiny",
        "sokoban_text_tiny",
        "sokoban_qwen2_5_0_5b_ragen",
        "minigrid_lavagap_tiny",
        *VAGEN_3B,
        *ONE_GPU_RECIPES,
    }
    assert expected <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_validates_with_an_absent_model_directory(path, tmp_path):
    absent = tmp_path / "no-such-checkpoint"
    cfg = load_config(path, [f"model.path={absent}"])  # validation never opens the model
    assert cfg.model.path == str(absent) and not absent.exists()
    env = make_language_env(cfg.env)  # env_kwargs are passed to gymnasium.make unchecked by the loader
    observation, _ = env.reset(seed=0)
    assert bool(observation.images) != cfg.env.text_only


@pytest.mark.parametrize("path", TINY_RECIPES, ids=lambda p: p.stem)
def test_tiny_recipes_resolve_their_model_and_warm_start(path, tiny_vlm_path, tiny_text_path):
    cfg = load_config(path)
    model_dir = resolve_model_path(cfg.model.path)
    if cfg.model.path.startswith("assets/perception/"):  # a shipped perception-pretrained tiny VLM
        assert load_policy(model_dir)[0].config.text_config.hidden_size == 128
    else:
        assert model_dir == (tiny_text_path if cfg.env.text_only else tiny_vlm_path)
    teacher = cfg.warm_start.teacher
    if teacher != "none":
        assert warm_start_dir(cfg.model.path, cfg.env, cfg.rollout, cfg.warm_start).name.startswith(
            f"{teacher}-"
        )


@pytest.mark.parametrize(
    "name",
    [
        "minigrid_lavagap_tiny",
        "sokoban_tiny",
        "frozenlake_slippery_tiny",
        "frozenlake_text_tiny",
        "frozenlake_text_grpo_tiny",
        "sokoban_text_tiny",
    ],
)
def test_tiny_rl_recipes_start_from_the_format_warm_start(name):
    assert recipe(name).warm_start.teacher == "format"


@pytest.mark.parametrize(("text", "visual"), TEXT_TWINS.items())
def test_text_baselines_share_env_and_budgets_with_their_visual_recipe(text, visual):
    text_cfg, visual_cfg = recipe(text), recipe(visual)
    assert (text_cfg.model.path, text_cfg.env.text_only) == ("tiny-text", True)
    assert asdict(text_cfg.env) == asdict(visual_cfg.env) | {"text_only": True}
    assert text_cfg.rollout == visual_cfg.rollout


def test_anchored_text_recipe_keeps_the_measured_settings():
    """The settings the probe rounds measured (0.51-0.69 after 30 minutes, docs/results.md): change them and
    the recipe's header and docs/results.md no longer describe it."""
    cfg, twin = recipe("frozenlake_text_grpo_tiny"), recipe("frozenlake_text_tiny")
    a, r = cfg.algo, cfg.rollout
    assert cfg.env.env_kwargs == twin.env.env_kwargs and cfg.env.text_only
    assert (cfg.env.prompt_format, cfg.env.max_actions_per_turn) == ("no_think", 1)
    assert (r.num_groups, r.group_size, r.max_turns, r.max_new_tokens) == (16, 4, 10, 16)
    assert (a.adv, a.kl_coef, a.kl_kind, a.kl_in_reward) == ("grpo", 0.05, "k3", False)
    assert a.whiten_advantages
    assert cfg.optim.actor_lr == 5e-4


def test_mpo_recipes_keep_the_measured_settings():
    """frozenlake_text_mpo_tiny is the recipe docs/results.md quotes (0.000 -> 0.910 and 0.918 in 30
    minutes, two seeds); the visual mpo recipe shares its rollout, optimizer and update, reading state
    planes instead of text bytes, without the feedback line and with a weak pull of mass onto the action
    tokens (mpo_mass_coef 0.1), the setting that learned to see."""
    text, visual = recipe("frozenlake_text_mpo_tiny"), recipe("frozenlake_mpo_tiny")
    a, r = text.algo, text.rollout
    assert (a.policy_loss, a.critic, a.state_critic_input, a.gamma, a.mpo_eta, a.mpo_uniform_mix) == (
        "mpo",
        "state",
        "text",
        0.9,
        0.5,
        0.1,
    )
    assert (a.state_critic_steps, a.ppo_epochs, a.mini_batches, a.kl_coef, a.kl_kind) == (
        30,
        2,
        16,
        1.0,
        "k2",
    )
    assert (r.num_groups, r.group_size, r.max_turns, r.window, r.random_start) == (256, 1, 10, 0, 0.5)
    assert (text.env.prompt_format, text.env.max_actions_per_turn, text.env.instructions) == (
        "no_think",
        1,
        "brief",
    )
    assert text.optim.actor_lr == 1e-3 and text.env.text_only and text.env.action_feedback
    assert visual.rollout == r and visual.optim == text.optim
    assert asdict(visual.algo) == asdict(a) | {
        "state_critic_input": "features",
        "state_critic_max_bytes": 256,
        "mpo_mass_coef": 0.1,
    }
    assert not visual.env.action_feedback and visual.env.env_kwargs["tile_style"] == "flat"
    assert visual.perception.enabled and not text.perception.enabled  # the visual policy starts able to see


def test_quickstart_is_the_visual_mpo_recipe_from_the_shipped_perception_model():
    """`make train` (docs/results.md#make-train): frozenlake_mpo_tiny's update, started from the shipped
    model that reads flat-tile FrozenLake, validated on 128 held-out levels every 5 of its 20 iterations."""
    quick, base = recipe("frozenlake_quickstart_tiny"), recipe("frozenlake_mpo_tiny")
    assert (
        quick.model.path == "assets/perception/frozenlake_slippery_mpo_tiny" and not quick.perception.enabled
    )
    assert asdict(quick.algo) == asdict(base.algo) and quick.optim == base.optim
    assert asdict(quick.env) == asdict(base.env) and asdict(quick.rollout) == asdict(base.rollout)
    assert quick.warm_start == base.warm_start
    assert (quick.trainer.steps, quick.trainer.val_groups, quick.trainer.val_every) == (20, 128, 5)
    makefile = (REPO / "Makefile").read_text()
    assert "vagen/train.py --config configs/frozenlake_quickstart_tiny.yaml" in makefile


def test_sokoban_and_slippery_mpo_recipes_change_only_what_their_task_needs():
    """sokoban_mpo_tiny and frozenlake_slippery_mpo_tiny are frozenlake_mpo_tiny on another env: Sokoban
    with all of it (perception pretraining, exploring starts); slippery FrozenLake with 16 turns, gamma
    0.95, eta 0.25 and critic lr 1e-3 (the recipe's comment says why), the critic reading the map from the
    player and, as measured, without perception pretraining."""
    base, sokoban, slippery = (
        recipe(n) for n in ("frozenlake_mpo_tiny", "sokoban_mpo_tiny", "frozenlake_slippery_mpo_tiny")
    )
    assert asdict(sokoban.algo) == asdict(base.algo) and sokoban.optim == base.optim
    assert asdict(sokoban.rollout) == asdict(base.rollout)
    assert sokoban.perception == base.perception and not slippery.perception.enabled
    assert sokoban.env.env_kwargs == {
        "dim_room": [6, 6], "num_boxes": 1, "max_steps": 10, "min_optimal_steps": 1, "max_optimal_steps": 5,
        "tile_style": "flat",
    }  # fmt: skip
    assert asdict(slippery.algo) == asdict(base.algo) | {"gamma": 0.95, "mpo_eta": 0.25}
    assert asdict(slippery.optim) == asdict(base.optim) | {"critic_lr": 1e-3}
    assert asdict(slippery.rollout) == asdict(base.rollout) | {"max_turns": 16, "max_actions_per_episode": 16}
    assert slippery.env.env_kwargs == base.env.env_kwargs | {
        "is_slippery": True, "max_steps": 16, "state_view": "egocentric",
    }  # fmt: skip
    for cfg in (sokoban, slippery):
        env_fields = asdict(cfg.env) | {"env_id": base.env.env_id, "env_kwargs": base.env.env_kwargs}
        assert env_fields == asdict(base.env)


def test_minigrid_recipe_is_the_visual_mpo_recipe_on_lava_gap(tiny_vlm_path):
    """minigrid_lavagap_tiny: frozenlake_mpo_tiny's update and optimizer on MiniGrid LavaGapS6, every level
    from a random start, the turn budget the env's own step limit, from the shipped MiniGrid reader (whose
    perception settings the recipe keeps, to rebuild it); its actions start with distinct tokens, so MPO
    reads the policy off one position."""
    base, minigrid = recipe("frozenlake_mpo_tiny"), recipe("minigrid_lavagap_tiny")
    assert asdict(minigrid.algo) == asdict(base.algo) and minigrid.optim == base.optim
    assert minigrid.env.env_kwargs == {
        "task": "MiniGrid-LavaGapS6-v0", "max_steps": 14, "reward_scale": 10.0, "start": "random",
    }  # fmt: skip
    r = minigrid.rollout
    assert r.max_turns == r.max_actions_per_episode == minigrid.env.env_kwargs["max_steps"]
    assert r.random_start == 0.0 and r.num_groups == 128
    assert minigrid.model.path == "assets/perception/minigrid_lavagap_tiny"
    assert not minigrid.perception.enabled and minigrid.perception.shuffle_cells == 1.0
    assert minigrid.warm_start.teacher == "format"
    env_fields = asdict(minigrid.env) | {"env_id": base.env.env_id, "env_kwargs": base.env.env_kwargs}
    assert env_fields == asdict(base.env)
    codec = ChatCodec(load_policy(tiny_vlm_path)[1])
    assert len(set(action_token_ids(codec, make_language_env(minigrid.env).action_names))) == 3


def test_slippery_recipe_lets_the_policy_react_after_every_slip():
    cfg = recipe("frozenlake_slippery_tiny")
    assert cfg.env.env_kwargs["is_slippery"] is True and cfg.env.max_actions_per_turn == 1
    # one action per turn: the turn budget is the action budget, which is the env's own step limit
    assert cfg.rollout.max_turns == cfg.rollout.max_actions_per_episode == cfg.env.env_kwargs["max_steps"]


@pytest.mark.parametrize("name", VAGEN_3B)
def test_vagen_3b_recipes_keep_the_published_settings(name):
    cfg = recipe(name)
    r = cfg.rollout
    assert cfg.model.path == "/models/Qwen2.5-VL-3B-Instruct" and cfg.model.dtype == "bfloat16"
    assert (r.engine, r.max_turns, cfg.env.max_actions_per_turn, r.max_new_tokens) == ("vllm", 3, 3, 200)
    assert (r.temperature, r.top_p) == (0.7, 0.95)
    assert r.num_groups * r.group_size == 128  # data.train_batch_size x n_trajectory
    assert r.num_groups * r.group_size // cfg.algo.mini_batches == 32  # ppo_mini_batch_size
    assert (cfg.algo.kl_coef, cfg.optim.actor_lr) == (0.001, 1e-6)
    # VAGEN's update: entropy 0.001, the loss averaged per trajectory, GAE advantages whitened
    assert (cfg.algo.entropy_coef, cfg.algo.loss_agg) == (0.001, "episode-mean")
    assert cfg.algo.whiten_advantages == (cfg.algo.adv != "grpo")
    assert cfg.env.prompt_format == "grounding_worldmodeling"
    assert (cfg.env.grounding_reward_weight, cfg.env.worldmodel_reward_weight) == (0.5, 0.5)
    assert derived_sizes(cfg, world_size=4).groups_per_rank * 4 == r.num_groups  # 4 GPUs as published


def test_trico_recipe_is_bilevel_gae_with_the_critic_lr():
    cfg = recipe("sokoban_qwen2_5_vl_3b_trico")
    a = cfg.algo
    assert a.adv == "bilevel_gae"
    assert (a.gamma, a.gamma_token, a.lam, a.lam_token) == (0.95, 1.0, 1.0, 1.0)
    assert cfg.optim.critic_lr == 1e-5 and a.kl_in_reward


def test_vagen_baselines_differ_from_trico_only_in_the_algorithm():
    trico = recipe("sokoban_qwen2_5_vl_3b_trico")
    ppo, grpo = recipe("sokoban_qwen2_5_vl_3b_ppo"), recipe("sokoban_qwen2_5_vl_3b_grpo")
    assert (ppo.algo.adv, grpo.algo.adv) == ("gae", "grpo")
    assert ppo.env == trico.env == grpo.env and ppo.rollout == trico.rollout and ppo.optim == trico.optim
    # GRPO needs groups: same episodes per batch, cut into 16 levels x 8 tries
    assert (grpo.rollout.num_groups, grpo.rollout.group_size) == (16, 8)
    for cfg in (ppo, grpo):  # same loop settings; each recipe has its own run folder
        assert asdict(cfg.trainer) | {"run_dir": ""} == asdict(trico.trainer) | {"run_dir": ""}


def test_ragen_recipe_is_starpo_s_without_kl():
    cfg = recipe("sokoban_qwen2_5_0_5b_ragen")
    r, a = cfg.rollout, cfg.algo
    assert cfg.model.path == "/models/Qwen2.5-0.5B-Instruct" and cfg.env.text_only
    assert (r.num_groups, r.group_size, r.max_turns) == (8, 16, 5)
    assert (a.filter.rule, a.filter.keep) == ("top_std_fraction", 0.25)
    assert (a.clip_low, a.clip_high, a.kl_coef) == (0.2, 0.28, 0.0)


@pytest.mark.parametrize(
    "name", ["sokoban_mpo_tiny", "frozenlake_slippery_mpo_tiny", "minigrid_lavagap_tiny"]
)
def test_shipped_perception_models_match_their_recipe_and_load(name):
    """assets/perception/<recipe> (its README) was pretrained with the recipe's perception settings and
    still loads; a change to those settings makes it stale and fails here."""
    folder = REPO / "assets" / "perception" / name
    report = json.loads((folder / REPORT_FILE).read_text())
    settings = pretraining_settings(recipe(name).perception)
    assert {k: report["perception"][k] for k in settings} == settings
    assert report["after"]["token_accuracy"] > 0.99
    model, _ = load_policy(str(folder))
    assert model.config.text_config.hidden_size == 128  # the tiny VLM, not a placeholder


@pytest.mark.parametrize(("name", "config_dir"), ONE_GPU_RECIPES.items())
def test_one_gpu_recipes_fit_the_gpu_they_name(name, config_dir):
    """The memory estimate (vagen/memory.py) of the recipe on one GPU, from the public config.json of its
    model (assets/), stays under its trainer.gpu_memory_gb."""
    cfg = recipe(name)
    shape = model_shape(REPO / "assets" / config_dir, cfg.model.lora)
    zero = ZeroSetup.from_deepspeed(deepspeed_config(cfg, derived_sizes(cfg, world_size=1)), gpus=1)
    model_critic = POLICY_UPDATES[cfg.algo.policy_loss].critic(cfg) == "model"
    estimate = estimate_memory(cfg, shape, zero, model_critic)
    assert cfg.trainer.gpu_memory_gb == 24 and cfg.model.lora.rank > 0 and cfg.rollout.engine == "hf"
    assert estimate.total <= cfg.trainer.gpu_memory_gb * 1e9, estimate.describe(zero)
