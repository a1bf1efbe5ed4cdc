"""Data parallelism under torchrun, shared by the trainers (tuned lens, sparse autoencoders): who we are
(`sprout.distributed`: a process group only when a trainer joins one, never from a query). The gradients'
all-reduce is the trainers' shared core's (`sprout.training.core.reduce_grads`)."""
from __future__ import annotations

from sprout.distributed import join, requested, world_and_rank

__all__ = ["join", "requested", "world_and_rank"]
