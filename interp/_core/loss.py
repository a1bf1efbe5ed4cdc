"""The mean next-token loss of a model run with forward hooks (ablations share it)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Int

from .batching import batches
from .model import HookedModel


@torch.inference_mode()
def hooked_loss(model: HookedModel, rows: list[Int[torch.Tensor, " pos"]], batch_size: int, loss_from: int,
                hooks: list) -> float:
    """Mean next-token loss (nats) over the predictions made at positions >= loss_from, with the forward
    hooks `hooks` ((hook name, hook) pairs; [] for the clean model) in place; rows go in padded batches."""
    total, n = 0.0, 0
    for _, ids in batches(rows, batch_size, device=model.cfg.device):
        logits = model.run_with_hooks(ids, fwd_hooks=hooks)
        lp = F.log_softmax(logits[:, loss_from:-1].float(), dim=-1)
        nll = -lp.gather(-1, ids[:, loss_from + 1:, None])
        total += nll.double().sum().item()
        n += nll.numel()
    if n == 0:
        raise ValueError(f"no predictions to score: sequences are too short for loss_from={loss_from}")
    return total / n
