"""A run's models: the actor (a DeepSpeed engine), its critic, the frozen reference and the generation
engine, all starting from `model.path` or its warm start (vagen.pretrain.warm_start_model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vagen.batching import DerivedSizes
from vagen.config import RunConfig
from vagen.critics import TurnCritic, build_state_critic
from vagen.distributed import comm_device
from vagen.models.loading import ValueModel, load_policy
from vagen.optim import adamw, make_deepspeed_engine
from vagen.pretrain import warm_start_model
from vagen.rollout.assembly import ChatCodec, action_token_ids
from vagen.rollout.engines import make_engine
from vagen.rollout.manager import make_language_env, read_chat_template
from vagen.updates import PolicyUpdate


@dataclass
class Models:
    actor: Any  # DeepSpeedEngine around the policy
    reference: torch.nn.Module | None  # frozen policy; None without KL, or under LoRA (adapter off)
    processor: Any
    generation: Any  # GenerationEngine
    critic: Any | None = (
        None  # DeepSpeedEngine around a ValueModel (algo.critic=model, critic-based estimators)
    )
    state_critic: TurnCritic | None = None  # algo.critic=state: V(s) (or Q(s, .)) of the env state
    state_critic_optim: torch.optim.Optimizer | None = None
    action_tokens: torch.Tensor | None = None  # (K,) the token of each action name (update.scores_actions)


def _model_critic(cfg: RunConfig, sizes: DerivedSizes, start: str, env: Any, outputs: int) -> dict[str, Any]:
    """A value head on a copy of the policy's backbone, trained by DeepSpeed beside the actor."""
    m = cfg.model
    value_model = ValueModel.from_pretrained(start, m.dtype, m.attn_implementation, m.gradient_checkpointing)
    return {"critic": make_deepspeed_engine(value_model, cfg.optim.critic_lr, cfg, sizes)}


def _state_critic(cfg: RunConfig, sizes: DerivedSizes, start: str, env: Any, outputs: int) -> dict[str, Any]:
    """An MLP on the env's true state (vagen.critics), the same on every rank, with its own AdamW."""
    algo, o = cfg.algo, cfg.optim
    probe, _ = env.reset(seed=cfg.trainer.seed)
    critic = build_state_critic(algo.state_critic_input, algo.state_critic_max_bytes, probe.features, outputs)
    critic = critic.to(comm_device())
    for p in critic.parameters():  # ranks seed differently: start from rank 0's weights
        dist.broadcast(p.data, src=0)
    return {
        "state_critic": critic,
        "state_critic_optim": adamw(critic.parameters(), o.critic_lr, o.betas, o.weight_decay),
    }


# algo.critic -> builder of the Models fields that critic fills
CRITIC_BUILDERS = {"model": _model_critic, "state": _state_critic}


def build_models(cfg: RunConfig, sizes: DerivedSizes, update: PolicyUpdate) -> Models:
    """Actor, critic and reference, all starting from `model.path` or its warm start; the critic and the
    action tokens are those the policy update asks for."""
    m = cfg.model
    if dist.get_rank() == 0:  # rank 0 builds (or finds) the cached warm start, the others then read it
        start = warm_start_model(cfg)
    dist.barrier()
    if dist.get_rank() != 0:
        start = warm_start_model(cfg)
    load = dict(
        dtype=m.dtype, attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code
    )
    lora = None
    if m.lora.rank > 0:
        lora = {"r": m.lora.rank, "lora_alpha": m.lora.alpha, "lora_dropout": m.lora.dropout}
        if m.lora.target_modules is not None:
            lora["target_modules"] = list(m.lora.target_modules)
    policy, processor = load_policy(start, gradient_checkpointing=m.gradient_checkpointing, lora=lora, **load)
    actor = make_deepspeed_engine(policy, cfg.optim.actor_lr, cfg, sizes)
    env = make_language_env(cfg.env)
    action_tokens = None
    if update.scores_actions:
        codec = ChatCodec(processor, read_chat_template(cfg.rollout.chat_template))
        action_tokens = torch.tensor(action_token_ids(codec, env.action_names))
    kind = update.critic(cfg)
    outputs = update.state_critic_outputs(len(env.action_names))
    critics = CRITIC_BUILDERS[kind](cfg, sizes, start, env, outputs) if kind is not None else {}
    reference = None
    if cfg.algo.kl_coef > 0 and lora is None:
        reference, _ = load_policy(start, **load)
        reference.to(comm_device()).eval().requires_grad_(False)
    # vLLM keeps its own copy of the weights (synced after every update) and sizes its budgets up front
    generation = make_engine(cfg.rollout.engine, actor.module, processor, cfg.rollout)
    return Models(actor, reference, processor, generation, action_tokens=action_tokens, **critics)
