"""Supervised pretraining before RL, on the env's own data: perception (read the images) and the warm
start (imitate a teacher), both on one supervised core (vagen.pretrain.supervised) and both cached.

`warm_start_model(cfg)` is the entry the trainer and the evaluator use: the checkpoint a run starts from.
"""

from vagen.config import RunConfig
from vagen.pretrain.perception import start_model
from vagen.pretrain.sft import run_sft


def warm_start_model(cfg: RunConfig, log=print) -> str:
    """The policy checkpoint a run starts from: `start_model(cfg)` (model.path, or its perception-pretrained
    copy) itself when `warm_start.teacher` is none, else the (cached) warm start on it. With several
    ranks, call it on rank 0 first, then barrier, then on the others (they hit the cache)."""
    base = start_model(cfg, log)
    if cfg.warm_start.teacher == "none":
        return base
    return str(run_sft(base, cfg.env, cfg.rollout, cfg.warm_start, log=log).model_dir)


__all__ = ["start_model", "warm_start_model"]
