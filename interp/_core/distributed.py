"""Data parallelism under torchrun, shared by the trainers (tuned lens, sparse autoencoders): who we are
(`sprout.distributed`: a process group only when asked). The gradients' all-reduce is the trainers'
shared core's (`sprout.training.core.reduce_grads`)."""
from __future__ import annotations

from sprout.distributed import requested, world_and_rank

__all__ = ["requested", "world_and_rank"]
