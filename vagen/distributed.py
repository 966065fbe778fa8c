"""The process group: joining it, where collective tensors live, and a global sum."""

import math
import os
import socket

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator


def init_distributed() -> tuple[int, int]:
    """Join the process group; returns (rank, world size).

    Launchers (deepspeed, torchrun) set RANK / WORLD_SIZE / MASTER_*; a plain `python vagen/train.py`
    gets a one-process group on a free local port. Backend: nccl on GPUs, gloo on CPU.
    """
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def comm_device() -> torch.device:
    """Where collective tensors live: the rank's GPU under nccl, the CPU under gloo."""
    return torch.device(get_accelerator().current_device_name())


def global_sum(value: float) -> float:
    """The sum of `value` over all ranks."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t)  # named reduction: SUM over ranks
    return float(t.item())


def whiten_all_ranks(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries of every rank (named reduction: SUM of n, sum, sum sq)."""
    m = mask.bool()
    moments = torch.stack([m.sum().double(), x[m].double().sum(), (x[m].double() ** 2).sum()]).to(
        comm_device()
    )
    dist.all_reduce(moments)
    n, total, total_sq = moments.tolist()
    mean = total / max(n, 1.0)
    var = max(total_sq / max(n, 1.0) - mean**2, 0.0)
    return torch.where(m, (x - mean) / math.sqrt(var + eps), 0.0)
