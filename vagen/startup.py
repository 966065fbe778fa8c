"""A run's start: every input that can be checked before work starts, the seeds, and quiet libraries.

`check_run(cfg)` raises one ConfigError line for the first problem it finds and writes nothing: what the
chosen policy update and estimator need of the config (their registries), the model path, the DeepSpeed
file against the run's batch shape, and the env (built and reset once with its kwargs; on the env server
when `env.remote` is set, which must then answer) with what the warm start's teacher and the critic read
of it (envs_visual.contract), and, for an update that reads a policy over the actions (mpo), that one
token tells the action names apart (vagen.rollout.assembly.action_token_ids).
"""

import logging
import os
import random
from pathlib import Path

import deepspeed
import gymnasium as gym
import numpy as np
import torch
import transformers

from envs_visual.remote import EnvServiceError
from vagen.batching import derived_sizes
from vagen.config import ConfigError, RunConfig
from vagen.models.loading import check_model_dir, load_processor
from vagen.models.tiny import TINY_MODELS
from vagen.optim import deepspeed_config
from vagen.pretrain.teachers import TEACHER_NEEDS, teacher_available
from vagen.rollout.assembly import ChatCodec, action_token_ids
from vagen.rollout.manager import check_random_start, make_language_env
from vagen.updates import POLICY_UPDATES


def _bad(key: str, message: str) -> ConfigError:
    return ConfigError(f"bad value for config key '{key}': {message}")


def check_run(cfg: RunConfig) -> None:
    """The checks of the module docstring, in order; ConfigError on the first problem."""
    update = POLICY_UPDATES[cfg.algo.policy_loss]
    update.check(cfg)
    if cfg.model.path not in TINY_MODELS:
        path = Path(cfg.model.path).expanduser()
        if not path.is_dir():
            raise _bad("model.path", f"'{path}' is not a local directory (nothing is downloaded from a hub)")
        try:
            check_model_dir(path)
        except FileNotFoundError as err:
            raise _bad("model.path", str(err)) from None
    deepspeed_config(cfg, derived_sizes(cfg, int(os.environ.get("WORLD_SIZE", "1"))))
    remote = cfg.env.remote
    if remote is not None and not remote.startswith(("http://", "https://")):
        raise _bad("env.remote", f"{remote!r} is not an http:// or https:// URL")
    try:
        env = make_language_env(cfg.env)
        observation, _ = env.reset(seed=cfg.trainer.seed)
        check_random_start(cfg.env, cfg.rollout.random_start, "rollout.random_start")
    except (gym.error.Error, TypeError, ValueError, KeyError, AssertionError) as err:
        raise _bad("env", f"{cfg.env.env_id} with {cfg.env.env_kwargs}: {err}".splitlines()[0]) from None
    except EnvServiceError as err:
        raise _bad("env.remote", str(err).splitlines()[0]) from None
    if update.scores_actions:  # the update reads a policy over the actions off one token
        try:
            action_token_ids(ChatCodec(load_processor(cfg.model.path)), env.action_names)
        except ValueError as err:
            raise _bad("algo.policy_loss", f"{cfg.algo.policy_loss}: {err}") from None
    teacher = cfg.warm_start.teacher  # teachers play a local copy of the game
    if teacher != "none" and not teacher_available(
        make_language_env(cfg.env, local=True).env.unwrapped, teacher
    ):
        raise _bad(
            "warm_start.teacher",
            f"{teacher} needs the env's {TEACHER_NEEDS[teacher]}(); {cfg.env.env_id} has none",
        )
    reads_features = update.critic(cfg) == "state" and cfg.algo.state_critic_input == "features"
    if reads_features and observation.features is None:
        raise _bad("algo.state_critic_input", f"features: {cfg.env.env_id} has no state_features()")


def seed_everything(seed: int, rank: int) -> None:
    """Seed python, numpy and torch. Per-rank offset: ranks must not draw identical random streams
    (dropout, shuffles); rollouts get their own seeds from the level schedule, not from these."""
    rank_seed = seed + 100_003 * rank
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)


def quiet_libraries() -> None:
    """transformers, DeepSpeed and vLLM print errors only (vLLM: unless VLLM_LOGGING_LEVEL says otherwise)."""
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    deepspeed.utils.logger.setLevel(logging.WARNING)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vLLM is imported
