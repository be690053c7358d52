"""The process group under torchrun: this process's rank and the world size, sums and flags across ranks.
One process (no group) is rank 0 of a world of 1, and every function here is then a no-op."""

import os

import torch
import torch.distributed as dist
from torch import Tensor


def init_distributed(device: str = "cpu") -> tuple[int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...) when
    WORLD_SIZE > 1 — gloo on CPU, NCCL on CUDA — and return (rank, world size)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as err:
        raise ValueError(f"WORLD_SIZE must be an integer, got {os.environ['WORLD_SIZE']!r}") from err
    if world > 1 and not dist.is_initialized():
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend="nccl")
        else:
            dist.init_process_group(backend="gloo")
    return rank_world()


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_ranks_sum(value: Tensor, world: int) -> float:
    if world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value.item()


def any_rank(flag: bool, world: int, device: torch.device) -> bool:
    """True on every rank when it is True on any (so that all ranks stop after the same step)."""
    if world == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
