"""Data parallelism under torchrun, shared by the trainers (tuned lens, sparse autoencoders): who we are
(`sprout.distributed`: a process group only when a trainer joins one, never from a query), and the gradients' all-reduce."""
from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist

from sprout.distributed import join, requested, world_and_rank

__all__ = ["average_grads", "join", "requested", "world_and_rank"]


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
