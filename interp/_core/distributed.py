"""Data parallelism under torchrun, shared by the trainers (tuned lens, sparse autoencoders): who we are, and
the gradients' all-reduce."""
from __future__ import annotations

import os
from typing import cast

import torch
import torch.distributed as dist


def world_and_rank() -> tuple[int, int]:
    """(processes, this one's rank): under torchrun after joining the gloo group, else (1, 0)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def average_grads(module: torch.nn.Module, world: int) -> None:
    """Data parallelism's all-reduce: every process ends up with the mean of the processes' gradients."""
    if world == 1:
        return
    grads = [cast(torch.Tensor, p.grad) for p in module.parameters()]  # called after backward: all set
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(chunk.view_as(g))
