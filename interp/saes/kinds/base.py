"""The base class of the kinds: how latents fire and what training adds to the loss (ReLU's rule, no penalty)."""
from __future__ import annotations

from typing import Optional

import torch


class Kind:
    """The sparsity rule of one dictionary kind (a base class: ReLU's rule without its penalty)."""

    name = "base"
    has_penalty = False

    def encode(self, pre: torch.Tensor, sae) -> torch.Tensor:
        """Latents [..., d_sae] from pre-activations [..., d_sae] at inference."""
        return torch.relu(pre)

    def train_acts(self, pre: torch.Tensor, sae, global_rows: int) -> torch.Tensor:
        """Latents [rows, d_sae] as training computes them (differentiable; `global_rows` is the rows of
        the whole batch over all processes)."""
        return self.encode(pre, sae)

    def penalty(self, pre: torch.Tensor, acts: torch.Tensor, sae) -> torch.Tensor:
        """The sparsity term per row [rows], before its coefficient (0 for the TopK kinds)."""
        return acts.new_zeros(acts.shape[0])

    def reconstruction(self, target: torch.Tensor, acts: torch.Tensor, sae, extra: Optional[torch.Tensor]) -> torch.Tensor:
        """Squared error per row [rows] of the reconstruction (`extra`: a skip term added to it)."""
        out = sae.decode(acts) if extra is None else sae.decode(acts) + extra
        return (out - target).pow(2).sum(-1)

    def after_step(self, acts: torch.Tensor, sae, threshold_lr: float) -> None:
        """Update what the kind learns outside the gradient (BatchTopK's inference threshold)."""
