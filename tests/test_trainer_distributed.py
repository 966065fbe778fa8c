"""Two CPU processes (gloo) give the same parameters after one update as one process on the same data.

The same file is the worker: `torchrun --nproc_per_node 2 tests/test_trainer_distributed.py OUT CRITIC`
runs `one_update` on each rank, with the value-model critic (gae), the state critic (turn_gae) or no
critic (grpo, whose per-episode loss mean is then weighed across micro-batches and ranks).
Every rank plays the same 4 episodes (same model, seeds and sampling) and gives them fixed rewards;
each rank then keeps its own share of the groups, as in training, and the filter, advantages and one
DeepSpeed update run on the shares."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]


def one_update(out_path: str, critic_kind: str) -> None:
    import torch.distributed as dist

    from vagen import optim
    from vagen.batching import derived_sizes
    from vagen.config import load_config
    from vagen.distributed import init_distributed
    from vagen.metrics import MetricAccumulator
    from vagen.models import build
    from vagen.rollout.manager import RolloutManager
    from vagen.startup import seed_everything
    from vagen.trainer import filter_groups, optimize, plan_update, score
    from vagen.updates import POLICY_UPDATES

    def sgd_like_adamw(params, lr, betas, weight_decay=0.0):
        # eps >> |gradient| turns AdamW's first step into SGD (step = lr * g / (|g| + eps)), so that the
        # comparison sees gradient magnitudes, not only their signs
        return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=1.0, weight_decay=weight_decay)

    optim.adamw = build.adamw = sgd_like_adamw
    rank, world = init_distributed()
    overrides = [
        "warm_start.teacher=none", "rollout.engine=hf", "rollout.num_groups=2", "rollout.group_size=2",
        "rollout.max_turns=2", "rollout.max_new_tokens=12", "algo.mini_batches=1", "algo.kl_coef=0.01",
        "trainer.micro_batch_size=1", "optim.actor_lr=1.0", "optim.critic_lr=1.0", "optim.warmup_steps=0",
    ]  # fmt: skip
    overrides += {
        "model": ["algo.adv=gae"],
        "state": ["algo.adv=turn_gae", "algo.critic=state", "algo.state_critic_steps=2"],
        "none": ["algo.adv=grpo"],
    }[critic_kind]
    cfg = load_config(REPO / "configs/frozenlake_tiny.yaml", overrides)
    sizes = derived_sizes(cfg, world)
    update = POLICY_UPDATES[cfg.algo.policy_loss]
    seed_everything(cfg.trainer.seed, rank=0)  # identical weights and episodes on every rank
    models = build.build_models(cfg, sizes, update)
    manager = RolloutManager(cfg.env, cfg.rollout, models.generation, models.processor)
    batch = manager.collect(manager.seeds.next_train(cfg.rollout.num_groups, cfg.rollout.group_size))
    # fixed, distinct rewards at the turn ends so that advantages and gradients are not zero
    ramp = torch.linspace(-1.0, 1.0, batch.turn_end.numel()).view_as(batch.token_rewards)  # (B, L)
    batch.token_rewards = torch.where(batch.turn_end, ramp, 0.0)
    for e, episode in enumerate(batch.episodes):
        episode.episode_return = float(batch.token_rewards[batch.episode_ids == e].sum())
    # this rank's share: its groups, as rollout_share would have played them
    per_rank = cfg.rollout.num_groups // world
    mine = [e for e, ep in enumerate(batch.episodes) if ep.group // per_rank == rank]
    share = batch.select(torch.isin(batch.episode_ids, torch.tensor(mine)).nonzero().flatten())
    scores = score(models, share, cfg)
    rows, _, _ = filter_groups(share, cfg, world)
    kept, kept_scores = share.select(rows), scores.select(rows)
    stats = MetricAccumulator()
    plan = plan_update(update, models, kept, kept_scores, cfg, stats)  # fits the state critic
    generator = torch.Generator().manual_seed(0)
    optimize(update, models, kept, kept_scores, plan, share.select([0]), cfg, sizes, generator, stats)
    reduced = stats.reduce()
    second = {"model": "critic/grad_norm", "state": "critic/vf_loss", "none": "actor/grad_norm"}[critic_kind]
    grad_norms = torch.tensor([reduced["actor/grad_norm"], reduced[second]], dtype=torch.float64)
    actor = {
        f"actor.{k}": v.detach().clone().contiguous() for k, v in models.actor.module.state_dict().items()
    }
    value_fn = {"model": models.critic and models.critic.module, "state": models.state_critic}.get(
        critic_kind
    )
    weights = value_fn.state_dict().items() if value_fn is not None else []
    critic = {f"critic.{k}": v.detach().clone().contiguous() for k, v in weights}
    if rank == 0:
        save_file(actor | critic | {"grad_norms": grad_norms}, out_path)
    dist.barrier()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("critic_kind", ["model", "state", "none"])
def test_two_processes_match_one_process_after_one_update(tmp_path, critic_kind):
    env = os.environ | {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    outputs = {}
    for world in (1, 2):
        outputs[world] = tmp_path / f"world{world}.safetensors"
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}"]
        launcher += [f"--master_port={free_port()}", __file__, str(outputs[world]), critic_kind]
        done = subprocess.run(launcher, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = load_file(outputs[1]), load_file(outputs[2])
    assert one.keys() == two.keys()
    assert torch.allclose(one["grad_norms"], two["grad_norms"], rtol=1e-5)
    assert (one["grad_norms"] > 0).all()
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    assert worst <= 1e-5
    # and the update did move the weights (the comparison is not between two untouched models)
    from vagen.models.loading import load_policy

    initial, _ = load_policy("tiny-vlm")
    moved = max((one[f"actor.{k}"] - v).abs().max().item() for k, v in initial.state_dict().items())
    print("worst", worst, "moved", moved, "norms", one["grad_norms"].tolist())
    assert moved > 1e-4
    if critic_kind == "state":  # the state critic starts with a zero last layer: the fit moved it
        assert one["critic.mlp.4.weight"].abs().max().item() > 1e-4


if __name__ == "__main__":
    one_update(sys.argv[1], sys.argv[2])
