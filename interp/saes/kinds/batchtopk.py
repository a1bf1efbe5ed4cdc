"""batchtopk: the k * batch largest latents over the whole batch, and at inference one learned threshold
(the running mean of the smallest latent kept): Bussmann et al. 2024, "BatchTopK Sparse Autoencoders"."""
from __future__ import annotations

import torch
import torch.distributed as dist
from jaxtyping import Float

from .base import Dictionary, Kind, threshold_of


class BatchTopK(Kind):
    name = "batchtopk"

    def __init__(self, k: int) -> None:
        self.k = k

    def encode(self, pre: Float[torch.Tensor, "*batch d_sae"], sae: Dictionary) -> Float[torch.Tensor, "*batch d_sae"]:
        return pre * (pre > threshold_of(sae)).to(pre.dtype) * (pre > 0).to(pre.dtype)

    def train_acts(self, pre: Float[torch.Tensor, "rows d_sae"], sae: Dictionary,
                   global_rows: int) -> Float[torch.Tensor, "rows d_sae"]:
        act = pre.relu()
        cut = batch_threshold(act.detach(), self.k * global_rows)
        return act * (act >= cut).to(act.dtype) * (act > 0).to(act.dtype)

    def after_step(self, acts: Float[torch.Tensor, "rows d_sae"], sae: Dictionary, threshold_lr: float) -> None:
        """threshold <- (1 - lr) threshold + lr * (the smallest positive latent of the batch, over all
        processes): the running estimate of the cut BatchTopK makes, used alone at inference."""
        a = acts.detach()
        smallest = torch.where(a > 0, a, torch.full_like(a, float("inf"))).min()
        if dist.is_initialized():
            dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
        if torch.isfinite(smallest):
            threshold = threshold_of(sae)
            if not threshold.any():  # the first update: start at the first batch's value
                threshold_lr = 1.0
            with torch.no_grad():
                threshold.mul_(1 - threshold_lr).add_(threshold_lr * smallest.to(threshold.dtype))


def batch_threshold(act: Float[torch.Tensor, "rows d_sae"], n_keep: int) -> Float[torch.Tensor, ""]:
    """The n_keep-th largest value of act [rows, d_sae] over the batch of every process (0 if fewer)."""
    flat = act.reshape(-1)
    local = flat.topk(min(n_keep, flat.numel()), sorted=False).values
    if dist.is_initialized():
        padded = torch.full((n_keep,), -1.0, dtype=flat.dtype, device=flat.device)
        padded[:local.numel()] = local
        parts = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, padded)
        local = torch.cat(parts)
    if local.numel() < n_keep:
        return flat.new_tensor(0.0)
    return local.topk(n_keep, sorted=False).values.min().clamp_min(0)
