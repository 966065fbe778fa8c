"""The RL loop on the tiny VLM: 2-step runs per estimator and policy update, one update's direction,
alarm policies, start-up checks, and exact resume after a SIGKILL."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vagen.config import load_config
from vagen.distributed import init_distributed
from vagen.metrics import read_metrics
from vagen.trainer import train

REPO = Path(__file__).resolve().parents[1]


# the required metric names (docs/metrics.md defines them all)
REQUIRED = [
    "train/success_rate", "train/return_mean", "train/return_std_in_group", "train/turns_mean",
    "train/invalid_action_rate", "train/format_ok_rate", "train/response_tokens", "train/think_tokens",
    "train/template_score", "actor/pg_loss", "actor/entropy", "actor/kl", "actor/clipfrac", "actor/grad_norm",
    "actor/lr", "actor/skipped_steps", "filter/kept_groups", "time/rollout_s", "time/update_s", "time/step_s",
    "alarm/grad_norm_spike",
]  # fmt: skip


def tiny_overrides(run_dir: Path, **extra) -> list[str]:
    """G=2 groups x n=2, 2 turns, 16 new tokens, 2 validation episodes: a step takes about a second."""
    base = {
        "warm_start.teacher": "none",  # the untrained tiny model: no SFT before the test
        "perception.enabled": "false",  # and no perception pretraining (the mpo recipes turn it on)
        "rollout.engine": "hf",  # deterministic, no engine start-up
        "trainer.run_dir": str(run_dir),
        "trainer.steps": 2,
        "trainer.save_every": 0,
        "trainer.val_groups": 2,
        "trainer.micro_batch_size": 2,
        "trainer.viz_every": 0,
        "rollout.num_groups": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_new_tokens": 16,
        "optim.actor_lr": 1e-3,
        "optim.warmup_steps": 0,
    }
    return [f"{k}={v}" for k, v in (base | extra).items()]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize(
    ("adv", "critic", "kl_tokens"),
    [
        ("gae", "model", "loss"),
        ("bilevel_gae", "model", "loss"),
        ("grpo", "model", "loss"),
        ("turn_gae", "state", "loss"),
        ("gae", "state", "non_action"),  # issue 37's PPO: the anchor on every reply token but the action's
    ],
)
def test_two_step_run(tmp_path, adv, critic, kl_tokens):
    extra = {"algo.adv": adv, "algo.critic": critic, "algo.kl_tokens": kl_tokens}
    full_check = critic == "model" and adv == "gae"  # also exercise the GIF/HTML writer and checkpoint format
    if full_check:
        extra |= {"trainer.viz_every": 2, "trainer.viz_episodes": 2}
    summary = train(load_config(REPO / "configs/frozenlake_tiny.yaml", tiny_overrides(tmp_path, **extra)))
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        missing = [k for k in REQUIRED if k not in m]
        assert not missing, missing
        assert all(math.isfinite(v) for v in m.values())
        assert m["filter/kept_groups"] == 2
        assert ("critic/vf_loss" in m) == ("critic/explained_var" in m) == (adv != "grpo")
        assert ("critic/clipfrac" in m) == (adv != "grpo" and critic == "model")  # no value clip on state
    documented = (REPO / "docs" / "metrics.md").read_text()
    undocumented = {k for m in lines for k in m if k != "step" and f"`{k}`" not in documented}
    assert not undocumented, f"define these in docs/metrics.md: {sorted(undocumented)}"
    assert 0.0 <= summary["val_after"]["val/success_ci_low"] <= summary["val_after"]["val/success_rate"]
    assert "val/success_rate" in lines[0] and "val/success_rate" in lines[2]
    ends = {k: v for k, v in lines[2].items() if k.startswith("val/end/")}
    assert ends and sum(ends.values()) == pytest.approx(1.0), ends  # every validation episode ended one way
    assert "val/success_rate_blank_image" in lines[0] and "val/success_rate_blank_image" in lines[2]
    assert lines[0]["time/torch_threads"] == torch.get_num_threads()
    final = tmp_path / "checkpoints" / "step_000002"
    assert (final / "actor" / "model.safetensors").is_file() and (final / "trainer_state.json").is_file()
    assert (final / "state_critic" / "model.safetensors").is_file() == (critic == "state")
    if full_check:
        assert (final / "critic" / "value_head.safetensors").is_file()
        assert len(list((tmp_path / "rollouts" / "step_000002").glob("*.gif"))) == 2
        from transformers import AutoModelForImageTextToText

        reloaded = AutoModelForImageTextToText.from_pretrained(final / "actor", local_files_only=True)
        assert sum(p.numel() for p in reloaded.parameters()) > 0


def comparable(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith("time/")}


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread):
    return one_torch_thread


def test_exact_resume_after_sigkill(tmp_path, one_thread):
    """4 steps in one go == 2 steps, SIGKILL during step 3, then resume=auto for steps 3 and 4."""
    overrides = {"trainer.steps": 4, "trainer.save_every": 2, "trainer.keep_last": 2}
    straight = tmp_path / "straight"
    train(load_config(REPO / "configs/frozenlake_tiny.yaml", tiny_overrides(straight, **overrides)))

    killed = tmp_path / "killed"
    env = os.environ | one_thread
    env.pop("RANK", None)  # the child makes its own one-process group
    command = [sys.executable, "vagen/train.py", "--config", "configs/frozenlake_tiny.yaml"]
    child = subprocess.Popen(
        command + tiny_overrides(killed, **overrides),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (killed / "checkpoints" / "step_000002").is_dir():
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)  # not a clean exit
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not (killed / "checkpoints" / "step_000004").exists()
    # the killed run reached the same state as the straight one at step 2 ...
    from safetensors.torch import load_file

    weights = [
        load_file(run / "checkpoints/step_000002/actor/model.safetensors") for run in (straight, killed)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])

    train(
        load_config(
            REPO / "configs/frozenlake_tiny.yaml",
            tiny_overrides(killed, **overrides, **{"trainer.resume": "auto"}),
        )
    )
    resumed = {m["step"]: comparable(m) for m in read_metrics(killed / "metrics.jsonl")}
    expected = {m["step"]: comparable(m) for m in read_metrics(straight / "metrics.jsonl")}
    assert sorted(resumed) == [0, 1, 2, 3, 4]  # the killed run's partial lines were dropped
    # ... and continues exactly as the straight run did
    assert resumed[3] == expected[3]
    assert resumed[4] == expected[4]
    state = json.loads((killed / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    straight_state = json.loads((straight / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state == straight_state and state["step"] == 4
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_000002", "step_000004"]


@pytest.mark.parametrize("policy", ["stop", "rollback"])
def test_alarm_policies_stop_or_roll_back(tmp_path, policy, monkeypatch):
    # a hair trigger: entropy (constant ~6.9 on the untrained model) "spikes" over 0.5 x its median
    from vagen import metrics
    from vagen.algo import CollapseDetector

    monkeypatch.setattr(
        metrics, "CollapseDetector", lambda: CollapseDetector(spike_factor=0.5, min_history=1)
    )
    alarm = {"alarms.policy": policy, "alarms.max_rollbacks": 1}
    overrides = tiny_overrides(tmp_path, **{"trainer.steps": 4, "trainer.save_every": 1, **alarm})
    summary = train(load_config(REPO / "configs/frozenlake_tiny.yaml", overrides))
    lines = read_metrics(tmp_path / "metrics.jsonl")
    fired = [m["step"] for m in lines if m.get("alarm/entropy_swing") == 1.0]
    if policy == "stop":
        assert [m["step"] for m in lines] == [0, 1, 2] and fired == [2]
    else:  # step 2 alarms, rolls back to step 1's checkpoint, alarms again with no rollback left
        assert [m["step"] for m in lines] == [0, 1, 2, 2] and fired == [2, 2]
    assert summary["steps"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]  # alarmed: unsaved


def build(cfg):
    """The run's policy update and models, as train() builds them."""
    from vagen.batching import derived_sizes
    from vagen.models.build import build_models
    from vagen.updates import POLICY_UPDATES

    _, world = init_distributed()
    sizes = derived_sizes(cfg, world)
    update = POLICY_UPDATES[cfg.algo.policy_loss]
    return update, build_models(cfg, sizes, update), sizes


def test_one_update_raises_the_better_episodes_tokens_and_lowers_the_worse():
    from vagen.metrics import MetricAccumulator
    from vagen.rollout.manager import RolloutManager
    from vagen.trainer import optimize, plan_update, score

    overrides = [
        "warm_start.teacher=none", "rollout.engine=hf", "rollout.num_groups=1", "rollout.group_size=2",
        "rollout.max_turns=1", "rollout.max_new_tokens=8", "algo.adv=grpo", "algo.mini_batches=1",
        "algo.kl_coef=0", "optim.actor_lr=1e-3",
    ]  # fmt: skip
    cfg = load_config(REPO / "configs/frozenlake_tiny.yaml", overrides)
    update, models, sizes = build(cfg)
    manager = RolloutManager(cfg.env, cfg.rollout, models.generation, models.processor)
    batch = manager.collect(manager.seeds.next_train(1, 2))
    for episode, episode_return in zip(batch.episodes, [1.0, 0.0], strict=True):  # member 0 did better
        episode.episode_return = episode_return
    scores = score(models, batch, cfg)
    stats = MetricAccumulator()
    plan = plan_update(update, models, batch, scores, cfg, stats)
    adv = plan.advantages
    assert adv[0][batch.loss_mask[0]].gt(0).all() and adv[1][batch.loss_mask[1]].lt(0).all()
    optimize(update, models, batch, scores, plan, batch.select([0]), cfg, sizes, torch.Generator(), stats)
    after = score(models, batch, cfg)

    def mean_logp(s, row):
        return s.old_logp[row][batch.loss_mask[row]].mean()

    assert mean_logp(after, 0) > mean_logp(scores, 0)
    assert mean_logp(after, 1) < mean_logp(scores, 1)


# the mpo recipe (frozenlake_mpo_tiny.yaml) at test size: its 2 epochs x 16 mini-batches cut to 1 x 2
MPO = {"algo.ppo_epochs": 1, "algo.mini_batches": 2}


@pytest.mark.parametrize("state_input", ["text", "features"])
def test_two_step_mpo_run(tmp_path, state_input):
    overrides = tiny_overrides(tmp_path, **MPO, **{"algo.state_critic_input": state_input})
    summary = train(load_config(REPO / "configs/frozenlake_mpo_tiny.yaml", overrides))
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        assert all(math.isfinite(v) for v in m.values())
        assert {"actor/mpo_loss", "critic/q_mean", "critic/vf_loss", "train/acting_turn_share"} <= set(m)
        assert "actor/pg_loss" not in m and "actor/clipfrac" not in m
    documented = (REPO / "docs" / "metrics.md").read_text()
    assert not {k for m in lines for k in m if k != "step" and f"`{k}`" not in documented}
    final = tmp_path / "checkpoints" / "step_000002" / "state_critic" / "model.safetensors"
    from safetensors.torch import load_file

    weights = load_file(final)
    assert weights["mlp.4.weight"].shape[0] == 4  # Q(s, .) of the four FrozenLake actions
    if state_input == "features":  # tile planes (ice, hole, goal) and the player's plane of 4 x 4 cells
        assert weights["mlp.0.weight"].shape[1] == 4 * 16
    assert summary["steps"] == 2


@pytest.mark.parametrize("mass_coef", [1.0, 0.0])
def test_one_mpo_update_raises_the_better_action_even_where_another_was_sampled(mass_coef):
    """Every turn sampled Down; the critic says Right is worth more. A sampled policy gradient could only
    move Down's probability; the all-action target raises Right's at every action token (fitted with
    full-vocabulary log-probs or with the policy over the four actions alone)."""
    from test_rollout_manager import ScriptedEngine

    from vagen.metrics import MetricAccumulator
    from vagen.rollout.manager import RolloutManager
    from vagen.trainer import optimize, score
    from vagen.updates import Plan
    from vagen.updates.mpo import action_turns, improved_policy, rollout_policy

    overrides = tiny_overrides(REPO / "runs" / "unused", **MPO) + [
        "algo.mini_batches=1", "algo.kl_coef=0", f"algo.mpo_mass_coef={mass_coef}"
    ]  # fmt: skip
    cfg = load_config(REPO / "configs/frozenlake_mpo_tiny.yaml", overrides)
    update, models, sizes = build(cfg)
    engine = ScriptedEngine(models.processor.tokenizer, ["<answer>Down</answer>"])
    manager = RolloutManager(cfg.env, cfg.rollout, engine, models.processor)
    batch = manager.collect(manager.seeds.next_train(2, 2))
    scores = score(models, batch, cfg)
    turns = action_turns(batch, models.action_tokens)
    probs = rollout_policy(turns, scores.action_logp, 4)  # (N, 4) over Up, Down, Left, Right
    q = torch.zeros_like(probs)
    q[:, 3] = 5.0
    targets, advantages = improved_policy(batch.input_ids.shape, turns, probs, q, eta=1.0, uniform_mix=0.1)
    assert len(turns.acted) == len(turns.states) and (turns.actions == 1).all()
    plan = Plan(advantages, targets=targets)
    optimize(
        update,
        models,
        batch,
        scores,
        plan,
        batch.select([0]),
        cfg,
        sizes,
        torch.Generator(),
        MetricAccumulator(),
    )
    after = rollout_policy(turns, score(models, batch, cfg).action_logp, 4)
    assert (after[:, 3] > probs[:, 3]).all() and (after[:, 1] < probs[:, 1]).all()  # Right 0.26 -> 0.69
    assert after[:, 3].mean() > 0.5
